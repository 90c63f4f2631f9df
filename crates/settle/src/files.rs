//! The files the commands write (export, backup, migrate): SPEC §12 —
//! created exclusively, never through an existing name or link, mode 0600
//! (they hold every tenant's results), and published under their final
//! name only whole.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::Path;

use crate::exit::Failure;

/// Creates `path` for writing; fails if any file or link is there.
pub fn create_exclusive(path: &Path) -> Result<File, Failure> {
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path).map_err(|e| {
        if e.kind() == ErrorKind::AlreadyExists {
            Failure::local(format!(
                "{} already exists: another run is writing it, or one was interrupted; \
                 remove it if none is running (nothing is written through an existing name)",
                path.display()
            ))
        } else {
            Failure::local(format!("cannot create {}: {e}", path.display()))
        }
    })
}

/// Fails if `to` names anything (a file, a directory, a link).
pub fn refuse_existing(to: &Path) -> Result<(), Failure> {
    if to.symlink_metadata().is_ok() {
        return Err(Failure::local(format!(
            "{} already exists; settle never overwrites a file: move it away or choose another \
             name",
            to.display()
        )));
    }
    Ok(())
}

/// Gives the whole, synced `partial` its final name `to`, which must not
/// exist, and makes the name durable.
pub fn publish(partial: &Path, to: &Path) -> Result<(), Failure> {
    let exists = || {
        Failure::local(format!(
            "{} appeared while it was written; it was left as it is",
            to.display()
        ))
    };
    // A hard link cannot replace a file that appeared meanwhile (a rename
    // would); where links are not supported, check and rename.
    match std::fs::hard_link(partial, to) {
        Ok(()) => {
            let _ = std::fs::remove_file(partial);
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(exists()),
        Err(_) => {
            if to.symlink_metadata().is_ok() {
                return Err(exists());
            }
            std::fs::rename(partial, to).map_err(|e| {
                Failure::local(format!(
                    "cannot rename {} to {}: {e}",
                    partial.display(),
                    to.display()
                ))
            })?;
        }
    }
    // The directory entry is durable only once its directory is synced.
    let dir = match to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Failure::local(format!("syncing {}: {e}", dir.display())))
}
