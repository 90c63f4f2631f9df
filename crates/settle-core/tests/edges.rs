//! Edges of the rule book that no scenario test reached: each test here
//! was written against a mutant of the whole-core `cargo mutants` run
//! that the other tests let through (docs/testing.md).

mod common;
use common::*;
use settle_core::*;

fn alice() -> Binding {
    binding("alice", 0)
}

/// A record whose execute lease expired unsettled, and the fence of the
/// reconcile lease the next claim got.
fn to_reconcile(h: &mut H, k: &str) -> Fence {
    h.exec(claim_with(k, 1, alice(), 1_000, false));
    h.advance(1_000);
    match h.run(claim_with(k, 1, alice(), 1_000, false)) {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g.fence,
        other => panic!("expected reconcile, got {other:?}"),
    }
}

// ------------------------------------------------- settle: lost acknowledgements

#[test]
fn terminal_evidence_after_an_unknown_settlement_of_the_same_fence_is_stale() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    let unknown_rc = receipt(h.run(settle("a", f, 1, alice(), unknown())));
    // The lease ended with the `unknown` receipt: the same fence cannot
    // settle again, and does not get the `unknown` receipt back either.
    let r = h.run(settle("a", f, 1, alice(), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown);
    assert_eq!(rec.quarantine.len(), 1);
    assert_eq!(rec.attempts[0].receipt.as_ref(), Some(&unknown_rc));
    // The `unknown` retry itself still gets its receipt.
    assert_eq!(
        receipt(h.run(settle("a", f, 1, alice(), unknown()))),
        unknown_rc
    );
}

#[test]
fn an_unknown_retry_after_a_terminal_settlement_of_the_same_fence_is_stale() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    receipt(h.run(settle("a", f, 1, alice(), completed(1))));
    let r = h.run(settle("a", f, 1, alice(), unknown()));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let rec = h.rec("a");
    assert!(
        !rec.disputed,
        "unknown evidence never disputes a terminal record"
    );
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.quarantine[0].status, Some(OutcomeStatus::Unknown));
}

#[test]
fn an_unknown_retry_with_another_fingerprint_is_no_retry() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    receipt(h.run(settle("a", f, 1, alice(), unknown())));
    let r = h.run(settle("a", f, 2, alice(), unknown()));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    assert_eq!(h.rec("a").quarantine[0].fingerprint, Some(fp(2)));
}

// ------------------------------------------------------ settle rule 0 exactly

#[test]
fn the_same_fence_with_another_digest_of_the_same_status_disputes() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    let rc = receipt(h.run(settle("a", f, 1, alice(), completed(1))));
    // Same status, same fence, another response: not a retry.
    let r = h.run(settle("a", f, 1, alice(), completed(2)));
    assert_eq!(refused(&r), Some(RefusalCode::ResultMismatch));
    assert!(h.rec("a").disputed);
    assert_eq!(h.rec("a").receipt, Some(rc));
}

#[test]
fn the_same_fence_with_the_same_digest_but_another_status_disputes() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    receipt(h.run(settle("a", f, 1, alice(), completed(1))));
    let same_digest = Outcome::failed(
        ResultJson::from_text("{}", 1024).unwrap(),
        completed(1).response_sha256().unwrap(),
        None,
    );
    let r = h.run(settle("a", f, 1, alice(), same_digest));
    assert_eq!(refused(&r), Some(RefusalCode::ResultMismatch));
    assert!(h.rec("a").disputed);
    assert_eq!(h.rec("a").status, Status::Completed);
}

#[test]
fn mismatched_terminal_evidence_on_a_settled_record_is_stale_not_a_dispute() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    receipt(h.run(settle("a", f, 1, alice(), completed(1))));
    let r = h.run(settle("a", f, 2, alice(), completed(2)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let r = h.run(settle("a", f, 1, binding("bob", 0), completed(2)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let rec = h.rec("a");
    assert!(!rec.disputed);
    assert_eq!(rec.quarantine.len(), 2);
}

// ------------------------------------------- reconcile(not_committed) retries

#[test]
fn not_committed_on_an_execute_lease_is_wrong_purpose_every_time() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    for _ in 0..2 {
        // A refused finding is observed on the attempt; it does not make
        // the next one a retry of an accepted `not_committed`.
        let r = h.run(reconcile("a", f, Finding::NotCommitted));
        assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    }
    let rec = h.rec("a");
    assert_eq!(rec.attempts[0].observations.len(), 2);
    assert!(rec.attempts[0].observations.iter().all(|o| !o.accepted));
    assert_eq!(rec.quarantine.len(), 2);
}

#[test]
fn other_findings_under_a_lease_turned_execute_are_wrong_purpose() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let r = h.run(reconcile("a", f, Finding::NotCommitted));
    assert!(
        matches!(r, Reply::Claim(ClaimDecision::Execute(_))),
        "{r:?}"
    );
    let r = h.run(reconcile("a", f, Finding::Unavailable));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    let r = h.run(reconcile("a", f, committed(1, alice(), completed(1))));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    // The lease is still the holder's to execute and settle.
    let rc = receipt(h.run(settle("a", f, 1, alice(), completed(1))));
    assert_eq!(rc.status, Status::Completed);
}

// ------------------------------------------------------------------ principals

#[test]
fn a_principal_supplied_twice_keeps_the_second_state() {
    let alice = Principal::new("alice").unwrap();
    let bob = Principal::new("bob").unwrap();
    let mut ps = Principals::new();
    ps.insert(alice.clone(), PrincipalState::at(1, Timestamp(1)));
    ps.insert(bob.clone(), PrincipalState::at(5, Timestamp(5)));
    ps.insert(alice.clone(), PrincipalState::at(2, Timestamp(2)));
    assert_eq!(ps.get(&alice), PrincipalState::at(2, Timestamp(2)));
    assert_eq!(ps.get(&bob), PrincipalState::at(5, Timestamp(5)));
    assert_eq!(ps.dirty().count(), 0, "supplied state is not a change");
}

#[test]
fn clear_dirty_forgets_written_changes() {
    let mut state = OpState::default();
    let p = Principal::new("alice").unwrap();
    state
        .principals
        .insert(p.clone(), PrincipalState::default());
    let ctx = Ctx {
        now: Timestamp(T0),
        next_fence: Fence(1),
        limits: Limits::default(),
    };
    let applied = apply(&mut state, &revoke("alice"), &ctx);
    assert!(applied.needs_commit(&state));
    let dirty: Vec<_> = state
        .principals
        .dirty()
        .map(|(p, s)| (p.clone(), *s))
        .collect();
    assert_eq!(dirty.len(), 1);
    assert_eq!(dirty[0].0, p);
    assert_eq!(dirty[0].1.generation, 1);
    state.principals.clear_dirty();
    assert_eq!(state.principals.dirty().count(), 0);
    assert!(!applied.changed);
    assert!(!applied.needs_commit(&state));
    assert_eq!(state.principals.get(&p).generation, 1, "the state stays");
}

// --------------------------------------------------------------------- records

#[test]
fn running_is_pending_with_an_open_lease_only() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, alice(), 1_000, true));
    assert!(h.rec("a").is_running());
    h.run(release("a", f));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending);
    assert!(!rec.is_running(), "pending without a lease");
    to_reconcile(&mut h, "b");
    let rec = h.rec("b");
    assert!(rec.open_lease().is_some());
    assert!(!rec.is_running(), "unknown with a reconcile lease");
}

#[test]
fn a_result_of_exactly_the_default_limit_settles() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, alice()));
    // `"xx…x"`: the quotes and 65,534 bytes of text make 64 KiB.
    let text = format!("\"{}\"", "x".repeat(DEFAULT_MAX_RESULT_BYTES - 2));
    let over = format!("\"{}\"", "x".repeat(DEFAULT_MAX_RESULT_BYTES - 1));
    let big = |t: &str| Outcome::completed(ResultJson::from_text(t, 1 << 20).unwrap(), fp(7));
    let r = h.run(settle("a", f, 1, alice(), big(&over)));
    assert!(
        matches!(&r, Reply::Invalid(e) if e.reason.contains("at most 65536")),
        "{r:?}"
    );
    let rc = receipt(h.run(settle("a", f, 1, alice(), big(&text))));
    assert_eq!(rc.status, Status::Completed);
}
