//! The embedded engine on the simulated disk with the in-memory index
//! passes the backend conformance suite, threaded and inline (the real
//! filesystem with fjall: settle-embedded's `tests/conformance.rs`), and
//! its listing finds every record once whatever holds it.

use std::sync::Arc;

use settle_embedded::{EmbeddedOptions, EmbeddedStore, InlineStore};
use settle_ledger::Clock;
use settle_ledger::conformance::Fixture;
use settle_sim::disk::{MemIndex, SimDisk};

fn opts(clock: &Clock) -> EmbeddedOptions {
    EmbeddedOptions {
        clock: clock.clone(),
        segment_bytes: 16 * 1024,
        ..EmbeddedOptions::default()
    }
}

mod simulated_disk {
    use super::*;

    async fn fixture() -> Fixture {
        let clock = Clock::system();
        let disk = SimDisk::new();
        let index = MemIndex::new(&disk, "/data");
        let store = EmbeddedStore::open_on(&disk, "/data", index, opts(&clock)).unwrap();
        Fixture::new(store, clock)
    }

    settle_ledger::conformance_tests!(fixture());
}

mod inline_on_simulated_disk {
    use super::*;

    async fn fixture() -> Fixture {
        let clock = Clock::system();
        let disk = SimDisk::new();
        let index = MemIndex::new(&disk, "/data");
        let store = InlineStore::open(&disk, "/data", index, opts(&clock)).unwrap();
        Fixture::new(Arc::new(store), clock)
    }

    settle_ledger::conformance_tests!(fixture());
}

/// The listing merges the keys held in memory with the index's: records
/// checkpointed and evicted from memory, records still in memory, and
/// records changed after their checkpoint all appear exactly once, in key
/// order, per tenant (inline, so checkpoints run at known points).
mod listing_across_memory_and_index {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Reply, TenantId};
    use settle_ledger::Store;
    use settle_ledger::inspect::{ListFilter, ListQuery, list};

    #[tokio::test]
    async fn every_record_once_whatever_holds_it() {
        let clock = Clock::system();
        let disk = SimDisk::new();
        let index = MemIndex::new(&disk, "/data");
        let store = InlineStore::open(&disk, "/data", index, opts(&clock)).unwrap();
        let (acme, beta) = (
            TenantId::new("acme").unwrap(),
            TenantId::new("beta").unwrap(),
        );
        let mut want = Vec::new();
        for i in 0..400 {
            let t = if i % 5 == 0 { &beta } else { &acme };
            let k = format!("k-{i:04}");
            let Reply::Claim(ClaimDecision::Execute(g)) = store
                .execute(t, claim(&k, 1, binding("a", 0)))
                .await
                .unwrap()
            else {
                panic!()
            };
            // Every third stays open (in memory for good); the rest settle
            // and leave memory at a checkpoint.
            if i % 3 != 0 {
                store
                    .execute(t, settle(&k, g.fence, 1, binding("a", 0), completed(1)))
                    .await
                    .unwrap();
            }
            if t == &acme {
                want.push(k);
            }
        }
        assert!(
            store.resident() < 300,
            "checkpoints moved settled records out of memory ({} resident)",
            store.resident()
        );
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let q = ListQuery {
                filter: ListFilter::default(),
                order: Default::default(),
                after: after.take(),
                limit: 7,
                stuck_after_ms: 1000,
            };
            let page = list(&store, &acme, &q).await.unwrap();
            got.extend(page.records.iter().map(|r| r.key.as_str().to_string()));
            match page.next {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        assert_eq!(got, want);
    }
}
