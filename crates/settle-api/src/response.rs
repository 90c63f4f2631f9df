//! Response bodies of SPEC §7, built from the core's replies, and back.

use serde::{Deserialize, Serialize};
use settle_core as core;
use settle_core::InvalidInput;
use utoipa::ToSchema;

use crate::record::Status;
use crate::request::Outcome;
use crate::time::Time;

/// A granted lease: act under this fence.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Grant {
    /// Pass it to the remote as its fencing token.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// When the lease expires unless a heartbeat extends it.
    pub lease_expires_at: Time,
    /// 1-based attempt number on this record.
    pub attempt: u32,
}

/// The answer to a claim (and to `reconcile(not_committed)`, which answers `execute`).
// Built once per answer; the size of the replay variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(
    tag = "decision",
    rename_all = "snake_case",
    try_from = "DecisionFields"
)]
pub enum ClaimDecision {
    /// Go ahead: perform the effect under this fence.
    Execute(Grant),
    /// Find out whether the remote effect happened before writing anything.
    Reconcile(Grant),
    /// Another worker holds a live lease; claim again after the hint.
    InFlight {
        /// Until that lease expires, capped at 1000, at least 10.
        retry_after_ms: u64,
        /// When the running lease expires (RFC 3339, the store's clock).
        lease_expires_at: Time,
    },
    /// Already settled: the one true outcome.
    Replay {
        /// The canonical (terminal) outcome.
        outcome: Outcome,
        /// Its durable receipt.
        receipt: Receipt,
    },
}

impl From<&core::Grant> for Grant {
    fn from(g: &core::Grant) -> Grant {
        Grant {
            fence: g.fence.0,
            lease_expires_at: g.lease_expires_at.into(),
            attempt: g.attempt,
        }
    }
}
impl From<Grant> for core::Grant {
    fn from(g: Grant) -> core::Grant {
        core::Grant {
            fence: core::Fence(g.fence),
            lease_expires_at: g.lease_expires_at.into(),
            attempt: g.attempt,
        }
    }
}

impl From<&core::ClaimDecision> for ClaimDecision {
    fn from(d: &core::ClaimDecision) -> ClaimDecision {
        match d {
            core::ClaimDecision::Execute(g) => ClaimDecision::Execute(g.into()),
            core::ClaimDecision::Reconcile(g) => ClaimDecision::Reconcile(g.into()),
            core::ClaimDecision::InFlight {
                retry_after_ms,
                lease_expires_at,
            } => ClaimDecision::InFlight {
                retry_after_ms: *retry_after_ms,
                lease_expires_at: (*lease_expires_at).into(),
            },
            core::ClaimDecision::Replay { outcome, receipt } => ClaimDecision::Replay {
                outcome: outcome.into(),
                receipt: receipt.into(),
            },
        }
    }
}

impl TryFrom<ClaimDecision> for core::ClaimDecision {
    type Error = InvalidInput;
    /// What a client makes of the answer (validated like a request).
    fn try_from(d: ClaimDecision) -> Result<core::ClaimDecision, InvalidInput> {
        Ok(match d {
            ClaimDecision::Execute(g) => core::ClaimDecision::Execute(g.into()),
            ClaimDecision::Reconcile(g) => core::ClaimDecision::Reconcile(g.into()),
            ClaimDecision::InFlight {
                retry_after_ms,
                lease_expires_at,
            } => core::ClaimDecision::InFlight {
                retry_after_ms,
                lease_expires_at: lease_expires_at.into(),
            },
            ClaimDecision::Replay { outcome, receipt } => core::ClaimDecision::Replay {
                outcome: outcome.to_core()?,
                receipt: receipt.try_into()?,
            },
        })
    }
}

/// The durable proof of a settlement.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Receipt {
    /// The operation's key.
    pub key: String,
    /// Lowercase hex SHA-256.
    pub fingerprint: String,
    /// Lowercase hex SHA-256 of the upstream's raw response.
    pub response_sha256: Option<String>,
    /// The settled status: `completed`, `failed`, or `unknown` (an unknown receipt is kept on its attempt only).
    pub status: Status,
    /// The fence of the lease that settled.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// When the settlement committed (the store's clock).
    pub committed_at: Time,
    /// Always true: a receipt is only handed out after a durable commit.
    pub durable: bool,
}

impl From<&core::Receipt> for Receipt {
    fn from(r: &core::Receipt) -> Receipt {
        Receipt {
            key: r.key.to_string(),
            fingerprint: crate::hex::encode(&r.fingerprint),
            response_sha256: r.response_sha256.map(|d| crate::hex::encode(&d)),
            status: r.status.into(),
            fence: r.fence.0,
            committed_at: r.committed_at.into(),
            durable: r.durable,
        }
    }
}

impl TryFrom<Receipt> for core::Receipt {
    type Error = InvalidInput;
    fn try_from(r: Receipt) -> Result<core::Receipt, InvalidInput> {
        Ok(core::Receipt {
            key: core::Key::new(r.key)?,
            fingerprint: crate::hex::decode("receipt.fingerprint", &r.fingerprint)?,
            response_sha256: r
                .response_sha256
                .map(|d| crate::hex::decode("receipt.response_sha256", &d))
                .transpose()?,
            status: r.status.into(),
            fence: core::Fence(r.fence),
            committed_at: r.committed_at.into(),
            durable: r.durable,
        })
    }
}

/// The answer to settle and to `reconcile(committed)`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct ReceiptResponse {
    /// The durable receipt.
    pub receipt: Receipt,
}

/// A live lease after heartbeat.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseInfo {
    /// The fence of the live lease.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// When it now expires.
    pub lease_expires_at: Time,
}

impl From<&core::LeaseInfo> for LeaseInfo {
    fn from(l: &core::LeaseInfo) -> LeaseInfo {
        LeaseInfo {
            fence: l.fence.0,
            lease_expires_at: l.lease_expires_at.into(),
        }
    }
}
impl From<LeaseInfo> for core::LeaseInfo {
    fn from(l: LeaseInfo) -> core::LeaseInfo {
        core::LeaseInfo {
            fence: core::Fence(l.fence),
            lease_expires_at: l.lease_expires_at.into(),
        }
    }
}

/// The answer to dispatch.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Dispatched {
    /// The fence of the live `execute` lease.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// When it expires unless a heartbeat extends it.
    pub lease_expires_at: Time,
    /// Always true.
    pub dispatched: bool,
}

impl From<&core::LeaseInfo> for Dispatched {
    fn from(l: &core::LeaseInfo) -> Dispatched {
        Dispatched {
            fence: l.fence.0,
            lease_expires_at: l.lease_expires_at.into(),
            dispatched: true,
        }
    }
}

/// The answer to release and to `reconcile(unavailable)`: the lease ended without a receipt.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// The fence of the lease that ended.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// Always true.
    pub released: bool,
}

impl Released {
    /// The answer for the lease of `fence`.
    pub fn new(fence: core::Fence) -> Released {
        Released {
            fence: fence.0,
            released: true,
        }
    }
}

/// The answer to reconcile, by finding.
// Built once per answer; the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged, try_from = "DecisionFields")]
pub enum ReconcileResponse {
    /// `not_committed`: an execute lease under the same fence.
    Execute(ClaimDecision),
    /// `committed`.
    Receipt(ReceiptResponse),
    /// `unavailable`.
    Released(Released),
}

/// The answer to revoke.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Revoked {
    /// The revoked principal.
    pub principal: String,
    /// The principal's new generation. Within [0, 2^53 − 1] unless the
    /// principal was revoked at 2^53 − 1: then no claim can carry it any
    /// more (SPEC §2), and the principal stays revoked.
    #[schema(minimum = 1)]
    pub generation: u64,
}

/// `GET /v1/principals/{principal}`: what a reconciler needs to claim
/// with the current generation (SPEC §7).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct PrincipalGeneration {
    /// The principal.
    pub principal: String,
    /// Its current generation: 0 for a principal never seen, one more for
    /// each revocation (and raised by a claim at a higher generation). Past
    /// 2^53 − 1 only once revoked at the top of the range, like `Revoked`.
    #[schema(minimum = 0)]
    pub generation: u64,
}

/// One bounded durable warning per `(tenant, task, class)`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Warning {
    /// The task the warning belongs to.
    pub task: String,
    /// The warning's class; one warning per task and class.
    pub class: String,
    /// Saturates at the server's `warning_cap`.
    pub count: u64,
    /// The newest detail given; a call without one keeps it.
    pub detail: Option<String>,
    /// When it was first raised.
    pub first_at: Time,
    /// When it was last raised.
    pub last_at: Time,
    /// The count reached the cap.
    pub saturated: bool,
}

impl From<&core::Warning> for Warning {
    fn from(w: &core::Warning) -> Warning {
        Warning {
            task: w.task.to_string(),
            class: w.class.to_string(),
            count: w.count,
            detail: w.detail.as_ref().map(|d| d.to_string()),
            first_at: w.first_at.into(),
            last_at: w.last_at.into(),
            saturated: w.saturated,
        }
    }
}

/// The warnings of a task.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Warnings {
    /// One warning per class, at most 64.
    pub warnings: Vec<Warning>,
}

/// `/healthz` and `/readyz`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` or `ready`.
    pub status: HealthStatus,
}

/// `ok` (the process answers) or `ready` (the store answers too).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// The process answers (`/healthz`).
    Ok,
    /// The store accepts writes too (`/readyz`).
    Ready,
}

/// Every field a claim or reconcile answer may carry, read in one pass.
///
/// serde's tagged and untagged enums buffer their input, and a buffered
/// `result` can no longer be read as raw JSON text; reading the fields
/// directly keeps a replayed result byte for byte.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionFields {
    decision: Option<Decision>,
    fence: Option<u64>,
    lease_expires_at: Option<Time>,
    attempt: Option<u32>,
    retry_after_ms: Option<u64>,
    outcome: Option<Outcome>,
    receipt: Option<Receipt>,
    released: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Decision {
    Execute,
    Reconcile,
    InFlight,
    Replay,
}

fn missing(field: &str) -> String {
    format!("missing field `{field}`")
}

impl DecisionFields {
    fn grant(&self) -> Result<Grant, String> {
        Ok(Grant {
            fence: self.fence.ok_or_else(|| missing("fence"))?,
            lease_expires_at: self
                .lease_expires_at
                .ok_or_else(|| missing("lease_expires_at"))?,
            attempt: self.attempt.ok_or_else(|| missing("attempt"))?,
        })
    }
}

impl TryFrom<DecisionFields> for ClaimDecision {
    type Error = String;
    fn try_from(f: DecisionFields) -> Result<ClaimDecision, String> {
        Ok(
            match f.decision.as_ref().ok_or_else(|| missing("decision"))? {
                Decision::Execute => ClaimDecision::Execute(f.grant()?),
                Decision::Reconcile => ClaimDecision::Reconcile(f.grant()?),
                Decision::InFlight => ClaimDecision::InFlight {
                    retry_after_ms: f.retry_after_ms.ok_or_else(|| missing("retry_after_ms"))?,
                    lease_expires_at: f
                        .lease_expires_at
                        .ok_or_else(|| missing("lease_expires_at"))?,
                },
                Decision::Replay => ClaimDecision::Replay {
                    outcome: f.outcome.ok_or_else(|| missing("outcome"))?,
                    receipt: f.receipt.ok_or_else(|| missing("receipt"))?,
                },
            },
        )
    }
}

impl TryFrom<DecisionFields> for ReconcileResponse {
    type Error = String;
    fn try_from(f: DecisionFields) -> Result<ReconcileResponse, String> {
        if f.decision.is_some() {
            return ClaimDecision::try_from(f).map(ReconcileResponse::Execute);
        }
        if let Some(receipt) = f.receipt {
            return Ok(ReconcileResponse::Receipt(ReceiptResponse { receipt }));
        }
        match (f.fence, f.released) {
            (Some(fence), Some(released)) => {
                Ok(ReconcileResponse::Released(Released { fence, released }))
            }
            _ => Err("expected a decision, a receipt or a release".to_string()),
        }
    }
}
