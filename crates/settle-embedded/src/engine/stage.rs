//! The first half of a group commit: the writer applies each command
//! through the pure core (`settle_core::apply`) against the latest state,
//! then encodes the frame of what the batch changed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use settle_core::{
    Command, Ctx, Fence, OpState, PrincipalState, Principals, RefusalCode, Reply, Target, TenantId,
    Timestamp, apply, principals_needed,
};
use settle_ledger::StoreError;

use super::Hasher;
use super::shared::Shared;
use crate::codec::{
    KIND_PRINCIPAL, KIND_RECORD, KIND_TASK, Value, encode_frame_of, entity_key_into,
};
use crate::index::Index;
use crate::wal::Faults;

/// Applies commands and encodes their frame (the first half of a group commit).
pub struct Stage<I: Index> {
    pub shared: Arc<Shared<I>>,
    /// The last batch staged.
    pub lsn: u64,
    pub next_fence: u64,
    /// Records marked disputed as of the last batch staged.
    pub disputed: u64,
    pub max_batch: usize,
    /// Principal generations the writer has seen. The writer is their only
    /// mutator, so this cache is exact; it saves an index lookup (usually a
    /// miss: most principals stay at generation 0) on every claim and settle.
    pub principals: HashMap<Box<[u8]>, PrincipalState, Hasher>,
    /// The batch's changes; they become the frame's entries as they are.
    pub overlay: Changes,
    /// The changes of the batches staged and not yet in `map` (published
    /// once durable), oldest first, with their batch numbers: later
    /// batches read them from here, newest first.
    pub pending: VecDeque<(u64, Arc<Changes>)>,
    /// Frame buffers handed back by the log, reused.
    pub spare: Vec<Vec<u8>>,
    /// Where principal keys are built for a lookup, reused.
    pub key_buf: Vec<u8>,
    /// The principals of the command being applied, reused.
    pub principal_buf: Principals,
    pub faults: Option<Arc<Faults>>,
}

/// The final state of every entity a batch changed.
pub type Changes = HashMap<Box<[u8]>, Arc<Value>, Hasher>;

/// A batch being gathered: its commands applied as they came, its
/// changes in [`Stage::overlay`], its frame not encoded yet.
pub struct Gathering<R> {
    pub(super) replies: Vec<(R, Result<Reply, StoreError>)>,
    /// Records marked disputed, store-wide, as of the last command applied.
    disputed: i64,
    /// The earliest expiry of a terminal record written (`u64::MAX`: none).
    due: u64,
}

impl<R> Default for Gathering<R> {
    fn default() -> Self {
        Gathering {
            replies: Vec::new(),
            disputed: 0,
            due: u64::MAX,
        }
    }
}

impl<R> Gathering<R> {
    /// Commands applied so far.
    pub fn len(&self) -> usize {
        self.replies.len()
    }
    pub fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }
}

/// A batch applied and encoded, waiting to be made durable and answered.
pub struct Staged<R> {
    /// Each command's answer, given out once the frame is durable.
    pub replies: Vec<(R, Result<Reply, StoreError>)>,
    /// `None`: nothing changed, nothing to write.
    pub frame: Option<StagedFrame>,
}

/// The frame of a staged batch, and what publishing it needs.
pub struct StagedFrame {
    pub buf: Vec<u8>,
    pub lsn: u64,
    pub disputed: u64,
    pub changes: Arc<Changes>,
    /// The earliest expiry of a terminal record among `changes` (`u64::MAX`: none).
    pub due: u64,
    /// The fence counter after the batch.
    pub next_fence: u64,
}

/// Bound on the writer's principal cache; it is simply cleared when full.
const PRINCIPAL_CACHE: usize = 100_000;

impl<I: Index> Stage<I> {
    /// Applies every command of `batch` in order and encodes the frame of
    /// what changed. Nothing is written and nobody is answered yet.
    pub fn stage<R>(&mut self, batch: &mut Vec<(TenantId, Command, R)>) -> Staged<R> {
        let mut g = self.begin(batch.len());
        for (tenant, cmd, r) in batch.drain(..) {
            self.apply(&mut g, &tenant, &cmd, r);
        }
        self.end(g)
    }

    /// Starts a batch; its commands are applied one by one as they come
    /// ([`Stage::apply`]), then [`Stage::end`] encodes its frame.
    pub fn begin<R>(&self, capacity: usize) -> Gathering<R> {
        Gathering {
            replies: Vec::with_capacity(capacity),
            disputed: self.disputed as i64,
            due: u64::MAX,
        }
    }

    /// Applies one command to the batch being gathered, against the
    /// latest state: the batch's own changes, the batches staged before
    /// it, the durable map, the index.
    pub fn apply<R>(&mut self, g: &mut Gathering<R>, tenant: &TenantId, cmd: &Command, r: R) {
        if Faults::take_panic(&self.faults) {
            panic!("injected writer panic");
        }
        Faults::applying(&self.faults);
        if self.shared.is_poisoned() {
            g.replies.push((r, Err(StoreError::Poisoned)));
            return;
        }
        let now = self.shared.now();
        let mut overlay = std::mem::take(&mut self.overlay);
        let shared = self.shared.clone();
        let mut leased = shared.leased();
        let mut marks = Marks::new(&mut leased, g.due);
        let res = self.apply_one(tenant, cmd, now, &mut overlay, &mut g.disputed, &mut marks);
        g.due = marks.due;
        drop(leased);
        self.overlay = overlay;
        g.replies.push((r, res));
    }

    /// Ends the batch being gathered: encodes the frame of what changed
    /// (none if nothing did). Nothing is written and nobody is answered yet.
    pub fn end<R>(&mut self, g: Gathering<R>) -> Staged<R> {
        let Gathering {
            replies,
            disputed,
            due,
        } = g;
        let frame = (!self.overlay.is_empty()).then(|| {
            let lsn = self.lsn + 1;
            let disputed = disputed.max(0) as u64;
            // The next batch starts a map of the same size.
            let capacity = self.overlay.capacity();
            let changes = std::mem::replace(
                &mut self.overlay,
                HashMap::with_capacity_and_hasher(capacity, Hasher::default()),
            );
            // Each value is encoded once, straight into the frame; the
            // checkpointer ingests the same bytes into the index.
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            encode_frame_of(
                lsn,
                self.next_fence,
                disputed,
                changes.iter().map(|(k, v)| (&k[..], &**v)),
                &mut buf,
            );
            for (k, v) in &changes {
                if let Value::Principal(p) = &**v {
                    if self.principals.len() >= PRINCIPAL_CACHE {
                        self.principals.clear();
                    }
                    self.principals.insert(k.clone(), *p);
                }
            }
            self.lsn = lsn;
            self.disputed = disputed;
            let changes = Arc::new(changes);
            self.pending.push_back((lsn, changes.clone()));
            StagedFrame {
                buf,
                lsn,
                disputed,
                changes,
                due,
                next_fence: self.next_fence,
            }
        });
        Staged { replies, frame }
    }

    /// What `f` makes of the latest state of an entity outside the batch
    /// being applied: the batches staged before it and not yet published
    /// (maybe not durable yet), newest first, else the durable state. `f`
    /// borrows the value, so nothing is cloned that the command does not
    /// need.
    fn load_with<T>(&self, k: &[u8], f: impl FnOnce(&Value) -> T) -> Result<Option<T>, StoreError> {
        for (_, changes) in self.pending.iter().rev() {
            if let Some(v) = changes.get(k) {
                return Ok(Some(f(v)));
            }
        }
        self.shared.load_with(k, f)
    }

    /// [`Stage::load_with`], the batch's own changes first.
    fn lookup<T>(
        &self,
        overlay: &Changes,
        k: &[u8],
        f: impl FnOnce(&Value) -> T,
    ) -> Result<Option<T>, StoreError> {
        if let Some(v) = overlay.get(k) {
            return Ok(Some(f(v)));
        }
        self.load_with(k, f)
    }

    /// The states of the principals `cmd` needs (batch overlay, cache,
    /// map, index), in the writer's one reused `Principals`; `None` when
    /// one is undecodable (the command is refused).
    fn principals_for(
        &mut self,
        tenant: &TenantId,
        cmd: &Command,
        record: Option<&settle_core::Record>,
        overlay: &Changes,
    ) -> Result<Option<Principals>, StoreError> {
        let mut principals = std::mem::take(&mut self.principal_buf);
        principals.clear();
        // Principal keys are only looked up (the cache usually has them):
        // built in one reused buffer.
        let mut pk = std::mem::take(&mut self.key_buf);
        for p in principals_needed(cmd, record) {
            pk.clear();
            entity_key_into(KIND_PRINCIPAL, tenant, p.as_str(), &mut pk);
            let st = if let Some(Value::Principal(s)) = overlay.get(&pk[..]).map(|v| &**v) {
                *s
            } else if let Some(s) = self.principals.get(&pk[..]) {
                *s
            } else {
                let found = self.load_with(&pk, |v| match v {
                    Value::Principal(s) => Ok(*s),
                    Value::Undecodable(_) => Err(()),
                    _ => Ok(PrincipalState::default()),
                })?;
                let s = match found {
                    Some(Ok(s)) => s,
                    Some(Err(())) => return Ok(None),
                    None => PrincipalState::default(),
                };
                if self.principals.len() >= PRINCIPAL_CACHE {
                    self.principals.clear();
                }
                self.principals.insert(pk[..].into(), s);
                s
            };
            principals.insert(p.clone(), st);
        }
        self.key_buf = pk;
        Ok(Some(principals))
    }

    /// Loads what `cmd` targets (batch overlay first), applies the rules, records the changes.
    fn apply_one(
        &mut self,
        tenant: &TenantId,
        cmd: &Command,
        now: Timestamp,
        overlay: &mut Changes,
        disputed: &mut i64,
        marks: &mut Marks<'_>,
    ) -> Result<Reply, StoreError> {
        const REFUSED: Reply = Reply::Refused(RefusalCode::RecordRefused);
        let (kind, name) = match cmd.target() {
            Target::Record(key) => (KIND_RECORD, key.as_str()),
            Target::Task(task) => (KIND_TASK, task.as_str()),
            Target::Principal(p) => (KIND_PRINCIPAL, p.as_str()),
        };
        // Built once, at its exact size: it becomes the overlay's key as is.
        let mut k = Vec::with_capacity(2 + tenant.as_str().len() + name.len());
        entity_key_into(kind, tenant, name, &mut k);
        let target_key = k.into_boxed_slice();
        let mut state = OpState::default();
        match cmd.target() {
            Target::Record(_) => {
                // Cloned straight into the state: a record is ~370 bytes,
                // and each wrapper it was returned through was a copy.
                let slot = &mut state.record;
                let found = self.lookup(overlay, &target_key, |v| match v {
                    Value::Record(r) => {
                        *slot = Some(r.clone());
                        true
                    }
                    // Never taken for absent: the key could be claimed again.
                    Value::Undecodable(_) => false,
                    _ => true,
                })?;
                if found == Some(false) {
                    return Ok(REFUSED);
                }
            }
            Target::Task(_) => {
                let found = self.lookup(overlay, &target_key, |v| match v {
                    Value::Warnings(w) => Ok(Some(w.clone())),
                    Value::Undecodable(_) => Err(()),
                    _ => Ok(None),
                })?;
                match found {
                    Some(Ok(Some(w))) => state.warnings = w,
                    Some(Err(())) => return Ok(REFUSED),
                    _ => {}
                }
            }
            Target::Principal(_) => {}
        }
        match self.principals_for(tenant, cmd, state.record.as_ref(), overlay)? {
            Some(p) => state.principals = p,
            None => return Ok(REFUSED),
        }
        let was_disputed = state.record.as_ref().is_some_and(|r| r.disputed);
        let was_leased = state
            .record
            .as_ref()
            .is_some_and(|r| r.open_lease().is_some());
        let ctx = Ctx {
            now,
            next_fence: Fence(self.next_fence),
            limits: self.shared.limits(),
        };
        let applied = apply(&mut state, cmd, &ctx);
        if applied.fence_used {
            self.next_fence += 1;
        }
        for (p, st) in state.principals.dirty() {
            let mut k = Vec::with_capacity(2 + tenant.as_str().len() + p.as_str().len());
            entity_key_into(KIND_PRINCIPAL, tenant, p.as_str(), &mut k);
            overlay.insert(k.into_boxed_slice(), Arc::new(Value::Principal(*st)));
        }
        self.principal_buf = std::mem::take(&mut state.principals);
        if applied.changed {
            let v = match cmd.target() {
                Target::Record(_) => {
                    let is_disputed = state.record.as_ref().is_some_and(|r| r.disputed);
                    *disputed += is_disputed as i64 - was_disputed as i64;
                    marks.note(&target_key, was_leased, state.record.as_ref());
                    state.record.map(Value::Record).unwrap_or(Value::Gone)
                }
                Target::Task(_) => Value::Warnings(state.warnings),
                Target::Principal(_) => unreachable!("principals report through dirty()"),
            };
            overlay.insert(target_key, Arc::new(v));
        }
        Ok(applied.reply)
    }
}

/// What the writer notes while it applies a batch: [`Shared::leased`]
/// (locked for the batch) and the earliest expiry it wrote. Opening a
/// store notes every record it loaded the same way.
pub struct Marks<'a> {
    leased: &'a mut HashSet<Box<[u8]>, Hasher>,
    pub due: u64,
}

impl<'a> Marks<'a> {
    /// Marks going on from `due`, the earliest expiry noted so far.
    pub fn new(leased: &'a mut HashSet<Box<[u8]>, Hasher>, due: u64) -> Self {
        Marks { leased, due }
    }

    /// Record `k` was in a state holding an open lease (`was_leased`) and is now `now`.
    pub fn note(&mut self, k: &[u8], was_leased: bool, now: Option<&settle_core::Record>) {
        let leased = now.is_some_and(|r| r.open_lease().is_some());
        if leased && !was_leased {
            self.leased.insert(k.into());
        } else if was_leased && !leased {
            self.leased.remove(k);
        }
        if let Some(e) = now.and_then(|r| r.expires_at()) {
            self.due = self.due.min(e.millis());
        }
    }
}
