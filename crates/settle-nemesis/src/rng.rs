//! A seeded generator (SplitMix64): the same seed gives the same
//! schedule and the same workload choices on every machine.

/// SplitMix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the bias of a modulo is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn ms(&mut self, lo: u64, hi: u64) -> std::time::Duration {
        std::time::Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_seed_gives_one_sequence() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = super::Rng::new(7);
                move |_| r.next()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = super::Rng::new(7);
                move |_| r.next()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
    }
}
