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
    /// The page's summaries, in key order.
    pub operations: Vec<OperationSummary>,
    /// The opaque cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// One record in a listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct OperationSummary {
    /// The operation's key.
    pub key: String,
    /// The shown status (`running` is pending with a live lease).
    pub status: RecordStatus,
    /// The lattice rank of the status (SPEC §3), 0 (`pending`) to 4 (`completed`).
    #[schema(minimum = 0, maximum = 4)]
    pub rank: u8,
    /// An effect may have been dispatched and no terminal evidence arrived.
    pub reconcile_required: bool,
    /// Two matching terminal results disagreed; the first stays canonical.
    pub disputed: bool,
    /// Not terminal, no live lease, untouched for the server's `stuck_after_s`.
    pub stuck: bool,
    /// Quarantine entries (all, not only the kept ones).
    pub quarantined: u64,
    /// The live lease, or null.
    pub lease: Option<LeaseSummary>,
    /// Attempts (all, not only the kept ones).
    pub attempts: u32,
    /// When the first claim reserved the key.
    pub created_at: Time,
    /// The last progress on the record (claim, heartbeat, lease end, settlement).
    pub updated_at: Time,
    /// When the terminal record may be collected; null while not terminal.
    pub expires_at: Option<Time>,
}

/// The current lease in a summary.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseSummary {
    /// The lease's fence.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What the lease allows.
    pub purpose: Purpose,
    /// When it expires unless extended.
    pub expires_at: Time,
    /// `dispatch` was called: the remote write may have started.
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
    /// Records per shown status.
    pub by_status: StatusCounts,
    /// Every record of the tenant.
    pub total: u64,
    /// Records with `reconcile_required` set.
    pub reconcile_required: u64,
    /// Records marked `disputed`.
    pub disputed: u64,
    /// Records stuck (not terminal, no live lease, untouched for `stuck_after_s`).
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
    /// Pending without a live lease.
    pub pending: u64,
    /// Pending with a live lease.
    pub running: u64,
    /// At `unknown`.
    pub unknown: u64,
    /// At `conflict`.
    pub conflict: u64,
    /// At `failed`.
    pub failed: u64,
    /// At `completed`.
    pub completed: u64,
}
