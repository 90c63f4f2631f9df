//! The embedded store passes the backend conformance suite (a fresh
//! directory per test; small segments so checkpoints run during the tests):
//! on the real filesystem with fjall, and the same engine on the simulated
//! disk with the in-memory index, threaded and inline.

use std::sync::Arc;

use settle_embedded::sim::{MemIndex, SimDisk};
use settle_embedded::{EmbeddedOptions, EmbeddedStore, InlineStore};
use settle_ledger::Clock;
use settle_ledger::conformance::Fixture;

fn opts(clock: &Clock) -> EmbeddedOptions {
    EmbeddedOptions {
        clock: clock.clone(),
        segment_bytes: 16 * 1024,
        ..EmbeddedOptions::default()
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::system();
    let store = EmbeddedStore::open(dir.path(), opts(&clock)).unwrap();
    let mut fx = Fixture::new(store, clock);
    fx.guard = Some(Box::new(dir));
    fx
}

settle_ledger::conformance_tests!(fixture());

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
