//! The operation record and its parts (SPEC §2–§3).

use serde::{Deserialize, Serialize};

use crate::refusal::RefusalCode;
use crate::types::{
    Binding, ClaimId, Digest, ErrorText, Fence, InvalidInput, Key, LeaseMs, Principal, ResultJson,
    RetentionS, Scopes, TaskId, Text, Timestamp, WarningClass,
};

/// Newest attempts kept per record; older ones are counted in `attempts_total`.
pub const MAX_ATTEMPTS: usize = 32;
/// Newest observations kept per attempt; older ones are counted in `observations_total`.
pub const MAX_OBSERVATIONS: usize = 32;
/// Newest quarantine entries kept per record; all are counted in `quarantine_total`.
pub const MAX_QUARANTINE: usize = 32;
/// At most this many warning classes per task.
pub const MAX_WARNING_CLASSES: usize = 64;

/// The status lattice: `pending = running < unknown < conflict < failed < completed`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Reserved, nothing may have reached the outside world (rank 0). With an
    /// open lease it is shown as `running`, at the same rank.
    Pending,
    /// An effect may have been dispatched and no terminal evidence arrived
    /// (rank 1). Never read as a rollback.
    Unknown,
    /// The current lease holder reported an outcome for a request that does not
    /// match the reservation (rank 2). Transient: matching terminal evidence upgrades it.
    Conflict,
    /// Terminal: a definitive failure from the upstream (rank 3).
    Failed,
    /// Terminal: the effect happened, result recorded (rank 4).
    Completed,
}

impl Status {
    /// The rank in the lattice (SPEC §3).
    pub fn rank(self) -> u8 {
        match self {
            Status::Pending => 0,
            Status::Unknown => 1,
            Status::Conflict => 2,
            Status::Failed => 3,
            Status::Completed => 4,
        }
    }
    /// `completed` or `failed`: the record holds a receipt and is replayed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed)
    }
    /// The lattice join: the higher-ranked of the two. Never lowers `self`.
    pub fn merge(self, other: Status) -> Status {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }
    /// The wire name (`pending`, `unknown`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Unknown => "unknown",
            Status::Conflict => "conflict",
            Status::Failed => "failed",
            Status::Completed => "completed",
        }
    }
}

/// What a worker may report in `settle`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// The effect happened.
    Completed,
    /// The upstream definitively failed it.
    Failed,
    /// The worker may have sent and does not know what happened.
    Unknown,
}

impl OutcomeStatus {
    /// The lattice status this outcome moves the record to.
    pub fn status(self) -> Status {
        match self {
            OutcomeStatus::Completed => Status::Completed,
            OutcomeStatus::Failed => Status::Failed,
            OutcomeStatus::Unknown => Status::Unknown,
        }
    }
    /// `completed` or `failed`.
    pub fn is_terminal(self) -> bool {
        self.status().is_terminal()
    }
}

/// A reported outcome: `{status, result?, response_sha256?, error?}`.
///
/// Opaque: every constructor and the deserializer (JSON and stored) check
/// SPEC §4's rules, so an invalid outcome cannot exist. `completed` and
/// `failed` carry a `result` (JSON `null` is a result) and a
/// `response_sha256`; `unknown` carries no `result`, and may carry a
/// `response_sha256` and an `error`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(try_from = "OutcomeWire")]
pub struct Outcome {
    status: OutcomeStatus,
    result: Option<ResultJson>,
    response_sha256: Option<Digest>,
    error: Option<ErrorText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutcomeWire {
    status: OutcomeStatus,
    #[serde(default, deserialize_with = "present_result")]
    result: Option<ResultJson>,
    #[serde(default)]
    response_sha256: Option<Digest>,
    #[serde(default)]
    error: Option<ErrorText>,
}

/// In JSON a present `result` is a result, `null` included (only an absent
/// field is "no result"); stored outcomes carry the option itself.
fn present_result<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ResultJson>, D::Error> {
    if d.is_human_readable() {
        ResultJson::deserialize(d).map(Some)
    } else {
        Option::<ResultJson>::deserialize(d)
    }
}

impl TryFrom<OutcomeWire> for Outcome {
    type Error = InvalidInput;
    fn try_from(w: OutcomeWire) -> Result<Outcome, InvalidInput> {
        Outcome::new(w.status, w.result, w.response_sha256, w.error)
    }
}

impl Outcome {
    /// Validates SPEC §4's rules for `outcome`.
    pub fn new(
        status: OutcomeStatus,
        result: Option<ResultJson>,
        response_sha256: Option<Digest>,
        error: Option<ErrorText>,
    ) -> Result<Outcome, InvalidInput> {
        let o = Outcome {
            status,
            result,
            response_sha256,
            error,
        };
        o.validate()?;
        Ok(o)
    }
    /// The rules every outcome obeys; [`crate::apply`] checks them again
    /// before anything is written.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let name = self.status.status().as_str();
        if self.status.is_terminal() {
            if self.response_sha256.is_none() {
                return Err(InvalidInput::new(
                    "outcome.response_sha256",
                    format!("is required when status is {name}"),
                ));
            }
            if self.result.is_none() {
                return Err(InvalidInput::new(
                    "outcome.result",
                    format!("is required when status is {name} (JSON null is a result)"),
                ));
            }
        } else if self.result.is_some() {
            return Err(InvalidInput::new(
                "outcome.result",
                "is not allowed when status is unknown: nothing is known about the result \
                 (keep what you have in error and response_sha256)",
            ));
        }
        Ok(())
    }
    /// A terminal `completed` outcome.
    pub fn completed(result: ResultJson, response_sha256: Digest) -> Outcome {
        Outcome {
            status: OutcomeStatus::Completed,
            result: Some(result),
            response_sha256: Some(response_sha256),
            error: None,
        }
    }
    /// A terminal `failed` outcome.
    pub fn failed(
        result: ResultJson,
        response_sha256: Digest,
        error: Option<ErrorText>,
    ) -> Outcome {
        Outcome {
            status: OutcomeStatus::Failed,
            result: Some(result),
            response_sha256: Some(response_sha256),
            error,
        }
    }
    /// An `unknown` outcome: the worker may have sent and does not know.
    pub fn unknown(error: Option<ErrorText>) -> Outcome {
        Outcome {
            status: OutcomeStatus::Unknown,
            result: None,
            response_sha256: None,
            error,
        }
    }
    /// An `unknown` outcome with the digest of whatever response arrived
    /// (e.g. a truncated body), kept for the reconciling operator.
    pub fn unknown_with_response(error: Option<ErrorText>, response_sha256: Digest) -> Outcome {
        Outcome {
            status: OutcomeStatus::Unknown,
            result: None,
            response_sha256: Some(response_sha256),
            error,
        }
    }
    /// The reported status.
    pub fn status(&self) -> OutcomeStatus {
        self.status
    }
    /// The result; present exactly when the status is terminal.
    pub fn result(&self) -> Option<&ResultJson> {
        self.result.as_ref()
    }
    /// SHA-256 of the upstream's raw response; present when terminal, optional
    /// for `unknown`.
    pub fn response_sha256(&self) -> Option<Digest> {
        self.response_sha256
    }
    /// The upstream's error message, if the worker gave one.
    pub fn error(&self) -> Option<&ErrorText> {
        self.error.as_ref()
    }
}

/// The immutable reservation recorded by the first claim. Only `generation` moves, and only up.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Reservation {
    /// SHA-256 of the effect-defining request fields, fixed for the record's lifetime.
    pub fingerprint: Digest,
    /// The principal, fixed for the record's lifetime.
    pub principal: Principal,
    /// The scopes, fixed for the record's lifetime.
    pub scopes: Scopes,
    /// The binding generation; only moves up (claim rule 4).
    pub generation: u64,
}

impl Reservation {
    /// Whether `fingerprint`, principal and scopes match (the generation is checked separately).
    pub fn mismatch(&self, fingerprint: &Digest, binding: &Binding) -> Option<RefusalCode> {
        if &self.fingerprint != fingerprint {
            Some(RefusalCode::FingerprintMismatch)
        } else if self.principal != binding.principal || self.scopes != binding.scopes {
            Some(RefusalCode::BindingMismatch)
        } else {
            None
        }
    }
}

/// What a lease was granted for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// Perform the effect.
    Execute,
    /// Find out whether an earlier attempt's effect happened (claim rule 7).
    Reconcile,
}

/// Why a lease ended.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEnd {
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
    /// Ended by `release(not_committed)`: the holder attested that the
    /// remote definitively refused the effect (SPEC §4 release).
    NotCommitted,
}

impl LeaseEnd {
    /// Ended by the passage of time or a generation move: later calls get `lease_expired`
    /// rather than `stale_fence`.
    pub fn lapsed(self) -> bool {
        matches!(self, LeaseEnd::Expired | LeaseEnd::Revoked)
    }
}

/// How and when a lease ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Ended {
    /// Why it ended.
    pub reason: LeaseEnd,
    /// When it ended (store clock; for a revocation, the generation move).
    pub at: Timestamp,
}

/// The right to act on an operation, held by one worker at a time.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token: store-wide unique, strictly increasing.
    pub fence: Fence,
    /// What the lease allows.
    pub purpose: Purpose,
    /// The binding generation it was granted under.
    pub generation: u64,
    /// When the lease was granted (store clock).
    pub granted_at: Timestamp,
    /// When it expires unless a heartbeat extends it (store clock).
    pub expires_at: Timestamp,
    /// The length a heartbeat without `lease_ms` extends by.
    pub lease_ms: LeaseMs,
    /// The claim promised to call `dispatch` before the remote write.
    pub marks_dispatch: bool,
    /// `dispatch` was called: the remote write may have started.
    pub dispatched: bool,
    /// The worker label the claim gave.
    pub worker: Option<Text>,
    /// `None` while the lease is live.
    pub ended: Option<Ended>,
    /// The `claim_id` of the claim that was granted this lease: a retry of
    /// that claim gets the same grant while it lives (claim rule 5a).
    pub claim_id: Option<ClaimId>,
}

impl Lease {
    /// Not yet ended (it may still be past `expires_at` until lazy expiry runs).
    pub fn is_open(&self) -> bool {
        self.ended.is_none()
    }
    /// Whether a remote write may have started under this lease.
    pub fn may_have_dispatched(&self) -> bool {
        !self.marks_dispatch || self.dispatched
    }
}

/// The durable proof of a settlement.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// The operation's key.
    pub key: Key,
    /// The reservation's fingerprint.
    pub fingerprint: Digest,
    /// SHA-256 of the upstream's response; always present on a terminal receipt.
    pub response_sha256: Option<Digest>,
    /// The settled status: `completed`, `failed`, or `unknown` (kept per attempt only).
    pub status: Status,
    /// The fence of the lease that settled.
    pub fence: Fence,
    /// When the settlement committed (store clock). A date after the store's
    /// clock makes the record refused (SPEC §6.9).
    pub committed_at: Timestamp,
    /// Always true: a receipt is only ever handed out after a durable commit.
    pub durable: bool,
}

/// Which call reported an observation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// `settle`.
    Settle,
    /// `reconcile`.
    Reconcile,
}

/// A reconcile finding, as observed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The remote effect happened (terminal evidence attached).
    Committed,
    /// The remote confirms the effect did not happen.
    NotCommitted,
    /// The remote could not be asked.
    Unavailable,
}

/// What one attempt (one fence) reported in one call, accepted or not.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Observation {
    /// When it was reported (store clock).
    pub at: Timestamp,
    /// Which call reported it.
    pub call: Call,
    /// The reported outcome status, if the call carried an outcome.
    pub status: Option<OutcomeStatus>,
    /// The reconcile finding, for `reconcile` calls.
    pub finding: Option<FindingKind>,
    /// The reported response digest, if any.
    pub response_sha256: Option<Digest>,
    /// Whether the evidence was accepted; a refused one is also quarantined
    /// on the record (except `not_found`/`record_refused`).
    pub accepted: bool,
    /// The refusal, when not accepted.
    pub code: Option<RefusalCode>,
}

/// One granted lease and what its holder reported.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based attempt number on this record.
    pub number: u32,
    /// The lease this attempt held.
    pub lease: Lease,
    /// The receipt this attempt obtained (terminal or `unknown`).
    pub receipt: Option<Receipt>,
    /// The `error` the attempt reported with its receipt (kept for an
    /// `unknown` settlement too: it is what a reconciling operator needs).
    pub error: Option<ErrorText>,
    /// The newest [`MAX_OBSERVATIONS`] observations, oldest first.
    pub observations: Vec<Observation>,
    /// Every observation ever made on this attempt, kept or not.
    pub observations_total: u32,
}

impl Attempt {
    pub(crate) fn observe(&mut self, o: Observation) {
        self.observations.push(o);
        self.observations_total = self.observations_total.saturating_add(1);
        if self.observations.len() > MAX_OBSERVATIONS {
            self.observations.remove(0);
        }
    }
}

/// Evidence that was received and refused, kept for audit.
///
/// The `result` body is not kept (only its digest) so a record stays small.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct QuarantineEntry {
    /// When the evidence was refused (store clock).
    pub at: Timestamp,
    /// The fence it was presented under.
    pub fence: Fence,
    /// Why it was refused.
    pub reason: RefusalCode,
    /// Which call presented it.
    pub call: Call,
    /// The outcome status it carried, if any.
    pub status: Option<OutcomeStatus>,
    /// The reconcile finding, for `reconcile` calls.
    pub finding: Option<FindingKind>,
    /// The fingerprint it carried, if any.
    pub fingerprint: Option<Digest>,
    /// The binding it carried, if any.
    pub binding: Option<Binding>,
    /// The response digest it carried, if any.
    pub response_sha256: Option<Digest>,
}

/// The durable operation record.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Record {
    /// The operation's idempotency key (unique per tenant).
    pub key: Key,
    /// What the first claim reserved.
    pub reservation: Reservation,
    /// The canonical status; only ever moves up the lattice.
    pub status: Status,
    /// The canonical terminal outcome.
    pub outcome: Option<Outcome>,
    /// The canonical terminal receipt.
    pub receipt: Option<Receipt>,
    /// An effect may have been dispatched and no terminal evidence arrived:
    /// no `execute` lease is granted while set (SPEC §6.10).
    pub reconcile_required: bool,
    /// Two matching terminal results disagreed (settle rule 0); the first
    /// stays canonical.
    pub disputed: bool,
    /// Newest attempts, oldest first; the last one holds the current lease.
    pub attempts: Vec<Attempt>,
    /// Every attempt ever made on this record, kept or not; also the number
    /// of the latest.
    pub attempts_total: u32,
    /// The newest [`MAX_QUARANTINE`] refused pieces of evidence, oldest first.
    pub quarantine: Vec<QuarantineEntry>,
    /// Every piece of evidence ever quarantined on this record, kept or not.
    pub quarantine_total: u64,
    /// How long the record is kept once terminal (set by the creating claim).
    pub retention_s: RetentionS,
    /// When the creating claim reserved it (store clock).
    pub created_at: Timestamp,
    /// The last progress (claim, heartbeat, lease end, settlement). Quarantine
    /// is audit, not progress, and leaves it.
    pub updated_at: Timestamp,
    /// When the record became terminal; retention counts from here.
    pub settled_at: Option<Timestamp>,
}

impl Record {
    /// The current (latest) lease, open or ended.
    pub fn lease(&self) -> Option<&Lease> {
        self.attempts.last().map(|a| &a.lease)
    }
    /// The current lease if it has not ended.
    pub fn open_lease(&self) -> Option<&Lease> {
        self.lease().filter(|l| l.is_open())
    }
    pub(crate) fn current_attempt_mut(&mut self) -> Option<&mut Attempt> {
        self.attempts.last_mut()
    }
    /// The kept attempt that holds (or held) the lease of `fence`.
    pub fn attempt_for(&self, fence: Fence) -> Option<&Attempt> {
        self.attempts.iter().rev().find(|a| a.lease.fence == fence)
    }
    pub(crate) fn attempt_for_mut(&mut self, fence: Fence) -> Option<&mut Attempt> {
        self.attempts
            .iter_mut()
            .rev()
            .find(|a| a.lease.fence == fence)
    }
    /// When a terminal record may be collected.
    pub fn expires_at(&self) -> Option<Timestamp> {
        self.settled_at
            .map(|t| t.plus_ms(self.retention_s.get().saturating_mul(1000)))
    }
    /// Terminal and past its retention at `now`.
    pub fn is_collectable(&self, now: Timestamp) -> bool {
        self.status.is_terminal() && self.expires_at().is_some_and(|e| now >= e)
    }
    /// The latest `committed_at` of any receipt on the record (canonical or per attempt).
    pub fn latest_receipt_at(&self) -> Option<Timestamp> {
        self.receipt
            .iter()
            .chain(self.attempts.iter().filter_map(|a| a.receipt.as_ref()))
            .map(|r| r.committed_at)
            .max()
    }
    /// SPEC §6.9: a receipt dated after the store's clock means the record cannot be trusted.
    pub fn is_from_the_future(&self, now: Timestamp) -> bool {
        self.latest_receipt_at().is_some_and(|t| t > now)
    }
    /// The highest fence ever granted on this record.
    pub fn last_fence(&self) -> Option<Fence> {
        self.lease().map(|l| l.fence)
    }
    /// Non-terminal, no open lease, untouched for `stuck_after_ms` at `now`.
    pub fn is_stuck(&self, now: Timestamp, stuck_after_ms: u64) -> bool {
        !self.status.is_terminal()
            && self.open_lease().is_none()
            && now.ms_since(self.updated_at) >= stuck_after_ms
    }
    pub(crate) fn quarantine(&mut self, q: QuarantineEntry) {
        self.quarantine.push(q);
        self.quarantine_total = self.quarantine_total.saturating_add(1);
        if self.quarantine.len() > MAX_QUARANTINE {
            self.quarantine.remove(0);
        }
    }
}

/// Newest generation moves kept per principal (see [`PrincipalState::left_at`]).
pub const MAX_MOVES: usize = 8;

/// One move of a principal's generation: the generation it left, and when.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Move {
    /// The generation the principal left.
    pub left: u64,
    /// When it left it (store clock).
    pub at: Timestamp,
}

/// A principal's current generation, when it last moved, and its newest
/// moves (revocation counts from the move that ended a lease).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct PrincipalState {
    /// The principal's current generation: raised by claims, plus one by revoke.
    pub generation: u64,
    /// When `generation` last moved (store clock).
    pub moved_at: Timestamp,
    /// The newest moves, oldest first; `moves_len` of them are used.
    pub moves: [Move; MAX_MOVES],
    /// How many entries of `moves` are in use (at most [`MAX_MOVES`]).
    pub moves_len: u8,
}

impl PrincipalState {
    /// A principal at generation `generation` since `moved_at`, with no history.
    pub fn at(generation: u64, moved_at: Timestamp) -> PrincipalState {
        PrincipalState {
            generation,
            moved_at,
            ..PrincipalState::default()
        }
    }
    /// A stored principal: its generation, latest move and newest moves
    /// (oldest first; only the newest [`MAX_MOVES`] are kept).
    pub fn with_moves(generation: u64, moved_at: Timestamp, moves: &[Move]) -> PrincipalState {
        let keep = &moves[moves.len().saturating_sub(MAX_MOVES)..];
        let mut st = PrincipalState::at(generation, moved_at);
        st.moves[..keep.len()].copy_from_slice(keep);
        st.moves_len = keep.len() as u8;
        st
    }
    /// The newest moves, oldest first.
    pub fn moves(&self) -> &[Move] {
        &self.moves[..(self.moves_len as usize).min(MAX_MOVES)]
    }
    /// The state after moving to `generation` at `at` (the oldest move is
    /// forgotten when [`MAX_MOVES`] are kept).
    pub fn moved(&self, generation: u64, at: Timestamp) -> PrincipalState {
        let mut next = *self;
        let m = Move {
            left: self.generation,
            at,
        };
        let n = self.moves().len();
        if n == MAX_MOVES {
            next.moves.copy_within(1.., 0);
            next.moves[MAX_MOVES - 1] = m;
        } else {
            next.moves[n] = m;
            next.moves_len = n as u8 + 1;
        }
        next.generation = generation;
        next.moved_at = at;
        next
    }
    /// When the principal left generation `generation`: the move that
    /// revoked every lease granted under it. A lease's generation is one
    /// the principal held (a claim raises the principal to it), so the
    /// first kept move that left it or a later generation is that move.
    /// If it is no longer kept (more than [`MAX_MOVES`] moves since), the
    /// oldest kept move is the earliest instant known (an upper bound).
    /// `None` while `generation` is current or above.
    pub fn left_at(&self, generation: u64) -> Option<Timestamp> {
        if generation >= self.generation {
            return None;
        }
        Some(
            self.moves()
                .iter()
                .find(|m| m.left >= generation)
                .map_or(self.moved_at, |m| m.at),
        )
    }
}

/// One bounded durable warning per `(tenant, task, class)`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Warning {
    /// The task the warning belongs to.
    pub task: TaskId,
    /// The warning's class; one warning per task and class.
    pub class: WarningClass,
    /// How many times it was raised, capped at the configured cap (default 1000).
    pub count: u64,
    /// The newest detail given; a call without one keeps it.
    pub detail: Option<Text>,
    /// When it was first raised (store clock).
    pub first_at: Timestamp,
    /// When it was last raised (store clock).
    pub last_at: Timestamp,
    /// `count` reached the cap and no longer grows.
    pub saturated: bool,
}

impl Record {
    /// Pending with an open lease: what the inspection view calls `running`
    /// (the same rank as `pending`).
    pub fn is_running(&self) -> bool {
        self.status == Status::Pending && self.open_lease().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lattice_ranks_follow_the_spec() {
        use Status::*;
        let order = [Pending, Unknown, Conflict, Failed, Completed];
        for w in order.windows(2) {
            assert!(w[0].rank() < w[1].rank());
        }
        assert_eq!(Completed.merge(Unknown), Completed);
        assert_eq!(Unknown.merge(Completed), Completed);
        assert_eq!(Conflict.merge(Pending), Conflict);
    }

    #[test]
    fn terminal_outcome_needs_result_and_digest() {
        let e = Outcome::new(OutcomeStatus::Completed, None, None, None).unwrap_err();
        assert_eq!(e.field, "outcome.response_sha256");
        let d = Digest([1; 32]);
        let e = Outcome::new(OutcomeStatus::Failed, None, Some(d), None).unwrap_err();
        assert_eq!(e.field, "outcome.result");
        assert!(Outcome::new(OutcomeStatus::Unknown, None, None, None).is_ok());
        let bad: Result<Outcome, _> = serde_json::from_str(r#"{"status":"completed"}"#);
        assert!(bad.is_err());
        let unknown_field: Result<Outcome, _> =
            serde_json::from_str(r#"{"status":"unknown","extra":1}"#);
        assert!(unknown_field.is_err());
    }
}
