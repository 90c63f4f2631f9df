//! What checkpoints write to the index's `open` list: a record settled in
//! a later segment than the one that listed it open is unlisted (its
//! tombstone is written), a record still open stays listed, also across a
//! reopen (inline on the simulated disk, so checkpoints run at known points).

use settle_core::testkit::*;
use settle_core::{ClaimDecision, Fence, Reply, TenantId};
use settle_embedded::index::Index;
use settle_embedded::{EmbeddedOptions, InlineStore};
use settle_ledger::Clock;
use settle_sim::disk::{MemIndex, SimDisk};

fn opts(clock: &Clock) -> EmbeddedOptions {
    EmbeddedOptions {
        clock: clock.clone(),
        segment_bytes: 16 * 1024,
        ..EmbeddedOptions::default()
    }
}

fn listed(index: &MemIndex) -> Vec<String> {
    let mut keys: Vec<String> = index
        .open_records()
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
        .collect();
    keys.sort();
    keys
}

fn claim_now(store: &InlineStore<SimDisk, MemIndex>, t: &TenantId, k: &str) -> Fence {
    match store.execute_now(t, claim(k, 1, binding("a", 0))).unwrap() {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    }
}

fn settle_now(store: &InlineStore<SimDisk, MemIndex>, t: &TenantId, k: &str, fence: Fence) {
    let r = store
        .execute_now(t, settle(k, fence, 1, binding("a", 0), completed(1)))
        .unwrap();
    assert!(matches!(r, Reply::Receipt(_)), "{r:?}");
}

#[test]
fn a_record_listed_open_is_unlisted_once_it_settles_also_after_a_reopen() {
    let clock = Clock::system();
    let disk = SimDisk::new();
    let index = MemIndex::new(&disk, "/data");
    let t = TenantId::new("acme").unwrap();
    let store = InlineStore::open(&disk, "/data", index.clone(), opts(&clock)).unwrap();
    let a = claim_now(&store, &t, "a");
    let b = claim_now(&store, &t, "b");
    let c = claim_now(&store, &t, "c");
    // Claimed and settled within one segment: never listed.
    let d = claim_now(&store, &t, "d");
    settle_now(&store, &t, "d", d);
    store.checkpoint_now().unwrap();
    assert_eq!(listed(&index), ["racme\0a", "racme\0b", "racme\0c"]);

    settle_now(&store, &t, "a", a);
    store.checkpoint_now().unwrap();
    assert_eq!(listed(&index), ["racme\0b", "racme\0c"]);

    // A new process knows the listing only from what it loads at open.
    settle_now(&store, &t, "b", b);
    store.close();
    drop(store);
    let store = InlineStore::open(&disk, "/data", index.clone(), opts(&clock)).unwrap();
    assert_eq!(listed(&index), ["racme\0c"]);
    settle_now(&store, &t, "c", c);
    store.checkpoint_now().unwrap();
    assert!(listed(&index).is_empty(), "{:?}", listed(&index));
}
