//! The inspection API of SPEC §9 (list and stats). The types are defined
//! here for the server and the console; the endpoints come with the
//! inspection work.

use serde::{Deserialize, Serialize};
use settle_core as core;
use utoipa::ToSchema;

use crate::record::{Purpose, RecordStatus};
use crate::time::Time;

/// `GET /v1/operations` → one page of summaries.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ListResponse {
    pub operations: Vec<OperationSummary>,
    /// The opaque cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// One record in a listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct OperationSummary {
    pub key: String,
    pub status: RecordStatus,
    #[schema(minimum = 0, maximum = 4)]
    pub rank: u8,
    pub reconcile_required: bool,
    pub disputed: bool,
    pub stuck: bool,
    /// Quarantine entries (all, not only the kept ones).
    pub quarantined: u64,
    pub lease: Option<LeaseSummary>,
    /// Attempts (all, not only the kept ones).
    pub attempts: u32,
    pub created_at: Time,
    pub updated_at: Time,
    pub expires_at: Option<Time>,
}

/// The current lease in a summary.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseSummary {
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    pub purpose: Purpose,
    pub expires_at: Time,
    pub dispatched: bool,
}

impl OperationSummary {
    /// The summary of `r` at `now` (`stuck` per the server's `stuck_after_s`).
    pub fn of(r: &core::Record, now: core::Timestamp, stuck_after_ms: u64) -> OperationSummary {
        OperationSummary {
            key: r.key.to_string(),
            status: RecordStatus::of(r),
            rank: r.status.rank(),
            reconcile_required: r.reconcile_required,
            disputed: r.disputed,
            stuck: r.is_stuck(now, stuck_after_ms),
            quarantined: r.quarantine_total,
            lease: r.open_lease().map(|l| LeaseSummary {
                fence: l.fence.0,
                purpose: l.purpose.into(),
                expires_at: l.expires_at.into(),
                dispatched: l.dispatched,
            }),
            attempts: r.attempts_total,
            created_at: r.created_at.into(),
            updated_at: r.updated_at.into(),
            expires_at: r.expires_at().map(Into::into),
        }
    }
}

/// `GET /v1/stats`: counts for the caller's tenant.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    pub by_status: StatusCounts,
    pub total: u64,
    pub reconcile_required: u64,
    pub disputed: u64,
    pub stuck: u64,
    /// Quarantined evidence entries.
    pub quarantined: u64,
    /// Records holding quarantined evidence.
    pub quarantined_records: u64,
    /// Records refused on load (SPEC §6.9).
    pub refused: u64,
}

/// Records per shown status (`running` is pending with a live lease).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct StatusCounts {
    pub pending: u64,
    pub running: u64,
    pub unknown: u64,
    pub conflict: u64,
    pub failed: u64,
    pub completed: u64,
}
