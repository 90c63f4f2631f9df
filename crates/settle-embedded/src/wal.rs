//! The write-ahead log: numbered segment files of checksummed frames,
//! appended with one `write` and one `fdatasync` per group commit.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use settle_ledger::StoreError;

/// Fault injection for tests: each flag fails the next matching call once.
#[derive(Debug, Default)]
pub struct Faults {
    /// The next `write` fails before writing anything.
    pub fail_write: AtomicBool,
    /// The next `write` writes only half of its bytes, then fails (a torn write).
    pub torn_write: AtomicBool,
    /// The next `fdatasync` fails (after the bytes were handed to the OS).
    pub fail_sync: AtomicBool,
    /// The next checkpoint of the index fails.
    pub fail_checkpoint: AtomicBool,
    /// Successful log syncs so far.
    pub syncs: AtomicU64,
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

/// Existing segments, oldest first.
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        if let Ok(seq) = stem.parse::<u64>() {
            out.push((seq, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Removes segments that were being prepared when the process stopped.
pub fn remove_prepared(dir: &Path) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_str().is_some_and(|n| n.ends_with(".prep")) {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Makes a directory entry change (create, delete) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes a zero-filled file of `size` bytes and makes it durable.
///
/// Segments are preallocated with real zeros so that appending a frame
/// overwrites allocated blocks without changing the file's size: the
/// `fdatasync` after each batch then flushes only our data and does not
/// wait for a filesystem journal commit (which on ext4 would also wait for
/// the index's concurrent checkpoint writes).
fn prepare(dir: &Path, seq: u64, size: u64) -> io::Result<()> {
    let path = prepared_path(dir, seq);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// The segment being appended to.
pub struct Wal {
    dir: PathBuf,
    seq: u64,
    file: File,
    /// Offset after the last whole frame.
    bytes: u64,
    /// Preallocated size of each segment.
    size: u64,
    faults: Option<Arc<Faults>>,
    /// The next segment, being zero-filled in the background.
    next: Option<JoinHandle<io::Result<()>>>,
}

impl Wal {
    /// Creates segment `seq` (it must not exist), preallocated, durable.
    pub fn create(dir: &Path, seq: u64, size: u64, faults: Option<Arc<Faults>>) -> io::Result<Wal> {
        prepare(dir, seq, size)?;
        Wal::install(dir, seq, size, 0, faults)
    }

    /// Continues writing segment `seq` after its `valid` bytes of whole frames
    /// (the rest of it is zeros).
    pub fn resume(
        dir: &Path,
        seq: u64,
        size: u64,
        valid: u64,
        faults: Option<Arc<Faults>>,
    ) -> io::Result<Wal> {
        let file = OpenOptions::new()
            .write(true)
            .open(segment_path(dir, seq))?;
        let mut w = Wal {
            dir: dir.to_path_buf(),
            seq,
            file,
            bytes: valid,
            size,
            faults,
            next: None,
        };
        w.prepare_next();
        Ok(w)
    }

    /// Renames the prepared file into place and makes that durable.
    fn install(
        dir: &Path,
        seq: u64,
        size: u64,
        valid: u64,
        faults: Option<Arc<Faults>>,
    ) -> io::Result<Wal> {
        std::fs::rename(prepared_path(dir, seq), segment_path(dir, seq))?;
        sync_dir(dir)?;
        Wal::resume(dir, seq, size, valid, faults)
    }

    fn prepare_next(&mut self) {
        let (dir, seq, size) = (self.dir.clone(), self.seq + 1, self.size);
        self.next = Some(std::thread::spawn(move || prepare(&dir, seq, size)));
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `len` more bytes fit in the preallocated space.
    pub fn fits(&self, len: usize) -> bool {
        self.bytes + len as u64 <= self.size
    }

    /// One positioned `write` and one `fdatasync`. On error the segment's
    /// tail is in an unknown state: the caller must stop writing (fail
    /// closed), never retry.
    pub fn append_sync(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(f) = &self.faults {
            if Faults::take(&f.fail_write) {
                return Err(injected("write"));
            }
            if Faults::take(&f.torn_write) {
                self.file.write_all_at(&buf[..buf.len() / 2], self.bytes)?;
                return Err(injected("torn write"));
            }
        }
        self.file.write_all_at(buf, self.bytes)?;
        if let Some(f) = &self.faults
            && Faults::take(&f.fail_sync)
        {
            return Err(injected("fdatasync"));
        }
        self.file.sync_data()?;
        if let Some(f) = &self.faults {
            f.syncs.fetch_add(1, Ordering::SeqCst);
        }
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Starts the next segment (normally prepared already); returns the sealed one's number.
    pub fn rotate(&mut self) -> io::Result<u64> {
        match self.next.take().map(|h| h.join()) {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(_)) => return Err(io::Error::other("segment preparation panicked")),
            None => prepare(&self.dir, self.seq + 1, self.size)?,
        }
        let next = Wal::install(&self.dir, self.seq + 1, self.size, 0, self.faults.clone())?;
        let old = std::mem::replace(self, next);
        Ok(old.seq)
    }
}

/// The bytes of one segment (decode them with [`crate::codec::decode_frames`]).
pub fn read_segment(path: &Path) -> Result<Vec<u8>, StoreError> {
    let mut buf = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))?;
    Ok(buf)
}

/// Whether everything after the whole frames is the preallocated zeros.
pub fn clean_tail(buf: &[u8], valid: usize) -> bool {
    buf[valid..].iter().all(|&b| b == 0)
}

/// Overwrites a torn tail (bytes after the last whole frame) with zeros,
/// durably, so later appends follow whole frames and a later recovery
/// does not mistake it for damage.
pub fn zero_tail(path: &Path, from: u64, len: u64) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    f.write_all_at(&vec![0u8; (len - from) as usize], from)
        .and_then(|_| f.sync_data())
        .map_err(|e| StoreError::Io(e.to_string()))
}
