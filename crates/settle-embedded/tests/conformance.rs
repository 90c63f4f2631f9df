//! The embedded store passes the backend conformance suite on the real
//! filesystem with fjall (a fresh directory per test; small segments so
//! checkpoints run during the tests). The same engine on the simulated
//! disk, threaded and inline: `settle-sim`'s `tests/conformance.rs`.

use settle_embedded::{EmbeddedOptions, EmbeddedStore};
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
