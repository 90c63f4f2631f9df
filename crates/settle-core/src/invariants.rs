//! SPEC §6 invariants that can be checked on stored state.
//!
//! [`check_record`] checks one record on its own (used after every rule in
//! debug builds, by `settle check`/`inspect`, the crash tests and the model
//! test); [`check_transition`] checks one record before and after a change.

use crate::record::{MAX_ATTEMPTS, MAX_OBSERVATIONS, MAX_QUARANTINE, Purpose, Record, Status};

/// A broken invariant: which one, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{rule}: {detail}")]
pub struct Violation {
    /// A short kebab-case name of the broken rule (`receipt-matches-reservation`, ...).
    pub rule: &'static str,
    /// What was seen, for the operator.
    pub detail: String,
}

fn fail(rule: &'static str, detail: impl Into<String>) -> Result<(), Violation> {
    Err(Violation {
        rule,
        detail: detail.into(),
    })
}

/// Checks the invariants that hold for every stored record.
pub fn check_record(r: &Record) -> Result<(), Violation> {
    let terminal = r.status.is_terminal();
    // The canonical outcome and receipt exist exactly when terminal, and agree.
    if terminal != r.receipt.is_some()
        || terminal != r.outcome.is_some()
        || terminal != r.settled_at.is_some()
    {
        return fail(
            "terminal-has-receipt",
            format!(
                "status {:?} with receipt {:?}",
                r.status,
                r.receipt.is_some()
            ),
        );
    }
    if let (Some(rc), Some(o)) = (&r.receipt, &r.outcome) {
        if rc.status != r.status || o.status().status() != r.status {
            return fail(
                "receipt-matches-status",
                format!("{:?} vs {:?}", rc.status, r.status),
            );
        }
        if rc.fingerprint != r.reservation.fingerprint || rc.key != r.key || !rc.durable {
            return fail("receipt-matches-reservation", format!("{rc:?}"));
        }
        if rc.response_sha256.is_none() {
            return fail("terminal-receipt-has-digest", format!("{rc:?}"));
        }
    }
    // §6.3: at most one live lease (only the newest attempt may be open); fences increase.
    for w in r.attempts.windows(2) {
        if w[0].lease.fence >= w[1].lease.fence || w[0].number >= w[1].number {
            return fail(
                "6.3-fences-increase",
                format!("{:?} then {:?}", w[0].lease.fence, w[1].lease.fence),
            );
        }
        if w[0].lease.is_open() {
            return fail(
                "6.3-one-live-lease",
                format!("attempt {} is still open", w[0].number),
            );
        }
    }
    if let Some(l) = r.open_lease() {
        if terminal {
            return fail("terminal-no-lease", "a terminal record holds an open lease");
        }
        // §6.10: no execute lease while reconciliation is required.
        if l.purpose == Purpose::Execute && r.reconcile_required {
            return fail(
                "6.10-no-execute-while-reconciling",
                format!("fence {}", l.fence),
            );
        }
    }
    if r.reconcile_required && (terminal || r.status.rank() < Status::Unknown.rank()) {
        return fail(
            "reconcile-flag-rank",
            format!("reconcile_required with status {:?}", r.status),
        );
    }
    // Per-attempt receipts are the attempt's own settlement.
    for a in &r.attempts {
        if let Some(rc) = &a.receipt
            && (rc.fence != a.lease.fence || rc.fingerprint != r.reservation.fingerprint)
        {
            return fail(
                "attempt-receipt",
                format!("attempt {} receipt {rc:?}", a.number),
            );
        }
        if a.observations.len() > MAX_OBSERVATIONS
            || (a.observations_total as usize) < a.observations.len()
        {
            return fail("bounded-observations", format!("attempt {}", a.number));
        }
    }
    if r.attempts.len() > MAX_ATTEMPTS || (r.attempts_total as usize) < r.attempts.len() {
        return fail(
            "bounded-attempts",
            format!("{} attempts kept", r.attempts.len()),
        );
    }
    if r.quarantine.len() > MAX_QUARANTINE || (r.quarantine_total as usize) < r.quarantine.len() {
        return fail(
            "bounded-quarantine",
            format!("{} entries kept", r.quarantine.len()),
        );
    }
    if r.updated_at < r.created_at {
        return fail("timestamps", "updated_at before created_at");
    }
    Ok(())
}

/// Checks one change of the same record (same reservation, not recreated).
pub fn check_transition(before: &Record, after: &Record) -> Result<(), Violation> {
    check_record(after)?;
    // §6.1: rank never decreases.
    if after.status.rank() < before.status.rank() {
        return fail(
            "6.1-rank-monotonic",
            format!("{:?} -> {:?}", before.status, after.status),
        );
    }
    let (b, a) = (&before.reservation, &after.reservation);
    if b.fingerprint != a.fingerprint || b.principal != a.principal || b.scopes != a.scopes {
        return fail("reservation-immutable", format!("{b:?} -> {a:?}"));
    }
    if a.generation < b.generation {
        return fail(
            "generation-monotonic",
            format!("{} -> {}", b.generation, a.generation),
        );
    }
    if after.last_fence() < before.last_fence() {
        return fail(
            "6.3-fences-increase",
            format!("{:?} -> {:?}", before.last_fence(), after.last_fence()),
        );
    }
    // The first durable terminal stays canonical.
    if before.status.is_terminal()
        && (before.receipt != after.receipt || before.outcome != after.outcome)
    {
        return fail(
            "canonical-outcome-immutable",
            format!("{:?} -> {:?}", before.receipt, after.receipt),
        );
    }
    if before.disputed && !after.disputed {
        return fail("disputed-sticks", "disputed was cleared");
    }
    Ok(())
}
