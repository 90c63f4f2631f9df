//! Each SPEC §6 check of `invariants` on its own: a valid record made by
//! the rules passes, and breaking exactly one thing is reported under the
//! rule that names it. The model test only ever shows these checks valid
//! state; `settle check`, `inspect`, the crash tests and the rules'
//! prelude rely on them to refuse damaged state.

mod common;

use common::*;
use settle_core::invariants::{check_record, check_transition};
use settle_core::*;

/// A pending record holding its first, open execute lease.
fn open() -> Record {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 0)));
    h.rec("a")
}

/// A completed record (one attempt, settled).
fn settled() -> Record {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    h.rec("a")
}

/// An `unknown` record needing reconciliation, its first lease expired and
/// its second (a reconcile lease) open.
fn reconciling() -> Record {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 0)));
    h.advance(30_000);
    match h.run(claim("a", 1, binding("alice", 0))) {
        Reply::Claim(ClaimDecision::Reconcile(_)) => {}
        other => panic!("expected reconcile, got {other:?}"),
    }
    h.rec("a")
}

/// The rule `check_record` names for `r`, or `None` when it passes.
fn broken(r: &Record) -> Option<&'static str> {
    check_record(r).err().map(|v| v.rule)
}

fn broken_by(before: &Record, after: &Record) -> Option<&'static str> {
    check_transition(before, after).err().map(|v| v.rule)
}

#[test]
fn records_made_by_the_rules_are_valid() {
    for r in [open(), settled(), reconciling()] {
        assert_eq!(check_record(&r), Ok(()), "{r:?}");
        assert_eq!(check_transition(&r, &r), Ok(()));
    }
    let r = reconciling();
    assert_eq!(r.status, Status::Unknown);
    assert!(r.reconcile_required);
    assert_eq!(r.attempts.len(), 2);
}

#[test]
fn a_violation_names_its_rule_and_what_was_seen() {
    let mut r = open();
    r.updated_at = Timestamp(r.created_at.0 - 1);
    let v = check_record(&r).unwrap_err();
    assert_eq!(v.rule, "timestamps");
    assert_eq!(v.to_string(), "timestamps: updated_at before created_at");
}

#[test]
fn receipt_outcome_and_settlement_time_exist_exactly_when_terminal() {
    let done = settled();
    let mut r = done.clone();
    r.receipt = None;
    assert_eq!(broken(&r), Some("terminal-has-receipt"));
    let mut r = done.clone();
    r.outcome = None;
    assert_eq!(broken(&r), Some("terminal-has-receipt"));
    let mut r = done.clone();
    r.settled_at = None;
    assert_eq!(broken(&r), Some("terminal-has-receipt"));

    let mut r = reconciling();
    r.receipt = done.receipt.clone();
    assert_eq!(broken(&r), Some("terminal-has-receipt"));
    let mut r = reconciling();
    r.outcome = done.outcome.clone();
    assert_eq!(broken(&r), Some("terminal-has-receipt"));
    let mut r = reconciling();
    r.settled_at = done.settled_at;
    assert_eq!(broken(&r), Some("terminal-has-receipt"));
}

#[test]
fn the_receipt_and_outcome_carry_the_records_status() {
    let mut r = settled();
    r.receipt.as_mut().unwrap().status = Status::Failed;
    assert_eq!(broken(&r), Some("receipt-matches-status"));
    let mut r = settled();
    r.outcome = Some(failed(1));
    assert_eq!(broken(&r), Some("receipt-matches-status"));
}

#[test]
fn the_receipt_belongs_to_the_reservation_and_is_durable() {
    let mut r = settled();
    r.receipt.as_mut().unwrap().fingerprint = fp(9);
    assert_eq!(broken(&r), Some("receipt-matches-reservation"));
    let mut r = settled();
    r.receipt.as_mut().unwrap().key = key("b");
    assert_eq!(broken(&r), Some("receipt-matches-reservation"));
    let mut r = settled();
    r.receipt.as_mut().unwrap().durable = false;
    assert_eq!(broken(&r), Some("receipt-matches-reservation"));
    let mut r = settled();
    r.receipt.as_mut().unwrap().response_sha256 = None;
    assert_eq!(broken(&r), Some("terminal-receipt-has-digest"));
}

#[test]
fn attempts_have_increasing_fences_and_numbers() {
    let mut r = reconciling();
    r.attempts[1].lease.fence = r.attempts[0].lease.fence;
    assert_eq!(broken(&r), Some("6.3-fences-increase"));
    let mut r = reconciling();
    r.attempts[1].number = r.attempts[0].number;
    assert_eq!(broken(&r), Some("6.3-fences-increase"));
}

#[test]
fn only_the_newest_attempt_may_hold_an_open_lease() {
    let mut r = reconciling();
    r.attempts[0].lease.ended = None;
    assert_eq!(broken(&r), Some("6.3-one-live-lease"));
}

#[test]
fn a_terminal_record_holds_no_open_lease() {
    let mut r = settled();
    r.attempts[0].lease.ended = None;
    assert_eq!(broken(&r), Some("terminal-no-lease"));
}

#[test]
fn no_execute_lease_while_reconciliation_is_required() {
    let mut r = reconciling();
    r.attempts[1].lease.purpose = Purpose::Execute;
    assert_eq!(broken(&r), Some("6.10-no-execute-while-reconciling"));
    // An open execute lease without the flag is a running record.
    assert_eq!(broken(&open()), None);
}

#[test]
fn reconciliation_is_required_only_of_open_records_at_unknown_or_above() {
    let mut r = open();
    r.attempts[0].lease.purpose = Purpose::Reconcile;
    r.reconcile_required = true;
    assert_eq!(broken(&r), Some("reconcile-flag-rank"));
    let mut r = settled();
    r.reconcile_required = true;
    assert_eq!(broken(&r), Some("reconcile-flag-rank"));
    for status in [Status::Unknown, Status::Conflict] {
        let mut r = reconciling();
        r.status = status;
        assert_eq!(broken(&r), None, "{status:?}");
    }
}

#[test]
fn an_attempts_receipt_is_its_own_settlement() {
    let mut r = settled();
    r.attempts[0].receipt.as_mut().unwrap().fence = Fence(99);
    assert_eq!(broken(&r), Some("attempt-receipt"));
    let mut r = settled();
    r.attempts[0].receipt.as_mut().unwrap().fingerprint = fp(9);
    assert_eq!(broken(&r), Some("attempt-receipt"));
}

#[test]
fn observations_are_bounded_and_counted() {
    let r = settled();
    assert_eq!(r.attempts[0].observations.len(), 1);
    let obs = r.attempts[0].observations[0].clone();
    let mut full = r.clone();
    full.attempts[0].observations = vec![obs.clone(); 32];
    full.attempts[0].observations_total = 32;
    assert_eq!(broken(&full), None);
    let mut over = full.clone();
    over.attempts[0].observations.push(obs);
    over.attempts[0].observations_total = 40;
    assert_eq!(broken(&over), Some("bounded-observations"));
    let mut undercounted = full;
    undercounted.attempts[0].observations_total = 31;
    assert_eq!(broken(&undercounted), Some("bounded-observations"));
}

/// `r` with its attempts extended to `n` closed ones before the current one.
fn with_attempts(r: &Record, n: usize) -> Record {
    let mut r = r.clone();
    let last = r.attempts.pop().unwrap();
    let mut first = r.attempts[0].clone();
    r.attempts.clear();
    for i in 0..n - 1 {
        first.number = i as u32 + 1;
        first.lease.fence = Fence(i as u64 + 1);
        r.attempts.push(first.clone());
    }
    let mut last = last;
    last.number = n as u32;
    last.lease.fence = Fence(n as u64);
    r.attempts.push(last);
    r.attempts_total = n as u32;
    r
}

#[test]
fn attempts_are_bounded_and_counted() {
    let full = with_attempts(&reconciling(), 32);
    assert_eq!(broken(&full), None);
    let over = with_attempts(&reconciling(), 33);
    assert_eq!(broken(&over), Some("bounded-attempts"));
    let mut undercounted = full;
    undercounted.attempts_total = 31;
    assert_eq!(broken(&undercounted), Some("bounded-attempts"));
}

#[test]
fn quarantine_is_bounded_and_counted() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle(
        "a",
        Fence(f.0 + 1),
        1,
        binding("alice", 0),
        completed(1),
    ));
    let r = h.rec("a");
    assert_eq!(r.quarantine.len(), 1);
    let q = r.quarantine[0].clone();
    let mut full = r.clone();
    full.quarantine = vec![q.clone(); 32];
    full.quarantine_total = 32;
    assert_eq!(broken(&full), None);
    let mut over = full.clone();
    over.quarantine.push(q);
    over.quarantine_total = 33;
    assert_eq!(broken(&over), Some("bounded-quarantine"));
    let mut undercounted = full;
    undercounted.quarantine_total = 31;
    assert_eq!(broken(&undercounted), Some("bounded-quarantine"));
}

#[test]
fn a_record_is_not_updated_before_it_was_created() {
    let mut r = open();
    r.updated_at = r.created_at;
    assert_eq!(broken(&r), None);
    r.updated_at = Timestamp(r.created_at.0 - 1);
    assert_eq!(broken(&r), Some("timestamps"));
}

#[test]
fn a_transition_checks_the_record_after_it() {
    let before = open();
    let mut after = open();
    after.updated_at = Timestamp(after.created_at.0 - 1);
    assert_eq!(broken_by(&before, &after), Some("timestamps"));
}

#[test]
fn a_transition_never_lowers_the_status() {
    let before = reconciling();
    let mut after = before.clone();
    after.status = Status::Pending;
    after.reconcile_required = false;
    after.attempts[1].lease.purpose = Purpose::Execute;
    assert_eq!(broken(&after), None);
    assert_eq!(broken_by(&before, &after), Some("6.1-rank-monotonic"));
    assert_eq!(broken_by(&after, &before), None, "rising is fine");
}

#[test]
fn a_transition_keeps_the_reservation_and_only_raises_its_generation() {
    let before = open();
    let mut after = before.clone();
    after.reservation.fingerprint = fp(9);
    assert_eq!(broken_by(&before, &after), Some("reservation-immutable"));
    let mut after = before.clone();
    after.reservation.principal = Principal::new("bob").unwrap();
    assert_eq!(broken_by(&before, &after), Some("reservation-immutable"));
    let mut after = before.clone();
    after.reservation.scopes = Scopes::from_strs(["refund"]).unwrap();
    assert_eq!(broken_by(&before, &after), Some("reservation-immutable"));

    let mut higher = before.clone();
    higher.reservation.generation = 1;
    assert_eq!(broken_by(&before, &higher), None);
    assert_eq!(broken_by(&higher, &before), Some("generation-monotonic"));
}

#[test]
fn a_transition_never_lowers_the_last_fence() {
    let two = reconciling();
    let mut one = two.clone();
    one.attempts.pop();
    one.attempts[0].lease.ended = None;
    one.attempts[0].lease.purpose = Purpose::Reconcile;
    assert_eq!(broken(&one), None);
    assert_eq!(broken_by(&one, &two), None);
    assert_eq!(broken_by(&two, &one), Some("6.3-fences-increase"));
}

#[test]
fn the_first_terminal_outcome_stays_canonical() {
    let before = settled();
    let mut after = before.clone();
    after.receipt.as_mut().unwrap().committed_at = Timestamp(before.created_at.0 + 5);
    assert_eq!(broken(&after), None);
    assert_eq!(
        broken_by(&before, &after),
        Some("canonical-outcome-immutable")
    );
    let mut after = before.clone();
    after.outcome = Some(completed(2));
    after.receipt.as_mut().unwrap().response_sha256 = completed(2).response_sha256();
    assert_eq!(broken(&after), None);
    let mut before_same_receipt = before.clone();
    before_same_receipt.receipt = after.receipt.clone();
    assert_eq!(
        broken_by(&before_same_receipt, &after),
        Some("canonical-outcome-immutable")
    );
    // An open record may become terminal.
    let open = open();
    let mut done = settled();
    done.attempts = open.attempts.clone();
    done.attempts[0].lease.ended = before.attempts[0].lease.ended;
    done.attempts[0].receipt = before.attempts[0].receipt.clone();
    assert_eq!(broken_by(&open, &done), None);
}

#[test]
fn disputed_is_never_cleared() {
    let mut before = settled();
    before.disputed = true;
    let mut after = before.clone();
    assert_eq!(broken_by(&before, &after), None);
    after.disputed = false;
    assert_eq!(broken_by(&before, &after), Some("disputed-sticks"));
    assert_eq!(
        broken_by(&after, &before),
        None,
        "a record may become disputed"
    );
}
