//! The portable format (SPEC §12) of an embedded store: a snapshot out,
//! live ([`Frozen::of`], behind `Store::export`) or of a stopped store
//! ([`export_dir`]), and an import into an empty data directory ([`import`]).
//!
//! A snapshot is the map of durable states in memory plus a view of the
//! index, both at one published batch (`Shared::snapshot`): a state is in
//! memory until the index holds it, so the two together are the store at
//! that instant. Writes wait only while the instant is marked (the batch,
//! the view, the start of a capture: constant time); the map is then read
//! while the writer runs on, each publish keeping the instant's states it
//! replaces, and the index is read afterwards, from its view.

use std::fs::File;
use std::io::{BufReader, Seek, Write};
use std::path::Path;
use std::sync::Arc;

use dashmap::DashMap;
use settle_ledger::StoreError;
use settle_ledger::export::{CHUNK, ExportError, ImportError, ImportReport};
use settle_ledger::{Part, Snapshot};
use settle_portable::{Entity, Header, Reader, Summary, Writer};

use crate::codec::{
    EntityKey, KIND_PRINCIPAL, KIND_RECORD, KIND_TASK, Value, decode_value, describe, encode_value,
};
use crate::fs::{Fs, OsFs};
use crate::index::{CheckpointItem, FjallIndex, Index, IndexView, Meta};
use crate::open::io;
use crate::recovery::{self, Recovered};
use crate::{EmbeddedOptions, EmbeddedStore, Hasher, Shared, Slot};

/// One instant of a store: the map's entries (sorted) and the index's view.
pub(crate) struct Frozen {
    fence_floor: u64,
    resident: Vec<(Box<[u8]>, Arc<Value>)>,
    view: Box<dyn IndexView>,
}

impl Frozen {
    /// The running store's snapshot (`Shared::snapshot`: writes wait only
    /// while its instant is marked, not while the map is read).
    pub(crate) fn of<I: Index>(shared: &Shared<I>) -> Result<Frozen, StoreError> {
        let started = std::time::Instant::now();
        let snap = shared.snapshot(|| shared.index().view())?;
        // How long publishing waited: the one cost an export puts on writes.
        metrics::histogram!("settle_export_freeze_seconds").record(snap.held.as_secs_f64());
        tracing::info!(
            resident = snap.resident.len(),
            replaced = snap.replaced,
            held_ms = snap.held.as_secs_f64() * 1e3,
            read_ms = started.elapsed().as_secs_f64() * 1e3,
            "export snapshot taken"
        );
        Ok(Frozen::new(snap.resident, snap.view, snap.fence_floor))
    }

    /// A running store's snapshot, streamed (`Store::export` of both stores).
    pub(crate) async fn export<I: Index>(shared: Arc<Shared<I>>) -> Result<Snapshot, StoreError> {
        // The copy of the map takes a moment: off the async workers.
        let frozen = tokio::task::spawn_blocking(move || Frozen::of(&shared))
            .await
            .map_err(|e| StoreError::Io(format!("export task: {e}")))??;
        frozen.spawn()
    }

    /// A stopped store's snapshot (what recovery put in memory, and its index).
    fn offline(
        map: &DashMap<Box<[u8]>, Slot, Hasher>,
        index: &impl Index,
        fence_floor: u64,
    ) -> Result<Frozen, StoreError> {
        let resident = map
            .iter()
            .map(|s| (s.key().clone(), s.value.clone()))
            .collect();
        Ok(Frozen::new(resident, index.view()?, fence_floor))
    }

    fn new(
        mut resident: Vec<(Box<[u8]>, Arc<Value>)>,
        view: Box<dyn IndexView>,
        fence_floor: u64,
    ) -> Frozen {
        resident.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Frozen {
            fence_floor,
            resident,
            view,
        }
    }

    /// Streams the snapshot from a thread of its own.
    pub(crate) fn spawn(self) -> Result<Snapshot, StoreError> {
        let (snap, tx) = Snapshot::channel("embedded", self.fence_floor, FENCES_PER_CLAIM_MAX);
        std::thread::Builder::new()
            .name("settle-export".into())
            .spawn(move || {
                let r =
                    self.stream(&mut |chunk| tx.blocking_send(Ok(Part::Entities(chunk))).is_ok());
                // Only a stream that ran to its end says so.
                let _ = tx.blocking_send(r.map(|()| Part::End));
            })
            .map_err(io)?;
        Ok(snap)
    }

    /// Hands every entity to `send`, [`CHUNK`] at a time, in the portable
    /// format's canonical order (records, principals, warning tasks; each
    /// in key order, which is tenant, then name); stops when `send` says so.
    pub(crate) fn stream(
        self,
        send: &mut dyn FnMut(Vec<Entity>) -> bool,
    ) -> Result<(), StoreError> {
        let mut out = Out {
            chunk: Vec::with_capacity(CHUNK),
            send,
            open: true,
        };
        for kind in [KIND_RECORD, KIND_PRINCIPAL, KIND_TASK] {
            let lo = self
                .resident
                .partition_point(|(k, _)| k.first() < Some(&kind));
            let hi = self
                .resident
                .partition_point(|(k, _)| k.first() <= Some(&kind));
            let mut mem = self.resident[lo..hi].iter().peekable();
            let mut failed = None;
            self.view.for_each_prefixed(&[kind], &mut |k, bytes| {
                // What memory holds comes first, and wins over the index.
                while let Some((mk, mv)) = mem.next_if(|(mk, _)| &mk[..] <= k) {
                    let shadows = &mk[..] == k;
                    if let Err(e) = out.put(entity(mk, mv)) {
                        failed = Some(e);
                        return false;
                    }
                    if shadows {
                        return out.open;
                    }
                }
                let value = decode_value(bytes)
                    .map_err(|e| StoreError::Corrupt(format!("{}: {e}", Recovered::describe(k))));
                match value.and_then(|v| out.put(entity(k, &v))) {
                    Ok(()) => out.open,
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
            for (mk, mv) in mem {
                out.put(entity(mk, mv))?;
            }
            if !out.open {
                return Ok(());
            }
        }
        out.flush();
        Ok(())
    }
}

struct Out<'a> {
    chunk: Vec<Entity>,
    send: &'a mut dyn FnMut(Vec<Entity>) -> bool,
    /// The receiver still wants more.
    open: bool,
}

impl Out<'_> {
    fn put(&mut self, e: Result<Option<Entity>, StoreError>) -> Result<(), StoreError> {
        if let Some(e) = e? {
            self.chunk.push(e);
            if self.chunk.len() == CHUNK {
                self.flush();
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        if self.open && !self.chunk.is_empty() {
            self.open = (self.send)(std::mem::take(&mut self.chunk));
        }
    }
}

/// The entity a stored state is (`None`: deleted).
fn entity(key: &[u8], value: &Value) -> Result<Option<Entity>, StoreError> {
    let bad = |what: &str| StoreError::Corrupt(format!("{}: {what}", Recovered::describe(key)));
    Ok(match (EntityKey::from_bytes(key)?, value) {
        (_, Value::Gone) => None,
        (_, Value::Undecodable(e)) => return Err(bad(e)),
        (EntityKey::Record(tenant, _), Value::Record(r)) => Some(Entity::Record {
            tenant,
            record: r.clone(),
        }),
        (EntityKey::Principal(tenant, principal), Value::Principal(state)) => {
            Some(Entity::Principal {
                tenant,
                principal,
                state: *state,
            })
        }
        (EntityKey::Task(tenant, task), Value::Warnings(w)) => Some(Entity::Warnings {
            tenant,
            task,
            warnings: w.clone(),
        }),
        _ => return Err(bad("the key's kind does not match its value")),
    })
}

/// Exports a stopped store's data directory to `out` (read-only, like
/// `settle inspect`: recovery runs in memory, nothing on disk changes),
/// calling `progress(entities, bytes)` as it goes.
pub fn export_dir<W: Write>(
    dir: impl AsRef<Path>,
    out: W,
    mut progress: impl FnMut(u64, u64),
) -> Result<(W, Summary), ExportError> {
    let dir = dir.as_ref();
    if !dir.join("wal").is_dir() || !dir.join("index").is_dir() {
        return Err(StoreError::Io(format!(
            "{} is not a settle data directory (no wal/ and index/)",
            dir.display()
        ))
        .into());
    }
    let _lock = OsFs.lock(&dir.join("LOCK")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            StoreError::Io(format!(
                "{} is in use by a running settle serve: stop the server first (or take a live \
                 backup of it with settle backup --url)",
                dir.display()
            ))
        } else {
            io(e)
        }
    })?;
    let index = FjallIndex::open(&dir.join("index"))?;
    let rec = recovery::recover(&OsFs, &dir.join("wal"), &index)?;
    let frozen = Frozen::offline(&rec.map, &index, rec.next_fence)?;
    let floor = frozen.fence_floor;
    let mut w = Writer::new(out, Header::new("embedded", floor, FENCES_PER_CLAIM_MAX))?;
    let mut failed = None;
    frozen.stream(&mut |chunk| {
        for e in &chunk {
            if let Err(err) = w.write(e) {
                failed = Some(err);
                return false;
            }
        }
        progress(w.entities(), w.bytes());
        true
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(w.finish(floor)?)
}

/// Fences one claim consumes here: the rules draw one per new lease, and
/// the fence counter is logged with each batch (nothing drawn ahead).
pub const FENCES_PER_CLAIM_MAX: u64 = 1;

/// Entities per ingestion while importing.
const IMPORT_CHUNK: usize = 16 * 1024;

/// An entity ready for the index: key, encoded value, open, expiry (ms).
type Item = (Vec<u8>, Vec<u8>, bool, Option<u64>);

/// Imports `file` into `dir`, which must not exist or be an empty
/// directory. The file is checked whole first; the store is built in a
/// directory beside `dir` and renamed into place in one step, so a crash
/// leaves either no store (the half-built one, named `.<dir>.import-<pid>`,
/// is never opened and is removed by the next import) or the whole one.
/// Its fence counter starts at [`Summary::import_floor`]`(margin)`.
pub fn import(
    dir: impl AsRef<Path>,
    file: impl AsRef<Path>,
    margin: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<ImportReport, ImportError> {
    let dir = dir.as_ref();
    let file = file.as_ref();
    // The target first (SPEC §12: refused before any work).
    check_target(dir)?;
    // One handle for both passes: a file renamed over the path between them
    // is not read; one rewritten in place is caught by the digest below.
    let mut input = File::open(file)?;
    let summary = settle_portable::verify(BufReader::new(&input))?;
    // Bounded before any work (SPEC §12): refused, nothing written.
    let floor = summary.import_floor(margin)?;
    let name = dir
        .file_name()
        .ok_or_else(|| ImportError::NotEmpty(format!("{} names no directory", dir.display())))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)?;
    // One import into a target at a time: another one's build beside it
    // would look stale to this one. (The empty lock file stays.)
    let lock = parent.join(format!(".{}.import.lock", name.to_string_lossy()));
    let _lock = OsFs.lock(&lock).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            ImportError::Io(std::io::Error::other(format!(
                "another import into {} is running (it holds {})",
                dir.display(),
                lock.display()
            )))
        } else {
            e.into()
        }
    })?;
    // What an import killed before its rename left is never opened: gone.
    let stale = format!(".{}.import-", name.to_string_lossy());
    for e in std::fs::read_dir(&parent)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&stale) {
            std::fs::remove_dir_all(e.path())?;
        }
    }
    let tmp = parent.join(format!("{stale}{}", std::process::id()));
    // A fresh store lays out the log and the index, and closes.
    EmbeddedStore::open(&tmp, EmbeddedOptions::default())?.close();
    let index = FjallIndex::open(&tmp.join("index"))?;
    let meta = index.meta()?;
    input.seek(std::io::SeekFrom::Start(0))?;
    let mut reader = Reader::new(BufReader::new(input))?;
    let mut batch: Vec<Item> = Vec::with_capacity(IMPORT_CHUNK);
    let mut disputed = 0u64;
    let mut done = 0u64;
    let mut section = None;
    loop {
        let next = reader.next_entity()?;
        let this = next.as_ref().map(|e| e.order().0);
        if (this != section || batch.len() == IMPORT_CHUNK) && !batch.is_empty() {
            ingest(&index, &mut batch)?;
            progress(done, reader.offset());
        }
        section = this;
        let Some(e) = next else { break };
        let (key, value) = match e {
            Entity::Record { tenant, record } => {
                disputed += u64::from(record.disputed);
                (
                    EntityKey::Record(tenant, record.key.clone()),
                    Value::Record(record),
                )
            }
            Entity::Principal {
                tenant,
                principal,
                state,
            } => (
                EntityKey::Principal(tenant, principal),
                Value::Principal(state),
            ),
            Entity::Warnings {
                tenant,
                task,
                warnings,
            } => (EntityKey::Task(tenant, task), Value::Warnings(warnings)),
        };
        let (open, expires_at) = describe(&value);
        batch.push((key.to_bytes(), encode_value(&value), open, expires_at));
        done += 1;
    }
    // The file was verified before; the bytes just imported must be those.
    if reader.summary().map(|s| &s.sha256) != Some(&summary.sha256) {
        return Err(settle_portable::Error::Damaged {
            offset: 0,
            reason: "the file changed while it was imported".into(),
        }
        .into());
    }
    index.commit_meta(&Meta {
        checkpoint_seq: meta.checkpoint_seq,
        checkpoint_lsn: meta.checkpoint_lsn,
        next_fence: floor.max(meta.next_fence),
        disputed: Some(disputed),
    })?;
    drop(index);
    std::fs::rename(&tmp, dir)?;
    OsFs.sync_dir(&parent)?;
    Ok(ImportReport {
        summary,
        fence_floor: floor,
    })
}

/// An import's target must be absent or an empty directory that is not a
/// mount point.
fn check_target(dir: &Path) -> Result<(), ImportError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ImportError::NotEmpty(format!(
                    "{} is not empty",
                    dir.display()
                )));
            }
            if is_mount_point(dir)? {
                return Err(ImportError::Io(std::io::Error::other(format!(
                    "{} is a mount point: the store is built beside its target and renamed \
                     into place, which a mount point cannot take; import into a directory \
                     inside it (such as {}) and give that to settle serve --data",
                    dir.display(),
                    dir.join("data").display()
                ))));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Whether `dir` is a mount point: on another device than its parent, the
/// root, or listed in /proc/self/mountinfo (a bind mount of the same
/// device). A rename onto a mount point fails (EBUSY).
fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (m, p) = (std::fs::metadata(dir)?, std::fs::metadata(dir.join(".."))?);
        if m.dev() != p.dev() || m.ino() == p.ino() {
            return Ok(true);
        }
    }
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(false);
    };
    let dir = std::fs::canonicalize(dir)?;
    // The fifth field is the mount point, with space, tab, LF and \ octal-escaped.
    Ok(mounts.lines().filter_map(|l| l.split(' ').nth(4)).any(|m| {
        let m = m
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\");
        Path::new(&m) == dir
    }))
}

/// One ingestion of a section's entities (in key order: the file's order).
fn ingest(index: &FjallIndex, batch: &mut Vec<Item>) -> Result<(), StoreError> {
    debug_assert!(batch.windows(2).all(|w| w[0].0 < w[1].0));
    let items: Vec<CheckpointItem<'_>> = batch
        .iter()
        .map(|(key, value, open, expires_at)| CheckpointItem {
            key,
            open: *open,
            expires_at: *expires_at,
            value,
            listed: false,
        })
        .collect();
    index.ingest(&items, &|| {})?;
    drop(items);
    batch.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_mount_point;
    use std::path::Path;

    #[test]
    fn mount_points_are_told_from_directories() {
        assert!(is_mount_point(Path::new("/")).unwrap(), "the root");
        if Path::new("/proc/self").exists() {
            assert!(is_mount_point(Path::new("/proc")).unwrap());
        }
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).unwrap();
        assert!(!is_mount_point(&d).unwrap());
    }
}
