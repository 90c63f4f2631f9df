//! The durable index (fjall): the state as of the last checkpoint.
//!
//! Keyspaces: `data` (every entity, versioned values), `open` (ids of
//! records that are not terminal, reloaded into memory at start), `expiry`
//! (`[expires_at BE][id]` of terminal records, for collection) and `meta`.

use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use settle_ledger::StoreError;

use crate::pace::STEP_BYTES;

/// Ids and stored values of open records.
pub type OpenRecords<B> = Vec<(Vec<u8>, B)>;

/// The durable index as the engine sees it: the state as of the last
/// checkpoint. Values are the encoded bytes of the log (`codec::encode_value`);
/// decoding them is the engine's business, so an undecodable value is
/// handled the same way whatever holds it.
///
/// [`FjallIndex`] is the real one; `settle-sim`'s `disk::MemIndex` keeps
/// it in memory, with the same durability points, for power-loss tests and
/// simulation (fjall has no pluggable filesystem).
pub trait Index: Send + Sync + 'static {
    /// A stored value as the index hands it out (a fjall slice, or owned bytes).
    type Bytes: AsRef<[u8]> + Send + 'static;

    /// The stored value of entity `key` in `data`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Self::Bytes>, StoreError>;
    /// The meta of the last completed checkpoint (a fresh index reports
    /// nothing checkpointed).
    fn meta(&self) -> Result<Meta, StoreError>;
    /// The ids and values of the records listed as open (to reload at start;
    /// the list may hold records that settled since: the caller filters).
    fn open_records(&self) -> Result<OpenRecords<Self::Bytes>, StoreError>;
    /// Writes the newest states of a checkpoint (`items` sorted by key) into
    /// `data`, `open` and `expiry`, durably before returning. `pace` is
    /// called between steps of the writing and may wait (see [`crate::pace`]).
    fn ingest(&self, items: &[CheckpointItem<'_>], pace: &dyn Fn()) -> Result<(), StoreError>;
    /// Records a completed checkpoint, durably before returning (a fresh
    /// write then a sync: never trusting an earlier, failed sync).
    fn commit_meta(&self, meta: &Meta) -> Result<(), StoreError>;
    /// Expiry entries due at `now_ms`, oldest first, strictly after the
    /// expiry key `after` if given, at most `limit`.
    fn due(
        &self,
        after: Option<&[u8]>,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError>;
    /// Drops an expiry entry that no longer matches its record (not synced:
    /// it may come back after a crash, and is dropped again).
    fn forget_expiry(&self, t: u64, key: &[u8]) -> Result<(), StoreError>;
    /// Keys in `data` within `range` (entities, deleted ones excluded), in
    /// order, at most `limit` (the inspection listing).
    fn keys_in(
        &self,
        range: (Bound<Vec<u8>>, Bound<Vec<u8>>),
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Every stored entity, raw (offline inspection).
    fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StoreError>;
    /// `data` as it is now, unchanged by later checkpoints (a live export
    /// reads it while the store runs on).
    fn view(&self) -> Result<Box<dyn IndexView>, StoreError>;

    /// A step of writing out what the index's own background work (fjall's
    /// compactions) has written so far, or `None` if it has none. The store
    /// runs the steps on a thread of its own, one per log sync
    /// ([`crate::pace`]).
    fn background_writeback(&self) -> Option<Box<dyn FnMut() + Send>> {
        None
    }
}

/// A read-only view of an index's entities at one instant ([`Index::view`]).
pub trait IndexView: Send + 'static {
    /// Calls `f` with every entity whose key starts with `prefix`, in key
    /// order, until it returns `false`.
    fn for_each_prefixed(
        &self,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;
}

/// A fjall snapshot of `data`: old versions stay readable while it lives.
struct FjallView {
    snapshot: fjall::Snapshot,
    data: Keyspace,
}

impl IndexView for FjallView {
    fn for_each_prefixed(
        &self,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        for g in self.snapshot.prefix(&self.data, prefix) {
            let (k, v) = g.into_inner().map_err(err)?;
            if !f(&k, &v) {
                break;
            }
        }
        Ok(())
    }
}

/// The index in a fjall database on disk.
pub struct FjallIndex {
    db: Database,
    data: Keyspace,
    open: Keyspace,
    expiry: Keyspace,
    meta: Keyspace,
}

fn err(e: fjall::Error) -> StoreError {
    StoreError::Io(format!("index: {e}"))
}

/// Meta values persisted with each checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Log segments up to and including this one are in the index.
    pub checkpoint_seq: u64,
    /// Batches up to and including this LSN are in the index.
    pub checkpoint_lsn: u64,
    /// The fence counter at the checkpoint.
    pub next_fence: u64,
    /// Records marked disputed at the checkpoint; `None` in an index
    /// written before the count existed (recovery counts them once).
    pub disputed: Option<u64>,
}

/// One entity written by a checkpoint (its newest state in the covered log).
pub struct CheckpointItem<'a> {
    /// The entity's key in `data` (an encoded entity key).
    pub key: &'a [u8],
    /// A record that is not terminal.
    pub open: bool,
    /// A terminal record's collection time.
    pub expires_at: Option<u64>,
    /// The encoded value; empty for a deleted entity.
    pub value: &'a [u8],
    /// The record may be listed in `open` (an earlier checkpoint wrote it
    /// open, or the caller cannot tell): a record that is not open gets a
    /// tombstone there. `false` skips the tombstone of a record that was
    /// never listed (most records are claimed and settled within one
    /// segment), which would only cost a write now and compaction later.
    pub listed: bool,
}

/// The key of an `expiry` entry: `expires_at_ms` big-endian, then the record
/// key, so entries sort by time.
pub fn expiry_key(expires_at_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// Splits an expiry key into its time and record key.
pub fn split_expiry_key(k: &[u8]) -> Result<(u64, &[u8]), StoreError> {
    if k.len() < 8 {
        return Err(StoreError::Corrupt("expiry key".into()));
    }
    let (t, key) = k.split_at(8);
    Ok((u64::from_be_bytes(t.try_into().expect("8 bytes")), key))
}

/// Writes out, in steps, the table files fjall is filling (an ingestion's,
/// or a compaction's).
///
/// fjall writes a table through a buffer and syncs it once, when it is
/// complete: a checkpoint's or a compaction's tens of megabytes reached the
/// disk in one burst, and the log's syncs waited 50–90 ms behind it.
/// Syncing the files as they grow keeps each burst to one step. This is
/// advice only: it relies on fjall keeping a keyspace's tables under
/// `tables/` (if that changes, the steps find nothing and the bursts come
/// back), errors are ignored, and durability still comes from fjall's own
/// sync at the end.
struct Writeback {
    dirs: Vec<Dir>,
    /// Each file's bytes synced so far and for how many steps it has not
    /// grown; `None` once it stopped growing for good (fjall never changes
    /// a finished table), so it is not looked at again.
    files: HashMap<PathBuf, Option<(u64, u32)>>,
    /// Bytes handed to fjall since the last step ([`Writeback::fed`]).
    fed: usize,
}

/// Steps without growth after which a file counts as finished.
const FINISHED_AFTER: u32 = 20;

/// A watched directory, and when it was last listed.
struct Dir {
    path: PathBuf,
    /// Its modification time when listed, and when that was.
    listed: Option<(SystemTime, SystemTime)>,
}

/// A directory's modification time comes from a coarse clock (one tick is
/// a few milliseconds): a file created in the tick of a listing may leave
/// the time as it was. A listing this long after the time it saw is sure
/// to have seen every file created until then.
const MTIME_TICK: Duration = Duration::from_millis(50);

impl Dir {
    /// Whether a file may have been added or removed since the last listing
    /// (one `stat`, where a listing is five calls and a `stat` per file).
    fn changed(&self) -> Option<SystemTime> {
        let mtime = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        match (self.listed, mtime) {
            (Some((seen, at)), Some(m))
                if m == seen && at.duration_since(m).is_ok_and(|d| d >= MTIME_TICK) =>
            {
                None
            }
            // Unreadable: listed (and found empty) as before.
            (_, m) => Some(m.unwrap_or(SystemTime::UNIX_EPOCH)),
        }
    }
}

/// Where fjall keeps a keyspace's tables.
fn tables(ks: &Keyspace) -> PathBuf {
    ks.path().join("tables")
}

impl Writeback {
    /// Watches `dirs`; the files there now are finished.
    fn new(dirs: Vec<PathBuf>) -> Writeback {
        let mut dirs: Vec<Dir> = dirs
            .into_iter()
            .map(|path| Dir { path, listed: None })
            .collect();
        let mut files = HashMap::new();
        for d in &mut dirs {
            if let Some(mtime) = d.changed() {
                d.listed = Some((mtime, SystemTime::now()));
            }
            files.extend(Writeback::files(&d.path).map(|f| (f, None)));
        }
        Writeback {
            dirs,
            files,
            fed: 0,
        }
    }

    /// `n` more bytes were handed to fjall: every [`STEP_BYTES`], `pace`,
    /// then a step.
    fn fed(&mut self, n: usize, pace: &dyn Fn()) {
        self.fed += n;
        if self.fed >= STEP_BYTES {
            self.fed = 0;
            pace();
            self.step();
        }
    }

    fn files(dir: &Path) -> impl Iterator<Item = PathBuf> + use<> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
    }

    /// Syncs what the watched files gained since the last step. A
    /// directory is listed again only when its modification time says a
    /// file may have come or gone: most steps (every few milliseconds, with
    /// no compaction running) cost one `stat` per directory.
    fn step(&mut self) {
        for dir in &mut self.dirs {
            let Some(mtime) = dir.changed() else {
                continue;
            };
            dir.listed = Some((mtime, SystemTime::now()));
            let present: HashSet<PathBuf> = Writeback::files(&dir.path).collect();
            // Tables compacted away.
            self.files
                .retain(|p, _| !p.starts_with(&dir.path) || present.contains(p));
            for path in present {
                self.files.entry(path).or_insert(Some((0, 0)));
            }
        }
        for (path, entry) in &mut self.files {
            let Some((synced, still)) = entry else {
                continue;
            };
            let Ok(len) = std::fs::metadata(path).map(|m| m.len()) else {
                continue;
            };
            if len <= *synced {
                *still += 1;
                if *still >= FINISHED_AFTER {
                    *entry = None;
                }
            } else if let Ok(f) = std::fs::File::open(path)
                && f.sync_data().is_ok()
            {
                *synced = len;
                *still = 0;
            }
        }
    }
}

/// Level-0 tables (one per checkpoint, each spanning the whole key range)
/// before fjall merges them into level 1. fjall's default of 4 merged
/// every fourth checkpoint into all of level 1: in a 40 s run at 1,024 in
/// flight the p99 was 8 x the p50 (73 ms), against 2.7-3 x with 16, at less
/// CPU per pair. Lookups pay with up to 16 more Bloom filter probes; fjall
/// slows writes only from 20 tables.
const L0_TABLES: u8 = 16;

impl FjallIndex {
    /// Opens (or creates) the index in the directory `path`.
    pub fn open(path: &Path) -> Result<FjallIndex, StoreError> {
        let db = Database::builder(path)
            // We persist explicitly at each checkpoint; the log covers the rest.
            .manual_journal_persist(true)
            .cache_size(32 * 1024 * 1024)
            // One background worker: with two or more, worker 0 hands every
            // compaction request back to the queue (to keep itself free for
            // flushes) and receives it again at once, spinning while the
            // others compact (fjall 3.1 `worker_tick`: 6-9 % of the
            // process's CPU in the in-process benchmark). Flushes are rare
            // here: checkpoints ingest tables directly; only `meta` goes
            // through a memtable.
            .worker_threads(1)
            .open()
            .map_err(err)?;
        let ks = |name: &str, point_reads: bool| {
            db.keyspace(name, || {
                let o = KeyspaceCreateOptions::default().compaction_strategy(Arc::new(
                    fjall::compaction::Leveled::default().with_l0_threshold(L0_TABLES),
                ));
                // `open` and `expiry` are only ever scanned: a Bloom filter
                // there is built per key (about a tenth of a checkpoint's
                // table writing) and never read. Applies to keyspaces
                // created from now on; fjall keeps an existing one's options.
                if point_reads {
                    o
                } else {
                    o.filter_policy(fjall::config::FilterPolicy::disabled())
                }
            })
            .map_err(err)
        };
        Ok(FjallIndex {
            data: ks("data", true)?,
            open: ks("open", false)?,
            expiry: ks("expiry", false)?,
            meta: ks("meta", true)?,
            db,
        })
    }
}

impl Index for FjallIndex {
    type Bytes = fjall::Slice;

    fn get(&self, key: &[u8]) -> Result<Option<fjall::Slice>, StoreError> {
        self.data.get(key).map_err(err)
    }

    fn meta(&self) -> Result<Meta, StoreError> {
        let get = |k: &str| -> Result<Option<u64>, StoreError> {
            match self.meta.get(k).map_err(err)? {
                Some(v) => Ok(Some(u64::from_le_bytes(
                    v.as_ref()
                        .try_into()
                        .map_err(|_| StoreError::Corrupt(format!("meta {k}")))?,
                ))),
                None => Ok(None),
            }
        };
        Ok(Meta {
            checkpoint_seq: get("checkpoint_seq")?.unwrap_or(0),
            checkpoint_lsn: get("checkpoint_lsn")?.unwrap_or(0),
            next_fence: get("next_fence")?.unwrap_or(0).max(1),
            disputed: get("disputed")?,
        })
    }

    fn open_records(&self) -> Result<OpenRecords<fjall::Slice>, StoreError> {
        let mut out = Vec::new();
        for g in self.open.iter() {
            let k = g.key().map_err(err)?;
            // A crash between ingesting `data` and `open` can leave an id
            // whose record settled or went; the caller filters, the log
            // replay covers the rest.
            if let Some(v) = self.data.get(&k).map_err(err)? {
                out.push((k.to_vec(), v));
            }
        }
        Ok(out)
    }

    /// Bulk ingestion writes sorted tables straight to disk (fsynced)
    /// instead of going through memtables and the journal: a checkpoint
    /// costs a sort and a sequential write, which keeps it cheap enough to
    /// run beside the writer. The keyspaces are ingested one after another;
    /// a crash in between is harmless because the covered log segments are
    /// deleted only after `meta` says the checkpoint is complete, and replay
    /// is idempotent (see docs/design.md).
    ///
    /// The tables are written out in steps while they are filled
    /// ([`Writeback`]), `pace` before each step, so the final `fsync` has
    /// little left to write.
    fn ingest(&self, items: &[CheckpointItem<'_>], pace: &dyn Fn()) -> Result<(), StoreError> {
        debug_assert!(items.windows(2).all(|w| w[0].key < w[1].key));
        let mut writeback = Writeback::new(vec![tables(&self.data)]);
        let mut data = self.data.start_ingestion().map_err(err)?;
        for it in items {
            if it.value.is_empty() {
                data.write_tombstone(it.key).map_err(err)?;
            } else {
                data.write(it.key, it.value).map_err(err)?;
            }
            writeback.fed(it.key.len() + it.value.len(), pace);
        }
        data.finish().map_err(err)?;

        // Open records are listed; a record that is no longer open and may
        // have been listed gets a tombstone.
        let mut open = self.open.start_ingestion().map_err(err)?;
        // Expiry time in the high 64 bits, position in `items` in the low
        // ones: `items` are sorted by key, so this order is the expiry
        // keys' (time, then key) without building and comparing the keys
        // (their long common prefixes made the sort a string sort), and
        // integers sort with a third of the instructions tuples take.
        let mut expiring: Vec<u128> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            if it.key.first() != Some(&b'r') {
                continue;
            }
            if it.open {
                open.write(it.key, []).map_err(err)?;
            } else if it.listed {
                open.write_tombstone(it.key).map_err(err)?;
            }
            if let Some(e) = it.expires_at {
                expiring.push(u128::from(e) << 64 | i as u128);
            }
        }
        open.finish().map_err(err)?;

        expiring.sort_unstable();
        let mut writeback = Writeback::new(vec![tables(&self.expiry)]);
        let mut expiry = self.expiry.start_ingestion().map_err(err)?;
        for t in expiring {
            let k = expiry_key((t >> 64) as u64, items[t as u64 as usize].key);
            let n = k.len();
            expiry.write(k, []).map_err(err)?;
            writeback.fed(n, pace);
        }
        expiry.finish().map_err(err)
    }

    fn commit_meta(&self, meta: &Meta) -> Result<(), StoreError> {
        let mut b = self.db.batch();
        b.insert(
            &self.meta,
            "checkpoint_seq",
            meta.checkpoint_seq.to_le_bytes(),
        );
        b.insert(
            &self.meta,
            "checkpoint_lsn",
            meta.checkpoint_lsn.to_le_bytes(),
        );
        b.insert(&self.meta, "next_fence", meta.next_fence.to_le_bytes());
        if let Some(d) = meta.disputed {
            b.insert(&self.meta, "disputed", d.to_le_bytes());
        }
        b.commit().map_err(err)?;
        self.db.persist(PersistMode::SyncAll).map_err(err)
    }

    fn due(
        &self,
        after: Option<&[u8]>,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let end = expiry_key(now_ms.saturating_add(1), &[]);
        let start = match after {
            Some(a) => Bound::Excluded(a.to_vec()),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for g in self.expiry.range((start, Bound::Excluded(end))) {
            let k = g.key().map_err(err)?;
            let (t, key) = split_expiry_key(&k)?;
            out.push((t, key.to_vec()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn forget_expiry(&self, t: u64, key: &[u8]) -> Result<(), StoreError> {
        self.expiry.remove(expiry_key(t, key)).map_err(err)
    }

    fn keys_in(
        &self,
        range: (Bound<Vec<u8>>, Bound<Vec<u8>>),
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out = Vec::new();
        // A snapshot read: it never waits for the checkpointer or the writer.
        for g in self.data.range(range).take(limit) {
            out.push(g.key().map_err(err)?.to_vec());
        }
        Ok(out)
    }

    fn background_writeback(&self) -> Option<Box<dyn FnMut() + Send>> {
        let mut w = Writeback::new(
            [&self.data, &self.open, &self.expiry, &self.meta]
                .into_iter()
                .map(tables)
                .collect(),
        );
        Some(Box::new(move || w.step()))
    }

    fn view(&self) -> Result<Box<dyn IndexView>, StoreError> {
        Ok(Box::new(FjallView {
            snapshot: self.db.snapshot(),
            data: self.data.clone(),
        }))
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StoreError> {
        for g in self.data.iter() {
            let (k, v) = g.into_inner().map_err(err)?;
            f(&k, &v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint's tables are written in steps, `pace` before each
    /// (one per [`STEP_BYTES`] fed), and every item is there afterwards.
    #[test]
    fn ingestion_takes_turns_and_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let index = FjallIndex::open(dir.path()).unwrap();
        let keys: Vec<Vec<u8>> = (0..2_000u32)
            .map(|i| format!("racme\0k{i:08}").into_bytes())
            .collect();
        let value = vec![7u8; 1024];
        let items: Vec<CheckpointItem<'_>> = keys
            .iter()
            .map(|k| CheckpointItem {
                key: k,
                open: false,
                expires_at: Some(1),
                value: &value,
                listed: false,
            })
            .collect();
        let fed: usize = keys.iter().map(|k| k.len() + value.len()).sum();
        let steps = std::sync::atomic::AtomicUsize::new(0);
        index
            .ingest(&items, &|| {
                steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
            .unwrap();
        assert!(steps.into_inner() >= fed / STEP_BYTES);
        for k in &keys {
            assert_eq!(index.get(k).unwrap().as_deref(), Some(&value[..]));
        }
        assert_eq!(index.due(None, 1, 10_000).unwrap().len(), keys.len());
    }

    /// The writeback follows files as they grow, leaves alone what was
    /// there before and what stopped growing, and forgets what went.
    #[test]
    fn writeback_follows_growing_tables() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("1");
        std::fs::write(&old, [1u8; 100]).unwrap();
        let mut w = Writeback::new(vec![dir.path().to_path_buf()]);
        assert_eq!(w.files[&old], None);
        let new = dir.path().join("2");
        let mut f = std::fs::File::create(&new).unwrap();
        f.write_all(&[2u8; 1000]).unwrap();
        w.step();
        assert_eq!(w.files[&new], Some((1000, 0)));
        f.write_all(&[2u8; 500]).unwrap();
        w.step();
        assert_eq!(w.files[&new], Some((1500, 0)));
        for _ in 0..FINISHED_AFTER {
            w.step();
        }
        assert_eq!(w.files[&new], None);
        assert_eq!(w.files[&old], None);
        std::fs::remove_file(&new).unwrap();
        w.step();
        assert!(!w.files.contains_key(&new));
    }

    /// A directory is listed again only if its modification time moved, or
    /// was too close to the last listing to tell.
    #[test]
    fn a_directory_is_listed_again_only_when_it_may_have_changed() {
        let dir = tempfile::tempdir().unwrap();
        let past = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::open(dir.path())
            .unwrap()
            .set_modified(past)
            .unwrap();
        let mut d = Dir {
            path: dir.path().to_path_buf(),
            listed: None,
        };
        assert_eq!(d.changed(), Some(past), "never listed");
        d.listed = Some((past, past + MTIME_TICK / 2));
        assert_eq!(
            d.changed(),
            Some(past),
            "listed within the tick of its time"
        );
        d.listed = Some((past, past + MTIME_TICK));
        assert_eq!(d.changed(), None, "listed well after its time");
        std::fs::write(dir.path().join("t"), [1u8]).unwrap();
        let now = d.changed().expect("a file was added");
        assert!(now > past);
        // The writeback finds it at its next step.
        let mut w = Writeback {
            dirs: vec![d],
            files: HashMap::new(),
            fed: 0,
        };
        w.step();
        assert_eq!(w.files[&dir.path().join("t")], Some((1, 0)));
    }
}
