//! How long a live export or backup holds the writer up (SPEC §12): the
//! snapshot of the in-memory map, taken while no batch is published.
//!
//! `cargo run --release -p settle-embedded --example freeze -- [OPEN_RECORDS] [ROUNDS]`
//! (defaults 200000 and 7) fills a fresh store with OPEN_RECORDS claimed,
//! unsettled records, then starts ROUNDS exports one after the other
//! while a probe claims new keys one at a time: `probe_max_ms`, the
//! longest of those claims, is the most an export start made a write wait
//! (the writes it held, plus one commit); `export_call_ms` is each
//! `Store::export` call (the snapshot taken, before its encoding, which
//! runs afterwards on its own thread). One JSON line out
//! (docs/performance.md, "Live export and backup"); on stderr, the
//! engine's `export snapshot taken` line of each export, whose `held_ms`
//! is how long publishing waited.
#![allow(clippy::print_stdout)] // an example prints its figures

use std::sync::Arc;
use std::time::Instant;

use settle_core::TenantId;
use settle_core::testkit::{binding, claim};
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::Store;

#[tokio::main]
async fn main() {
    // The engine logs each snapshot's hold (`held_ms`) at info, on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("settle_embedded=info")
        .with_ansi(false)
        .init();
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

    // A writer of its own meanwhile: one claim at a time, each timed. The
    // longest claim while an export starts is what an export costs a
    // write (the hold, plus one commit).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (store, tenant, stop) = (Arc::clone(&store), tenant.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut worst = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                store
                    .execute(
                        &tenant,
                        claim(&format!("probe-{i:09}"), 1, binding("alice", 0)),
                    )
                    .await
                    .unwrap();
                worst.push(t.elapsed().as_secs_f64() * 1e3);
                i += 1;
            }
            worst
        })
    };
    let mut call_ms = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let snapshot = store.export().await.unwrap();
        call_ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(snapshot);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut probe_ms = probe.await.unwrap();
    probe_ms.sort_by(f64::total_cmp);
    let mut sorted = call_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let round2 = |m: &f64| (m * 100.0).round() / 100.0;
    println!(
        "{{\"open_records\":{open},\"resident\":{},\"fill_s\":{fill_s:.2},\"export_call_ms\":{:?},\"export_call_median_ms\":{:.2},\"probe_claims\":{},\"probe_p50_ms\":{:.2},\"probe_max_ms\":{:.2}}}",
        store.resident(),
        call_ms.iter().map(round2).collect::<Vec<_>>(),
        sorted[sorted.len() / 2],
        probe_ms.len(),
        probe_ms[probe_ms.len() / 2],
        probe_ms[probe_ms.len() - 1],
    );
    store.close();
}
