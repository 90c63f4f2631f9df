//! Faults: connections lost mid-transaction and during COMMIT, terminated
//! backends, several stores (servers) on one database, fail-closed loads.
//!
//! The invariant under every fault: the caller gets an error or a correct
//! answer, never a receipt for a write that did not commit.
#![allow(clippy::print_stderr)] // crash tests report what they observed

mod common;

use std::time::{Duration, Instant};

use common::proxy::{Cut, Proxy};
use common::{acme, exec_fence, record};
use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::{Store, StoreError};
use settle_pg::PgStore;

fn settle_k(k: &str, f: Fence) -> Command {
    settle(k, f, 1, binding("alice", 0), completed(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_answer_is_resolved_as_committed() {
    lost_commit_answer(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_answer_is_resolved_as_committed_without_group_commit() {
    lost_commit_answer(false).await;
}

async fn lost_commit_answer(group: bool) {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let (store, _clock, _g) = common::store_with(&proxy.url(&common::url()), "incommit", |o| {
        o.group_commit = group;
    })
    .await;

    // A claim whose COMMIT answer is lost: the grant is only returned
    // because the store learned that the transaction committed. (Running
    // the claim again instead would answer in_flight.)
    proxy.arm(Cut::AfterCommit);
    let reply = store
        .execute(&acme(), claim("k", 1, binding("alice", 0)))
        .await
        .expect("in-doubt commit resolved");
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    let Reply::Claim(ClaimDecision::Execute(g)) = reply else {
        panic!("{reply:?}")
    };
    let rec = record(&store, "k").await;
    assert_eq!(rec.open_lease().unwrap().fence, g.fence);
    assert_eq!(rec.attempts.len(), 1);

    // The same for a settlement: the receipt is the committed one.
    proxy.arm(Cut::AfterCommit);
    let rc = receipt(
        store
            .execute(&acme(), settle_k("k", g.fence))
            .await
            .unwrap(),
    );
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 2);
    let rec = record(&store, "k").await;
    assert_eq!(rec.receipt, Some(rc));
    assert_eq!(rec.attempts[0].observations.len(), 1, "settled once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_that_never_arrives_is_an_error_and_changes_nothing() {
    commit_never_arrives(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_that_never_arrives_is_an_error_without_group_commit() {
    commit_never_arrives(false).await;
}

async fn commit_never_arrives(group: bool) {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let (store, _clock, _g) = common::store_with(&proxy.url(&common::url()), "nocommit", |o| {
        o.max_retries = 0;
        o.group_commit = group;
    })
    .await;
    let f = exec_fence(&store, "k").await;
    proxy.arm(Cut::BeforeCommit);
    let err = store
        .execute(&acme(), settle_k("k", f))
        .await
        .expect_err("no receipt without a commit");
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    let rec = record(&store, "k").await;
    assert_eq!(rec.status, Status::Pending);
    assert!(rec.receipt.is_none());
    assert_eq!(
        rec.open_lease().unwrap().fence,
        f,
        "the lease is still held"
    );
    // The worker retries and settles.
    let rc = receipt(store.execute(&acme(), settle_k("k", f)).await.unwrap());
    assert_eq!(record(&store, "k").await.receipt, Some(rc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_that_never_arrives_is_retried_when_known_aborted() {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let (store, _clock, _g) = common::store_at(&proxy.url(&common::url()), "retrycommit").await;
    let f = exec_fence(&store, "k").await;
    proxy.arm(Cut::BeforeCommit);
    // The commit token is not there: it did not commit, so the command
    // runs again from scratch.
    let rc = receipt(store.execute(&acme(), settle_k("k", f)).await.unwrap());
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    let rec = record(&store, "k").await;
    assert_eq!(rec.receipt, Some(rc));
    assert_eq!(rec.attempts[0].observations.len(), 1, "settled once");
}

/// Waits until one of the store's backends waits for a lock; returns its pid.
async fn lock_waiter(side: &tokio_postgres::Client, schema: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = side
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&schema],
            )
            .await
            .unwrap();
        if let Some(r) = rows.first() {
            return r.get(0);
        }
        assert!(Instant::now() < deadline, "the command never blocked");
        tokio::task::yield_now().await;
    }
}

async fn block_row<'a>(
    side: &'a mut tokio_postgres::Client,
    schema: &str,
    k: &str,
) -> tokio_postgres::Transaction<'a> {
    let tx = side.transaction().await.unwrap();
    let n = tx
        .execute(
            &format!(
                "SELECT 1 FROM \"{schema}\".settle_records WHERE tenant = 'acme' AND key = $1 FOR UPDATE"
            ),
            &[&k],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_mid_transaction_gives_error_or_correct_answer() {
    killed_mid_transaction(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_mid_transaction_without_group_commit() {
    killed_mid_transaction(false).await;
}

async fn killed_mid_transaction(group: bool) {
    // Without retries: the caller gets an error and nothing changed.
    let (store, _clock, g) = common::store_with(&common::url(), "midtx", |o| {
        o.max_retries = 0;
        o.group_commit = group;
    })
    .await;
    let f = exec_fence(&store, "k").await;
    let mut side = common::side_client().await;
    let killer = common::side_client().await;
    let tx = block_row(&mut side, &g.schema, "k").await;
    let s2 = store.clone();
    let pending = tokio::spawn(async move { s2.execute(&acme(), settle_k("k", f)).await });
    let pid = lock_waiter(&killer, &g.schema).await;
    killer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let err = pending
        .await
        .unwrap()
        .expect_err("its connection died before COMMIT");
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    tx.rollback().await.unwrap();
    let rec = record(&store, "k").await;
    assert!(rec.receipt.is_none());
    assert_eq!(rec.open_lease().unwrap().fence, f);

    // With retries: the command runs again on a new connection and answers correctly.
    let (store, _clock, g) =
        common::store_with(&common::url(), "midtx_retry", |o| o.group_commit = group).await;
    let f = exec_fence(&store, "k").await;
    let tx = block_row(&mut side, &g.schema, "k").await;
    let s2 = store.clone();
    let pending = tokio::spawn(async move { s2.execute(&acme(), settle_k("k", f)).await });
    let first = lock_waiter(&killer, &g.schema).await;
    killer
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap();
    // The retry blocks again on the same row, from another backend.
    let second = loop {
        let pid = lock_waiter(&killer, &g.schema).await;
        if pid != first {
            break pid;
        }
        tokio::task::yield_now().await;
    };
    assert_ne!(first, second);
    tx.rollback().await.unwrap();
    let rc = receipt(pending.await.unwrap().unwrap());
    assert_eq!(record(&store, "k").await.receipt, Some(rc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_recovers_after_its_backends_are_terminated() {
    let (store, _clock, g) = common::store_at(&common::url(), "terminate").await;
    // Open several connections at once.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move { exec_fence(&s, &format!("pre-{i}")).await })
        })
        .collect();
    let mut fences = Vec::new();
    for t in tasks {
        fences.push(t.await.unwrap());
    }
    let side = common::side_client().await;
    let killed = common::terminate_store_backends(&side, &g.schema).await;
    assert!(!killed.is_empty());

    // Bounded wait for the first success (retries usually make it immediate).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = 0;
    loop {
        match store
            .execute(&acme(), claim("after-0", 1, binding("alice", 0)))
            .await
        {
            Ok(Reply::Claim(ClaimDecision::Execute(_))) => break,
            Ok(other) => panic!("{other:?}"),
            Err(_) => failures += 1,
        }
        assert!(Instant::now() < deadline, "the pool never recovered");
    }
    // From then on everything works, on new backends, with the old data.
    for i in 1..20 {
        exec_fence(&store, &format!("after-{i}")).await;
    }
    for (i, f) in fences.iter().enumerate() {
        receipt(
            store
                .execute(&acme(), settle_k(&format!("pre-{i}"), *f))
                .await
                .unwrap(),
        );
    }
    let now_pids = common::store_backends(&side, &g.schema).await;
    assert!(
        now_pids.iter().all(|p| !killed.contains(p)),
        "dead backends reused"
    );
    eprintln!("failures before recovery: {failures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_stores_on_one_database_agree() {
    // Two "servers" start at once on a fresh schema: migrations run once.
    let schema = common::unique_schema("multi");
    let _g = common::SchemaGuard::new(&common::url(), &schema);
    let clock = settle_ledger::Clock::system();
    let url = common::url();
    let (a, b) = tokio::join!(
        PgStore::connect(&url, common::options(&schema, clock.clone())),
        PgStore::connect(&url, common::options(&schema, clock.clone())),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let side = common::side_client().await;
    let versions: i64 = side
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".settle_schema_version"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(versions, settle_pg::SCHEMA_VERSION as i64);

    // Racing first claims through both: exactly one execute.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                s.execute(&acme(), claim("race", 1, binding("alice", 0)))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut executes = 0;
    for t in tasks {
        match t.await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(_)) => executes += 1,
            Reply::Claim(ClaimDecision::InFlight { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(executes, 1);

    // Fences keep increasing whichever store grants them.
    let mut last = Fence(0);
    for i in 0..20 {
        let s = if i % 2 == 0 { &a } else { &b };
        let f = exec_fence(s, &format!("f-{i}")).await;
        assert!(f > last);
        last = f;
    }
    // A revoke through one is seen by the other at once.
    let f = exec_fence(&a, "v").await;
    assert!(matches!(
        b.execute(&acme(), revoke("alice")).await.unwrap(),
        Reply::Revoked { generation: 1, .. }
    ));
    assert_eq!(
        a.execute(&acme(), settle_k("v", f)).await.unwrap(),
        Reply::Refused(RefusalCode::LeaseExpired)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_racing_settlements_never_settles_a_revoked_lease() {
    // Settlements race a revoke of their principal. Whatever the
    // interleaving, a `get` taken after the revoke returned shows every lease
    // it did not see settled as revoked, and no receipt from such a lease
    // appears later (the settlement would have been ordered after the revoke).
    let (store, _clock, _g) = common::store_at(&common::url(), "revokerace").await;
    let n = 40;
    let mut fences = Vec::new();
    for i in 0..n {
        fences.push(exec_fence(&store, &format!("r-{i}")).await);
    }
    let settles: Vec<_> = fences
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let s = store.clone();
            let f = *f;
            tokio::spawn(async move {
                s.execute(&acme(), settle_k(&format!("r-{i}"), f))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let rv = store.execute(&acme(), revoke("alice")).await.unwrap();
    assert!(matches!(rv, Reply::Revoked { generation: 1, .. }));
    let mut revoked_seen = Vec::new();
    for i in 0..n {
        let r = record(&store, &format!("r-{i}")).await;
        if r.receipt.is_none() {
            assert_eq!(r.lease().unwrap().ended.unwrap().reason, LeaseEnd::Revoked);
            revoked_seen.push(i);
        }
    }
    for (i, t) in settles.into_iter().enumerate() {
        let reply = t.await.unwrap();
        if revoked_seen.contains(&i) {
            assert_eq!(reply, Reply::Refused(RefusalCode::LeaseExpired), "key {i}");
        } else {
            assert!(matches!(reply, Reply::Receipt(_)), "key {i}: {reply:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_from_the_future_is_refused_and_counted() {
    let (store, clock, _g) = common::store_at(&common::url(), "future").await;
    clock.advance(3_600_000);
    let f = exec_fence(&store, "k").await;
    receipt(store.execute(&acme(), settle_k("k", f)).await.unwrap());
    // The store's clock falls back an hour: the receipt is dated in its future.
    clock.advance(-3_600_000);
    assert_eq!(
        store.get(&acme(), &key("k")).await.unwrap(),
        Err(RefusalCode::RecordRefused)
    );
    assert_eq!(
        store
            .execute(&acme(), claim("k", 1, binding("alice", 0)))
            .await
            .unwrap(),
        Reply::Refused(RefusalCode::RecordRefused)
    );
    assert_eq!(store.stats(1000).await.unwrap().refused, 1);
    // It stays stored: the sweep does not collect it either.
    store.sweep().await.unwrap();
    clock.advance(3_600_000);
    assert!(record(&store, "k").await.receipt.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_refused_counted_and_skipped_by_the_sweep() {
    unreadable_records(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_refused_without_group_commit() {
    unreadable_records(false).await;
}

/// A record that does not decode (an unknown format, or
/// garbage in the known one) is never treated as absent — every call on its
/// key is refused with `record_refused` — nothing is written over it, it is
/// counted, and the sweep skips it and goes on.
async fn unreadable_records(group: bool) {
    let (store, clock, g) =
        common::store_with(&common::url(), "corrupt", |o| o.group_commit = group).await;
    let side = common::side_client().await;
    // Three leases that will all be due: two get damaged, one stays healthy.
    let f_alien = exec_fence(&store, "alien").await;
    let f_garbled = exec_fence(&store, "garbled").await;
    exec_fence(&store, "healthy").await;
    side.execute(
        &format!(
            "UPDATE \"{}\".settle_records SET format = 99 WHERE key = 'alien'",
            g.schema
        ),
        &[],
    )
    .await
    .unwrap();
    side.execute(
        &format!(
            "UPDATE \"{}\".settle_records SET value = '\\xffffffff' WHERE key = 'garbled'",
            g.schema
        ),
        &[],
    )
    .await
    .unwrap();

    for (k, f) in [("alien", f_alien), ("garbled", f_garbled)] {
        assert_eq!(
            store.get(&acme(), &key(k)).await.unwrap(),
            Err(RefusalCode::RecordRefused),
            "{k}: get"
        );
        assert_eq!(
            store.execute(&acme(), settle_k(k, f)).await.unwrap(),
            Reply::Refused(RefusalCode::RecordRefused),
            "{k}: settle"
        );
        assert_eq!(
            store
                .execute(&acme(), claim(k, 1, binding("alice", 0)))
                .await
                .unwrap(),
            Reply::Refused(RefusalCode::RecordRefused),
            "{k}: a claim must not take the key as free"
        );
        assert_eq!(
            store
                .execute(&acme(), heartbeat(k, f, Some(5000)))
                .await
                .unwrap(),
            Reply::Refused(RefusalCode::RecordRefused),
            "{k}: heartbeat"
        );
    }
    assert_eq!(store.stats(1000).await.unwrap().undecodable, 2);

    // Every lease is past due: the sweep ends the healthy one and skips the two others.
    clock.advance(3_600_000);
    let report = store
        .sweep()
        .await
        .expect("the sweep goes on past unreadable records");
    assert_eq!(report.expired, 1);
    assert_eq!(record(&store, "healthy").await.status, Status::Unknown);
    assert_eq!(store.sweep().await.unwrap().expired, 0);

    // Nothing was written over them.
    let rows = side
        .query(
            &format!(
                "SELECT key, format, value FROM \"{}\".settle_records \
                 WHERE key IN ('alien', 'garbled') ORDER BY key",
                g.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i16>(1), 99);
    assert_eq!(rows[1].get::<_, Vec<u8>>(2), vec![0xff; 4]);

    // Repaired by an operator (here: deleted), it is no longer counted.
    side.execute(
        &format!(
            "DELETE FROM \"{}\".settle_records WHERE key IN ('alien', 'garbled')",
            g.schema
        ),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(store.stats(1000).await.unwrap().undecodable, 0);
}

/// The disputed gauge is counted from the store, so it
/// survives a restart of the server (a new store on the same schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disputed_gauge_is_counted_from_the_store() {
    disputed_gauge(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disputed_gauge_is_counted_without_group_commit() {
    disputed_gauge(false).await;
}

async fn disputed_gauge(group: bool) {
    let (store, _clock, g) =
        common::store_with(&common::url(), "disputed", |o| o.group_commit = group).await;
    for i in 0..2 {
        let k = format!("d-{i}");
        let f = exec_fence(&store, &k).await;
        receipt(store.execute(&acme(), settle_k(&k, f)).await.unwrap());
        assert_eq!(
            store
                .execute(&acme(), settle(&k, f, 1, binding("alice", 0), completed(2)))
                .await
                .unwrap(),
            Reply::Refused(RefusalCode::ResultMismatch)
        );
        assert!(record(&store, &k).await.disputed);
        assert_eq!(store.stats(1000).await.unwrap().disputed, i + 1);
    }
    let f = exec_fence(&store, "calm").await;
    receipt(store.execute(&acme(), settle_k("calm", f)).await.unwrap());
    store.close();
    let reopened = PgStore::connect(&common::url(), {
        let mut o = common::options(&g.schema, settle_ledger::Clock::system());
        o.group_commit = group;
        o
    })
    .await
    .unwrap();
    assert_eq!(reopened.stats(1000).await.unwrap().disputed, 2);
}

/// Migration 2 fills the new `disputed` column from the records already stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_2_backfills_the_disputed_column() {
    let (store, _clock, g) = common::store_at(&common::url(), "backfill").await;
    let f = exec_fence(&store, "d").await;
    receipt(store.execute(&acme(), settle_k("d", f)).await.unwrap());
    store
        .execute(
            &acme(),
            settle("d", f, 1, binding("alice", 0), completed(2)),
        )
        .await
        .unwrap();
    let f = exec_fence(&store, "calm").await;
    receipt(store.execute(&acme(), settle_k("calm", f)).await.unwrap());
    exec_fence(&store, "open").await;
    store.close();
    // Back to the shape of version 1.
    let side = common::side_client().await;
    side.batch_execute(&format!(
        "DROP TABLE \"{s}\".settle_commits; \
         ALTER TABLE \"{s}\".settle_records DROP COLUMN disputed; \
         ALTER TABLE \"{s}\".settle_principals DROP COLUMN moves; \
         DELETE FROM \"{s}\".settle_schema_version WHERE version = 2;",
        s = g.schema
    ))
    .await
    .unwrap();
    let reopened = PgStore::connect(
        &common::url(),
        common::options(&g.schema, settle_ledger::Clock::system()),
    )
    .await
    .unwrap();
    assert_eq!(reopened.stats(1000).await.unwrap().disputed, 1);
    let flags: Vec<(String, Option<bool>)> = side
        .query(
            &format!(
                "SELECT key, disputed FROM \"{}\".settle_records ORDER BY key",
                g.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        flags,
        vec![
            ("calm".to_string(), Some(false)),
            ("d".to_string(), Some(true)),
            ("open".to_string(), Some(false))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_changed_under_a_batch_is_never_overwritten() {
    // Group commit reads without row locks and writes compare-and-set on
    // xmin. Change the row between the batch's read and its write: the
    // batch must notice, write nothing, and rerun the command on the
    // locking path, which then sees the change (here: an unreadable row,
    // so the caller is refused instead of getting a receipt over it).
    let (store, _clock, g) = common::store_at(&common::url(), "cas").await;
    let f = exec_fence(&store, "k").await;
    let mut side = common::side_client().await;
    let watcher = common::side_client().await;
    let tx = side.transaction().await.unwrap();
    let n = tx
        .execute(
            &format!(
                "UPDATE \"{}\".settle_records SET format = 99 WHERE tenant = 'acme' AND key = 'k'",
                g.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let s2 = store.clone();
    let pending = tokio::spawn(async move { s2.execute(&acme(), settle_k("k", f)).await });
    // The batch read the old row (a plain read does not wait) and now waits
    // to write it.
    lock_waiter(&watcher, &g.schema).await;
    tx.commit().await.unwrap();
    let r = pending.await.unwrap();
    assert_eq!(r.unwrap(), Reply::Refused(RefusalCode::RecordRefused));
    let format: i16 = watcher
        .query_one(
            &format!("SELECT format FROM \"{}\".settle_records", g.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(format, 99, "the batch wrote over a row that changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_racing_on_shared_keys_keep_every_invariant() {
    // Two stores (as two servers) with group commit race claims and
    // settlements on the same keys: batches of both write the same rows,
    // so compare-and-set conflicts and the locking fallback are exercised.
    let schema = common::unique_schema("race2");
    let _g = common::SchemaGuard::new(&common::url(), &schema);
    let clock = settle_ledger::Clock::system();
    let url = common::url();
    let a = PgStore::connect(&url, common::options(&schema, clock.clone()))
        .await
        .unwrap();
    let b = PgStore::connect(&url, common::options(&schema, clock.clone()))
        .await
        .unwrap();
    let keys = 12;
    let per_key = 6;
    let mut tasks = Vec::new();
    for k in 0..keys {
        for w in 0..per_key {
            let s = if w % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                let key = format!("shared-{k}");
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    assert!(Instant::now() < deadline, "{key} never settled");
                    match s
                        .execute(&acme(), claim(&key, 1, binding("alice", 0)))
                        .await
                        .unwrap()
                    {
                        Reply::Claim(ClaimDecision::Execute(g)) => {
                            let rc =
                                receipt(s.execute(&acme(), settle_k(&key, g.fence)).await.unwrap());
                            return (key, Some(g.fence), rc);
                        }
                        Reply::Claim(ClaimDecision::Replay { receipt, .. }) => {
                            return (key, None, receipt);
                        }
                        Reply::Claim(ClaimDecision::InFlight { .. }) => {
                            tokio::task::yield_now().await;
                        }
                        other => panic!("{key}: {other:?}"),
                    }
                }
            }));
        }
    }
    let mut by_key: std::collections::HashMap<String, Vec<(Option<Fence>, Receipt)>> =
        std::collections::HashMap::new();
    for t in tasks {
        let (k, f, rc) = t.await.unwrap();
        by_key.entry(k).or_default().push((f, rc));
    }
    let mut fences = std::collections::HashSet::new();
    for (k, results) in by_key {
        let executes: Vec<Fence> = results.iter().filter_map(|(f, _)| *f).collect();
        assert_eq!(executes.len(), 1, "{k}: exactly one execute");
        assert!(fences.insert(executes[0]), "fence {:?} reused", executes[0]);
        let canonical = &results.iter().find(|(f, _)| f.is_some()).unwrap().1;
        for (_, rc) in &results {
            assert_eq!(rc, canonical, "{k}: every caller learns the one outcome");
        }
        let rec = record(&a, &k).await;
        assert_eq!(rec.receipt.as_ref(), Some(canonical));
        assert_eq!(rec.attempts.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_breaking_an_invariant_is_refused_and_group_commit_goes_on() {
    let (store, _clock, g) = common::store_at(&common::url(), "panicky").await;
    let f = exec_fence(&store, "k").await;
    assert!(matches!(
        store.execute(&acme(), settle_k("k", f)).await.unwrap(),
        Reply::Receipt(_)
    ));
    // A record that decodes but breaks an invariant (settled without a
    // receipt). The rules refuse it as `record_refused` before any of
    // their production assertions could panic on it, and the batch goes
    // on either way.
    let mut broken = record(&store, "k").await;
    broken.receipt = None;
    let bytes = postcard::to_allocvec(&broken).unwrap();
    let side = common::side_client().await;
    side.execute(
        &format!("UPDATE \"{}\".settle_records SET value = $1", g.schema),
        &[&bytes],
    )
    .await
    .unwrap();
    let r = store
        .execute(&acme(), claim("k", 1, binding("alice", 0)))
        .await;
    assert!(
        matches!(r, Ok(Reply::Refused(RefusalCode::RecordRefused))),
        "{r:?}"
    );
    // The worker survived: other claims and settlements still go through
    // (a dead worker would leave them waiting forever, hence the deadline).
    let after = async {
        for i in 0..3 {
            let k = format!("after-{i}");
            let f = exec_fence(&store, &k).await;
            assert!(matches!(
                store.execute(&acme(), settle_k(&k, f)).await.unwrap(),
                Reply::Receipt(_)
            ));
        }
    };
    tokio::time::timeout(Duration::from_secs(20), after)
        .await
        .expect("group commit stopped after a panic");
}

/// The network goes silent in the middle of a transaction
/// (the COMMIT is swallowed; nothing is closed). The call must come back
/// (client-side deadline), and the silent session must not keep its locks
/// (the server ends it after `idle_in_transaction_timeout`): the token then
/// shows the transaction did not commit, the command runs again and settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_before_commit_neither_hangs_nor_keeps_its_locks() {
    silent(true, Cut::SilentBeforeCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_before_commit_without_group_commit() {
    silent(false, Cut::SilentBeforeCommit).await;
}

/// The COMMIT got through and committed, then the network went silent: the
/// call comes back at its deadline, and the token shows it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_after_commit_is_resolved_as_committed() {
    silent(true, Cut::SilentAfterCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_after_commit_without_group_commit() {
    silent(false, Cut::SilentAfterCommit).await;
}

async fn silent(group: bool, cut: Cut) {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let (store, _clock, _g) = common::store_with(&proxy.url(&common::url()), "silent", |o| {
        o.group_commit = group;
        o.client_timeout = Duration::from_millis(1000);
        o.idle_in_transaction_timeout = Duration::from_millis(1000);
        o.in_doubt_timeout = Duration::from_secs(10);
    })
    .await;
    let f = exec_fence(&store, "k").await;
    proxy.arm(cut);
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        store.execute(&acme(), settle_k("k", f)),
    )
    .await
    .expect("a silent connection stalled the call");
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    let rc = receipt(r.unwrap());
    let rec = record(&store, "k").await;
    assert_eq!(rec.receipt, Some(rc));
    assert_eq!(rec.attempts[0].observations.len(), 1, "settled once");
    let d = store.in_doubt();
    match cut {
        Cut::SilentAfterCommit => assert_eq!((d.committed, d.not_committed), (1, 0)),
        _ => assert_eq!((d.committed, d.not_committed), (0, 1)),
    }
    eprintln!(
        "{cut:?} (group {group}): answered after {:?}",
        started.elapsed()
    );
    proxy.release();
}

/// A row lock held elsewhere (a stuck session) makes a
/// command fail after `lock_timeout`, or after `statement_timeout` when that
/// is shorter, instead of waiting for as long as the lock is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_fails_the_command_after_the_configured_timeouts() {
    for group in [true, false] {
        let (store, _clock, g) = common::store_with(&common::url(), "locktimeout", |o| {
            o.group_commit = group;
            o.lock_timeout = Duration::from_millis(300);
            o.max_retries = 1;
        })
        .await;
        let by_statement = PgStore::connect(&common::url(), {
            let mut o = common::options(&g.schema, settle_ledger::Clock::system());
            o.group_commit = group;
            o.lock_timeout = Duration::from_secs(60);
            o.statement_timeout = Duration::from_millis(300);
            o.max_retries = 0;
            o
        })
        .await
        .unwrap();
        let f = exec_fence(&store, "k").await;
        let mut side = common::side_client().await;
        let tx = block_row(&mut side, &g.schema, "k").await;
        for (s, what) in [
            (&store, "lock timeout"),
            (&by_statement, "statement timeout"),
        ] {
            let r = tokio::time::timeout(
                Duration::from_secs(20),
                s.execute(&acme(), settle_k("k", f)),
            )
            .await
            .expect("the command waited for the lock");
            assert!(
                matches!(&r, Err(StoreError::Database(m)) if m.contains(what)),
                "group {group}: {r:?}"
            );
        }
        tx.rollback().await.unwrap();
        receipt(store.execute(&acme(), settle_k("k", f)).await.unwrap());
    }
}

/// In-doubt checks have a reserved connection. Here every
/// pooled connection is busy (one command waits for a lock, another queues
/// for the pool) when a COMMIT's answer is lost: the check still answers at
/// once, instead of queueing behind them until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_doubt_checks_do_not_queue_behind_the_pool() {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let (store, _clock, g) = common::store_with(&proxy.url(&common::url()), "reserved", |o| {
        o.group_commit = false;
        o.pool_size = 2;
        o.lock_timeout = Duration::from_secs(60);
        o.statement_timeout = Duration::from_secs(60);
        o.client_timeout = Duration::from_secs(60);
        o.in_doubt_timeout = Duration::from_secs(3);
    })
    .await;
    let fa = exec_fence(&store, "a").await;
    let fb = exec_fence(&store, "b").await;
    let mut side = common::side_client().await;
    let watcher = common::side_client().await;
    let tx = block_row(&mut side, &g.schema, "b").await;
    // Connection 1: waits for the lock on b.
    let s = store.clone();
    let blocked = tokio::spawn(async move { s.execute(&acme(), settle_k("b", fb)).await });
    lock_waiter(&watcher, &g.schema).await;
    // Connection 2: a's COMMIT goes through, its answer never comes back.
    proxy.arm(Cut::SilentAfterCommit);
    let s = store.clone();
    let lost = tokio::spawn(async move { s.execute(&acme(), settle_k("a", fa)).await });
    // Committed on the server (closing the proxy's sockets before the
    // server read the COMMIT would lose it: then it did not commit).
    let settled = format!(
        "SELECT 1 FROM \"{}\".settle_records WHERE key = 'a' AND status >= 3",
        g.schema
    );
    let t0 = Instant::now();
    while watcher.query_opt(&settled, &[]).await.unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "a never committed");
        tokio::task::yield_now().await;
    }
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    // More commands queue for the pool (each will wait for b's lock too).
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.execute(&acme(), heartbeat("b", fb, Some(5000))).await })
        })
        .collect();
    let t0 = Instant::now();
    while store.pool().status().waiting < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            store.pool().status()
        );
        tokio::task::yield_now().await;
    }
    // Now the answer is lost for good: a's connection closes.
    proxy.release();
    let answer = tokio::time::timeout(Duration::from_secs(20), lost)
        .await
        .expect("answered")
        .unwrap()
        .expect("resolved through the reserved connection");
    // Only now is the pool free again.
    tx.rollback().await.unwrap();
    receipt(blocked.await.unwrap().unwrap());
    for q in queued {
        q.await.unwrap().unwrap();
    }
    assert_eq!(record(&store, "a").await.receipt, Some(receipt(answer)));
    assert_eq!(store.in_doubt().committed, 1);
}

/// The group-commit queue is bounded. With its worker
/// stuck (its batch waits for a row lock), calls beyond the bound answer
/// `Overloaded` at once, with a retry hint, instead of queueing without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_group_commit_queue_answers_overloaded() {
    let (store, _clock, g) = common::store_with(&common::url(), "queue", |o| {
        o.group_commit_queue = 4;
        o.max_batch = 1;
        o.lock_timeout = Duration::from_secs(60);
        o.statement_timeout = Duration::from_secs(60);
    })
    .await;
    let f = exec_fence(&store, "k").await;
    let mut side = common::side_client().await;
    let watcher = common::side_client().await;
    let tx = block_row(&mut side, &g.schema, "k").await;
    let s = store.clone();
    let stuck = tokio::spawn(async move { s.execute(&acme(), settle_k("k", f)).await });
    lock_waiter(&watcher, &g.schema).await;
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move {
                s.execute(&acme(), claim(&format!("q-{i}"), 1, binding("alice", 0)))
                    .await
            })
        })
        .collect();
    // The overloaded ones come back while the worker is still stuck.
    tokio::time::sleep(Duration::from_millis(0)).await;
    let mut overloaded = 0;
    let mut waiting = Vec::new();
    for c in calls {
        if c.is_finished() {
            match c.await.unwrap() {
                Err(StoreError::Overloaded { retry_after_ms }) => {
                    assert!((10..=5000).contains(&retry_after_ms));
                    overloaded += 1;
                }
                other => panic!("{other:?}"),
            }
        } else {
            waiting.push(c);
        }
    }
    // Not finished yet: they may still be on their way to the queue.
    let mut queued = 0;
    tx.rollback().await.unwrap();
    receipt(stuck.await.unwrap().unwrap());
    for c in waiting {
        match c.await.unwrap() {
            Err(StoreError::Overloaded { .. }) => overloaded += 1,
            Ok(Reply::Claim(ClaimDecision::Execute(_))) => queued += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((queued, overloaded), (4, 16));
}

/// Readiness is asked on a reserved connection: a pool whose every
/// connection is busy (here: waiting for a lock) is overloaded, not unready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_every_pooled_connection_is_busy() {
    let (store, _clock, g) = common::store_with(&common::url(), "health", |o| {
        o.group_commit = false;
        o.pool_size = 1;
        o.lock_timeout = Duration::from_secs(60);
        o.statement_timeout = Duration::from_secs(60);
        o.client_timeout = Duration::from_secs(60);
    })
    .await;
    let f = exec_fence(&store, "k").await;
    let mut side = common::side_client().await;
    let watcher = common::side_client().await;
    let tx = block_row(&mut side, &g.schema, "k").await;
    let s = store.clone();
    let blocked = tokio::spawn(async move { s.execute(&acme(), settle_k("k", f)).await });
    lock_waiter(&watcher, &g.schema).await;
    tokio::time::timeout(Duration::from_secs(10), store.health())
        .await
        .expect("health waited for the busy pool")
        .expect("ready");
    tx.rollback().await.unwrap();
    receipt(blocked.await.unwrap().unwrap());
}
