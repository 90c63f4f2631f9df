//! # settle-embedded: the ledger on local disk
//!
//! The default store: a single writer thread applies every command through
//! the pure core, group-commits each batch into a checksummed log with one
//! `write` + `fdatasync`, and only then answers the callers. A checkpointer
//! moves state into a fjall index off the critical path and truncates the
//! log, so settled records leave RAM. See `docs/design.md` for the format,
//! the commit protocol and the crash analysis.
//!
//! The log and recovery run over an I/O seam ([`fs::Fs`]) and the index
//! behind a trait ([`index::Index`]): the same engine runs on the real
//! filesystem with fjall ([`EmbeddedStore::open`]), or on another
//! implementation of the two (the simulated disk and in-memory index of
//! `settle-sim`'s `disk` module), threaded ([`EmbeddedStore::open_on`]) or
//! inline on the caller's thread ([`InlineStore`], deterministic).

#[cfg(not(feature = "fuzzing"))]
mod codec;
// The fuzz targets (fuzz/, docs/testing.md) decode log frames and stored
// values from arbitrary bytes; the format stays private otherwise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod codec;
mod engine;
pub mod fs;
pub mod index;
mod pace;
mod record_codec;
mod recovery;
mod wal;

#[cfg(test)]
mod format_tests;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use dashmap::DashMap;
use parking_lot::Mutex;
use settle_core::{
    Command, Key, Limits, Principals, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp,
    Warning, view_at,
};
use settle_ledger::inspect::Scan;
use settle_ledger::{BoxFuture, Clock, Store, StoreError, StoreStats, SweepReport};

use crate::codec::{EntityKey, Value, decode_value};
use crate::engine::{
    Checkpointer, CkptMsg, Core, Hasher, Msg, SealSink, Shared, Slot, Syncer, Writer,
};
use crate::fs::{Fs, OsFs, create_dir_all_durable};
use crate::index::{FjallIndex, Index, expiry_key};
use crate::pace::Pacer;
use crate::recovery::Recovered;
#[cfg(feature = "faults")]
pub use crate::wal::{CheckpointStep, Faults};

/// How the embedded store is opened.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// The rules' limits (lease margin, warning cap, result size).
    pub limits: Limits,
    /// The store's clock (tests skew it to move time without sleeping).
    pub clock: Clock,
    /// Most commands gathered into one group commit (a batch message is
    /// never split). While a batch is this full the writer takes no more
    /// and waits for the frame ahead of it to be durable. 512, not 1,024:
    /// at 1,024 in flight a cap of 1,024 let every in-flight command fall
    /// into one frame, which the writer applied and encoded whole before
    /// the log thread could start on it (lock-step, the disk idle
    /// meanwhile); 512 gave 2-7 % more pairs/s and a 12 % lower p50
    /// (docs/performance.md, "Tenth round").
    pub max_batch: usize,
    /// A log segment is sealed and checkpointed into the index at this size.
    pub segment_bytes: u64,
    /// Most commands waiting for the writer; past it a command is answered
    /// `StoreError::Overloaded` at once (nothing written).
    pub max_queue: usize,
    /// Most sealed segments waiting for the checkpointer besides the one it
    /// works on; past it the writer waits (and the queue fills). Bounds the
    /// memory, the log on disk and the reopen time.
    pub max_checkpoint_backlog: usize,
    /// The retry hint given with `Overloaded`.
    pub overload_retry_after_ms: u64,
    /// Fault injection (tests; the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: Option<Arc<Faults>>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            limits: Limits::default(),
            clock: Clock::system(),
            max_batch: 512,
            segment_bytes: 64 * 1024 * 1024,
            max_queue: 65_536,
            max_checkpoint_backlog: 2,
            overload_retry_after_ms: 100,
            #[cfg(feature = "faults")]
            faults: None,
        }
    }
}

impl EmbeddedOptions {
    /// The faults to inject: always none without the `faults` feature.
    fn faults(&self) -> Option<Arc<wal::Faults>> {
        #[cfg(feature = "faults")]
        return self.faults.clone();
        #[cfg(not(feature = "faults"))]
        None
    }
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

/// Starts a store thread named `name`.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(io)
}

/// The writeback thread steps at most this often: a step lists the index's
/// table directories.
const WRITEBACK_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// The writer's and the checkpointer's state.
type Engine<F, I> = (Core<F, I>, Checkpointer<F, I>);

/// Recovers the store in `dir` (on `fs`, with `index`), tidies its log and
/// builds the writer's and the checkpointer's state.
fn recover_engine<F: Fs, I: Index>(
    fs: &F,
    dir: &Path,
    index: I,
    opts: &EmbeddedOptions,
    mut sealed: SealSink,
) -> Result<Engine<F, I>, StoreError> {
    let wal_dir = dir.join("wal");
    let mut rec = recovery::recover(fs, &wal_dir, &index)?;
    rec.apply(fs, &wal_dir, &index)?;
    let size = opts.segment_bytes.max(4096);
    let pacer = Arc::new(Pacer::default());
    let wal = match rec.resume {
        // Keep filling the last segment's preallocated space.
        Some((seq, valid)) if valid + 4096 <= size => {
            wal::Wal::resume(fs, &wal_dir, seq, size, valid, opts.faults(), pacer.clone())
        }
        _ => wal::Wal::create(
            fs,
            &wal_dir,
            rec.last_seq + 1,
            size,
            opts.faults(),
            pacer.clone(),
        ),
    }
    .map_err(io)?;
    // Segments before the one being written are sealed: a backlog left by a
    // crash (or by halted checkpoints) is checkpointed now, not only when
    // the next segment fills, so it never lingers across reopens.
    let sealed_upto = wal.seq() - 1;
    if sealed_upto > rec.meta.checkpoint_seq {
        match &mut sealed {
            SealSink::Channel(tx) => {
                // The channel is new, empty and holds at least one message.
                let _ = tx.try_send(CkptMsg::Sealed(sealed_upto));
            }
            SealSink::Queue(q) => q.push(sealed_upto),
        }
    }
    let map = std::mem::take(&mut rec.map);
    let listed = map
        .iter()
        .filter(|s| s.key().first() == Some(&b'r'))
        .map(|s| s.key().clone())
        .collect();
    let shared = Arc::new(Shared::new(index, map, opts.clock.clone(), opts.limits));
    for k in &rec.undecodable {
        shared.undecodable.insert(k.clone(), ());
    }
    let ckpt = Checkpointer {
        shared: shared.clone(),
        fs: fs.clone(),
        wal_dir,
        meta: rec.meta,
        faults: opts.faults(),
        listed,
        read_buf: Vec::new(),
        pacer,
        reclaim: None,
    };
    let core = Core::new(shared, wal, &rec, opts.max_batch, sealed, opts.faults());
    Ok((core, ckpt))
}

/// The embedded durable store: a writer thread and a checkpointer thread
/// over the log on `F` and the index `I` (by default the real filesystem
/// and fjall).
pub struct EmbeddedStore<F: Fs = OsFs, I: Index = FjallIndex> {
    shared: Arc<Shared<I>>,
    /// To the writer (ringing its doorbell).
    tx: engine::Ringing<Msg>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stopped at close (ends the writeback thread).
    pacer: Arc<Pacer>,
    closed: AtomicBool,
    max_queue: usize,
    retry_after_ms: u64,
    _lock: F::Lock,
    dir: PathBuf,
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, recovering after a crash:
    /// the index as of its last checkpoint, then every whole frame of the log.
    pub fn open(
        dir: impl AsRef<Path>,
        opts: EmbeddedOptions,
    ) -> Result<Arc<EmbeddedStore>, StoreError> {
        let dir = dir.as_ref();
        let fs = OsFs;
        create_dir_all_durable(&fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        let index = FjallIndex::open(&dir.join("index"))?;
        // fjall created `index/` if it was new.
        fs.sync_dir(dir).map_err(io)?;
        EmbeddedStore::start(&fs, dir, lock, index, opts)
    }
}

impl<F: Fs, I: Index> EmbeddedStore<F, I> {
    /// Opens the store in `dir` on another filesystem and index (the
    /// simulated disk and the in-memory index, in tests).
    pub fn open_on(
        fs: &F,
        dir: impl AsRef<Path>,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<Arc<Self>, StoreError> {
        let dir = dir.as_ref();
        create_dir_all_durable(fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        EmbeddedStore::start(fs, dir, lock, index, opts)
    }

    fn start(
        fs: &F,
        dir: &Path,
        lock: F::Lock,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<Arc<Self>, StoreError> {
        let (ctx, crx) = crossbeam_channel::bounded::<CkptMsg>(opts.max_checkpoint_backlog.max(1));
        let (core, mut ckpt) = recover_engine(fs, dir, index, &opts, SealSink::Channel(ctx))?;
        let shared = core.shared.clone();
        let pacer = ckpt.pacer.clone();
        let (tx, rx) = crossbeam_channel::unbounded();
        // Ends after the checkpointer, which holds the sending side.
        let (rtx, rrx) = crossbeam_channel::bounded(engine::RECLAIM_BACKLOG);
        let reclaimer = engine::Reclaimer { rx: rrx };
        let rc = spawn("settle-reclaim", move || reclaimer.run())?;
        ckpt.reclaim = Some(rtx);
        let ck = spawn("settle-checkpoint", move || ckpt.run(crx))?;
        let Core { stage, log, .. } = core;
        // The writer gathers the next batch while the log thread makes the
        // last durable; `IN_FLIGHT` frames wait there at most (and one more
        // for a moment: the writer sends the next before it handles a
        // completion).
        let (stx, srx) = crossbeam_channel::bounded(engine::IN_FLIGHT);
        let (done_tx, done_rx) = crossbeam_channel::bounded(engine::IN_FLIGHT);
        let writer_bell = Arc::new(engine::Doorbell::default());
        let syncer_bell = Arc::new(engine::Doorbell::default());
        let syncer = Syncer {
            log,
            rx: srx,
            synced: engine::Ringing {
                tx: done_tx,
                bell: writer_bell.clone(),
            },
            bell: syncer_bell.clone(),
        };
        let sy = spawn("settle-sync", move || syncer.run())?;
        let writer = Writer {
            stage,
            rx,
            tx: engine::Ringing {
                tx: stx,
                bell: syncer_bell,
            },
            synced: done_rx,
            bell: writer_bell.clone(),
        };
        let wr = spawn("settle-writer", move || writer.run())?;
        let mut threads = vec![wr, sy, ck, rc];
        // The index's own background writes (compactions) take turns with
        // the log too: one step after a sync, at most every few milliseconds.
        if let Some(mut step) = shared.index.background_writeback() {
            let p = pacer.clone();
            threads.push(spawn("settle-writeback", move || {
                p.run_after_syncs(WRITEBACK_EVERY, &mut step)
            })?);
        }
        Ok(Arc::new(EmbeddedStore {
            shared,
            tx: engine::Ringing {
                tx,
                bell: writer_bell,
            },
            threads: Mutex::new(threads),
            pacer,
            closed: AtomicBool::new(false),
            max_queue: opts.max_queue.max(1),
            retry_after_ms: opts.overload_retry_after_ms,
            _lock: lock,
            dir: dir.to_path_buf(),
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
        self.pacer.stop();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst)
    }

    /// The directory the store was opened on.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entities held in memory (open records plus what awaits a checkpoint).
    pub fn resident(&self) -> usize {
        self.shared.map.len()
    }
}

impl<F: Fs, I: Index> Drop for EmbeddedStore<F, I> {
    fn drop(&mut self) {
        self.close();
    }
}

fn get_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    key: &Key,
) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
    let now = shared.now();
    let k = EntityKey::Record(tenant.clone(), key.clone()).to_bytes();
    let rec = match shared.load(&k)?.as_deref() {
        Some(Value::Record(r)) => Some(r.clone()),
        Some(Value::Undecodable(_)) => return Ok(Err(RefusalCode::RecordRefused)),
        _ => None,
    };
    let mut principals = Principals::new();
    if let Some(r) = &rec {
        let p = &r.reservation.principal;
        match shared.principal(tenant, p)? {
            Ok(st) => principals.insert(p.clone(), st),
            Err(code) => return Ok(Err(code)),
        }
    }
    Ok(view_at(rec.as_ref(), &principals, now))
}

fn warnings_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    task: &TaskId,
) -> Result<Vec<Warning>, StoreError> {
    let k = EntityKey::Task(tenant.clone(), task.clone()).to_bytes();
    match shared.load(&k)?.as_deref() {
        Some(Value::Warnings(w)) => Ok(w.clone()),
        Some(Value::Undecodable(e)) => Err(StoreError::Corrupt(format!(
            "the warnings of task {task} do not decode: {e}"
        ))),
        _ => Ok(Vec::new()),
    }
}

/// Expiry entries read per page; the sweep acts on at most `SWEEP_DUE` of them.
const DUE_PAGE: usize = 1000;
const SWEEP_DUE: usize = 10_000;

/// Candidates for the sweep: open records whose lease lapsed, terminal
/// records past retention (in memory and in the expiry index). A stored
/// value that does not decode is skipped (and counted), never a reason to stop.
fn sweep_candidates<I: Index>(
    shared: &Shared<I>,
    now: Timestamp,
) -> Result<Vec<(TenantId, Command)>, StoreError> {
    let mut out = Vec::new();
    // Terminal records in memory past their retention: only once the bound
    // on their expiries has passed is the whole map walked (it holds each
    // shard while it is read). The walk sets the bound again; a batch
    // published meanwhile lowers it after its states are in the map.
    let bound = shared.due_in_memory.swap(u64::MAX, Ordering::SeqCst);
    let mut next = bound;
    if bound <= now.millis() {
        next = u64::MAX;
        for s in shared.map.iter() {
            let Value::Record(r) = &*s.value else {
                continue;
            };
            let Some(expires) = r.expires_at() else {
                continue;
            };
            if r.is_collectable(now) && !r.is_from_the_future(now) {
                out.push(s.key().clone());
            } else {
                // Not collected yet (from the future, or not due): looked at again.
                next = next.min(expires.millis());
            }
        }
    }
    shared.due_in_memory.fetch_min(next, Ordering::SeqCst);
    // Open leases: the records `leased` names, copied first (the writer
    // holds that lock while it applies a batch), then each looked at in the map.
    let keys: Vec<Box<[u8]>> = shared.leased.lock().iter().cloned().collect();
    let mut leased = Vec::new();
    for k in keys {
        let Some(s) = shared.map.get(&k) else {
            continue;
        };
        let Value::Record(r) = &*s.value else {
            continue;
        };
        if r.is_from_the_future(now) {
            continue;
        }
        if let Some(l) = r.open_lease() {
            leased.push((
                k.clone(),
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
        let Ok(p) = shared.principal(&t, &principal)? else {
            continue;
        };
        if now >= expires_at || lease_generation < p.generation {
            out.push((t, Command::Expire { key }));
        }
    }
    let mut after: Option<Vec<u8>> = None;
    let mut due = 0;
    while due < SWEEP_DUE {
        let page = shared.index.due(after.as_deref(), now.millis(), DUE_PAGE)?;
        for (t, k) in &page {
            match shared.load(k)?.as_deref() {
                Some(Value::Record(r)) if r.expires_at().map(|e| e.millis()) == Some(*t) => {
                    if let Ok(EntityKey::Record(tenant, key)) = EntityKey::from_bytes(k) {
                        out.push((tenant, Command::Collect { key }));
                        due += 1;
                    }
                }
                // Refused on every access and counted; its entry stays.
                Some(Value::Undecodable(_)) => {}
                // The record was collected or reserved afresh: the entry is stale.
                _ => shared.index.forget_expiry(*t, k)?,
            }
        }
        match page.last() {
            Some((t, k)) if page.len() == DUE_PAGE => after = Some(expiry_key(*t, k)),
            _ => break,
        }
    }
    Ok(out)
}

fn stats_sync<I: Index>(shared: &Shared<I>, stuck_after_ms: u64) -> StoreStats {
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
    s.disputed = shared.disputed.load(Ordering::SeqCst);
    s.undecodable = shared.undecodable.len() as u64;
    s
}

/// The next `max` records of `tenant` after `after`: the sorted keys of
/// the records in memory merged with the index's, each loaded and viewed
/// like `get`. Holds the key set's read lock only to copy `max` keys, so
/// the writer waits at most that long.
fn scan_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    after: Option<&Key>,
    max: usize,
) -> Result<Scan, StoreError> {
    use std::ops::Bound;
    let max = max.max(1);
    let now = shared.now();
    let prefix = EntityKey::Record(tenant.clone(), Key::new("!").expect("valid key")).to_bytes();
    let prefix = &prefix[..prefix.len() - 1];
    let start = match after {
        Some(k) => Bound::Excluded(EntityKey::Record(tenant.clone(), k.clone()).to_bytes()),
        None => Bound::Included(prefix.to_vec()),
    };
    // The tenant's record keys end before `r<tenant>\x01`.
    let mut end = prefix.to_vec();
    *end.last_mut().expect("separator") = 1;
    let end = Bound::Excluded(end);
    let mem: Vec<Vec<u8>> = shared
        .record_keys()
        .range::<[u8], _>((
            start.as_ref().map(Vec::as_slice),
            end.as_ref().map(Vec::as_slice),
        ))
        .take(max)
        .map(|k| k.to_vec())
        .collect();
    let idx = shared.index.keys_in((start, end), max)?;
    // Each list holds every key up to its last one; a full list may stop
    // early, so the merge is only complete up to the smaller full last key.
    let mut bound: Option<&Vec<u8>> = None;
    for l in [&mem, &idx] {
        if l.len() == max {
            let last = l.last().expect("non-empty");
            bound = Some(bound.map_or(last, |b| b.min(last)));
        }
    }
    let mut keys: Vec<&Vec<u8>> = mem.iter().chain(idx.iter()).collect();
    keys.sort_unstable();
    keys.dedup();
    if let Some(b) = bound {
        keys.retain(|k| *k <= b);
    }
    let more = bound.is_some() || keys.len() > max;
    keys.truncate(max);
    let mut records = Vec::with_capacity(keys.len());
    let mut principals = Principals::new();
    for k in &keys {
        let Some(v) = shared.load(k)? else { continue };
        // Collected (`Gone`) or undecodable (counted by the gauges): not listed.
        let Value::Record(r) = &*v else { continue };
        let p = &r.reservation.principal;
        if !principals.contains(p) {
            match shared.principal(tenant, p)? {
                Ok(st) => principals.insert(p.clone(), st),
                Err(_) => {
                    records.push(r.clone());
                    continue;
                }
            };
        }
        match view_at(Some(r), &principals, now) {
            Ok(Some(view)) => records.push(view),
            Ok(None) => {}
            // Refused under §6.9: listed as stored.
            Err(_) => records.push(r.clone()),
        }
    }
    let next = match (more, keys.last()) {
        (true, Some(k)) => match EntityKey::from_bytes(k)? {
            EntityKey::Record(_, key) => Some(key),
            _ => {
                return Err(StoreError::Corrupt(
                    "a record key range held another entity".into(),
                ));
            }
        },
        _ => None,
    };
    Ok(Scan { records, next, now })
}

fn health_sync<I: Index>(shared: &Shared<I>, closed: bool) -> Result<(), StoreError> {
    if closed {
        return Err(StoreError::Closed);
    }
    if shared.poisoned.load(Ordering::SeqCst) {
        return Err(StoreError::Poisoned);
    }
    if !shared.writer_alive.load(Ordering::SeqCst) {
        return Err(StoreError::Io("the writer thread stopped".into()));
    }
    if !shared.checkpointer_alive.load(Ordering::SeqCst) {
        return Err(StoreError::Io("the checkpointer thread stopped".into()));
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(format!("blocking task failed: {e}")))
}

impl<F: Fs, I: Index> Store for EmbeddedStore<F, I> {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move {
            if self.shared.poisoned.load(Ordering::SeqCst) {
                return Err(StoreError::Poisoned);
            }
            if self.closed.load(Ordering::Relaxed) {
                return Err(StoreError::Closed);
            }
            // Admission: a bounded queue, answered at once when full.
            if self.shared.queued.fetch_add(1, Ordering::Relaxed) >= self.max_queue {
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                return Err(StoreError::Overloaded {
                    retry_after_ms: self.retry_after_ms,
                });
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = self.tx.send(Msg::Exec {
                tenant: tenant.clone(),
                cmd,
                reply: tx,
            });
            if sent.is_err() {
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                return Err(StoreError::Closed);
            }
            rx.await.map_err(|_| {
                // The writer answers everything it takes, even on close: a
                // reply dropped unanswered means its thread is gone (and
                // readiness must say so now, not once it finished unwinding).
                self.shared.writer_alive.store(false, Ordering::SeqCst);
                StoreError::Closed
            })?
        })
    }

    /// The whole batch goes to the writer as one message: it is applied in
    /// order within one group commit (one `write` + `fdatasync`, shared with
    /// whatever else is queued), and answered once that is durable.
    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        Box::pin(async move {
            let n = cmds.len();
            let all = |e: StoreError| (0..n).map(|_| Err(e.clone())).collect::<Vec<_>>();
            if n == 0 {
                return Vec::new();
            }
            if self.shared.poisoned.load(Ordering::SeqCst) {
                return all(StoreError::Poisoned);
            }
            if self.closed.load(Ordering::Relaxed) {
                return all(StoreError::Closed);
            }
            // Admission counts every command; a batch is admitted whole or not at all.
            if self.shared.queued.fetch_add(n, Ordering::Relaxed) + n > self.max_queue {
                self.shared.queued.fetch_sub(n, Ordering::Relaxed);
                return all(StoreError::Overloaded {
                    retry_after_ms: self.retry_after_ms,
                });
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = self.tx.send(Msg::Batch {
                tenant: tenant.clone(),
                cmds,
                reply: tx,
            });
            if sent.is_err() {
                self.shared.queued.fetch_sub(n, Ordering::Relaxed);
                return all(StoreError::Closed);
            }
            match rx.await {
                Ok(results) => results,
                Err(_) => {
                    self.shared.writer_alive.store(false, Ordering::SeqCst);
                    all(StoreError::Closed)
                }
            }
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

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        let shared = self.shared.clone();
        let (tenant, principal) = (tenant.clone(), principal.clone());
        Box::pin(async move {
            blocking(move || Ok(shared.principal(&tenant, &principal)?.map(|s| s.generation)))
                .await?
        })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        let shared = self.shared.clone();
        let (tenant, task) = (tenant.clone(), task.clone());
        Box::pin(async move { blocking(move || warnings_sync(&shared, &tenant, &task)).await? })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move {
            let now = self.shared.now();
            let shared = self.shared.clone();
            let candidates = blocking(move || sweep_candidates(&shared, now)).await??;
            let mut report = SweepReport::default();
            for (t, cmd) in candidates {
                match self.execute(&t, cmd).await {
                    Ok(Reply::Expired { ended: true }) => report.expired += 1,
                    Ok(Reply::Collected { removed: true }) => report.collected += 1,
                    Ok(_) => {}
                    // Busy: the rest waits for the next sweep.
                    Err(StoreError::Overloaded { .. }) => break,
                    Err(e) => return Err(e),
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

    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        let shared = self.shared.clone();
        let (tenant, after) = (tenant.clone(), after.cloned());
        Box::pin(async move {
            blocking(move || scan_sync(&shared, &tenant, after.as_ref(), max)).await?
        })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { health_sync(&self.shared, self.closed.load(Ordering::SeqCst)) })
    }
}

/// The same engine with no threads: each call applies and commits its
/// commands, then runs any checkpoint due, on the caller's thread. Batches
/// are exactly the calls, so a run is a deterministic function of its
/// inputs, its clock and its disk: this is what the power-loss tests and
/// the deterministic simulator (`settle-sim`) drive on a simulated disk.
pub struct InlineStore<F: Fs, I: Index> {
    inner: Mutex<Inline<F, I>>,
    shared: Arc<Shared<I>>,
    _lock: F::Lock,
}

struct Inline<F: Fs, I: Index> {
    core: Core<F, I>,
    ckpt: Checkpointer<F, I>,
    closed: bool,
}

impl<F: Fs, I: Index> Inline<F, I> {
    fn checkpoint_sealed(&mut self) {
        let SealSink::Queue(q) = &mut self.core.log.sealed else {
            return;
        };
        let Some(&seq) = q.last() else { return };
        q.clear();
        if self.core.shared.poisoned.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.ckpt.run_to(seq) {
            tracing::error!(error = %e, "checkpoint failed; failing closed");
            self.core.shared.poison();
        }
    }
}

impl<F: Fs, I: Index> InlineStore<F, I> {
    /// Opens (creating if needed) the store in `dir` on `fs` with `index`.
    pub fn open(
        fs: &F,
        dir: impl AsRef<Path>,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<InlineStore<F, I>, StoreError> {
        let dir = dir.as_ref();
        create_dir_all_durable(fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        let (core, ckpt) = recover_engine(fs, dir, index, &opts, SealSink::Queue(Vec::new()))?;
        Ok(InlineStore {
            shared: core.shared.clone(),
            inner: Mutex::new(Inline {
                core,
                ckpt,
                closed: false,
            }),
            _lock: lock,
        })
    }

    /// Applies the commands as one group commit; each answer arrives only
    /// after the batch is durable.
    pub fn execute_batch(&self, cmds: Vec<(TenantId, Command)>) -> Vec<Result<Reply, StoreError>> {
        let mut g = self.inner.lock();
        let mut out: Vec<Result<Reply, StoreError>> =
            (0..cmds.len()).map(|_| Err(StoreError::Closed)).collect();
        if g.closed {
            return out;
        }
        let mut batch: Vec<(TenantId, Command, usize)> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, (t, c))| (t, c, i))
            .collect();
        g.core.commit(&mut batch, |i, r| out[i] = r);
        g.checkpoint_sealed();
        out
    }

    /// One command, one group commit.
    pub fn execute_now(&self, tenant: &TenantId, cmd: Command) -> Result<Reply, StoreError> {
        self.execute_batch(vec![(tenant.clone(), cmd)])
            .pop()
            .expect("one answer")
    }

    /// The `get` view now, on the caller's thread (see [`Store::get`]).
    pub fn get_now(
        &self,
        tenant: &TenantId,
        key: &Key,
    ) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
        get_sync(&self.shared, tenant, key)
    }

    /// The warnings of `task`, on the caller's thread.
    pub fn warnings_now(
        &self,
        tenant: &TenantId,
        task: &TaskId,
    ) -> Result<Vec<Warning>, StoreError> {
        warnings_sync(&self.shared, tenant, task)
    }

    /// Seals the current segment and checkpoints everything sealed
    /// (as a clean close does), keeping the store open.
    pub fn checkpoint_now(&self) -> Result<(), StoreError> {
        let mut g = self.inner.lock();
        if g.core.log.wal.bytes() > 0 {
            g.core.seal()?;
        }
        g.checkpoint_sealed();
        if self.shared.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned);
        }
        Ok(())
    }

    /// Checkpoints and stops accepting commands (a clean shutdown).
    pub fn close(&self) {
        let poisoned = self.shared.poisoned.load(Ordering::SeqCst);
        if !poisoned {
            let _ = self.checkpoint_now();
        }
        self.inner.lock().closed = true;
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst)
    }

    /// Entities held in memory (open records plus what awaits a checkpoint).
    pub fn resident(&self) -> usize {
        self.shared.map.len()
    }

    /// Stats as [`Store::stats`] reports them.
    pub fn stats_now(&self, stuck_after_ms: u64) -> StoreStats {
        stats_sync(&self.shared, stuck_after_ms)
    }

    /// Every stored record, open or settled (memory, then the index).
    pub fn records(&self) -> Result<Vec<(TenantId, Record)>, StoreError> {
        let mut out = Vec::new();
        let mut seen: HashSet<Box<[u8]>> = HashSet::new();
        for s in self.shared.map.iter() {
            if let Value::Record(r) = &*s.value
                && let EntityKey::Record(t, _) = EntityKey::from_bytes(s.key())?
            {
                out.push((t, r.clone()));
            }
            seen.insert(s.key().clone());
        }
        self.shared.index.for_each(&mut |k, v| {
            if !seen.contains(k)
                && let Ok(Value::Record(r)) = decode_value(v)
                && let Ok(EntityKey::Record(t, _)) = EntityKey::from_bytes(k)
            {
                out.push((t, r));
            }
        })?;
        Ok(out)
    }

    /// One background sweep, inline.
    pub fn sweep_now(&self) -> Result<SweepReport, StoreError> {
        let now = self.shared.now();
        let mut report = SweepReport::default();
        for (t, cmd) in sweep_candidates(&self.shared, now)? {
            match self.execute_now(&t, cmd)? {
                Reply::Expired { ended: true } => report.expired += 1,
                Reply::Collected { removed: true } => report.collected += 1,
                _ => {}
            }
        }
        Ok(report)
    }
}

impl<F: Fs, I: Index> Store for InlineStore<F, I> {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move { self.execute_now(tenant, cmd) })
    }

    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        let cmds = cmds.into_iter().map(|c| (tenant.clone(), c)).collect();
        Box::pin(async move { InlineStore::execute_batch(self, cmds) })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async move { self.get_now(tenant, key) })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async move { warnings_sync(&self.shared, tenant, task) })
    }

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        Box::pin(async move {
            Ok(self
                .shared
                .principal(tenant, principal)?
                .map(|s| s.generation))
        })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move { self.sweep_now() })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move { Ok(self.stats_now(stuck_after_ms)) })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(self.shared.now()) })
    }

    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        // Inline: deterministic, on the caller's thread.
        Box::pin(async move { scan_sync(&self.shared, tenant, after, max) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { health_sync(&self.shared, self.inner.lock().closed) })
    }
}

/// What [`scan`] found besides the records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Stored values that do not decode (`tenant/key: reason`).
    pub undecodable: Vec<String>,
    /// A torn tail left by a crash (never acknowledged; cut at the next open).
    pub torn_tail: Option<String>,
}

/// Reads a stopped store offline, calling `f` for every stored record, open
/// or settled. Read-only: it recovers into memory and changes nothing on
/// disk (a torn tail stays, a store recovery would refuse is refused with
/// the same error and left as it is).
pub fn scan(
    dir: impl AsRef<Path>,
    mut f: impl FnMut(&TenantId, &Record),
) -> Result<ScanReport, StoreError> {
    let dir = dir.as_ref();
    if !dir.join("wal").is_dir() || !dir.join("index").is_dir() {
        return Err(StoreError::Io(format!(
            "{} is not a settle data directory (no wal/ and index/)",
            dir.display()
        )));
    }
    let _lock = OsFs.lock(&dir.join("LOCK")).map_err(io)?;
    let index = FjallIndex::open(&dir.join("index"))?;
    let rec = recovery::recover(&OsFs, &dir.join("wal"), &index)?;
    let mut report = ScanReport {
        torn_tail: rec
            .torn
            .as_ref()
            .map(|(p, from, to)| format!("{} bytes {from}..{to}", p.display())),
        ..ScanReport::default()
    };
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    let map: &DashMap<Box<[u8]>, Slot, Hasher> = &rec.map;
    for s in map.iter() {
        match &*s.value {
            Value::Record(r) => {
                if let EntityKey::Record(t, _) = EntityKey::from_bytes(s.key())? {
                    f(&t, r);
                }
            }
            Value::Undecodable(e) => report
                .undecodable
                .push(format!("{}: {e}", Recovered::describe(s.key()))),
            _ => {}
        }
        seen.insert(s.key().clone());
    }
    index.for_each(&mut |k, v| {
        if seen.contains(k) {
            return;
        }
        match decode_value(v) {
            Ok(Value::Record(r)) => {
                if let Ok(EntityKey::Record(t, _)) = EntityKey::from_bytes(k) {
                    f(&t, &r);
                }
            }
            Ok(_) => {}
            Err(e) => report
                .undecodable
                .push(format!("{}: {e}", Recovered::describe(k))),
        }
    })?;
    Ok(report)
}

#[cfg(test)]
mod record_key_set_tests {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Fence, Reply};

    type Inline = InlineStore<OsFs, FjallIndex>;

    /// The store inline (checkpoints at known points) in `dir`.
    fn open_inline(dir: &Path) -> Inline {
        let opts = EmbeddedOptions {
            segment_bytes: 16 * 1024,
            ..EmbeddedOptions::default()
        };
        let index = FjallIndex::open(&dir.join("index")).unwrap();
        InlineStore::open(&OsFs, dir, index, opts).unwrap()
    }

    fn key_set_len(store: &Inline) -> usize {
        store.shared.record_keys().len()
    }

    /// The listing's sorted key set keeps the records in memory only: a
    /// record claimed and settled within one segment leaves it at the
    /// checkpoint that evicts it (it is never inserted), one still open
    /// stays, and one settled in a later segment leaves then.
    #[test]
    fn the_sorted_key_set_holds_exactly_the_records_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_inline(dir.path());
        // A listing turns the key sets on (a store nobody listed keeps none).
        assert_eq!(key_set_len(&store), 0);
        let t = TenantId::new("acme").unwrap();
        let mut open = Vec::new();
        for i in 0..20 {
            let k = format!("k-{i:02}");
            let Reply::Claim(ClaimDecision::Execute(g)) = store
                .execute_now(&t, claim(&k, 1, binding("a", 0)))
                .unwrap()
            else {
                panic!()
            };
            if i % 4 == 0 {
                open.push((k, g.fence));
            } else {
                store
                    .execute_now(&t, settle(&k, g.fence, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        // Not folded yet (a listing would fold them): the checkpoint below
        // meets them as fresh keys.
        let s = &store.shared;
        assert_eq!(
            s.record_keys.read().len() + s.new_record_keys.lock().len(),
            20
        );
        store.checkpoint_now().unwrap();
        assert_eq!(key_set_len(&store), open.len());
        assert_eq!(store.resident(), open.len());
        for (k, fence) in &open {
            store
                .execute_now(&t, settle(k, *fence, 1, binding("a", 0), completed(1)))
                .unwrap();
        }
        store.checkpoint_now().unwrap();
        assert_eq!(key_set_len(&store), 0);
        assert_eq!(store.resident(), 0);
    }

    /// Until the first listing no key set is kept; that listing finds
    /// every record in memory (recovered at open or published since), and
    /// from then on the set follows the map as above.
    #[test]
    fn the_first_listing_sorts_in_what_memory_holds_and_the_sets_follow_from_then() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId::new("acme").unwrap();
        let claim_only = |store: &Inline, k: &str| {
            let Reply::Claim(ClaimDecision::Execute(g)) =
                store.execute_now(&t, claim(k, 1, binding("a", 0))).unwrap()
            else {
                panic!()
            };
            g.fence
        };
        {
            let store = open_inline(dir.path());
            claim_only(&store, "before-restart");
            store.close();
        }
        let store = open_inline(dir.path());
        let s = &store.shared;
        let mut fences: Vec<(String, Option<Fence>)> = vec![("before-restart".into(), None)];
        for i in 0..30 {
            let k = format!("k-{i:02}");
            let f = claim_only(&store, &k);
            if i % 3 == 0 {
                fences.push((k, Some(f)));
            } else {
                store
                    .execute_now(&t, settle(&k, f, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        store.checkpoint_now().unwrap();
        // Nothing was kept while nobody listed.
        assert_eq!(
            s.record_keys.read().len() + s.new_record_keys.lock().len(),
            0
        );
        let listed = scan_sync(&store.shared, &t, None, 1000).unwrap();
        let keys: Vec<String> = listed.records.iter().map(|r| r.key.to_string()).collect();
        assert_eq!(keys.len(), 31, "{keys:?}");
        // The sorted set holds exactly the open records, all in memory.
        assert_eq!(key_set_len(&store), fences.len());
        assert_eq!(store.resident(), fences.len());
        let fresh = claim_only(&store, "after-listing");
        assert_eq!(s.new_record_keys.lock().len(), 1);
        fences.push(("after-listing".into(), Some(fresh)));
        for (k, f) in &fences {
            if let Some(f) = f {
                store
                    .execute_now(&t, settle(k, *f, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        store.checkpoint_now().unwrap();
        store.checkpoint_now().unwrap();
        // Left: the record claimed before the restart (still open).
        assert_eq!(key_set_len(&store), 1);
        assert_eq!(store.resident(), 1);
        assert_eq!(
            scan_sync(&store.shared, &t, None, 1000)
                .unwrap()
                .records
                .len(),
            32
        );
    }
}
