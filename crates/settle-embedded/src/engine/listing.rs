//! The record keys held in memory, kept sorted for the inspection listing
//! (SPEC §9), and the one invariant that makes it complete: **a listing
//! never misses a record that is only in memory.**
//!
//! A listing merges these keys with the index's. A record is in the map,
//! the index, or both; this module owns every step where a key moves
//! between the map and the sorted set:
//!
//! - a record key entering the map is pushed to `pending` while the key's
//!   map shard is locked ([`Listing::entered`]);
//! - an eviction takes `pending` under `evicting`, removes evicted keys from
//!   `sorted` while their shard is locked, and gives back the keys it kept
//!   before it lets go of `evicting` ([`Listing::evicting`]);
//! - a listing holds `evicting` while it folds `pending` into `sorted`
//!   ([`Listing::keys_in`]), so it never runs between an eviction taking
//!   the pending keys and giving back those it kept.
//!
//! Until a store is first listed nothing is tracked (`tracking` off): a
//! key copy, two hash lookups and a free per record are saved on a store
//! nobody lists. The first listing turns tracking on for good, under
//! `evicting`, so one eviction runs wholly in one mode.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};

use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard, RwLock};

use super::Hasher;
use super::lock_order::{self, Level};
use super::shared::Slot;

/// Record keys added to the map and not sorted into the listing set yet.
#[derive(Default)]
struct PendingKeys {
    /// Pushed, cheaply, as each key enters the map (its shard locked).
    new: Vec<Box<[u8]>>,
    /// Keys a checkpoint took as new and did not evict: most were
    /// published after its segment was sealed and leave at the next one,
    /// so they get one more checkpoint before they are sorted in (a
    /// record claimed and settled within a segment or two never costs a
    /// sorted insert and removal).
    carried: Vec<Box<[u8]>>,
}

/// Whether `key` names a record (entity kind `r`).
fn is_record(key: &[u8]) -> bool {
    key.first() == Some(&b'r')
}

/// The record keys of the map, for listings. See the module doc.
#[derive(Default)]
pub struct Listing {
    /// The record keys of the map, sorted. Changed only while the key's
    /// map shard is locked, so it never disagrees with the map about a key.
    sorted: RwLock<BTreeSet<Box<[u8]>>>,
    /// Record keys in the map and not yet in `sorted`.
    pending: Mutex<PendingKeys>,
    /// Held by an eviction while the keys it took from `pending` are in
    /// neither set, and by a listing while it folds them in.
    evicting: Mutex<()>,
    /// Whether `sorted` and `pending` are kept (off until the first listing).
    tracking: AtomicBool,
}

impl Listing {
    /// Notes that record key `key` entered the map. Called with the key's
    /// map shard locked (the caller holds its entry).
    pub fn entered(&self, key: &[u8]) {
        if is_record(key) && self.tracking.load(Ordering::SeqCst) {
            let _order = lock_order::enter(Level::Pending);
            self.pending.lock().new.push(key.into());
        }
    }

    /// Up to `max` record keys in `range`, sorted: every record key the map
    /// held when this began, and any added since (it may include keys
    /// evicted meanwhile: those are in the index). Turns tracking on at
    /// the first call.
    pub fn keys_in<'r>(
        &self,
        map: &DashMap<Box<[u8]>, Slot, Hasher>,
        range: (Bound<&'r [u8]>, Bound<&'r [u8]>),
        max: usize,
    ) -> Vec<Vec<u8>> {
        let _order = lock_order::enter(Level::Evicting);
        let evicting = self.evicting.lock();
        if !self.tracking.load(Ordering::SeqCst) {
            // Set before the map is read: a key published into a shard
            // after this read it is pushed to `pending` (the publisher
            // reads the flag under the shard's lock), one published before
            // is in the map here.
            self.tracking.store(true, Ordering::SeqCst);
            let keys: Vec<Box<[u8]>> = {
                let _order = lock_order::enter(Level::Map);
                map.iter()
                    .filter(|s| is_record(s.key()))
                    .map(|s| s.key().clone())
                    .collect()
            };
            let _order = lock_order::enter(Level::Sorted);
            self.sorted.write().extend(keys);
        }
        {
            let _order = lock_order::enter(Level::Pending);
            let mut fresh = self.pending.lock();
            if !fresh.new.is_empty() || !fresh.carried.is_empty() {
                let _order = lock_order::enter(Level::Sorted);
                let mut sorted = self.sorted.write();
                sorted.extend(fresh.new.drain(..));
                sorted.extend(fresh.carried.drain(..));
            }
        }
        let _order = lock_order::enter(Level::Sorted);
        let sorted = self.sorted.read();
        drop(evicting);
        sorted
            .range::<[u8], _>(range)
            .take(max)
            .map(|k| k.to_vec())
            .collect()
    }

    /// How many keys the sorted set holds (tests: what the set costs).
    #[cfg(test)]
    pub fn sorted_len(&self) -> usize {
        self.sorted.read().len()
    }

    /// How many keys wait in `pending` (tests).
    #[cfg(test)]
    pub fn pending_len(&self) -> usize {
        let p = self.pending.lock();
        p.new.len() + p.carried.len()
    }

    /// Begins an eviction: holds `evicting` until [`Eviction::end`] (or
    /// drop), and takes the pending keys.
    pub fn evicting(&self) -> Eviction<'_> {
        let order = lock_order::enter(Level::Evicting);
        let guard = self.evicting.lock();
        // Nobody listed yet: the key sets are not kept (the lists below
        // are empty) and no evicted key is looked for in the sorted set.
        let tracking = self.tracking.load(Ordering::SeqCst);
        let (new, carried) = {
            let _order = lock_order::enter(Level::Pending);
            let mut p = self.pending.lock();
            (std::mem::take(&mut p.new), std::mem::take(&mut p.carried))
        };
        // Each fresh key, and whether it was carried over already.
        let mut fresh: HashMap<Box<[u8]>, bool, Hasher> =
            HashMap::with_capacity_and_hasher(new.len() + carried.len(), Hasher::default());
        fresh.extend(new.into_iter().map(|k| (k, false)));
        fresh.extend(carried.into_iter().map(|k| (k, true)));
        Eviction {
            listing: self,
            tracking,
            fresh,
            _guard: guard,
            _order: order,
        }
    }
}

/// An eviction in progress ([`Listing::evicting`]): `evicting` is held.
pub struct Eviction<'a> {
    listing: &'a Listing,
    tracking: bool,
    fresh: HashMap<Box<[u8]>, bool, Hasher>,
    _guard: MutexGuard<'a, ()>,
    _order: lock_order::Held,
}

impl Eviction<'_> {
    /// Notes that `key` leaves the map. Called with its shard locked, so a
    /// writer cannot re-add it in between.
    pub fn evicted(&mut self, key: &[u8]) {
        if self.tracking && is_record(key) && self.fresh.remove(key).is_none() {
            let _order = lock_order::enter(Level::Sorted);
            self.listing.sorted.write().remove(key);
        }
    }

    /// Ends the eviction: fresh keys kept twice (open records, mostly) are
    /// sorted in; those kept once wait for the next checkpoint, which
    /// usually evicts them. Then `evicting` is released.
    pub fn end(self) {
        let (sort_in, keep): (Vec<_>, Vec<_>) = self.fresh.into_iter().partition(|&(_, c)| c);
        if !sort_in.is_empty() {
            let _order = lock_order::enter(Level::Sorted);
            self.listing
                .sorted
                .write()
                .extend(sort_in.into_iter().map(|(k, _)| k));
        }
        let _order = lock_order::enter(Level::Pending);
        self.listing.pending.lock().carried = keep.into_iter().map(|(k, _)| k).collect();
    }
}
