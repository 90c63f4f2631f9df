//! The single writer with group commit, and the checkpointer.
//!
//! Commit protocol (see docs/design.md):
//! 1. The writer takes every queued command (up to `max_batch`), applies
//!    each through `settle_core::apply` in arrival order against the latest
//!    state (batch overlay, then the durable map, then the index).
//! 2. It encodes the final state of every changed entity into one frame,
//!    `write`s it and `fdatasync`s it.
//! 3. Only then does it publish the new states to the durable map (which
//!    readers see) and answer every caller.
//! 4. When a segment is full it seals it; the checkpointer writes every
//!    entity changed up to the seal into the index, fsyncs it, deletes the
//!    covered segments and evicts terminal records from memory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use dashmap::DashMap;
use settle_core::{
    Command, Ctx, Fence, Limits, OpState, PrincipalState, Principals, Reply, Target, TenantId,
    Timestamp, apply, principals_needed,
};
use settle_ledger::{Clock, StoreError};
use tokio::sync::oneshot;

use crate::codec::{
    Batch, EntityKey, Entry, FORMAT_VERSION, Value, decode_frames, encode_for_log, encode_frame,
};
use crate::index::{CheckpointItem, Index, Meta};
use crate::wal::{self, Faults, Wal};

/// Hashing for in-memory maps: keys come from the tenants' trusted
/// services, and foldhash is randomly seeded; SipHash showed in profiles.
pub type Hasher = foldhash::fast::RandomState;

/// One entity's durable state in memory.
pub struct Slot {
    /// The batch that wrote this state.
    pub lsn: u64,
    pub value: Arc<Value>,
}

impl Slot {
    /// Terminal records, tombstones, principals and warnings may leave RAM
    /// once checkpointed; open records stay (the sweep needs them).
    fn evictable(&self) -> bool {
        match &*self.value {
            Value::Record(r) => r.status.is_terminal(),
            _ => true,
        }
    }
}

/// State shared by the writer, the checkpointer and readers.
pub struct Shared {
    /// Durable state changed since the last checkpoint, plus every open record.
    pub map: DashMap<Box<[u8]>, Slot, Hasher>,
    pub index: Index,
    /// Set on any write, fsync or checkpoint failure: the store fails closed.
    pub poisoned: AtomicBool,
    pub clock: Clock,
    pub limits: Limits,
    /// The store's clock never goes backwards within a process.
    pub last_now: AtomicU64,
}

impl Shared {
    /// The store's clock: the configured clock, never earlier than a time already used.
    pub fn now(&self) -> Timestamp {
        let t = self.clock.now().0;
        let prev = self.last_now.fetch_max(t, Ordering::SeqCst);
        Timestamp(prev.max(t))
    }

    /// The durable state of an entity (map, then index).
    pub fn load(&self, key: &[u8]) -> Result<Option<Arc<Value>>, StoreError> {
        if let Some(s) = self.map.get(key) {
            return Ok(Some(s.value.clone()));
        }
        Ok(self.index.get(key)?.map(Arc::new))
    }

    pub fn principal(
        &self,
        tenant: &TenantId,
        p: &settle_core::Principal,
    ) -> Result<PrincipalState, StoreError> {
        let k = EntityKey::Principal(tenant.clone(), p.clone()).to_bytes();
        Ok(match self.load(&k)?.as_deref() {
            Some(Value::Principal(s)) => *s,
            _ => PrincipalState::default(),
        })
    }
}

pub type ReplyTx = oneshot::Sender<Result<Reply, StoreError>>;

pub enum Msg {
    Exec {
        tenant: TenantId,
        cmd: Command,
        reply: ReplyTx,
    },
    /// Finish queued work, checkpoint, stop.
    Close(std::sync::mpsc::Sender<()>),
}

pub enum CkptMsg {
    Sealed { seq: u64, lsn: u64, next_fence: u64 },
    Stop(std::sync::mpsc::Sender<()>),
}

pub struct WriterConfig {
    pub max_batch: usize,
}

pub struct Writer {
    pub shared: Arc<Shared>,
    pub wal: Wal,
    pub lsn: u64,
    pub next_fence: u64,
    pub rx: Receiver<Msg>,
    pub ckpt: Sender<CkptMsg>,
    pub config: WriterConfig,
    /// The LSN that ends each written batch of the current segment.
    pub segment_last_lsn: u64,
    /// Principal generations the writer has seen. The writer is their only
    /// mutator, so this cache is exact; it saves an index lookup (usually a
    /// miss: most principals stay at generation 0) on every claim and settle.
    pub principals: HashMap<Box<[u8]>, PrincipalState, Hasher>,
    /// The batch's changes, reused across batches to keep its capacity.
    pub overlay: HashMap<Box<[u8]>, Value, Hasher>,
}

/// Bound on the writer's principal cache; it is simply cleared when full.
const PRINCIPAL_CACHE: usize = 100_000;

fn io_err(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl Writer {
    /// The writer thread's loop.
    pub fn run(mut self) {
        let mut batch: Vec<(TenantId, Command, ReplyTx)> =
            Vec::with_capacity(self.config.max_batch);
        let mut buf = Vec::with_capacity(1 << 20);
        loop {
            let first = match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return self.close(None),
            };
            let mut closing = None;
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Msg::Exec { tenant, cmd, reply } => batch.push((tenant, cmd, reply)),
                    Msg::Close(done) => {
                        closing = Some(done);
                        break;
                    }
                }
                if batch.len() < self.config.max_batch {
                    next = self.rx.try_recv().ok();
                }
            }
            if !batch.is_empty() {
                self.commit(&mut batch, &mut buf);
            }
            if let Some(done) = closing {
                return self.close(Some(done));
            }
        }
    }

    /// Applies, logs, syncs, publishes, answers: one group commit.
    fn commit(&mut self, batch: &mut Vec<(TenantId, Command, ReplyTx)>, buf: &mut Vec<u8>) {
        if self.shared.poisoned.load(Ordering::SeqCst) {
            for (_, _, reply) in batch.drain(..) {
                let _ = reply.send(Err(StoreError::Poisoned));
            }
            return;
        }
        let now = self.shared.now();
        let mut overlay = std::mem::take(&mut self.overlay);
        let mut replies = Vec::with_capacity(batch.len());
        for (tenant, cmd, reply) in batch.drain(..) {
            let r = self.apply_one(&tenant, &cmd, now, &mut overlay);
            replies.push((reply, r));
        }
        if !overlay.is_empty() {
            let started = Instant::now();
            self.lsn += 1;
            // Each value is encoded once: into the log here, and the
            // checkpointer ingests the same bytes into the index.
            let encoded: Vec<(Box<[u8]>, Value, Vec<u8>)> = overlay
                .drain()
                .map(|(k, v)| {
                    let blob = encode_for_log(&v);
                    (k, v, blob)
                })
                .collect();
            let frame = Batch {
                version: FORMAT_VERSION,
                lsn: self.lsn,
                next_fence: self.next_fence,
                entries: encoded
                    .iter()
                    .map(|(k, v, b)| Entry::new(k, v, b))
                    .collect(),
            };
            buf.clear();
            encode_frame(&frame, buf);
            drop(frame);
            // A frame goes whole into one segment: start the next one if the
            // preallocated space is short (an oversized frame extends the file).
            if self.wal.bytes() > 0 && !self.wal.fits(buf.len()) {
                self.seal();
            }
            if let Err(e) = self.wal.append_sync(buf) {
                // Fail closed: never retry an fsync, never answer with a receipt.
                tracing::error!(error = %e, "log write failed; the store refuses writes until reopened");
                self.shared.poisoned.store(true, Ordering::SeqCst);
                let err = StoreError::Io(e.to_string());
                for (reply, _) in replies {
                    let _ = reply.send(Err(err.clone()));
                }
                return;
            }
            metrics::histogram!("settle_commit_batch_size").record(replies.len() as f64);
            metrics::histogram!("settle_commit_duration_seconds")
                .record(started.elapsed().as_secs_f64());
            let lsn = self.lsn;
            for (k, v, _) in encoded {
                if let Value::Principal(p) = &v {
                    self.principals.insert(k.clone(), *p);
                }
                let value = Arc::new(v);
                match self.shared.map.entry(k) {
                    dashmap::Entry::Occupied(mut e) => {
                        let s = e.get_mut();
                        s.lsn = lsn;
                        s.value = value;
                    }
                    dashmap::Entry::Vacant(e) => {
                        e.insert(Slot { lsn, value });
                    }
                }
            }
            self.segment_last_lsn = lsn;
        }
        self.overlay = overlay;
        for (reply, r) in replies {
            let _ = reply.send(r);
        }
        if !self.wal.fits(4096) {
            self.seal();
        }
    }

    /// Loads what `cmd` targets (batch overlay first), applies the rules, records the changes.
    fn apply_one(
        &mut self,
        tenant: &TenantId,
        cmd: &Command,
        now: Timestamp,
        overlay: &mut HashMap<Box<[u8]>, Value, Hasher>,
    ) -> Result<Reply, StoreError> {
        let load = |overlay: &HashMap<Box<[u8]>, Value, Hasher>,
                    k: &[u8]|
         -> Result<Option<Value>, StoreError> {
            if let Some(v) = overlay.get(k) {
                return Ok(Some(v.clone()));
            }
            Ok(self.shared.load(k)?.map(|v| (*v).clone()))
        };
        let mut state = OpState::default();
        let target_key: Box<[u8]> = match cmd.target() {
            Target::Record(key) => {
                let k = EntityKey::Record(tenant.clone(), key.clone())
                    .to_bytes()
                    .into_boxed_slice();
                state.record = match load(overlay, &k)? {
                    Some(Value::Record(r)) => Some(r),
                    _ => None,
                };
                k
            }
            Target::Task(task) => {
                let k = EntityKey::Task(tenant.clone(), task.clone())
                    .to_bytes()
                    .into_boxed_slice();
                if let Some(Value::Warnings(w)) = load(overlay, &k)? {
                    state.warnings = w;
                }
                k
            }
            Target::Principal(p) => EntityKey::Principal(tenant.clone(), p.clone())
                .to_bytes()
                .into_boxed_slice(),
        };
        let mut principals = Principals::new();
        for p in principals_needed(cmd, state.record.as_ref()) {
            let k = EntityKey::Principal(tenant.clone(), p.clone()).to_bytes();
            let st = if let Some(Value::Principal(s)) = overlay.get(&k[..]) {
                *s
            } else if let Some(s) = self.principals.get(&k[..]) {
                *s
            } else {
                let s = match self.shared.load(&k)?.as_deref() {
                    Some(Value::Principal(s)) => *s,
                    _ => PrincipalState::default(),
                };
                if self.principals.len() >= PRINCIPAL_CACHE {
                    self.principals.clear();
                }
                self.principals.insert(k.into_boxed_slice(), s);
                s
            };
            principals.insert(p.clone(), st);
        }
        state.principals = principals;
        let ctx = Ctx {
            now,
            next_fence: Fence(self.next_fence),
            limits: self.shared.limits,
        };
        let applied = apply(&mut state, cmd, &ctx);
        if applied.fence_used {
            self.next_fence += 1;
        }
        for (p, st) in state.principals.dirty() {
            let k = EntityKey::Principal(tenant.clone(), p.clone())
                .to_bytes()
                .into_boxed_slice();
            overlay.insert(k, Value::Principal(*st));
        }
        if applied.changed {
            let v = match cmd.target() {
                Target::Record(_) => state.record.map(Value::Record).unwrap_or(Value::Gone),
                Target::Task(_) => Value::Warnings(state.warnings),
                Target::Principal(_) => unreachable!("principals report through dirty()"),
            };
            overlay.insert(target_key, v);
        }
        Ok(applied.reply)
    }

    /// Starts a new segment and hands the full one to the checkpointer.
    fn seal(&mut self) {
        match self.wal.rotate() {
            Ok(seq) => {
                let _ = self.ckpt.send(CkptMsg::Sealed {
                    seq,
                    lsn: self.segment_last_lsn,
                    next_fence: self.next_fence,
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a new log segment; failing closed");
                self.shared.poisoned.store(true, Ordering::SeqCst);
            }
        }
    }

    fn close(mut self, done: Option<std::sync::mpsc::Sender<()>>) {
        // Answer anything still queued, then checkpoint what is durable.
        let mut rest = Vec::new();
        while let Ok(Msg::Exec { tenant, cmd, reply }) = self.rx.try_recv() {
            rest.push((tenant, cmd, reply));
        }
        if !rest.is_empty() {
            let mut buf = Vec::new();
            self.commit(&mut rest, &mut buf);
        }
        if !self.shared.poisoned.load(Ordering::SeqCst) && self.wal.bytes() > 0 {
            self.seal();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self.ckpt.send(CkptMsg::Stop(tx)).is_ok() {
            let _ = rx.recv();
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

/// The checkpointer thread's loop.
pub fn checkpointer(
    shared: Arc<Shared>,
    wal_dir: PathBuf,
    rx: Receiver<CkptMsg>,
    mut checkpoint_seq: u64,
    faults: Option<Arc<Faults>>,
) {
    for msg in rx {
        match msg {
            CkptMsg::Sealed {
                seq,
                lsn,
                next_fence,
            } => {
                if shared.poisoned.load(Ordering::SeqCst) {
                    continue;
                }
                match checkpoint(
                    &shared,
                    &wal_dir,
                    checkpoint_seq,
                    seq,
                    lsn,
                    next_fence,
                    &faults,
                ) {
                    Ok(()) => checkpoint_seq = seq,
                    Err(e) => {
                        tracing::error!(error = %e, "checkpoint failed; failing closed");
                        shared.poisoned.store(true, Ordering::SeqCst);
                    }
                }
            }
            CkptMsg::Stop(done) => {
                let _ = done.send(());
                return;
            }
        }
    }
}

/// Ingests the newest state of every entity in the sealed segments
/// `(from_seq, to_seq]` into the index, makes it durable, deletes those
/// segments, then evicts from memory what may leave it.
fn checkpoint(
    shared: &Shared,
    wal_dir: &std::path::Path,
    from_seq: u64,
    to_seq: u64,
    to_lsn: u64,
    next_fence: u64,
    faults: &Option<Arc<Faults>>,
) -> Result<(), StoreError> {
    let started = Instant::now();
    let segments: Vec<(u64, PathBuf)> = wal::segments(wal_dir)
        .map_err(io_err)?
        .into_iter()
        .filter(|(s, _)| *s > from_seq && *s <= to_seq)
        .collect();
    // The newest entry per key (later batches win), borrowed from the segment bytes.
    let buffers = segments
        .iter()
        .map(|(_, path)| wal::read_segment(path))
        .collect::<Result<Vec<_>, _>>()?;
    let mut newest: HashMap<&[u8], (u64, Entry<'_>), Hasher> = HashMap::default();
    for (buf, (_, path)) in buffers.iter().zip(&segments) {
        let (batches, valid) = decode_frames(buf)?;
        if !wal::clean_tail(buf, valid) {
            return Err(StoreError::Corrupt(format!(
                "sealed segment {} is damaged",
                path.display()
            )));
        }
        for b in batches {
            for e in b.entries {
                newest.insert(e.key, (b.lsn, e));
            }
        }
    }
    let mut taken: Vec<(u64, Entry<'_>)> = newest.into_values().collect();
    taken.sort_unstable_by(|a, b| a.1.key.cmp(b.1.key));
    let items: Vec<CheckpointItem<'_>> = taken
        .iter()
        .map(|(_, e)| CheckpointItem {
            key: e.key,
            open: e.open,
            expires_at: e.expires_at,
            value: e.value,
        })
        .collect();
    if Faults::take_checkpoint(faults) {
        return Err(StoreError::Io("injected checkpoint failure".into()));
    }
    shared.index.checkpoint(
        &items,
        Meta {
            checkpoint_seq: to_seq,
            checkpoint_lsn: to_lsn,
            next_fence,
        },
    )?;
    // The index now holds everything those segments hold: drop them.
    for (_, path) in &segments {
        std::fs::remove_file(path).map_err(io_err)?;
    }
    wal::sync_dir(wal_dir).map_err(io_err)?;
    // Evict what was checkpointed unless a later batch changed it since.
    for (lsn, e) in &taken {
        shared
            .map
            .remove_if(e.key, |_, s| s.lsn == *lsn && s.evictable());
    }
    tracing::debug!(
        entities = taken.len(),
        to_seq,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint"
    );
    Ok(())
}
