//! The write-ahead log: numbered segment files of checksummed frames,
//! appended with one `write` and one `fdatasync` per group commit.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

/// Makes a directory entry change (create, delete) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The segment being appended to.
pub struct Wal {
    dir: PathBuf,
    seq: u64,
    file: File,
    bytes: u64,
    faults: Option<Arc<Faults>>,
}

impl Wal {
    /// Creates segment `seq` (it must not exist) and makes its creation durable.
    pub fn create(dir: &Path, seq: u64, faults: Option<Arc<Faults>>) -> io::Result<Wal> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(segment_path(dir, seq))?;
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            seq,
            file,
            bytes: 0,
            faults,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One `write` and one `fdatasync`. On error the segment's tail is in an
    /// unknown state: the caller must stop writing (fail closed), never retry.
    pub fn append_sync(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(f) = &self.faults {
            if Faults::take(&f.fail_write) {
                return Err(injected("write"));
            }
            if Faults::take(&f.torn_write) {
                self.file.write_all(&buf[..buf.len() / 2])?;
                return Err(injected("torn write"));
            }
        }
        self.file.write_all(buf)?;
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

    /// Starts the next segment; returns the sealed one's number.
    pub fn rotate(&mut self) -> io::Result<u64> {
        let next = Wal::create(&self.dir, self.seq + 1, self.faults.clone())?;
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

/// Cuts a torn tail off the last segment so later appends follow whole frames.
pub fn truncate(path: &Path, len: u64) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    f.set_len(len).map_err(|e| StoreError::Io(e.to_string()))?;
    f.sync_all().map_err(|e| StoreError::Io(e.to_string()))
}
