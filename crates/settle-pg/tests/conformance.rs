//! The backend conformance suite against a real PostgreSQL: each case on
//! its own freshly created schema, dropped afterwards; with group commit
//! (the default) and with one transaction per command.

mod common;

mod grouped {
    settle_ledger::conformance_tests!(super::common::fixture(true));
}

mod single {
    settle_ledger::conformance_tests!(super::common::fixture(false));
}
