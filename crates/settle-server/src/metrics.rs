//! The Prometheus recorder behind the `metrics` facade. The embedded store
//! records `settle_commit_batch_size` and `settle_commit_duration_seconds`
//! through the same facade, so they appear on `/metrics` too.
//!
//! No metric carries a tenant or key label (SPEC §7).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use settle_ledger::StoreStats;

/// Counter of HTTP requests, by `route` and `status`.
pub const REQUESTS: &str = "settle_http_requests_total";
/// Counter of the rules' answers, by `call` and `decision` (a decision, reply kind or refusal code).
pub const DECISIONS: &str = "settle_decisions_total";
/// Counter of refused evidence that was quarantined, by `call`.
pub const QUARANTINED: &str = "settle_quarantined_total";
/// Counter of `result_mismatch` answers (the record became or stayed disputed).
pub const DISPUTED: &str = "settle_disputed_total";
/// Counter of store failures, by `call`.
pub const STORE_ERRORS: &str = "settle_store_errors_total";
/// Counter of leases the sweep ended.
pub const SWEEP_EXPIRED: &str = "settle_sweep_expired_total";
/// Counter of records the sweep collected.
pub const SWEEP_COLLECTED: &str = "settle_sweep_collected_total";
/// Counter of `GET /v1/admin/export` streams, by `outcome`: `completed`
/// (the trailer was sent), `failed` (the store failed midway: the body was
/// aborted), `abandoned` (the client went away), `refused` (the store
/// could not start one).
pub const EXPORTS: &str = "settle_admin_exports_total";
/// Counter of requests refused by a tenant's quota (SPEC §12), by `code`
/// (`rate_limited`, `quota_exceeded`); no tenant label (§7: a tenant's own
/// figures are in its `/v1/stats`).
pub const QUOTA_REFUSALS: &str = "settle_quota_refusals_total";
/// Counter of configuration reloads (SIGHUP), by `result` (`applied`, `refused`).
pub const CONFIG_RELOADS: &str = "settle_config_reloads_total";
/// Histogram of commands per group commit (recorded by the embedded store).
pub const COMMIT_BATCH_SIZE: &str = "settle_commit_batch_size";
/// Histogram of group commit durations in seconds (recorded by the embedded store).
pub const COMMIT_DURATION: &str = "settle_commit_duration_seconds";

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the global recorder once per process; `None` if another
/// recorder was installed first (then `/metrics` says so).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(COMMIT_BATCH_SIZE.into()),
                    &[
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                    ],
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(COMMIT_DURATION.into()),
                        &[
                            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                            0.25, 1.0,
                        ],
                    )
                })
                .expect("bucket lists are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    describe();
                    Some(handle)
                }
                Err(_) => None,
            }
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(REQUESTS, "HTTP requests by route and status.");
    describe_counter!(
        QUOTA_REFUSALS,
        "Requests refused by a tenant's quota, by code (rate_limited, quota_exceeded)."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads (SIGHUP), by result (applied, refused)."
    );
    describe_counter!(
        DECISIONS,
        "Ledger answers by call and decision or refusal code."
    );
    describe_counter!(
        QUARANTINED,
        "Settle/reconcile evidence refused and quarantined."
    );
    describe_counter!(
        DISPUTED,
        "Terminal evidence that disagreed with the canonical outcome (result_mismatch)."
    );
    describe_counter!(STORE_ERRORS, "Calls answered 503 because the store failed.");
    describe_counter!(SWEEP_EXPIRED, "Leases ended by the background sweep.");
    describe_counter!(
        SWEEP_COLLECTED,
        "Terminal records collected after their retention."
    );
    describe_counter!(
        EXPORTS,
        "Admin exports by outcome (completed, failed, abandoned, refused)."
    );
    describe_histogram!(COMMIT_BATCH_SIZE, "Commands per durable group commit.");
    describe_histogram!(
        COMMIT_DURATION,
        Unit::Seconds,
        "Time of one durable group commit."
    );
    describe_gauge!("settle_records_open", "Records not yet terminal.");
    describe_gauge!("settle_records_pending", "Records pending or running.");
    describe_gauge!(
        "settle_records_unknown",
        "Records whose effect may have happened, no terminal evidence."
    );
    describe_gauge!("settle_records_conflict", "Records in conflict.");
    describe_gauge!(
        "settle_records_reconcile_required",
        "Records that must be reconciled before any new execution."
    );
    describe_gauge!(
        "settle_records_stuck",
        "Non-terminal records without a live lease, untouched for stuck_after_s."
    );
    describe_gauge!(
        "settle_records_refused",
        "Records refused under SPEC §6.9 (receipt dated in the future)."
    );
    describe_gauge!(
        "settle_records_disputed",
        "Records marked disputed (two terminal results disagreed), counted from the store: \
         survives restarts; each stays until its retention collects it."
    );
    describe_gauge!(
        "settle_records_quarantined",
        "Quarantined evidence entries (refused terminal evidence kept for an operator), \
         summed over the configured tenants."
    );
    describe_gauge!(
        "settle_records_quarantined_records",
        "Records holding quarantined evidence, summed over the configured tenants."
    );
    describe_gauge!(
        "settle_records_undecodable",
        "Stored records that cannot be decoded (every call on their key answers record_refused)."
    );
}

/// Publishes the store's gauges.
pub fn set_stats(s: &StoreStats) {
    metrics::gauge!("settle_records_open").set(s.open as f64);
    metrics::gauge!("settle_records_pending").set(s.pending as f64);
    metrics::gauge!("settle_records_unknown").set(s.unknown as f64);
    metrics::gauge!("settle_records_conflict").set(s.conflict as f64);
    metrics::gauge!("settle_records_reconcile_required").set(s.reconcile_required as f64);
    metrics::gauge!("settle_records_stuck").set(s.stuck as f64);
    metrics::gauge!("settle_records_refused").set(s.refused as f64);
    metrics::gauge!("settle_records_disputed").set(s.disputed as f64);
    metrics::gauge!("settle_records_undecodable").set(s.undecodable as f64);
}

/// The `route` label values of [`REQUESTS`].
pub const ROUTES: [&str; 20] = [
    "claim",
    "heartbeat",
    "dispatch",
    "settle",
    "release",
    "reconcile",
    "get",
    "revoke",
    "warn",
    "warnings",
    "list",
    "stats",
    "healthz",
    "readyz",
    "metrics",
    "openapi",
    "unmatched",
    "batch",
    "principal",
    "admin_export",
];

const STATUSES: [&str; 10] = [
    "200", "400", "401", "404", "408", "409", "413", "422", "503", "other",
];

fn status_index(status: u16) -> usize {
    match status {
        200 => 0,
        400 => 1,
        401 => 2,
        404 => 3,
        408 => 4,
        409 => 5,
        413 => 6,
        422 => 7,
        503 => 8,
        _ => 9,
    }
}

/// Counter handles are registered once per label set and then reused, so a
/// request costs one atomic add instead of a registry lookup.
static REQUEST_COUNTERS: [[OnceLock<metrics::Counter>; STATUSES.len()]; ROUTES.len()] =
    [const { [const { OnceLock::new() }; STATUSES.len()] }; ROUTES.len()];

/// Counts one answered request.
pub fn count_request(route: usize, status: u16) {
    let s = status_index(status);
    REQUEST_COUNTERS[route][s]
        .get_or_init(
            || metrics::counter!(REQUESTS, "route" => ROUTES[route], "status" => STATUSES[s]),
        )
        .increment(1);
}

/// The `decision` label values of [`DECISIONS`] (`Reply::label`).
const DECISION_LABELS: [&str; 25] = [
    "execute",
    "reconcile",
    "in_flight",
    "replay",
    "heartbeat",
    "dispatched",
    "receipt",
    "released",
    "revoked",
    "warning",
    "expired",
    "collected",
    "fingerprint_mismatch",
    "binding_mismatch",
    "stale_binding",
    "stale_fence",
    "lease_expired",
    "wrong_purpose",
    "result_mismatch",
    "receipt_required",
    "too_many_classes",
    "not_found",
    "record_refused",
    "generation_exhausted",
    "invalid_request",
];

const CALLS: [&str; 8] = [
    "claim",
    "heartbeat",
    "dispatch",
    "settle",
    "release",
    "reconcile",
    "revoke",
    "warn",
];

static DECISION_COUNTERS: [[OnceLock<metrics::Counter>; DECISION_LABELS.len()]; CALLS.len()] =
    [const { [const { OnceLock::new() }; DECISION_LABELS.len()] }; CALLS.len()];

/// Counts one ledger answer (`call` is `Command::name`, `decision` is `Reply::label`).
pub fn count_decision(call: &'static str, decision: &'static str) {
    let c = CALLS.iter().position(|x| *x == call);
    let d = DECISION_LABELS.iter().position(|x| *x == decision);
    match (c, d) {
        (Some(c), Some(d)) => DECISION_COUNTERS[c][d]
            .get_or_init(|| metrics::counter!(DECISIONS, "call" => call, "decision" => decision))
            .increment(1),
        // A label added to the core later still gets counted, just without the cache.
        _ => metrics::counter!(DECISIONS, "call" => call, "decision" => decision).increment(1),
    }
}

/// The gauges that scan the store (the engine's open-record stats and the
/// quarantine counts of every tenant), refreshed by a scrape only when the
/// last refresh is older than the interval, one refresh at a time: a
/// scrape storm costs one scan per interval (the scan reads every record).
pub struct Gauges {
    every: std::time::Duration,
    /// When the last refresh began; `None` before the first.
    last: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Refreshes done (tests and the operator's curiosity).
    refreshes: std::sync::atomic::AtomicU64,
}

impl Gauges {
    /// Gauges refreshed at most once per `every`.
    pub fn new(every: std::time::Duration) -> Gauges {
        Gauges {
            every,
            last: tokio::sync::Mutex::new(None),
            refreshes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Refreshes the gauges if the last refresh is older than the interval.
    /// A scrape that arrives during a refresh waits for it, then reads its
    /// values.
    pub async fn refresh(&self, st: &crate::http::AppState) {
        let mut last = self.last.lock().await;
        if last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        *last = Some(std::time::Instant::now());
        self.refreshes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match st.store.stats(st.live().stuck_after_ms).await {
            Ok(s) => set_stats(&s),
            Err(e) => tracing::warn!(error = %e, "store stats unavailable for /metrics"),
        }
        crate::inspect::publish_quarantine(st).await;
    }

    /// How many refreshes have run.
    pub fn refreshes(&self) -> u64 {
        self.refreshes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_code_has_a_cached_decision_counter() {
        for c in settle_core::RefusalCode::ALL {
            assert!(DECISION_LABELS.contains(&c.code()), "{}", c.code());
        }
    }
}
