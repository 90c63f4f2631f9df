//! Three `settle serve` processes on one PostgreSQL database, racing
//! claims and settles through all of them (SPEC §4 across servers).
//!
//! Needs the PostgreSQL of the test machine (`SETTLE_TEST_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). The test creates its own
//! uniquely named database and drops it afterwards.

mod common;

use std::collections::{HashMap, HashSet};

use common::pg::Database;
use common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_one_database_execute_each_key_once() {
    let db = Database::create().await;
    let dummy = TempDir::new("multi");
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(dummy.path(), &["--store", &db.url()]))
        .collect();
    let eps: Vec<_> = servers.iter().map(|s| s.ep()).collect();
    let b = binding("svc", 0);

    // 30 keys, each claimed 4 times through each of the 3 servers at once.
    let keys: Vec<String> = (0..30).map(|i| format!("multi-{i}")).collect();
    let mut tasks = Vec::new();
    for k in &keys {
        for ep in &eps {
            for _ in 0..4 {
                let (ep, k, b) = (ep.clone(), k.clone(), b.clone());
                tasks.push(tokio::spawn(async move {
                    let r = op(&ep, &k, "claim", claim_body(1, &b)).await;
                    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                    (k, r.json())
                }));
            }
        }
    }
    let mut winners: HashMap<String, u64> = HashMap::new();
    let mut fences = HashSet::new();
    for t in tasks {
        let (k, v) = t.await.unwrap();
        match v["decision"].as_str().unwrap() {
            "execute" => {
                let f = v["fence"].as_u64().unwrap();
                assert!(fences.insert(f), "fence {f} granted twice");
                assert!(winners.insert(k.clone(), f).is_none(), "{k} executed twice");
            }
            "in_flight" => assert!(v["retry_after_ms"].as_u64().unwrap() >= 10),
            other => panic!("unexpected decision {other} for {k}"),
        }
    }
    assert_eq!(winners.len(), keys.len(), "exactly one execute per key");

    // Each winner settles through the next server; racing duplicates of the
    // same settlement go through the other two.
    let mut tasks = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let f = winners[k];
        for j in 0..3 {
            let (ep, k, b) = (eps[(i + j) % 3].clone(), k.clone(), b.clone());
            tasks.push(tokio::spawn(async move {
                let r = op(&ep, &k, "settle", settle_body(f, 1, &b, completed(1))).await;
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                (k, r.json()["receipt"].clone())
            }));
        }
    }
    let mut receipts: HashMap<String, Value> = HashMap::new();
    for t in tasks {
        let (k, rc) = t.await.unwrap();
        assert_eq!(rc["durable"], true);
        // The retries are idempotent: every caller gets the same receipt.
        if let Some(prev) = receipts.insert(k.clone(), rc.clone()) {
            assert_eq!(prev, rc, "{k}: two different receipts");
        }
    }

    // Every server replays the same receipt for every key: none was lost.
    for k in &keys {
        for ep in &eps {
            let r = op(ep, k, "claim", claim_body(1, &b)).await;
            let v = r.json();
            assert_eq!(v["decision"], "replay", "{v}");
            assert_eq!(v["receipt"], receipts[k]);
        }
    }

    // Fences keep increasing across servers: a later grant anywhere is above all of them.
    let mut last = *fences.iter().max().unwrap();
    for round in 0..3 {
        for (i, ep) in eps.iter().enumerate() {
            let f = execute(ep, &format!("after-{round}-{i}"), 1, &b).await;
            assert!(f > last, "server {i} granted {f} after {last}");
            last = f;
        }
    }
    drop(servers);
}
