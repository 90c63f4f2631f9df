//! Crash-test child: runs concurrent claim/settle traffic against an
//! embedded store until it is killed, printing one JSON line per
//! acknowledged grant or receipt (after the acknowledgement arrived).
//!
//! Usage: settle-embedded-torture DIR PREFIX CONCURRENCY

use std::io::Write;
use std::sync::Arc;

use serde_json::json;
use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::Store;

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, prefix, concurrency) = (&args[1], args[2].clone(), args[3].parse::<usize>().unwrap());
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
    let tenant = TenantId::new("crash").unwrap();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let store: Arc<EmbeddedStore> = store.clone();
        let tenant = tenant.clone();
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0u64.. {
                let k = format!("{prefix}-{w}-{n}");
                let fence = match store
                    .execute(&tenant, claim(&k, 1, binding("worker", 0)))
                    .await
                    .expect("claim")
                {
                    Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
                    other => panic!("{other:?}"),
                };
                emit(json!({"grant": k, "fence": fence.0}));
                // Every fifth operation times out first, then reconciles.
                if n % 5 == 4 {
                    let r = store
                        .execute(
                            &tenant,
                            settle(&k, fence, 1, binding("worker", 0), unknown()),
                        )
                        .await
                        .expect("settle");
                    let Reply::Receipt(rc) = r else {
                        panic!("{r:?}")
                    };
                    emit(json!({"ack": k, "receipt": rc}));
                    let g = match store
                        .execute(&tenant, claim(&k, 1, binding("worker", 0)))
                        .await
                        .expect("claim")
                    {
                        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
                        other => panic!("{other:?}"),
                    };
                    emit(json!({"grant": k, "fence": g.fence.0}));
                    let r = store
                        .execute(
                            &tenant,
                            reconcile(
                                &k,
                                g.fence,
                                committed(1, binding("worker", 0), completed(1)),
                            ),
                        )
                        .await
                        .expect("reconcile");
                    let Reply::Receipt(rc) = r else {
                        panic!("{r:?}")
                    };
                    emit(json!({"ack": k, "receipt": rc}));
                } else {
                    let r = store
                        .execute(
                            &tenant,
                            settle(&k, fence, 1, binding("worker", 0), completed(1)),
                        )
                        .await
                        .expect("settle");
                    let Reply::Receipt(rc) = r else {
                        panic!("{r:?}")
                    };
                    emit(json!({"ack": k, "receipt": rc}));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
