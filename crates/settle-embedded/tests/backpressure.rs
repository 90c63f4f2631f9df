//! Backpressure: a checkpointer that falls behind (a checkpoint-delay
//! fault) holds the writer back once `max_checkpoint_backlog` sealed
//! segments wait, and the command queue then answers `Overloaded` past
//! `max_queue`: memory, log segments on disk and reopen time stay bounded.
//! Nothing admitted is lost.

use std::sync::Arc;

use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore, Faults};
mod common;
use common::{Release, logs, tenant};
use settle_ledger::{Store, StoreError};

#[allow(clippy::too_many_lines)] // one scenario, kept whole
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_checkpointer_bounds_the_log_and_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    faults.hold_checkpoints();
    let backlog = 1;
    let o = EmbeddedOptions {
        segment_bytes: 8192,
        max_checkpoint_backlog: backlog,
        max_queue: 16,
        max_batch: 32,
        overload_retry_after_ms: 250,
        faults: Some(faults.clone()),
        ..EmbeddedOptions::default()
    };
    let store = EmbeddedStore::open(dir.path(), o.clone()).unwrap();
    // On a failed assertion, let the checkpointer go so the store can close.
    let _release = Release(faults.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let spawn = |i: u32| {
        let (store, tx) = (store.clone(), tx.clone());
        tokio::spawn(async move {
            let r = store
                .execute(&tenant(), claim(&format!("q{i}"), 1, binding("alice", 0)))
                .await;
            let _ = tx.send((i, r));
        });
    };
    let mut admitted = Vec::new();
    // One write at a time until the writer waits for the checkpointer: with
    // checkpoints held, once `backlog` sealed segments wait besides the one
    // being checkpointed.
    let mut waiting = {
        let faults = faults.clone();
        tokio::task::spawn_blocking(move || faults.wait_for_writer_to_wait())
    };
    let mut i = 0;
    loop {
        spawn(i);
        i += 1;
        tokio::select! {
            r = rx.recv() => {
                let (j, r) = r.unwrap();
                assert!(
                    matches!(r, Ok(Reply::Claim(ClaimDecision::Execute(_)))),
                    "q{j}: {r:?}"
                );
                admitted.push(j);
                assert!(
                    logs(dir.path()) <= backlog + 3,
                    "the log grew past the bound without the writer waiting"
                );
            }
            w = &mut waiting => {
                assert!(w.unwrap(), "the writer waits");
                break;
            }
        }
    }
    // The writer waits now: writes queue up to `max_queue`, then are refused.
    // More writes than one batch and the queue hold: the first answer is a refusal.
    for _ in 0..o.max_batch + o.max_queue + 4 {
        spawn(i);
        i += 1;
    }
    let (j, r) = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
        .await
        .expect("no answer in 30 s: nothing refused while the writer waits")
        .unwrap();
    let overloaded = match r {
        Err(StoreError::Overloaded { retry_after_ms }) => Some(retry_after_ms),
        other => panic!("q{j} answered while the writer waits: {other:?}"),
    };
    assert_eq!(overloaded, Some(250));
    let most_logs = logs(dir.path());
    assert_eq!(
        most_logs,
        backlog + 3,
        "log segments with a backlog bound of {backlog}"
    );
    let before_release = admitted.len();
    // The checkpointer catches up; everything admitted completes.
    faults.release_checkpoints();
    drop(tx);
    while let Some((i, r)) = rx.recv().await {
        match r {
            Ok(Reply::Claim(ClaimDecision::Execute(_))) => admitted.push(i),
            Err(StoreError::Overloaded { .. }) => {}
            other => panic!("q{i}: {other:?}"),
        }
    }
    assert!(
        admitted.len() > before_release,
        "the waiting writes went through"
    );
    assert!(matches!(
        store
            .execute(&tenant(), claim("after", 1, binding("alice", 0)))
            .await
            .unwrap(),
        Reply::Claim(ClaimDecision::Execute(_))
    ));
    store.close();
    drop(store);
    let store = EmbeddedStore::open(dir.path(), o).unwrap();
    for i in &admitted {
        assert!(
            store
                .get(&tenant(), &key(&format!("q{i}")))
                .await
                .unwrap()
                .unwrap()
                .is_some(),
            "q{i} was acknowledged"
        );
    }
    eprintln!(
        "backpressure: overloaded after {before_release} acknowledged writes, at most {most_logs} log segments"
    );
}

/// A backlog left by a crash is checkpointed one segment at a time (each
/// read, ingested, recorded and deleted before the next is read), so the
/// memory a checkpoint needs is one segment's, however long the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_checkpointed_one_segment_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let o = |faults: Arc<Faults>| EmbeddedOptions {
        segment_bytes: 8192,
        max_checkpoint_backlog: 100,
        faults: Some(faults),
        ..EmbeddedOptions::default()
    };
    let halted = Arc::new(Faults::default());
    halted
        .halt_checkpoints
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let store = EmbeddedStore::open(dir.path(), o(halted)).unwrap();
    for i in 0..150 {
        store
            .execute(&tenant(), claim(&format!("b{i}"), 1, binding("alice", 0)))
            .await
            .unwrap();
    }
    store.close();
    drop(store);
    let backlog = logs(dir.path());
    assert!(backlog >= 3, "{backlog} segments");
    let last = dir.path().join(format!("wal/{backlog:020}.log"));
    let faults = Arc::new(Faults::default());
    let store = EmbeddedStore::open(dir.path(), o(faults.clone())).unwrap();
    store.close();
    // The last segment is sealed too unless the reopened store went on
    // writing into its preallocated space (then it is the live segment).
    let sealed = if last.exists() { backlog - 1 } else { backlog };
    assert_eq!(
        faults.checkpoints.load(std::sync::atomic::Ordering::SeqCst) as usize,
        sealed,
        "one checkpoint per sealed segment, without waiting for a new one to fill"
    );
    assert_eq!(logs(dir.path()), 1, "only the live segment is left");
}
