//! Durability of the embedded store: reopen, checkpoints and eviction,
//! fail-closed storage errors, torn writes, records from the future.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use settle_core::invariants::check_record;
use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore, Faults};
use settle_ledger::{Clock, Store, StoreError};

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

fn opts(clock: &Clock, segment_bytes: u64, faults: Option<Arc<Faults>>) -> EmbeddedOptions {
    EmbeddedOptions {
        clock: clock.clone(),
        segment_bytes,
        faults,
        ..EmbeddedOptions::default()
    }
}

async fn pair(store: &EmbeddedStore, k: &str) -> Result<Receipt, StoreError> {
    pair_with(store, Claim::new(key(k), fp(1), binding("alice", 0))).await
}

/// A claim with a lease of 1 s, left open.
async fn lease(store: &EmbeddedStore, k: &str) -> Result<Reply, StoreError> {
    store
        .execute(
            &tenant(),
            claim_with(k, 1, binding("alice", 0), 1000, false),
        )
        .await
}

/// Claims with `c` (which must execute), then settles.
async fn pair_with(store: &EmbeddedStore, c: Claim) -> Result<Receipt, StoreError> {
    let k = c.key.clone();
    let f = match store.execute(&tenant(), Command::Claim(c)).await? {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };
    match store
        .execute(
            &tenant(),
            settle(k.as_str(), f, 1, binding("alice", 0), completed(1)),
        )
        .await?
    {
        Reply::Receipt(rc) => Ok(rc),
        other => panic!("{other:?}"),
    }
}

async fn get(store: &EmbeddedStore, k: &str) -> Option<Record> {
    store.get(&tenant(), &key(k)).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_survive_reopen_across_checkpoints_and_leave_ram() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let mut receipts = Vec::new();
    let max_fence;
    {
        // Tiny segments: many checkpoints and evictions during the run.
        let store = EmbeddedStore::open(dir.path(), opts(&clock, 8 * 1024, None)).unwrap();
        for i in 0..600 {
            receipts.push((
                format!("k{i}"),
                pair(&store, &format!("k{i}")).await.unwrap(),
            ));
        }
        // An open record and a principal generation must survive too.
        store
            .execute(&tenant(), claim("open-1", 1, binding("bob", 5)))
            .await
            .unwrap();
        max_fence = receipts.iter().map(|(_, r)| r.fence).max().unwrap();
        assert!(
            store.resident() < 300,
            "settled records leave memory after checkpoints: {} resident",
            store.resident()
        );
        for (k, rc) in &receipts {
            assert_eq!(get(&store, k).await.unwrap().receipt.as_ref(), Some(rc));
        }
        store.close();
    }
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 8 * 1024, None)).unwrap();
    for (k, rc) in &receipts {
        let r = get(&store, k).await.expect("record survives");
        assert_eq!(r.receipt.as_ref(), Some(rc), "{k}");
        assert_eq!(check_record(&r), Ok(()));
        match store
            .execute(&tenant(), claim(k, 1, binding("alice", 0)))
            .await
            .unwrap()
        {
            Reply::Claim(ClaimDecision::Replay { receipt, .. }) => assert_eq!(&receipt, rc),
            other => panic!("{other:?}"),
        }
    }
    let open = get(&store, "open-1").await.unwrap();
    assert!(open.open_lease().is_some());
    assert_eq!(
        store
            .execute(&tenant(), claim("x", 1, binding("bob", 4)))
            .await
            .unwrap(),
        Reply::Refused(RefusalCode::StaleBinding),
        "bob's generation 5 survived"
    );
    // Fences keep increasing across the restart.
    let rc = pair(&store, "after-restart").await.unwrap();
    assert!(rc.fence > max_fence);
    assert!(rc.fence > open.lease().unwrap().fence);
}

/// A store opened empty skips the index for keys no checkpoint ingested
/// (a fresh claim's lookup): every key a checkpoint ingested and evicted
/// must still be found there, by the writer and by readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_records_are_found_in_the_index_without_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 8 * 1024, None)).unwrap();
    let mut receipts = Vec::new();
    for i in 0..600 {
        receipts.push((
            format!("e{i}"),
            pair(&store, &format!("e{i}")).await.unwrap(),
        ));
    }
    assert!(store.resident() < 300, "{} resident", store.resident());
    for (k, rc) in &receipts {
        assert_eq!(
            get(&store, k).await.unwrap().receipt.as_ref(),
            Some(rc),
            "{k}"
        );
        match store
            .execute(&tenant(), claim(k, 1, binding("alice", 0)))
            .await
            .unwrap()
        {
            Reply::Claim(ClaimDecision::Replay { receipt, .. }) => assert_eq!(&receipt, rc),
            other => panic!("{k}: {other:?}"),
        }
    }
    assert_eq!(get(&store, "never-claimed").await, None);
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let _a = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    let b = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None));
    assert!(matches!(b, Err(StoreError::Io(m)) if m.contains("in use")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_fsync_fails_closed_and_never_answers_with_a_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    let before = pair(&store, "before").await.unwrap();
    let f = match store
        .execute(&tenant(), claim("k", 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };
    faults.fail_sync.store(true, Ordering::SeqCst);
    let r = store
        .execute(
            &tenant(),
            settle("k", f, 1, binding("alice", 0), completed(1)),
        )
        .await;
    assert!(matches!(r, Err(StoreError::Io(_))), "{r:?}");
    assert!(store.is_poisoned());
    // Every later write is refused until the store is reopened; nothing is retried.
    let syncs = faults.syncs.load(Ordering::SeqCst);
    for cmd in [
        claim("other", 1, binding("alice", 0)),
        settle("k", f, 1, binding("alice", 0), completed(1)),
    ] {
        assert!(matches!(
            store.execute(&tenant(), cmd).await,
            Err(StoreError::Poisoned)
        ));
    }
    assert_eq!(
        faults.syncs.load(Ordering::SeqCst),
        syncs,
        "no fsync was retried"
    );
    store.close();
    drop(store);

    // After reopening, the in-doubt settle is resolved by reading: it is
    // either settled (the bytes reached the disk) or still open; a retry
    // with the same fence gets the one true answer.
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    assert_eq!(get(&store, "before").await.unwrap().receipt, Some(before));
    let r = store
        .execute(
            &tenant(),
            settle("k", f, 1, binding("alice", 0), completed(1)),
        )
        .await
        .unwrap();
    let Reply::Receipt(rc) = r else {
        panic!("{r:?}")
    };
    assert_eq!(get(&store, "k").await.unwrap().receipt, Some(rc));
}

/// A claim staged while the settle before it is being synced reads the
/// settle's receipt (not durable yet) and changes nothing, so it has no
/// frame of its own. If that sync fails, the claim must fail with it: a
/// replay of a receipt that never became durable is a receipt that lies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_a_receipt_whose_sync_failed_is_never_answered() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    let f = match store
        .execute(&tenant(), claim("k", 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };
    faults.hold_syncs();
    faults.fail_sync.store(true, Ordering::SeqCst);
    let applied = faults.applied();
    let settling = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .execute(
                    &tenant(),
                    settle("k", f, 1, binding("alice", 0), completed(1)),
                )
                .await
        })
    };
    // The settle is written and waits for its fdatasync.
    assert!(faults.wait_for_held_sync());
    let replaying = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .execute(&tenant(), claim("k", 1, binding("alice", 0)))
                .await
        })
    };
    // The claim is applied on top of the settle (and reads its receipt).
    {
        let faults = faults.clone();
        tokio::task::spawn_blocking(move || faults.wait_for_applied(applied + 2))
            .await
            .unwrap();
    }
    faults.release_syncs();
    let settled = settling.await.unwrap();
    assert!(matches!(settled, Err(StoreError::Io(_))), "{settled:?}");
    let replay = replaying.await.unwrap();
    assert!(
        replay.is_err(),
        "a claim answered from a batch that never became durable: {replay:?}"
    );
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_write_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    faults.fail_write.store(true, Ordering::SeqCst);
    let r = store
        .execute(&tenant(), claim("k", 1, binding("alice", 0)))
        .await;
    assert!(matches!(r, Err(StoreError::Io(_))));
    assert!(
        get(&store, "k").await.is_none(),
        "unacknowledged state is not visible"
    );
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    assert!(get(&store, "k").await.is_none());
    pair(&store, "k").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_write_is_cut_on_recovery_and_later_writes_survive() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    let a = pair(&store, "a").await.unwrap();
    faults.torn_write.store(true, Ordering::SeqCst);
    assert!(
        store
            .execute(&tenant(), claim("torn", 1, binding("alice", 0)))
            .await
            .is_err()
    );
    store.close();
    drop(store);

    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    assert_eq!(get(&store, "a").await.unwrap().receipt, Some(a.clone()));
    assert!(get(&store, "torn").await.is_none());
    let b = pair(&store, "b").await.unwrap();
    assert!(b.fence > a.fence);
    store.close();
    drop(store);

    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    assert_eq!(get(&store, "a").await.unwrap().receipt, Some(a));
    assert_eq!(get(&store, "b").await.unwrap().receipt, Some(b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_checkpoint_fails_closed_and_the_log_recovers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    faults.fail_checkpoint.store(true, Ordering::SeqCst);
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 4 * 1024, Some(faults.clone()))).unwrap();
    let mut acked = Vec::new();
    for i in 0..200 {
        match pair(&store, &format!("c{i}")).await {
            Ok(rc) => acked.push((format!("c{i}"), rc)),
            Err(StoreError::Poisoned) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        store.is_poisoned(),
        "the failed checkpoint poisoned the store"
    );
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4 * 1024, None)).unwrap();
    for (k, rc) in &acked {
        assert_eq!(get(&store, k).await.unwrap().receipt.as_ref(), Some(rc));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_from_the_future_is_refused_after_reopen_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ahead = Clock::system();
    ahead.advance(3_600_000);
    {
        let store = EmbeddedStore::open(dir.path(), opts(&ahead, 1 << 20, None)).unwrap();
        pair(&store, "future").await.unwrap();
        store.close();
    }
    let clock = Clock::system();
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    assert_eq!(
        store.get(&tenant(), &key("future")).await.unwrap(),
        Err(RefusalCode::RecordRefused)
    );
    assert_eq!(
        store
            .execute(&tenant(), claim("future", 1, binding("alice", 0)))
            .await
            .unwrap(),
        Reply::Refused(RefusalCode::RecordRefused)
    );
    store.sweep().await.unwrap();
    store.close();
    drop(store);
    // Offline inspection reports it.
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let mut refused = Vec::new();
    settle_embedded::scan(dir.path(), |_, r| {
        if r.is_from_the_future(now) {
            refused.push(r.key.clone());
        }
    })
    .unwrap();
    assert_eq!(refused, vec![key("future")]);
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    clock.advance(3_700_000);
    // Once the store's clock passes the receipt, the record is served again, intact.
    let r = store
        .get(&tenant(), &key("future"))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.status, Status::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_collects_checkpointed_records_from_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4 * 1024, None)).unwrap();
    for i in 0..100 {
        let k = format!("r{i}");
        let mut c = Claim::new(key(&k), fp(1), binding("alice", 0));
        // Long enough that a slow, loaded machine does not expire them early.
        c.retention_s = RetentionS::new(3_600).unwrap();
        let f = match store.execute(&tenant(), Command::Claim(c)).await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("{other:?}"),
        };
        store
            .execute(
                &tenant(),
                settle(&k, f, 1, binding("alice", 0), completed(1)),
            )
            .await
            .unwrap();
    }
    store.close();
    drop(store);
    // Reopened: most records live only in the index now.
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4 * 1024, None)).unwrap();
    assert!(get(&store, "r0").await.is_some());
    clock.advance(3_700_000);
    assert!(get(&store, "r0").await.is_none(), "expired reads as absent");
    let report = store.sweep().await.unwrap();
    assert_eq!(report.collected, 100);
    assert_eq!(store.sweep().await.unwrap().collected, 0);
    // Fresh intent on an old key.
    assert!(matches!(
        store
            .execute(&tenant(), claim("r0", 2, binding("alice", 0)))
            .await
            .unwrap(),
        Reply::Claim(ClaimDecision::Execute(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_reopen_cycles_with_checkpoints_keep_everything() {
    // Checkpoints after a reopen must pick up where the last one stopped.
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let mut receipts: Vec<(String, Receipt)> = Vec::new();
    for cycle in 0..6 {
        let store = EmbeddedStore::open(dir.path(), opts(&clock, 4 * 1024, None)).unwrap();
        for (k, rc) in &receipts {
            assert_eq!(
                get(&store, k).await.unwrap().receipt.as_ref(),
                Some(rc),
                "cycle {cycle}: {k}"
            );
        }
        for i in 0..80 {
            let k = format!("c{cycle}-{i}");
            receipts.push((k.clone(), pair(&store, &k).await.unwrap()));
        }
        store.close();
    }
}

/// The thread zero-filling the next segment is joined on close: it cannot
/// outlive the store (and its lock) and write into a directory another
/// process has opened since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_joins_the_segment_preparation_thread() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    faults.prepare_delay_ms.store(300, Ordering::SeqCst);
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    pair(&store, "a").await.unwrap();
    store.close();
    assert_eq!(
        faults.prepares_running.load(Ordering::SeqCst),
        0,
        "a segment preparation outlived the store"
    );
}

/// Readiness is real: it fails once the store cannot write, whatever the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_fails_when_the_writer_is_gone_poisoned_or_closed() {
    let clock = Clock::system();
    // The writer thread dies.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    store.health().await.unwrap();
    faults.panic_writer.store(true, Ordering::SeqCst);
    let r = store
        .execute(&tenant(), claim("k", 1, binding("alice", 0)))
        .await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    assert!(
        store.health().await.is_err(),
        "health with no writer thread"
    );
    drop(store);

    // A failed fsync poisons it.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults.clone()))).unwrap();
    faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(pair(&store, "k").await.is_err());
    assert!(matches!(store.health().await, Err(StoreError::Poisoned)));
    drop(store);

    // Closed.
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    store.close();
    assert!(matches!(store.health().await, Err(StoreError::Closed)));
}

/// A stored record that does not decode is refused on every call and
/// never taken for absent (its key could be claimed again); the sweep
/// skips it, counts it, and goes on; `scan` reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_is_refused_skipped_and_counted() {
    use settle_embedded::index::{CheckpointItem, FjallIndex, Index};
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    {
        let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
        let mut c = Claim::new(key("good"), fp(1), binding("alice", 0));
        c.retention_s = RetentionS::new(3_600).unwrap();
        let f = match store.execute(&tenant(), Command::Claim(c)).await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("{other:?}"),
        };
        store
            .execute(
                &tenant(),
                settle("good", f, 1, binding("alice", 0), completed(1)),
            )
            .await
            .unwrap();
        store.close();
    }
    {
        // Plant values that do not decode: one due for collection before
        // the good record, one listed as open.
        let index = FjallIndex::open(&dir.path().join("index")).unwrap();
        let bad = b"racme\0bad";
        let bad_open = b"racme\0bad-open";
        index
            .ingest(
                &[
                    CheckpointItem {
                        key: bad,
                        open: false,
                        expires_at: Some(1),
                        value: &[1, 0xff, 0xff, 0xff],
                        listed: true,
                    },
                    CheckpointItem {
                        key: bad_open,
                        open: true,
                        expires_at: None,
                        value: &[1, 0xfe],
                        listed: true,
                    },
                ],
                &|| {},
            )
            .unwrap();
    }
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    for k in ["bad", "bad-open"] {
        assert_eq!(
            store.get(&tenant(), &key(k)).await.unwrap(),
            Err(RefusalCode::RecordRefused),
            "{k}"
        );
        assert_eq!(
            store
                .execute(&tenant(), claim(k, 1, binding("alice", 0)))
                .await
                .unwrap(),
            Reply::Refused(RefusalCode::RecordRefused),
            "{k} is never claimed afresh"
        );
    }
    clock.advance(3_700_000);
    let report = store.sweep().await.unwrap();
    assert_eq!(report.collected, 1, "the sweep went on past the bad record");
    assert_eq!(store.sweep().await.unwrap().collected, 0);
    assert_eq!(store.stats(60_000).await.unwrap().undecodable, 2);
    assert_eq!(
        store.get(&tenant(), &key("bad")).await.unwrap(),
        Err(RefusalCode::RecordRefused),
        "still refused after the sweeps"
    );
    store.close();
    drop(store);
    let report = settle_embedded::scan(dir.path(), |_, _| {}).unwrap();
    assert_eq!(report.undecodable.len(), 2, "{report:?}");
    assert!(report.undecodable[0].contains("acme/bad"), "{report:?}");
}

/// The disputed gauge comes from the store: it counts records that left
/// memory and survives restarts; collection takes records out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disputed_gauge_counts_every_stored_record_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4096, None)).unwrap();
    for i in 0..3 {
        let k = format!("d{i}");
        let mut c = Claim::new(key(&k), fp(1), binding("alice", 0));
        c.retention_s = RetentionS::new(3_600).unwrap();
        let f = match store.execute(&tenant(), Command::Claim(c)).await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("{other:?}"),
        };
        for n in [1, 2] {
            store
                .execute(
                    &tenant(),
                    settle(&k, f, 1, binding("alice", 0), completed(n)),
                )
                .await
                .unwrap();
        }
    }
    // Push them out of memory (a checkpoint after each batch here).
    for i in 0..40 {
        pair(&store, &format!("p{i}")).await.unwrap();
    }
    assert_eq!(store.stats(60_000).await.unwrap().disputed, 3);
    assert!(store.resident() < 20, "{} resident", store.resident());
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4096, None)).unwrap();
    assert_eq!(
        store.stats(60_000).await.unwrap().disputed,
        3,
        "after a restart"
    );
    clock.advance(3_700_000);
    store.sweep().await.unwrap();
    assert_eq!(store.stats(60_000).await.unwrap().disputed, 0, "collected");
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 4096, None)).unwrap();
    assert_eq!(store.stats(60_000).await.unwrap().disputed, 0);
}

/// The sweep finds open leases through the keys the publisher keeps, and
/// in-memory records past retention through a bound on their expiries;
/// opening a store rebuilds both from what it loads. A lease taken and a
/// record settled (retention 1 s) before a crash (no checkpoint: both are
/// replayed from the log) are expired and collected after it, and so is
/// what is claimed and settled after the reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_acts_on_leases_and_retention_from_before_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    {
        let faults = Arc::new(Faults::default());
        faults.halt_checkpoints.store(true, Ordering::SeqCst);
        let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, Some(faults))).unwrap();
        lease(&store, "leased").await.unwrap();
        let mut c = Claim::new(key("kept-1s"), fp(1), binding("alice", 0));
        c.retention_s = RetentionS::new(1).unwrap();
        pair_with(&store, c).await.unwrap();
        store.close();
    }
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1 << 20, None)).unwrap();
    // Nothing is due yet: the sweep acts on nothing and keeps both.
    let report = store.sweep().await.unwrap();
    assert_eq!((report.expired, report.collected), (0, 0), "{report:?}");
    lease(&store, "leased-after").await.unwrap();
    clock.advance(1500);
    let report = store.sweep().await.unwrap();
    assert_eq!(report.expired, 2, "both lapsed leases: {report:?}");
    assert_eq!(report.collected, 1, "{report:?}");
    assert!(get(&store, "kept-1s").await.is_none());
    for k in ["leased", "leased-after"] {
        let r = get(&store, k).await.unwrap();
        assert!(r.open_lease().is_none(), "{k}: {r:?}");
        assert_eq!(r.status, Status::Unknown);
    }
    // Acted on once: the next sweep finds nothing.
    let report = store.sweep().await.unwrap();
    assert_eq!((report.expired, report.collected), (0, 0), "{report:?}");
    store.close();
}

/// Claims keys `from..from + n` of `prefix` in one batch (one frame), then
/// settles them in another; every claim executes and every settlement
/// gives a receipt.
async fn pairs_in_one_batch(store: &EmbeddedStore, prefix: &str, from: usize, n: usize) {
    let claims = (from..from + n)
        .map(|i| claim(&format!("{prefix}{i}"), 1, binding("alice", 0)))
        .collect();
    let settles = store
        .execute_batch(&tenant(), claims)
        .await
        .into_iter()
        .zip(from..)
        .map(|(r, i)| match r {
            Ok(Reply::Claim(ClaimDecision::Execute(g))) => settle(
                &format!("{prefix}{i}"),
                g.fence,
                1,
                binding("alice", 0),
                completed(1),
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    for r in store.execute_batch(&tenant(), settles).await {
        assert!(matches!(r, Ok(Reply::Receipt(_))), "{r:?}");
    }
}

/// A log that writes big frames (high throughput) gets its segments
/// reserved rather than zero-filled (nothing written twice); one that
/// writes small frames keeps zero-filling. Either way every receipt is
/// there after a reopen, read from the log and from the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_frames_get_reserved_segments_and_everything_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let faults = Arc::new(Faults::default());
    {
        let store =
            EmbeddedStore::open(dir.path(), opts(&clock, 1024 * 1024, Some(faults.clone())))
                .unwrap();
        // Small frames first: one pair at a time.
        for i in 0..50 {
            pair(&store, &format!("small{i}")).await.unwrap();
        }
        // 500 claims (then 500 settlements) a frame: well over 32 KiB each,
        // so several segments of 1 MiB in a row average big frames.
        for round in 0..12 {
            pairs_in_one_batch(&store, "big", round * 500, 500).await;
        }
        assert!(
            faults.prepared_allocated.load(Ordering::SeqCst) > 0,
            "big frames: the segments are reserved"
        );
        // As a crash leaves it: the last segments are recovered from the log.
        faults.halt_checkpoints.store(true, Ordering::SeqCst);
        pairs_in_one_batch(&store, "big", 6000, 500).await;
        store.close();
    }
    let store = EmbeddedStore::open(dir.path(), opts(&clock, 1024 * 1024, None)).unwrap();
    for k in (0..50)
        .map(|i| format!("small{i}"))
        .chain((0..6500).map(|i| format!("big{i}")))
    {
        let r = get(&store, &k).await.unwrap_or_else(|| panic!("{k} lost"));
        assert_eq!(r.status, Status::Completed, "{k}");
        check_record(&r).unwrap();
    }
    store.close();

    // Small frames only: never reserved.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let store =
        EmbeddedStore::open(dir.path(), opts(&clock, 64 * 1024, Some(faults.clone()))).unwrap();
    for i in 0..600 {
        pair(&store, &format!("small{i}")).await.unwrap();
    }
    assert!(highest_segment(dir.path()) > 1, "the log rotated");
    assert_eq!(faults.prepared_allocated.load(Ordering::SeqCst), 0);
    store.close();
}

/// Segment numbers used so far (the highest on disk or checkpointed).
fn highest_segment(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            p.file_stem()?.to_str()?.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0)
}
