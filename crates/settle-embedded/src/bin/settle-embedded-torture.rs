//! Crash-test child: runs the crash harness's load
//! (`settle_ledger::crash`) against an embedded store until it is killed,
//! printing one JSON line per acknowledged grant or receipt (after the
//! acknowledgement arrived):
//!
//! ```text
//! {"ready":true}
//! {"grant":KEY,"fence":N}
//! {"ack":KEY,"receipt":RECEIPT}
//! ```
//!
//! Every fifth key is settled `unknown` first (a timeout), then claimed
//! again and reconciled. A failed call ends the load, and the child panics
//! with it: only the parent's SIGKILL may end a healthy run.
//!
//! Usage: settle-embedded-torture DIR PREFIX CONCURRENCY

use std::io::Write;
use std::sync::Arc;

use serde_json::json;
use settle_core::TenantId;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::crash::{Ack, Acked, Load, Workload};

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, prefix, concurrency) = (&args[1], &args[2], args[3].parse::<usize>().unwrap());
    let store = EmbeddedStore::open(
        dir,
        EmbeddedOptions {
            // Small segments: checkpoints and log truncation happen under the kill too.
            segment_bytes: 256 * 1024,
            ..EmbeddedOptions::default()
        },
    )
    .expect("open");
    emit(json!({"ready": true}));
    // The parent checks under the same tenant and principal.
    let workload = Workload::new(
        TenantId::new("crash").unwrap(),
        "worker",
        prefix,
        concurrency,
    )
    .unknown_every(5);
    let acked = Arc::new(Acked::tapped(|ack| match ack {
        Ack::Grant { key, fence } => emit(json!({"grant": key, "fence": fence.0})),
        Ack::Receipt(rc) => emit(json!({"ack": rc.key.as_str(), "receipt": rc})),
    }));
    let stopped = Load::start(store, &workload, acked).ended().await;
    panic!("the load stopped: {stopped:?}");
}
