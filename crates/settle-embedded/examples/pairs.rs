//! Quick in-process pair benchmark for profiling: `cargo run --release -p
//! settle-embedded --example pairs -- DIR CONCURRENCY SECONDS`.
#![allow(clippy::print_stdout)] // an example prints its figures

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use settle_core::TenantId;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::bench::run_pairs;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = &args[1];
    let concurrency: usize = args[2].parse().unwrap();
    let secs: u64 = args[3].parse().unwrap();
    let seg: u64 = std::env::var("SEG_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let store = EmbeddedStore::open(
        dir,
        EmbeddedOptions {
            segment_bytes: seg << 20,
            ..EmbeddedOptions::default()
        },
    )
    .unwrap();
    let s = run_pairs(
        store.clone(),
        TenantId::default_tenant(),
        &format!("p{}", std::process::id()),
        concurrency,
        Duration::from_secs(secs),
        Arc::new(AtomicU64::new(0)),
    )
    .await
    .unwrap();
    let cpu = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = cpu.split_whitespace().collect();
    let ticks: f64 = f[13].parse::<f64>().unwrap() + f[14].parse::<f64>().unwrap();
    let cpu_us_per_pair = ticks / 100.0 * 1e6 / s.pairs as f64;
    println!(
        "c={} pairs/s={:.0} p50={:.2}ms p99={:.2}ms p999={:.2}ms cpu/pair={:.1}us resident={}",
        s.concurrency,
        s.pairs_per_s,
        s.p50_ms,
        s.p99_ms,
        s.p999_ms,
        cpu_us_per_pair,
        store.resident()
    );
    store.close();
}
