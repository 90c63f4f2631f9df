//! The record of `get` (SPEC §4), as the wire shows it.

use serde::{Deserialize, Serialize};
use settle_core as core;
use utoipa::ToSchema;

use crate::problem::Refusal;
use crate::request::{Binding, Finding, Outcome, OutcomeStatus};
use crate::response::Receipt;
use crate::time::Time;

/// The canonical status (SPEC §3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Reserved; nothing may have reached the outside world (rank 0).
    Pending,
    /// An effect may have been dispatched and no terminal evidence arrived (rank 1).
    Unknown,
    /// The lease holder reported an outcome for a request that does not match the reservation (rank 2).
    Conflict,
    /// Terminal: a definitive failure from the upstream (rank 3).
    Failed,
    /// Terminal: the effect happened, result recorded (rank 4).
    Completed,
}

impl From<core::Status> for Status {
    fn from(s: core::Status) -> Status {
        match s {
            core::Status::Pending => Status::Pending,
            core::Status::Unknown => Status::Unknown,
            core::Status::Conflict => Status::Conflict,
            core::Status::Failed => Status::Failed,
            core::Status::Completed => Status::Completed,
        }
    }
}
impl From<Status> for core::Status {
    fn from(s: Status) -> core::Status {
        match s {
            Status::Pending => core::Status::Pending,
            Status::Unknown => core::Status::Unknown,
            Status::Conflict => core::Status::Conflict,
            Status::Failed => core::Status::Failed,
            Status::Completed => core::Status::Completed,
        }
    }
}

/// A record's status as shown: the canonical status, or `running` (pending
/// with a live lease; the same rank).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// Reserved, no live lease (rank 0).
    Pending,
    /// Pending with a live lease (rank 0).
    Running,
    /// An effect may have been dispatched and no terminal evidence arrived (rank 1).
    Unknown,
    /// The lease holder reported an outcome for a request that does not match the reservation (rank 2).
    Conflict,
    /// Terminal: a definitive failure from the upstream (rank 3).
    Failed,
    /// Terminal: the effect happened, result recorded (rank 4).
    Completed,
}

impl RecordStatus {
    /// `running` when pending with an open lease, else the canonical status.
    pub fn of(r: &core::Record) -> RecordStatus {
        match r.status {
            core::Status::Pending if r.open_lease().is_some() => RecordStatus::Running,
            core::Status::Pending => RecordStatus::Pending,
            core::Status::Unknown => RecordStatus::Unknown,
            core::Status::Conflict => RecordStatus::Conflict,
            core::Status::Failed => RecordStatus::Failed,
            core::Status::Completed => RecordStatus::Completed,
        }
    }
    /// The wire's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Pending => "pending",
            RecordStatus::Running => "running",
            RecordStatus::Unknown => "unknown",
            RecordStatus::Conflict => "conflict",
            RecordStatus::Failed => "failed",
            RecordStatus::Completed => "completed",
        }
    }
}

/// The immutable reservation recorded by the first claim.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    /// Lowercase hex SHA-256.
    pub fingerprint: String,
    /// The principal; never changes for the record's lifetime.
    pub principal: String,
    /// The scopes, sorted and de-duplicated; never change for the record's lifetime.
    pub scopes: Vec<String>,
    /// Only moves up (claim rule 4).
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    pub generation: u64,
}

impl From<&core::Reservation> for Reservation {
    fn from(r: &core::Reservation) -> Reservation {
        Reservation {
            fingerprint: crate::hex::encode(&r.fingerprint),
            principal: r.principal.to_string(),
            scopes: r.scopes.as_slice().iter().map(|s| s.to_string()).collect(),
            generation: r.generation,
        }
    }
}

/// What a lease was granted for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// Perform the effect.
    Execute,
    /// Find out whether an earlier attempt's effect happened before writing anything.
    Reconcile,
}

impl From<core::Purpose> for Purpose {
    fn from(p: core::Purpose) -> Purpose {
        match p {
            core::Purpose::Execute => Purpose::Execute,
            core::Purpose::Reconcile => Purpose::Reconcile,
        }
    }
}

/// Why a lease ended.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEndReason {
    /// Ran past `expires_at` unsettled.
    Expired,
    /// Its generation fell below the principal's current generation.
    Revoked,
    /// Ended by a settlement that wrote a receipt.
    Settled,
    /// Ended by the holder's own mismatched evidence (settle rule 2).
    Refused,
    /// Ended by `release(not_dispatched)`.
    Released,
    /// Ended by `reconcile(unavailable)`.
    Unavailable,
    /// Ended by `release(not_committed)`: the holder's attestation.
    NotCommitted,
}

impl From<core::LeaseEnd> for LeaseEndReason {
    fn from(e: core::LeaseEnd) -> LeaseEndReason {
        match e {
            core::LeaseEnd::Expired => LeaseEndReason::Expired,
            core::LeaseEnd::Revoked => LeaseEndReason::Revoked,
            core::LeaseEnd::Settled => LeaseEndReason::Settled,
            core::LeaseEnd::Refused => LeaseEndReason::Refused,
            core::LeaseEnd::Released => LeaseEndReason::Released,
            core::LeaseEnd::Unavailable => LeaseEndReason::Unavailable,
            core::LeaseEnd::NotCommitted => LeaseEndReason::NotCommitted,
        }
    }
}

/// How and when a lease ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseEnded {
    /// Why it ended.
    pub reason: LeaseEndReason,
    /// When it ended (for a revocation: when the principal's generation moved).
    pub at: Time,
}

/// A lease: the right to act on the operation, held by one worker at a time.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Lease {
    /// The fencing token: unique in the store, strictly increasing.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What the lease allows.
    pub purpose: Purpose,
    /// The binding generation it was granted under.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    pub generation: u64,
    /// When it was granted.
    pub granted_at: Time,
    /// When it expires unless a heartbeat extends it.
    pub expires_at: Time,
    /// Its length in ms; a heartbeat without `lease_ms` extends by this much.
    pub lease_ms: u64,
    /// The claim promised to call `dispatch` before the remote write.
    pub marks_dispatch: bool,
    /// `dispatch` was called: the remote write may have started.
    pub dispatched: bool,
    /// The worker label the claim gave.
    pub worker: Option<String>,
    /// Null while the lease is live.
    pub ended: Option<LeaseEnded>,
    /// The `claim_id` of the claim it was granted to (claim rule 5a), if
    /// that claim carried one.
    pub claim_id: Option<String>,
}

impl From<&core::Lease> for Lease {
    fn from(l: &core::Lease) -> Lease {
        Lease {
            fence: l.fence.0,
            purpose: l.purpose.into(),
            generation: l.generation,
            granted_at: l.granted_at.into(),
            expires_at: l.expires_at.into(),
            lease_ms: l.lease_ms.get(),
            marks_dispatch: l.marks_dispatch,
            dispatched: l.dispatched,
            worker: l.worker.as_ref().map(|w| w.to_string()),
            ended: l.ended.map(|e| LeaseEnded {
                reason: e.reason.into(),
                at: e.at.into(),
            }),
            claim_id: l.claim_id.as_ref().map(|c| c.as_str().to_string()),
        }
    }
}

/// Which call reported an observation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// `settle`.
    Settle,
    /// `reconcile`.
    Reconcile,
}

impl From<core::Call> for Call {
    fn from(c: core::Call) -> Call {
        match c {
            core::Call::Settle => Call::Settle,
            core::Call::Reconcile => Call::Reconcile,
        }
    }
}

/// What one attempt reported in one call, accepted or not.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Observation {
    /// When it was reported.
    pub at: Time,
    /// Which call reported it.
    pub call: Call,
    /// The reported outcome status (`settle`, `reconcile(committed)`).
    pub status: Option<OutcomeStatus>,
    /// The reconcile finding (`reconcile` only).
    pub finding: Option<Finding>,
    /// The reported response digest, if any.
    pub response_sha256: Option<String>,
    /// Whether the evidence was accepted; a refused one is also quarantined.
    pub accepted: bool,
    /// The refusal, when not accepted.
    pub code: Option<Refusal>,
}

impl From<&core::Observation> for Observation {
    fn from(o: &core::Observation) -> Observation {
        Observation {
            at: o.at.into(),
            call: o.call.into(),
            status: o.status.map(Into::into),
            finding: o.finding.map(Into::into),
            response_sha256: o.response_sha256.map(|d| crate::hex::encode(&d)),
            accepted: o.accepted,
            code: o.code.map(Into::into),
        }
    }
}

/// One granted lease and what its holder reported.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    /// 1-based attempt number on this record.
    pub number: u32,
    /// The lease this attempt held.
    pub lease: Lease,
    /// The receipt this attempt obtained (terminal or `unknown`).
    pub receipt: Option<Receipt>,
    /// The `error` the attempt reported with its receipt (`unknown` included).
    pub error: Option<String>,
    /// The newest 32.
    pub observations: Vec<Observation>,
    /// Every observation of this attempt, kept or not.
    pub observations_total: u32,
}

impl From<&core::Attempt> for Attempt {
    fn from(a: &core::Attempt) -> Attempt {
        Attempt {
            number: a.number,
            lease: (&a.lease).into(),
            receipt: a.receipt.as_ref().map(Into::into),
            error: a.error.as_ref().map(|e| e.to_string()),
            observations: a.observations.iter().map(Into::into).collect(),
            observations_total: a.observations_total,
        }
    }
}

/// Evidence that was received and refused, kept for audit (the result
/// body is not kept, only its digest).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct QuarantineEntry {
    /// When it was refused.
    pub at: Time,
    /// The fence it was presented under.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// The refusal.
    pub reason: Refusal,
    /// Which call presented it.
    pub call: Call,
    /// The outcome status it carried, if any.
    pub status: Option<OutcomeStatus>,
    /// The reconcile finding it carried (`reconcile` only).
    pub finding: Option<Finding>,
    /// The fingerprint it carried, if any.
    pub fingerprint: Option<String>,
    /// The binding it carried, if any.
    pub binding: Option<Binding>,
    /// The response digest it carried, if any.
    pub response_sha256: Option<String>,
}

impl From<&core::QuarantineEntry> for QuarantineEntry {
    fn from(q: &core::QuarantineEntry) -> QuarantineEntry {
        QuarantineEntry {
            at: q.at.into(),
            fence: q.fence.0,
            reason: q.reason.into(),
            call: q.call.into(),
            status: q.status.map(Into::into),
            finding: q.finding.map(Into::into),
            fingerprint: q.fingerprint.map(|d| crate::hex::encode(&d)),
            binding: q.binding.as_ref().map(Into::into),
            response_sha256: q.response_sha256.map(|d| crate::hex::encode(&d)),
        }
    }
}

/// The record of `get`: the tenant's inspection view of one operation.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = Record)]
pub struct RecordView {
    /// The operation's key.
    pub key: String,
    /// The shown status (`running` is pending with a live lease).
    pub status: RecordStatus,
    /// Rank in the lattice (0–4).
    #[schema(minimum = 0, maximum = 4)]
    pub rank: u8,
    /// What the first claim reserved.
    pub reservation: Reservation,
    /// The current lease, live or ended.
    pub lease: Option<Lease>,
    /// The canonical terminal outcome.
    pub outcome: Option<Outcome>,
    /// The canonical terminal receipt.
    pub receipt: Option<Receipt>,
    /// An effect may have been dispatched and no terminal evidence arrived: no `execute` lease is granted while set.
    pub reconcile_required: bool,
    /// Two matching terminal results disagreed (settle rule 0); the first stays canonical.
    pub disputed: bool,
    /// The newest 32 attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Every attempt ever made, kept or not.
    pub attempts_total: u32,
    /// The newest 32 quarantine entries.
    pub quarantine: Vec<QuarantineEntry>,
    /// Every quarantine entry ever made, kept or not.
    pub quarantine_total: u64,
    /// How long the record is kept once terminal, in seconds.
    pub retention_s: u64,
    /// When the first claim reserved the key.
    pub created_at: Time,
    /// The last progress (claim, heartbeat, lease end, settlement); quarantine does not move it.
    pub updated_at: Time,
    /// When the record became terminal; retention counts from here.
    pub settled_at: Option<Time>,
    /// When a terminal record will be collected.
    pub expires_at: Option<Time>,
}

impl From<&core::Record> for RecordView {
    fn from(r: &core::Record) -> RecordView {
        RecordView {
            key: r.key.to_string(),
            status: RecordStatus::of(r),
            rank: r.status.rank(),
            reservation: (&r.reservation).into(),
            lease: r.lease().map(Into::into),
            outcome: r.outcome.as_ref().map(Into::into),
            receipt: r.receipt.as_ref().map(Into::into),
            reconcile_required: r.reconcile_required,
            disputed: r.disputed,
            attempts: r.attempts.iter().map(Into::into).collect(),
            attempts_total: r.attempts_total,
            quarantine: r.quarantine.iter().map(Into::into).collect(),
            quarantine_total: r.quarantine_total,
            retention_s: r.retention_s.get(),
            created_at: r.created_at.into(),
            updated_at: r.updated_at.into(),
            settled_at: r.settled_at.map(Into::into),
            expires_at: r.expires_at().map(Into::into),
        }
    }
}
