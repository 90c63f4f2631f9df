//! The backend conformance suite against a real PostgreSQL: each case on
//! its own freshly created schema, dropped afterwards.

mod common;

settle_ledger::conformance_tests!(common::fixture());
