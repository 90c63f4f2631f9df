//! The single writer with group commit, and the checkpointer.
//!
//! Commit protocol (see docs/design.md):
//! 1. The writer applies each command as it comes (up to `max_batch` a
//!    batch) through `settle_core::apply` in arrival order against the
//!    latest state (batch overlay, then the batches staged before it and
//!    not yet published, then the durable map, then the index).
//! 2. When fewer than [`IN_FLIGHT`] frames are at the syncer, it encodes
//!    the final state of every entity the batch changed into one frame and
//!    hands it over; the syncer `write`s and `fdatasync`s frames in order
//!    (one frame at most written and not yet durable) while the writer
//!    gathers the next batch.
//! 3. Only then does the writer publish the new states to the durable map
//!    (which readers see) and answer every caller; the next frame is on its
//!    way to the disk meanwhile.
//! 4. When a segment is full it seals it; the checkpointer writes every
//!    entity changed in it into the index, makes that durable, deletes the
//!    segment and evicts terminal records from memory.
//!
//! [`Core`] (the writer's state: [`Stage`] and [`Log`]) and [`Checkpointer`]
//! are plain structs over the I/O seam ([`Fs`]) and the [`Index`]: the
//! threaded store drives them from three threads (writer, syncer,
//! checkpointer), [`crate::InlineStore`] from the caller's thread
//! (deterministic, for power-loss tests and simulation).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use dashmap::DashMap;
use parking_lot::RwLock;
use settle_core::{
    Command, Ctx, Fence, Limits, OpState, PrincipalState, Principals, RefusalCode, Reply, Target,
    TenantId, Timestamp, apply, principals_needed,
};
use settle_ledger::{Clock, StoreError};
use tokio::sync::oneshot;

use crate::codec::{
    EntityKey, Entry, KIND_PRINCIPAL, KIND_RECORD, KIND_TASK, Value, decode_frames, decode_value,
    encode_frame_of, entity_key_into,
};
use crate::fs::Fs;
use crate::index::{CheckpointItem, Index, Meta};
use crate::pace::Pacer;
use crate::recovery::Recovered;
use crate::wal::{self, CheckpointStep, Faults, Wal, first_nonzero};

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

/// The keys the index may hold, when that can be known: the index held no
/// entity when the store was opened, and every checkpoint adds the keys it
/// ingests here before ingesting them (and so before evicting them from
/// the map). A key this says the index cannot hold is not looked up there:
/// a fresh claim's index lookup is a miss every time. Bloom filters, a
/// chain of doubling sizes; off (every lookup goes to the index) when the
/// index was not empty at open or the filters are full.
pub struct Ingested {
    on: AtomicBool,
    hasher: Hasher,
    filters: RwLock<Vec<Bloom>>,
}

struct Bloom {
    bits: Vec<AtomicU64>,
    /// Keys added (only the checkpointer adds).
    keys: AtomicUsize,
}

/// Bits of the first filter (1 MiB); each next one doubles.
const BLOOM_FIRST_BITS: usize = 1 << 23;
/// Past this many bits in all (32 MiB; about 22 million keys) the filters
/// stop growing and are turned off.
const BLOOM_MAX_BITS: usize = 1 << 28;
/// Bits per key at capacity, and probes per key: under 1 % false
/// positives (blocked: a little more than the 0.5 % of free probes).
const BLOOM_BITS_PER_KEY: usize = 12;
const BLOOM_PROBES: u64 = 5;

impl Bloom {
    fn new(bits: usize) -> Bloom {
        Bloom {
            bits: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            keys: AtomicUsize::new(0),
        }
    }

    /// The word and bit of each probe of hash `h`. Every probe of a key
    /// falls in one 512-bit block (a cache line), chosen by the hash's
    /// high half: a lookup costs one cache miss, not one per probe (the
    /// filters are megabytes, and a fresh claim's lookup read five
    /// scattered words on the writer thread). The bits within the block
    /// come from 9-bit pieces of a second mix of the hash.
    fn probes(&self, h: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
        let blocks = self.bits.len() / BLOCK_WORDS;
        debug_assert!(blocks.is_power_of_two());
        let block = ((h >> 32) as usize & (blocks - 1)) * BLOCK_WORDS;
        let g = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..BLOOM_PROBES).map(move |i| {
            let b = (g >> (64 - 9 * (i + 1))) & 511;
            (block + (b >> 6) as usize, 1u64 << (b & 63))
        })
    }
}

/// Words of one filter block (512 bits).
const BLOCK_WORDS: usize = 8;

impl Ingested {
    /// `on`: the index holds no entity.
    pub fn new(on: bool) -> Ingested {
        Ingested {
            on: AtomicBool::new(on),
            hasher: Hasher::default(),
            filters: RwLock::new(if on {
                vec![Bloom::new(BLOOM_FIRST_BITS)]
            } else {
                Vec::new()
            }),
        }
    }

    /// Whether the index may hold `key` (`true` when not known).
    pub fn may_hold(&self, key: &[u8]) -> bool {
        if !self.on.load(Ordering::Acquire) {
            return true;
        }
        let h = self.hasher.hash_one(key);
        self.filters.read().iter().any(|f| {
            f.probes(h)
                .all(|(w, bit)| f.bits[w].load(Ordering::Acquire) & bit != 0)
        })
    }

    /// Records that the index may hold `keys` from now on; called before
    /// they are ingested (only by the checkpointer).
    pub fn add<'k>(&self, keys: impl ExactSizeIterator<Item = &'k [u8]>) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        let n = keys.len();
        {
            let mut filters = self.filters.write();
            let last = filters.last().expect("a filter while on");
            if last.keys.load(Ordering::Relaxed) + n > last.bits.len() * 64 / BLOOM_BITS_PER_KEY {
                let total: usize = filters.iter().map(|f| f.bits.len() * 64).sum();
                let next =
                    (last.bits.len() * 64 * 2).max((n * BLOOM_BITS_PER_KEY).next_power_of_two());
                if total + next > BLOOM_MAX_BITS {
                    // Every lookup goes to the index from here on (the
                    // filters stay: a lookup that saw `on` still reads them,
                    // and only for keys of earlier checkpoints).
                    self.on.store(false, Ordering::SeqCst);
                    return;
                }
                filters.push(Bloom::new(next));
            }
        }
        let filters = self.filters.read();
        let f = filters.last().expect("a filter while on");
        for k in keys {
            let h = self.hasher.hash_one(k);
            for (w, bit) in f.probes(h) {
                f.bits[w].fetch_or(bit, Ordering::Release);
            }
        }
        f.keys.fetch_add(n, Ordering::Relaxed);
    }
}

/// Record keys added to the map and not sorted into `record_keys` yet.
#[derive(Default)]
pub struct PendingKeys {
    /// Pushed, cheaply, as each key enters the map (its shard locked).
    pub new: Vec<Box<[u8]>>,
    /// Keys a checkpoint took as new and did not evict: most were
    /// published after its segment was sealed and leave at the next one,
    /// so they get one more checkpoint before they are sorted in.
    pub carried: Vec<Box<[u8]>>,
}

impl PendingKeys {
    pub fn len(&self) -> usize {
        self.new.len() + self.carried.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `v` is a record holding an open lease.
fn holds_lease(v: &Value) -> bool {
    matches!(v, Value::Record(r) if r.open_lease().is_some())
}

/// State shared by the writer, the checkpointer and readers.
pub struct Shared<I> {
    /// Durable state changed since the last checkpoint, plus every open record.
    pub map: DashMap<Box<[u8]>, Slot, Hasher>,
    /// The record keys of `map`, sorted (the inspection listing merges them
    /// with the index's). Changed only while the key's map shard is locked,
    /// so it never disagrees with `map` about a key.
    pub record_keys: RwLock<BTreeSet<Box<[u8]>>>,
    /// Record keys in `map` and not yet in `record_keys`. A listing folds
    /// them in ([`Shared::record_keys`]); a checkpoint takes them, so a
    /// record claimed and settled within a segment or two never costs a
    /// sorted insert and removal.
    pub new_record_keys: parking_lot::Mutex<PendingKeys>,
    /// Held by a checkpoint while the keys it took from `new_record_keys`
    /// are in neither set, and by a listing before it folds: a listing
    /// never misses a record that is only in memory.
    pub evicting: parking_lot::Mutex<()>,
    /// Whether `record_keys` and `new_record_keys` are kept: off from open
    /// until the first listing, which turns it on (for good) and sorts in
    /// the record keys of `map` then. Until a store is listed, publishing
    /// and eviction skip the key bookkeeping (a key copy, two hash lookups
    /// and a free per record); turned on only under `evicting`, so one
    /// eviction runs wholly in one mode.
    pub tracking: AtomicBool,
    /// The keys of the records whose latest state holds an open lease,
    /// kept by the writer as it applies each command (old and new state in
    /// hand): the sweep looks at these, not at every record in memory
    /// (which held the map's shards each second). A lease the writer has
    /// staged the end of may still be open in `map` for a batch: the sweep
    /// need not end it.
    pub leased: parking_lot::Mutex<HashSet<Box<[u8]>, Hasher>>,
    /// No terminal record in `map` expires before this (ms; `u64::MAX`:
    /// none). A bound, not the minimum: the sweep scans `map` for records
    /// to collect only once it has passed, and sets it again.
    pub due_in_memory: AtomicU64,
    /// The last batch whose changes are in `map` (set by whoever publishes:
    /// the writer thread, or an inline commit). A checkpoint evicts a
    /// segment's records only once its last batch is published.
    pub published: parking_lot::Mutex<u64>,
    pub published_cv: parking_lot::Condvar,
    pub index: I,
    /// The keys the index may hold, when known.
    pub ingested: Ingested,
    /// Set on any write, fsync or checkpoint failure: the store fails closed.
    pub poisoned: AtomicBool,
    pub clock: Clock,
    pub limits: Limits,
    /// The store's clock never goes backwards within a process.
    pub last_now: AtomicU64,
    /// Records marked disputed, store-wide, as of the last durable batch.
    pub disputed: AtomicU64,
    /// Keys whose stored value does not decode, met so far.
    pub undecodable: DashMap<Box<[u8]>, (), Hasher>,
    /// Commands admitted to the writer's queue and not yet taken.
    pub queued: AtomicUsize,
    pub writer_alive: AtomicBool,
    pub checkpointer_alive: AtomicBool,
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
            record_keys: RwLock::new(BTreeSet::new()),
            new_record_keys: parking_lot::Mutex::new(PendingKeys::default()),
            evicting: parking_lot::Mutex::new(()),
            tracking: AtomicBool::new(false),
            due_in_memory: AtomicU64::new(due_in_memory),
            published: parking_lot::Mutex::new(0),
            published_cv: parking_lot::Condvar::new(),
            leased: parking_lot::Mutex::new(leased),
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
        commands: usize,
    ) {
        self.disputed.store(disputed, Ordering::SeqCst);
        metrics::histogram!("settle_commit_batch_size").record(commands as f64);
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
                    if let Some(mut s) = self.map.get_mut(&k[..]) {
                        s.lsn = lsn;
                        s.value = v.clone();
                        continue;
                    }
                    self.publish(k.clone(), v.clone(), lsn);
                }
            }
        }
        // After the states are in the map: a sweep that took the bound
        // before this finds them there.
        self.due_in_memory.fetch_min(due, Ordering::SeqCst);
        let mut p = self.published.lock();
        debug_assert!(*p < lsn, "batches are published in order");
        *p = lsn;
        drop(p);
        self.published_cv.notify_all();
    }

    /// Waits until batch `lsn` is published; `false` if it never will be
    /// (the store failed or its writer stopped).
    pub fn wait_published(&self, lsn: u64) -> bool {
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
        match self.map.entry(k) {
            dashmap::Entry::Occupied(mut e) => {
                let s = e.get_mut();
                s.lsn = lsn;
                s.value = v;
            }
            dashmap::Entry::Vacant(e) => {
                if e.key().first() == Some(&b'r') && self.tracking.load(Ordering::SeqCst) {
                    self.new_record_keys.lock().new.push(e.key().clone());
                }
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

    /// The sorted record keys, every key added to `map` so far included.
    pub fn record_keys(&self) -> parking_lot::RwLockReadGuard<'_, BTreeSet<Box<[u8]>>> {
        // A checkpoint between taking its keys and giving back those it
        // kept would hide them: wait for it.
        let evicting = self.evicting.lock();
        if !self.tracking.load(Ordering::SeqCst) {
            // Set before the map is read: a key published into a shard
            // after this read it is pushed to `new_record_keys` (the
            // publisher reads the flag under the shard's lock), one
            // published before is in the map here.
            self.tracking.store(true, Ordering::SeqCst);
            let keys: Vec<Box<[u8]>> = self
                .map
                .iter()
                .filter(|s| s.key().first() == Some(&b'r'))
                .map(|s| s.key().clone())
                .collect();
            self.record_keys.write().extend(keys);
        }
        let mut fresh = self.new_record_keys.lock();
        if !fresh.is_empty() {
            let mut sorted = self.record_keys.write();
            sorted.extend(fresh.new.drain(..));
            sorted.extend(fresh.carried.drain(..));
        }
        drop(fresh);
        let keys = self.record_keys.read();
        drop(evicting);
        keys
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
        if let Some(s) = self.map.get(key) {
            return Ok(Some(s.value.clone()));
        }
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
        if let Some(s) = self.map.get(key) {
            return Ok(Some(f(&s.value)));
        }
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

pub type ReplyTx = oneshot::Sender<Result<Reply, StoreError>>;

/// Where the answers of a batch message go: all at once, in order.
pub type BatchTx = oneshot::Sender<Vec<Result<Reply, StoreError>>>;

pub enum Msg {
    Exec {
        tenant: TenantId,
        cmd: Command,
        reply: ReplyTx,
    },
    /// Commands applied in order within one group commit, answered together.
    Batch {
        tenant: TenantId,
        cmds: Vec<Command>,
        reply: BatchTx,
    },
    /// Finish queued work, checkpoint, stop.
    Close(std::sync::mpsc::Sender<()>),
}

pub enum CkptMsg {
    /// Segments up to this one are sealed.
    Sealed(u64),
    Stop(std::sync::mpsc::Sender<()>),
}

/// Where sealed segments go.
pub enum SealSink {
    /// To the checkpointer thread, over a bounded channel: when the
    /// checkpointer is that far behind, the writer waits (backpressure).
    Channel(Sender<CkptMsg>),
    /// Queued for the caller to checkpoint inline.
    Queue(Vec<u64>),
}

/// The writer's state: everything one group commit needs. `stage` (apply
/// and encode) and `log` (write, sync, publish, answer) run one after the
/// other on one thread ([`Core::commit`], inline), or on two threads as a
/// pipeline ([`Writer`] and [`Syncer`]): batch N+1 is applied while batch N
/// is being synced.
pub struct Core<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub stage: Stage<I>,
    pub log: Log<F, I>,
}

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
    pub pending: std::collections::VecDeque<(u64, Arc<Changes>)>,
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

/// Writes, syncs, publishes and answers staged batches, in order (the
/// second half of a group commit); seals full segments.
pub struct Log<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub wal: Wal<F>,
    pub sealed: SealSink,
    pub faults: Option<Arc<Faults>>,
    /// Syncs slower than [`SLOW_SYNC`], reported now and then.
    pub slow_syncs: SlowSyncs,
}

/// Slow log syncs not reported yet, and when the last report was: at most
/// one report per [`SLOW_SYNC_REPORT`], saying how many there were.
#[derive(Debug, Default)]
pub struct SlowSyncs {
    unreported: u64,
    last_report: Option<Instant>,
}

impl SlowSyncs {
    /// Counts a slow sync at `now`; `Some(n)`: report `n` slow syncs now.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        if self
            .last_report
            .is_some_and(|t| now.saturating_duration_since(t) < SLOW_SYNC_REPORT)
        {
            return None;
        }
        self.last_report = Some(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

/// A log write + `fdatasync` this slow is reported (a warning, rate
/// limited): every command of its batch waited for it. On the test VMs
/// these came with the checkpoint's table writes and segment removals on
/// a busy disk (docs/performance.md, "Eleventh round").
pub const SLOW_SYNC: Duration = Duration::from_millis(50);
const SLOW_SYNC_REPORT: Duration = Duration::from_secs(10);

/// A batch being gathered: its commands applied as they came, its
/// changes in [`Stage::overlay`], its frame not encoded yet.
pub struct Gathering<R> {
    replies: Vec<(R, Result<Reply, StoreError>)>,
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
    replies: Vec<(R, Result<Reply, StoreError>)>,
    /// `None`: nothing changed, nothing to write.
    frame: Option<StagedFrame>,
}

struct StagedFrame {
    buf: Vec<u8>,
    lsn: u64,
    disputed: u64,
    changes: Arc<Changes>,
    /// The earliest expiry of a terminal record among `changes` (`u64::MAX`: none).
    due: u64,
}

/// Bound on the writer's principal cache; it is simply cleared when full.
const PRINCIPAL_CACHE: usize = 100_000;

impl<F: Fs, I: Index> Core<F, I> {
    pub fn new(
        shared: Arc<Shared<I>>,
        wal: Wal<F>,
        rec: &Recovered,
        max_batch: usize,
        sealed: SealSink,
        faults: Option<Arc<Faults>>,
    ) -> Self {
        shared.disputed.store(rec.disputed, Ordering::SeqCst);
        // Recovery put every replayed batch into the map.
        *shared.published.lock() = rec.lsn;
        Core {
            stage: Stage {
                shared: shared.clone(),
                lsn: rec.lsn,
                next_fence: rec.next_fence,
                disputed: rec.disputed,
                max_batch: max_batch.max(1),
                principals: HashMap::default(),
                overlay: HashMap::default(),
                pending: Default::default(),
                spare: Vec::new(),
                key_buf: Vec::new(),
                principal_buf: Principals::new(),
                faults: faults.clone(),
            },
            log: Log {
                shared: shared.clone(),
                wal,
                sealed,
                faults,
                slow_syncs: SlowSyncs::default(),
            },
            shared,
        }
    }

    /// Applies, logs, syncs, publishes, answers: one group commit. Every
    /// command of `batch` is answered through `answer`, after its batch is
    /// durable (or with an error, never a receipt).
    pub fn commit<R>(
        &mut self,
        batch: &mut Vec<(TenantId, Command, R)>,
        answer: impl FnMut(R, Result<Reply, StoreError>),
    ) {
        let staged = self.stage.stage(batch);
        if let Some(buf) = self.log.finish(staged, answer) {
            self.stage.spare.push(buf);
        }
        // Published (or poisoned): nothing is pending any more.
        self.stage.pending.clear();
        if !self.log.wal.fits(4096) {
            // A failure poisons the store; the batch is durable already.
            let _ = self.log.seal();
        }
    }

    /// Starts a new segment and hands the full one to the checkpointer.
    pub fn seal(&mut self) -> Result<(), StoreError> {
        self.log.seal()
    }
}

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
        if self.shared.poisoned.load(Ordering::SeqCst) {
            g.replies.push((r, Err(StoreError::Poisoned)));
            return;
        }
        let now = self.shared.now();
        let mut overlay = std::mem::take(&mut self.overlay);
        let shared = self.shared.clone();
        let mut leased = shared.leased.lock();
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
                let found = self.lookup(overlay, &target_key, |v| match v {
                    Value::Record(r) => Ok(Some(r.clone())),
                    // Never taken for absent: the key could be claimed again.
                    Value::Undecodable(_) => Err(()),
                    _ => Ok(None),
                })?;
                match found {
                    Some(Ok(r)) => state.record = r,
                    Some(Err(())) => return Ok(REFUSED),
                    None => {}
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
            limits: self.shared.limits,
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
    due: u64,
}

impl<'a> Marks<'a> {
    /// Marks going on from `due`, the earliest expiry noted so far.
    fn new(leased: &'a mut HashSet<Box<[u8]>, Hasher>, due: u64) -> Self {
        Marks { leased, due }
    }

    /// Record `k` was in a state holding an open lease (`was_leased`) and is now `now`.
    fn note(&mut self, k: &[u8], was_leased: bool, now: Option<&settle_core::Record>) {
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

impl<F: Fs, I: Index> Log<F, I> {
    /// Writes, syncs, publishes and answers a staged batch (the inline
    /// group commit); batches must come in the order they were staged.
    /// Gives back the frame buffer for reuse.
    pub fn finish<R>(
        &mut self,
        staged: Staged<R>,
        mut answer: impl FnMut(R, Result<Reply, StoreError>),
    ) -> Option<Vec<u8>> {
        let Staged { replies, frame } = staged;
        let Some(StagedFrame {
            mut buf,
            lsn,
            disputed,
            changes,
            due,
        }) = frame
        else {
            // Nothing to write; what the answers say is durable already
            // (the batch before was published before this one came).
            for (r, res) in replies {
                answer(r, res);
            }
            return None;
        };
        match self.write(&mut buf) {
            Ok(()) => {
                self.shared
                    .publish_batch(changes, lsn, disputed, due, replies.len());
                for (r, res) in replies {
                    answer(r, res);
                }
            }
            Err(e) => {
                for (r, _) in replies {
                    answer(r, Err(e.clone()));
                }
            }
        }
        Some(buf)
    }

    /// Writes and syncs one staged frame (the durable half of a group
    /// commit). An error is final: the store is poisoned and nothing of the
    /// frame may be answered as durable.
    pub fn write(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        // A batch staged after a failure was applied on top of changes
        // that never became durable: it is not written.
        if self.shared.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned);
        }
        let started = Instant::now();
        // A frame goes whole into one segment: start the next one if the
        // preallocated space is short (an oversized frame extends the file).
        if self.wal.bytes() > 0 && !self.wal.fits(buf.len()) {
            // The batch stops here: nothing of it was written.
            self.seal()?;
        }
        if let Err(e) = self.wal.append_sync(buf) {
            // Fail closed: never retry an fsync, never answer with a receipt.
            tracing::error!(error = %e, "log write failed; the store refuses writes until reopened");
            self.shared.poison();
            return Err(StoreError::Io(e.to_string()));
        }
        let took = started.elapsed();
        metrics::histogram!("settle_commit_duration_seconds").record(took.as_secs_f64());
        if took >= SLOW_SYNC {
            self.slow_sync(took, buf.len());
        }
        Ok(())
    }

    /// Counts a slow sync; warns now and then (with how many since).
    fn slow_sync(&mut self, took: Duration, bytes: usize) {
        metrics::counter!("settle_log_slow_syncs_total").increment(1);
        if let Some(n) = self.slow_syncs.note(Instant::now()) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                bytes,
                slow_syncs = n,
                "a log write and sync took over {} ms (the disk is busy or slow; \
                 every command of the batch waited)",
                SLOW_SYNC.as_millis()
            );
        }
    }

    /// A clean close: seals the last segment and lets the checkpointer
    /// finish it, then stops the checkpointer.
    fn close(&mut self) {
        let skip = Faults::halted(&self.faults);
        if !skip && !self.shared.poisoned.load(Ordering::SeqCst) && self.wal.bytes() > 0 {
            let _ = self.seal();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if let SealSink::Channel(ckpt) = &self.sealed
            && ckpt.send(CkptMsg::Stop(tx)).is_ok()
        {
            let _ = rx.recv();
        }
    }

    /// Starts a new segment and hands the full one to the checkpointer. A
    /// failure poisons the store.
    pub fn seal(&mut self) -> Result<(), StoreError> {
        let seq = self.wal.rotate().map_err(|e| {
            tracing::error!(error = %e, "cannot start a new log segment; failing closed");
            self.shared.poison();
            StoreError::Io(format!("cannot start a new log segment: {e}"))
        })?;
        match &mut self.sealed {
            SealSink::Queue(q) => {
                q.push(seq);
                Ok(())
            }
            SealSink::Channel(tx) => {
                let sent = match tx.try_send(CkptMsg::Sealed(seq)) {
                    Ok(()) => Ok(()),
                    // The checkpointer is `max_checkpoint_backlog` behind:
                    // wait for it (commands queue up meanwhile, up to `max_queue`).
                    Err(crossbeam_channel::TrySendError::Full(m)) => {
                        tracing::warn!(segment = seq, "the checkpointer is behind; writes wait");
                        metrics::counter!("settle_checkpoint_backpressure_total").increment(1);
                        Faults::set_writer_waiting(&self.faults, true);
                        let r = tx.send(m).map_err(|_| ());
                        Faults::set_writer_waiting(&self.faults, false);
                        r
                    }
                    Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(()),
                };
                sent.map_err(|()| {
                    tracing::error!("the checkpointer stopped; failing closed");
                    self.shared.poison();
                    StoreError::Io("the checkpointer stopped".into())
                })
            }
        }
    }
}

/// Runs a closure when dropped (also while unwinding).
pub struct OnDrop<G: FnMut()>(pub G);

impl<G: FnMut()> Drop for OnDrop<G> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Collects the answers of one batch message; sends them when the last arrives.
pub struct Gather {
    results: Vec<Option<Result<Reply, StoreError>>>,
    missing: usize,
    reply: Option<BatchTx>,
}

/// Whom the writer answers for one command (the parts of a batch message
/// share its [`Gather`]; inline, answers are given on the caller's thread).
pub enum Answer {
    One(ReplyTx),
    Part(usize, Arc<parking_lot::Mutex<Gather>>),
}

impl Answer {
    fn send(self, r: Result<Reply, StoreError>) {
        match self {
            Answer::One(tx) => {
                let _ = tx.send(r);
            }
            Answer::Part(i, g) => {
                let mut g = g.lock();
                g.results[i] = Some(r);
                g.missing -= 1;
                if g.missing == 0
                    && let Some(tx) = g.reply.take()
                {
                    let all = g
                        .results
                        .drain(..)
                        .map(|r| r.expect("every part answered"))
                        .collect();
                    let _ = tx.send(all);
                }
            }
        }
    }
}

/// How many commands a message carries (for the admission count).
pub fn commands_in(m: &Msg) -> usize {
    match m {
        Msg::Exec { .. } => 1,
        Msg::Batch { cmds, .. } => cmds.len(),
        Msg::Close(_) => 0,
    }
}

/// What the writer hands the log thread.
pub enum SyncMsg {
    /// Write and sync this frame; answer with [`Synced`].
    Write(Vec<u8>),
    /// Seal the last segment, stop the checkpointer, drop the log.
    Close(std::sync::mpsc::Sender<()>),
}

/// The log thread's answer to a [`SyncMsg::Write`]: the frame buffer back,
/// and whether the frame is durable.
pub struct Synced {
    pub buf: Vec<u8>,
    pub result: Result<(), StoreError>,
}

/// Frames the writer hands the log thread before the oldest is durable:
/// the next one waits at the log thread, so it is written as soon as the
/// `fdatasync` before it returns, without waiting for the writer to be
/// scheduled; commands that come meanwhile are applied into the batch
/// after it, sent when the oldest is durable. The log thread still writes
/// a frame only after the one before it is durable. (One in flight: 8 %
/// fewer pairs/s at 1,024 in flight; sending each batch as soon as a
/// command came, rather than gathering until the disk is free: a third
/// fewer at 64. docs/performance.md, "Sixth round".)
pub const IN_FLIGHT: usize = 2;

/// A staged batch whose frame the log thread is writing: published and
/// answered by the writer once it is durable.
struct InFlight {
    replies: Vec<(Answer, Result<Reply, StoreError>)>,
    /// The answers of batches staged after it that changed nothing: given
    /// after its own, or failed with it.
    after: Vec<(Answer, Result<Reply, StoreError>)>,
    lsn: u64,
    disputed: u64,
    changes: Arc<Changes>,
    due: u64,
}

/// The writer thread: applies each command as it comes into the batch
/// being gathered, sends the batch's frame to the log thread when fewer
/// than [`IN_FLIGHT`] are there (so commands that come while the disk is
/// busy share the next sync), and publishes and answers each batch once
/// the log thread made it durable. The next frame goes to the disk before
/// the durable batch is published and answered.
///
/// Publishing and answering here, not on the log thread, keeps the
/// critical path on one thread: the log thread only writes and syncs (and
/// so sleeps in `fdatasync` and wakes at once), and a batch's records are
/// put in the map by the thread that built them, while they are in its
/// cache.
pub struct Writer<I: Index> {
    pub stage: Stage<I>,
    pub rx: Receiver<Msg>,
    /// Frames to the log thread (at most [`IN_FLIGHT`]).
    pub tx: Ringing<SyncMsg>,
    /// What the log thread made of each frame, in order.
    pub synced: Receiver<Synced>,
    /// Rung by whoever sends on `rx` or `synced`.
    pub bell: Arc<Doorbell>,
}

/// A channel's sending side that rings the receiver's [`Doorbell`] after
/// each send: every sender to a thread that waits on a doorbell goes
/// through one, so none can forget to wake it.
#[derive(Debug)]
pub struct Ringing<T> {
    pub tx: Sender<T>,
    pub bell: Arc<Doorbell>,
}

impl<T> Ringing<T> {
    /// Sends `m`, then rings (also when the receiver is gone: it may be
    /// waiting to find that out).
    pub fn send(&self, m: T) -> Result<(), crossbeam_channel::SendError<T>> {
        let sent = self.tx.send(m);
        self.bell.ring();
        sent
    }
}

/// Wakes a thread that waits for messages on channels it only polls
/// (`try_recv`). Crossbeam's blocking receive spins, then calls
/// `sched_yield` up to four times before it parks: on two busy cores each
/// yield hands the core to another thread (and under EEVDF moves the
/// yielder's deadline back), and the writer and the log thread, which
/// every command waits for, did that at every wait (docs/performance.md,
/// "Twelfth round"). Here a waiter polls a little, then parks until rung.
#[derive(Debug, Default)]
pub struct Doorbell {
    sleeping: AtomicBool,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

/// A waiter looks again this often unrung: a sender that went away (a
/// thread that ended) does not ring.
const DOORBELL_TIMEOUT: Duration = Duration::from_millis(200);

/// Polls before a waiter parks (a few microseconds).
const DOORBELL_SPINS: u32 = 64;

impl Doorbell {
    /// Wakes the waiting thread if it sleeps. Called after the message is
    /// sent.
    pub fn ring(&self) {
        // Orders the send before the read of `sleeping`, as the waiter
        // orders its write of `sleeping` before its last poll: one of the
        // two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed)
            && self.sleeping.swap(false, Ordering::SeqCst)
            && let Some(t) = self.thread.get()
        {
            t.unpark();
        }
    }

    /// Waits until `poll` gives something, at most about `timeout` (then
    /// `None`). One thread only ever waits on a doorbell.
    pub fn wait<T>(&self, timeout: Duration, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
        let me = self.thread.get_or_init(std::thread::current);
        debug_assert_eq!(
            me.id(),
            std::thread::current().id(),
            "one waiter per doorbell"
        );
        for _ in 0..DOORBELL_SPINS {
            if let Some(v) = poll() {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.sleeping.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Some(v) = poll() {
                self.sleeping.store(false, Ordering::Relaxed);
                return Some(v);
            }
            let now = Instant::now();
            if now >= deadline {
                self.sleeping.store(false, Ordering::Relaxed);
                return None;
            }
            // A ring before this returns at once (the park token).
            std::thread::park_timeout(deadline - now);
            self.sleeping.store(false, Ordering::Relaxed);
            if let Some(v) = poll() {
                return Some(v);
            }
        }
    }
}

impl<I: Index> Writer<I> {
    /// The writer thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self) {
        let shared = self.stage.shared.clone();
        let syncer_bell = self.tx.bell.clone();
        let _alive = OnDrop(move || {
            shared.writer_alive.store(false, Ordering::SeqCst);
            // The log thread finds its channel closed without waiting out
            // its timeout.
            syncer_bell.ring();
        });
        let max = self.stage.max_batch;
        let mut gathering = self.stage.begin(max);
        let mut inflight: VecDeque<InFlight> = VecDeque::with_capacity(IN_FLIGHT);
        loop {
            // Commands (while the batch has room), or a frame in flight
            // becoming durable, whichever comes first.
            let taking = gathering.len() < max;
            // A durable frame first: its commands wait for nothing else.
            let synced = || match self.synced.try_recv() {
                Ok(s) => Some(Event::Synced(Some(s))),
                Err(TryRecvError::Disconnected) => Some(Event::Synced(None)),
                Err(TryRecvError::Empty) => None,
            };
            let msg = || match self.rx.try_recv() {
                Ok(m) => Some(Event::Msg(Some(m))),
                Err(TryRecvError::Disconnected) => Some(Event::Msg(None)),
                Err(TryRecvError::Empty) => None,
            };
            let event = if inflight.is_empty() {
                self.bell.wait(DOORBELL_TIMEOUT, msg)
            } else if taking {
                self.bell.wait(DOORBELL_TIMEOUT, || synced().or_else(msg))
            } else {
                self.bell.wait(DOORBELL_TIMEOUT, synced)
            };
            let Some(event) = event else { continue };
            let mut closing = None;
            match event {
                Event::Msg(None) => {
                    self.flush(&mut gathering, &mut inflight);
                    self.drain(&mut inflight);
                    return self.close(None);
                }
                Event::Msg(Some(first)) => {
                    let mut next = Some(first);
                    let mut taken = 0;
                    while let Some(m) = next.take() {
                        taken += commands_in(&m);
                        if let Some(done) = self.take(&mut gathering, m) {
                            closing = Some(done);
                            break;
                        }
                        // A batch message is never split: it may take the
                        // group commit past `max_batch`.
                        if gathering.len() < max {
                            next = self.rx.try_recv().ok();
                        }
                    }
                    self.stage.shared.queued.fetch_sub(taken, Ordering::Relaxed);
                }
                Event::Synced(s) => {
                    // The batch gathered meanwhile goes to the disk before
                    // the durable one is published and answered, so the
                    // disk works while the writer does.
                    if !gathering.is_empty() {
                        self.send(&mut gathering, &mut inflight);
                    }
                    let done = inflight
                        .pop_front()
                        .expect("a completion comes only for a frame in flight");
                    self.complete(done, s);
                }
            }
            if inflight.len() < IN_FLIGHT && !gathering.is_empty() {
                self.send(&mut gathering, &mut inflight);
            }
            if let Some(done) = closing {
                self.flush(&mut gathering, &mut inflight);
                self.drain(&mut inflight);
                return self.close(Some(done));
            }
        }
    }

    /// Applies a message's commands to the batch being gathered; a
    /// `Close` gives back whom to tell when the store is closed.
    fn take(&mut self, g: &mut Gathering<Answer>, m: Msg) -> Option<std::sync::mpsc::Sender<()>> {
        match m {
            Msg::Exec { tenant, cmd, reply } => {
                self.stage.apply(g, &tenant, &cmd, Answer::One(reply));
            }
            Msg::Batch {
                tenant,
                cmds,
                reply,
            } => {
                if cmds.is_empty() {
                    let _ = reply.send(Vec::new());
                    return None;
                }
                let parts = Arc::new(parking_lot::Mutex::new(Gather {
                    results: (0..cmds.len()).map(|_| None).collect(),
                    missing: cmds.len(),
                    reply: Some(reply),
                }));
                for (i, cmd) in cmds.iter().enumerate() {
                    self.stage
                        .apply(g, &tenant, cmd, Answer::Part(i, parts.clone()));
                }
            }
            Msg::Close(done) => return Some(done),
        }
        None
    }

    /// Ends the batch gathered so far and sends its frame to the log
    /// thread. A batch that changed nothing is not written: it is answered
    /// once every frame before it is durable (its answers may tell of
    /// those frames' changes: a replay of a receipt one wrote), and fails
    /// with them.
    fn send(&mut self, g: &mut Gathering<Answer>, inflight: &mut VecDeque<InFlight>) {
        // The next batch begins from what this one ends with (the disputed count).
        let ended = std::mem::take(g);
        let Staged { replies, frame } = self.stage.end(ended);
        *g = self.stage.begin(self.stage.max_batch);
        let Some(fr) = frame else {
            match inflight.back_mut() {
                Some(last) => last.after.extend(replies),
                // Nothing in flight: everything it read is durable.
                None => {
                    for (r, res) in replies {
                        r.send(res);
                    }
                }
            }
            return;
        };
        let next = InFlight {
            replies,
            after: Vec::new(),
            lsn: fr.lsn,
            disputed: fr.disputed,
            changes: fr.changes,
            due: fr.due,
        };
        // If a frame before failed, the store is poisoned and the log
        // thread refuses this one too.
        match self.tx.send(SyncMsg::Write(fr.buf)) {
            Ok(()) => inflight.push_back(next),
            Err(_) => {
                // The log thread is gone: nothing more can become durable.
                self.stage.shared.poison();
                self.stage.pending.retain(|(l, _)| *l != next.lsn);
                next.fail(StoreError::Closed);
            }
        }
    }

    /// Publishes and answers a frame the log thread is done with (the
    /// oldest in flight), then the batches that changed nothing staged
    /// after it; if it did not become durable, answers them all with the
    /// error.
    fn complete(&mut self, f: InFlight, synced: Option<Synced>) {
        // Its changes leave `pending` first: published, they are read from
        // the map (and move there without a copy).
        let (lsn, _) = self
            .stage
            .pending
            .pop_front()
            .expect("every frame in flight is pending");
        assert_eq!(lsn, f.lsn, "frames complete in the order they were staged");
        let Some(Synced { buf, result }) = synced else {
            self.stage.shared.poison();
            return f.fail(StoreError::Closed);
        };
        self.stage.spare.push(buf);
        if let Err(e) = result {
            return f.fail(e);
        }
        self.stage
            .shared
            .publish_batch(f.changes, f.lsn, f.disputed, f.due, f.replies.len());
        for (r, res) in f.replies.into_iter().chain(f.after) {
            r.send(res);
        }
    }

    /// Sends what was gathered, if anything.
    fn flush(&mut self, g: &mut Gathering<Answer>, inflight: &mut VecDeque<InFlight>) {
        if !g.is_empty() {
            self.send(g, inflight);
        }
    }

    /// Waits for every frame in flight and answers it.
    fn drain(&mut self, inflight: &mut VecDeque<InFlight>) {
        while let Some(f) = inflight.pop_front() {
            let s = self.synced.recv().ok();
            self.complete(f, s);
        }
    }

    fn close(mut self, done: Option<std::sync::mpsc::Sender<()>>) {
        // Answer anything still queued, then checkpoint what is durable.
        let mut g = self.stage.begin(0);
        let mut taken = 0;
        while let Ok(m) = self.rx.try_recv() {
            taken += commands_in(&m);
            // A second close has nobody waiting for it.
            let _ = self.take(&mut g, m);
        }
        self.stage.shared.queued.fetch_sub(taken, Ordering::Relaxed);
        let mut inflight = VecDeque::new();
        self.flush(&mut g, &mut inflight);
        self.drain(&mut inflight);
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(SyncMsg::Close(tx)).is_ok() {
            let _ = rx.recv();
        }
        // The log (and its segment-preparation thread) goes before the
        // caller hears that the store is closed.
        drop(self);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

/// What woke the writer.
enum Event {
    /// A message (`None`: every sender is gone).
    Msg(Option<Msg>),
    /// The log thread is done with the oldest frame in flight (`None`: it is gone).
    Synced(Option<Synced>),
}

impl InFlight {
    /// Answers every command with `e`.
    fn fail(self, e: StoreError) {
        for (r, _) in self.replies.into_iter().chain(self.after) {
            r.send(Err(e.clone()));
        }
    }
}

/// The log thread: writes and syncs the writer's frames, in order, and
/// seals full segments.
pub struct Syncer<F: Fs, I: Index> {
    pub log: Log<F, I>,
    pub rx: Receiver<SyncMsg>,
    pub synced: Ringing<Synced>,
    /// Rung by the writer after each message on `rx`.
    pub bell: Arc<Doorbell>,
}

impl<F: Fs, I: Index> Syncer<F, I> {
    /// The log thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self) {
        let shared = self.log.shared.clone();
        let writer_bell = self.synced.bell.clone();
        let _alive = OnDrop(move || {
            shared.writer_alive.store(false, Ordering::SeqCst);
            writer_bell.ring();
        });
        loop {
            let next = self
                .bell
                .wait(DOORBELL_TIMEOUT, || match self.rx.try_recv() {
                    Ok(m) => Some(Some(m)),
                    Err(TryRecvError::Disconnected) => Some(None),
                    Err(TryRecvError::Empty) => None,
                });
            let m = match next {
                Some(Some(m)) => m,
                // The writer is gone.
                Some(None) => return,
                None => continue,
            };
            match m {
                SyncMsg::Write(mut buf) => {
                    let result = self.log.write(&mut buf);
                    if result.is_ok() && !self.log.wal.fits(4096) {
                        // A failure poisons the store; this frame is durable
                        // already. The checkpointer evicts the segment's
                        // records once the writer published its last batch.
                        let _ = self.log.seal();
                    }
                    if self.synced.send(Synced { buf, result }).is_err() {
                        return;
                    }
                }
                SyncMsg::Close(done) => {
                    self.log.close();
                    drop(self);
                    let _ = done.send(());
                    return;
                }
            }
        }
    }
}

/// The positions of `keys` in byte order of the keys, equal keys in the
/// order given (as sorting `(key, position)` pairs would give), comparing
/// integers where it can:
/// a segment's keys share long prefixes (kind, tenant, often the key's
/// own), so a plain sort spent most of its time in `memcmp` over equal
/// bytes. Keys are grouped by their first byte; within a group every key
/// shares the group's common prefix, and the 8 bytes after it (zero
/// padded), read as a big-endian integer, order any two keys they tell
/// apart; only keys equal there are compared whole.
fn sorted_by_key<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<usize> {
    let all: Vec<&[u8]> = keys.collect();
    // The common prefix of each first byte's keys (`usize::MAX`: none seen).
    let mut common = [usize::MAX; 256];
    let mut first: [&[u8]; 256] = [&[]; 256];
    for &k in &all {
        let Some(&b) = k.first() else { continue };
        let c = &mut common[b as usize];
        if *c == usize::MAX {
            *c = k.len();
            first[b as usize] = k;
        } else {
            let f = first[b as usize];
            let n = (*c).min(k.len());
            *c = f[..n]
                .iter()
                .zip(&k[..n])
                .position(|(x, y)| x != y)
                .unwrap_or(n);
        }
    }
    // Each key as one integer: its group (first byte + 1; 0 for the empty
    // key, never an entity key) in bits 96.., the word in bits 32..96,
    // its position in the low 32 bits. Integers sort with a fraction of
    // the instructions a tuple comparison takes (docs/performance.md,
    // "Eleventh round"); keys equal in group and word are then sorted
    // whole, run by run.
    assert!(
        u32::try_from(all.len()).is_ok(),
        "a segment holds fewer than 2^32 entries"
    );
    let mut tagged: Vec<u128> = all
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (group, word) = match k.first() {
                None => (0u128, 0u64),
                Some(&b) => {
                    let rest = &k[common[b as usize]..];
                    let mut word = [0u8; 8];
                    let n = rest.len().min(8);
                    word[..n].copy_from_slice(&rest[..n]);
                    (u128::from(b) + 1, u64::from_be_bytes(word))
                }
            };
            group << 96 | u128::from(word) << 32 | i as u128
        })
        .collect();
    tagged.sort_unstable();
    let position = |t: &u128| (*t as u32) as usize;
    let mut order: Vec<usize> = Vec::with_capacity(tagged.len());
    for run in tagged.chunk_by(|a, b| a >> 32 == b >> 32) {
        let start = order.len();
        order.extend(run.iter().map(position));
        if run.len() > 1 {
            order[start..].sort_unstable_by(|&a, &b| all[a].cmp(all[b]).then(a.cmp(&b)));
        }
    }
    order
}

/// Moves sealed segments into the index, one segment at a time (so memory
/// stays bounded by one segment however far behind it is).
pub struct Checkpointer<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub fs: F,
    pub wal_dir: PathBuf,
    /// The last completed checkpoint.
    pub meta: Meta,
    pub faults: Option<Arc<Faults>>,
    /// Record keys the index's `open` keyspace may list: those a checkpoint
    /// of this process wrote open, and every record in memory at open (a
    /// superset of what earlier processes listed and still matters). Only
    /// these get a tombstone there once they are no longer open.
    pub listed: std::collections::HashSet<Box<[u8]>, Hasher>,
    /// The segment being checkpointed, read into the same buffer each time:
    /// a fresh 64 MiB buffer per checkpoint cost its page faults and the
    /// kernel's zeroing of every page (a fifth of the checkpointer's CPU).
    pub read_buf: Vec<u8>,
    /// The table writes take turns with the log's syncs.
    pub pacer: Arc<Pacer>,
    /// Where evicted states go to be freed ([`Reclaimer`]); `None`: freed
    /// at once.
    pub reclaim: Option<Sender<Evicted>>,
}

/// States an eviction took out of the map, to be freed.
pub type Evicted = Vec<(Box<[u8]>, Slot)>;

/// Evictions waiting for the [`Reclaimer`] at most; past that the
/// checkpointer frees them itself, so memory stays bounded whatever the
/// reclaim thread gets of the CPU.
pub const RECLAIM_BACKLOG: usize = 2;

/// The reclaim thread: frees what evictions took out of the map. Nothing
/// waits for it; it moves the cost of freeing ~95,000 cold records per
/// segment off the checkpointer, which the writer waits for when it falls
/// behind (docs/performance.md, "Twelfth round").
pub struct Reclaimer {
    pub rx: Receiver<Evicted>,
}

impl Reclaimer {
    /// The reclaim thread's loop; ends when the checkpointer is gone.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(self) {
        for evicted in self.rx {
            drop(evicted);
        }
    }
}

fn io_err(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl<F: Fs, I: Index> Checkpointer<F, I> {
    /// Checkpoints every segment after the last checkpoint up to `seq`.
    pub fn run_to(&mut self, seq: u64) -> Result<(), StoreError> {
        if seq <= self.meta.checkpoint_seq {
            return Ok(());
        }
        let segments = wal::segments(&self.fs, &self.wal_dir).map_err(io_err)?;
        for (s, path) in segments {
            if s <= self.meta.checkpoint_seq || s > seq {
                continue;
            }
            if s != self.meta.checkpoint_seq + 1 {
                return Err(StoreError::Corrupt(format!(
                    "log segment {} is missing",
                    self.meta.checkpoint_seq + 1
                )));
            }
            if !self.one(s, &path)? {
                break;
            }
        }
        Ok(())
    }

    /// Ingests the newest state of every entity in segment `seq` into the
    /// index, makes it durable, records the checkpoint, deletes the
    /// segment, then evicts from memory what may leave it. The order is
    /// what makes a crash at any point harmless (docs/design.md).
    /// `Ok(false)`: halted by a fault, nothing done.
    fn one(&mut self, seq: u64, path: &std::path::Path) -> Result<bool, StoreError> {
        Faults::before_checkpoint(&self.faults);
        if Faults::halted(&self.faults) {
            return Ok(false);
        }
        let started = Instant::now();
        let mut buf = std::mem::take(&mut self.read_buf);
        let done = self.ingest_segment(seq, path, &mut buf);
        self.read_buf = buf;
        done?;
        if let Some(f) = &self.faults {
            f.checkpoints.fetch_add(1, Ordering::SeqCst);
        }
        tracing::debug!(
            seq,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint"
        );
        Ok(true)
    }

    /// [`Checkpointer::one`] on the segment read into `buf`.
    fn ingest_segment(
        &mut self,
        seq: u64,
        path: &std::path::Path,
        buf: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        wal::read_segment_into(&self.fs, path, buf)?;
        let buf = &buf[..];
        let frames = decode_frames(buf, seq)?;
        if let Some(x) = first_nonzero(buf, frames.valid) {
            return Err(StoreError::Corrupt(format!(
                "sealed segment {} is damaged at byte {} (non-zero byte at {x})",
                path.display(),
                frames.valid
            )));
        }
        let mut meta = self.meta;
        meta.checkpoint_seq = seq;
        // The newest entry per key (later batches win), borrowed from the segment bytes.
        // Sized for every entry up front: growing it rehashed every key
        // several times per segment.
        let entries = frames.batches.iter().map(|b| b.entries.len()).sum();
        let mut newest: HashMap<&[u8], (u64, Entry<'_>), Hasher> =
            HashMap::with_capacity_and_hasher(entries, Hasher::default());
        for b in frames.batches {
            if b.lsn != meta.checkpoint_lsn + 1 {
                return Err(StoreError::Corrupt(format!(
                    "{}: batch {} where {} was expected",
                    path.display(),
                    b.lsn,
                    meta.checkpoint_lsn + 1
                )));
            }
            meta.checkpoint_lsn = b.lsn;
            meta.next_fence = meta.next_fence.max(b.next_fence);
            meta.disputed = Some(b.disputed);
            for e in b.entries {
                newest.insert(e.key, (b.lsn, e));
            }
        }
        let taken: Vec<(u64, Entry<'_>)> = newest.into_values().collect();
        // Sorted as positions in `taken`: far fewer bytes to move than
        // the entries themselves.
        let order = sorted_by_key(taken.iter().map(|(_, e)| e.key));
        let items: Vec<CheckpointItem<'_>> = order
            .iter()
            .map(|&i| {
                let e = &taken[i].1;
                CheckpointItem {
                    key: e.key,
                    open: e.open,
                    expires_at: e.expires_at,
                    value: e.value,
                    // (Most stores list nothing: no hashing then.)
                    listed: !self.listed.is_empty() && self.listed.contains(e.key),
                }
            })
            .collect();
        drop(order);
        if Faults::take_checkpoint(&self.faults) {
            return Err(StoreError::Io("injected checkpoint failure".into()));
        }
        let prepared = Instant::now();
        // Before they can be in the index (and long before they leave the map).
        self.shared.ingested.add(items.iter().map(|it| it.key));
        let pacer = &self.pacer;
        self.shared.index.ingest(&items, &|| pacer.step())?;
        for it in items.iter().filter(|it| it.key.first() == Some(&b'r')) {
            if it.open {
                self.listed.insert(it.key.into());
            } else if it.listed {
                self.listed.remove(it.key);
            }
        }
        Faults::step(&self.faults, CheckpointStep::TablesWritten);
        let written = Instant::now();
        self.shared.index.commit_meta(&meta)?;
        Faults::step(&self.faults, CheckpointStep::Persisted);
        let persisted = Instant::now();
        // The index now holds everything the segment holds: drop it.
        let pacer = &self.pacer;
        self.fs
            .remove_paced(path, &|| pacer.step())
            .map_err(io_err)?;
        self.fs.sync_dir(&self.wal_dir).map_err(io_err)?;
        Faults::step(&self.faults, CheckpointStep::SegmentDeleted);
        let removed = Instant::now();
        // The log thread seals a segment as soon as its last frame is
        // durable; the writer publishes that batch a moment later. Evicting
        // before then would keep the state it is about to publish in memory
        // for good (an eviction matches each key's batch).
        if self.shared.wait_published(meta.checkpoint_lsn) {
            self.evict(&taken);
        }
        self.meta = meta;
        // Each step's time: which one a slow log sync came with.
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_millis() as u64;
        tracing::debug!(
            entities = taken.len(),
            seq,
            read_sort_ms = ms(started, prepared),
            tables_ms = ms(prepared, written),
            meta_ms = ms(written, persisted),
            remove_ms = ms(persisted, removed),
            evict_ms = ms(removed, Instant::now()),
            "checkpoint ingested"
        );
        Ok(())
    }

    /// Evicts from the map what the checkpoint of `taken` made durable,
    /// unless a later batch changed it since; settles which fresh record
    /// keys are carried and which are sorted into the listing set.
    fn evict(&self, taken: &[(u64, Entry<'_>)]) {
        // Evict what was checkpointed unless a later batch changed it since.
        // Every key of this segment that is new to the map is among the
        // fresh ones now (published before the segment was sealed); keys
        // published from here on belong to later segments, never evicted here.
        let evicting = self.shared.evicting.lock();
        // Nobody listed yet: the key sets are not kept (the lists below
        // are empty) and no evicted key is looked for in the sorted set.
        let tracking = self.shared.tracking.load(Ordering::SeqCst);
        let (new, carried) = {
            let mut p = self.shared.new_record_keys.lock();
            (std::mem::take(&mut p.new), std::mem::take(&mut p.carried))
        };
        // Each fresh key, and whether it was carried over already.
        let mut fresh: HashMap<Box<[u8]>, bool, Hasher> =
            HashMap::with_capacity_and_hasher(new.len() + carried.len(), Hasher::default());
        fresh.extend(new.into_iter().map(|k| (k, false)));
        fresh.extend(carried.into_iter().map(|k| (k, true)));
        let mut gone = Vec::with_capacity(taken.len());
        for (lsn, e) in taken {
            let removed = self.shared.map.remove_if(e.key, |k, s| {
                let evict = s.lsn == *lsn && s.evictable();
                // Terminal records hold no lease (settle_core asserts it):
                // `leased` never names a key that leaves the map.
                debug_assert!(!(evict && holds_lease(&s.value)));
                // Under the shard lock: a writer cannot re-add it in between.
                if tracking && evict && k.first() == Some(&b'r') && fresh.remove(k).is_none() {
                    self.shared.record_keys.write().remove(k);
                }
                evict
            });
            if let Some(r) = removed {
                gone.push(r);
            }
        }
        // Freeing the evicted states (cold memory the writer allocated) was
        // a sixth of the checkpointer's time: handed to the reclaim thread,
        // or freed here when that thread is behind (or absent).
        if let Some(tx) = &self.reclaim {
            // Refused (full or gone): dropped here with the error.
            let _ = tx.try_send(gone);
        }
        Faults::step(&self.faults, CheckpointStep::Evicted);
        // Kept twice (open records, mostly) are sorted in; kept once wait
        // for the next checkpoint, which usually evicts them.
        let (sort_in, keep): (Vec<_>, Vec<_>) = fresh.into_iter().partition(|&(_, c)| c);
        if !sort_in.is_empty() {
            self.shared
                .record_keys
                .write()
                .extend(sort_in.into_iter().map(|(k, _)| k));
        }
        self.shared.new_record_keys.lock().carried = keep.into_iter().map(|(k, _)| k).collect();
        drop(evicting);
    }

    /// The checkpointer thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self, rx: Receiver<CkptMsg>) {
        let shared = self.shared.clone();
        let _alive = OnDrop(move || shared.checkpointer_alive.store(false, Ordering::SeqCst));
        for msg in rx {
            match msg {
                CkptMsg::Sealed(seq) => {
                    if self.shared.poisoned.load(Ordering::SeqCst) {
                        continue;
                    }
                    if let Err(e) = self.run_to(seq) {
                        tracing::error!(error = %e, "checkpoint failed; failing closed");
                        self.shared.poison();
                    }
                }
                CkptMsg::Stop(done) => {
                    let _ = done.send(());
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The checkpointer's sort gives what sorting by the whole key
        /// gives: keys of few bytes (so that prefixes, equal words and
        /// keys that are prefixes of others are common), any first byte.
        #[test]
        fn sorted_by_key_sorts_as_bytes_do(
            keys in proptest::collection::vec(
                proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(b'r'), any::<u8>()], 0..20),
                0..200,
            ),
            prefix in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            // Half the keys share a long prefix, as a segment's do.
            let keys: Vec<Vec<u8>> = keys
                .into_iter()
                .enumerate()
                .map(|(i, k)| if i % 2 == 0 { [&prefix[..], &k[..]].concat() } else { k })
                .collect();
            let order = sorted_by_key(keys.iter().map(|k| &k[..]));
            // Equal keys keep their order (the checkpointer keeps the last).
            let got: Vec<(&[u8], usize)> = order.iter().map(|&i| (&keys[i][..], i)).collect();
            let mut want: Vec<(&[u8], usize)> = keys.iter().enumerate().map(|(i, k)| (&k[..], i)).collect();
            want.sort();
            prop_assert_eq!(got, want);
            let mut seen = order.clone();
            seen.sort();
            prop_assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
        }
    }

    /// A waiter that went to sleep is woken by a ring after a send, and
    /// gives up after its timeout when nothing comes.
    #[test]
    fn a_doorbell_wakes_its_sleeping_waiter() {
        let (tx, rx) = crossbeam_channel::unbounded::<u32>();
        let quiet = Doorbell::default();
        assert_eq!(
            quiet.wait(Duration::from_millis(1), || rx.try_recv().ok()),
            None
        );
        let bell = Arc::new(Doorbell::default());
        let waiter = {
            let bell = bell.clone();
            std::thread::spawn(move || bell.wait(Duration::from_secs(3600), || rx.try_recv().ok()))
        };
        // Asleep (or about to park, which a ring then ends at once).
        while !bell.sleeping.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        tx.send(7).unwrap();
        bell.ring();
        assert_eq!(waiter.join().unwrap(), Some(7));
    }

    /// Two senders, one waiter that sleeps whenever the channel is empty:
    /// every message arrives (a lost wake-up would leave the waiter asleep
    /// for an hour). One sender waits for each message to be taken before
    /// the next, so the waiter goes to sleep between them, at every point
    /// of its way there.
    #[test]
    fn a_doorbell_loses_no_wake_up() {
        let bell = Arc::new(Doorbell::default());
        let taken = Arc::new(AtomicU64::new(0));
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        const EACH: u64 = 20_000;
        let lockstep = {
            let (tx, bell, taken) = (tx.clone(), bell.clone(), taken.clone());
            std::thread::spawn(move || {
                for i in 0..EACH {
                    // A varying delay: the waiter is caught polling,
                    // going to sleep, or asleep.
                    for _ in 0..i % 16 {
                        std::thread::yield_now();
                    }
                    let before = taken.load(Ordering::SeqCst);
                    tx.send(i).unwrap();
                    bell.ring();
                    while taken.load(Ordering::SeqCst) == before {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let free = {
            let (tx, bell) = (tx.clone(), bell.clone());
            std::thread::spawn(move || {
                for i in 0..EACH {
                    tx.send(i).unwrap();
                    bell.ring();
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut sum = 0;
        for _ in 0..2 * EACH {
            sum += bell
                .wait(Duration::from_secs(3600), || rx.try_recv().ok())
                .expect("a message before the timeout");
            taken.fetch_add(1, Ordering::SeqCst);
        }
        lockstep.join().unwrap();
        free.join().unwrap();
        assert_eq!(sum, 2 * (EACH * (EACH - 1) / 2));
    }

    #[test]
    fn ingested_keys_are_held_and_others_mostly_not() {
        let g = Ingested::new(true);
        let keys: Vec<Vec<u8>> = (0..100_000)
            .map(|i| format!("rk{i}").into_bytes())
            .collect();
        assert!(!g.may_hold(b"rk0"));
        g.add(keys.iter().map(|k| &k[..]));
        assert!(keys.iter().all(|k| g.may_hold(k)));
        let false_positives = (0..100_000)
            .filter(|i| g.may_hold(format!("other{i}").as_bytes()))
            .count();
        assert!(false_positives < 2_000, "{false_positives}");
    }

    #[test]
    fn a_full_filter_stays_under_one_and_a_half_percent_false_positives() {
        let g = Ingested::new(true);
        let cap = BLOOM_FIRST_BITS / BLOOM_BITS_PER_KEY;
        let keys: Vec<Vec<u8>> = (0..cap).map(|i| format!("r/t/k{i}").into_bytes()).collect();
        g.add(keys.iter().map(|k| &k[..]));
        assert_eq!(g.filters.read().len(), 1, "filled to capacity, not past it");
        assert!(keys.iter().all(|k| g.may_hold(k)));
        let false_positives = (0..100_000)
            .filter(|i| g.may_hold(format!("r/t/other{i}").as_bytes()))
            .count();
        assert!(false_positives < 1_500, "{false_positives} of 100,000");
    }

    #[test]
    fn the_filters_grow_then_turn_off_and_hold_everything() {
        let g = Ingested::new(true);
        let cap = BLOOM_FIRST_BITS / BLOOM_BITS_PER_KEY;
        let batch = |from: usize, n: usize| -> Vec<Vec<u8>> {
            (from..from + n).map(|i| i.to_le_bytes().to_vec()).collect()
        };
        let a = batch(0, cap);
        g.add(a.iter().map(|k| &k[..]));
        let b = batch(cap, 10);
        g.add(b.iter().map(|k| &k[..]));
        assert_eq!(
            g.filters.read().len(),
            2,
            "a second filter for the overflow"
        );
        assert!(a.iter().chain(&b).all(|k| g.may_hold(k)));
        // More than the filters may take in all: off, every key may be held.
        g.add(std::iter::repeat_n(
            &b"c"[..],
            BLOOM_MAX_BITS / BLOOM_BITS_PER_KEY,
        ));
        assert!(!g.on.load(Ordering::SeqCst));
        assert!(g.may_hold(b"anything"));
    }

    #[test]
    fn slow_syncs_are_reported_at_most_once_per_period_with_their_count() {
        let t0 = Instant::now();
        let mut s = SlowSyncs::default();
        assert_eq!(s.note(t0), Some(1), "the first is reported at once");
        assert_eq!(s.note(t0 + Duration::from_secs(1)), None);
        assert_eq!(
            s.note(t0 + SLOW_SYNC_REPORT - Duration::from_millis(1)),
            None
        );
        assert_eq!(
            s.note(t0 + SLOW_SYNC_REPORT),
            Some(3),
            "the next report counts the ones held back"
        );
        assert_eq!(s.note(t0 + SLOW_SYNC_REPORT * 3), Some(1));
    }

    #[test]
    fn off_holds_everything() {
        let g = Ingested::new(false);
        assert!(g.may_hold(b"k"));
        g.add([&b"k"[..]].into_iter());
        assert!(g.may_hold(b"other"));
    }
}
