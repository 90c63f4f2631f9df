// One long file on purpose: the operations' rules share their steps (the holder
// check, the evidence and its quarantine, a lease's end) and read in SPEC §4's order.
//! The rule book: one pure function per operation of SPEC §4.
//!
//! Every function takes the current state and a context (the store's `now`
//! and the next fence) and returns the decision, mutating the state in
//! place. No I/O, no clock, no randomness. An engine's only job is to load
//! the state of [`Command::target`], call [`apply`], and make the new state
//! durable before anyone hears the reply.

use crate::command::{
    Claim, ClaimDecision, Command, CommittedFinding, Dispatch, Finding, Grant, Heartbeat,
    LeaseInfo, Reconcile, Release, ReleaseReason, Reply, Revoke, Settle, Warn,
};
use crate::invariants;
use crate::record::{
    Attempt, Call, Ended, FindingKind, Lease, LeaseEnd, MAX_ATTEMPTS, MAX_WARNING_CLASSES,
    Observation, Outcome, OutcomeStatus, PrincipalState, Purpose, QuarantineEntry, Receipt, Record,
    Reservation, Status, Warning,
};
use crate::refusal::RefusalCode;
use crate::types::{
    Binding, ClaimId, DEFAULT_MAX_RESULT_BYTES, Digest, Fence, Principal, Timestamp,
};

/// Configurable limits the rules need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A settlement needs at least this much lease left (SPEC default 100 ms).
    pub lease_margin_ms: u64,
    /// Warning counts saturate here (SPEC default 1000).
    pub warning_cap: u64,
    /// A settled result's compact JSON text may be at most this long
    /// (SPEC `max_result_bytes`, default 64 KiB).
    pub max_result_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            lease_margin_ms: 100,
            warning_cap: 1000,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

/// What the store supplies besides the state: its clock and its next fence.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// The store's clock.
    pub now: Timestamp,
    /// The fence to use if this command grants a lease. The store advances
    /// its counter only when [`Applied::fence_used`] says so.
    pub next_fence: Fence,
    /// The configured limits.
    pub limits: Limits,
}

/// The generations of the principals a command needs (at most two: the
/// command's own binding principal and the record's reservation principal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Principals {
    entries: Vec<(Principal, PrincipalState, bool)>,
}

impl Principals {
    /// No principals loaded yet.
    pub fn new() -> Principals {
        Principals::default()
    }
    /// Supplies a loaded principal state (generation 0 when the store has none).
    pub fn insert(&mut self, principal: Principal, state: PrincipalState) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == principal) {
            e.1 = state;
        } else {
            self.entries.push((principal, state, false));
        }
    }
    /// Whether the engine supplied `principal`'s state.
    pub fn contains(&self, principal: &Principal) -> bool {
        self.entries.iter().any(|e| &e.0 == principal)
    }
    /// The loaded state. Panics when the engine did not load it: that is an
    /// engine bug (see [`principals_needed`]), not a protocol outcome.
    pub fn get(&self, principal: &Principal) -> PrincipalState {
        match self.entries.iter().find(|e| &e.0 == principal) {
            Some(e) => e.1,
            None => panic!("engine did not load principal {principal:?}"),
        }
    }
    fn set(&mut self, principal: &Principal, state: PrincipalState) {
        let e = self
            .entries
            .iter_mut()
            .find(|e| &e.0 == principal)
            .unwrap_or_else(|| panic!("engine did not load principal {principal:?}"));
        assert!(
            state.generation >= e.1.generation,
            "a principal's generation never decreases"
        );
        e.1 = state;
        e.2 = true;
    }
    /// Raises the generation to at least `g`.
    fn raise(&mut self, principal: &Principal, g: u64, now: Timestamp) {
        let cur = self.get(principal);
        if cur.generation < g {
            self.set(principal, cur.moved(g, now));
        }
    }
    /// Principals whose generation changed and must be written back.
    pub fn dirty(&self) -> impl Iterator<Item = (&Principal, &PrincipalState)> {
        self.entries.iter().filter(|e| e.2).map(|e| (&e.0, &e.1))
    }
    /// Forgets every principal, keeping the allocation: an engine that
    /// applies many commands reuses one `Principals` (an allocation and a
    /// free per command showed in the writer's profile).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
    /// Marks everything clean (after the engine persisted it).
    pub fn clear_dirty(&mut self) {
        for e in &mut self.entries {
            e.2 = false;
        }
    }
}

/// The principals an engine must load for `cmd` given the stored record.
pub fn principals_needed<'a>(
    cmd: &'a Command,
    record: Option<&'a Record>,
) -> impl Iterator<Item = &'a Principal> {
    let own = cmd.binding_principal();
    let owner = record.map(|r| &r.reservation.principal);
    let second = owner.filter(|o| Some(*o) != own);
    own.into_iter().chain(second)
}

/// The state a command runs against; an engine fills what [`Command::target`] names.
#[derive(Clone, Debug, Default)]
pub struct OpState {
    /// The operation record (record commands).
    pub record: Option<Record>,
    /// See [`principals_needed`].
    pub principals: Principals,
    /// The task's warnings (`warn`).
    pub warnings: Vec<Warning>,
}

/// The result of [`apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// What the rules decided, for the caller.
    pub reply: Reply,
    /// The record or the warnings changed and must be written (principals
    /// report their own changes through [`Principals::dirty`]).
    pub changed: bool,
    /// `ctx.next_fence` was consumed by a new lease.
    pub fence_used: bool,
}

impl Applied {
    /// Whether anything at all must be made durable.
    pub fn needs_commit(&self, state: &OpState) -> bool {
        self.changed || state.principals.dirty().next().is_some()
    }
}

#[derive(Default)]
struct Tx {
    /// Something must be written.
    changed: bool,
    /// A caller's action changed the record (lazy expiry alone does not
    /// count as a touch, so stuck records stay visible as stuck).
    touched: bool,
    fence_used: bool,
    /// A lapsed lease was ended (lazy expiry or revocation).
    lapsed: bool,
    /// The record was replaced by a fresh one (claim after retention), so
    /// rank monotonicity restarts.
    recreated: bool,
}

impl Tx {
    fn touch(&mut self) {
        self.changed = true;
        self.touched = true;
    }
}

/// Applies one command. The single entry point every engine calls.
///
/// The command's arguments are validated first (against the store's
/// [`Limits`] too): an invalid command is answered [`Reply::Invalid`]
/// before anything is read or written, whoever built it.
pub fn apply(state: &mut OpState, cmd: &Command, ctx: &Ctx) -> Applied {
    if let Err(e) = cmd.validate(&ctx.limits) {
        return Applied {
            reply: Reply::Invalid(e),
            changed: false,
            fence_used: false,
        };
    }
    match cmd {
        Command::Claim(c) => claim(state, c, ctx),
        Command::Heartbeat(c) => heartbeat(state, c, ctx),
        Command::Dispatch(c) => dispatch(state, c, ctx),
        Command::Settle(c) => settle(state, c, ctx),
        Command::Release(c) => release(state, c, ctx),
        Command::Reconcile(c) => reconcile(state, c, ctx),
        Command::Revoke(c) => revoke(state, c, ctx),
        Command::Warn(c) => warn(state, c, ctx),
        Command::Expire { .. } => expire(state, ctx),
        Command::Collect { .. } => collect(state, ctx),
    }
}

/// Runs one rule and checks, in production too, the invariants every rule promises.
fn run(
    state: &mut OpState,
    ctx: &Ctx,
    rule: impl FnOnce(&mut OpState, &mut Tx) -> Reply,
) -> Applied {
    let before_rank = state.record.as_ref().map(|r| r.status.rank());
    let before_fence = state.record.as_ref().and_then(|r| r.last_fence());
    let mut tx = Tx::default();

    let reply = rule(state, &mut tx);

    if let (Some(before), Some(r)) = (before_rank, state.record.as_ref())
        && !tx.recreated
    {
        assert!(
            r.status.rank() >= before,
            "SPEC §6.1 violated: status of {:?} fell from rank {before} to {:?}",
            r.key,
            r.status
        );
    }
    if tx.fence_used {
        let r = state
            .record
            .as_ref()
            .expect("a lease was granted on a record");
        assert_eq!(r.last_fence(), Some(ctx.next_fence));
        if let Some(b) = before_fence {
            assert!(
                ctx.next_fence > b,
                "SPEC §6.3 violated: fence did not increase"
            );
        }
    }
    // Checked on what the rule wrote; a record left as it was loaded is
    // the prelude's to refuse, not a reason to stop the store.
    if let Some(r) = state.record.as_mut()
        && tx.changed
    {
        assert!(
            !(r.status.is_terminal() && r.open_lease().is_some()),
            "a terminal record holds no open lease"
        );
        if tx.touched {
            r.updated_at = r.updated_at.max(ctx.now);
        }
        debug_assert_eq!(invariants::check_record(r), Ok(()));
    }
    Applied {
        reply,
        changed: tx.changed,
        fence_used: tx.fence_used,
    }
}

/// What every record command does first: refuse a record from the future,
/// treat an expired terminal record as collected, end a lapsed lease.
fn prelude(state: &mut OpState, now: Timestamp, tx: &mut Tx) -> Option<Reply> {
    if let Some(r) = state.record.as_ref() {
        // SPEC §6.9: fail closed on a record from the future; never touch it.
        // The same for a stored record that breaks a §6 invariant (damaged
        // or written by a faulty build): the rules' own asserts assume
        // valid state, and one bad record must not take a store's single
        // writer down for every tenant.
        if r.is_from_the_future(now) || invariants::check_record(r).is_err() {
            return Some(Reply::Refused(RefusalCode::RecordRefused));
        }
        // Retention: an expired terminal record is treated as collected.
        if r.is_collectable(now) {
            state.record = None;
            tx.changed = true;
            tx.recreated = true;
        }
    }
    if let Some(r) = state.record.as_mut()
        && end_lapsed_lease(r, &state.principals, now)
    {
        tx.changed = true;
        tx.lapsed = true;
    }
    None
}

/// Runs a record rule after the [`prelude`].
fn run_record(
    state: &mut OpState,
    ctx: &Ctx,
    rule: impl FnOnce(&mut OpState, &mut Tx) -> Reply,
) -> Applied {
    run(state, ctx, |state, tx| {
        if let Some(reply) = prelude(state, ctx.now, tx) {
            return reply;
        }
        rule(state, tx)
    })
}

/// The background sweep's command: ends a lapsed lease (the same rule runs lazily on every access).
pub fn expire(state: &mut OpState, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |_, tx| Reply::Expired { ended: tx.lapsed })
}

/// Collects a terminal record past its retention (the key can then be reserved afresh).
pub fn collect(state: &mut OpState, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |_, tx| Reply::Collected {
        removed: tx.recreated,
    })
}

/// Lease expiry (SPEC §4): ends the current lease if it expired or its
/// generation was revoked. Returns whether anything changed.
pub fn end_lapsed_lease(r: &mut Record, principals: &Principals, now: Timestamp) -> bool {
    let owner = principals.get(&r.reservation.principal);
    let Some(lease) = r.open_lease() else {
        return false;
    };
    // Revocation counts from the move that left the lease's generation,
    // not from the principal's latest move.
    let revoked_at = owner.left_at(lease.generation);
    let expired_at = (now >= lease.expires_at).then_some(lease.expires_at);
    let end = match (revoked_at, expired_at) {
        (Some(rv), Some(ex)) if ex < rv => Ended {
            reason: LeaseEnd::Expired,
            at: ex,
        },
        (Some(rv), _) => Ended {
            reason: LeaseEnd::Revoked,
            at: rv.min(now),
        },
        (None, Some(ex)) => Ended {
            reason: LeaseEnd::Expired,
            at: ex,
        },
        (None, None) => return false,
    };
    end_unsettled(r, end);
    true
}

/// A lease ends without a receipt: if anything may have been sent, the
/// record moves to at least `unknown` and needs reconciliation.
fn end_unsettled(r: &mut Record, end: Ended) {
    assert!(
        !r.status.is_terminal(),
        "terminal records hold no open lease"
    );
    let att = r
        .current_attempt_mut()
        .expect("an open lease has an attempt");
    assert!(att.lease.is_open());
    att.lease.ended = Some(end);
    r.updated_at = r.updated_at.max(end.at);
    let att = r.current_attempt_mut().expect("checked");
    if att.lease.may_have_dispatched() {
        r.status = r.status.merge(Status::Unknown);
        r.reconcile_required = true;
    }
}

fn end_lease(r: &mut Record, reason: LeaseEnd, now: Timestamp) {
    let att = r
        .current_attempt_mut()
        .expect("an open lease has an attempt");
    assert!(att.lease.is_open(), "only an open lease can end");
    att.lease.ended = Some(Ended { reason, at: now });
}

fn grant(r: &mut Record, c: &Claim, purpose: Purpose, ctx: &Ctx, tx: &mut Tx) -> Grant {
    // SPEC §6.10: never an execute lease while reconciliation is required.
    assert!(
        !(purpose == Purpose::Execute && r.reconcile_required),
        "SPEC §6.10 violated: execute lease while reconcile_required"
    );
    // SPEC §6.3: at most one live lease, fences strictly increase.
    assert!(
        r.open_lease().is_none(),
        "SPEC §6.3: one live lease at most"
    );
    if let Some(last) = r.last_fence() {
        assert!(ctx.next_fence > last, "SPEC §6.3: fences strictly increase");
    }
    let lease = Lease {
        fence: ctx.next_fence,
        purpose,
        generation: c.binding.generation,
        granted_at: ctx.now,
        expires_at: ctx.now.plus_ms(c.lease_ms.get()),
        lease_ms: c.lease_ms,
        marks_dispatch: c.marks_dispatch,
        dispatched: false,
        worker: c.worker.clone(),
        ended: None,
        claim_id: c.claim_id.clone(),
    };
    r.attempts_total = r.attempts_total.saturating_add(1);
    r.attempts.push(Attempt {
        number: r.attempts_total,
        lease,
        receipt: None,
        error: None,
        observations: Vec::new(),
        observations_total: 0,
    });
    if r.attempts.len() > MAX_ATTEMPTS {
        r.attempts.remove(0);
    }
    tx.touch();
    tx.fence_used = true;
    Grant {
        fence: ctx.next_fence,
        lease_expires_at: ctx.now.plus_ms(c.lease_ms.get()),
        attempt: r.attempts_total,
    }
}

/// `claim` (SPEC §4, claim rules 1–8; first match wins).
pub fn claim(state: &mut OpState, c: &Claim, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| claim_rules(state, c, ctx, tx))
}

fn claim_rules(state: &mut OpState, c: &Claim, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let now = ctx.now;
    // Rule 1: a binding below the principal's current generation, checked first.
    if c.binding.generation < state.principals.get(&c.binding.principal).generation {
        return Reply::Refused(RefusalCode::StaleBinding);
    }
    // Rule 2: no record: reserve (compare-and-set) and grant execute in one step.
    let Some(r) = state.record.as_mut() else {
        state
            .principals
            .raise(&c.binding.principal, c.binding.generation, now);
        let mut r = Record {
            key: c.key.clone(),
            reservation: Reservation {
                fingerprint: c.fingerprint,
                principal: c.binding.principal.clone(),
                scopes: c.binding.scopes.clone(),
                generation: c.binding.generation,
            },
            status: Status::Pending,
            outcome: None,
            receipt: None,
            reconcile_required: false,
            disputed: false,
            attempts: Vec::new(),
            attempts_total: 0,
            quarantine: Vec::new(),
            quarantine_total: 0,
            retention_s: c.retention_s,
            created_at: now,
            updated_at: now,
            settled_at: None,
        };
        let g = grant(&mut r, c, Purpose::Execute, ctx, tx);
        state.record = Some(r);
        return Reply::Claim(ClaimDecision::Execute(g));
    };
    // Rule 3: a mismatched caller learns nothing: no lease, no result.
    if let Some(code) = r.reservation.mismatch(&c.fingerprint, &c.binding) {
        return Reply::Refused(code);
    }
    // Rule 4: generations.
    if c.binding.generation < r.reservation.generation {
        return Reply::Refused(RefusalCode::StaleBinding);
    }
    if c.binding.generation > r.reservation.generation {
        r.reservation.generation = c.binding.generation;
        state
            .principals
            .raise(&c.binding.principal, c.binding.generation, now);
        // The older-generation lease is revoked as if it expired now.
        end_lapsed_lease(r, &state.principals, now);
        tx.touch();
    }
    // Rule 5: settled: the one true outcome.
    if r.status.is_terminal() {
        let outcome = r.outcome.clone().expect("terminal records have an outcome");
        let receipt = r.receipt.clone().expect("terminal records have a receipt");
        return Reply::Claim(ClaimDecision::Replay { outcome, receipt });
    }
    // Rule 5a: a retry of the claim that was granted the live lease (its
    // answer was lost) gets the same grant; nothing changes.
    if let Some(decision) = c.claim_id.as_ref().and_then(|id| same_grant(r, id)) {
        return Reply::Claim(decision);
    }
    // Rule 6: someone holds a live lease.
    if let Some(l) = r.open_lease() {
        let retry_after_ms = l.expires_at.ms_since(now).clamp(10, 1000);
        return Reply::Claim(ClaimDecision::InFlight {
            retry_after_ms,
            lease_expires_at: l.expires_at,
        });
    }
    // Rule 7: an effect may have happened: find out before writing.
    if r.reconcile_required {
        let g = grant(r, c, Purpose::Reconcile, ctx, tx);
        return Reply::Claim(ClaimDecision::Reconcile(g));
    }
    // Rule 8: pending, or conflict without the flag.
    let g = grant(r, c, Purpose::Execute, ctx, tx);
    Reply::Claim(ClaimDecision::Execute(g))
}

/// Claim rule 5a: the grant first answered to the claim `id`, if the live
/// lease was granted to it. Lazy expiry and revocation already ran, so an
/// open lease is unexpired and unrevoked. A reconcile lease that a
/// `not_committed` finding turned into an execute lease was first answered
/// `reconcile`.
fn same_grant(r: &Record, id: &ClaimId) -> Option<ClaimDecision> {
    let att = r.attempts.last()?;
    let lease = &att.lease;
    if !lease.is_open() || lease.claim_id.as_ref() != Some(id) {
        return None;
    }
    let grant = Grant {
        fence: lease.fence,
        lease_expires_at: lease.granted_at.plus_ms(lease.lease_ms.get()),
        attempt: att.number,
    };
    let was_reconcile = lease.purpose == Purpose::Reconcile
        || att.observations.iter().any(|o| {
            o.accepted && o.call == Call::Reconcile && o.finding == Some(FindingKind::NotCommitted)
        });
    Some(if was_reconcile {
        ClaimDecision::Reconcile(grant)
    } else {
        ClaimDecision::Execute(grant)
    })
}

/// Checks that `fence` holds the record's current lease (settle rule 1 and
/// its uses in heartbeat, dispatch, release and reconcile).
fn check_holder(
    r: &Record,
    fence: Fence,
    purpose: Option<Purpose>,
    margin_ms: Option<u64>,
    now: Timestamp,
) -> Result<(), RefusalCode> {
    let Some(lease) = r.lease().filter(|l| l.fence == fence) else {
        return Err(RefusalCode::StaleFence);
    };
    if let Some(end) = lease.ended
        && !end.reason.lapsed()
    {
        return Err(RefusalCode::StaleFence);
    }
    if let Some(p) = purpose
        && lease.purpose != p
    {
        return Err(RefusalCode::WrongPurpose);
    }
    if lease.ended.is_some() {
        return Err(RefusalCode::LeaseExpired);
    }
    let margin = margin_ms.unwrap_or(0);
    if now.plus_ms(margin) > lease.expires_at || now >= lease.expires_at {
        return Err(RefusalCode::LeaseExpired);
    }
    Ok(())
}

/// `heartbeat`: extends an open lease; never revives an ended one.
pub fn heartbeat(state: &mut OpState, c: &Heartbeat, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| heartbeat_rules(state, c, ctx, tx))
}

fn heartbeat_rules(state: &mut OpState, c: &Heartbeat, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let Some(r) = state.record.as_mut() else {
        return Reply::Refused(RefusalCode::NotFound);
    };
    if let Err(code) = check_holder(r, c.fence, None, None, ctx.now) {
        return Reply::Refused(code);
    }
    let lease = &mut r.current_attempt_mut().expect("checked").lease;
    let ms = c.lease_ms.unwrap_or(lease.lease_ms).get();
    // Extends, never shortens.
    let new_expiry = lease.expires_at.max(ctx.now.plus_ms(ms));
    if new_expiry != lease.expires_at {
        lease.expires_at = new_expiry;
        tx.touch();
    }
    Reply::Heartbeat(LeaseInfo {
        fence: lease.fence,
        lease_expires_at: lease.expires_at,
    })
}

/// `dispatch`: the holder of the execute lease is about to write remotely.
/// Needs the same margin as a settlement: a lease about to lapse must not start a write.
pub fn dispatch(state: &mut OpState, c: &Dispatch, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| dispatch_rules(state, c, ctx, tx))
}

fn dispatch_rules(state: &mut OpState, c: &Dispatch, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let Some(r) = state.record.as_mut() else {
        return Reply::Refused(RefusalCode::NotFound);
    };
    if let Err(code) = check_holder(
        r,
        c.fence,
        Some(Purpose::Execute),
        Some(ctx.limits.lease_margin_ms),
        ctx.now,
    ) {
        return Reply::Refused(code);
    }
    let lease = &mut r.current_attempt_mut().expect("checked").lease;
    if !lease.dispatched {
        lease.dispatched = true;
        tx.touch();
    }
    Reply::Dispatched(LeaseInfo {
        fence: lease.fence,
        lease_expires_at: lease.expires_at,
    })
}

/// Terminal or unknown evidence as presented by a worker.
struct Evidence<'a> {
    call: Call,
    fence: Fence,
    fingerprint: &'a Digest,
    binding: &'a Binding,
    outcome: &'a Outcome,
}

fn observation(e: &Evidence<'_>, now: Timestamp, code: Option<RefusalCode>) -> Observation {
    Observation {
        at: now,
        call: e.call,
        status: Some(e.outcome.status()),
        finding: (e.call == Call::Reconcile).then_some(FindingKind::Committed),
        response_sha256: e.outcome.response_sha256(),
        accepted: code.is_none(),
        code,
    }
}

/// Refuses evidence: quarantined on the record, observed on its attempt.
fn quarantine_evidence(r: &mut Record, e: &Evidence<'_>, code: RefusalCode, now: Timestamp) {
    r.quarantine(QuarantineEntry {
        at: now,
        fence: e.fence,
        reason: code,
        call: e.call,
        status: Some(e.outcome.status()),
        finding: (e.call == Call::Reconcile).then_some(FindingKind::Committed),
        fingerprint: Some(*e.fingerprint),
        binding: Some(e.binding.clone()),
        response_sha256: e.outcome.response_sha256(),
    });
    if let Some(att) = r.attempt_for_mut(e.fence) {
        att.observe(observation(e, now, Some(code)));
    }
}

fn quarantine_finding(
    r: &mut Record,
    fence: Fence,
    kind: FindingKind,
    code: RefusalCode,
    now: Timestamp,
) {
    r.quarantine(QuarantineEntry {
        at: now,
        fence,
        reason: code,
        call: Call::Reconcile,
        status: None,
        finding: Some(kind),
        fingerprint: None,
        binding: None,
        response_sha256: None,
    });
    if let Some(att) = r.attempt_for_mut(fence) {
        att.observe(Observation {
            at: now,
            call: Call::Reconcile,
            status: None,
            finding: Some(kind),
            response_sha256: None,
            accepted: false,
            code: Some(code),
        });
    }
}

/// `settle` (SPEC §4, settle rules 0–4).
pub fn settle(state: &mut OpState, c: &Settle, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| settle_rules(state, c, ctx, tx))
}

fn settle_rules(state: &mut OpState, c: &Settle, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let now = ctx.now;
    let owner_generation = match state.record.as_ref() {
        Some(r) => state.principals.get(&r.reservation.principal).generation,
        None => return Reply::Refused(RefusalCode::NotFound),
    };
    let r = state.record.as_mut().expect("checked above");
    let e = Evidence {
        call: Call::Settle,
        fence: c.fence,
        fingerprint: &c.fingerprint,
        binding: &c.binding,
        outcome: &c.outcome,
    };
    let matches = r.reservation.mismatch(&c.fingerprint, &c.binding).is_none();

    // A repeated `unknown` from a fence that already holds its `unknown`
    // receipt: the worker lost the acknowledgement.
    if c.outcome.status() == OutcomeStatus::Unknown
        && matches
        && let Some(receipt) = r
            .attempt_for(c.fence)
            .and_then(|a| a.receipt.as_ref())
            .filter(|rc| rc.status == Status::Unknown)
    {
        return Reply::Receipt(receipt.clone());
    }

    // Rule 0: matching terminal evidence on a terminal record.
    if let Some(reply) = settled_evidence(r, &e, now, tx) {
        return reply;
    }

    // Rule 1: the current, unexpired execute lease with margin to spare.
    if let Err(code) = check_holder(
        r,
        c.fence,
        Some(Purpose::Execute),
        Some(ctx.limits.lease_margin_ms),
        now,
    ) {
        quarantine_evidence(r, &e, code, now);
        // Quarantine is audit, not progress: `updated_at` stays, so a
        // zombie retrying in a loop cannot keep a record off the stuck list.
        tx.changed = true;
        return Reply::Refused(code);
    }

    settle_as_holder(r, &e, owner_generation, now, tx)
}

/// Settle rule 0, shared by `settle` and `reconcile(committed)`: terminal
/// evidence matching the reservation on a record that is already terminal.
/// The same fence with the same result is a retry that lost its
/// acknowledgement (the original receipt, nothing changes); a different
/// result disputes the record; the same result from another fence is stale.
fn settled_evidence(
    r: &mut Record,
    e: &Evidence<'_>,
    now: Timestamp,
    tx: &mut Tx,
) -> Option<Reply> {
    if !(r.status.is_terminal()
        && e.outcome.status().is_terminal()
        && r.reservation.mismatch(e.fingerprint, e.binding).is_none())
    {
        return None;
    }
    let canon = r.receipt.clone().expect("terminal records have a receipt");
    let same_result = canon.status == e.outcome.status().status()
        && canon.response_sha256 == e.outcome.response_sha256();
    if same_result && canon.fence == e.fence {
        return Some(Reply::Receipt(canon));
    }
    let code = if same_result {
        RefusalCode::StaleFence
    } else {
        r.disputed = true;
        RefusalCode::ResultMismatch
    };
    quarantine_evidence(r, e, code, now);
    // Not progress (the canonical outcome is unchanged): `updated_at` stays.
    tx.changed = true;
    Some(Reply::Refused(code))
}

/// Settle rules 2–4, shared by `settle` and `reconcile(committed)`; the
/// caller holds the current lease (rule 1 passed).
fn settle_as_holder(
    r: &mut Record,
    e: &Evidence<'_>,
    owner_generation: u64,
    now: Timestamp,
    tx: &mut Tx,
) -> Reply {
    // Rule 2: the holder reported for another request: wrong intent under this lease.
    if let Some(code) = r.reservation.mismatch(e.fingerprint, e.binding) {
        // The lease ends and the status may move: that is progress.
        tx.touch();
        quarantine_evidence(r, e, code, now);
        r.status = r.status.merge(Status::Conflict);
        let dispatched = r.lease().expect("holder").may_have_dispatched();
        end_lease(r, LeaseEnd::Refused, now);
        if dispatched {
            r.reconcile_required = true;
        }
        return Reply::Refused(code);
    }
    // Rule 3: the binding generation must be the reservation's and the principal's.
    if e.binding.generation != r.reservation.generation || e.binding.generation != owner_generation
    {
        quarantine_evidence(r, e, RefusalCode::StaleBinding, now);
        // Quarantine only: not progress.
        tx.changed = true;
        return Reply::Refused(RefusalCode::StaleBinding);
    }
    // Rule 4: merge by rank, write the receipt, release the lease: one commit.
    tx.touch();
    let status = e.outcome.status().status();
    let receipt = Receipt {
        key: r.key.clone(),
        fingerprint: r.reservation.fingerprint,
        response_sha256: e.outcome.response_sha256(),
        status,
        fence: e.fence,
        committed_at: now,
        durable: true,
    };
    if status.is_terminal() {
        assert!(!r.status.is_terminal(), "rule 0 handles terminal records");
        r.status = r.status.merge(status);
        assert_eq!(
            r.status, status,
            "terminal evidence outranks every open status"
        );
        r.outcome = Some(e.outcome.clone());
        r.receipt = Some(receipt.clone());
        r.settled_at = Some(now);
        r.reconcile_required = false;
    } else {
        r.status = r.status.merge(Status::Unknown);
        r.reconcile_required = true;
    }
    end_lease(r, LeaseEnd::Settled, now);
    let obs = observation(e, now, None);
    let att = r.current_attempt_mut().expect("holder");
    att.receipt = Some(receipt.clone());
    att.error = e.outcome.error().cloned();
    att.observe(obs);
    Reply::Receipt(receipt)
}

/// `release`: ends an execute lease without a receipt: when nothing could
/// have been sent (`not_dispatched`), or when the holder attests the remote
/// definitively refused the effect (`not_committed`).
pub fn release(state: &mut OpState, c: &Release, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| release_rules(state, c, ctx, tx))
}

fn release_rules(state: &mut OpState, c: &Release, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let Some(r) = state.record.as_mut() else {
        return Reply::Refused(RefusalCode::NotFound);
    };
    let end = match c.reason {
        ReleaseReason::NotDispatched => LeaseEnd::Released,
        // The holder attests nothing was applied: the status stays, no
        // flag is set, the lease's end records the attestation, and the
        // next claim executes (SPEC §4 release).
        ReleaseReason::NotCommitted => LeaseEnd::NotCommitted,
    };
    // A repeat of the release that ended this fence's lease, with the same
    // reason: its acknowledgement was lost. Nothing changes.
    if ended_by(r, c.fence, end) {
        return Reply::Released { fence: c.fence };
    }
    // No margin: ending a lease early is harmless when nothing happened
    // remotely, and the store's clock decides whether it is still held.
    if let Err(code) = check_holder(r, c.fence, Some(Purpose::Execute), None, ctx.now) {
        return Reply::Refused(code);
    }
    if end == LeaseEnd::Released && r.lease().expect("checked").may_have_dispatched() {
        return Reply::Refused(RefusalCode::ReceiptRequired);
    }
    if c.forget && !forgettable(r) {
        return Reply::Refused(RefusalCode::ReceiptRequired);
    }
    end_lease(r, end, ctx.now);
    if c.forget {
        // Removed as if collected: the key may be reserved afresh; fences
        // are store-wide, so none of this record's is ever handed out again.
        state.record = None;
        tx.changed = true;
        tx.recreated = true;
    } else {
        tx.touch();
    }
    Reply::Released { fence: c.fence }
}

/// Whether the attempt of `fence` (still kept) holds a lease that ended
/// for `reason`.
fn ended_by(r: &Record, fence: Fence, reason: LeaseEnd) -> bool {
    r.attempt_for(fence)
        .and_then(|a| a.lease.ended)
        .is_some_and(|e| e.reason == reason)
}

/// `release(forget)` (SPEC §4): only a record that would be `pending` with
/// nothing recorded but leases: no receipt (an `unknown` settlement moves
/// the status, so `pending` also means none was ever settled), no
/// reconciliation owed, no dispute, no quarantined evidence.
fn forgettable(r: &Record) -> bool {
    r.status == Status::Pending
        && r.receipt.is_none()
        && !r.reconcile_required
        && !r.disputed
        && r.quarantine_total == 0
        && r.attempts.iter().all(|a| a.receipt.is_none())
}

/// `reconcile` (SPEC §4): only for the current lease of purpose `reconcile`.
pub fn reconcile(state: &mut OpState, c: &Reconcile, ctx: &Ctx) -> Applied {
    run_record(state, ctx, |state, tx| reconcile_rules(state, c, ctx, tx))
}

fn committed_evidence(fence: Fence, f: &CommittedFinding) -> Evidence<'_> {
    Evidence {
        call: Call::Reconcile,
        fence,
        fingerprint: f.fingerprint(),
        binding: f.binding(),
        outcome: f.outcome(),
    }
}

/// A retried `reconcile(not_committed)` whose first answer was lost: the
/// fence's lease is the current one, already turned into an `execute`
/// lease by an accepted `not_committed` finding, and not dispatched since.
fn not_committed_retry(r: &Record, fence: Fence) -> bool {
    let Some(att) = r.attempts.last().filter(|a| a.lease.fence == fence) else {
        return false;
    };
    att.lease.purpose == Purpose::Execute
        && !att.lease.dispatched
        && att.observations.iter().any(|o| {
            o.accepted && o.call == Call::Reconcile && o.finding == Some(FindingKind::NotCommitted)
        })
}

/// The holder of the reconcile lease reports that the remote never committed:
/// the same lease turns into an execute lease under the same fence.
fn not_committed_as_holder(
    r: &mut Record,
    kind: FindingKind,
    now: Timestamp,
    tx: &mut Tx,
) -> Reply {
    // The remote confirms nothing happened: execute under the same fence.
    r.reconcile_required = false;
    let att = r.current_attempt_mut().expect("holder");
    att.observe(Observation {
        at: now,
        call: Call::Reconcile,
        status: None,
        finding: Some(kind),
        response_sha256: None,
        accepted: true,
        code: None,
    });
    let lease = &mut att.lease;
    lease.purpose = Purpose::Execute;
    lease.dispatched = false;
    lease.expires_at = lease.expires_at.max(now.plus_ms(lease.lease_ms.get()));
    tx.touch();
    Reply::Claim(ClaimDecision::Execute(Grant {
        fence: lease.fence,
        lease_expires_at: lease.expires_at,
        attempt: att.number,
    }))
}

fn reconcile_rules(state: &mut OpState, c: &Reconcile, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let now = ctx.now;
    let owner_generation = match state.record.as_ref() {
        Some(r) => state.principals.get(&r.reservation.principal).generation,
        None => return Reply::Refused(RefusalCode::NotFound),
    };
    let r = state.record.as_mut().expect("checked above");
    let kind = match &c.finding {
        Finding::Committed(_) => FindingKind::Committed,
        Finding::NotCommitted => FindingKind::NotCommitted,
        Finding::Unavailable => FindingKind::Unavailable,
    };
    // Rule 0 for a committed finding: a retry after a lost acknowledgement
    // gets its receipt, like a settle retry.
    if let Finding::Committed(f) = &c.finding
        && let Some(reply) = settled_evidence(r, &committed_evidence(c.fence, f), now, tx)
    {
        return reply;
    }
    // A repeated `unavailable` from the fence whose lease it ended: the
    // acknowledgement was lost. Nothing changes.
    if matches!(c.finding, Finding::Unavailable) && ended_by(r, c.fence, LeaseEnd::Unavailable) {
        return Reply::Released { fence: c.fence };
    }
    // A repeated `not_committed` after a lost acknowledgement: the same
    // grant, nothing changes (as long as the lease was not dispatched since).
    if matches!(c.finding, Finding::NotCommitted) && not_committed_retry(r, c.fence) {
        match check_holder(
            r,
            c.fence,
            Some(Purpose::Execute),
            Some(ctx.limits.lease_margin_ms),
            now,
        ) {
            Ok(()) => {
                let att = r.attempts.last().expect("checked");
                return Reply::Claim(ClaimDecision::Execute(Grant {
                    fence: att.lease.fence,
                    lease_expires_at: att.lease.expires_at,
                    attempt: att.number,
                }));
            }
            Err(code) => {
                quarantine_finding(r, c.fence, kind, code, now);
                tx.changed = true;
                return Reply::Refused(code);
            }
        }
    }
    if let Err(code) = check_holder(
        r,
        c.fence,
        Some(Purpose::Reconcile),
        Some(ctx.limits.lease_margin_ms),
        now,
    ) {
        match &c.finding {
            Finding::Committed(f) => {
                quarantine_evidence(r, &committed_evidence(c.fence, f), code, now)
            }
            _ => quarantine_finding(r, c.fence, kind, code, now),
        }
        // Quarantine is audit, not progress: `updated_at` stays.
        tx.changed = true;
        return Reply::Refused(code);
    }
    match &c.finding {
        Finding::Committed(f) => {
            // A committed finding always carries terminal evidence
            // (`CommittedFinding` and `apply`'s validation both check it).
            settle_as_holder(
                r,
                &committed_evidence(c.fence, f),
                owner_generation,
                now,
                tx,
            )
        }
        Finding::NotCommitted => not_committed_as_holder(r, kind, now, tx),
        Finding::Unavailable => {
            // Released; the flag stays so later claims keep reconciling.
            let att = r.current_attempt_mut().expect("holder");
            att.observe(Observation {
                at: now,
                call: Call::Reconcile,
                status: None,
                finding: Some(kind),
                response_sha256: None,
                accepted: true,
                code: None,
            });
            end_lease(r, LeaseEnd::Unavailable, now);
            tx.touch();
            Reply::Released { fence: c.fence }
        }
    }
}

/// `revoke`: the principal's generation moves to current + 1; older leases
/// lapse lazily from this instant.
pub fn revoke(state: &mut OpState, c: &Revoke, ctx: &Ctx) -> Applied {
    run(state, ctx, |state, _| revoke_rules(state, c, ctx))
}

fn revoke_rules(state: &mut OpState, c: &Revoke, ctx: &Ctx) -> Reply {
    let cur = state.principals.get(&c.principal);
    let Some(next) = cur.generation.checked_add(1) else {
        return Reply::Refused(RefusalCode::GenerationExhausted);
    };
    state.principals.set(&c.principal, cur.moved(next, ctx.now));
    Reply::Revoked {
        principal: c.principal.clone(),
        generation: next,
    }
}

/// `warn`: one bounded record per `(task, class)`.
pub fn warn(state: &mut OpState, c: &Warn, ctx: &Ctx) -> Applied {
    run(state, ctx, |state, tx| warn_rules(state, c, ctx, tx))
}

fn warn_rules(state: &mut OpState, c: &Warn, ctx: &Ctx, tx: &mut Tx) -> Reply {
    let cap = ctx.limits.warning_cap.max(1);
    let ws = &mut state.warnings;
    let w = if let Some(w) = ws.iter_mut().find(|w| w.class == c.class) {
        w.count = (w.count.saturating_add(1)).min(cap);
        w.saturated = w.count >= cap;
        if c.detail.is_some() {
            w.detail = c.detail.clone();
        }
        w.last_at = w.last_at.max(ctx.now);
        w.clone()
    } else {
        if ws.len() >= MAX_WARNING_CLASSES {
            return Reply::Refused(RefusalCode::TooManyClasses);
        }
        let w = Warning {
            task: c.task.clone(),
            class: c.class.clone(),
            count: 1,
            detail: c.detail.clone(),
            first_at: ctx.now,
            last_at: ctx.now,
            saturated: 1 >= cap,
        };
        ws.push(w.clone());
        w
    };
    tx.touch();
    Reply::Warning(w)
}

/// The `get` view at `now`: lazy expiry applied to a copy; `None` when the
/// record expired and counts as collected. A record from the future is
/// refused (SPEC §6.9).
pub fn view_at(
    record: Option<&Record>,
    principals: &Principals,
    now: Timestamp,
) -> Result<Option<Record>, RefusalCode> {
    let Some(r) = record else { return Ok(None) };
    if r.is_from_the_future(now) || invariants::check_record(r).is_err() {
        return Err(RefusalCode::RecordRefused);
    }
    if r.is_collectable(now) {
        return Ok(None);
    }
    let mut r = r.clone();
    end_lapsed_lease(&mut r, principals, now);
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{binding, claim, key, settle, unknown};
    use crate::world::World;

    /// A cleared `Principals` (an engine reuses one for every command)
    /// holds nothing of the command before: no state, nothing to write back.
    #[test]
    fn cleared_principals_hold_nothing() {
        let alice = Principal::new("alice").unwrap();
        let mut ps = Principals::new();
        ps.insert(alice.clone(), PrincipalState::at(3, Timestamp(5)));
        ps.raise(&alice, 4, Timestamp(6));
        assert_eq!(ps.dirty().count(), 1);
        ps.clear();
        assert!(!ps.contains(&alice));
        assert_eq!(ps.dirty().count(), 0);
        assert_eq!(ps, Principals::new());
        ps.insert(alice.clone(), PrincipalState::at(1, Timestamp(7)));
        assert_eq!(ps.get(&alice).generation, 1);
        assert_eq!(ps.dirty().count(), 0);
    }

    /// A record at `unknown` (its lease settled with `unknown`), loaded as an engine would.
    fn unknown_state() -> (OpState, Ctx) {
        let mut w = World::default();
        let t = crate::TenantId::default_tenant();
        let now = Timestamp(1_000);
        let Reply::Claim(ClaimDecision::Execute(g)) = w
            .execute(&t, &claim("a", 1, binding("alice", 0)), now)
            .reply
        else {
            panic!("expected execute")
        };
        w.execute(
            &t,
            &settle("a", g.fence, 1, binding("alice", 0), unknown()),
            now,
        );
        let record = w.records.get(&(t, key("a"))).cloned();
        assert_eq!(record.as_ref().map(|r| r.status), Some(Status::Unknown));
        let state = OpState {
            record,
            ..OpState::default()
        };
        let ctx = Ctx {
            now,
            next_fence: Fence(2),
            limits: Limits::default(),
        };
        (state, ctx)
    }

    /// A rule that lowers the record's status back to `pending`.
    fn lower(state: &mut OpState, tx: &mut Tx, recreated: bool) -> Reply {
        let r = state.record.as_mut().expect("a record");
        r.status = Status::Pending;
        r.reconcile_required = false;
        tx.recreated = recreated;
        Reply::Expired { ended: false }
    }

    #[test]
    #[should_panic(expected = "SPEC §6.1 violated")]
    fn the_rule_runner_stops_a_rule_that_lowers_a_records_rank() {
        let (mut state, ctx) = unknown_state();
        run(&mut state, &ctx, |state, tx| lower(state, tx, false));
    }

    #[test]
    fn a_recreated_record_starts_the_lattice_again() {
        let (mut state, ctx) = unknown_state();
        let applied = run(&mut state, &ctx, |state, tx| lower(state, tx, true));
        assert_eq!(applied.reply, Reply::Expired { ended: false });
        assert_eq!(state.record.map(|r| r.status), Some(Status::Pending));
    }
}
