//! Quick in-process pair benchmark for profiling: `cargo run --release -p
//! settle-embedded --example pairs -- DIR CONCURRENCY SECONDS`.

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
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
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
    println!("{s:?} resident={}", store.resident());
    store.close();
}
