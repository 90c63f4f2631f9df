//! # settle-embedded: the ledger on local disk
//!
//! The default store: a single writer thread applies every command through
//! the pure core, group-commits each batch into a checksummed log with one
//! `write` + `fdatasync`, and only then answers the callers. A checkpointer
//! moves state into a fjall index off the critical path and truncates the
//! log, so settled records leave RAM. See `docs/design.md` for the format,
//! the commit protocol and the crash analysis.

mod codec;
mod engine;
mod index;
mod wal;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use dashmap::DashMap;
use parking_lot::Mutex;
use settle_core::{
    Command, Key, Limits, Principals, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp,
    Warning, view_at,
};
use settle_ledger::{BoxFuture, Clock, Store, StoreError, StoreStats, SweepReport};

use crate::codec::{EntityKey, Value};
use crate::engine::{CkptMsg, Msg, Shared, Slot, Writer, WriterConfig};
use crate::index::Index;
pub use crate::wal::Faults;

/// How the embedded store is opened.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    pub limits: Limits,
    pub clock: Clock,
    /// Most commands in one group commit.
    pub max_batch: usize,
    /// A log segment is sealed and checkpointed into the index at this size.
    pub segment_bytes: u64,
    /// Fault injection (tests).
    pub faults: Option<Arc<Faults>>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            limits: Limits::default(),
            clock: Clock::system(),
            max_batch: 1024,
            segment_bytes: 64 * 1024 * 1024,
            faults: None,
        }
    }
}

/// The embedded durable store.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    tx: crossbeam_channel::Sender<Msg>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
    _lock: File,
    dir: PathBuf,
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, recovering after a crash:
    /// the index as of its last checkpoint, then every whole frame of the log.
    pub fn open(
        dir: impl AsRef<Path>,
        opts: EmbeddedOptions,
    ) -> Result<Arc<EmbeddedStore>, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let wal_dir = dir.join("wal");
        std::fs::create_dir_all(&wal_dir).map_err(io)?;
        let lock = File::create(dir.join("LOCK")).map_err(io)?;
        lock.try_lock().map_err(|_| {
            StoreError::Io(format!("{} is in use by another process", dir.display()))
        })?;
        let index = Index::open(&dir.join("index"))?;
        let meta = index.meta()?;

        let map: DashMap<Box<[u8]>, Slot, engine::Hasher> = DashMap::default();
        for (k, v) in index.open_records()? {
            map.insert(
                k.into_boxed_slice(),
                Slot {
                    lsn: meta.checkpoint_lsn,
                    value: Arc::new(v),
                },
            );
        }

        // Replay the log after the checkpoint.
        let mut lsn = meta.checkpoint_lsn;
        let mut next_fence = meta.next_fence;
        wal::remove_prepared(&wal_dir).map_err(io)?;
        let segments = wal::segments(&wal_dir).map_err(io)?;
        let mut last_seq = meta.checkpoint_seq;
        // Where the last segment's whole frames end, to keep appending there.
        let mut resume_at: Option<(u64, u64)> = None;
        for (i, (seq, path)) in segments.iter().enumerate() {
            last_seq = last_seq.max(*seq);
            if *seq <= meta.checkpoint_seq {
                // Covered by the checkpoint; its deletion did not complete.
                std::fs::remove_file(path).map_err(io)?;
                continue;
            }
            let buf = wal::read_segment(path)?;
            let (batches, valid) = codec::decode_frames(&buf)?;
            let (valid, len) = (valid as u64, buf.len() as u64);
            if !wal::clean_tail(&buf, valid as usize) {
                if i + 1 == segments.len() {
                    // A torn tail of the last write: never acknowledged.
                    tracing::warn!(segment = seq, valid, len, "zeroing a torn log tail");
                    wal::zero_tail(path, valid, len)?;
                } else {
                    return Err(StoreError::Corrupt(format!(
                        "log segment {} is damaged at byte {valid} and later segments exist",
                        path.display()
                    )));
                }
            }
            if i + 1 == segments.len() {
                resume_at = Some((*seq, valid));
            }
            for b in batches {
                if b.lsn <= lsn {
                    return Err(StoreError::Corrupt(format!(
                        "log batch {} after {lsn}",
                        b.lsn
                    )));
                }
                lsn = b.lsn;
                next_fence = next_fence.max(b.next_fence);
                for e in b.entries {
                    let value = Arc::new(e.decode()?);
                    map.insert(e.key.into(), Slot { lsn, value });
                }
            }
        }
        wal::sync_dir(&wal_dir).map_err(io)?;
        // Fences are never reused: the counter is past every fence on record.
        for s in map.iter() {
            if let Value::Record(r) = &*s.value
                && let Some(f) = r.last_fence()
                && f.0 >= next_fence
            {
                return Err(StoreError::Corrupt(format!(
                    "fence {} on record but the counter is at {next_fence}",
                    f.0
                )));
            }
        }

        let size = opts.segment_bytes.max(4096);
        let wal = match resume_at {
            // Keep filling the last segment's preallocated space.
            Some((seq, valid)) if valid + 4096 <= size => {
                wal::Wal::resume(&wal_dir, seq, size, valid, opts.faults.clone())
            }
            _ => wal::Wal::create(&wal_dir, last_seq + 1, size, opts.faults.clone()),
        }
        .map_err(io)?;
        let shared = Arc::new(Shared {
            map,
            index,
            poisoned: AtomicBool::new(false),
            clock: opts.clock.clone(),
            limits: opts.limits,
            last_now: AtomicU64::new(0),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctx, crx) = crossbeam_channel::unbounded::<CkptMsg>();
        let ck = {
            let shared = shared.clone();
            let faults = opts.faults.clone();
            let wal_dir = wal_dir.clone();
            std::thread::Builder::new()
                .name("settle-checkpoint".into())
                .spawn(move || {
                    engine::checkpointer(shared, wal_dir, crx, meta.checkpoint_seq, faults)
                })
                .map_err(io)?
        };
        let writer = Writer {
            shared: shared.clone(),
            wal,
            lsn,
            next_fence,
            rx,
            ckpt: ctx,
            config: WriterConfig {
                max_batch: opts.max_batch.max(1),
            },
            segment_last_lsn: lsn,
            principals: HashMap::default(),
            overlay: HashMap::default(),
        };
        let wr = std::thread::Builder::new()
            .name("settle-writer".into())
            .spawn(move || writer.run())
            .map_err(io)?;
        Ok(Arc::new(EmbeddedStore {
            shared,
            tx,
            threads: Mutex::new(vec![wr, ck]),
            closed: AtomicBool::new(false),
            _lock: lock,
            dir,
        }))
    }

    /// Stops accepting commands, lets queued commits finish, checkpoints, joins the threads.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Close(tx)).is_ok() {
            let _ = rx.recv();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entities held in memory (open records plus what awaits a checkpoint).
    pub fn resident(&self) -> usize {
        self.shared.map.len()
    }
}

fn get_sync(
    shared: &Shared,
    tenant: &TenantId,
    key: &Key,
) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
    let now = shared.now();
    let k = EntityKey::Record(tenant.clone(), key.clone()).to_bytes();
    let rec = match shared.load(&k)?.as_deref() {
        Some(Value::Record(r)) => Some(r.clone()),
        _ => None,
    };
    let mut principals = Principals::new();
    if let Some(r) = &rec {
        let p = &r.reservation.principal;
        principals.insert(p.clone(), shared.principal(tenant, p)?);
    }
    Ok(view_at(rec.as_ref(), &principals, now))
}

/// Candidates for the sweep: open records whose lease lapsed, terminal
/// records past retention (in memory and in the expiry index).
fn sweep_candidates(
    shared: &Shared,
    now: Timestamp,
) -> Result<Vec<(TenantId, Command)>, StoreError> {
    let mut out = Vec::new();
    // Clone what we need first: looking into the map while iterating it could deadlock.
    let mut leased = Vec::new();
    for s in shared.map.iter() {
        let Value::Record(r) = &*s.value else {
            continue;
        };
        if r.is_from_the_future(now) {
            continue;
        }
        if r.is_collectable(now) {
            out.push(s.key().clone());
        } else if let Some(l) = r.open_lease() {
            leased.push((
                s.key().clone(),
                r.reservation.principal.clone(),
                l.expires_at,
                l.generation,
            ));
        }
    }
    let mut out: Vec<(TenantId, Command)> = out
        .into_iter()
        .filter_map(|k| match EntityKey::from_bytes(&k) {
            Ok(EntityKey::Record(t, key)) => Some((t, Command::Collect { key })),
            _ => None,
        })
        .collect();
    for (k, principal, expires_at, lease_generation) in leased {
        let Ok(EntityKey::Record(t, key)) = EntityKey::from_bytes(&k) else {
            continue;
        };
        let generation = shared.principal(&t, &principal)?.generation;
        if now >= expires_at || lease_generation < generation {
            out.push((t, Command::Expire { key }));
        }
    }
    for (t, k) in shared.index.due(now.millis(), 10_000)? {
        match shared.load(&k)?.as_deref() {
            Some(Value::Record(r)) if r.expires_at().map(|e| e.millis()) == Some(t) => {
                if let EntityKey::Record(tenant, key) = EntityKey::from_bytes(&k)? {
                    out.push((tenant, Command::Collect { key }));
                }
            }
            // The record was collected or reserved afresh: the entry is stale.
            _ => shared.index.forget_expiry(t, &k)?,
        }
    }
    Ok(out)
}

fn stats_sync(shared: &Shared, stuck_after_ms: u64) -> StoreStats {
    let now = shared.now();
    let mut s = StoreStats::default();
    for slot in shared.map.iter() {
        if let Value::Record(r) = &*slot.value {
            if r.is_from_the_future(now) {
                s.refused += 1;
            }
            s.count(r, now, stuck_after_ms);
        }
    }
    s
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close();
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(format!("blocking task failed: {e}")))
}

impl Store for EmbeddedStore {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move {
            if self.shared.poisoned.load(Ordering::SeqCst) {
                return Err(StoreError::Poisoned);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.tx
                .send(Msg::Exec {
                    tenant: tenant.clone(),
                    cmd,
                    reply: tx,
                })
                .map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        // Reads never wait for the writer; the index may touch the disk, so
        // keep it off the async workers.
        let shared = self.shared.clone();
        let (tenant, key) = (tenant.clone(), key.clone());
        Box::pin(async move { blocking(move || get_sync(&shared, &tenant, &key)).await? })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        let shared = self.shared.clone();
        let k = EntityKey::Task(tenant.clone(), task.clone()).to_bytes();
        Box::pin(async move {
            blocking(move || {
                Ok(match shared.load(&k)?.as_deref() {
                    Some(Value::Warnings(w)) => w.clone(),
                    _ => Vec::new(),
                })
            })
            .await?
        })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move {
            let now = self.shared.now();
            let shared = self.shared.clone();
            let candidates = blocking(move || sweep_candidates(&shared, now)).await??;
            let mut report = SweepReport::default();
            for (t, cmd) in candidates {
                match self.execute(&t, cmd).await? {
                    Reply::Expired { ended: true } => report.expired += 1,
                    Reply::Collected { removed: true } => report.collected += 1,
                    _ => {}
                }
            }
            Ok(report)
        })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        let shared = self.shared.clone();
        Box::pin(async move { blocking(move || stats_sync(&shared, stuck_after_ms)).await })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(self.shared.now()) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            if self.shared.poisoned.load(Ordering::SeqCst) {
                return Err(StoreError::Poisoned);
            }
            Ok(())
        })
    }
}

/// Reads a stopped store offline (recovering it first), calling `f` for
/// every stored record, open or settled.
pub fn scan(
    dir: impl AsRef<Path>,
    mut f: impl FnMut(&TenantId, &Record),
) -> Result<(), StoreError> {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default())?;
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    for s in store.shared.map.iter() {
        if let Value::Record(r) = &*s.value
            && let EntityKey::Record(t, _) = EntityKey::from_bytes(s.key())?
        {
            f(&t, r);
        }
        seen.insert(s.key().clone());
    }
    store.shared.index.for_each(|k, v| {
        if let Value::Record(r) = v
            && !seen.contains(k)
            && let Ok(EntityKey::Record(t, _)) = EntityKey::from_bytes(k)
        {
            f(&t, &r);
        }
    })?;
    store.close();
    Ok(())
}
