//! A simulated disk and an in-memory index with the durability rules of
//! real hardware, under the embedded engine's I/O seams
//! ([`settle_embedded::fs::Fs`], [`settle_embedded::index::Index`]): the
//! engine's real log, checkpoint and recovery code runs on them in the
//! simulator ([`crate::store`]), in the power-loss tests
//! (`tests/power_loss.rs`) and in the `log_recovery` fuzz target.
//!
//! The model, per file: what reads see (the page cache) and what survives
//! a power cut (the durable bytes). A write changes only the former; an
//! `fdatasync`/`fsync` copies the file's pending writes to the latter. Per
//! directory: the entries reads see and the durable ones; a directory sync
//! makes its creations, renames and removals durable, and a new directory
//! survives only if its parent's entry does. A failed file sync
//! ([`SimDisk::fail_next_sync`]) behaves as Linux does: the pending writes
//! stay readable but are marked clean, so no later sync persists them.
//!
//! A power cut ([`SimDisk::cut_power_after`]) happens *during* a sync: the
//! syncs before it completed, that one did not, and every later operation
//! fails. [`SimDisk::crash`] then gives the disk as it is after the reboot:
//! the durable state plus, per [`Crash`] mode, none, all, or a random
//! subset of the 512-byte sectors of each write that was not synced
//! (possibly garbage: a torn write). Bytes a completed sync made durable
//! never change.
//!
//! Everything is single-threaded-deterministic: no clocks, no threads
//! (segments are prepared inline), seeded randomness only.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use settle_ledger::StoreError;

use settle_embedded::fs::{Fs, FsFile};
use settle_embedded::index::{
    CheckpointItem, Index, IndexView, Meta, OpenRecords, expiry_key, split_expiry_key,
};

/// What happens to writes that no completed sync covered when the power goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// All of them are lost.
    Drop,
    /// All of them reached the disk.
    Keep,
    /// Each 512-byte sector of each of them is lost, kept, or garbage,
    /// chosen by this seed.
    Tear(u64),
}

/// A small deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

const SECTOR: u64 = 512;

#[derive(Clone, Debug, Default)]
struct Inode {
    /// What reads see.
    data: Vec<u8>,
    /// What survives a power cut.
    durable: Vec<u8>,
    /// Writes since the last sync, in order: `(offset, bytes)`.
    pending: Vec<(u64, Vec<u8>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    File(u64),
    Dir,
}

#[derive(Clone, Debug, Default)]
struct Dir {
    current: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
}

#[derive(Debug, Default)]
struct Disk {
    /// False once the power was cut (or the disk replaced by its crash image).
    powered: bool,
    /// Completed syncs (file, directory, index).
    syncs: u64,
    /// The power goes during the sync that would complete as number `cut + 1`.
    cut_after: Option<u64>,
    /// The next file sync fails and marks its pending writes clean.
    fail_next_sync: bool,
    inodes: BTreeMap<u64, Inode>,
    next_ino: u64,
    dirs: BTreeMap<PathBuf, Dir>,
    locks: BTreeSet<PathBuf>,
}

fn lost() -> io::Error {
    io::Error::other("simulated power loss")
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", p.display()),
    )
}

fn split(path: &Path) -> io::Result<(&Path, String)> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(parent), Some(name)) => Ok((parent, name.to_string())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no parent", path.display()),
        )),
    }
}

impl Disk {
    fn check(&self) -> io::Result<()> {
        if self.powered { Ok(()) } else { Err(lost()) }
    }

    /// A sync point: fails (and cuts the power) if this is the one chosen.
    fn sync_point(&mut self) -> io::Result<()> {
        self.check()?;
        if self.cut_after == Some(self.syncs) {
            self.powered = false;
            return Err(lost());
        }
        self.syncs += 1;
        Ok(())
    }

    fn dir(&self, p: &Path) -> io::Result<&Dir> {
        self.dirs.get(p).ok_or_else(|| not_found(p))
    }

    fn dir_mut(&mut self, p: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(p).ok_or_else(|| not_found(p))
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        let (parent, name) = split(path)?;
        match self.dir(parent)?.current.get(&name) {
            Some(Node::File(ino)) => Ok(*ino),
            _ => Err(not_found(path)),
        }
    }

    /// The disk after a reboot.
    fn image(&self, mode: Crash) -> Disk {
        let mut rng = Rng::new(match mode {
            Crash::Tear(seed) => seed,
            _ => 0,
        });
        let mut out = Disk {
            powered: true,
            next_ino: self.next_ino,
            ..Disk::default()
        };
        // Directories survive through their parents' durable entries.
        let mut stack = vec![PathBuf::from("/")];
        while let Some(p) = stack.pop() {
            let Some(d) = self.dirs.get(&p) else { continue };
            for (name, node) in &d.durable {
                match node {
                    Node::Dir => stack.push(p.join(name)),
                    Node::File(ino) => {
                        if out.inodes.contains_key(ino) {
                            continue;
                        }
                        let old = &self.inodes[ino];
                        let mut data = old.durable.clone();
                        for (off, bytes) in &old.pending {
                            apply_crashed_write(&mut data, *off, bytes, mode, &mut rng);
                        }
                        out.inodes.insert(
                            *ino,
                            Inode {
                                durable: data.clone(),
                                data,
                                pending: Vec::new(),
                            },
                        );
                    }
                }
            }
            out.dirs.insert(
                p.clone(),
                Dir {
                    current: d.durable.clone(),
                    durable: d.durable.clone(),
                },
            );
        }
        out
    }
}

/// Applies what survives of one unsynced write.
fn apply_crashed_write(data: &mut Vec<u8>, off: u64, bytes: &[u8], mode: Crash, rng: &mut Rng) {
    let end = off + bytes.len() as u64;
    let put = |data: &mut Vec<u8>, from: u64, to: u64, garbage: Option<&mut Rng>| {
        if data.len() < to as usize {
            data.resize(to as usize, 0);
        }
        let src = &bytes[(from - off) as usize..(to - off) as usize];
        match garbage {
            None => data[from as usize..to as usize].copy_from_slice(src),
            Some(rng) => {
                for b in &mut data[from as usize..to as usize] {
                    *b = rng.next_u64() as u8;
                }
            }
        }
    };
    match mode {
        Crash::Drop => {}
        Crash::Keep => put(data, off, end, None),
        Crash::Tear(_) => {
            let mut s = off;
            while s < end {
                let e = ((s / SECTOR + 1) * SECTOR).min(end);
                match rng.below(10) {
                    0..=4 => put(data, s, e, None),
                    5 => put(data, s, e, Some(rng)),
                    _ => {}
                }
                s = e;
            }
        }
    }
}

/// A simulated disk (see the module docs). Cloning shares it.
#[derive(Clone, Debug)]
pub struct SimDisk {
    inner: Arc<Mutex<Disk>>,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk::new()
    }
}

impl SimDisk {
    /// An empty, powered disk with a root directory `/`.
    pub fn new() -> SimDisk {
        let mut d = Disk {
            powered: true,
            next_ino: 1,
            ..Disk::default()
        };
        d.dirs.insert(PathBuf::from("/"), Dir::default());
        SimDisk {
            inner: Arc::new(Mutex::new(d)),
        }
    }

    /// Syncs completed so far.
    pub fn syncs(&self) -> u64 {
        self.inner.lock().syncs
    }

    /// The power goes during the sync after `n` completed ones.
    pub fn cut_power_after(&self, n: u64) {
        self.inner.lock().cut_after = Some(n);
    }

    /// The power goes now.
    pub fn cut_power(&self) {
        self.inner.lock().powered = false;
    }

    /// `false` once the power was cut: every operation on this handle fails.
    pub fn is_powered(&self) -> bool {
        self.inner.lock().powered
    }

    /// The next file sync fails; its pending writes stay readable but are
    /// never persisted by a later sync (Linux after a writeback error).
    pub fn fail_next_sync(&self) {
        self.inner.lock().fail_next_sync = true;
    }

    /// Disarms every fault armed and not yet fired (a cut after some syncs,
    /// a failing next sync): from now on the disk just works.
    pub fn disarm(&self) {
        let mut d = self.inner.lock();
        d.cut_after = None;
        d.fail_next_sync = false;
    }

    /// The disk after a power cut now (if it has not happened yet) and a
    /// reboot. This handle stays dead, so nothing still holding it can
    /// touch the new image.
    pub fn crash(&self, mode: Crash) -> SimDisk {
        let mut d = self.inner.lock();
        d.powered = false;
        SimDisk {
            inner: Arc::new(Mutex::new(d.image(mode))),
        }
    }

    /// The disk as it would be after a clean reboot (everything kept):
    /// a copy sharing nothing.
    pub fn snapshot(&self) -> SimDisk {
        let d = self.inner.lock();
        let mut copy = Disk {
            powered: true,
            next_ino: d.next_ino,
            inodes: d.inodes.clone(),
            dirs: d.dirs.clone(),
            ..Disk::default()
        };
        copy.syncs = 0;
        SimDisk {
            inner: Arc::new(Mutex::new(copy)),
        }
    }

    /// Damages a file in place (bit rot), in what reads see and what is durable.
    pub fn corrupt(&self, path: &Path, offset: u64, xor: u8) -> io::Result<()> {
        let mut d = self.inner.lock();
        let ino = d.file(path)?;
        let f = d.inodes.get_mut(&ino).expect("inode");
        for v in [&mut f.data, &mut f.durable] {
            if let Some(b) = v.get_mut(offset as usize) {
                *b ^= xor;
            }
        }
        Ok(())
    }

    /// The bytes a file reads as.
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let d = self.inner.lock();
        let ino = d.file(path)?;
        Ok(d.inodes[&ino].data.clone())
    }

    fn sync_point(&self) -> io::Result<()> {
        self.inner.lock().sync_point()
    }
}

/// An open file of a [`SimDisk`].
#[derive(Debug)]
pub struct SimFile {
    disk: SimDisk,
    ino: u64,
}

impl SimFile {
    fn sync(&self) -> io::Result<()> {
        let mut d = self.disk.inner.lock();
        d.check()?;
        if std::mem::take(&mut d.fail_next_sync) {
            // Writeback failed: the pages are clean now, the data is not on disk.
            d.inodes.get_mut(&self.ino).expect("inode").pending.clear();
            return Err(io::Error::other("simulated fsync failure (EIO)"));
        }
        d.sync_point()?;
        let f = d.inodes.get_mut(&self.ino).expect("inode");
        for (off, bytes) in std::mem::take(&mut f.pending) {
            let end = off as usize + bytes.len();
            if f.durable.len() < end {
                f.durable.resize(end, 0);
            }
            f.durable[off as usize..end].copy_from_slice(&bytes);
        }
        Ok(())
    }
}

impl FsFile for SimFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.disk.inner.lock();
        d.check()?;
        let f = d.inodes.get_mut(&self.ino).expect("inode");
        let end = offset as usize + buf.len();
        if f.data.len() < end {
            f.data.resize(end, 0);
        }
        f.data[offset as usize..end].copy_from_slice(buf);
        f.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
}

/// A lock on a [`SimDisk`] path, released on drop.
#[derive(Debug)]
pub struct SimLock {
    disk: SimDisk,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.disk.inner.lock().locks.remove(&self.path);
    }
}

impl Fs for SimDisk {
    type File = SimFile;
    type Lock = SimLock;
    const BACKGROUND_PREPARE: bool = false;

    fn is_dir(&self, path: &Path) -> bool {
        self.inner.lock().dirs.contains_key(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut d = self.inner.lock();
        d.check()?;
        let (parent, name) = split(path)?;
        let p = d.dir_mut(parent)?;
        if p.current.contains_key(&name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"));
        }
        p.current.insert(name, Node::Dir);
        d.dirs.entry(path.to_path_buf()).or_default();
        Ok(())
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let d = self.inner.lock();
        d.check()?;
        Ok(d.dir(dir)?.current.keys().cloned().collect())
    }
    fn create(&self, path: &Path) -> io::Result<SimFile> {
        let mut d = self.inner.lock();
        d.check()?;
        let (parent, name) = split(path)?;
        d.dir(parent)?;
        let ino = d.next_ino;
        d.next_ino += 1;
        d.inodes.insert(ino, Inode::default());
        d.dir_mut(parent)?.current.insert(name, Node::File(ino));
        Ok(SimFile {
            disk: self.clone(),
            ino,
        })
    }
    fn open(&self, path: &Path) -> io::Result<SimFile> {
        let d = self.inner.lock();
        d.check()?;
        let ino = d.file(path)?;
        Ok(SimFile {
            disk: self.clone(),
            ino,
        })
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let d = self.inner.lock();
        d.check()?;
        let ino = d.file(path)?;
        Ok(d.inodes[&ino].data.clone())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut d = self.inner.lock();
        d.check()?;
        let ino = d.file(from)?;
        let (fp, fname) = split(from)?;
        let (tp, tname) = split(to)?;
        d.dir_mut(fp)?.current.remove(&fname);
        d.dir_mut(tp)?.current.insert(tname, Node::File(ino));
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut d = self.inner.lock();
        d.check()?;
        d.file(path)?;
        let (parent, name) = split(path)?;
        d.dir_mut(parent)?.current.remove(&name);
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut d = self.inner.lock();
        d.check()?;
        d.dir(dir)?;
        d.sync_point()?;
        let e = d.dir_mut(dir)?;
        e.durable = e.current.clone();
        Ok(())
    }
    fn lock(&self, path: &Path) -> io::Result<SimLock> {
        let mut d = self.inner.lock();
        d.check()?;
        if !d.locks.insert(path.to_path_buf()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use", path.display()),
            ));
        }
        Ok(SimLock {
            disk: self.clone(),
            path: path.to_path_buf(),
        })
    }
}

// ---- the index in memory ----

#[derive(Clone, Debug, Default)]
struct Tables {
    data: BTreeMap<Vec<u8>, Arc<[u8]>>,
    open: BTreeSet<Vec<u8>>,
    expiry: BTreeSet<Vec<u8>>,
    meta: Option<Meta>,
}

/// A stored value; `None` deletes.
type Value = Option<Arc<[u8]>>;

/// One change not yet durable.
#[derive(Clone, Debug)]
enum Op {
    /// An ingestion of one keyspace whose sync did not complete.
    Data(Vec<(Vec<u8>, Value)>),
    Open(Vec<(Vec<u8>, bool)>),
    Expiry(Vec<Vec<u8>>),
    /// Journal writes: durable at the next persist.
    Meta(Meta),
    ForgetExpiry(Vec<u8>),
}

impl Tables {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Data(items) => {
                for (k, v) in items {
                    match v {
                        Some(v) => self.data.insert(k.clone(), v.clone()),
                        None => self.data.remove(k),
                    };
                }
            }
            Op::Open(items) => {
                for (k, open) in items {
                    if *open {
                        self.open.insert(k.clone());
                    } else {
                        self.open.remove(k);
                    }
                }
            }
            Op::Expiry(keys) => self.expiry.extend(keys.iter().cloned()),
            Op::Meta(m) => self.meta = Some(*m),
            Op::ForgetExpiry(k) => {
                self.expiry.remove(k);
            }
        }
    }
}

#[derive(Debug, Default)]
struct MemState {
    /// The next persist fails as a failed fsync does: the journal writes
    /// stay readable but never become durable.
    fail_next_persist: bool,
    /// What reads see.
    live: Tables,
    /// What survives a power cut.
    durable: Tables,
    /// Changes in `live` but not in `durable`, in order.
    pending: Vec<Op>,
}

/// The index in memory, with fjall's durability points: each keyspace
/// ingestion is durable when it returns (its tables and version are
/// fsynced), journal writes (`meta`, forgotten expiry entries) when a
/// persist returns. Each of those is a sync point of its [`SimDisk`], so a
/// power cut can fall between any two of them.
#[derive(Clone, Debug)]
pub struct MemIndex {
    disk: SimDisk,
    /// The directory it lives in: it survives a power cut only with it.
    dir: PathBuf,
    inner: Arc<Mutex<MemState>>,
}

fn io_err(e: io::Error) -> StoreError {
    StoreError::Io(format!("index: {e}"))
}

impl MemIndex {
    /// An empty index in directory `dir` of `disk` (sharing its power and
    /// sync count). Like fjall's, its files live in that directory: if the
    /// directory is not durable at a power cut, the index is gone.
    pub fn new(disk: &SimDisk, dir: impl Into<PathBuf>) -> MemIndex {
        MemIndex {
            disk: disk.clone(),
            dir: dir.into(),
            inner: Arc::default(),
        }
    }

    /// The index after the power cut of `disk` and a reboot onto `after`
    /// (from [`SimDisk::crash`] with the same `mode`).
    pub fn crash(&self, after: &SimDisk, mode: Crash) -> MemIndex {
        let s = self.inner.lock();
        let survives = after.is_dir(&self.dir);
        let mut t = if survives {
            s.durable.clone()
        } else {
            Tables::default()
        };
        let mut rng = Rng::new(match mode {
            Crash::Tear(seed) => seed ^ 0x1d,
            _ => 0,
        });
        let mut journal_lost = false;
        for op in s.pending.iter().filter(|_| survives) {
            let keep = match mode {
                Crash::Drop => false,
                Crash::Keep => true,
                // The journal survives as a prefix; each ingestion independently.
                Crash::Tear(_) => match op {
                    Op::Meta(_) | Op::ForgetExpiry(_) => {
                        journal_lost |= rng.below(2) == 0;
                        !journal_lost
                    }
                    _ => rng.below(2) == 0,
                },
            };
            if keep {
                t.apply(op);
            }
        }
        MemIndex {
            disk: after.clone(),
            dir: self.dir.clone(),
            inner: Arc::new(Mutex::new(MemState {
                live: t.clone(),
                durable: t,
                ..MemState::default()
            })),
        }
    }

    /// The next persist (of `meta`) fails; its journal writes stay
    /// readable but are never persisted by a later one.
    pub fn fail_next_persist(&self) {
        self.inner.lock().fail_next_persist = true;
    }

    /// Disarms a failing next persist that has not fired.
    pub fn disarm(&self) {
        self.inner.lock().fail_next_persist = false;
    }

    /// Stores raw bytes under `key`, durably (tests: a value that does not decode).
    pub fn put_raw(&self, key: &[u8], value: &[u8], open: bool, expires_at: Option<u64>) {
        let mut g = self.inner.lock();
        let s = &mut *g;
        for t in [&mut s.live, &mut s.durable] {
            t.data.insert(key.to_vec(), value.into());
            if open {
                t.open.insert(key.to_vec());
            }
            if let Some(e) = expires_at {
                t.expiry.insert(expiry_key(e, key));
            }
        }
    }

    /// Applies a change that becomes durable at a sync point of its own.
    fn durable_op(&self, op: Op) -> Result<(), StoreError> {
        let mut s = self.inner.lock();
        s.live.apply(&op);
        match self.disk.sync_point() {
            Ok(()) => {
                s.durable.apply(&op);
                Ok(())
            }
            Err(e) => {
                s.pending.push(op);
                Err(io_err(e))
            }
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        self.disk.inner.lock().check().map_err(io_err)
    }
}

impl Index for MemIndex {
    type Bytes = Arc<[u8]>;

    fn get(&self, key: &[u8]) -> Result<Option<Arc<[u8]>>, StoreError> {
        self.check()?;
        Ok(self.inner.lock().live.data.get(key).cloned())
    }

    fn meta(&self) -> Result<Meta, StoreError> {
        self.check()?;
        Ok(self.inner.lock().live.meta.unwrap_or(Meta {
            next_fence: 1,
            ..Meta::default()
        }))
    }

    fn open_records(&self) -> Result<OpenRecords<Arc<[u8]>>, StoreError> {
        self.check()?;
        let s = self.inner.lock();
        Ok(s.live
            .open
            .iter()
            .filter_map(|k| s.live.data.get(k).map(|v| (k.clone(), v.clone())))
            .collect())
    }

    /// Nothing to pace in memory (and a pacing wait would only slow the
    /// deterministic runs down).
    fn ingest(&self, items: &[CheckpointItem<'_>], _pace: &dyn Fn()) -> Result<(), StoreError> {
        self.check()?;
        self.durable_op(Op::Data(
            items
                .iter()
                .map(|it| {
                    let v = (!it.value.is_empty()).then(|| Arc::from(it.value));
                    (it.key.to_vec(), v)
                })
                .collect(),
        ))?;
        let records = items.iter().filter(|it| it.key.first() == Some(&b'r'));
        self.durable_op(Op::Open(
            records
                .clone()
                .filter(|it| it.open || it.listed)
                .map(|it| (it.key.to_vec(), it.open))
                .collect(),
        ))?;
        self.durable_op(Op::Expiry(
            records
                .filter_map(|it| it.expires_at.map(|e| expiry_key(e, it.key)))
                .collect(),
        ))
    }

    fn commit_meta(&self, meta: &Meta) -> Result<(), StoreError> {
        self.check()?;
        let mut s = self.inner.lock();
        let op = Op::Meta(*meta);
        s.live.apply(&op);
        s.pending.push(op);
        if std::mem::take(&mut s.fail_next_persist) {
            s.pending
                .retain(|o| !matches!(o, Op::Meta(_) | Op::ForgetExpiry(_)));
            return Err(StoreError::Io("index: simulated persist failure".into()));
        }
        // persist: every journal write so far becomes durable.
        self.disk.sync_point().map_err(io_err)?;
        let journal: Vec<Op> = s
            .pending
            .iter()
            .filter(|o| matches!(o, Op::Meta(_) | Op::ForgetExpiry(_)))
            .cloned()
            .collect();
        s.pending
            .retain(|o| !matches!(o, Op::Meta(_) | Op::ForgetExpiry(_)));
        for op in &journal {
            s.durable.apply(op);
        }
        Ok(())
    }

    fn due(
        &self,
        after: Option<&[u8]>,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.check()?;
        let s = self.inner.lock();
        let end = expiry_key(now_ms.saturating_add(1), &[]);
        let start = match after {
            Some(a) => Bound::Excluded(a.to_vec()),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for k in s.live.expiry.range((start, Bound::Excluded(end))) {
            let (t, key) = split_expiry_key(k)?;
            out.push((t, key.to_vec()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn forget_expiry(&self, t: u64, key: &[u8]) -> Result<(), StoreError> {
        self.check()?;
        let mut s = self.inner.lock();
        let op = Op::ForgetExpiry(expiry_key(t, key));
        s.live.apply(&op);
        s.pending.push(op);
        Ok(())
    }

    fn keys_in(
        &self,
        range: (Bound<Vec<u8>>, Bound<Vec<u8>>),
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.check()?;
        let s = self.inner.lock();
        Ok(s.live
            .data
            .range(range)
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect())
    }

    fn view(&self) -> Result<Box<dyn IndexView>, StoreError> {
        self.check()?;
        Ok(Box::new(MemView(self.inner.lock().live.data.clone())))
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StoreError> {
        self.check()?;
        let data = self.inner.lock().live.data.clone();
        for (k, v) in &data {
            f(k, v);
        }
        Ok(())
    }
}

/// A copy of the index's entities ([`Index::view`]): later checkpoints do
/// not change it.
struct MemView(BTreeMap<Vec<u8>, Arc<[u8]>>);

impl IndexView for MemView {
    fn for_each_prefixed(
        &self,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        for (k, v) in self.0.range(prefix.to_vec()..) {
            if !k.starts_with(prefix) || !f(k, v) {
                break;
            }
        }
        Ok(())
    }
}
