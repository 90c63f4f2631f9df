//! Commands (what a caller asks) and replies (what the rules decided).

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, Receipt, Warning};
use crate::refusal::RefusalCode;
use crate::rules::Limits;
use crate::types::{
    Binding, Digest, Fence, InvalidInput, Key, LeaseMs, Principal, RetentionS, TaskId, Text,
    Timestamp, WarningClass,
};

/// `claim(key, fingerprint, binding, lease_ms, worker?, marks_dispatch, retention_s)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claim {
    pub key: Key,
    pub fingerprint: Digest,
    pub binding: Binding,
    pub lease_ms: LeaseMs,
    pub worker: Option<Text>,
    pub marks_dispatch: bool,
    pub retention_s: RetentionS,
}

impl Claim {
    /// A claim with the spec's defaults (30 s lease, no dispatch marking, 1 day retention).
    pub fn new(key: Key, fingerprint: Digest, binding: Binding) -> Claim {
        Claim {
            key,
            fingerprint,
            binding,
            lease_ms: LeaseMs::DEFAULT,
            worker: None,
            marks_dispatch: false,
            retention_s: RetentionS::DEFAULT,
        }
    }
}

/// `heartbeat(key, fence, lease_ms?)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Heartbeat {
    pub key: Key,
    pub fence: Fence,
    pub lease_ms: Option<LeaseMs>,
}

/// `dispatch(key, fence)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Dispatch {
    pub key: Key,
    pub fence: Fence,
}

/// `settle(key, fence, fingerprint, binding, outcome)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Settle {
    pub key: Key,
    pub fence: Fence,
    pub fingerprint: Digest,
    pub binding: Binding,
    pub outcome: Outcome,
}

/// Why a holder releases its `execute` lease without a receipt (SPEC §4 release).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// Nothing could have reached the outside world: the claim used
    /// `marks_dispatch` and `dispatch` was never called.
    #[default]
    NotDispatched,
    /// The holder attests the remote definitively refused the effect
    /// (a validation error, 409, 425, 429): allowed after `dispatch`.
    NotCommitted,
}

impl ReleaseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::NotDispatched => "not_dispatched",
            ReleaseReason::NotCommitted => "not_committed",
        }
    }
}

/// `release(key, fence, reason)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Release {
    pub key: Key,
    pub fence: Fence,
    pub reason: ReleaseReason,
}

/// What a reconciling worker found out about the remote effect.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Finding {
    /// The remote effect happened; the evidence (a terminal outcome) is attached.
    Committed(CommittedFinding),
    /// The remote confirms the effect did not happen.
    NotCommitted,
    /// The remote could not be asked.
    Unavailable,
}

/// The evidence of a `committed` finding. Opaque: it can only be built
/// with a terminal outcome (enum variant fields are always public, so the
/// rule lives in this type).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CommittedFinding {
    fingerprint: Digest,
    binding: Binding,
    outcome: Outcome,
}

impl CommittedFinding {
    /// `committed` requires a terminal outcome.
    pub fn new(
        fingerprint: Digest,
        binding: Binding,
        outcome: Outcome,
    ) -> Result<CommittedFinding, InvalidInput> {
        let c = CommittedFinding {
            fingerprint,
            binding,
            outcome,
        };
        c.validate()?;
        Ok(c)
    }
    fn validate(&self) -> Result<(), InvalidInput> {
        self.outcome.validate()?;
        if !self.outcome.status().is_terminal() {
            return Err(InvalidInput::new(
                "outcome.status",
                "a committed finding needs a terminal outcome (completed or failed)",
            ));
        }
        Ok(())
    }
    pub fn fingerprint(&self) -> &Digest {
        &self.fingerprint
    }
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

impl Finding {
    /// `committed` requires a terminal outcome.
    pub fn committed(
        fingerprint: Digest,
        binding: Binding,
        outcome: Outcome,
    ) -> Result<Finding, InvalidInput> {
        CommittedFinding::new(fingerprint, binding, outcome).map(Finding::Committed)
    }
}

/// `reconcile(key, fence, finding, ...)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Reconcile {
    pub key: Key,
    pub fence: Fence,
    pub finding: Finding,
}

/// `revoke(principal)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Revoke {
    pub principal: Principal,
}

/// `warn(task, class, detail?)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Warn {
    pub task: TaskId,
    pub class: WarningClass,
    pub detail: Option<Text>,
}

/// Every state-changing call of SPEC §4, plus the two time-driven housekeeping commands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Command {
    Claim(Claim),
    Heartbeat(Heartbeat),
    Dispatch(Dispatch),
    Settle(Settle),
    Release(Release),
    Reconcile(Reconcile),
    Revoke(Revoke),
    Warn(Warn),
    /// End a lapsed lease (background sweep; the same rule runs lazily on every access).
    Expire {
        key: Key,
    },
    /// Collect a terminal record past its retention.
    Collect {
        key: Key,
    },
}

/// Which state a command works on; an engine loads exactly that.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target<'a> {
    Record(&'a Key),
    Principal(&'a Principal),
    Task(&'a TaskId),
}

impl Command {
    pub fn target(&self) -> Target<'_> {
        match self {
            Command::Claim(c) => Target::Record(&c.key),
            Command::Heartbeat(c) => Target::Record(&c.key),
            Command::Dispatch(c) => Target::Record(&c.key),
            Command::Settle(c) => Target::Record(&c.key),
            Command::Release(c) => Target::Record(&c.key),
            Command::Reconcile(c) => Target::Record(&c.key),
            Command::Expire { key } | Command::Collect { key } => Target::Record(key),
            Command::Revoke(c) => Target::Principal(&c.principal),
            Command::Warn(c) => Target::Task(&c.task),
        }
    }

    /// The principal named by the command's own binding, if it carries one.
    pub fn binding_principal(&self) -> Option<&Principal> {
        match self {
            Command::Claim(c) => Some(&c.binding.principal),
            Command::Settle(c) => Some(&c.binding.principal),
            Command::Reconcile(Reconcile {
                finding: Finding::Committed(c),
                ..
            }) => Some(&c.binding.principal),
            Command::Revoke(c) => Some(&c.principal),
            _ => None,
        }
    }

    /// The spec's name of the call (for logs and metrics).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Claim(_) => "claim",
            Command::Heartbeat(_) => "heartbeat",
            Command::Dispatch(_) => "dispatch",
            Command::Settle(_) => "settle",
            Command::Release(_) => "release",
            Command::Reconcile(_) => "reconcile",
            Command::Revoke(_) => "revoke",
            Command::Warn(_) => "warn",
            Command::Expire { .. } => "expire",
            Command::Collect { .. } => "collect",
        }
    }

    /// The fence the caller presents, if any.
    pub fn fence(&self) -> Option<Fence> {
        match self {
            Command::Heartbeat(c) => Some(c.fence),
            Command::Dispatch(c) => Some(c.fence),
            Command::Settle(c) => Some(c.fence),
            Command::Release(c) => Some(c.fence),
            Command::Reconcile(c) => Some(c.fence),
            _ => None,
        }
    }

    /// Checks limits that depend on configuration (the result size); the
    /// fixed syntax was already checked when the parts were built.
    pub fn check_limits(&self, max_result_bytes: usize) -> Result<(), InvalidInput> {
        if let Some(r) = self.outcome().and_then(|o| o.result()) {
            r.check_size(max_result_bytes)?;
        }
        Ok(())
    }

    /// The outcome the command reports, if any.
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Command::Settle(s) => Some(&s.outcome),
            Command::Reconcile(Reconcile {
                finding: Finding::Committed(c),
                ..
            }) => Some(&c.outcome),
            _ => None,
        }
    }

    /// Every argument rule that depends on the store's configuration,
    /// plus the value rules again (defence in depth: [`crate::apply`]
    /// runs this before it reads or writes anything, so a command that
    /// bypassed the constructors still changes nothing).
    pub fn validate(&self, limits: &Limits) -> Result<(), InvalidInput> {
        let lease_ms = match self {
            Command::Claim(c) => Some(c.lease_ms),
            Command::Heartbeat(h) => h.lease_ms,
            _ => None,
        };
        if let Some(ms) = lease_ms
            && ms.get() <= limits.lease_margin_ms
        {
            return Err(InvalidInput::new(
                "lease_ms",
                format!(
                    "{} ms leaves no usable lease: a settlement needs more than the \
                     server's lease_margin_ms ({} ms) left, so lease_ms must be greater than it",
                    ms.get(),
                    limits.lease_margin_ms
                ),
            ));
        }
        if let Command::Reconcile(Reconcile {
            finding: Finding::Committed(c),
            ..
        }) = self
        {
            c.validate()?;
        }
        if let Some(o) = self.outcome() {
            o.validate()?;
        }
        self.check_limits(limits.max_result_bytes)
    }
}

/// A granted lease as the caller sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Grant {
    pub fence: Fence,
    pub lease_expires_at: Timestamp,
    pub attempt: u32,
}

/// The answer to a claim (and to `reconcile(not_committed)`, which answers `execute`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ClaimDecision {
    /// Go ahead: perform the effect under this fence.
    Execute(Grant),
    /// Find out whether the remote effect happened before writing anything.
    Reconcile(Grant),
    /// Another worker holds a live lease; retry after the hint.
    InFlight { retry_after_ms: u64 },
    /// Already settled: here is the one true outcome.
    Replay { outcome: Outcome, receipt: Receipt },
}

impl ClaimDecision {
    pub fn name(&self) -> &'static str {
        match self {
            ClaimDecision::Execute(_) => "execute",
            ClaimDecision::Reconcile(_) => "reconcile",
            ClaimDecision::InFlight { .. } => "in_flight",
            ClaimDecision::Replay { .. } => "replay",
        }
    }
    pub fn grant(&self) -> Option<&Grant> {
        match self {
            ClaimDecision::Execute(g) | ClaimDecision::Reconcile(g) => Some(g),
            _ => None,
        }
    }
}

/// A live lease after heartbeat or dispatch.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub fence: Fence,
    pub lease_expires_at: Timestamp,
}

/// What the rules decided.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Reply {
    /// `claim`, and `reconcile(not_committed)` (which answers `Execute`).
    Claim(ClaimDecision),
    /// `heartbeat`.
    Heartbeat(LeaseInfo),
    /// `dispatch`.
    Dispatched(LeaseInfo),
    /// `settle`, `reconcile(committed)`.
    Receipt(Receipt),
    /// `release`, `reconcile(unavailable)`: the lease ended without a receipt.
    Released { fence: Fence },
    /// `revoke`.
    Revoked {
        principal: Principal,
        generation: u64,
    },
    /// `warn`.
    Warning(Warning),
    /// `expire`: whether a lease ended.
    Expired { ended: bool },
    /// `collect`: whether the record was removed.
    Collected { removed: bool },
    /// A protocol refusal.
    Refused(RefusalCode),
    /// The command breaks an argument rule (e.g. a lease not longer than
    /// the lease margin); nothing was read or written.
    Invalid(InvalidInput),
}

impl Reply {
    /// Whether answering `cmd` with this reply quarantined evidence on the
    /// record: every refusal of `settle` and `reconcile` except `not_found`
    /// and `record_refused` does (settle rules 0–3).
    pub fn quarantined(&self, cmd: &Command) -> bool {
        matches!(cmd, Command::Settle(_) | Command::Reconcile(_))
            && matches!(self, Reply::Refused(c) if !matches!(c, RefusalCode::NotFound | RefusalCode::RecordRefused))
    }

    /// A short label for metrics: the decision or refusal code.
    pub fn label(&self) -> &'static str {
        match self {
            Reply::Claim(d) => d.name(),
            Reply::Heartbeat(_) => "heartbeat",
            Reply::Dispatched(_) => "dispatched",
            Reply::Receipt(_) => "receipt",
            Reply::Released { .. } => "released",
            Reply::Revoked { .. } => "revoked",
            Reply::Warning(_) => "warning",
            Reply::Expired { .. } => "expired",
            Reply::Collected { .. } => "collected",
            Reply::Refused(c) => c.code(),
            Reply::Invalid(_) => "invalid_request",
        }
    }
}
