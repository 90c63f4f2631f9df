//! Named tests that pin details of the rule book no other test observed:
//! each was written against a mutant `cargo mutants` reported as missed
//! (the list and the equivalent mutants are in docs/testing.md).

mod common;
use common::*;
use settle_core::*;

fn settled(h: &mut H, k: &str) -> Fence {
    let f = h.exec(claim_with(k, 1, binding("alice", 0), 1_000, false));
    h.run(settle(k, f, 1, binding("alice", 0), completed(1)));
    f
}

// ------------------------------------------------------------ Record::is_stuck

#[test]
fn is_stuck_needs_an_open_record_without_a_lease_untouched_long_enough() {
    let mut h = H::new();
    // A terminal record is never stuck.
    settled(&mut h, "done");
    let done = h.rec("done");
    assert!(!done.is_stuck(Timestamp(h.now + 10_000_000), 1_000));
    // An open record under a live lease is not stuck, however old.
    let f = h.exec(claim_with("held", 1, binding("alice", 0), 1_000, true));
    let held = h.rec("held");
    assert!(!held.is_stuck(Timestamp(h.now + 10_000_000), 1_000));
    // Released (no lease, pending): stuck only once untouched long enough.
    h.run(release("held", f));
    let open = h.rec("held");
    assert!(open.open_lease().is_none());
    assert!(!open.is_stuck(Timestamp(h.now + 999), 1_000));
    assert!(open.is_stuck(Timestamp(h.now + 1_000), 1_000));
    assert!(open.is_stuck(Timestamp(h.now + 5_000), 1_000));
}

// ------------------------------------------------------------ Attempt::observe

#[test]
fn observations_are_kept_per_attempt_and_bounded_to_the_newest_32() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    // Rule 3 refusals keep the lease: the same attempt observes each one.
    for _ in 0..40 {
        let r = h.run(settle("a", f, 1, binding("alice", 7), completed(1)));
        assert_eq!(refused(&r), Some(RefusalCode::StaleBinding));
    }
    let a = h.rec("a").attempts[0].clone();
    assert_eq!(a.observations.len(), 32);
    assert_eq!(a.observations_total, 40);
    assert!(a.observations.iter().all(|o| !o.accepted));
    // The accepted settlement is observed too (33rd kept is the newest).
    h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    let a = h.rec("a").attempts[0].clone();
    assert_eq!(a.observations.len(), 32);
    assert_eq!(a.observations_total, 41);
    assert!(a.observations.last().unwrap().accepted);
}

#[test]
fn one_observation_is_kept_below_the_bound() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    let a = h.rec("a").attempts[0].clone();
    assert_eq!(a.observations.len(), 1);
    assert_eq!(a.observations_total, 1);
    let o = &a.observations[0];
    assert!(o.accepted);
    assert_eq!(o.call, Call::Settle);
    // `finding` belongs to reconcile calls only.
    assert_eq!(o.finding, None);
    assert_eq!(o.status, Some(OutcomeStatus::Completed));
}

// ---------------------------------------------- observation / quarantine fields

#[test]
fn a_committed_finding_is_observed_as_one() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), unknown()));
    let Reply::Claim(ClaimDecision::Reconcile(g)) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    let r = h.run(reconcile(
        "a",
        g.fence,
        committed(1, binding("alice", 0), completed(1)),
    ));
    assert!(matches!(r, Reply::Receipt(_)), "{r:?}");
    let o = h.rec("a").attempts[1].observations.last().cloned().unwrap();
    assert_eq!(o.call, Call::Reconcile);
    assert_eq!(o.finding, Some(FindingKind::Committed));
    assert!(o.accepted);
}

#[test]
fn quarantined_settle_evidence_has_no_finding_and_committed_evidence_has_one() {
    let mut h = H::new();
    let f = settled(&mut h, "a");
    // A zombie's `unknown` from a settled fence: stale, quarantined.
    let r = h.run(settle(
        "a",
        Fence(f.0 + 100),
        1,
        binding("alice", 0),
        unknown(),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let q = h.rec("a").quarantine.last().cloned().unwrap();
    assert_eq!(q.call, Call::Settle);
    assert_eq!(q.finding, None);
    assert_eq!(q.fingerprint, Some(fp(1)));

    // A committed finding from a fence that holds no reconcile lease.
    let mut h = H::new();
    let f = h.exec(claim("b", 1, binding("alice", 0)));
    let r = h.run(reconcile(
        "b",
        f,
        committed(1, binding("alice", 0), completed(1)),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    let q = h.rec("b").quarantine.last().cloned().unwrap();
    assert_eq!(q.call, Call::Reconcile);
    assert_eq!(q.finding, Some(FindingKind::Committed));
    // The evidence itself is kept for audit (not only the finding's kind).
    assert_eq!(q.status, Some(OutcomeStatus::Completed));
    assert_eq!(q.fingerprint, Some(fp(1)));
    assert_eq!(q.binding, Some(binding("alice", 0)));
    assert_eq!(q.response_sha256, completed(1).response_sha256());
}

// -------------------------------------- end_lapsed_lease: expiry vs revocation

fn lapse(revoke_after_ms: u64) -> Ended {
    let mut h = H::new();
    h.exec(claim_with("a", 1, binding("alice", 0), 1_000, false));
    h.advance(revoke_after_ms);
    h.run(revoke("alice"));
    h.advance(5_000);
    let r = h.get("a").unwrap().unwrap();
    r.attempts[0].lease.ended.expect("the lease ended")
}

#[test]
fn a_lease_revoked_before_it_expires_ends_revoked_at_the_revocation() {
    let e = lapse(400);
    assert_eq!(e.reason, LeaseEnd::Revoked);
    assert_eq!(e.at, Timestamp(T0 + 400));
}

#[test]
fn a_lease_expired_before_its_revocation_ends_expired_at_its_expiry() {
    let e = lapse(1_500);
    assert_eq!(e.reason, LeaseEnd::Expired);
    assert_eq!(e.at, Timestamp(T0 + 1_000));
}

#[test]
fn a_lease_revoked_at_the_instant_it_expires_counts_as_revoked() {
    let e = lapse(1_000);
    assert_eq!(e.reason, LeaseEnd::Revoked);
    assert_eq!(e.at, Timestamp(T0 + 1_000));
}

#[test]
fn a_lease_is_not_ended_before_it_expires_or_is_revoked() {
    let mut h = H::new();
    h.exec(claim_with("a", 1, binding("alice", 0), 1_000, false));
    h.advance(999);
    let r = h.get("a").unwrap().unwrap();
    assert!(r.open_lease().is_some());
    h.advance(1);
    let r = h.get("a").unwrap().unwrap();
    assert_eq!(
        r.attempts[0].lease.ended.map(|e| e.reason),
        Some(LeaseEnd::Expired)
    );
}

// ------------------------------------------------------------- Principals

#[test]
fn principals_contains_exactly_what_was_inserted() {
    let alice = Principal::new("alice").unwrap();
    let bob = Principal::new("bob").unwrap();
    let mut p = Principals::new();
    assert!(!p.contains(&alice));
    p.insert(alice.clone(), PrincipalState::default());
    assert!(p.contains(&alice));
    assert!(!p.contains(&bob));
}

// ------------------------------------------------------- Applied::needs_commit

fn applied(cmd: &Command, state: &mut OpState, now: u64) -> Applied {
    let ctx = Ctx {
        now: Timestamp(now),
        next_fence: Fence(1),
        limits: Limits::default(),
    };
    apply(state, cmd, &ctx)
}

#[test]
fn needs_commit_is_a_changed_record_or_a_moved_principal() {
    let alice = Principal::new("alice").unwrap();
    let fresh = || {
        let mut s = OpState::default();
        s.principals
            .insert(Principal::new("alice").unwrap(), PrincipalState::default());
        s
    };
    // A new record: changed.
    let mut s = fresh();
    let a = applied(&claim("a", 1, binding("alice", 0)), &mut s, T0);
    assert!(a.changed && a.needs_commit(&s));
    // A revocation: only the principal moved (nothing else changed).
    let mut s = fresh();
    let a = applied(&revoke("alice"), &mut s, T0);
    assert!(!a.changed);
    assert!(a.needs_commit(&s));
    // A refusal that touches nothing: nothing to commit.
    let mut s = OpState::default();
    s.principals
        .insert(alice, PrincipalState::at(5, Timestamp(T0)));
    let a = applied(&claim("a", 1, binding("alice", 0)), &mut s, T0);
    assert_eq!(refused(&a.reply), Some(RefusalCode::StaleBinding));
    assert!(!a.needs_commit(&s));
}

// ------------------------------------------------------------------ warn cap

fn warn_cmd(class: &str) -> Command {
    Command::Warn(Warn {
        task: TaskId::new("t").unwrap(),
        class: WarningClass::new(class).unwrap(),
        detail: None,
    })
}

#[test]
fn warning_counts_saturate_exactly_at_the_cap() {
    let mut h = H::new();
    h.w.limits.warning_cap = 3;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let Reply::Warning(w) = h.run(warn_cmd("c")) else {
            panic!()
        };
        seen.push((w.count, w.saturated));
    }
    assert_eq!(
        seen,
        [(1, false), (2, false), (3, true), (3, true), (3, true)]
    );
    // A cap of one saturates at the first warning.
    let mut h = H::new();
    h.w.limits.warning_cap = 1;
    let Reply::Warning(w) = h.run(warn_cmd("c")) else {
        panic!()
    };
    assert_eq!((w.count, w.saturated), (1, true));
}

#[test]
fn warnings_of_different_classes_count_separately_up_to_64_classes() {
    let mut h = H::new();
    h.run(warn_cmd("a"));
    let Reply::Warning(w) = h.run(warn_cmd("b")) else {
        panic!()
    };
    assert_eq!(w.count, 1, "another class starts its own count");
    for i in 2..64 {
        let r = h.run(warn_cmd(&format!("c{i}")));
        assert!(matches!(r, Reply::Warning(_)), "class {i}: {r:?}");
    }
    assert_eq!(
        h.w.warnings(&h.tenant, &TaskId::new("t").unwrap()).len(),
        64
    );
    assert_eq!(
        refused(&h.run(warn_cmd("one-more"))),
        Some(RefusalCode::TooManyClasses)
    );
    // An existing class still counts at the limit.
    let Reply::Warning(w) = h.run(warn_cmd("a")) else {
        panic!()
    };
    assert_eq!(w.count, 2);
}

// ------------------------------------------------- claim rule 4 (generations)

#[test]
fn a_claim_at_the_same_generation_changes_nothing_while_a_lease_is_live() {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 2)));
    let before = h.rec("a");
    h.advance(500);
    let a = h.w.execute(
        &h.tenant.clone(),
        &claim("a", 1, binding("alice", 2)),
        Timestamp(h.now),
    );
    assert!(
        matches!(a.reply, Reply::Claim(ClaimDecision::InFlight { .. })),
        "{a:?}"
    );
    assert!(!a.changed, "an in_flight answer writes nothing");
    assert_eq!(h.rec("a"), before);
}

// ------------------------------------------------------------------ fences

/// SPEC §2: fences start at 1. A call under fence 0 is invalid and changes
/// nothing (found by schemathesis: it was quarantined under fence 0).
#[test]
fn a_call_under_fence_zero_is_invalid_and_changes_nothing() {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 0)));
    let before = h.rec("a");
    for cmd in [
        settle("a", Fence(0), 1, binding("alice", 0), unknown()),
        heartbeat("a", Fence(0), None),
        dispatch("a", Fence(0)),
        release("a", Fence(0)),
        reconcile("a", Fence(0), Finding::Unavailable),
    ] {
        let r = h.run(cmd.clone());
        assert!(
            matches!(r, Reply::Invalid(ref e) if e.field == "fence"),
            "{cmd:?}: {r:?}"
        );
    }
    assert_eq!(h.rec("a"), before);
}

// ---------------------------------------------------------- PrincipalState

#[test]
fn a_principal_state_keeps_when_it_last_moved() {
    let t = Timestamp(T0);
    let st = PrincipalState::at(3, t);
    assert_eq!((st.generation, st.moved_at), (3, t));
    assert!(st.moves().is_empty());
    let m = Move {
        left: 2,
        at: Timestamp(T0 - 5),
    };
    let st = PrincipalState::with_moves(3, t, &[m]);
    assert_eq!((st.generation, st.moved_at), (3, t));
    assert_eq!(st.moves(), &[m]);
    // Revocation of generation 2 counts from its move, not from the latest.
    assert_eq!(st.left_at(2), Some(Timestamp(T0 - 5)));
}
