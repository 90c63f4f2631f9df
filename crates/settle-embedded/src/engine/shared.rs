//! The state the writer, the log thread, the checkpointer and readers
//! share: the map of durable states in memory, what the sweep needs, and
//! the published LSN. Its fields are private: every lock is taken through a
//! method here (or in [`super::listing`]), in the order
//! [`super::lock_order`] states.

use std::collections::HashSet;
use std::ops::{Bound, Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use settle_core::{Limits, PrincipalState, RefusalCode, TenantId, Timestamp};
use settle_ledger::{Clock, StoreError};

use super::Hasher;
use super::bloom::Ingested;
use super::listing::Listing;
use super::lock_order::{self, Level};
use super::stage::{Changes, Marks};
use crate::codec::{EntityKey, Value, decode_value};
use crate::index::Index;

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

/// An export's instant while it reads the map (see [`Shared::snapshot`]).
struct Capture {
    /// The last batch published at the instant.
    lsn: u64,
    /// The states of the instant that publishes replaced since, first
    /// replacement only.
    replaced: std::collections::HashMap<Box<[u8]>, Arc<Value>, Hasher>,
}

/// A running store's state at one instant, read by [`Shared::snapshot`]: the
/// map's entries of the instant (unsorted) and the fence floor; the index
/// view is the caller's, opened at the instant.
pub struct MapSnapshot<V> {
    pub resident: Vec<(Box<[u8]>, Arc<Value>)>,
    pub view: V,
    pub fence_floor: u64,
    /// How long publishing waited for the instant to be marked.
    pub held: Duration,
    /// States replaced while the map was read (kept as they were).
    pub replaced: usize,
}

/// Whether `v` is a record holding an open lease.
fn holds_lease(v: &Value) -> bool {
    matches!(v, Value::Record(r) if r.open_lease().is_some())
}

/// A lock's guard that also holds its [`Level`] (released after the lock).
pub struct Locked<'a, T> {
    guard: MutexGuard<'a, T>,
    _order: lock_order::Held,
}

impl<T> Deref for Locked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Locked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// Takes `m` at `level`.
fn lock_at<T>(m: &Mutex<T>, level: Level) -> Locked<'_, T> {
    let order = lock_order::enter(level);
    Locked {
        guard: m.lock(),
        _order: order,
    }
}

/// State shared by the writer, the checkpointer and readers.
pub struct Shared<I> {
    /// Durable state changed since the last checkpoint, plus every open record.
    map: DashMap<Box<[u8]>, Slot, Hasher>,
    /// The record keys of `map`, for listings.
    listing: Listing,
    /// The keys of the records whose latest state holds an open lease,
    /// kept by the writer as it applies each command (old and new state in
    /// hand): the sweep looks at these, not at every record in memory
    /// (which held the map's shards each second). A lease the writer has
    /// staged the end of may still be open in `map` for a batch: the sweep
    /// need not end it.
    leased: Mutex<HashSet<Box<[u8]>, Hasher>>,
    /// No terminal record in `map` expires before this (ms; `u64::MAX`:
    /// none). A bound, not the minimum: the sweep scans `map` for records
    /// to collect only once it has passed, and sets it again.
    due_in_memory: AtomicU64,
    /// The last batch whose changes are in `map` (set by whoever publishes:
    /// the writer thread, or an inline commit). A checkpoint evicts a
    /// segment's records only once its last batch is published.
    published: Mutex<u64>,
    published_cv: Condvar,
    /// The fence counter of the last published batch: every fence a caller
    /// has been answered with is below it.
    fence_floor: AtomicU64,
    /// Held shared while a batch is published or a segment evicted, and
    /// exclusively while an export marks its instant (the published batch,
    /// its view of the index, the start of its capture): O(1), however many
    /// states the map holds.
    frozen: RwLock<()>,
    /// Held shared by an eviction, exclusively while an export reads the
    /// map: no state of the export's instant leaves the map meanwhile (the
    /// index view, taken at the instant, may not hold it).
    evict_gate: RwLock<()>,
    /// While an export reads the map: its instant's batch and the states
    /// publishes replaced since (key → the state at the instant). `None`
    /// otherwise; `capturing` says which without the lock.
    capture: Mutex<Option<Capture>>,
    capturing: AtomicBool,
    /// Fault injection (tests): `export_hook` runs between an export's
    /// instant and its read of the map.
    #[cfg(feature = "faults")]
    faults: std::sync::OnceLock<Arc<crate::wal::Faults>>,
    index: I,
    /// The keys the index may hold, when known.
    ingested: Ingested,
    /// Set on any write, fsync or checkpoint failure: the store fails closed.
    poisoned: AtomicBool,
    clock: Clock,
    limits: Limits,
    /// The store's clock never goes backwards within a process.
    last_now: AtomicU64,
    /// Records marked disputed, store-wide, as of the last durable batch.
    disputed: AtomicU64,
    /// Keys whose stored value does not decode, met so far.
    undecodable: DashMap<Box<[u8]>, (), Hasher>,
    /// Commands admitted to the writer's queue and not yet taken.
    queued: AtomicUsize,
    writer_alive: AtomicBool,
    checkpointer_alive: AtomicBool,
}

impl<I: Index> Shared<I> {
    pub fn new(
        index: I,
        map: DashMap<Box<[u8]>, Slot, Hasher>,
        clock: Clock,
        limits: Limits,
    ) -> Self {
        let mut leased = HashSet::default();
        let mut marks = Marks::new(&mut leased, u64::MAX);
        for s in map.iter() {
            if let Value::Record(r) = &*s.value {
                marks.note(s.key(), false, Some(r));
            }
        }
        let due_in_memory = marks.due;
        // An index that lists no entity returns none: until a checkpoint
        // adds keys (through `ingested`), lookups there can be skipped.
        let empty = index
            .keys_in((Bound::Unbounded, Bound::Unbounded), 1)
            .is_ok_and(|k| k.is_empty());
        Shared {
            map,
            listing: Listing::default(),
            due_in_memory: AtomicU64::new(due_in_memory),
            published: Mutex::new(0),
            published_cv: Condvar::new(),
            fence_floor: AtomicU64::new(1),
            frozen: RwLock::new(()),
            evict_gate: RwLock::new(()),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
            #[cfg(feature = "faults")]
            faults: std::sync::OnceLock::new(),
            leased: Mutex::new(leased),
            ingested: Ingested::new(empty),
            index,
            poisoned: AtomicBool::new(false),
            clock,
            limits,
            last_now: AtomicU64::new(0),
            disputed: AtomicU64::new(0),
            undecodable: DashMap::default(),
            queued: AtomicUsize::new(0),
            writer_alive: AtomicBool::new(true),
            checkpointer_alive: AtomicBool::new(true),
        }
    }

    /// Makes a durable batch visible: its changes go into the map (the
    /// next read sees them), then `published` moves to it. Batches come in
    /// the order they were staged; `commands` is the batch's size (metrics).
    pub fn publish_batch(
        &self,
        changes: Arc<Changes>,
        lsn: u64,
        disputed: u64,
        due: u64,
        next_fence: u64,
        commands: usize,
    ) {
        let _frozen = self.frozen_shared();
        self.disputed.store(disputed, Ordering::SeqCst);
        metrics::histogram!("settle_commit_batch_size").record(commands as f64);
        // Set under `frozen`, which this holds: an export that marked its
        // instant before this batch is reading the map now.
        if self.capturing.load(Ordering::SeqCst) {
            self.keep_replaced(&changes);
        }
        match Arc::try_unwrap(changes) {
            // The writer has staged a later batch and let go of this one:
            // keys and values move into the map (one lookup, no key copy).
            Ok(owned) => {
                for (k, v) in owned {
                    self.publish(k, v, lsn);
                }
            }
            Err(changes) => {
                for (k, v) in changes.iter() {
                    let _order = lock_order::enter(Level::Map);
                    if let Some(mut s) = self.map.get_mut(&k[..]) {
                        s.lsn = lsn;
                        s.value = v.clone();
                        continue;
                    }
                    drop(_order);
                    self.publish(k.clone(), v.clone(), lsn);
                }
            }
        }
        // After the states are in the map: a sweep that took the bound
        // before this finds them there.
        self.due_in_memory.fetch_min(due, Ordering::SeqCst);
        self.fence_floor.fetch_max(next_fence, Ordering::SeqCst);
        let mut p = lock_at(&self.published, Level::Published);
        // Checked in production: the checkpointer evicts by this number, and
        // a batch published out of order would let it evict a newer state.
        assert!(
            *p < lsn,
            "batches are published in order: {lsn} after {}",
            *p
        );
        *p = lsn;
        drop(p);
        self.published_cv.notify_all();
    }

    /// Before a batch replaces them: the states of the capture's instant
    /// it replaces, each kept once (only the writer publishes, and no
    /// eviction runs during a capture, so what is read here is what the
    /// batch replaces).
    fn keep_replaced(&self, changes: &Changes) {
        let _order = lock_order::enter(Level::Capture);
        let mut capture = self.capture.lock();
        let Some(c) = capture.as_mut() else { return };
        for (k, _) in changes.iter() {
            let _map = lock_order::enter(Level::Map);
            if let Some(s) = self.map.get(&k[..])
                && s.lsn <= c.lsn
                && !c.replaced.contains_key(&k[..])
            {
                c.replaced.insert(k.clone(), s.value.clone());
            }
        }
    }

    /// The store at one instant without holding writes for longer than it
    /// takes to mark it: under `frozen` (exclusive) only the published
    /// batch, the fence floor and `open_view` (the index's view) are taken
    /// and the capture starts; the map is then read while the writer runs
    /// on, each publish keeping the states of the instant it replaces
    /// ([`Shared::keep_replaced`]), and evictions wait (`evict_gate`). A
    /// state of the instant is either still in the map with its batch at
    /// or below the instant's, or kept; a state published after it has a
    /// later batch and is left out.
    pub fn snapshot<V>(
        &self,
        open_view: impl FnOnce() -> Result<V, StoreError>,
    ) -> Result<MapSnapshot<V>, StoreError> {
        let _gate_order = lock_order::enter(Level::EvictGate);
        let _gate = self.evict_gate.write();
        let started = std::time::Instant::now();
        let (view, lsn, fence_floor) = {
            let _order = lock_order::enter(Level::Frozen);
            let _g = self.frozen.write();
            let view = open_view()?;
            let lsn = self.published();
            let _c = lock_order::enter(Level::Capture);
            *self.capture.lock() = Some(Capture {
                lsn,
                replaced: Default::default(),
            });
            self.capturing.store(true, Ordering::SeqCst);
            (view, lsn, self.fence_floor())
        };
        let held = started.elapsed();
        #[cfg(feature = "faults")]
        if let Some(hook) = self.faults.get().and_then(|f| f.export_hook.lock().clone()) {
            hook();
        }
        let mut resident = Vec::with_capacity(self.map.len());
        {
            let _map = lock_order::enter(Level::Map);
            for s in self.map.iter() {
                if s.lsn <= lsn {
                    resident.push((s.key().clone(), s.value.clone()));
                }
            }
        }
        let replaced = {
            let _c = lock_order::enter(Level::Capture);
            let mut capture = self.capture.lock();
            self.capturing.store(false, Ordering::SeqCst);
            capture
                .take()
                .expect("the capture this export started")
                .replaced
        };
        let n = replaced.len();
        if n > 0 {
            // The kept state wins: the map may show a later one.
            resident.retain(|(k, _)| !replaced.contains_key(&k[..]));
            resident.extend(replaced);
        }
        Ok(MapSnapshot {
            resident,
            view,
            fence_floor,
            held,
            replaced: n,
        })
    }

    /// The faults a test injects (set once, when the store opens).
    #[cfg(feature = "faults")]
    pub fn set_faults(&self, faults: Option<Arc<crate::wal::Faults>>) {
        if let Some(f) = faults {
            let _ = self.faults.set(f);
        }
    }

    /// The last batch whose changes are in the map.
    pub fn published(&self) -> u64 {
        *lock_at(&self.published, Level::Published)
    }

    /// Sets the published batch of a store just opened: recovery put every
    /// replayed batch, up to `lsn`, into the map.
    pub fn recovered_to(&self, lsn: u64, next_fence: u64) {
        self.fence_floor.fetch_max(next_fence, Ordering::SeqCst);
        let mut p = lock_at(&self.published, Level::Published);
        assert_eq!(*p, 0, "set once, before any batch is published");
        *p = lsn;
    }

    /// The fence counter as of the last published batch.
    pub fn fence_floor(&self) -> u64 {
        self.fence_floor.load(Ordering::SeqCst)
    }

    fn frozen_shared(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        let _order = lock_order::enter(Level::Frozen);
        self.frozen.read()
    }

    /// Waits until batch `lsn` is published; `false` if it never will be
    /// (the store failed or its writer stopped).
    pub fn wait_published(&self, lsn: u64) -> bool {
        let _order = lock_order::enter(Level::Published);
        let mut p = self.published.lock();
        while *p < lsn {
            if self.poisoned.load(Ordering::SeqCst) || !self.writer_alive.load(Ordering::SeqCst) {
                return false;
            }
            // Bounded: the writer's death is seen without a notification.
            self.published_cv
                .wait_for(&mut p, Duration::from_millis(50));
        }
        true
    }

    /// Puts the durable state `v` of entity `k` (written by batch `lsn`) into the map.
    fn publish(&self, k: Box<[u8]>, v: Arc<Value>, lsn: u64) {
        let _order = lock_order::enter(Level::Map);
        match self.map.entry(k) {
            dashmap::Entry::Occupied(mut e) => {
                let s = e.get_mut();
                s.lsn = lsn;
                s.value = v;
            }
            dashmap::Entry::Vacant(e) => {
                // Under the shard's lock (the entry): see `listing`.
                self.listing.entered(e.key());
                e.insert(Slot { lsn, value: v });
            }
        }
    }

    /// The store's clock: the configured clock, never earlier than a time already used.
    pub fn now(&self) -> Timestamp {
        let t = self.clock.now().0;
        let prev = self.last_now.fetch_max(t, Ordering::SeqCst);
        Timestamp(prev.max(t))
    }

    /// Up to `max` record keys of the map in `range`, sorted: every record
    /// key only in memory is among them (the listing invariant, see
    /// [`super::listing`]).
    pub fn record_keys_in(&self, range: (Bound<&[u8]>, Bound<&[u8]>), max: usize) -> Vec<Vec<u8>> {
        self.listing.keys_in(&self.map, range, max)
    }

    /// How many record keys a listing sees in memory (after it folded
    /// the pending ones in, turning tracking on as any listing does).
    #[cfg(test)]
    pub fn listed_keys(&self) -> usize {
        use std::ops::Bound::Unbounded;
        self.listing.keys_in(&self.map, (Unbounded, Unbounded), 0);
        self.listing.sorted_len()
    }

    /// How many keys the listing's sorted set holds, as it is.
    #[cfg(test)]
    pub fn sorted_keys(&self) -> usize {
        self.listing.sorted_len()
    }

    /// How many keys wait to be sorted in.
    #[cfg(test)]
    pub fn pending_keys(&self) -> usize {
        self.listing.pending_len()
    }

    /// The writer's lock on the leased set, held while it applies a command.
    pub fn leased(&self) -> Locked<'_, HashSet<Box<[u8]>, Hasher>> {
        lock_at(&self.leased, Level::Leased)
    }

    /// Evicts from the map each `(lsn, key)` of a checkpointed segment whose
    /// state is still the one batch `lsn` wrote (a later batch may have
    /// changed it since) and may leave memory; gives back what it took out.
    /// Batch `last` (the segment's last) must be published: a state not
    /// published yet would come back into the map for good.
    pub fn evict<'k>(
        &self,
        last: u64,
        taken: impl ExactSizeIterator<Item = (u64, &'k [u8])>,
    ) -> Vec<(Box<[u8]>, Slot)> {
        let published = self.published();
        // Checked in production: evicting a state not yet published would
        // lose it from memory while the index may not hold it.
        assert!(
            last <= published,
            "eviction of batch {last}, published only to {published}"
        );
        // Every key of this segment that is new to the map is pending in the
        // listing now (published before the segment was sealed); keys
        // published from here on belong to later segments, never evicted here.
        let _gate_order = lock_order::enter(Level::EvictGate);
        let _gate = self.evict_gate.read();
        let mut eviction = self.listing.evicting();
        let _frozen = self.frozen_shared();
        let mut gone = Vec::with_capacity(taken.len());
        for (lsn, key) in taken {
            debug_assert!(lsn <= last, "a segment's batches end at its last");
            let _order = lock_order::enter(Level::Map);
            let removed = self.map.remove_if(key, |k, s| {
                let evict = s.lsn == lsn && s.evictable();
                // Terminal records hold no lease (settle_core asserts it):
                // `leased` never names a key that leaves the map.
                debug_assert!(!(evict && holds_lease(&s.value)));
                if evict {
                    // Under the shard lock: a writer cannot re-add it in between.
                    eviction.evicted(k);
                }
                evict
            });
            if let Some(r) = removed {
                gone.push(r);
            }
        }
        eviction.end();
        gone
    }

    /// Whether a storage failure made the store fail closed.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// The writer thread stopped (or will never run again).
    pub fn writer_stopped(&self) {
        self.writer_alive.store(false, Ordering::SeqCst);
    }

    pub fn is_writer_alive(&self) -> bool {
        self.writer_alive.load(Ordering::SeqCst)
    }

    /// The checkpointer thread stopped.
    pub fn checkpointer_stopped(&self) {
        self.checkpointer_alive.store(false, Ordering::SeqCst);
    }

    pub fn is_checkpointer_alive(&self) -> bool {
        self.checkpointer_alive.load(Ordering::SeqCst)
    }

    /// Admits `n` commands to the writer's queue unless that would put more
    /// than `max` there; `false` (nothing admitted) if it would.
    pub fn admit(&self, n: usize, max: usize) -> bool {
        if self.queued.fetch_add(n, Ordering::Relaxed) + n > max {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// `n` admitted commands left the queue (taken by the writer, or never sent).
    pub fn dequeued(&self, n: usize) {
        let before = self.queued.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "{n} dequeued of {before} admitted");
    }

    /// Sets the disputed count a store opens with (recovery counted it).
    pub fn recovered_disputed(&self, disputed: u64) {
        self.disputed.store(disputed, Ordering::SeqCst);
    }

    /// Records marked disputed, as of the last published batch.
    pub fn disputed(&self) -> u64 {
        self.disputed.load(Ordering::SeqCst)
    }

    /// Remembers a key whose stored value does not decode (recovery met it).
    pub fn note_undecodable(&self, key: Box<[u8]>) {
        self.undecodable.insert(key, ());
    }

    /// Keys whose stored value does not decode, met so far.
    pub fn undecodable(&self) -> u64 {
        self.undecodable.len() as u64
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The index off the critical path (its own locks, none of the above).
    pub fn index(&self) -> &I {
        &self.index
    }

    /// Notes keys a checkpoint is about to put into the index, before it does
    /// (a lookup that the filters rule out skips the index).
    pub fn ingesting<'k>(&self, keys: impl ExactSizeIterator<Item = &'k [u8]>) {
        self.ingested.add(keys);
    }

    /// Entities held in memory.
    pub fn resident(&self) -> usize {
        self.map.len()
    }

    /// Calls `f` with each entity in memory and its state. Each shard is
    /// held while it is read: `f` must not take another lock of this store.
    pub fn for_each_resident(&self, mut f: impl FnMut(&[u8], &Value)) {
        let _order = lock_order::enter(Level::Map);
        for s in self.map.iter() {
            f(s.key(), &s.value);
        }
    }

    /// The state of an entity if it is in memory (the index is not read).
    pub fn resident_state(&self, key: &[u8]) -> Option<Arc<Value>> {
        let _order = lock_order::enter(Level::Map);
        self.map.get(key).map(|s| s.value.clone())
    }

    /// The keys of the records holding an open lease, copied (the writer
    /// holds that set while it applies a batch).
    pub fn leased_keys(&self) -> Vec<Box<[u8]>> {
        self.leased().iter().cloned().collect()
    }

    /// Takes the bound on the expiries of the terminal records in memory,
    /// leaving none: the sweep then walks the map if it has passed and
    /// gives back the next one with [`Shared::lower_due_bound`].
    pub fn take_due_bound(&self) -> u64 {
        self.due_in_memory.swap(u64::MAX, Ordering::SeqCst)
    }

    /// Lowers the bound on the expiries in memory to `due` (a batch
    /// published meanwhile may have lowered it further: the lower stays).
    pub fn lower_due_bound(&self, due: u64) {
        self.due_in_memory.fetch_min(due, Ordering::SeqCst);
    }

    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }

    /// Decodes a stored value; one that does not decode is remembered,
    /// logged once, and read as [`Value::Undecodable`] (never as absent).
    pub fn decode(&self, key: &[u8], bytes: &[u8]) -> Value {
        match decode_value(bytes) {
            Ok(v) => v,
            Err(e) => {
                if self.undecodable.insert(key.into(), ()).is_none() {
                    tracing::error!(key = %String::from_utf8_lossy(key), error = %e,
                        "stored value does not decode; its key is refused");
                }
                Value::Undecodable(e.to_string().into())
            }
        }
    }

    /// The durable state of an entity (map, then index).
    pub fn load(&self, key: &[u8]) -> Result<Option<Arc<Value>>, StoreError> {
        let order = lock_order::enter(Level::Map);
        if let Some(s) = self.map.get(key) {
            return Ok(Some(s.value.clone()));
        }
        drop(order);
        if !self.ingested.may_hold(key) {
            return Ok(None);
        }
        Ok(self
            .index
            .get(key)?
            .map(|b| Arc::new(self.decode(key, b.as_ref()))))
    }

    /// What `f` makes of the durable state of an entity (map, then index),
    /// without cloning the shared value.
    pub fn load_with<T>(
        &self,
        key: &[u8],
        f: impl FnOnce(&Value) -> T,
    ) -> Result<Option<T>, StoreError> {
        let order = lock_order::enter(Level::Map);
        if let Some(s) = self.map.get(key) {
            return Ok(Some(f(&s.value)));
        }
        drop(order);
        if !self.ingested.may_hold(key) {
            return Ok(None);
        }
        Ok(self
            .index
            .get(key)?
            .map(|b| f(&self.decode(key, b.as_ref()))))
    }

    /// A principal's generation; `Ok(Err(_))` if its stored state does not decode.
    pub fn principal(
        &self,
        tenant: &TenantId,
        p: &settle_core::Principal,
    ) -> Result<Result<PrincipalState, RefusalCode>, StoreError> {
        let k = EntityKey::Principal(tenant.clone(), p.clone()).to_bytes();
        Ok(match self.load(&k)?.as_deref() {
            Some(Value::Principal(s)) => Ok(*s),
            Some(Value::Undecodable(_)) => Err(RefusalCode::RecordRefused),
            _ => Ok(PrincipalState::default()),
        })
    }
}
