//! The in-memory store passes the backend conformance suite.

use std::sync::Arc;

use settle_core::Limits;
use settle_ledger::conformance::Fixture;
use settle_ledger::{Clock, MemStore};

async fn fixture() -> Fixture {
    let clock = Clock::system();
    Fixture::new(
        Arc::new(MemStore::new(Limits::default(), clock.clone())),
        clock,
    )
}

settle_ledger::conformance_tests!(fixture());
