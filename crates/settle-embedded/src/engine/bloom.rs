//! The Bloom filters that say which keys the index may hold, so that a
//! fresh claim's lookup (a miss every time) skips the index.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::RwLock;

use super::Hasher;

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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn off_holds_everything() {
        let g = Ingested::new(false);
        assert!(g.may_hold(b"k"));
        g.add([&b"k"[..]].into_iter());
        assert!(g.may_hold(b"other"));
    }
}
