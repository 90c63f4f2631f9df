//! Named tests for every claim rule and settle rule of SPEC §4, the other
//! operations, scenarios across operations (a first-claim race, mismatched
//! and stale settlements, a client polling through a conflict) and the
//! completion orders A, B and C.

mod common;
use common::*;
use settle_core::*;

// ---------------------------------------------------------------- claim rules

#[test]
fn claim_rule1_generation_below_principal_is_stale_even_without_record() {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 3)));
    // Another key, no record: still refused because alice is at generation 3.
    let r = h.run(claim("b", 1, binding("alice", 2)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleBinding));
    assert!(
        !h.w.records.contains_key(&(h.tenant.clone(), key("b"))),
        "nothing created"
    );
}

#[test]
fn claim_rule2_creates_reservation_and_grants_execute_atomically() {
    let mut h = H::new();
    let r = h.run(claim("a", 1, binding("alice", 2)));
    let Reply::Claim(ClaimDecision::Execute(g)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(g.attempt, 1);
    assert_eq!(g.lease_expires_at, Timestamp(T0 + 30_000));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending);
    assert_eq!(rec.reservation.fingerprint, fp(1));
    assert_eq!(rec.reservation.generation, 2);
    assert_eq!(rec.open_lease().unwrap().fence, g.fence);
    assert_eq!(rec.open_lease().unwrap().purpose, Purpose::Execute);
    assert_eq!(
        h.w.generation(&h.tenant, &Principal::new("alice").unwrap()),
        2
    );
    assert!(rec.is_running());
}

#[test]
fn claim_rule3_fingerprint_or_binding_mismatch_gets_nothing() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    // A settled record must not leak its result to a mismatched caller.
    let r = h.run(claim("a", 2, binding("alice", 0)));
    assert_eq!(r, Reply::Refused(RefusalCode::FingerprintMismatch));
    let r = h.run(claim("a", 1, binding("bob", 0)));
    assert_eq!(r, Reply::Refused(RefusalCode::BindingMismatch));
    let r = h.run(claim("a", 1, binding_scopes("alice", &["refund"], 0)));
    assert_eq!(r, Reply::Refused(RefusalCode::BindingMismatch));
}

#[test]
fn claim_rule4_higher_generation_revokes_older_lease_and_raises_generations() {
    let mut h = H::new();
    let f1 = h.exec(claim("a", 1, binding("alice", 0)));
    // Re-authenticated caller: the old lease is revoked as if expired now.
    let r = h.run(claim("a", 1, binding("alice", 1)));
    // The old lease did not mark dispatch, so it may have sent: reconcile first.
    let Reply::Claim(ClaimDecision::Reconcile(g)) = r else {
        panic!("{r:?}")
    };
    assert!(g.fence > f1);
    let rec = h.rec("a");
    assert_eq!(rec.reservation.generation, 1);
    assert_eq!(rec.status, Status::Unknown);
    assert!(rec.reconcile_required);
    assert_eq!(
        rec.attempts[0].lease.ended.unwrap().reason,
        LeaseEnd::Revoked
    );
    assert_eq!(
        h.w.generation(&h.tenant, &Principal::new("alice").unwrap()),
        1
    );
}

#[test]
fn claim_rule4_older_generation_than_reservation_is_stale() {
    // The principal's generation can only be raised with the reservation,
    // so reach rule 4 through a world whose principal row was reset.
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 5)));
    h.w.principals.clear();
    let r = h.run(claim("a", 1, binding("alice", 4)));
    assert_eq!(r, Reply::Refused(RefusalCode::StaleBinding));
}

#[test]
fn claim_rule5_terminal_replays_outcome_and_receipt() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(7))));
    let r = h.run(claim("a", 1, binding("alice", 0)));
    let Reply::Claim(ClaimDecision::Replay { outcome, receipt }) = r else {
        panic!("{r:?}")
    };
    assert_eq!(receipt, rc);
    assert_eq!(outcome, completed(7));
}

#[test]
fn claim_rule5a_a_retried_claim_id_gets_the_same_grant_and_changes_nothing() {
    let mut h = H::new();
    let id = "retry-claim-0000000001";
    let Reply::Claim(ClaimDecision::Execute(g)) = h.run(claim_id("a", 1, binding("alice", 0), id))
    else {
        panic!("expected execute")
    };
    assert_eq!(
        h.rec("a")
            .lease()
            .unwrap()
            .claim_id
            .as_ref()
            .map(|c| c.as_str()),
        Some(id),
        "the lease keeps its claim_id"
    );
    // The answer was lost; a heartbeat from somewhere moved the expiry: the
    // retry still gets the grant as first answered, and nothing changes.
    h.advance(500);
    let before = h.rec("a");
    assert_eq!(
        h.run(claim_id("a", 1, binding("alice", 0), id)),
        Reply::Claim(ClaimDecision::Execute(g))
    );
    assert_eq!(h.rec("a"), before);
    // Another id, or none, meets the live lease.
    for c in [
        claim_id("a", 1, binding("alice", 0), "another-claim-00000002"),
        claim("a", 1, binding("alice", 0)),
    ] {
        assert!(matches!(
            h.run(c),
            Reply::Claim(ClaimDecision::InFlight { .. })
        ));
    }
    // Rules 1-4 come first: a mismatched retry learns nothing.
    assert_eq!(
        refused(&h.run(claim_id("a", 2, binding("alice", 0), id))),
        Some(RefusalCode::FingerprintMismatch)
    );
}

#[test]
fn claim_rule5a_an_ended_lease_makes_the_same_id_an_ordinary_claim() {
    let mut h = H::new();
    let id = "retry-claim-0000000003";
    let g1 = match h.run(claim_id("a", 1, binding("alice", 0), id)) {
        Reply::Claim(ClaimDecision::Execute(g)) => g,
        other => panic!("{other:?}"),
    };
    // The lease lapsed (no marks_dispatch: reconcile required): the same id
    // is an ordinary claim now and gets a new reconcile lease.
    h.advance(30_000);
    let g2 = match h.run(claim_id("a", 1, binding("alice", 0), id)) {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
        other => panic!("{other:?}"),
    };
    assert!(g2.fence > g1.fence);
    // A reconcile grant is answered again as reconcile, also after its
    // not_committed finding turned it into an execute lease.
    assert_eq!(
        h.run(claim_id("a", 1, binding("alice", 0), id)),
        Reply::Claim(ClaimDecision::Reconcile(g2))
    );
    h.run(reconcile("a", g2.fence, Finding::NotCommitted));
    assert_eq!(
        h.run(claim_id("a", 1, binding("alice", 0), id)),
        Reply::Claim(ClaimDecision::Reconcile(g2))
    );
    // Settled: a retry is replayed (rule 5 comes before 5a).
    h.run(settle("a", g2.fence, 1, binding("alice", 0), completed(1)));
    assert!(matches!(
        h.run(claim_id("a", 1, binding("alice", 0), id)),
        Reply::Claim(ClaimDecision::Replay { .. })
    ));
}

#[test]
fn claim_rule5a_a_refused_finding_does_not_make_an_execute_grant_reconcile() {
    let mut h = H::new();
    let id = "retry-claim-0000000005";
    let g = match h.run(claim_id("a", 1, binding("alice", 0), id)) {
        Reply::Claim(ClaimDecision::Execute(g)) => g,
        other => panic!("{other:?}"),
    };
    // A not_committed finding on an execute lease is refused (and observed
    // on the attempt as not accepted): the lease was granted `execute`.
    assert_eq!(
        refused(&h.run(reconcile("a", g.fence, Finding::NotCommitted))),
        Some(RefusalCode::WrongPurpose)
    );
    assert_eq!(
        h.run(claim_id("a", 1, binding("alice", 0), id)),
        Reply::Claim(ClaimDecision::Execute(g))
    );
}

#[test]
fn claim_rule5a_a_revoked_lease_is_not_granted_again() {
    let mut h = H::new();
    let id = "retry-claim-0000000004";
    h.run(claim_with("a", 1, binding("alice", 0), 30_000, true));
    let rec = h.rec("a");
    let f = rec.lease().unwrap().fence;
    h.run(release("a", f));
    let g = match h.run(claim_id("a", 1, binding("alice", 0), id)) {
        Reply::Claim(ClaimDecision::Execute(g)) => g,
        other => panic!("{other:?}"),
    };
    h.run(revoke("alice"));
    // The retry carries the old generation: stale_binding (rule 1), never
    // the revoked grant.
    assert_eq!(
        refused(&h.run(claim_id("a", 1, binding("alice", 0), id))),
        Some(RefusalCode::StaleBinding)
    );
    // With the new generation (rule 4 revoked the lease): a new grant.
    match h.run(claim_id("a", 1, binding("alice", 1), id)) {
        Reply::Claim(ClaimDecision::Reconcile(g2) | ClaimDecision::Execute(g2)) => {
            assert!(g2.fence > g.fence)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn claim_rule6_live_lease_is_in_flight_with_bounded_retry_hint() {
    let mut h = H::new();
    h.exec(claim_with("a", 1, binding("alice", 0), 5000, false));
    let r = h.run(claim("a", 1, binding("alice", 0)));
    let expires = Timestamp(h.now + 5000);
    assert_eq!(
        r,
        Reply::Claim(ClaimDecision::InFlight {
            retry_after_ms: 1000,
            lease_expires_at: expires,
        })
    );
    h.advance(4995);
    let r = h.run(claim("a", 1, binding("alice", 0)));
    assert_eq!(
        r,
        Reply::Claim(ClaimDecision::InFlight {
            retry_after_ms: 10,
            lease_expires_at: expires,
        })
    );
    h.advance(2);
    let r = h.run(claim("a", 1, binding("alice", 0)));
    assert_eq!(
        r,
        Reply::Claim(ClaimDecision::InFlight {
            retry_after_ms: 10,
            lease_expires_at: expires,
        })
    );
}

#[test]
fn claim_rule7_reconcile_required_grants_reconcile_lease() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), unknown())));
    let r = h.run(claim("a", 1, binding("alice", 0)));
    let Reply::Claim(ClaimDecision::Reconcile(g)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(g.attempt, 2);
    assert_eq!(h.rec("a").open_lease().unwrap().purpose, Purpose::Reconcile);
}

#[test]
fn claim_rule8_pending_or_conflict_without_flag_grants_execute() {
    let mut h = H::new();
    // pending after a release
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    assert!(matches!(h.run(release("a", f)), Reply::Released { .. }));
    let f2 = h.exec(claim("a", 1, binding("alice", 0)));
    assert!(f2 > f);
    // conflict without the flag: the holder (marks_dispatch, never dispatched)
    // reported for another request
    let f3 = h.exec(claim_with("b", 1, binding("alice", 0), 1000, true));
    let r = h.run(settle("b", f3, 9, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::FingerprintMismatch));
    let rec = h.rec("b");
    assert_eq!(rec.status, Status::Conflict);
    assert!(!rec.reconcile_required);
    h.exec(claim("b", 1, binding("alice", 0)));
}

// ---------------------------------------------------------------- lease expiry

#[test]
fn lease_expiry_without_dispatch_mark_moves_to_unknown_and_requires_reconcile() {
    let mut h = H::new();
    h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(1000);
    let r = h.run(claim("a", 1, binding("alice", 0)));
    assert!(
        matches!(r, Reply::Claim(ClaimDecision::Reconcile(_))),
        "{r:?}"
    );
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown);
    assert_eq!(
        rec.attempts[0].lease.ended.unwrap().reason,
        LeaseEnd::Expired
    );
    assert_eq!(
        rec.attempts[0].lease.ended.unwrap().at,
        Timestamp(T0 + 1000)
    );
}

#[test]
fn lease_expiry_with_marks_dispatch_and_no_dispatch_changes_nothing() {
    let mut h = H::new();
    h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    h.advance(1500);
    let r = h.run(Command::Expire { key: key("a") });
    assert_eq!(r, Reply::Expired { ended: true });
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending);
    assert!(!rec.reconcile_required);
    h.exec(claim("a", 1, binding("alice", 0)));
}

#[test]
fn lease_expiry_after_dispatch_requires_reconcile() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    assert!(matches!(h.run(dispatch("a", f)), Reply::Dispatched(_)));
    h.advance(1000);
    assert_eq!(
        h.run(Command::Expire { key: key("a") }),
        Reply::Expired { ended: true }
    );
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown);
    assert!(rec.reconcile_required);
}

#[test]
fn expired_lease_is_never_revived_by_heartbeat() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(1001);
    assert_eq!(
        refused(&h.run(heartbeat("a", f, None))),
        Some(RefusalCode::LeaseExpired)
    );
    assert!(h.rec("a").open_lease().is_none());
}

#[test]
fn revoke_lapses_older_leases_lazily_from_the_moment_it_moved() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.advance(10);
    assert_eq!(
        h.run(revoke("alice")),
        Reply::Revoked {
            principal: Principal::new("alice").unwrap(),
            generation: 1
        }
    );
    h.advance(10);
    // The lease is refused on settlement: revoked.
    let r = h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
    let rec = h.rec("a");
    let end = rec.attempts[0].lease.ended.unwrap();
    assert_eq!(end.reason, LeaseEnd::Revoked);
    assert_eq!(end.at, Timestamp(T0 + 10));
    assert_eq!(rec.status, Status::Unknown);
    // Old generation claims are stale; the new one must reconcile.
    assert_eq!(
        refused(&h.run(claim("a", 1, binding("alice", 0)))),
        Some(RefusalCode::StaleBinding)
    );
    assert!(matches!(
        h.run(claim("a", 1, binding("alice", 1))),
        Reply::Claim(ClaimDecision::Reconcile(_))
    ));
}

#[test]
fn revoke_at_max_generation_is_refused_and_changes_nothing() {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", u64::MAX)));
    assert_eq!(
        refused(&h.run(revoke("alice"))),
        Some(RefusalCode::GenerationExhausted)
    );
    assert_eq!(
        h.w.generation(&h.tenant, &Principal::new("alice").unwrap()),
        u64::MAX
    );
}

// ---------------------------------------------------------------- heartbeat, dispatch, release

#[test]
fn heartbeat_extends_and_never_shortens() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(900);
    let Reply::Heartbeat(l) = h.run(heartbeat("a", f, None)) else {
        panic!()
    };
    assert_eq!(l.lease_expires_at, Timestamp(T0 + 1900));
    let Reply::Heartbeat(l) = h.run(heartbeat("a", f, Some(200))) else {
        panic!()
    };
    assert_eq!(l.lease_expires_at, Timestamp(T0 + 1900));
    assert_eq!(
        refused(&h.run(heartbeat("a", Fence(999), None))),
        Some(RefusalCode::StaleFence)
    );
    assert_eq!(
        refused(&h.run(heartbeat("nope", f, None))),
        Some(RefusalCode::NotFound)
    );
}

#[test]
fn dispatch_needs_the_current_execute_lease_with_margin() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    h.advance(950);
    assert_eq!(
        refused(&h.run(dispatch("a", f))),
        Some(RefusalCode::LeaseExpired)
    );
    assert!(!h.rec("a").lease().unwrap().dispatched);
    h.run(heartbeat("a", f, None));
    assert!(matches!(h.run(dispatch("a", f)), Reply::Dispatched(_)));
    assert!(h.rec("a").lease().unwrap().dispatched);
}

#[test]
fn release_requires_marks_dispatch_and_no_dispatch() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    assert_eq!(
        refused(&h.run(release("a", f))),
        Some(RefusalCode::ReceiptRequired)
    );
    assert!(h.rec("a").open_lease().is_some(), "the lock stays held");

    let f = h.exec(claim_with("b", 1, binding("alice", 0), 1000, true));
    h.run(dispatch("b", f));
    assert_eq!(
        refused(&h.run(release("b", f))),
        Some(RefusalCode::ReceiptRequired)
    );

    let f = h.exec(claim_with("c", 1, binding("alice", 0), 1000, true));
    assert_eq!(h.run(release("c", f)), Reply::Released { fence: f });
    let rec = h.rec("c");
    assert_eq!(rec.status, Status::Pending);
    assert_eq!(
        rec.lease().unwrap().ended.unwrap().reason,
        LeaseEnd::Released
    );
    // Released means ended: a repeat with the same reason is a lost
    // acknowledgement (200, nothing changes); another reason is stale.
    let before = h.rec("c");
    assert_eq!(h.run(release("c", f)), Reply::Released { fence: f });
    assert_eq!(h.rec("c"), before);
    assert_eq!(
        refused(&h.run(release_not_committed("c", f))),
        Some(RefusalCode::StaleFence)
    );
}

#[test]
fn release_forget_removes_a_record_with_nothing_recorded() {
    let mut h = H::new();
    // A request refused before any work (a framework's 422): released with
    // forget, also after dispatch (the middleware marks it first).
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    h.run(dispatch("a", f));
    assert_eq!(
        h.run(release_forget("a", f, ReleaseReason::NotCommitted)),
        Reply::Released { fence: f }
    );
    assert!(!h.w.records.contains_key(&(h.tenant.clone(), key("a"))));
    // The corrected request (another fingerprint) claims the key afresh,
    // above every fence the forgotten record had.
    let g = h.exec(claim("a", 2, binding("alice", 0)));
    assert!(g > f);
    // A repeat of the forgetting release finds no record.
    assert_eq!(
        refused(&h.run(release_forget("a", f, ReleaseReason::NotCommitted))),
        Some(RefusalCode::StaleFence)
    );
}

#[test]
fn release_forget_is_refused_where_something_was_recorded() {
    let mut h = H::new();
    // unknown: an attempt was settled.
    let f = h.exec(claim("u", 1, binding("alice", 0)));
    h.run(settle("u", f, 1, binding("alice", 0), unknown()));
    let g = match h.run(claim("u", 1, binding("alice", 0))) {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
        other => panic!("{other:?}"),
    };
    h.run(reconcile("u", g.fence, Finding::NotCommitted));
    let before = h.rec("u");
    assert_eq!(
        refused(&h.run(release_forget("u", g.fence, ReleaseReason::NotCommitted))),
        Some(RefusalCode::ReceiptRequired)
    );
    assert_eq!(h.rec("u"), before, "nothing changes");
    // Quarantined evidence (a stale settle) is kept for audit.
    let f = h.exec(claim("q", 1, binding("alice", 0)));
    h.run(settle(
        "q",
        Fence(f.0 + 1000),
        1,
        binding("alice", 0),
        completed(1),
    ));
    assert_eq!(
        refused(&h.run(release_forget("q", f, ReleaseReason::NotCommitted))),
        Some(RefusalCode::ReceiptRequired)
    );
    assert!(h.rec("q").open_lease().is_some());
    // Without marks_dispatch, not_dispatched still needs a receipt.
    let f = h.exec(claim("n", 1, binding("alice", 0)));
    assert_eq!(
        refused(&h.run(release_forget("n", f, ReleaseReason::NotDispatched))),
        Some(RefusalCode::ReceiptRequired)
    );
}

#[test]
fn release_of_a_reconcile_lease_is_wrong_purpose() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), unknown()));
    let Reply::Claim(ClaimDecision::Reconcile(g)) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    assert_eq!(
        refused(&h.run(release("a", g.fence))),
        Some(RefusalCode::WrongPurpose)
    );
}

// ---------------------------------------------------------------- settle rules

#[test]
fn settle_rule0_idempotent_retry_returns_the_original_receipt() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    assert!(rc.durable);
    h.advance(5);
    let before = h.rec("a");
    let again = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    assert_eq!(again, rc);
    assert_eq!(h.rec("a"), before, "nothing changed");
}

#[test]
fn settle_rule0_disagreeing_terminal_is_result_mismatch_and_disputed() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    let r = h.run(settle("a", f, 1, binding("alice", 0), completed(2)));
    assert_eq!(refused(&r), Some(RefusalCode::ResultMismatch));
    let r = h.run(settle("a", Fence(12345), 1, binding("alice", 0), failed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::ResultMismatch));
    let rec = h.rec("a");
    assert!(rec.disputed);
    assert_eq!(
        rec.receipt.as_ref(),
        Some(&rc),
        "first durable terminal stays canonical"
    );
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.quarantine.len(), 2);
    assert_eq!(rec.quarantine[0].reason, RefusalCode::ResultMismatch);
}

#[test]
fn settle_rule0_agreeing_terminal_from_another_fence_is_stale_fence() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    let r = h.run(settle(
        "a",
        Fence(f.0 + 100),
        1,
        binding("alice", 0),
        completed(1),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let rec = h.rec("a");
    assert!(!rec.disputed);
    assert_eq!(
        rec.quarantine.last().unwrap().reason,
        RefusalCode::StaleFence
    );
}

#[test]
fn settle_rule1_not_current_lease_is_stale_fence_and_quarantined() {
    let mut h = H::new();
    let f1 = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    h.run(release("a", f1));
    let f2 = h.exec(claim("a", 1, binding("alice", 0)));
    let r = h.run(settle("a", f1, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending);
    assert_eq!(rec.open_lease().unwrap().fence, f2, "successor untouched");
    assert_eq!(rec.quarantine.len(), 1);
    assert_eq!(rec.quarantine[0].fence, f1);
}

#[test]
fn settle_rule1_reconcile_lease_is_wrong_purpose() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), unknown()));
    let Reply::Claim(ClaimDecision::Reconcile(g)) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    let r = h.run(settle("a", g.fence, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    assert_eq!(h.rec("a").status, Status::Unknown);
}

#[test]
fn settle_rule1_expired_or_within_margin_is_lease_expired() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(901); // 99 ms left < 100 ms margin
    let r = h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
    let rec = h.rec("a");
    assert!(
        rec.open_lease().is_some(),
        "within margin the lease is still held"
    );
    assert_eq!(rec.status, Status::Pending);
    h.advance(200);
    let r = h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
    assert_eq!(h.rec("a").status, Status::Unknown);
    assert_eq!(h.rec("a").quarantine.len(), 2);
}

#[test]
fn settle_rule1_exactly_the_margin_left_is_accepted() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(900);
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
}

#[test]
fn settle_rule2_holder_with_mismatched_request_sets_conflict_and_ends_lease() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let r = h.run(settle("a", f, 2, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::FingerprintMismatch));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Conflict);
    assert!(rec.reconcile_required, "it may have dispatched");
    assert_eq!(
        rec.lease().unwrap().ended.unwrap().reason,
        LeaseEnd::Refused
    );
    assert!(rec.receipt.is_none());
    // binding mismatch likewise
    let f = h.exec(claim("b", 1, binding("alice", 0)));
    let r = h.run(settle("b", f, 1, binding("mallory", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::BindingMismatch));
    assert_eq!(h.rec("b").status, Status::Conflict);
}

#[test]
fn settle_rule3_generation_must_match_reservation_and_principal() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 1)));
    let r = h.run(settle("a", f, 1, binding("alice", 0), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleBinding));
    let r = h.run(settle("a", f, 1, binding("alice", 2), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleBinding));
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending);
    assert!(rec.open_lease().is_some(), "the lease stays as it is");
    receipt(h.run(settle("a", f, 1, binding("alice", 1), completed(1))));
}

#[test]
fn settle_rule4_merges_writes_receipt_and_releases_in_one_step() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.advance(7);
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(3))));
    assert_eq!(rc.fence, f);
    assert_eq!(rc.status, Status::Completed);
    assert_eq!(rc.committed_at, Timestamp(T0 + 7));
    assert_eq!(rc.response_sha256, completed(3).response_sha256());
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Completed);
    assert!(rec.open_lease().is_none());
    assert_eq!(
        rec.lease().unwrap().ended.unwrap().reason,
        LeaseEnd::Settled
    );
    assert_eq!(rec.attempts[0].receipt.as_ref(), Some(&rc));
    assert_eq!(rec.expires_at(), Some(Timestamp(T0 + 7 + 86_400_000)));
}

#[test]
fn settle_unknown_sets_reconcile_and_a_retry_returns_the_same_receipt() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), unknown())));
    assert_eq!(rc.status, Status::Unknown);
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown);
    assert!(rec.reconcile_required);
    assert!(
        rec.receipt.is_none(),
        "unknown receipts live on the attempt"
    );
    h.advance(3);
    let again = receipt(h.run(settle("a", f, 1, binding("alice", 0), unknown())));
    assert_eq!(again, rc);
    assert_eq!(h.rec("a"), rec);
}

#[test]
fn settle_on_unknown_key_is_not_found() {
    let mut h = H::new();
    let r = h.run(settle(
        "zzz",
        Fence(1),
        1,
        binding("alice", 0),
        completed(1),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::NotFound));
}

// ---------------------------------------------------------------- reconcile

fn to_reconcile(h: &mut H, k: &str) -> Fence {
    let f = h.exec(claim(k, 1, binding("alice", 0)));
    h.run(settle(k, f, 1, binding("alice", 0), unknown()));
    match h.run(claim(k, 1, binding("alice", 0))) {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g.fence,
        other => panic!("{other:?}"),
    }
}

#[test]
fn reconcile_committed_settles_like_settle() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let rc = receipt(h.run(reconcile(
        "a",
        f,
        committed(1, binding("alice", 0), completed(1)),
    )));
    assert_eq!(rc.status, Status::Completed);
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Completed);
    assert!(!rec.reconcile_required);
}

#[test]
fn reconcile_committed_retry_returns_the_original_receipt() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let rc = receipt(h.run(reconcile(
        "a",
        f,
        committed(1, binding("alice", 0), completed(1)),
    )));
    let before = h.rec("a");
    // The worker lost the acknowledgement and retries: same answer, nothing changes.
    let again = receipt(h.run(reconcile(
        "a",
        f,
        committed(1, binding("alice", 0), completed(1)),
    )));
    assert_eq!(again, rc);
    assert_eq!(h.rec("a"), before);
    // A different result for the same reservation disputes the record.
    let r = h.run(reconcile(
        "a",
        f,
        committed(1, binding("alice", 0), completed(2)),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::ResultMismatch));
    assert!(h.rec("a").disputed);
}

#[test]
fn reconcile_committed_with_mismatch_sets_conflict() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let r = h.run(reconcile(
        "a",
        f,
        committed(5, binding("alice", 0), completed(1)),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::FingerprintMismatch));
    assert_eq!(h.rec("a").status, Status::Conflict);
}

#[test]
fn reconcile_not_committed_turns_the_lease_into_execute_and_clears_flag() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let r = h.run(reconcile("a", f, Finding::NotCommitted));
    let Reply::Claim(ClaimDecision::Execute(g)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(g.fence, f, "same fence");
    let rec = h.rec("a");
    assert!(!rec.reconcile_required);
    assert_eq!(rec.status, Status::Unknown, "no downgrade");
    assert_eq!(rec.open_lease().unwrap().purpose, Purpose::Execute);
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    assert_eq!(rc.status, Status::Completed);
}

#[test]
fn reconcile_unavailable_releases_and_keeps_the_flag() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    assert_eq!(
        h.run(reconcile("a", f, Finding::Unavailable)),
        Reply::Released { fence: f }
    );
    let rec = h.rec("a");
    assert!(rec.reconcile_required);
    assert!(rec.open_lease().is_none());
    // A repeat (the acknowledgement was lost): 200, nothing changes, no
    // quarantine; other findings from that fence are stale.
    assert_eq!(
        h.run(reconcile("a", f, Finding::Unavailable)),
        Reply::Released { fence: f }
    );
    assert_eq!(h.rec("a"), rec);
    assert_eq!(
        refused(&h.run(reconcile("a", f, Finding::NotCommitted))),
        Some(RefusalCode::StaleFence)
    );
    assert!(matches!(
        h.run(claim("a", 1, binding("alice", 0))),
        Reply::Claim(ClaimDecision::Reconcile(_))
    ));
}

#[test]
fn reconcile_on_an_execute_lease_is_wrong_purpose() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let r = h.run(reconcile("a", f, Finding::NotCommitted));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
    let r = h.run(reconcile("a", Fence(f.0 + 9), Finding::Unavailable));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
}

// ---------------------------------------------------------------- warnings, retention, §6.9

#[test]
fn warnings_are_one_per_class_bounded_and_saturating() {
    let mut h = H::new();
    h.w.limits.warning_cap = 3;
    let warn = |class: &str, detail: Option<&str>| {
        Command::Warn(Warn {
            task: TaskId::new("export-1").unwrap(),
            class: WarningClass::new(class).unwrap(),
            detail: detail.map(|d| Text::new("detail", d).unwrap()),
        })
    };
    h.run(warn("deferred", Some("first")));
    h.advance(1);
    h.run(warn("deferred", None));
    let Reply::Warning(w) = h.run(warn("deferred", Some("third"))) else {
        panic!()
    };
    assert_eq!(w.count, 3);
    assert!(w.saturated);
    assert_eq!(w.detail.as_ref().unwrap().as_str(), "third");
    let Reply::Warning(w) = h.run(warn("deferred", None)) else {
        panic!()
    };
    assert_eq!(w.count, 3, "saturates at the cap");
    assert_eq!(
        w.detail.as_ref().unwrap().as_str(),
        "third",
        "kept without detail"
    );
    assert_eq!(w.first_at, Timestamp(T0));
    for i in 1..64 {
        assert!(matches!(
            h.run(warn(&format!("c{i}"), None)),
            Reply::Warning(_)
        ));
    }
    assert_eq!(
        refused(&h.run(warn("one-too-many", None))),
        Some(RefusalCode::TooManyClasses)
    );
    assert_eq!(
        h.w.warnings(&h.tenant, &TaskId::new("export-1").unwrap())
            .len(),
        64
    );
}

#[test]
fn retention_expired_terminal_record_is_collected_and_key_reusable() {
    let mut h = H::new();
    let mut c = Claim::new(key("a"), fp(1), binding("alice", 0));
    c.retention_s = RetentionS::new(10).unwrap();
    let f = h.exec(Command::Claim(c));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    h.advance(9_999);
    assert!(h.get("a").unwrap().is_some());
    assert_eq!(
        h.run(Command::Collect { key: key("a") }),
        Reply::Collected { removed: false }
    );
    h.advance(1);
    assert!(
        h.get("a").unwrap().is_none(),
        "expired records read as absent"
    );
    // A new intent may now reuse the key.
    let f2 = h.exec(claim("a", 2, binding("alice", 0)));
    assert!(f2 > f);
    assert_eq!(h.rec("a").reservation.fingerprint, fp(2));
}

#[test]
fn collect_removes_only_expired_terminal_records() {
    let mut h = H::new();
    h.exec(claim("open", 1, binding("alice", 0)));
    h.advance(400 * 86_400_000);
    assert_eq!(
        h.run(Command::Collect { key: key("open") }),
        Reply::Collected { removed: false }
    );
    assert!(h.w.records.contains_key(&(h.tenant.clone(), key("open"))));
    let rec = h.rec("open");
    assert!(rec.is_stuck(Timestamp(h.now), 3_600_000));
}

#[test]
fn record_with_receipt_from_the_future_is_refused_and_untouched() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.advance(1000);
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    let before = h.rec("a");
    h.now -= 500; // the store's clock is now behind the receipt
    let r = h.run(claim("a", 1, binding("alice", 0)));
    assert_eq!(refused(&r), Some(RefusalCode::RecordRefused));
    assert_eq!(h.get("a"), Err(RefusalCode::RecordRefused));
    assert_eq!(
        h.run(Command::Collect { key: key("a") }),
        Reply::Refused(RefusalCode::RecordRefused)
    );
    assert_eq!(h.rec("a"), before, "kept, not dropped");
}

#[test]
fn quarantine_and_attempts_are_bounded_with_counters() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    for i in 0..40u64 {
        h.run(settle(
            "a",
            Fence(f.0 + 1 + i),
            1,
            binding("alice", 0),
            completed(1),
        ));
    }
    let rec = h.rec("a");
    assert_eq!(rec.quarantine.len(), 32);
    assert_eq!(rec.quarantine_total, 40);
    // attempts: 40 claim/release cycles
    for _ in 0..40 {
        let f = h.exec(claim_with("b", 1, binding("alice", 0), 1000, true));
        h.run(release("b", f));
    }
    let rec = h.rec("b");
    assert_eq!(rec.attempts.len(), 32);
    assert_eq!(rec.attempts_total, 40);
    assert_eq!(rec.attempts.last().unwrap().number, 40);
}

#[test]
fn tenants_never_meet() {
    let mut h = H::new();
    h.exec(claim("a", 1, binding("alice", 0)));
    let other = TenantId::new("other").unwrap();
    let r =
        h.w.execute(&other, &claim("a", 2, binding("bob", 0)), Timestamp(h.now));
    assert!(matches!(r.reply, Reply::Claim(ClaimDecision::Execute(_))));
    assert!(
        h.w.get(&other, &key("a"), Timestamp(h.now))
            .unwrap()
            .unwrap()
            .reservation
            .fingerprint
            == fp(2)
    );
    assert!(h.get("a").unwrap().unwrap().reservation.fingerprint == fp(1));
}

// ---------------------------------------------------------------- scenarios across operations

#[test]
fn seed_cas_first_claim_race_only_one_executes() {
    let mut h = H::new();
    let replies: Vec<Reply> = (0..24)
        .map(|_| h.run(claim("a", 1, binding("alice", 0))))
        .collect();
    let executes = replies
        .iter()
        .filter(|r| matches!(r, Reply::Claim(ClaimDecision::Execute(_))))
        .count();
    let in_flight = replies
        .iter()
        .filter(|r| matches!(r, Reply::Claim(ClaimDecision::InFlight { .. })))
        .count();
    assert_eq!((executes, in_flight), (1, 23));
}

#[test]
fn seed_atomic_claim_blocks_mismatched_settlement() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    // A worker that never held a claim for this request cannot canonicalize:
    // a foreign fence is stale, a foreign request under the lease is conflict.
    let r = h.run(settle(
        "a",
        Fence(f.0 + 50),
        2,
        binding("mallory", 0),
        completed(9),
    ));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    assert_eq!(h.rec("a").status, Status::Pending);
    let r = h.run(settle("a", f, 2, binding("alice", 0), completed(9)));
    assert_eq!(refused(&r), Some(RefusalCode::FingerprintMismatch));
    assert_ne!(h.rec("a").status, Status::Completed);
}

#[test]
fn seed_binding_bump_blocks_stale_generation_settlement() {
    let mut h = H::new();
    let f1 = h.exec(claim("a", 1, binding("alice", 1)));
    // The client re-authenticates: generation 2.
    let r = h.run(claim("a", 1, binding("alice", 2)));
    assert!(matches!(r, Reply::Claim(ClaimDecision::Reconcile(_))));
    // The old worker wakes up with a success matching the original
    // generation: its lease was revoked and succeeded, so its fence is stale.
    let r = h.run(settle("a", f1, 1, binding("alice", 1), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    assert_ne!(h.rec("a").status, Status::Completed);
}

#[test]
fn seed_matching_lock_client_polls_through_transient_conflict() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    h.run(settle("a", f, 2, binding("alice", 0), completed(1)));
    assert_eq!(h.rec("a").status, Status::Conflict);
    // The matching client keeps claiming: it is not refused, it gets to execute.
    let f2 = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f2, 1, binding("alice", 0), completed(1))));
    assert!(matches!(
        h.run(claim("a", 1, binding("alice", 0))),
        Reply::Claim(ClaimDecision::Replay { .. })
    ));
    // A mismatched caller still gets nothing.
    assert_eq!(
        refused(&h.run(claim("a", 2, binding("alice", 0)))),
        Some(RefusalCode::FingerprintMismatch)
    );
}

#[test]
fn seed_mismatched_late_success_never_canonicalizes() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    h.advance(2000);
    for (fp_n, who) in [(2, "alice"), (1, "mallory"), (2, "mallory")] {
        let r = h.run(settle("a", f, fp_n, binding(who, 0), completed(1)));
        assert!(refused(&r).is_some());
    }
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown);
    assert!(rec.receipt.is_none());
    assert_eq!(rec.quarantine.len(), 3);
}

// ---------------------------------------------------------------- completion orders

#[test]
fn order_a_success_then_timeout_keeps_completed() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, false));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    // The late timeout report from the same attempt...
    let r = h.run(settle("a", f, 1, binding("alice", 0), unknown()));
    assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    // ...and the lease's nominal expiry change nothing.
    h.advance(5000);
    assert_eq!(
        h.run(Command::Expire { key: key("a") }),
        Reply::Expired { ended: false }
    );
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.receipt, Some(rc));
}

#[test]
fn order_b_timeout_then_success_upgrades_to_completed() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let u = receipt(h.run(settle("a", f, 1, binding("alice", 0), unknown())));
    assert_eq!(u.status, Status::Unknown);
    let Reply::Claim(ClaimDecision::Reconcile(g)) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    let rc = receipt(h.run(reconcile(
        "a",
        g.fence,
        committed(1, binding("alice", 0), completed(1)),
    )));
    assert_eq!(rc.status, Status::Completed);
    assert_eq!(h.rec("a").status, Status::Completed);
}

#[test]
fn order_c_mismatched_late_success_never_reaches_completed() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", f, 1, binding("alice", 0), unknown()));
    // Late success for another request (other fingerprint, other binding, older generation)
    for (fp_n, b) in [
        (2, binding("alice", 0)),
        (1, binding("bob", 0)),
        (1, binding_scopes("alice", &["x"], 0)),
    ] {
        let r = h.run(settle("a", f, fp_n, b, completed(1)));
        assert!(refused(&r).is_some(), "{r:?}");
    }
    let rec = h.rec("a");
    assert_ne!(rec.status, Status::Completed);
    assert!(rec.receipt.is_none());
}

// ---------------------------------------------------------------- validation and bookkeeping

#[test]
fn quarantine_is_not_progress_a_zombie_cannot_keep_a_record_off_the_stuck_list() {
    let mut h = H::new();
    let zombie = h.exec(claim("a", 1, binding("alice", 0)));
    h.run(settle("a", zombie, 1, binding("alice", 0), unknown()));
    let Reply::Claim(ClaimDecision::Reconcile(g)) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    h.run(reconcile("a", g.fence, Finding::Unavailable));
    let settled = h.rec("a").updated_at;
    let stuck_after_ms = 10_000;
    // The zombie keeps retrying its stale settlement, and a stale finding
    // arrives too: every one is quarantined, none is progress.
    for _ in 0..12 {
        h.advance(1_000);
        let r = h.run(settle("a", zombie, 1, binding("alice", 0), completed(1)));
        assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
        let r = h.run(reconcile("a", g.fence, Finding::NotCommitted));
        assert_eq!(refused(&r), Some(RefusalCode::StaleFence));
    }
    let rec = h.rec("a");
    assert_eq!(rec.quarantine_total, 24, "every refusal is kept for audit");
    assert_eq!(
        rec.updated_at, settled,
        "quarantine does not move updated_at"
    );
    assert!(rec.is_stuck(Timestamp(h.now), stuck_after_ms));
}

#[test]
fn quarantine_of_a_stale_binding_is_not_progress_either() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let before = h.rec("a").updated_at;
    h.advance(5);
    // Rule 3: a generation that is not the reservation's: quarantined, the lease stays.
    let r = h.run(settle("a", f, 1, binding("alice", 1), completed(1)));
    assert_eq!(refused(&r), Some(RefusalCode::StaleBinding));
    let rec = h.rec("a");
    assert_eq!(rec.quarantine_total, 1);
    assert!(rec.open_lease().is_some());
    assert_eq!(rec.updated_at, before);
}

#[test]
fn reconcile_not_committed_retry_returns_the_same_grant_and_changes_nothing() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    let Reply::Claim(ClaimDecision::Execute(first)) =
        h.run(reconcile("a", f, Finding::NotCommitted))
    else {
        panic!()
    };
    let before = h.rec("a");
    h.advance(50);
    // The acknowledgement was lost; the worker asks again.
    let again = h.run(reconcile("a", f, Finding::NotCommitted));
    assert_eq!(again, Reply::Claim(ClaimDecision::Execute(first)));
    assert_eq!(h.rec("a"), before, "nothing changes");
    // Once the lease was dispatched, a retry is no longer the same question.
    h.run(dispatch("a", f));
    let r = h.run(reconcile("a", f, Finding::NotCommitted));
    assert_eq!(refused(&r), Some(RefusalCode::WrongPurpose));
}

#[test]
fn reconcile_not_committed_retry_after_the_lease_ran_out_is_lease_expired() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    h.run(reconcile("a", f, Finding::NotCommitted));
    h.advance(30_001);
    let r = h.run(reconcile("a", f, Finding::NotCommitted));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
}

#[test]
fn revocation_is_dated_by_the_move_that_ended_the_lease() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 10_000, false));
    h.advance(10);
    h.run(revoke("alice")); // 0 -> 1 at T0+10: this ends the lease
    h.advance(10);
    h.run(revoke("alice")); // 1 -> 2 at T0+20
    h.advance(10);
    h.exec(claim("b", 1, binding("alice", 7))); // 2 -> 7 at T0+30
    h.advance(10);
    let r = h.run(heartbeat("a", f, None));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
    let end = h.rec("a").attempts[0].lease.ended.unwrap();
    assert_eq!(end.reason, LeaseEnd::Revoked);
    assert_eq!(end.at, Timestamp(T0 + 10), "the first move, not the latest");
    assert_eq!(h.rec("a").updated_at, Timestamp(T0 + 10));
}

#[test]
fn a_lease_that_expired_before_its_revocation_ended_by_expiry() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1_000, false));
    h.advance(2_000);
    h.run(revoke("alice")); // after the lease ran out
    h.advance(10);
    h.run(revoke("alice"));
    let r = h.run(heartbeat("a", f, None));
    assert_eq!(refused(&r), Some(RefusalCode::LeaseExpired));
    let end = h.rec("a").attempts[0].lease.ended.unwrap();
    assert_eq!(end.reason, LeaseEnd::Expired);
    assert_eq!(end.at, Timestamp(T0 + 1_000));
}

#[test]
fn lease_ms_must_leave_a_usable_lease_over_the_margin() {
    let mut h = H::new();
    // The default margin is 100 ms: a 100 ms lease could never be settled.
    let r = h.run(claim_with("a", 1, binding("alice", 0), 100, false));
    let Reply::Invalid(e) = r else {
        panic!("{r:?}")
    };
    assert_eq!(e.field, "lease_ms");
    assert!(
        e.reason.contains("lease_margin_ms (100 ms)"),
        "{}",
        e.reason
    );
    assert!(h.w.records.is_empty(), "nothing was written");
    assert_eq!(h.w.next_fence, 1, "no fence was used");
    assert_eq!(
        h.w.generation(&h.tenant, &Principal::new("alice").unwrap()),
        0
    );
    // One millisecond more is a lease that can be settled at once.
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 101, false));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    assert_eq!(rc.status, Status::Completed);
    // Heartbeats follow the same rule.
    let f = h.exec(claim("b", 1, binding("alice", 0)));
    let before = h.rec("b");
    let r = h.run(heartbeat("b", f, Some(100)));
    assert!(
        matches!(r, Reply::Invalid(ref e) if e.field == "lease_ms"),
        "{r:?}"
    );
    assert_eq!(h.rec("b"), before);
}

#[test]
fn an_invalid_command_is_answered_before_lazy_expiry_writes_anything() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1_000, false));
    h.advance(5_000);
    // The lease has lapsed, but an invalid heartbeat must not end it.
    let applied = h.w.execute(
        &h.tenant.clone(),
        &heartbeat("a", f, Some(50 + 50)),
        Timestamp(h.now),
    );
    assert!(matches!(applied.reply, Reply::Invalid(_)));
    assert!(!applied.changed);
    assert!(h.rec("a").open_lease().is_some());
}

#[test]
fn the_result_size_limit_is_part_of_the_commands_validation() {
    let limits = Limits {
        max_result_bytes: 16,
        ..Limits::default()
    };
    let mut w = World::new(limits);
    let t = TenantId::default_tenant();
    let now = Timestamp(T0);
    let Reply::Claim(ClaimDecision::Execute(g)) = w
        .execute(&t, &claim("a", 1, binding("alice", 0)), now)
        .reply
    else {
        panic!()
    };
    let big = Outcome::completed(
        ResultJson::from_text(r#"{"charge":"ch_0123456789"}"#, 1 << 20).unwrap(),
        fp(7),
    );
    let before = w.records.clone();
    let applied = w.execute(&t, &settle("a", g.fence, 1, binding("alice", 0), big), now);
    let Reply::Invalid(e) = &applied.reply else {
        panic!("{:?}", applied.reply)
    };
    assert_eq!(e.field, "outcome.result");
    assert!(e.reason.contains("at most 16"), "{}", e.reason);
    assert!(!applied.changed);
    assert_eq!(w.records, before, "nothing was written");
}

#[test]
fn settle_unknown_keeps_error_and_digest_on_the_attempt() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let error = ErrorText::new("outcome.error", "upstream timed out\nafter 30 s").unwrap();
    let o = Outcome::unknown_with_response(Some(error.clone()), fp(9));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), o)));
    assert_eq!(rc.status, Status::Unknown);
    assert_eq!(rc.response_sha256, Some(fp(9)));
    let rec = h.rec("a");
    assert_eq!(rec.attempts[0].receipt.as_ref(), Some(&rc));
    assert_eq!(rec.attempts[0].error.as_ref(), Some(&error));
    assert_eq!(
        rec.attempts[0].receipt.as_ref().unwrap().response_sha256,
        Some(fp(9))
    );
}

#[test]
fn an_unknown_outcome_with_a_result_is_invalid() {
    let r = ResultJson::from_text("{}", 100).unwrap();
    let e = Outcome::new(OutcomeStatus::Unknown, Some(r), None, None).unwrap_err();
    assert_eq!(e.field, "outcome.result");
    let e =
        serde_json::from_str::<Outcome>(r#"{"status":"unknown","result":{"a":1}}"#).unwrap_err();
    assert!(e.to_string().contains("outcome.result"), "{e}");
    // null is a result too, so it is refused here as well.
    assert!(serde_json::from_str::<Outcome>(r#"{"status":"unknown","result":null}"#).is_err());
    assert!(serde_json::from_str::<Outcome>(r#"{"status":"unknown","error":""}"#).is_ok());
}

#[test]
fn a_committed_finding_needs_a_terminal_outcome() {
    let e = Finding::committed(fp(1), binding("alice", 0), unknown()).unwrap_err();
    assert_eq!(e.field, "outcome.status");
    let e = CommittedFinding::new(fp(1), binding("alice", 0), unknown()).unwrap_err();
    assert_eq!(e.field, "outcome.status");
    assert!(Finding::committed(fp(1), binding("alice", 0), failed(1)).is_ok());
}

#[test]
fn a_terminal_outcome_needs_its_digest_and_result() {
    let r = ResultJson::from_text("null", 100).unwrap();
    let e = Outcome::new(OutcomeStatus::Completed, Some(r.clone()), None, None).unwrap_err();
    assert_eq!(e.field, "outcome.response_sha256");
    let e = Outcome::new(OutcomeStatus::Failed, None, Some(fp(1)), None).unwrap_err();
    assert_eq!(e.field, "outcome.result");
    let o = Outcome::new(OutcomeStatus::Failed, Some(r), Some(fp(1)), None).unwrap();
    assert_eq!(o.result().unwrap().as_str(), "null");
}

#[test]
fn a_null_result_settles_and_replays() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let o: Outcome = serde_json::from_str(&format!(
        r#"{{"status":"completed","result":null,"response_sha256":"{}"}}"#,
        fp(3).to_hex()
    ))
    .unwrap();
    receipt(h.run(settle("a", f, 1, binding("alice", 0), o.clone())));
    let Reply::Claim(d @ ClaimDecision::Replay { .. }) = h.run(claim("a", 1, binding("alice", 0)))
    else {
        panic!()
    };
    let json = serde_json::to_string(&d).unwrap();
    assert!(json.contains(r#""result":null"#), "{json}");
}

#[test]
fn replays_return_the_settled_text_byte_for_byte() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    // Floats that f64 would round or respell, escapes, key order, spacing.
    let sent = "{ \"amount\": 0.1000000000000000055511151231257827,\n \"big\": 1e400, \
                \"exp\": 1E+2, \"z\": \"caf\\u00e9 \\\" x\", \"a\": [1.0, -0.0, 12345678901234567890123] }";
    let body = format!(
        r#"{{"status":"completed","result":{sent},"response_sha256":"{}"}}"#,
        fp(3).to_hex()
    );
    let o: Outcome = serde_json::from_str(&body).unwrap();
    let compact = "{\"amount\":0.1000000000000000055511151231257827,\"big\":1e400,\
                   \"exp\":1E+2,\"z\":\"caf\\u00e9 \\\" x\",\"a\":[1.0,-0.0,12345678901234567890123]}";
    assert_eq!(o.result().unwrap().as_str(), compact);
    receipt(h.run(settle("a", f, 1, binding("alice", 0), o)));
    let Reply::Claim(d) = h.run(claim("a", 1, binding("alice", 0))) else {
        panic!()
    };
    let json = serde_json::to_string(&d).unwrap();
    assert!(json.contains(&format!("\"result\":{compact}")), "{json}");
}

#[test]
fn outcome_errors_are_any_text_up_to_the_limit() {
    for text in ["", "line one\nline two\r\n\ttab", "\u{0}nul and \u{7f}"] {
        let json = serde_json::to_string(&serde_json::json!({"status": "unknown", "error": text}))
            .unwrap();
        let o: Outcome = serde_json::from_str(&json).unwrap();
        assert_eq!(o.error().unwrap().as_str(), text);
    }
    let long = "é".repeat(2049);
    let e = ErrorText::new("outcome.error", long).unwrap_err();
    assert!(e.reason.contains("4098 bytes"), "{}", e.reason);
    assert!(ErrorText::new("outcome.error", "x".repeat(4096)).is_ok());
}

#[test]
fn results_nested_deeper_than_the_limit_are_refused() {
    let ok = format!(
        "{}{}",
        "[".repeat(MAX_RESULT_DEPTH),
        "]".repeat(MAX_RESULT_DEPTH)
    );
    assert!(ResultJson::from_text(&ok, 1 << 20).is_ok());
    for depth in [MAX_RESULT_DEPTH + 1, 200, 100_000] {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let e = ResultJson::from_text(&deep, 1 << 20).unwrap_err();
        assert_eq!(e.field, "outcome.result");
        assert!(e.reason.contains("deeper than 64"), "{}", e.reason);
        let body = format!(
            r#"{{"status":"failed","result":{deep},"response_sha256":"{}"}}"#,
            fp(1).to_hex()
        );
        let e = serde_json::from_str::<Outcome>(&body).unwrap_err();
        assert!(e.to_string().contains("deeper than 64"), "{e}");
    }
    // Brackets inside strings are not nesting.
    let s = format!("\"{}\"", "[".repeat(500));
    assert!(ResultJson::from_text(&s, 1 << 20).is_ok());
    // A value built in code is held to the same limit.
    let mut v = serde_json::Value::Null;
    for _ in 0..=MAX_RESULT_DEPTH {
        v = serde_json::Value::Array(vec![v]);
    }
    assert!(ResultJson::from_value(&v, 1 << 20).is_err());
}

// ---------------------------------------------------------------- release(not_committed)

#[test]
fn release_not_committed_after_dispatch_keeps_status_and_the_next_claim_executes() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1_000, true));
    h.run(dispatch("a", f));
    // The remote answered 409: nothing happened. The holder says so.
    assert_eq!(
        h.run(release_not_committed("a", f)),
        Reply::Released { fence: f }
    );
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Pending, "the status stays");
    assert!(!rec.reconcile_required, "no flag is set");
    let end = rec.attempts[0].lease.ended.unwrap();
    assert_eq!(
        end.reason,
        LeaseEnd::NotCommitted,
        "the attempt records the attestation"
    );
    assert_eq!(end.at, Timestamp(h.now));
    let g = h.exec(claim("a", 1, binding("alice", 0)));
    assert!(g > f, "the next claim executes");
    // A repeat of that release (its answer was lost) is answered 200 and
    // changes nothing, also after the next claim took over; another
    // reason from the released fence is stale.
    let before = h.rec("a");
    assert_eq!(
        h.run(release_not_committed("a", f)),
        Reply::Released { fence: f }
    );
    assert_eq!(h.rec("a"), before);
    assert_eq!(
        refused(&h.run(release("a", f))),
        Some(RefusalCode::StaleFence)
    );
}

#[test]
fn release_not_committed_without_marks_dispatch_is_allowed() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    assert_eq!(
        refused(&h.run(release("a", f))),
        Some(RefusalCode::ReceiptRequired),
        "not_dispatched still needs proof that nothing was sent"
    );
    assert_eq!(
        h.run(release_not_committed("a", f)),
        Reply::Released { fence: f }
    );
    assert_eq!(h.rec("a").status, Status::Pending);
}

#[test]
fn release_not_committed_keeps_an_unknown_status_and_clears_no_reconciliation() {
    let mut h = H::new();
    let f = to_reconcile(&mut h, "a");
    // A reconcile lease ends through reconcile.
    assert_eq!(
        refused(&h.run(release_not_committed("a", f))),
        Some(RefusalCode::WrongPurpose)
    );
    h.run(reconcile("a", f, Finding::NotCommitted));
    h.run(dispatch("a", f));
    assert_eq!(
        h.run(release_not_committed("a", f)),
        Reply::Released { fence: f }
    );
    let rec = h.rec("a");
    assert_eq!(rec.status, Status::Unknown, "no downgrade");
    assert!(!rec.reconcile_required);
    assert!(matches!(
        h.run(claim("a", 1, binding("alice", 0))),
        Reply::Claim(ClaimDecision::Execute(_))
    ));
}

#[test]
fn release_not_committed_after_the_lease_ran_out_is_lease_expired() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1_000, true));
    h.run(dispatch("a", f));
    h.advance(1_000);
    assert_eq!(
        refused(&h.run(release_not_committed("a", f))),
        Some(RefusalCode::LeaseExpired)
    );
    let rec = h.rec("a");
    assert_eq!(
        rec.status,
        Status::Unknown,
        "expiry after dispatch already decided"
    );
    assert!(rec.reconcile_required);
}

#[test]
fn a_stored_record_that_breaks_an_invariant_is_refused_not_a_panic() {
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    // Damage the stored record: a terminal record holding an open lease.
    let id = (h.tenant.clone(), key("a"));
    h.w.records.get_mut(&id).unwrap().attempts[0].lease.ended = None;
    let damaged = h.rec("a");
    for cmd in [
        claim("a", 1, binding("alice", 0)),
        heartbeat("a", f, None),
        settle("a", f, 1, binding("alice", 0), completed(1)),
        Command::Expire { key: key("a") },
    ] {
        assert_eq!(refused(&h.run(cmd)), Some(RefusalCode::RecordRefused));
    }
    assert_eq!(h.get("a"), Err(RefusalCode::RecordRefused));
    assert_eq!(h.rec("a"), damaged, "left as it was, for the operator");
}
