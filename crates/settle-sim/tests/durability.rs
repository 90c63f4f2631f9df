//! Durability of the embedded store inline on the simulated disk, where a
//! test needs the group commits to be exactly its calls.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, Faults, InlineStore};
use settle_sim::disk::{MemIndex, SimDisk};

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// A group commit that needs a new segment, when starting that segment
/// fails, stops there: no receipt, no grant, nothing written.
#[test]
fn a_failed_seal_stops_the_batch() {
    let disk = SimDisk::new();
    let index = MemIndex::new(&disk, "/d");
    let faults = Arc::new(Faults::default());
    let o = EmbeddedOptions {
        segment_bytes: 8192,
        faults: Some(faults.clone()),
        ..EmbeddedOptions::default()
    };
    let store = InlineStore::open(&disk, "/d", index.clone(), o.clone()).unwrap();
    assert!(matches!(
        store
            .execute_now(&tenant(), claim("first", 1, binding("alice", 0)))
            .unwrap(),
        Reply::Claim(ClaimDecision::Execute(_))
    ));
    faults.fail_rotate.store(true, Ordering::SeqCst);
    // One group commit too large for the space left: it needs the next segment.
    let batch: Vec<_> = (0..150)
        .map(|i| (tenant(), claim(&format!("b{i}"), 1, binding("alice", 0))))
        .collect();
    let replies = store.execute_batch(batch);
    assert!(
        replies.iter().all(|r| r.is_err()),
        "answers after the failed seal: {:?}",
        replies.iter().find(|r| r.is_ok())
    );
    assert!(store.is_poisoned());
    drop(store);
    let store = InlineStore::open(&disk, "/d", index, o).unwrap();
    for i in 0..150 {
        assert_eq!(
            store.get_now(&tenant(), &key(&format!("b{i}"))).unwrap(),
            Ok(None),
            "b{i} was written"
        );
    }
    assert!(
        store
            .get_now(&tenant(), &key("first"))
            .unwrap()
            .unwrap()
            .is_some()
    );
}
