//! `max_records` (SPEC §12): how many records a tenant with that quota
//! holds, and whether a claim may create one more.
//!
//! The count is the tenant's records as a scan of the store finds them
//! (terminal ones included, until collected), plus the records created by
//! claims since that scan. It is rescanned when it says the tenant is at
//! its limit and the last scan is over [`RESCAN_AT_LIMIT`] old (collected
//! records make room again), and at least every [`RESCAN_EVERY`]. Claims
//! running at the same time all see the count before any of them created
//! its record, so the count may overshoot the limit by at most the claims
//! in flight (documented in docs/operations.md, "Quotas").

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settle_core::{Key, TenantId};
use settle_ledger::Store;
use std::sync::Mutex;

use crate::metrics as m;
use crate::problem::Problem;

/// A count at the limit is rescanned when older than this.
pub const RESCAN_AT_LIMIT: Duration = Duration::from_secs(1);
/// A count is rescanned at least this often while it is used.
pub const RESCAN_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Count {
    records: AtomicU64,
    /// When the last scan ended; `None`: never scanned. The async lock
    /// makes concurrent callers wait for one scan instead of running many.
    scanned: tokio::sync::Mutex<Option<Instant>>,
}

/// The record counts of the tenants that have `max_records`.
#[derive(Default)]
pub struct RecordCounts {
    counts: Mutex<HashMap<TenantId, Arc<Count>>>,
}

impl RecordCounts {
    fn entry(&self, tenant: &TenantId) -> Arc<Count> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(tenant.clone())
            .or_default()
            .clone()
    }

    /// The tenant's records, scanned when the count is missing or stale
    /// (see the module's doc) against `max`.
    async fn records(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        max: u64,
    ) -> Result<u64, Problem> {
        let count = self.entry(tenant);
        let mut scanned = count.scanned.lock().await;
        let n = count.records.load(Ordering::Relaxed);
        let stale = match *scanned {
            None => true,
            Some(at) => {
                let age = at.elapsed();
                age >= RESCAN_EVERY || (n >= max && age >= RESCAN_AT_LIMIT)
            }
        };
        if !stale {
            return Ok(n);
        }
        // Records created while the scan runs may be counted twice (by the
        // scan and by `created`): the count errs high until the next scan.
        let stats = settle_ledger::inspect::tenant_stats(store, tenant, 0)
            .await
            .map_err(|e| crate::http::store_error("quota", None, &e))?;
        count.records.store(stats.total, Ordering::Relaxed);
        *scanned = Some(Instant::now());
        Ok(stats.total)
    }

    /// How many records the tenant may still create before `max`.
    pub async fn headroom(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        max: u64,
    ) -> Result<u64, Problem> {
        Ok(max.saturating_sub(self.records(store, tenant, max).await?))
    }

    /// `Ok` when a claim on `key` does not need room (the key has a
    /// record: a replay, a retry, a reconcile); 429 `quota_exceeded` when
    /// it would create a record. Called when the tenant has no headroom.
    pub async fn existing_or_refuse(
        store: &dyn Store,
        tenant: &TenantId,
        key: &Key,
        max: u64,
    ) -> Result<(), Problem> {
        match store.get(tenant, key).await {
            // A record that cannot be trusted is not room to make: the
            // claim goes on and the rules refuse it (record_refused).
            Ok(Ok(Some(_)) | Err(_)) => Ok(()),
            Ok(Ok(None)) => {
                metrics::counter!(m::QUOTA_REFUSALS, "code" => "quota_exceeded").increment(1);
                Err(Problem::quota_exceeded(max))
            }
            Err(e) => Err(crate::http::store_error("quota", Some(key), &e)),
        }
    }

    /// A claim of the tenant's created a record (its first attempt).
    pub fn created(&self, tenant: &TenantId, n: u64) {
        if n > 0
            && let Some(c) = self
                .counts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(tenant)
        {
            c.records.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Whether a reply to a claim created the record: an `execute` of its
/// first attempt (a key whose record was collected starts again at 1).
pub fn creates_record(reply: &settle_core::Reply) -> bool {
    matches!(
        reply,
        settle_core::Reply::Claim(settle_core::ClaimDecision::Execute(g)) if g.attempt == 1
    )
}
