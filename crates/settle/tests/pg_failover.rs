//! Primary → synchronous standby failover under load through `settle serve`,
//! on two throwaway PostgreSQL clusters of this machine
//! (never the shared one on 5432): streaming replication with
//! `synchronous_standby_names`, claim+settle pairs through the HTTP server,
//! kill -9 of every process of the primary, promotion of the standby, a new
//! `settle serve` on it. Then every receipt and grant the first server
//! acknowledged must be there, fences must go on increasing, and the new
//! server must serve.
//!
//! One failover by default; `SETTLE_PG_FAILOVER_RUNS=N` runs N (each on a
//! fresh pair of clusters). See docs/postgres.md for measured figures.
#![allow(clippy::print_stderr)] // crash tests report what they observed

#[path = "../../settle-pg/tests/common/cluster.rs"]
mod cluster;
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster::{Cluster, tools_or_skip};
use common::*;
use serde_json::Value;
use settle_client::Client;

/// What the load got for one key.
enum Acked {
    Receipt(Value),
    Grant(u64),
}

struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<(HashMap<String, Acked>, u64)>>,
}

fn start_load(ep: &Client, clients: usize, prefix: &str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let b = binding("svc", 0);
    let tasks = (0..clients)
        .map(|c| {
            let (ep, stop, ok, b) = (ep.clone(), stop.clone(), ok.clone(), b.clone());
            let prefix = format!("{prefix}-{c}");
            tokio::spawn(async move {
                let mut acked = HashMap::new();
                let mut failed = 0;
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let k = format!("{prefix}-{i}");
                    i += 1;
                    let r = ep
                        .send_raw(
                            hyper::Method::POST,
                            &settle_client::operation_path(&k, "claim"),
                            Some(serde_json::to_vec(&claim_body(1, &b)).unwrap().into()),
                        )
                        .await;
                    let fence = match r {
                        Ok(r) if r.status == 200 => {
                            let v = r.json();
                            assert_eq!(v["decision"], "execute", "{k}: a first claim: {v}");
                            v["fence"].as_u64().unwrap()
                        }
                        // 503 (database gone, commit in doubt) or no server: nothing acknowledged.
                        _ => {
                            failed += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    let body = settle_body(fence, 1, &b, completed(1));
                    let r = ep
                        .send_raw(
                            hyper::Method::POST,
                            &settle_client::operation_path(&k, "settle"),
                            Some(serde_json::to_vec(&body).unwrap().into()),
                        )
                        .await;
                    match r {
                        Ok(r) if r.status == 200 => {
                            let rc = r.json()["receipt"].clone();
                            assert_eq!(rc["durable"], true);
                            acked.insert(k, Acked::Receipt(rc));
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => {
                            failed += 1;
                            acked.insert(k, Acked::Grant(fence));
                        }
                    }
                }
                (acked, failed)
            })
        })
        .collect();
    Load { stop, ok, tasks }
}

impl Load {
    async fn progress(&self, n: u64) {
        let target = self.ok.load(Ordering::SeqCst) + n;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ok.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < deadline, "the load made no progress");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    async fn finish(self) -> (HashMap<String, Acked>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = HashMap::new();
        let mut failed = 0;
        for t in self.tasks {
            let (a, f) = t.await.expect("a load task panicked");
            all.extend(a);
            failed += f;
        }
        (all, failed)
    }
}

fn signal(pid: i32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

async fn wait_sync(primary: &Cluster) {
    let c = primary.wait_ready().await;
    c.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (settle_standby)'")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE application_name = 'settle_standby' AND sync_state = 'sync'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never became synchronous"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_receipt() {
    let Some(pg) = tools_or_skip("failover") else {
        return;
    };
    let runs: usize = std::env::var("SETTLE_PG_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for run in 0..runs {
        failover_once(&pg, run).await;
    }
}

async fn failover_once(pg: &cluster::Pg, run: usize) {
    let started = Instant::now();
    let primary = tokio::task::block_in_place(|| Cluster::create(pg, "primary", &[]));
    let standby = tokio::task::block_in_place(|| primary.standby("standby", "settle_standby"));
    // Only to show that this test catches lost receipts: without a
    // synchronous standby it fails.
    let asynchronous = std::env::var_os("SETTLE_PG_FAILOVER_ASYNC").is_some();
    if !asynchronous {
        wait_sync(&primary).await;
    }
    let dummy = TempDir::new("failover");

    let mut first = Server::start(dummy.path(), &["--store", &primary.url()]);
    let load = start_load(&first.ep(), 8, &format!("run{run}"));
    load.progress(200).await;

    // The standby falls behind: its WAL receiver stops for a moment (with
    // a synchronous standby, commits wait; without one, the primary goes on
    // acknowledging what the standby does not have).
    let receiver: i32 = standby
        .wait_ready()
        .await
        .query_one("SELECT pid FROM pg_stat_wal_receiver", &[])
        .await
        .unwrap()
        .get(0);
    signal(receiver, "STOP");
    let before_lag = load.ok.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during_lag = load.ok.load(Ordering::SeqCst) - before_lag;
    // Then the primary's machine dies, with commits in flight.
    tokio::task::block_in_place(|| primary.kill9_all());
    let killed_at = Instant::now();
    signal(receiver, "CONT");
    tokio::task::block_in_place(|| standby.promote());
    standby.wait_ready().await;
    // The operator restarts settle on the new primary.
    first.kill9();
    let (acked, failed) = load.finish().await;
    let second = Server::start(dummy.path(), &["--store", &standby.url()]);
    let ep = second.ep();
    let downtime = killed_at.elapsed();

    let b = binding("svc", 0);
    let (mut receipts, mut grants, mut highest) = (0, 0, 0);
    for (k, a) in &acked {
        match a {
            Acked::Receipt(rc) => {
                // The same claim replays the same receipt: it survived.
                let r = op(&ep, k, "claim", claim_body(1, &b)).await;
                assert_eq!(r.status, 200, "{k}: {}", String::from_utf8_lossy(&r.body));
                let v = r.json();
                assert_eq!(
                    v["decision"], "replay",
                    "{k}: an acknowledged receipt was lost: {v}"
                );
                assert_eq!(&v["receipt"], rc, "{k}");
                highest = highest.max(rc["fence"].as_u64().unwrap());
                receipts += 1;
            }
            Acked::Grant(f) => {
                let r = get(&ep, &settle_client::operation_path(k, "")).await;
                assert_eq!(r.status, 200, "{k}: an acknowledged grant was lost");
                let v = r.json();
                assert!(
                    v["attempts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|a| a["lease"]["fence"].as_u64() == Some(*f)),
                    "{k}: the granted lease {f} is not in the record: {v}"
                );
                highest = highest.max(*f);
                grants += 1;
            }
        }
    }
    // The new primary serves, and its fences are above every one acknowledged.
    let f = execute(&ep, &format!("after-{run}"), 1, &b).await;
    assert!(f > highest, "fence {f} after {highest}");
    let r = op(
        &ep,
        &format!("after-{run}"),
        "settle",
        settle_body(f, 1, &b, completed(1)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(get(&ep, "/readyz").await.status == 200);
    eprintln!(
        "failover run {run}: {receipts} receipts and {grants} grants acknowledged before the \
         kill, all present after the failover ({during_lag} pairs acknowledged while the \
         standby's WAL receiver was stopped); {failed} calls failed; promotion and the \
         second server took {:.1} s; run {:.1} s",
        downtime.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(second);
}
