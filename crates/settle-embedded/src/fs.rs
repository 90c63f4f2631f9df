//! The I/O seam: everything the log and its recovery do to files and
//! directories goes through [`Fs`], so the same code runs on the real
//! filesystem ([`OsFs`]) and on a simulated disk that loses unsynced writes
//! at a power cut (`settle-sim`'s `disk::SimDisk`).
//!
//! The engine is generic over it (static dispatch); the calls are per
//! batch, per segment or per recovery, never per command.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::pace::STEP_BYTES;

/// A filesystem as the log sees it.
pub trait Fs: Clone + Send + Sync + 'static {
    /// An open file.
    type File: FsFile;
    /// Held while a store has its directory open.
    type Lock: Send + Sync + 'static;
    /// Whether the next log segment may be zero-filled on a background
    /// thread (the simulated disk prepares it inline, to stay deterministic).
    const BACKGROUND_PREPARE: bool;

    /// Whether `path` is an existing directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// Creates one directory (its parent must exist). Not durable until the
    /// parent directory is synced.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries of a directory.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates (or truncates) a file for writing.
    fn create(&self, path: &Path) -> io::Result<Self::File>;
    /// Opens an existing file for writing.
    fn open(&self, path: &Path) -> io::Result<Self::File>;
    /// Creates (or truncates) `path` holding `size` zero bytes on written
    /// (not merely reserved) blocks, and makes it durable. `pace` is called
    /// between steps of the writing (it may wait: see [`crate::pace`]).
    fn create_zeroed(&self, path: &Path, size: u64, pace: &dyn Fn()) -> io::Result<()> {
        let _ = pace;
        let f = self.create(path)?;
        write_zeros(&f, 0, size)?;
        f.sync_all()
    }
    /// Creates (or truncates) `path` holding `size` bytes that read as
    /// zeros on blocks reserved for it but not written (`fallocate`: no
    /// zeros go to the disk), and makes it durable. The first write to
    /// each block then also commits the filesystem's record of it at the
    /// next `fdatasync`. Where the filesystem cannot reserve, it writes
    /// zeros ([`Fs::create_zeroed`]); by default, too.
    fn create_allocated(&self, path: &Path, size: u64, pace: &dyn Fn()) -> io::Result<()> {
        self.create_zeroed(path, size, pace)
    }
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The whole content of a file, into `buf` (its capacity reused).
    fn read_into(&self, path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
        *buf = self.read(path)?;
        Ok(())
    }
    /// Renames a file (atomic; not durable until the directory is synced).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file (not durable until the directory is synced).
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes a file that nothing will read again (a checkpointed log
    /// segment), giving its blocks back in steps with `pace` between them.
    /// Not durable until the directory is synced.
    fn remove_paced(&self, path: &Path, pace: &dyn Fn()) -> io::Result<()> {
        let _ = pace;
        self.remove(path)
    }
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// An exclusive lock on `path` (created if needed), refused if held.
    fn lock(&self, path: &Path) -> io::Result<Self::Lock>;
}

/// An open file of an [`Fs`].
pub trait FsFile: Send + Sync + 'static {
    /// Writes all of `buf` at `offset` (not durable until synced).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: the data (and the size needed to read it) is durable.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`.
    fn sync_all(&self) -> io::Result<()>;
}

/// Writes zeros over `from..size` of `f`, a megabyte at a time.
fn write_zeros<Fl: FsFile>(f: &Fl, from: u64, size: u64) -> io::Result<()> {
    let zeros = vec![0u8; (1 << 20).min((size - from.min(size)) as usize)];
    let mut at = from;
    while at < size {
        let n = (size - at).min(zeros.len() as u64) as usize;
        f.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Bytes a paced removal gives back per step.
const SHRINK_STEP: u64 = 1 << 20;

/// Alignment of `O_DIRECT` buffers, offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// Zero-fills `path` with `O_DIRECT` writes: the zeros go from one buffer
/// straight to the disk, without being copied into the page cache (the
/// buffered copy was as much CPU as writing the log itself). The whole
/// file is then read ahead into the page cache by the kernel (DMA, no
/// copy), so that appending a frame finds its pages cached and does not
/// read them back first. An error means "not supported here" as well as
/// a real failure: the caller falls back to buffered writes.
///
/// The zeros go in steps of [`STEP_BYTES`], `pace` between them: the log's
/// `fdatasync` waits for every write in the disk's queue, and a 1 MiB step
/// held it for 10–30 ms (docs/performance.md).
fn zero_fill_direct(path: &Path, size: u64, pace: &dyn Fn()) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let direct = size - size % DIRECT_ALIGN as u64;
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)?;
    let chunk = STEP_BYTES.min(direct as usize);
    let raw = vec![0u8; chunk + DIRECT_ALIGN];
    let skew = raw.as_ptr() as usize % DIRECT_ALIGN;
    let start = (DIRECT_ALIGN - skew) % DIRECT_ALIGN;
    let zeros = &raw[start..start + chunk];
    let mut at = 0;
    while at < direct {
        let n = (direct - at).min(chunk as u64) as usize;
        if at > 0 {
            pace();
        }
        FileExt::write_all_at(&f, &zeros[..n], at)?;
        at += n as u64;
    }
    drop(f);
    let f = OpenOptions::new().write(true).open(path)?;
    // An unaligned tail, buffered.
    write_zeros(&f, direct, size)?;
    f.sync_all()?;
    if let Some(len) = std::num::NonZeroU64::new(size) {
        // Advice only: without it, appends read the pages they touch first.
        let _ = rustix::fs::fadvise(&f, 0, Some(len), rustix::fs::Advice::WillNeed);
    }
    Ok(())
}

/// The real filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl FsFile for File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

impl Fs for OsFs {
    type File = File;
    type Lock = File;
    const BACKGROUND_PREPARE: bool = true;

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            if let Ok(name) = e?.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }
    fn create(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
    }
    fn open(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new().write(true).open(path)
    }
    fn create_zeroed(&self, path: &Path, size: u64, pace: &dyn Fn()) -> io::Result<()> {
        if zero_fill_direct(path, size, pace).is_ok() {
            return Ok(());
        }
        // No O_DIRECT here (tmpfs, some filesystems): buffered zeros.
        let f = self.create(path)?;
        write_zeros(&f, 0, size)?;
        f.sync_all()
    }
    fn create_allocated(&self, path: &Path, size: u64, pace: &dyn Fn()) -> io::Result<()> {
        let f = self.create(path)?;
        match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, size) {
            Ok(()) => f.sync_all(),
            // Not supported by this filesystem (or not here): real zeros.
            Err(_) => {
                drop(f);
                self.create_zeroed(path, size, pace)
            }
        }
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        File::open(path)?.read_to_end(&mut buf)?;
        Ok(buf)
    }
    fn read_into(&self, path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
        buf.clear();
        File::open(path)?.read_to_end(buf)?;
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    /// On a filesystem mounted with `discard` (the test machines' ext4),
    /// the blocks of a removed file are discarded when the journal
    /// commits, and the commit waits for it: removing a 64 MiB segment at
    /// once held the log's `fdatasync` for 15–50 ms. So the file is cut
    /// down [`SHRINK_STEP`] at a time, each cut committed (`fsync`) before
    /// the next, `pace` between them; then removed. The file is checkpointed:
    /// a crash half-way leaves a shorter covered segment, which recovery
    /// removes without reading.
    fn remove_paced(&self, path: &Path, pace: &dyn Fn()) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        let mut len = f.metadata()?.len();
        while len > SHRINK_STEP {
            len -= SHRINK_STEP;
            f.set_len(len)?;
            f.sync_all()?;
            pace();
        }
        drop(f);
        std::fs::remove_file(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn lock(&self, path: &Path) -> io::Result<File> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        f.try_lock().map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} is in use by another process",
                    path.parent().unwrap_or(path).display()
                ),
            )
        })?;
        Ok(f)
    }
}

/// `mkdir -p`, durably: each directory it creates is made durable by
/// syncing its parent, so a power cut cannot take a fresh data directory
/// (and the log inside it) away after writes to it were acknowledged.
pub fn create_dir_all_durable<F: Fs>(fs: &F, path: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut p = path;
    while !fs.is_dir(p) {
        missing.push(p);
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => break,
        }
    }
    for dir in missing.into_iter().rev() {
        match fs.create_dir(dir) {
            Ok(()) => {}
            // Created concurrently: still sync its parent below.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        fs.sync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whichever way it is written (O_DIRECT where the filesystem takes it,
    /// buffered otherwise), a prepared file is exactly `size` zeros, also
    /// over an older file's bytes and with a tail that is not block-aligned.
    #[test]
    fn create_zeroed_leaves_exactly_size_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg.prep");
        std::fs::write(&path, vec![0xab; 3 * DIRECT_ALIGN + 7]).unwrap();
        for size in [2 * DIRECT_ALIGN as u64 + 100, 16 * 1024, 100] {
            OsFs.create_zeroed(&path, size, &|| {}).unwrap();
            let got = OsFs.read(&path).unwrap();
            assert_eq!(got.len() as u64, size);
            assert!(got.iter().all(|&b| b == 0));
        }
    }

    /// Reserved rather than written, a prepared file reads the same:
    /// exactly `size` zeros, also over an older, longer file's bytes (the
    /// recovery's check that a segment's tail is zeros relies on it).
    #[test]
    fn create_allocated_leaves_exactly_size_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg.prep");
        for size in [2 * DIRECT_ALIGN as u64 + 100, 16 * 1024, 100] {
            std::fs::write(&path, vec![0xab; 5 * DIRECT_ALIGN + 7]).unwrap();
            OsFs.create_allocated(&path, size, &|| {}).unwrap();
            let got = OsFs.read(&path).unwrap();
            assert_eq!(got.len() as u64, size);
            assert!(got.iter().all(|&b| b == 0));
            // Written over in place, it keeps its size and its other zeros.
            let f = OsFs.open(&path).unwrap();
            FsFile::write_at(&f, b"frame", 10).unwrap();
            FsFile::sync_data(&f).unwrap();
            let got = OsFs.read(&path).unwrap();
            assert_eq!(got.len() as u64, size);
            assert_eq!(&got[10..15], b"frame");
            assert!(got[..10].iter().chain(&got[15..]).all(|&b| b == 0));
        }
    }

    /// The zero-fill takes turns with the log: `pace` runs between its
    /// steps (where `O_DIRECT` is taken; the buffered fallback is one
    /// burst that the final `fsync` writes out).
    #[test]
    fn the_zero_fill_paces_between_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg.prep");
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let size = 4 * STEP_BYTES as u64 + 100;
        OsFs.create_zeroed(&path, size, &|| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(OsFs.read(&path).unwrap(), vec![0; size as usize]);
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(&path)
                .is_ok()
        };
        let calls = calls.into_inner();
        assert_eq!(calls, if direct { 3 } else { 0 });
    }

    /// A checkpointed segment is given back in steps, `pace` between them,
    /// and is gone at the end.
    #[test]
    fn a_paced_removal_shrinks_in_steps_then_removes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000001.log");
        std::fs::write(&path, vec![1u8; 4 * SHRINK_STEP as usize + 10]).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        OsFs.remove_paced(&path, &|| {
            seen.lock()
                .unwrap()
                .push(std::fs::metadata(&path).unwrap().len());
        })
        .unwrap();
        assert!(!path.exists());
        let lens = seen.into_inner().unwrap();
        assert_eq!(
            lens,
            [3, 2, 1, 0].map(|i| i * SHRINK_STEP + 10).to_vec(),
            "one step of SHRINK_STEP per pace"
        );
    }
}
