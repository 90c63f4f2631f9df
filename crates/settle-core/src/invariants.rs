//! SPEC §6 invariants that can be checked on stored state.
//!
//! [`check_record`] checks one record on its own (used after every rule in
//! debug builds, by `settle check`/`inspect`, the crash tests and the model
//! test); [`check_transition`] checks one record before and after a change.

use crate::record::{
    MAX_ATTEMPTS, MAX_MOVES, MAX_OBSERVATIONS, MAX_QUARANTINE, Move, PrincipalState, Purpose,
    Record, Status,
};

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

/// Checks a stored principal: at most [`MAX_MOVES`] moves kept, the unused
/// slots empty, and each kept move left a generation below the next one's
/// and below the current one (a generation only moves up).
pub fn check_principal(p: &PrincipalState) -> Result<(), Violation> {
    let n = p.moves_len as usize;
    if n > MAX_MOVES {
        return fail(
            "bounded-moves",
            format!("{n} moves kept, at most {MAX_MOVES}"),
        );
    }
    if p.moves[n..].iter().any(|m| *m != Move::default()) {
        return fail("moves-canonical", "an unused move slot is not empty");
    }
    let kept = p.moves();
    if kept.windows(2).any(|w| w[0].left >= w[1].left) {
        return fail("moves-increase", format!("{kept:?}"));
    }
    if let Some(last) = kept.last()
        && last.left >= p.generation
    {
        return fail(
            "moves-below-generation",
            format!(
                "a move left generation {}, the current is {}",
                last.left, p.generation
            ),
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    fn moved(gens: &[u64]) -> PrincipalState {
        let mut p = PrincipalState::default();
        for (i, &g) in gens.iter().enumerate() {
            p = p.moved(g, Timestamp(i as u64 + 1));
        }
        p
    }

    #[test]
    fn a_principal_the_rules_made_passes() {
        assert_eq!(check_principal(&PrincipalState::default()), Ok(()));
        assert_eq!(check_principal(&moved(&[1, 2, 5])), Ok(()));
        // More moves than are kept: the oldest are forgotten.
        let many: Vec<u64> = (1..=20).collect();
        assert_eq!(check_principal(&moved(&many)), Ok(()));
    }

    fn rule(p: &PrincipalState) -> &'static str {
        check_principal(p).expect_err("refused").rule
    }

    #[test]
    fn a_principal_out_of_shape_is_refused_by_rule() {
        let mut p = moved(&[1, 2, 3]);
        p.moves_len = MAX_MOVES as u8 + 1;
        assert_eq!(rule(&p), "bounded-moves");
        let mut p = moved(&[1, 2, 3]);
        p.moves_len = 2;
        assert_eq!(rule(&p), "moves-canonical", "the third move is left behind");
        let mut p = moved(&[1, 2, 3]);
        p.moves.swap(0, 1);
        assert_eq!(rule(&p), "moves-increase");
        let mut p = moved(&[1, 2, 3]);
        p.moves[1].left = p.moves[0].left;
        assert_eq!(rule(&p), "moves-increase", "equal is not increasing");
        let mut p = moved(&[1, 2, 3]);
        p.generation = 2;
        assert_eq!(rule(&p), "moves-below-generation", "the last move left 2");
        // The full set of kept slots is accepted (the bound is inclusive).
        let mut p = moved(&(1..=9).collect::<Vec<_>>());
        assert_eq!(p.moves_len as usize, MAX_MOVES);
        assert_eq!(check_principal(&p), Ok(()));
        p.moves[MAX_MOVES - 1].left = p.generation;
        assert_eq!(rule(&p), "moves-below-generation");
    }
}
