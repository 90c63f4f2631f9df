//! How long a live export or backup holds the writer up (SPEC §12): the
//! snapshot of the in-memory map, taken while no batch is published.
//!
//! `cargo run --release -p settle-embedded --example freeze -- [OPEN_RECORDS] [ROUNDS]`
//! (defaults 200000 and 7) fills a fresh store with OPEN_RECORDS claimed,
//! unsettled records, then starts ROUNDS exports and times each
//! `Store::export` call: it returns once the snapshot is taken (its
//! encoding runs afterwards, on its own thread), so the call bounds the
//! hold from above. One JSON line out (docs/performance.md, "Live
//! export and backup").
#![allow(clippy::print_stdout)] // an example prints its figures

use std::sync::Arc;
use std::time::Instant;

use settle_core::TenantId;
use settle_core::testkit::{binding, claim};
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::Store;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let open: usize = args.get(1).map_or(200_000, |s| s.parse().unwrap());
    let rounds: usize = args.get(2).map_or(7, |s| s.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let tenant = TenantId::default_tenant();

    // Fill: 256 claimers, each its share of distinct keys.
    let started = Instant::now();
    let tasks = 256;
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let store = Arc::clone(&store);
        let tenant = tenant.clone();
        set.spawn(async move {
            for i in (t..open).step_by(tasks) {
                store
                    .execute(
                        &tenant,
                        claim(&format!("open-{i:07}"), 1, binding("alice", 0)),
                    )
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    let fill_s = started.elapsed().as_secs_f64();

    let mut held_ms = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let snapshot = store.export().await.unwrap();
        held_ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(snapshot);
    }
    let mut sorted = held_ms.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{{\"open_records\":{open},\"resident\":{},\"fill_s\":{fill_s:.2},\"export_call_ms\":{:?},\"median_ms\":{:.2},\"max_ms\":{:.2}}}",
        store.resident(),
        held_ms
            .iter()
            .map(|m| (m * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
    );
    store.close();
}
