//! What the embedded store's listing index costs a pair: the writer adds a
//! new record's key to the sorted key set (`Shared::record_keys`, a
//! `RwLock<BTreeSet>`) and the checkpointer removes it when the record
//! leaves memory. This times exactly those two operations, with keys shaped
//! like `settle bench`'s and `RESIDENT` keys already in the set, so the
//! figure can be set against the CPU per pair that `settle bench --data`
//! prints.
//!
//!     cargo run --release -p settle-embedded --example listing_index_cost [RESIDENT]
#![allow(clippy::print_stdout)] // an example prints its figures

use std::collections::BTreeSet;
use std::time::Instant;

use parking_lot::RwLock;

fn key(run: &str, w: usize, n: usize) -> Box<[u8]> {
    let mut k = b"rdefault\0".to_vec();
    k.extend_from_slice(format!("bench-{run}-{w}-{n}").as_bytes());
    k.into_boxed_slice()
}

fn main() {
    let resident: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let set: RwLock<BTreeSet<Box<[u8]>>> =
        RwLock::new((0..resident).map(|i| key("old", i % 64, i)).collect());
    const OPS: usize = 1_000_000;
    let keys: Vec<Box<[u8]>> = (0..OPS).map(|i| key("new", i % 64, i / 64)).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for k in &keys {
            set.write().insert(k.clone());
        }
        for k in &keys {
            set.write().remove(k);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{resident} resident keys: {:.0} ns per pair (one insert + one remove, best of 3)",
        best * 1e9 / OPS as f64
    );
}
