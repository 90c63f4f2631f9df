//! The configuration a request runs under, swapped whole on SIGHUP (SPEC
//! §12 "Reload"): who may call (tenants and their tokens, `[admin]`, the
//! metrics token), the request limits and the quotas. A request loads it
//! once, at its start, and keeps that `Arc` to its end, so a reload never
//! changes the rules under a request in flight.
//!
//! What is not here is fixed at start: the listen address, the engine and
//! its directory, and the rule book's limits the store was opened with
//! (`lease_margin_ms`, `warning_cap`, `max_result_bytes`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::HeaderMap;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota as GcraQuota};
use settle_core::{RetentionS, TenantId};

use crate::auth::{AdminAuth, Auth};
use crate::config::{Config, Quota, Rate};
use crate::metrics as m;
use crate::problem::Problem;

/// One tenant's quotas as the request path uses them.
struct TenantQuota {
    quota: Quota,
    /// The token bucket of `quota.rate` (shared with the previous
    /// configuration when the rate did not change, so a reload does not
    /// refill every bucket).
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

/// The reloadable part of the configuration.
pub struct Live {
    /// Token → tenant.
    pub auth: Auth,
    /// Who may call the admin endpoints.
    pub admin: AdminAuth,
    /// Larger request bodies are answered 413.
    pub max_body_bytes: usize,
    /// Most calls in one `POST /v1/batch` (422 past it).
    pub max_batch_calls: usize,
    /// Largest `POST /v1/batch` body (413 past it).
    pub max_batch_body_bytes: usize,
    /// The `retention_s` of a claim that gives none.
    pub default_retention: RetentionS,
    /// When a record counts as stuck, in ms (`stuck_after_s` × 1000).
    pub stuck_after_ms: u64,
    /// `/metrics` needs a bearer token with this SHA-256 when set.
    pub metrics_token: Option<[u8; 32]>,
    quotas: HashMap<TenantId, TenantQuota>,
}

fn limiter(rate: Rate) -> DefaultDirectRateLimiter {
    let burst = std::num::NonZeroU32::new(rate.burst).expect("burst is validated to be ≥ 1");
    let period = std::time::Duration::from_secs_f64(1.0 / rate.per_s);
    // A period of 0 (rates above 1e9/s are refused by the config) would panic.
    let quota = GcraQuota::with_period(period.max(std::time::Duration::from_nanos(1)))
        .expect("the period is at least 1 ns")
        .allow_burst(burst);
    DefaultDirectRateLimiter::direct(quota)
}

impl Live {
    /// The live configuration of `config`; token buckets whose rate did
    /// not change are taken over from `previous`.
    pub fn new(config: &Config, previous: Option<&Live>) -> Live {
        let quotas = config
            .quotas
            .iter()
            .map(|(tenant, quota)| {
                let kept = previous
                    .and_then(|p| p.quotas.get(tenant))
                    .filter(|old| old.quota.rate == quota.rate)
                    .and_then(|old| old.limiter.clone());
                let limiter = kept.or_else(|| quota.rate.map(|r| Arc::new(limiter(r))));
                (
                    tenant.clone(),
                    TenantQuota {
                        quota: *quota,
                        limiter,
                    },
                )
            })
            .collect();
        Live {
            auth: Auth::from_config(&config.auth),
            admin: AdminAuth::from_config(&config.auth, &config.admin_tokens),
            max_body_bytes: config.max_body_bytes,
            max_batch_calls: config.max_batch_calls,
            max_batch_body_bytes: config.max_batch_body_bytes,
            default_retention: config.default_retention,
            stuck_after_ms: config.stuck_after_s.saturating_mul(1000),
            metrics_token: config.metrics_token_sha256.map(|d| d.0),
            quotas,
        }
    }

    /// Authentication, then the tenant's request rate (SPEC §12: checked
    /// right after authentication): the tenant, 401 `unauthorized`, or 429
    /// `rate_limited` with `Retry-After`.
    pub fn admit(&self, headers: &HeaderMap) -> Result<&TenantId, Problem> {
        let tenant = self.auth.tenant(headers)?;
        crate::trace::record("tenant", tenant.as_str());
        if let Some(limiter) = self.quotas.get(tenant).and_then(|q| q.limiter.as_ref())
            && let Err(not_until) = limiter.check()
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            metrics::counter!(m::QUOTA_REFUSALS, "code" => "rate_limited").increment(1);
            return Err(Problem::rate_limited(wait));
        }
        Ok(tenant)
    }

    /// The tenant's `max_records`, if it has one.
    pub fn max_records(&self, tenant: &TenantId) -> Option<u64> {
        self.quotas.get(tenant).and_then(|q| q.quota.max_records)
    }
}
