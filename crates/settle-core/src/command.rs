//! Commands (what a caller asks) and replies (what the rules decided).

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, Receipt, Warning};
use crate::refusal::RefusalCode;
use crate::rules::Limits;
use crate::types::{
    Binding, ClaimId, Digest, Fence, InvalidInput, Key, LeaseMs, Principal, RetentionS, TaskId,
    Text, Timestamp, WarningClass,
};

/// `claim(key, fingerprint, binding, lease_ms, worker?, marks_dispatch, retention_s, claim_id?)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claim {
    /// The operation's idempotency key.
    pub key: Key,
    /// SHA-256 of the request's effect-defining fields; fixed by the reservation.
    pub fingerprint: Digest,
    /// The authorization the caller runs under (checked by claim rules 1, 3, 4).
    pub binding: Binding,
    /// How long the granted lease lasts.
    pub lease_ms: LeaseMs,
    /// A free label of the worker, kept on the attempt for inspection.
    pub worker: Option<Text>,
    /// Promise to call `dispatch` before the remote write, so an expiry before
    /// it sets no `reconcile_required` and `release(not_dispatched)` is allowed.
    pub marks_dispatch: bool,
    /// How long the record is kept once terminal; only the creating claim's counts.
    pub retention_s: RetentionS,
    /// The caller's id for this claim: a retry after a lost answer sends it
    /// again and gets the same grant (claim rule 5a).
    pub claim_id: Option<ClaimId>,
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
            claim_id: None,
        }
    }
}

/// `heartbeat(key, fence, lease_ms?)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Heartbeat {
    /// The operation's idempotency key.
    pub key: Key,
    /// The fence of the lease to extend.
    pub fence: Fence,
    /// The lease length from now (`None`: the lease's own `lease_ms`); a
    /// heartbeat extends and never shortens the lease.
    pub lease_ms: Option<LeaseMs>,
}

/// `dispatch(key, fence)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Dispatch {
    /// The operation's idempotency key.
    pub key: Key,
    /// The fence of the `execute` lease whose holder is about to write remotely.
    pub fence: Fence,
}

/// `settle(key, fence, fingerprint, binding, outcome)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Settle {
    /// The operation's idempotency key.
    pub key: Key,
    /// The fence of the lease the outcome was produced under (settle rule 1).
    pub fence: Fence,
    /// The fingerprint of the request that was executed (settle rule 2).
    pub fingerprint: Digest,
    /// The binding it ran under (settle rules 2 and 3).
    pub binding: Binding,
    /// What happened upstream.
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
    /// The wire name (`not_dispatched`, `not_committed`).
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
    /// The operation's idempotency key.
    pub key: Key,
    /// The fence of the `execute` lease to release.
    pub fence: Fence,
    /// Why no receipt is needed.
    pub reason: ReleaseReason,
    /// Remove the record as if collected, allowed only for a record that
    /// would be `pending` with nothing recorded but leases (SPEC §4
    /// `release(forget)`): a request refused before any work.
    pub forget: bool,
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
    /// The fingerprint of the request the remote effect belongs to.
    pub fn fingerprint(&self) -> &Digest {
        &self.fingerprint
    }
    /// The binding it ran under.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
    /// The terminal outcome (`completed` or `failed`).
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
    /// The operation's idempotency key.
    pub key: Key,
    /// The fence of the `reconcile` lease.
    pub fence: Fence,
    /// What the worker found out.
    pub finding: Finding,
}

/// `revoke(principal)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Revoke {
    /// The principal whose generation moves up by one.
    pub principal: Principal,
}

/// `warn(task, class, detail?)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Warn {
    /// The task the warning belongs to.
    pub task: TaskId,
    /// The warning's class; one record per task and class.
    pub class: WarningClass,
    /// The newest detail; `None` keeps the stored one.
    pub detail: Option<Text>,
}

/// Every state-changing call of SPEC §4, plus the two time-driven housekeeping commands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Command {
    /// SPEC §4 claim.
    Claim(Claim),
    /// SPEC §4 heartbeat.
    Heartbeat(Heartbeat),
    /// SPEC §4 dispatch.
    Dispatch(Dispatch),
    /// SPEC §4 settle.
    Settle(Settle),
    /// SPEC §4 release.
    Release(Release),
    /// SPEC §4 reconcile.
    Reconcile(Reconcile),
    /// SPEC §4 revoke.
    Revoke(Revoke),
    /// SPEC §4 warn.
    Warn(Warn),
    /// End a lapsed lease (background sweep; the same rule runs lazily on every access).
    Expire {
        /// The record whose lease may have lapsed.
        key: Key,
    },
    /// Collect a terminal record past its retention.
    Collect {
        /// The record to collect.
        key: Key,
    },
}

/// Which state a command works on; an engine loads exactly that.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target<'a> {
    /// The operation record of a key (and the generations of its principals).
    Record(&'a Key),
    /// The generation of a principal.
    Principal(&'a Principal),
    /// The warnings of a task.
    Task(&'a TaskId),
}

impl Command {
    /// The state this command reads and writes.
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
        // SPEC §2: fences start at 1; 0 names no lease (and must not be
        // quarantined as if it did).
        if self.fence().is_some_and(|f| f.0 == 0) {
            return Err(InvalidInput::new("fence", "fences start at 1"));
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
    /// The fence of the lease; present it on every later call.
    pub fence: Fence,
    /// When the lease expires (store clock), unless extended by heartbeat.
    pub lease_expires_at: Timestamp,
    /// The attempt's number on the record, counting from 1 (also past attempts
    /// no longer kept).
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
    InFlight {
        /// Milliseconds until the holding lease expires, within [10, 1000].
        retry_after_ms: u64,
        /// When the running lease expires (the store's clock): how long a
        /// duplicate may have to wait at most, unless it is heartbeated.
        lease_expires_at: Timestamp,
    },
    /// Already settled: here is the one true outcome.
    Replay {
        /// The canonical (terminal) outcome.
        outcome: Outcome,
        /// Its durable receipt.
        receipt: Receipt,
    },
}

impl ClaimDecision {
    /// The wire name of the decision (`execute`, `reconcile`, `in_flight`, `replay`).
    pub fn name(&self) -> &'static str {
        match self {
            ClaimDecision::Execute(_) => "execute",
            ClaimDecision::Reconcile(_) => "reconcile",
            ClaimDecision::InFlight { .. } => "in_flight",
            ClaimDecision::Replay { .. } => "replay",
        }
    }
    /// The lease granted by `execute` or `reconcile`, else `None`.
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
    /// The fence of the live lease.
    pub fence: Fence,
    /// When it now expires (store clock).
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
    Released {
        /// The fence of the lease that ended.
        fence: Fence,
    },
    /// `revoke`.
    Revoked {
        /// The revoked principal.
        principal: Principal,
        /// Its current generation after the revocation.
        generation: u64,
    },
    /// `warn`.
    Warning(Warning),
    /// `expire`: whether a lease ended.
    Expired {
        /// `true` when a lapsed lease ended; `false` when there was nothing to do.
        ended: bool,
    },
    /// `collect`: whether the record was removed.
    Collected {
        /// `true` when the record was past its retention and is gone.
        removed: bool,
    },
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
