//! The write-ahead log: numbered segment files of checksummed frames,
//! appended with one `write` and one `fdatasync` per group commit.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use settle_ledger::StoreError;

use crate::codec::place_frame;
use crate::fs::{Fs, FsFile};
use crate::pace::Pacer;

/// A step of a checkpoint, for crash injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointStep {
    /// The index tables were ingested (durable), `meta` not yet written.
    TablesWritten,
    /// `meta` was written and persisted; the segment is still there.
    Persisted,
    /// The covered segment was deleted and the directory synced; nothing
    /// evicted from memory yet.
    SegmentDeleted,
    /// What may leave memory left it; the record keys the checkpoint took
    /// and kept are not given back yet (listings wait).
    Evicted,
}

type Hook = Arc<dyn Fn(CheckpointStep) + Send + Sync>;

#[derive(Default)]
struct Gate {
    held: bool,
    /// A checkpoint is waiting at the gate.
    holding: bool,
    writer_waiting: bool,
    /// Log syncs wait at the gate ([`Faults::hold_syncs`]).
    syncs_held: bool,
    /// A sync is waiting at the gate.
    sync_holding: bool,
    /// Commands the writer began to apply.
    applied: u64,
}

/// Fault injection for tests: each flag fails the next matching call once.
#[derive(Default)]
pub struct Faults {
    /// The next `write` fails before writing anything.
    pub fail_write: AtomicBool,
    /// The next `write` writes only half of its bytes, then fails (a torn write).
    pub torn_write: AtomicBool,
    /// The next `fdatasync` fails (after the bytes were handed to the OS).
    pub fail_sync: AtomicBool,
    /// The next checkpoint of the index fails.
    pub fail_checkpoint: AtomicBool,
    /// The next move to a new log segment fails.
    pub fail_rotate: AtomicBool,
    /// Preparing a segment in the background takes this long (ms).
    pub prepare_delay_ms: AtomicU64,
    /// Segment preparations running right now.
    pub prepares_running: AtomicUsize,
    /// Segments prepared so far as [`Prep::Allocated`] (reserved, or zeros
    /// where the filesystem cannot reserve).
    pub prepared_allocated: AtomicUsize,
    /// Each checkpoint waits this long first (ms): a slow index.
    pub checkpoint_delay_ms: AtomicU64,
    /// Whether checkpoints are held ([`Faults::hold_checkpoints`]) and
    /// whether the writer waits for the checkpointer (backpressure).
    gate: Mutex<Gate>,
    changed: Condvar,
    /// No checkpoint runs from now on (one held by [`Faults::hold_checkpoints`]
    /// is skipped when released) and `close` does not seal the last
    /// segment: the log stays as a crash would leave it.
    pub halt_checkpoints: AtomicBool,
    /// The writer thread panics at the next command it applies.
    pub panic_writer: AtomicBool,
    /// Called at each step of each checkpoint (to cut a simulated power there).
    pub checkpoint_hook: Mutex<Option<Hook>>,
    /// Called by a live export after it marked its instant and before it
    /// reads the map (on the export's thread; writes go on meanwhile).
    /// Read only with the `faults` feature (through the store's `Shared`).
    #[cfg_attr(not(feature = "faults"), allow(dead_code))]
    pub export_hook: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// Successful log syncs so far.
    pub syncs: AtomicU64,
    /// Checkpoints completed so far.
    pub checkpoints: AtomicU64,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("syncs", &self.syncs)
            .finish_non_exhaustive()
    }
}

impl Faults {
    fn take(flag: &AtomicBool) -> bool {
        flag.swap(false, Ordering::SeqCst)
    }
    pub(crate) fn take_checkpoint(faults: &Option<Arc<Faults>>) -> bool {
        faults
            .as_ref()
            .is_some_and(|f| Faults::take(&f.fail_checkpoint))
    }
    pub(crate) fn take_panic(faults: &Option<Arc<Faults>>) -> bool {
        faults
            .as_ref()
            .is_some_and(|f| Faults::take(&f.panic_writer))
    }
    pub(crate) fn set_writer_waiting(faults: &Option<Arc<Faults>>, waiting: bool) {
        if let Some(f) = faults {
            f.gate.lock().writer_waiting = waiting;
            f.changed.notify_all();
        }
    }
    pub(crate) fn applying(faults: &Option<Arc<Faults>>) {
        if let Some(f) = faults {
            f.gate.lock().applied += 1;
            f.changed.notify_all();
        }
    }
    fn before_sync(&self) {
        let mut g = self.gate.lock();
        if g.syncs_held {
            g.sync_holding = true;
            self.changed.notify_all();
            while g.syncs_held {
                self.changed.wait(&mut g);
            }
            g.sync_holding = false;
        }
    }
    /// The checkpoint delay faults: a fixed delay, then the hold.
    pub(crate) fn before_checkpoint(faults: &Option<Arc<Faults>>) {
        let Some(f) = faults else { return };
        let ms = f.checkpoint_delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let mut g = f.gate.lock();
        if g.held {
            g.holding = true;
            f.changed.notify_all();
            while g.held {
                f.changed.wait(&mut g);
            }
            g.holding = false;
        }
    }
    pub(crate) fn halted(faults: &Option<Arc<Faults>>) -> bool {
        faults
            .as_ref()
            .is_some_and(|f| f.halt_checkpoints.load(Ordering::SeqCst))
    }
    pub(crate) fn step(faults: &Option<Arc<Faults>>, step: CheckpointStep) {
        if let Some(f) = faults {
            let hook = f.checkpoint_hook.lock().clone();
            if let Some(h) = hook {
                h(step);
            }
        }
    }
}

/// What a test does with its faults: hold and release checkpoints and
/// syncs, and wait for the writer to reach a point.
#[cfg(feature = "faults")]
impl Faults {
    /// Checkpoints wait until [`Faults::release_checkpoints`].
    pub fn hold_checkpoints(&self) {
        self.gate.lock().held = true;
    }
    /// Lets held checkpoints go on (see [`Faults::hold_checkpoints`]).
    pub fn release_checkpoints(&self) {
        self.gate.lock().held = false;
        self.changed.notify_all();
    }
    /// Blocks until the writer waits for a checkpointer that is held at
    /// the gate, so it will wait until released (`true`), or until the
    /// checkpoints are released (`false`).
    pub fn wait_for_writer_to_wait(&self) -> bool {
        let mut g = self.gate.lock();
        while !(g.writer_waiting && g.holding) && g.held {
            self.changed.wait(&mut g);
        }
        g.writer_waiting && g.holding
    }
    /// Log syncs (after their write, before the `fdatasync`) wait until
    /// [`Faults::release_syncs`].
    pub fn hold_syncs(&self) {
        self.gate.lock().syncs_held = true;
    }
    /// Lets held syncs go on.
    pub fn release_syncs(&self) {
        self.gate.lock().syncs_held = false;
        self.changed.notify_all();
    }
    /// Blocks until a sync waits at the gate (`true`), or syncs are released (`false`).
    pub fn wait_for_held_sync(&self) -> bool {
        let mut g = self.gate.lock();
        while !g.sync_holding && g.syncs_held {
            self.changed.wait(&mut g);
        }
        g.sync_holding
    }
    /// Commands the writer began to apply so far.
    pub fn applied(&self) -> u64 {
        self.gate.lock().applied
    }
    /// Blocks until the writer began to apply `n` commands in all.
    pub fn wait_for_applied(&self, n: u64) {
        let mut g = self.gate.lock();
        while g.applied < n {
            self.changed.wait(&mut g);
        }
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

pub fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.log"))
}

fn prepared_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.prep"))
}

/// A segment's number from its file name.
pub fn segment_seq(name: &str) -> Option<u64> {
    name.strip_suffix(".log")?.parse().ok()
}

/// Existing segments, oldest first.
pub fn segments<F: Fs>(fs: &F, dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = fs
        .list(dir)?
        .iter()
        .filter_map(|n| segment_seq(n).map(|s| (s, dir.join(n))))
        .collect();
    out.sort();
    Ok(out)
}

/// Leftover segments that were being prepared when the process stopped.
pub fn prepared<F: Fs>(fs: &F, dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(fs
        .list(dir)?
        .iter()
        .filter(|n| n.ends_with(".prep"))
        .map(|n| dir.join(n))
        .collect())
}

/// How a segment's blocks are prepared before the log writes to it.
///
/// [`Prep::Zeroed`] writes real zeros: appending a frame then overwrites
/// written blocks without changing the file, and the `fdatasync` after
/// each batch flushes only our data, with no filesystem journal commit
/// (which on ext4 would also wait for the index's concurrent checkpoint
/// writes). But every byte of the log then goes to the disk twice, and at
/// high throughput the disk's bandwidth is the bound: the zeros of the
/// next segment share each sync's device flush with the frames.
/// [`Prep::Allocated`] only reserves the blocks (`fallocate`); each sync
/// then also commits the journal (a fixed cost per sync), and nothing is
/// written twice. Measured on the test machine, alternating runs:
/// reserving gave 8–12 % more pairs/s with frames of ~190 KB (1,024 in
/// flight) and 10–23 % with frames of ~45 KB (256 in flight), and cost
/// 3–9 % with frames of ~8 KB (64 in flight). So the log picks by the
/// frames it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prep {
    Zeroed,
    Allocated,
}

/// A segment whose frames averaged at least this many bytes has the
/// segment after the next one reserved rather than zero-filled (between
/// the ~8 KB frames where zeros win and the ~45 KB where reserving does).
pub const ALLOCATE_FROM_FRAME_BYTES: u64 = 32 * 1024;

impl Prep {
    /// How to prepare a segment after one that took `frames` frames in
    /// `bytes` bytes.
    pub fn after(frames: u64, bytes: u64) -> Prep {
        if frames > 0 && bytes / frames >= ALLOCATE_FROM_FRAME_BYTES {
            Prep::Allocated
        } else {
            Prep::Zeroed
        }
    }
}

/// Prepares segment `seq`'s file of `size` zero bytes and makes it durable.
fn prepare<F: Fs>(
    fs: &F,
    dir: &Path,
    seq: u64,
    size: u64,
    prep: Prep,
    faults: &Option<Arc<Faults>>,
    pace: &dyn Fn(),
) -> io::Result<()> {
    if let Some(f) = faults {
        let ms = f.prepare_delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
    let path = prepared_path(dir, seq);
    match prep {
        Prep::Zeroed => fs.create_zeroed(&path, size, pace),
        Prep::Allocated => {
            if let Some(f) = faults {
                f.prepared_allocated.fetch_add(1, Ordering::SeqCst);
            }
            fs.create_allocated(&path, size, pace)
        }
    }
}

/// The segment being appended to.
pub struct Wal<F: Fs> {
    fs: F,
    dir: PathBuf,
    seq: u64,
    file: F::File,
    /// Offset after the last whole frame.
    bytes: u64,
    /// Frames appended to this segment by this process, and their bytes.
    frames: u64,
    frame_bytes: u64,
    /// Preallocated size of each segment.
    size: u64,
    faults: Option<Arc<Faults>>,
    /// The next segment, being zero-filled in the background.
    next: Option<JoinHandle<io::Result<()>>>,
    /// Told of every sync; background writes take turns with them.
    pacer: Arc<Pacer>,
}

impl<F: Fs> Wal<F> {
    /// Creates segment `seq` (it must not exist), preallocated, durable.
    pub fn create(
        fs: &F,
        dir: &Path,
        seq: u64,
        size: u64,
        faults: Option<Arc<Faults>>,
        pacer: Arc<Pacer>,
    ) -> io::Result<Wal<F>> {
        // Nothing to protect yet: the store is opening.
        prepare(fs, dir, seq, size, Prep::Zeroed, &faults, &|| {})?;
        Wal::install(fs, dir, seq, size, Prep::Zeroed, faults, pacer)
    }

    /// Continues writing segment `seq` after its `valid` bytes of whole frames
    /// (the rest of it is zeros); the next segment is zero-filled.
    pub fn resume(
        fs: &F,
        dir: &Path,
        seq: u64,
        size: u64,
        valid: u64,
        faults: Option<Arc<Faults>>,
        pacer: Arc<Pacer>,
    ) -> io::Result<Wal<F>> {
        Wal::resume_with(fs, dir, seq, size, valid, Prep::Zeroed, faults, pacer)
    }

    /// [`Wal::resume`], the next segment prepared as `next`.
    #[allow(clippy::too_many_arguments)]
    fn resume_with(
        fs: &F,
        dir: &Path,
        seq: u64,
        size: u64,
        valid: u64,
        next: Prep,
        faults: Option<Arc<Faults>>,
        pacer: Arc<Pacer>,
    ) -> io::Result<Wal<F>> {
        let file = fs.open(&segment_path(dir, seq))?;
        let mut w = Wal {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            seq,
            file,
            bytes: valid,
            frames: 0,
            frame_bytes: 0,
            size,
            faults,
            next: None,
            pacer,
        };
        w.prepare_next(next);
        Ok(w)
    }

    /// Renames the prepared file into place and makes that durable; the
    /// segment after it is prepared as `next`.
    fn install(
        fs: &F,
        dir: &Path,
        seq: u64,
        size: u64,
        next: Prep,
        faults: Option<Arc<Faults>>,
        pacer: Arc<Pacer>,
    ) -> io::Result<Wal<F>> {
        fs.rename(&prepared_path(dir, seq), &segment_path(dir, seq))?;
        fs.sync_dir(dir)?;
        Wal::resume_with(fs, dir, seq, size, 0, next, faults, pacer)
    }

    fn prepare_next(&mut self, prep: Prep) {
        if !F::BACKGROUND_PREPARE {
            return;
        }
        let (fs, dir, seq, size) = (self.fs.clone(), self.dir.clone(), self.seq + 1, self.size);
        let faults = self.faults.clone();
        let pacer = self.pacer.clone();
        if let Some(f) = &faults {
            f.prepares_running.fetch_add(1, Ordering::SeqCst);
        }
        let spawned = std::thread::Builder::new()
            .name("settle-prepare".into())
            .spawn(move || {
                let r = prepare(&fs, &dir, seq, size, prep, &faults, &|| pacer.step());
                if let Some(f) = &faults {
                    f.prepares_running.fetch_sub(1, Ordering::SeqCst);
                }
                r
            });
        // As `std::thread::spawn` would: a process that cannot start a
        // thread cannot run the store.
        self.next = Some(spawned.expect("starting the segment preparation thread"));
    }

    /// The segment being written.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `len` more bytes fit in the preallocated space.
    pub fn fits(&self, len: usize) -> bool {
        self.bytes + len as u64 <= self.size
    }

    /// Places the frame in `buf` at the end of the log, then one positioned
    /// `write` and one `fdatasync`. On error the segment's tail is in an
    /// unknown state: the caller must stop writing (fail closed), never retry.
    pub fn append_sync(&mut self, buf: &mut [u8]) -> io::Result<()> {
        place_frame(buf, self.seq, self.bytes);
        if let Some(f) = &self.faults {
            if Faults::take(&f.fail_write) {
                return Err(injected("write"));
            }
            if Faults::take(&f.torn_write) {
                self.file.write_at(&buf[..buf.len() / 2], self.bytes)?;
                return Err(injected("torn write"));
            }
        }
        self.file.write_at(buf, self.bytes)?;
        if let Some(f) = &self.faults {
            f.before_sync();
            if Faults::take(&f.fail_sync) {
                return Err(injected("fdatasync"));
            }
        }
        self.file.sync_data()?;
        if let Some(f) = &self.faults {
            f.syncs.fetch_add(1, Ordering::SeqCst);
        }
        self.bytes += buf.len() as u64;
        self.frames += 1;
        self.frame_bytes += buf.len() as u64;
        // Past half of the segment, the next one must be ready in time.
        self.pacer.synced(self.bytes * 2 >= self.size);
        Ok(())
    }

    /// Starts the next segment (normally prepared already); returns the sealed one's number.
    pub fn rotate(&mut self) -> io::Result<u64> {
        if let Some(f) = &self.faults
            && Faults::take(&f.fail_rotate)
        {
            return Err(injected("segment rotation"));
        }
        // The writer waits for the next segment: no more pacing.
        self.pacer.hurry();
        match self.next.take().map(|h| h.join()) {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(_)) => return Err(io::Error::other("segment preparation panicked")),
            // Inline: the writer is the one waiting.
            None => prepare(
                &self.fs,
                &self.dir,
                self.seq + 1,
                self.size,
                Prep::Zeroed,
                &self.faults,
                &|| {},
            )?,
        }
        // The segment after the next one, by the frames of this one (the
        // next one was prepared while this one was written).
        let after = Prep::after(self.frames, self.frame_bytes);
        let next = Wal::install(
            &self.fs,
            &self.dir,
            self.seq + 1,
            self.size,
            after,
            self.faults.clone(),
            self.pacer.clone(),
        )?;
        let old = std::mem::replace(self, next);
        Ok(old.seq)
    }
}

impl<F: Fs> Drop for Wal<F> {
    /// The preparation thread never outlives the log (nor the store's lock):
    /// a leftover `.prep` written after another process opened the
    /// directory would race with it.
    fn drop(&mut self) {
        if let Some(h) = self.next.take() {
            let _ = h.join();
        }
    }
}

/// The bytes of one segment, into `buf`.
pub fn read_segment_into<F: Fs>(fs: &F, path: &Path, buf: &mut Vec<u8>) -> Result<(), StoreError> {
    fs.read_into(path, buf)
        .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))
}

/// The bytes of one segment.
pub fn read_segment<F: Fs>(fs: &F, path: &Path) -> Result<Vec<u8>, StoreError> {
    fs.read(path)
        .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))
}

/// Bytes looked at together by [`first_nonzero`] and [`last_nonzero`]: a
/// chunk ORed together compiles to vector instructions, where a byte at a
/// time took ~1 instruction per byte (a segment's zeros are tens of MB at
/// a close or a reopen).
const ZERO_CHUNK: usize = 64;

fn all_zero(chunk: &[u8]) -> bool {
    chunk.iter().fold(0u8, |a, &b| a | b) == 0
}

/// The first non-zero byte at or after `from`.
pub fn first_nonzero(buf: &[u8], from: usize) -> Option<usize> {
    let from = from.min(buf.len());
    let (i, chunk) = buf[from..]
        .chunks(ZERO_CHUNK)
        .enumerate()
        .find(|(_, c)| !all_zero(c))?;
    let p = chunk.iter().position(|&b| b != 0)?;
    Some(from + i * ZERO_CHUNK + p)
}

/// The last non-zero byte (its offset), if any.
pub fn last_nonzero(buf: &[u8]) -> Option<usize> {
    // Chunks from the front, so every chunk but the last is whole.
    let chunks = buf.chunks(ZERO_CHUNK);
    let (i, chunk) = chunks.enumerate().rev().find(|(_, c)| !all_zero(c))?;
    let p = chunk.iter().rposition(|&b| b != 0)?;
    Some(i * ZERO_CHUNK + p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The chunked scans find what a byte-at-a-time scan finds, at
        /// every offset around the chunk edges.
        #[test]
        fn the_zero_scans_agree_with_a_byte_at_a_time(
            len in 0usize..300,
            set in proptest::collection::vec((0usize..300, 1u8..=255), 0..3),
            from in 0usize..320,
        ) {
            let mut buf = vec![0u8; len];
            for (at, v) in set {
                if at < len {
                    buf[at] = v;
                }
            }
            let first = buf[from.min(len)..].iter().position(|&b| b != 0).map(|p| from + p);
            prop_assert_eq!(first_nonzero(&buf, from), first);
            prop_assert_eq!(last_nonzero(&buf), buf.iter().rposition(|&b| b != 0));
        }
    }
}
