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

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{Cluster, tools_or_skip};
use common::remote::Remote;
use common::*;
use settle_core::TenantId;
use settle_ledger::crash::{Acked, Load, Workload};

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
    // 503 (database gone, commit in doubt) or no server: nothing
    // acknowledged; the clients go on.
    let workload = Workload::new(TenantId::default_tenant(), "svc", &format!("run{run}"), 8)
        .retrying(Duration::from_millis(20));
    let acked = Arc::new(Acked::new());
    let load = Load::start(Arc::new(Remote(first.ep())), &workload, acked.clone());
    acked
        .progress(200, Duration::from_secs(60), "before the failover")
        .await;

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
    let before_lag = acked.receipts();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during_lag = acked.receipts() - before_lag;
    // Then the primary's machine dies, with commits in flight.
    tokio::task::block_in_place(|| primary.kill9_all());
    let killed_at = Instant::now();
    signal(receiver, "CONT");
    tokio::task::block_in_place(|| standby.promote());
    standby.wait_ready().await;
    // The operator restarts settle on the new primary.
    first.kill9();
    load.finish().await;
    let second = Server::start(dummy.path(), &["--store", &standby.url()]);
    let ep = second.ep();
    let downtime = killed_at.elapsed();

    // Every acknowledged receipt is in its record and replays to the same
    // claim; every acknowledged lease is in its record.
    let what = format!("failover run {run}");
    let remote = Remote(ep.clone());
    let verified = acked.verify(&remote, &workload.tenant, &what).await;
    acked.replays(&remote, &workload, &what).await;
    // The new primary serves, and its fences are above every one acknowledged.
    let after = format!("after-{run}");
    let f = acked.fences_go_on(&remote, &workload, &after, &what).await;
    let b = binding("svc", 0);
    let r = op(&ep, &after, "settle", settle_body(f.0, 1, &b, completed(1))).await;
    assert_eq!(r.status, 200);
    assert!(get(&ep, "/readyz").await.status == 200);
    let (receipts, grants, failed) = (verified.receipts, verified.grants, acked.failed_calls());
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
