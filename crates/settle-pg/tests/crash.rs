//! PostgreSQL itself failing, on throwaway clusters (never the shared one on
//! 5432): `pg_ctl stop -m immediate`, kill -9 of a backend (the postmaster
//! then restarts every backend and replays the WAL), kill -9 of the
//! postmaster, and a clean restart, each under load through a store with
//! group commit and one without; the transaction ids PostgreSQL hands out
//! again after a crash; durability the server or a pooler would turn off.
//!
//! The invariant: every grant and receipt the store returned is in the
//! database afterwards (errors are allowed, wrong answers are not).
//!
//! Short by default (one fault of each kind). `SETTLE_PG_CRASH_CYCLES=N`
//! repeats each fault N times (docs/postgres.md has measured figures).
#![allow(clippy::print_stderr)] // crash tests report what they observed

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, kill9, tools_or_skip};
use common::proxy::{Cut, Proxy};
use common::{acme, exec_fence};
use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::crash::{Acked, Load, Workload};
use settle_ledger::{Store, StoreError};
use settle_pg::PgStore;

fn cycles() -> usize {
    std::env::var("SETTLE_PG_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn options(o: &mut settle_pg::PgOptions, group: bool) {
    o.group_commit = group;
    o.client_timeout = Duration::from_secs(5);
    o.in_doubt_timeout = Duration::from_secs(10);
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `pg_ctl stop -m immediate`, then start.
    StopImmediate,
    /// kill -9 of one of the stores' backends: the postmaster ends every
    /// backend and replays the WAL (its start time does not change).
    KillBackend,
    /// kill -9 of the postmaster, then start.
    KillPostmaster,
    /// `pg_ctl restart -m fast`.
    Restart,
}

async fn inject(cluster: &Arc<Cluster>, fault: Fault, schemas: &[String]) {
    match fault {
        Fault::KillBackend => {
            let side = cluster.client().await.unwrap();
            let pid: i32 = side
                .query_one(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1) \
                     ORDER BY state = 'active' DESC, random() LIMIT 1",
                    &[&schemas],
                )
                .await
                .unwrap()
                .get(0);
            kill9(pid);
        }
        other => {
            let c = cluster.clone();
            tokio::task::spawn_blocking(move || match other {
                Fault::StopImmediate => {
                    c.stop("immediate");
                    c.start();
                }
                Fault::KillPostmaster => {
                    c.kill9_postmaster();
                    c.start();
                }
                Fault::Restart => c.restart("fast"),
                Fault::KillBackend => unreachable!(),
            })
            .await
            .unwrap();
        }
    }
    cluster.wait_ready().await;
}

/// How long the load may take to make progress.
const PATIENCE: Duration = Duration::from_secs(90);

async fn fault_under_load(name: &str, fault: Fault) {
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let cluster = Arc::new(tokio::task::block_in_place(|| {
        Cluster::create(&pg, name, &[])
    }));
    let url = cluster.url();
    let schemas = vec![format!("{name}_g"), format!("{name}_s")];
    let grouped = Arc::new(common::store_on(&url, &schemas[0], |o| options(o, true)).await);
    let single = Arc::new(common::store_on(&url, &schemas[1], |o| options(o, false)).await);
    // The stores recover on their own: the clients go on after an error.
    let pause = Duration::from_millis(20);
    let wg = Workload::new(acme(), "alice", "g", 6).retrying(pause);
    let ws = Workload::new(acme(), "alice", "s", 4).retrying(pause);
    let (acked_g, acked_s) = (Arc::new(Acked::new()), Arc::new(Acked::new()));
    let load_g = Load::start(grouped.clone(), &wg, acked_g.clone());
    let load_s = Load::start(single.clone(), &ws, acked_s.clone());
    let started = Instant::now();
    let n = cycles();
    for i in 0..n {
        acked_g.progress(50, PATIENCE, "before the fault").await;
        acked_s.progress(20, PATIENCE, "before the fault").await;
        inject(&cluster, fault, &schemas).await;
        // Back: both stores recover on their own.
        let after = format!("after {fault:?} #{i}");
        acked_g.progress(50, PATIENCE, &after).await;
        acked_s.progress(20, PATIENCE, &after).await;
    }
    load_g.finish().await;
    load_s.finish().await;
    let vg = acked_g.verify(&*grouped, &acme(), name).await;
    let vs = acked_s.verify(&*single, &acme(), name).await;
    // Fences go on increasing past every one handed out before the faults
    // (each schema has its own sequence).
    acked_g.fences_go_on(&*grouped, &wg, "after", name).await;
    acked_s.fences_go_on(&*single, &ws, "after", name).await;
    let (dg, ds) = (grouped.in_doubt(), single.in_doubt());
    let (fg, fs) = (acked_g.failed_claims(), acked_s.failed_claims());
    eprintln!(
        "{name}: {n} x {fault:?} in {:.1} s; receipts checked {} (group {}, single {}), \
         grants without receipt {} ({}/{}), failed claims {} ({fg}/{fs}); \
         in-doubt commits: {} committed, {} not committed, {} unresolved",
        started.elapsed().as_secs_f64(),
        vg.receipts + vs.receipts,
        vg.receipts,
        vs.receipts,
        vg.grants + vs.grants,
        vg.grants,
        vs.grants,
        fg + fs,
        dg.committed + ds.committed,
        dg.not_committed + ds.not_committed,
        dg.unresolved + ds.unresolved,
    );
    grouped.close();
    single.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_stop_under_load_loses_no_acknowledged_receipt() {
    fault_under_load("immediate", Fault::StopImmediate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_backend_under_load_loses_no_acknowledged_receipt() {
    fault_under_load("killbackend", Fault::KillBackend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_postmaster_under_load_loses_no_acknowledged_receipt() {
    fault_under_load("killpostmaster", Fault::KillPostmaster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_under_load_loses_no_acknowledged_receipt() {
    fault_under_load("restart", Fault::Restart).await;
}

/// PostgreSQL crashes while a settlement's COMMIT is held
/// back (it never reached the server), before anything made its
/// transaction id durable. After the restart that id is handed out again
/// to other transactions, which commit (checked: the burned ids reach it,
/// and `pg_xact_status` of it then answers, no longer "in the future").
/// A store that resolves the lost COMMIT by transaction id returns a
/// receipt for a settlement that never happened (both paths once did);
/// with commit tokens the settlement is known not to
/// have committed, runs again, and the receipt returned is the one in the
/// database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_transaction_id_never_confirms_a_lost_commit() {
    xid_reuse("xidreuse_s", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_transaction_id_never_confirms_a_lost_batch_commit() {
    xid_reuse("xidreuse_g", true).await;
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
async fn xid_reuse(name: &str, group: bool) {
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    // Nothing may write the WAL out behind the test's back: no WAL writer
    // rounds, background writer, autovacuum or checkpoint during the test.
    let cluster = Arc::new(tokio::task::block_in_place(|| {
        Cluster::create(
            &pg,
            name,
            &[
                "wal_writer_delay = '10s'",
                "bgwriter_lru_maxpages = 0",
                "autovacuum = off",
                "checkpoint_timeout = '1h'",
            ],
        )
    }));
    let proxy = Proxy::start(&cluster.addr()).await;
    let store = common::store_on(&proxy.url(&cluster.url()), name, |o| {
        o.group_commit = group;
        o.in_doubt_timeout = Duration::from_secs(30);
        o.client_timeout = Duration::from_secs(30);
    })
    .await;
    let f = exec_fence(&store, "k").await;

    proxy.arm(Cut::HoldCommit);
    let s2 = store.clone();
    let pending = tokio::spawn(async move {
        s2.execute(
            &acme(),
            settle("k", f, 1, binding("alice", 0), completed(1)),
        )
        .await
    });
    // The settlement's transaction waits for its COMMIT, which the proxy holds.
    let side = cluster.client().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let xid: Option<i64> = loop {
        let rows = side
            .query(
                "SELECT backend_xid::text::int8 FROM pg_stat_activity \
                 WHERE application_name = $1 AND state = 'idle in transaction'",
                &[&name],
            )
            .await
            .unwrap();
        if proxy.cuts.load(Ordering::SeqCst) == 1
            && let Some(r) = rows.first()
        {
            break r.get(0);
        }
        assert!(Instant::now() < deadline, "the COMMIT was never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    drop(side);

    // Crash: the transaction's WAL (if any) was still in memory.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        c.stop("immediate");
        c.start();
    })
    .await
    .unwrap();
    let side = cluster.wait_ready().await;
    match xid {
        Some(x) => {
            // Hand the lost id out again, to transactions that commit.
            let mut burned = 0;
            loop {
                let next: i64 = side
                    .query_one("SELECT pg_current_xact_id()::text::int8", &[])
                    .await
                    .unwrap()
                    .get(0);
                burned += 1;
                if next >= x {
                    break;
                }
                assert!(burned < 10_000, "xid {x} is far ahead of {next}");
            }
            // Reused: no longer "in the future" (22023). Usually by one of
            // the transactions above, which committed; it can also be the
            // store's own retry, once the token showed the settlement had
            // not committed.
            let deadline = Instant::now() + Duration::from_secs(20);
            let status = loop {
                let status: String = side
                    .query_one("SELECT pg_xact_status($1::text::xid8)", &[&x.to_string()])
                    .await
                    .expect("transaction id {x} reused")
                    .get(0);
                if status != "in progress" {
                    break status;
                }
                assert!(Instant::now() < deadline, "xid {x} stays in progress");
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            eprintln!(
                "{name}: xid {x} lost in the crash, reused after {burned} transactions: {status}"
            );
        }
        None => {
            // This transaction had no id yet (group commit takes one only
            // when it writes): other transactions commit anyway.
            for _ in 0..20 {
                side.query_one("SELECT pg_current_xact_id()::text::int8", &[])
                    .await
                    .unwrap();
            }
            eprintln!("{name}: the held transaction had no id yet");
        }
    }

    let reply = tokio::time::timeout(Duration::from_secs(60), pending)
        .await
        .expect("the settlement got an answer")
        .unwrap();
    let rec = store
        .get(&acme(), &key("k"))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match reply {
        Ok(Reply::Receipt(rc)) => {
            assert_eq!(
                rec.receipt.as_ref(),
                Some(&rc),
                "a receipt was returned for a settlement that is not in the database"
            );
            assert_eq!(rec.attempts[0].observations.len(), 1, "settled once");
        }
        // Not resolved in time: an error, never a receipt. (Not expected:
        // the token shows the commit did not happen, and the retry settles.)
        other => panic!("expected the retried settlement's receipt, got {other:?}"),
    }
    store.close();
}

/// A server running with `fsync=off` is refused: at
/// connect, and — if it is switched off while the store runs — on every
/// transaction (nothing is written) and by `health`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_fsync_is_refused() {
    let name = "nofsync";
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let cluster = tokio::task::block_in_place(|| Cluster::create(&pg, name, &["fsync = off"]));
    let err = PgStore::connect(&cluster.url(), common::options(name, Default::default()))
        .await
        .err()
        .expect("a store on a server without fsync");
    assert!(err.to_string().contains("fsync"), "{err}");

    // Turned off while serving.
    let side = cluster.client().await.unwrap();
    set_fsync(&side, "on").await;
    let url = cluster.url();
    let store =
        wait_for(|| PgStore::connect(&url, common::options(name, Default::default()))).await;
    let f = exec_fence(&store, "k").await;
    let single = common::store_on(&cluster.url(), name, |o| o.group_commit = false).await;
    store.health().await.expect("healthy with fsync on");
    set_fsync(&side, "off").await;
    // The reload reaches the backends between two statements; once the
    // health check's backend has it, the postmaster has signalled them all.
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.health().await.is_ok() {
        assert!(Instant::now() < deadline, "health ignored fsync=off");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = store.health().await.unwrap_err();
    assert!(e.to_string().contains("fsync"), "{e}");
    for group in [true, false] {
        let s = if group { &store } else { &single };
        let r = s
            .execute(
                &acme(),
                settle("k", f, 1, binding("alice", 0), completed(1)),
            )
            .await;
        assert!(
            matches!(&r, Err(StoreError::Database(m)) if m.contains("fsync")),
            "group {group}: {r:?}"
        );
    }
    set_fsync(&side, "on").await;
    let (t, k) = (acme(), key("k"));
    let rec = wait_for(|| store.get(&t, &k)).await.unwrap().unwrap();
    assert!(rec.receipt.is_none(), "nothing was written without fsync");

    // Unreachable: not ready.
    wait_for(|| store.health()).await;
    tokio::task::block_in_place(|| cluster.stop("immediate"));
    let e = store.health().await.expect_err("ready without a database");
    eprintln!("health without a database: {e}");
}

async fn set_fsync(side: &tokio_postgres::Client, value: &str) {
    side.batch_execute(&format!("ALTER SYSTEM SET fsync = {value}"))
        .await
        .unwrap();
    side.batch_execute("SELECT pg_reload_conf()").await.unwrap();
}

/// Retries `f` until it succeeds (bounded).
async fn wait_for<T, E: std::fmt::Debug, Fut: std::future::Future<Output = Result<T, E>>>(
    f: impl Fn() -> Fut,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `synchronous_commit=on` is set in every transaction, so
/// a pooler that drops the startup options cannot weaken it. The server
/// here defaults to `synchronous_commit=local` and names a synchronous
/// standby that does not exist: a commit that really runs with `on` waits
/// for it (the caller gets an error, in doubt), one with `local` returns at
/// once — a receipt on one machine only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_cannot_drop_synchronous_commit() {
    let name = "syncpooler";
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let cluster = tokio::task::block_in_place(|| {
        Cluster::create(
            &pg,
            name,
            &[
                "synchronous_commit = local",
                "synchronous_standby_names = 'nobody_here'",
            ],
        )
    });
    let pooler = Proxy::start_with(&cluster.addr(), true).await;
    for group in [true, false] {
        let schema = format!("{name}_{group}");
        let store = common::store_on(&pooler.url(&cluster.url()), &schema, |o| {
            o.group_commit = group;
            o.max_retries = 0;
            o.client_timeout = Duration::from_millis(1500);
            o.in_doubt_timeout = Duration::from_millis(1500);
        })
        .await;
        let r = store
            .execute(&acme(), claim("k", 1, binding("alice", 0)))
            .await;
        assert!(
            matches!(r, Err(StoreError::InDoubt(_))),
            "group {group}: a grant without the standby's acknowledgement: {r:?}"
        );
        store.close();
    }
}

/// Waits until a backend of `application_name` waits for a synchronous
/// standby (its COMMIT is flushed locally); returns its pid.
async fn syncrep_waiter(side: &tokio_postgres::Client, application_name: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = side
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event = 'SyncRep'",
                &[&application_name],
            )
            .await
            .unwrap();
        if let Some(r) = rows.first() {
            return r.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no COMMIT waited for the standby"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// From now on every commit of `cluster` waits for a standby that never
/// answers (a restart, not a reload, so that it surely is in force; stores
/// reconnect on their own). Returns a client beside the stores.
async fn require_an_absent_standby(cluster: &Cluster) -> tokio_postgres::Client {
    tokio::task::block_in_place(|| {
        cluster.append_conf(&["synchronous_standby_names = 'nobody_here'".to_string()]);
        cluster.restart("fast");
    });
    cluster.wait_ready().await
}

/// Cancels (`pg_cancel_backend`) the wait for the standby of the COMMIT of
/// `pending`, sent by the store whose application name is `application_name`,
/// and returns what the store answered.
async fn cancel_the_wait<T>(
    side: &tokio_postgres::Client,
    application_name: &str,
    pending: tokio::task::JoinHandle<T>,
) -> T {
    let pid = syncrep_waiter(side, application_name).await;
    side.execute("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("answered")
        .unwrap()
}

/// A COMMIT waiting for a synchronous standby that does
/// not answer is never turned into a reply. PostgreSQL ends such a wait
/// with success and a WARNING ("committed locally, might not have been
/// replicated") when the backend is cancelled (`pg_cancel_backend`): that
/// WARNING closes settle's connection, so the commit is in doubt, not
/// acknowledged. The statement timeout (shorter here than the wait) does
/// not cut the wait short: PostgreSQL disables it before committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_waiting_for_the_standby_is_never_acknowledged_early() {
    let name = "syncwait";
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let cluster = tokio::task::block_in_place(|| Cluster::create(&pg, name, &[]));
    let timeout_name = format!("{name}_timeout");
    let store = common::store_on(&cluster.url(), &timeout_name, |o| {
        o.group_commit = false;
        o.max_retries = 2;
        o.statement_timeout = Duration::from_millis(200);
        o.client_timeout = Duration::from_secs(3);
        o.in_doubt_timeout = Duration::from_secs(1);
    })
    .await;
    let cancel_name = format!("{name}_cancel");
    let cancelled = common::store_on(&cluster.url(), &cancel_name, |o| {
        o.group_commit = false;
        o.max_retries = 2;
        o.in_doubt_timeout = Duration::from_secs(1);
    })
    .await;
    let side = require_an_absent_standby(&cluster).await;

    // A statement timeout far shorter than the wait: the COMMIT goes on waiting.
    let s = store.clone();
    let pending =
        tokio::spawn(async move { s.execute(&acme(), claim("k", 1, binding("alice", 0))).await });
    let pid = syncrep_waiter(&side, &timeout_name).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        syncrep_waiter(&side, &timeout_name).await,
        pid,
        "the COMMIT stopped waiting for the standby after the statement timeout"
    );
    let r = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("answered")
        .unwrap();
    assert!(matches!(r, Err(StoreError::InDoubt(_))), "{r:?}");

    // The wait cancelled from outside: success plus a WARNING on the wire.
    let s = cancelled.clone();
    let pending =
        tokio::spawn(async move { s.execute(&acme(), claim("k", 1, binding("alice", 0))).await });
    let r = cancel_the_wait(&side, &cancel_name, pending).await;
    assert!(
        matches!(r, Err(StoreError::InDoubt(_))),
        "a grant the standby never acknowledged: {r:?}"
    );
}

/// A replay is never answered from a commit that the synchronous standby
/// has not confirmed (issue 50's suspicion, real before the fix). A
/// settlement's wait for the standby is cancelled: PostgreSQL keeps the
/// commit "locally" and shows it to every later reader, though a failover
/// to the standby would lose it. The settling store answers `InDoubt`; a
/// claim or a repeated settlement of the same key on another store (per
/// command, and through group commit) read the completed record — and used
/// to answer it as a replay at once. Now such an answer waits until a
/// commit after it is confirmed by the standby, here never: an error, not
/// a receipt. Once no standby is required, the replay is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_never_answered_from_a_commit_the_standby_has_not_confirmed() {
    let name = "replaysync";
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let cluster = tokio::task::block_in_place(|| Cluster::create(&pg, name, &[]));
    let quick = |o: &mut settle_pg::PgOptions| {
        o.max_retries = 1;
        o.client_timeout = Duration::from_secs(2);
        o.in_doubt_timeout = Duration::from_secs(1);
    };
    let writer = common::store_on(&cluster.url(), name, |o| {
        quick(o);
        o.group_commit = false;
    })
    .await;
    let b = || binding("alice", 0);
    let fence = exec_fence(&writer, "k").await;
    let side = require_an_absent_standby(&cluster).await;
    let w = writer.clone();
    let pending = tokio::spawn(async move {
        w.execute(&acme(), settle("k", fence, 1, b(), completed(1)))
            .await
    });
    let r = cancel_the_wait(&side, name, pending).await;
    assert!(matches!(r, Err(StoreError::InDoubt(_))), "{r:?}");
    // The completed record is visible on the primary, unconfirmed.
    let visible: i64 = side
        .query_one(
            &format!("SELECT count(*) FROM {name}.settle_records WHERE receipt_at IS NOT NULL"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(visible, 1, "the cancelled wait left the commit visible");

    for group in [false, true] {
        let reader = common::store_on(&cluster.url(), name, |o| {
            quick(o);
            o.group_commit = group;
        })
        .await;
        for cmd in [claim("k", 1, b()), settle("k", fence, 1, b(), completed(1))] {
            let r = tokio::time::timeout(Duration::from_secs(60), reader.execute(&acme(), cmd))
                .await
                .expect("answered");
            assert!(
                r.is_err(),
                "group commit {group}: answered from a commit the standby never confirmed: {r:?}"
            );
        }
    }

    tokio::task::block_in_place(|| {
        cluster.append_conf(&["synchronous_standby_names = ''".to_string()]);
        cluster.restart("fast");
    });
    cluster.wait_ready().await;
    let r = writer.execute(&acme(), claim("k", 1, b())).await.unwrap();
    assert!(
        matches!(r, Reply::Claim(ClaimDecision::Replay { .. })),
        "without a standby to wait for, the replay is answered: {r:?}"
    );
}

/// An in-doubt COMMIT is never decided against another
/// cluster. The settlement commits on A and its answer is lost; by then the
/// address leads to B, another cluster (its own system identifier) that
/// has the same schema but not the commit token. Deciding there would say
/// "not committed" and run the settlement again on the wrong database: the
/// store answers `InDoubt` instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_commit_is_never_decided_on_another_cluster() {
    let name = "othercluster";
    let Some(pg) = tools_or_skip(name) else {
        return;
    };
    let (a, b) = tokio::task::block_in_place(|| {
        (
            Cluster::create(&pg, "cluster_a", &[]),
            Cluster::create(&pg, "cluster_b", &[]),
        )
    });
    // B gets the same schema.
    common::store_on(&b.url(), name, |_| {}).await.close();
    let proxy = Proxy::start(&a.addr()).await;
    let store = common::store_on(&proxy.url(&a.url()), name, |o| {
        o.group_commit = false;
        o.client_timeout = Duration::from_secs(2);
        o.in_doubt_timeout = Duration::from_secs(2);
    })
    .await;
    let f = exec_fence(&store, "k").await;
    proxy.arm(Cut::SilentAfterCommit);
    proxy.set_upstream(&b.addr());
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        store.execute(
            &acme(),
            settle("k", f, 1, binding("alice", 0), completed(1)),
        ),
    )
    .await
    .expect("answered");
    assert!(
        matches!(&r, Err(StoreError::InDoubt(m)) if m.contains("another cluster")),
        "{r:?}"
    );
    // It did commit, on A.
    let on_a = common::store_on(&a.url(), name, |_| {}).await;
    assert!(
        on_a.get(&acme(), &key("k"))
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .receipt
            .is_some()
    );
    proxy.release();
}
