//! A listing taken while a checkpoint evicts sees every record only in
//! memory. The checkpoint takes the record keys that entered memory, evicts
//! what it ingested, and gives back the keys it kept (records published
//! after its segment was sealed); a listing in between must wait for it
//! rather than miss those records.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use settle_embedded::{CheckpointStep, EmbeddedOptions, EmbeddedStore, Faults};
mod common;
use common::{Release, claim_and_settle, logs, tenant};
use settle_ledger::Store;

/// The store keeps its sorted key set from its first listing on: the race
/// is the same whether that listing is the one taken during the eviction
/// (it turns the set on while the checkpoint holds it) or an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_during_eviction_misses_no_record() {
    listing_during_eviction(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_listing_during_eviction_misses_no_record() {
    listing_during_eviction(false).await;
}

async fn listing_during_eviction(listed_before: bool) {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    faults.hold_checkpoints();
    let _release = Release(faults.clone());
    let o = EmbeddedOptions {
        segment_bytes: 8192,
        faults: Some(faults.clone()),
        ..EmbeddedOptions::default()
    };
    let store = EmbeddedStore::open(dir.path(), o).unwrap();
    if listed_before {
        let scan = store.scan(&tenant(), None, 10).await.unwrap();
        assert!(scan.records.is_empty());
    }
    // Settled records until the first segment is sealed (its checkpoint
    // waits at the gate), then one more: published after the seal, so
    // the first checkpoint keeps it in memory.
    let mut keys = Vec::new();
    while logs(dir.path()) < 2 {
        let k = format!("early-{}", keys.len());
        claim_and_settle(&store, &k).await;
        keys.push(k);
        assert!(keys.len() < 10_000, "no segment was sealed");
    }
    claim_and_settle(&store, "late").await;
    keys.push("late".into());

    // At the first checkpoint's `Evicted` step, a listing starts on
    // another thread; the checkpoint waits for it a while. A listing that
    // does not wait for the checkpoint answers within that time, without
    // `late`; one that waits answers once the checkpoint has given the
    // kept keys back. (The bound only decides how often a listing that
    // does not wait is caught; it never fails a listing that waits.)
    let (tx, rx) = std::sync::mpsc::channel();
    let rx = parking_lot::Mutex::new(rx);
    let listing = Arc::new(parking_lot::Mutex::new(None));
    {
        let (store, listing, fired) = (
            store.clone(),
            listing.clone(),
            Arc::new(AtomicBool::new(false)),
        );
        let rt = tokio::runtime::Handle::current();
        *faults.checkpoint_hook.lock() = Some(Arc::new(move |step| {
            if step != CheckpointStep::Evicted || fired.swap(true, Ordering::SeqCst) {
                return;
            }
            let (store, rt, tx) = (store.clone(), rt.clone(), tx.clone());
            let listed = std::thread::spawn(move || {
                let scan = rt.block_on(store.scan(&tenant(), None, 100_000)).unwrap();
                let _ = tx.send(());
                scan.records
                    .iter()
                    .map(|r| r.key.as_str().to_string())
                    .collect::<Vec<_>>()
            });
            let _ = rx.lock().recv_timeout(Duration::from_secs(2));
            *listing.lock() = Some(listed);
        }));
    }
    faults.release_checkpoints();
    // Closing runs every checkpoint to its end.
    let closing = store.clone();
    tokio::task::spawn_blocking(move || closing.close())
        .await
        .unwrap();
    let listed = listing
        .lock()
        .take()
        .expect("the first checkpoint reached its eviction")
        .join()
        .unwrap();
    let mut listed = listed;
    listed.sort();
    keys.sort();
    assert_eq!(listed, keys, "the listing taken during eviction");
}
