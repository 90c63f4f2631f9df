//! The metrics the worker records (through the `metrics` facade: they reach
//! whatever recorder the application installed, e.g. Prometheus).

/// Counter: runs answered by a `replay` (the effect was not called).
pub const REPLAYS: &str = "settle_worker_replays_total";
/// Counter, labels `call` and `code`: calls the ledger refused.
pub const REFUSALS: &str = "settle_worker_refusals_total";
/// Counter, label `call`: calls sent again after no answer or an
/// unavailable ledger.
pub const RETRIES: &str = "settle_worker_retries_total";
/// Counter: waits for another worker's lease (`in_flight`).
pub const IN_FLIGHT_WAITS: &str = "settle_worker_in_flight_waits_total";
/// Counter: leases lost while the effect or the settle ran.
pub const LEASES_LOST: &str = "settle_worker_leases_lost_total";
/// Counter, label `result` (committed, not_committed, unavailable, skipped,
/// error): records the [`Reconciler`](crate::Reconciler) looked at.
pub const RECONCILER: &str = "settle_reconciler_records_total";
