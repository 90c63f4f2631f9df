// One long file on purpose: the cases are independent bodies that share only
// the fixture, and the macro below lists them all; a case is found by its name.
//! The backend conformance suite: the same test bodies for every [`Store`].
//!
//! The rules themselves are tested in `settle-core`; this suite checks that
//! an engine loads, applies and persists them faithfully, under concurrency,
//! with time moved through the store's [`Clock`].
//!
//! Plug a store in with
//! ```ignore
//! settle_ledger::conformance_tests!(async { my_fixture().await });
//! ```
//! which generates one `#[tokio::test]` per case.

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

use settle_core::testkit::*;
use settle_core::*;

use crate::inspect::{self, ListFilter, ListOrder, ListQuery, ListStatus, TenantStats};
use crate::store::{Clock, Store};

/// A fresh store for one test, its clock, and whatever must live as long as it.
pub struct Fixture {
    /// The store under test, empty.
    pub store: Arc<dyn Store>,
    /// The store's clock; cases advance it instead of sleeping.
    pub clock: Clock,
    /// Dropped after the test (e.g. a temporary directory or database).
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Fixture {
    /// A fixture with nothing to keep alive.
    pub fn new(store: Arc<dyn Store>, clock: Clock) -> Fixture {
        Fixture {
            store,
            clock,
            guard: None,
        }
    }
    fn tenant(&self) -> TenantId {
        TenantId::new("acme").unwrap()
    }
    async fn run(&self, cmd: Command) -> Reply {
        self.run_as(&self.tenant(), cmd).await
    }
    async fn run_as(&self, t: &TenantId, cmd: Command) -> Reply {
        self.store.execute(t, cmd).await.expect("store works")
    }
    async fn exec(&self, cmd: Command) -> Fence {
        match self.run(cmd).await {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("expected execute, got {other:?}"),
        }
    }
    async fn get(&self, k: &str) -> Option<Record> {
        self.store
            .get(&self.tenant(), &key(k))
            .await
            .expect("store works")
            .expect("not refused")
    }
}

/// Generates one `#[tokio::test]` per conformance case for the fixture expression.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            claim_settle_replay_roundtrip,
            racing_first_claims_execute_exactly_once,
            fences_strictly_increase_across_keys,
            concurrent_pairs_on_many_keys_all_settle,
            mismatched_claim_changes_nothing,
            refused_evidence_is_quarantined_durably,
            disputed_is_persisted,
            lease_expiry_moves_to_unknown_and_reconcile,
            sweep_expires_leases_and_collects_records,
            heartbeat_dispatch_release_are_persisted,
            reconcile_findings_are_persisted,
            revoke_is_persisted_and_lapses_leases,
            warnings_are_bounded_per_task,
            tenants_never_meet,
            unknown_keys_are_not_found,
            stats_count_open_records,
            revocation_is_dated_by_the_move_that_ended_the_lease,
            release_not_committed_and_attempt_errors_are_persisted,
            results_are_stored_as_sent,
            invalid_commands_write_nothing,
            quarantine_does_not_move_updated_at,
            batches_apply_in_order,
            batches_answer_as_one_by_one,
            listing_returns_every_record_once_per_tenant,
            listing_while_records_change_returns_each_once,
            listing_filters_and_tenant_stats_agree,
            listing_orders_and_prefixes,
            generations_are_read_back,
            an_export_holds_every_entity_as_stored,
            lost_answers_are_answered_again
        );
    };
    (@cases $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fx: $crate::conformance::Fixture = $make.await;
                $crate::conformance::$name(&fx).await;
            }
        )*
    };
}

/// Claim, settle `completed`, then a claim replays the same outcome and
/// receipt, and a repeated settle (a lost acknowledgement) returns the same
/// receipt; all of it as stored.
pub async fn claim_settle_replay_roundtrip(fx: &Fixture) {
    let f = fx.exec(claim("order-1", 1, binding("alice", 0))).await;
    let r = fx.get("order-1").await.expect("record exists");
    assert_eq!(r.status, Status::Pending);
    assert_eq!(r.open_lease().unwrap().fence, f);
    let rc = receipt(
        fx.run(settle("order-1", f, 1, binding("alice", 0), completed(1)))
            .await,
    );
    assert!(rc.durable);
    assert_eq!(rc.status, Status::Completed);
    let r = fx.get("order-1").await.unwrap();
    assert_eq!(r.status, Status::Completed);
    assert_eq!(r.receipt.as_ref(), Some(&rc));
    assert_eq!(r.outcome.as_ref(), Some(&completed(1)));
    match fx.run(claim("order-1", 1, binding("alice", 0))).await {
        Reply::Claim(ClaimDecision::Replay { outcome, receipt }) => {
            assert_eq!(receipt, rc);
            assert_eq!(outcome, completed(1));
        }
        other => panic!("{other:?}"),
    }
    // A lost acknowledgement: the retry returns the same receipt.
    assert_eq!(
        receipt(
            fx.run(settle("order-1", f, 1, binding("alice", 0), completed(1)))
                .await
        ),
        rc
    );
}

/// 24 racing first claims of one key: exactly one `execute`, the others
/// `in_flight` (the reservation is one compare-and-set).
pub async fn racing_first_claims_execute_exactly_once(fx: &Fixture) {
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let store = fx.store.clone();
            let t = fx.tenant();
            tokio::spawn(async move {
                store
                    .execute(&t, claim("race", 1, binding("alice", 0)))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut executes = 0;
    let mut in_flight = 0;
    for t in tasks {
        match t.await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(_)) => executes += 1,
            Reply::Claim(ClaimDecision::InFlight { .. }) => in_flight += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((executes, in_flight), (1, 23));
}

/// Fences strictly increase across keys (SPEC §6.3: store-wide).
pub async fn fences_strictly_increase_across_keys(fx: &Fixture) {
    let mut last = Fence(0);
    for i in 0..50 {
        let f = fx
            .exec(claim(&format!("f-{i}"), 1, binding("alice", 0)))
            .await;
        assert!(f > last, "{f:?} after {last:?}");
        last = f;
    }
}

/// 200 concurrent claim+settle pairs on distinct keys all settle, each
/// under its own fence, and every receipt is stored.
pub async fn concurrent_pairs_on_many_keys_all_settle(fx: &Fixture) {
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = fx.store.clone();
            let t = fx.tenant();
            tokio::spawn(async move {
                let k = format!("pair-{i}");
                let f = match store
                    .execute(&t, claim(&k, 1, binding("alice", 0)))
                    .await
                    .unwrap()
                {
                    Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
                    other => panic!("{other:?}"),
                };
                let rc = receipt(
                    store
                        .execute(&t, settle(&k, f, 1, binding("alice", 0), completed(1)))
                        .await
                        .unwrap(),
                );
                (k, rc)
            })
        })
        .collect();
    let mut fences = HashSet::new();
    for t in tasks {
        let (k, rc) = t.await.unwrap();
        assert!(fences.insert(rc.fence), "fence reused");
        let r = fx.get(&k).await.unwrap();
        assert_eq!(r.receipt, Some(rc));
    }
}

/// Claims with another fingerprint, principal or scopes are refused and
/// change nothing (SPEC §6.7).
pub async fn mismatched_claim_changes_nothing(fx: &Fixture) {
    fx.exec(claim("m", 1, binding("alice", 0))).await;
    let before = fx.get("m").await.unwrap();
    for cmd in [
        claim("m", 2, binding("alice", 0)),
        claim("m", 1, binding("bob", 0)),
        claim("m", 1, binding_scopes("alice", &["other"], 0)),
    ] {
        assert!(matches!(fx.run(cmd).await, Reply::Refused(_)));
    }
    assert_eq!(fx.get("m").await.unwrap(), before);
}

/// Evidence under a stale fence is refused, quarantined durably, and the
/// canonical status is unchanged.
pub async fn refused_evidence_is_quarantined_durably(fx: &Fixture) {
    let f = fx.exec(claim("q", 1, binding("alice", 0))).await;
    let r = fx
        .run(settle(
            "q",
            Fence(f.0 + 1000),
            1,
            binding("alice", 0),
            completed(1),
        ))
        .await;
    assert_eq!(r, Reply::Refused(RefusalCode::StaleFence));
    let rec = fx.get("q").await.unwrap();
    assert_eq!(rec.quarantine.len(), 1);
    assert_eq!(rec.quarantine[0].reason, RefusalCode::StaleFence);
    assert_eq!(rec.quarantine[0].fence, Fence(f.0 + 1000));
    assert_eq!(rec.status, Status::Pending);
}

/// A disagreeing terminal from the same fence gets `result_mismatch`, the
/// record is stored `disputed`, the first receipt stays canonical (settle rule 0).
pub async fn disputed_is_persisted(fx: &Fixture) {
    let f = fx.exec(claim("d", 1, binding("alice", 0))).await;
    let rc = receipt(
        fx.run(settle("d", f, 1, binding("alice", 0), completed(1)))
            .await,
    );
    let r = fx
        .run(settle("d", f, 1, binding("alice", 0), completed(2)))
        .await;
    assert_eq!(r, Reply::Refused(RefusalCode::ResultMismatch));
    let rec = fx.get("d").await.unwrap();
    assert!(rec.disputed);
    assert_eq!(rec.receipt, Some(rc));
}

/// An expired lease moves the record to `unknown` with `reconcile_required`
/// (applied lazily by `get`), and the next claim gets `reconcile`.
pub async fn lease_expiry_moves_to_unknown_and_reconcile(fx: &Fixture) {
    fx.exec(claim_with("e", 1, binding("alice", 0), 1000, false))
        .await;
    fx.clock.advance(1500);
    let rec = fx.get("e").await.unwrap();
    assert_eq!(rec.status, Status::Unknown, "get applies expiry lazily");
    assert!(rec.reconcile_required);
    assert!(matches!(
        fx.run(claim("e", 1, binding("alice", 0))).await,
        Reply::Claim(ClaimDecision::Reconcile(_))
    ));
}

/// The sweep ends lapsed leases and collects terminal records past their
/// retention; a collected key can be reserved afresh.
pub async fn sweep_expires_leases_and_collects_records(fx: &Fixture) {
    fx.exec(claim_with("s1", 1, binding("alice", 0), 1000, false))
        .await;
    let mut c = Claim::new(key("s2"), fp(1), binding("alice", 0));
    c.retention_s = RetentionS::new(1).unwrap();
    let f = fx.exec(Command::Claim(c)).await;
    receipt(
        fx.run(settle("s2", f, 1, binding("alice", 0), completed(1)))
            .await,
    );
    fx.clock.advance(1500);
    let report = fx.store.sweep().await.unwrap();
    assert!(report.expired >= 1, "{report:?}");
    assert!(report.collected >= 1, "{report:?}");
    let s1 = fx.get("s1").await.unwrap();
    assert_eq!(s1.status, Status::Unknown);
    assert!(s1.open_lease().is_none());
    assert!(fx.get("s2").await.is_none());
    // The key can be reserved afresh, for a new intent.
    fx.exec(claim("s2", 2, binding("alice", 0))).await;
    assert_eq!(fx.get("s2").await.unwrap().reservation.fingerprint, fp(2));
}

/// A heartbeat's new expiry is stored and keeps the lease live; release
/// (not_dispatched) is stored; after `dispatch` the same release is
/// `receipt_required`.
pub async fn heartbeat_dispatch_release_are_persisted(fx: &Fixture) {
    let f = fx
        .exec(claim_with("h", 1, binding("alice", 0), 1000, true))
        .await;
    fx.clock.advance(600);
    let Reply::Heartbeat(l) = fx.run(heartbeat("h", f, Some(5000))).await else {
        panic!()
    };
    assert_eq!(
        fx.get("h").await.unwrap().lease().unwrap().expires_at,
        l.lease_expires_at
    );
    fx.clock.advance(1000);
    // Still live thanks to the heartbeat.
    assert!(matches!(
        fx.run(claim("h", 1, binding("alice", 0))).await,
        Reply::Claim(ClaimDecision::InFlight { .. })
    ));
    assert_eq!(fx.run(release("h", f)).await, Reply::Released { fence: f });
    let rec = fx.get("h").await.unwrap();
    assert_eq!(
        rec.lease().unwrap().ended.unwrap().reason,
        LeaseEnd::Released
    );

    let f = fx
        .exec(claim_with("h2", 1, binding("alice", 0), 1000, true))
        .await;
    assert!(matches!(
        fx.run(dispatch("h2", f)).await,
        Reply::Dispatched(_)
    ));
    assert!(fx.get("h2").await.unwrap().lease().unwrap().dispatched);
    assert_eq!(
        fx.run(release("h2", f)).await,
        Reply::Refused(RefusalCode::ReceiptRequired)
    );
}

/// Reconcile findings are stored: `unavailable` releases and keeps
/// `reconcile_required`, `not_committed` turns the lease into `execute` and
/// clears the flag, and a settle under it is accepted.
pub async fn reconcile_findings_are_persisted(fx: &Fixture) {
    let f = fx.exec(claim("r", 1, binding("alice", 0))).await;
    let u = receipt(
        fx.run(settle("r", f, 1, binding("alice", 0), unknown()))
            .await,
    );
    assert_eq!(u.status, Status::Unknown);
    let g = match fx.run(claim("r", 1, binding("alice", 0))).await {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        fx.run(reconcile("r", g.fence, Finding::Unavailable)).await,
        Reply::Released { fence: g.fence }
    );
    assert!(fx.get("r").await.unwrap().reconcile_required);
    let g = match fx.run(claim("r", 1, binding("alice", 0))).await {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        fx.run(reconcile("r", g.fence, Finding::NotCommitted)).await,
        Reply::Claim(ClaimDecision::Execute(_))
    ));
    let rec = fx.get("r").await.unwrap();
    assert!(!rec.reconcile_required);
    assert_eq!(rec.open_lease().unwrap().purpose, Purpose::Execute);
    let rc = receipt(
        fx.run(settle("r", g.fence, 1, binding("alice", 0), failed(1)))
            .await,
    );
    assert_eq!(rc.status, Status::Failed);
    assert_eq!(fx.get("r").await.unwrap().status, Status::Failed);
}

/// Revoke raises the generation durably: the holder's lease lapses
/// (`lease_expired`), older bindings get `stale_binding`, and a claim at the
/// new generation raises the reservation's.
pub async fn revoke_is_persisted_and_lapses_leases(fx: &Fixture) {
    let f = fx.exec(claim("v", 1, binding("alice", 3))).await;
    assert_eq!(
        fx.run(revoke("alice")).await,
        Reply::Revoked {
            principal: Principal::new("alice").unwrap(),
            generation: 4
        }
    );
    assert_eq!(
        fx.run(settle("v", f, 1, binding("alice", 3), completed(1)))
            .await,
        Reply::Refused(RefusalCode::LeaseExpired)
    );
    assert_eq!(
        fx.run(claim("other", 1, binding("alice", 3))).await,
        Reply::Refused(RefusalCode::StaleBinding)
    );
    assert!(matches!(
        fx.run(claim("v", 1, binding("alice", 4))).await,
        Reply::Claim(ClaimDecision::Reconcile(_))
    ));
    assert_eq!(fx.get("v").await.unwrap().reservation.generation, 4);
}

/// Warnings count per task and class and keep their detail; the 65th class
/// of a task is `too_many_classes`.
pub async fn warnings_are_bounded_per_task(fx: &Fixture) {
    let warn = |class: &str, detail: Option<&str>| {
        Command::Warn(Warn {
            task: TaskId::new("export-7").unwrap(),
            class: WarningClass::new(class).unwrap(),
            detail: detail.map(|d| Text::new("detail", d).unwrap()),
        })
    };
    fx.run(warn("share_deferred", Some("slack down"))).await;
    fx.run(warn("share_deferred", None)).await;
    let Reply::Warning(w) = fx.run(warn("share_deferred", None)).await else {
        panic!()
    };
    assert_eq!(w.count, 3);
    assert_eq!(w.detail.as_ref().map(|d| d.as_str()), Some("slack down"));
    let ws = fx
        .store
        .warnings(&fx.tenant(), &TaskId::new("export-7").unwrap())
        .await
        .unwrap();
    assert_eq!(ws, vec![w]);
    for i in 1..64 {
        assert!(matches!(
            fx.run(warn(&format!("c{i}"), None)).await,
            Reply::Warning(_)
        ));
    }
    assert_eq!(
        fx.run(warn("c64", None)).await,
        Reply::Refused(RefusalCode::TooManyClasses)
    );
    let ws = fx
        .store
        .warnings(&fx.tenant(), &TaskId::new("export-7").unwrap())
        .await
        .unwrap();
    assert_eq!(ws.len(), 64);
}

/// The same key and principal name in another tenant is another operation;
/// a revoke there does not reach ours (SPEC §6.8).
pub async fn tenants_never_meet(fx: &Fixture) {
    let other = TenantId::new("globex").unwrap();
    let f = fx.exec(claim("shared", 1, binding("alice", 0))).await;
    receipt(
        fx.run(settle("shared", f, 1, binding("alice", 0), completed(1)))
            .await,
    );
    // Same key, same principal name, other tenant: a different operation.
    assert!(
        fx.store
            .get(&other, &key("shared"))
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        fx.run_as(&other, claim("shared", 2, binding("alice", 0)))
            .await,
        Reply::Claim(ClaimDecision::Execute(_))
    ));
    fx.run_as(&other, revoke("alice")).await;
    // The revoke in the other tenant did not touch ours.
    assert!(matches!(
        fx.run(claim("fresh", 1, binding("alice", 0))).await,
        Reply::Claim(ClaimDecision::Execute(_))
    ));
    assert_eq!(
        fx.get("shared").await.unwrap().reservation.fingerprint,
        fp(1)
    );
}

/// Calls on an unknown key are `not_found` and create nothing.
pub async fn unknown_keys_are_not_found(fx: &Fixture) {
    assert!(fx.get("nope").await.is_none());
    for cmd in [
        settle("nope", Fence(1), 1, binding("alice", 0), completed(1)),
        heartbeat("nope", Fence(1), None),
        dispatch("nope", Fence(1)),
        release("nope", Fence(1)),
        reconcile("nope", Fence(1), Finding::Unavailable),
    ] {
        assert_eq!(fx.run(cmd).await, Reply::Refused(RefusalCode::NotFound));
    }
    assert!(fx.get("nope").await.is_none(), "refusals create nothing");
}

/// [`crate::Store::stats`] counts open, `unknown`, `reconcile_required` and
/// stuck records, not settled ones.
pub async fn stats_count_open_records(fx: &Fixture) {
    fx.exec(claim_with("st1", 1, binding("alice", 0), 1000, false))
        .await;
    let f = fx.exec(claim("st2", 1, binding("alice", 0))).await;
    receipt(
        fx.run(settle("st2", f, 1, binding("alice", 0), completed(1)))
            .await,
    );
    fx.clock.advance(2000);
    fx.store.sweep().await.unwrap();
    let s = fx.store.stats(1000).await.unwrap();
    assert_eq!(s.open, 1);
    assert_eq!(s.unknown, 1);
    assert_eq!(s.reconcile_required, 1);
    assert_eq!(s.stuck, 1);
}

/// The principal's moves are stored: a lease revoked by one move and
/// looked at after a later one is dated by the first.
pub async fn revocation_is_dated_by_the_move_that_ended_the_lease(fx: &Fixture) {
    let f = fx
        .exec(claim_with("rv", 1, binding("carol", 0), 600_000, false))
        .await;
    let before_first = fx.store.now().await.unwrap();
    fx.run(revoke("carol")).await;
    fx.clock.advance(10_000);
    let before_second = fx.store.now().await.unwrap();
    fx.run(revoke("carol")).await;
    assert_eq!(
        fx.run(heartbeat("rv", f, None)).await,
        Reply::Refused(RefusalCode::LeaseExpired)
    );
    let end = fx.get("rv").await.unwrap().attempts[0].lease.ended.unwrap();
    assert_eq!(end.reason, LeaseEnd::Revoked);
    assert!(
        end.at >= before_first && end.at < before_second,
        "ended at {:?}, first move after {:?}, second after {:?}",
        end.at,
        before_first,
        before_second
    );
}

/// `release(not_committed)` and an `unknown` settlement's error survive the engine.
pub async fn release_not_committed_and_attempt_errors_are_persisted(fx: &Fixture) {
    let f = fx
        .exec(claim_with("nc", 1, binding("alice", 0), 30_000, true))
        .await;
    assert!(matches!(
        fx.run(dispatch("nc", f)).await,
        Reply::Dispatched(_)
    ));
    assert_eq!(
        fx.run(release_not_committed("nc", f)).await,
        Reply::Released { fence: f }
    );
    let r = fx.get("nc").await.unwrap();
    assert_eq!(r.status, Status::Pending);
    assert!(!r.reconcile_required);
    assert_eq!(
        r.attempts[0].lease.ended.unwrap().reason,
        LeaseEnd::NotCommitted
    );
    let g = fx.exec(claim("nc", 1, binding("alice", 0))).await;
    let error = ErrorText::new("outcome.error", "read timeout\n(after 30 s)").unwrap();
    let rc = receipt(
        fx.run(settle(
            "nc",
            g,
            1,
            binding("alice", 0),
            Outcome::unknown_with_response(Some(error.clone()), fp(42)),
        ))
        .await,
    );
    let r = fx.get("nc").await.unwrap();
    assert_eq!(r.attempts[1].error.as_ref(), Some(&error));
    assert_eq!(r.attempts[1].receipt.as_ref(), Some(&rc));
    assert_eq!(rc.response_sha256, Some(fp(42)));
}

/// SPEC §4's answers to a retry after a lost answer, as stored: a claim's
/// `claim_id` kept on its lease (the retry gets the same grant), a repeated
/// dispatch, release and `reconcile(unavailable)` answered 200 without a
/// change, and `release(forget)` removing the record so its key can be
/// reserved afresh, above every fence it had.
pub async fn lost_answers_are_answered_again(fx: &Fixture) {
    let id = "conformance-claim-0001";
    let g = match fx.run(claim_id("c", 1, binding("alice", 0), id)).await {
        Reply::Claim(ClaimDecision::Execute(g)) => g,
        other => panic!("{other:?}"),
    };
    let rec = fx.get("c").await.unwrap();
    assert_eq!(
        rec.lease().unwrap().claim_id.as_ref().map(ClaimId::as_str),
        Some(id)
    );
    fx.clock.advance(100);
    assert_eq!(
        fx.run(claim_id("c", 1, binding("alice", 0), id)).await,
        Reply::Claim(ClaimDecision::Execute(g))
    );
    assert_eq!(fx.get("c").await.unwrap(), rec, "nothing changed");
    assert!(matches!(
        fx.run(claim("c", 1, binding("alice", 0))).await,
        Reply::Claim(ClaimDecision::InFlight { .. })
    ));

    // dispatch and release(not_committed), each repeated.
    assert!(matches!(
        fx.run(dispatch("c", g.fence)).await,
        Reply::Dispatched(_)
    ));
    let rec = fx.get("c").await.unwrap();
    assert!(matches!(
        fx.run(dispatch("c", g.fence)).await,
        Reply::Dispatched(_)
    ));
    assert_eq!(fx.get("c").await.unwrap(), rec);
    for _ in 0..2 {
        assert_eq!(
            fx.run(release_not_committed("c", g.fence)).await,
            Reply::Released { fence: g.fence }
        );
    }
    let rec = fx.get("c").await.unwrap();
    assert_eq!(rec.attempts.len(), 1);
    assert_eq!(
        rec.attempts[0].lease.ended.unwrap().reason,
        LeaseEnd::NotCommitted
    );

    // reconcile(unavailable), repeated: no quarantine.
    let f = fx.exec(claim("u", 1, binding("alice", 0))).await;
    fx.run(settle("u", f, 1, binding("alice", 0), unknown()))
        .await;
    let g = match fx.run(claim("u", 1, binding("alice", 0))).await {
        Reply::Claim(ClaimDecision::Reconcile(g)) => g,
        other => panic!("{other:?}"),
    };
    for _ in 0..2 {
        assert_eq!(
            fx.run(reconcile("u", g.fence, Finding::Unavailable)).await,
            Reply::Released { fence: g.fence }
        );
    }
    let rec = fx.get("u").await.unwrap();
    assert_eq!(rec.quarantine_total, 0);
    assert!(rec.reconcile_required);

    // release(forget): gone, and claimed afresh with another fingerprint.
    let f = fx
        .exec(claim_with("f", 1, binding("alice", 0), 30_000, true))
        .await;
    assert!(matches!(
        fx.run(dispatch("f", f)).await,
        Reply::Dispatched(_)
    ));
    assert_eq!(
        fx.run(release_forget("f", f, ReleaseReason::NotCommitted))
            .await,
        Reply::Released { fence: f }
    );
    assert_eq!(fx.get("f").await, None);
    let f2 = fx.exec(claim("f", 2, binding("alice", 0))).await;
    assert!(f2 > f);
    assert_eq!(fx.get("f").await.unwrap().reservation.fingerprint, fp(2));
    // A record with something recorded is not forgotten.
    assert_eq!(
        fx.run(release_forget("u", g.fence, ReleaseReason::NotCommitted))
            .await,
        Reply::Refused(RefusalCode::StaleFence)
    );
}

/// A result is stored as the compact text that was sent: a replay returns
/// it byte for byte, floats and `null` included.
pub async fn results_are_stored_as_sent(fx: &Fixture) {
    for (k, sent, stored) in [
        (
            "res1",
            "{ \"amount\": 0.1000000000000000055511151231257827, \"e\": 1E+2, \"s\": \"caf\\u00e9\" }",
            "{\"amount\":0.1000000000000000055511151231257827,\"e\":1E+2,\"s\":\"caf\\u00e9\"}",
        ),
        ("res2", "null", "null"),
    ] {
        let f = fx.exec(claim(k, 1, binding("alice", 0))).await;
        let outcome: Outcome = serde_json::from_str(&format!(
            r#"{{"status":"failed","result":{sent},"response_sha256":"{}"}}"#,
            fp(5).to_hex()
        ))
        .unwrap();
        receipt(fx.run(settle(k, f, 1, binding("alice", 0), outcome)).await);
        let Reply::Claim(ClaimDecision::Replay { outcome, .. }) =
            fx.run(claim(k, 1, binding("alice", 0))).await
        else {
            panic!()
        };
        assert_eq!(outcome.result().unwrap().as_str(), stored);
        let json = serde_json::to_string(&outcome).unwrap();
        assert!(json.contains(&format!("\"result\":{stored}")), "{json}");
    }
}

/// A command that breaks an argument rule of the store's limits is
/// answered `Invalid` and writes nothing.
pub async fn invalid_commands_write_nothing(fx: &Fixture) {
    // Every fixture runs with the default lease margin (100 ms).
    match fx
        .run(claim_with("inv", 1, binding("dave", 5), 100, false))
        .await
    {
        Reply::Invalid(e) => assert_eq!(e.field, "lease_ms"),
        other => panic!("{other:?}"),
    }
    assert!(fx.get("inv").await.is_none());
    // The principal's generation did not move either.
    assert!(matches!(
        fx.run(claim("inv2", 1, binding("dave", 0))).await,
        Reply::Claim(ClaimDecision::Execute(_))
    ));
}

/// Refused evidence is kept for audit without counting as progress.
pub async fn quarantine_does_not_move_updated_at(fx: &Fixture) {
    let f = fx.exec(claim("qz", 1, binding("alice", 0))).await;
    receipt(
        fx.run(settle("qz", f, 1, binding("alice", 0), unknown()))
            .await,
    );
    let before = fx.get("qz").await.unwrap();
    fx.clock.advance(5_000);
    assert_eq!(
        fx.run(settle("qz", f, 1, binding("alice", 0), completed(1)))
            .await,
        Reply::Refused(RefusalCode::StaleFence)
    );
    let after = fx.get("qz").await.unwrap();
    assert_eq!(after.quarantine_total, before.quarantine_total + 1);
    assert_eq!(after.updated_at, before.updated_at);
}

/// `execute_batch`: one result per command, in order; a later command sees
/// what an earlier one of the same batch left (same record, or a revoked
/// principal); each command succeeds or fails on its own.
pub async fn batches_apply_in_order(fx: &Fixture) {
    let t = fx.tenant();
    let out = fx
        .store
        .execute_batch(
            &t,
            vec![
                claim("ba", 1, binding("bob", 0)),
                claim("bb", 1, binding("bob", 0)),
                // The same key again: the first claim's lease is live.
                claim("ba", 1, binding("bob", 0)),
                // A mismatch fails alone.
                claim("ba", 2, binding("bob", 0)),
            ],
        )
        .await;
    let out: Vec<Reply> = out.into_iter().map(|r| r.expect("store works")).collect();
    assert_eq!(out.len(), 4);
    let fence = |r: &Reply| match r {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("expected execute, got {other:?}"),
    };
    let (fa, fb) = (fence(&out[0]), fence(&out[1]));
    assert!(
        matches!(&out[2], Reply::Claim(ClaimDecision::InFlight { .. })),
        "{:?}",
        out[2]
    );
    assert_eq!(refused(&out[3]), Some(RefusalCode::FingerprintMismatch));

    let out = fx
        .store
        .execute_batch(
            &t,
            vec![
                settle("ba", fa, 1, binding("bob", 0), completed(1)),
                claim("ba", 1, binding("bob", 0)),
                revoke("bob"),
                // After the revocation in the same batch: refused.
                settle("bb", fb, 1, binding("bob", 0), completed(2)),
            ],
        )
        .await;
    let out: Vec<Reply> = out.into_iter().map(|r| r.expect("store works")).collect();
    assert_eq!(out.len(), 4);
    let rc = receipt(out[0].clone());
    match &out[1] {
        Reply::Claim(ClaimDecision::Replay { receipt, .. }) => assert_eq!(receipt, &rc),
        other => panic!("expected replay, got {other:?}"),
    }
    assert!(matches!(out[2], Reply::Revoked { generation: 1, .. }));
    assert_eq!(refused(&out[3]), Some(RefusalCode::LeaseExpired));
    assert_eq!(fx.get("ba").await.unwrap().status, Status::Completed);
    // The refused settlement wrote no receipt.
    let bb = fx.get("bb").await.unwrap();
    assert!(bb.receipt.is_none() && !bb.status.is_terminal(), "{bb:?}");
    assert!(fx.store.execute_batch(&t, Vec::new()).await.is_empty());
}

/// A small deterministic generator (xorshift64*) for the batch property:
/// no dependency, the same sequence on every engine.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// A call of the batch property, before it is given the fences of the
/// tenant it runs in.
#[derive(Debug, Clone)]
enum Call {
    Claim {
        key: &'static str,
        fp: u8,
        p: &'static str,
        g: u64,
    },
    Settle {
        key: &'static str,
        old: bool,
        fp: u8,
        p: &'static str,
        g: u64,
        outcome: u8,
    },
    Heartbeat {
        key: &'static str,
        old: bool,
    },
    Dispatch {
        key: &'static str,
        old: bool,
    },
    Release {
        key: &'static str,
        old: bool,
        committed: bool,
    },
    Reconcile {
        key: &'static str,
        old: bool,
        not_committed: bool,
    },
    Revoke {
        p: &'static str,
    },
}

/// The principals' generations as the one-by-one run left them.
#[derive(Default)]
struct Generations(std::collections::HashMap<&'static str, u64>);

impl Generations {
    fn of(&self, p: &str) -> u64 {
        self.0.get(p).copied().unwrap_or(0)
    }
    fn learn(&mut self, call: &Call, reply: &Reply) {
        let (p, g) = match (call, reply) {
            (Call::Revoke { p }, Reply::Revoked { generation, .. }) => (*p, *generation),
            (Call::Claim { p, g, .. }, Reply::Claim(_)) => (*p, *g),
            _ => return,
        };
        let e = self.0.entry(p).or_insert(0);
        *e = (*e).max(g);
    }
}

/// The fences a tenant was granted per key: the latest and the one before.
#[derive(Default)]
struct Fences(std::collections::HashMap<&'static str, (Fence, Option<Fence>)>);

impl Fences {
    /// A fence never granted (the store is fresh): for a key with none yet.
    const NEVER: Fence = Fence(9_000_000_000_000);
    fn of(&self, key: &str, old: bool) -> Fence {
        match self.0.get(key) {
            Some((latest, prev)) if old => prev.unwrap_or(*latest),
            Some((latest, _)) => *latest,
            None => Fences::NEVER,
        }
    }
    fn learn(&mut self, call: &Call, reply: &Reply) {
        let key = match call {
            Call::Claim { key, .. } | Call::Reconcile { key, .. } => *key,
            _ => return,
        };
        if let Reply::Claim(ClaimDecision::Execute(g) | ClaimDecision::Reconcile(g)) = reply {
            let e = self.0.entry(key).or_insert((g.fence, None));
            if e.0 != g.fence {
                *e = (g.fence, Some(e.0));
            }
        }
    }
}

impl Call {
    /// A random call; generations are drawn around `current`, the
    /// principals' generations as the one-by-one run left them (older,
    /// current, or one that raises).
    fn random(g: &mut Gen, principals: &[&'static str], current: &Generations) -> Call {
        let key = *g.pick(&["k0", "k1", "k2", "k3"]);
        let p = *g.pick(principals);
        let gen_ = match g.below(8) {
            0 => current.of(p).saturating_sub(1),
            1 | 2 => current.of(p) + 1,
            _ => current.of(p),
        };
        let old = g.below(4) == 0;
        match g.below(20) {
            0..=6 => Call::Claim {
                key,
                fp: if g.below(8) == 0 { 2 } else { 1 },
                p,
                g: gen_,
            },
            7..=11 => Call::Settle {
                key,
                old,
                fp: if g.below(10) == 0 { 2 } else { 1 },
                p,
                g: gen_,
                outcome: g.below(3) as u8,
            },
            12 => Call::Heartbeat { key, old },
            13 | 14 => Call::Dispatch { key, old },
            15 => Call::Release {
                key,
                old,
                committed: g.below(2) == 0,
            },
            16 | 17 => Call::Reconcile {
                key,
                old,
                not_committed: g.below(2) == 0,
            },
            _ => Call::Revoke { p },
        }
    }

    fn command(&self, fences: &Fences) -> Command {
        match *self {
            Call::Claim { key, fp, p, g } => claim_with(key, fp, binding(p, g), 30_000, true),
            Call::Settle {
                key,
                old,
                fp,
                p,
                g,
                outcome,
            } => settle(
                key,
                fences.of(key, old),
                fp,
                binding(p, g),
                match outcome {
                    0 => completed(1),
                    1 => failed(1),
                    _ => unknown(),
                },
            ),
            Call::Heartbeat { key, old } => heartbeat(key, fences.of(key, old), None),
            Call::Dispatch { key, old } => dispatch(key, fences.of(key, old)),
            Call::Release {
                key,
                old,
                committed: true,
            } => release_not_committed(key, fences.of(key, old)),
            Call::Release {
                key,
                old,
                committed: false,
            } => release(key, fences.of(key, old)),
            Call::Reconcile {
                key,
                old,
                not_committed,
            } => reconcile(
                key,
                fences.of(key, old),
                if not_committed {
                    Finding::NotCommitted
                } else {
                    Finding::Unavailable
                },
            ),
            Call::Revoke { p } => revoke(p),
        }
    }
}

/// What must be equal between a batch's answer and the one-by-one answer:
/// the decision or problem code and the statuses it carries (fences,
/// times and `retry_after_ms` may differ, SPEC §10).
fn essence(r: &Result<Reply, crate::StoreError>) -> String {
    match r {
        Err(e) => format!("store error: {e}"),
        Ok(Reply::Claim(ClaimDecision::Replay { outcome, receipt })) => {
            format!("replay {:?} {:?}", outcome.status(), receipt.status)
        }
        Ok(Reply::Receipt(rc)) => format!("receipt {:?}", rc.status),
        Ok(Reply::Revoked { generation, .. }) => format!("revoked {generation}"),
        Ok(other) => other.label().to_string(),
    }
}

/// SPEC §10: every call of a batch answers exactly what the single call
/// would have answered in that order. Random batches over a few keys and
/// two principals (repeated keys, generation raises, revokes, settles
/// under old and new generations and fences, lease expiry between
/// batches) run as a batch in one tenant and one by one in another with
/// the same history; decisions, statuses and codes must agree, and so
/// must the records after each batch.
pub async fn batches_answer_as_one_by_one(fx: &Fixture) {
    for seed in 1..=12u64 {
        let batched = TenantId::new(format!("batch-{seed}")).unwrap();
        let single = TenantId::new(format!("single-{seed}")).unwrap();
        let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut fa, mut fb) = (Fences::default(), Fences::default());
        let mut generations = Generations::default();
        // Every third seed has one principal only.
        let principals: &[&str] = if seed % 3 == 0 {
            &["p0"]
        } else {
            &["p0", "p0", "p1"]
        };
        for step in 0..10 {
            let calls: Vec<Call> = (0..1 + g.below(8))
                .map(|_| Call::random(&mut g, principals, &generations))
                .collect();
            let in_batch: Vec<Command> = calls.iter().map(|c| c.command(&fa)).collect();
            let one_by_one: Vec<Command> = calls.iter().map(|c| c.command(&fb)).collect();
            let a = fx.store.execute_batch(&batched, in_batch).await;
            let mut b = Vec::with_capacity(calls.len());
            for cmd in one_by_one {
                b.push(fx.store.execute(&single, cmd).await);
            }
            assert_eq!(a.len(), calls.len());
            for (i, call) in calls.iter().enumerate() {
                assert_eq!(
                    essence(&a[i]),
                    essence(&b[i]),
                    "seed {seed} step {step}: call {i} ({call:?}) of {calls:#?} answered differently in a batch"
                );
                if let (Ok(ra), Ok(rb)) = (&a[i], &b[i]) {
                    fa.learn(call, ra);
                    fb.learn(call, rb);
                    generations.learn(call, rb);
                }
            }
            for k in ["k0", "k1", "k2", "k3"] {
                let ra = fx.store.get(&batched, &key(k)).await.expect("store works");
                let rb = fx.store.get(&single, &key(k)).await.expect("store works");
                let view = |r: Result<Option<Record>, RefusalCode>| {
                    r.map(|r| {
                        r.map(|r| {
                            (
                                r.status,
                                r.reconcile_required,
                                r.disputed,
                                r.reservation.generation,
                                r.open_lease().map(|l| (l.purpose, l.dispatched)),
                            )
                        })
                    })
                };
                assert_eq!(
                    view(ra),
                    view(rb),
                    "seed {seed} step {step}: record {k} differs after {calls:#?}"
                );
            }
            // Now and then every lease lapses (both tenants alike).
            if g.below(4) == 0 {
                fx.clock.advance(31_000);
            }
        }
    }
}

/// Every page of a listing with `filter`, keys in order of appearance.
async fn list_all(fx: &Fixture, t: &TenantId, filter: ListFilter, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let q = ListQuery {
            filter: filter.clone(),
            order: Default::default(),
            after: after.take(),
            limit,
            stuck_after_ms: 1000,
        };
        let page = inspect::list(&*fx.store, t, &q).await.expect("store works");
        assert!(page.records.len() <= limit);
        out.extend(page.records.iter().map(|r| r.key.as_str().to_string()));
        match page.next {
            Some(k) => after = Some(k),
            None => return out,
        }
    }
}

/// SPEC §9: keyset pages return every record exactly once, in key order,
/// and only the caller's tenant's.
pub async fn listing_returns_every_record_once_per_tenant(fx: &Fixture) {
    let other = TenantId::new("globex").unwrap();
    let mut ours = Vec::new();
    for i in 0..23 {
        let k = format!("l-{i:02}");
        let f = fx.exec(claim(&k, 1, binding("alice", 0))).await;
        if i % 3 == 0 {
            receipt(
                fx.run(settle(&k, f, 1, binding("alice", 0), completed(1)))
                    .await,
            );
        }
        ours.push(k);
    }
    for i in 0..5 {
        fx.run_as(&other, claim(&format!("l-{i:02}x"), 1, binding("alice", 0)))
            .await;
    }
    for limit in [1, 4, 7, 23, 100] {
        let got = list_all(fx, &fx.tenant(), ListFilter::default(), limit).await;
        assert_eq!(got, ours, "limit {limit}");
    }
    let theirs = list_all(fx, &other, ListFilter::default(), 2).await;
    assert_eq!(theirs.len(), 5);
    assert!(theirs.iter().all(|k| k.ends_with('x')));
    let nobody = list_all(
        fx,
        &TenantId::new("initech").unwrap(),
        ListFilter::default(),
        10,
    )
    .await;
    assert!(nobody.is_empty());
}

/// Records created and settled between pages: each record that existed
/// throughout appears exactly once, and no key appears twice.
pub async fn listing_while_records_change_returns_each_once(fx: &Fixture) {
    let t = fx.tenant();
    let mut fences = Vec::new();
    for i in 0..30 {
        let k = format!("c-{:02}", i * 2);
        fences.push((k.clone(), fx.exec(claim(&k, 1, binding("alice", 0))).await));
    }
    let mut seen = Vec::new();
    let mut after = None;
    let mut round = 0;
    loop {
        let q = ListQuery {
            filter: ListFilter::default(),
            order: Default::default(),
            after: after.take(),
            limit: 4,
            stuck_after_ms: 1000,
        };
        let page = inspect::list(&*fx.store, &t, &q).await.unwrap();
        seen.extend(page.records.iter().map(|r| r.key.as_str().to_string()));
        // Changes between pages: new keys on both sides of the cursor, and
        // settles of records already listed and not yet listed.
        fx.exec(claim(
            &format!("c-{:02}", round * 2 + 1),
            1,
            binding("alice", 0),
        ))
        .await;
        fx.exec(claim(&format!("b-{round:02}"), 1, binding("alice", 0)))
            .await;
        if let Some((k, f)) = fences.get(round * 3 % 30) {
            fx.run(settle(k, *f, 1, binding("alice", 0), completed(1)))
                .await;
        }
        round += 1;
        match page.next {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no key twice: {seen:?}");
    for (k, _) in &fences {
        assert!(unique.contains(k), "{k} existed throughout and was listed");
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, seen, "key order");
}

/// Each filter selects exactly the records it names, and the tenant's
/// counts agree with the listing.
pub async fn listing_filters_and_tenant_stats_agree(fx: &Fixture) {
    let t = fx.tenant();
    let b = || binding("alice", 0);
    // running: an open lease
    fx.exec(claim("f-running", 1, b())).await;
    // pending, stuck: released (nothing applied), then left alone
    let f = fx.exec(claim("f-stuck", 1, b())).await;
    fx.run(release_not_committed("f-stuck", f)).await;
    // completed, then disputed by a different result
    let f = fx.exec(claim("f-disputed", 1, b())).await;
    receipt(fx.run(settle("f-disputed", f, 1, b(), completed(1))).await);
    fx.run(settle("f-disputed", f, 1, b(), completed(2))).await;
    // failed
    let f = fx.exec(claim("f-failed", 1, b())).await;
    receipt(fx.run(settle("f-failed", f, 1, b(), failed(1))).await);
    // unknown, reconcile required
    let f = fx.exec(claim("f-unknown", 1, b())).await;
    fx.run(settle("f-unknown", f, 1, b(), unknown())).await;
    // quarantined: evidence under a fence never granted
    let f = fx.exec(claim("g-quarantined", 1, b())).await;
    fx.run(settle(
        "g-quarantined",
        Fence(f.0 + 1000),
        1,
        b(),
        completed(1),
    ))
    .await;
    fx.clock.advance(1500);

    let by = |filter: ListFilter| list_all(fx, &t, filter, 2);
    let st = |s: &[ListStatus]| ListFilter {
        statuses: s.to_vec(),
        ..ListFilter::default()
    };
    assert_eq!(
        by(st(&[ListStatus::Running])).await,
        ["f-running", "g-quarantined"]
    );
    assert_eq!(
        by(st(&[ListStatus::Pending])).await,
        ["f-running", "f-stuck", "g-quarantined"],
        "pending includes running"
    );
    assert_eq!(
        by(st(&[ListStatus::Failed, ListStatus::Completed])).await,
        ["f-disputed", "f-failed"]
    );
    let flag = |f: fn(&mut ListFilter)| {
        let mut x = ListFilter::default();
        f(&mut x);
        x
    };
    assert_eq!(by(flag(|x| x.disputed = Some(true))).await, ["f-disputed"]);
    assert_eq!(
        by(flag(|x| x.reconcile_required = Some(true))).await,
        ["f-unknown"]
    );
    assert_eq!(
        by(flag(|x| x.stuck = Some(true))).await,
        ["f-stuck", "f-unknown"]
    );
    // The disputing evidence was quarantined too.
    assert_eq!(
        by(flag(|x| x.quarantined = Some(true))).await,
        ["f-disputed", "g-quarantined"]
    );
    assert_eq!(
        by(flag(|x| x.key_prefix = Some("g-".into()))).await,
        ["g-quarantined"]
    );
    assert_eq!(by(flag(|x| x.disputed = Some(false))).await.len(), 5);

    let s = inspect::tenant_stats(&*fx.store, &t, 1000).await.unwrap();
    assert_eq!(
        s,
        TenantStats {
            pending: 1,
            running: 2,
            unknown: 1,
            conflict: 0,
            failed: 1,
            completed: 1,
            total: 6,
            reconcile_required: 1,
            disputed: 1,
            stuck: 2,
            quarantined: 2,
            quarantined_records: 2,
            refused: 0,
        }
    );
    let other = inspect::tenant_stats(&*fx.store, &TenantId::new("globex").unwrap(), 1000)
        .await
        .unwrap();
    assert_eq!(other, TenantStats::default());
}

/// Every page of a listing in `order` with `filter`, keys in order of appearance.
async fn list_in(fx: &Fixture, order: ListOrder, filter: ListFilter, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let q = ListQuery {
            filter: filter.clone(),
            order,
            after: after.take(),
            limit,
            stuck_after_ms: 1000,
        };
        let page = inspect::list(&*fx.store, &fx.tenant(), &q)
            .await
            .expect("store works");
        assert!(page.records.len() <= limit);
        out.extend(page.records.iter().map(|r| r.key.as_str().to_string()));
        match page.next {
            Some(c) => {
                assert_eq!(c.order(), order, "the cursor carries the order");
                after = Some(c);
            }
            None => return out,
        }
    }
}

/// SPEC §9 `order` and `key_prefix`: `updated` is most recently updated
/// first; `attention` is reconcile required, disputed, stuck, then the
/// rest, most recently updated first within each; pages of any size give
/// each record once; a prefix lists exactly the keys that start with it.
#[allow(clippy::too_many_lines)] // one scenario, kept whole
pub async fn listing_orders_and_prefixes(fx: &Fixture) {
    let b = || binding("alice", 0);
    // Each step 10 ms after the last, so `updated_at` orders them.
    let step = || fx.clock.advance(10);
    let f = fx.exec(claim("o-unknown", 1, b())).await;
    step();
    let g = fx.exec(claim("o-disputed", 1, b())).await;
    step();
    let s = fx.exec(claim("o-stuck", 1, b())).await;
    step();
    fx.run(release_not_committed("o-stuck", s)).await;
    step();
    fx.exec(claim("mw-1", 1, b())).await;
    step();
    fx.exec(claim("mw-2", 1, b())).await;
    step();
    fx.exec(claim("mw", 1, b())).await;
    step();
    fx.exec(claim("mx", 1, b())).await;
    step();
    receipt(fx.run(settle("o-disputed", g, 1, b(), completed(1))).await);
    step();
    fx.run(settle("o-disputed", g, 1, b(), completed(2))).await;
    step();
    fx.run(settle("o-unknown", f, 1, b(), unknown())).await;
    step();
    // The claims of mw-1, mw-2, mw and mx are still running: not stuck.
    let updated = [
        "o-unknown",
        "o-disputed",
        "mx",
        "mw",
        "mw-2",
        "mw-1",
        "o-stuck",
    ];
    let attention = [
        "o-unknown",
        "o-disputed",
        "mx",
        "mw",
        "mw-2",
        "mw-1",
        "o-stuck",
    ];
    for limit in [1, 2, 3, 100] {
        assert_eq!(
            list_in(fx, ListOrder::Updated, ListFilter::default(), limit).await,
            updated,
            "limit {limit}"
        );
    }
    // o-stuck becomes stuck (no lease, untouched past stuck_after_ms), the
    // running leases are still open: it moves up to the third bucket.
    fx.clock.advance(1500);
    let attention_now = [
        "o-unknown",
        "o-disputed",
        "o-stuck",
        "mx",
        "mw",
        "mw-2",
        "mw-1",
    ];
    assert_ne!(attention, attention_now);
    for limit in [1, 2, 3, 100] {
        assert_eq!(
            list_in(fx, ListOrder::Attention, ListFilter::default(), limit).await,
            attention_now,
            "limit {limit}"
        );
    }
    let prefix = |p: &str| ListFilter {
        key_prefix: Some(p.to_string()),
        ..ListFilter::default()
    };
    for limit in [1, 2, 100] {
        assert_eq!(
            list_in(fx, ListOrder::Key, prefix("mw-"), limit).await,
            ["mw-1", "mw-2"]
        );
        assert_eq!(
            list_in(fx, ListOrder::Key, prefix("mw"), limit).await,
            ["mw", "mw-1", "mw-2"]
        );
        assert_eq!(
            list_in(fx, ListOrder::Updated, prefix("mw"), limit).await,
            ["mw", "mw-2", "mw-1"]
        );
        assert_eq!(
            list_in(fx, ListOrder::Key, prefix("o-s"), limit).await,
            ["o-stuck"]
        );
        assert!(
            list_in(fx, ListOrder::Key, prefix("n"), limit)
                .await
                .is_empty()
        );
    }
    // Filters apply in every order.
    let stuck = ListFilter {
        stuck: Some(true),
        ..ListFilter::default()
    };
    // (Unknown without a lease is stuck too; it needs reconciling first.)
    assert_eq!(
        list_in(fx, ListOrder::Attention, stuck, 1).await,
        ["o-unknown", "o-stuck"]
    );
}

/// SPEC §7 `GET /v1/principals/{p}`: a principal's current generation, 0
/// for one never seen, raised by a revoke and by a claim at a higher
/// generation, per tenant, and the same after a reopen of the store where
/// the engine has one (the fixture's store is read as written).
pub async fn generations_are_read_back(fx: &Fixture) {
    let t = fx.tenant();
    let other = TenantId::new("globex").unwrap();
    let p = |s: &str| Principal::new(s).unwrap();
    let gen_of = |t: TenantId, s: &'static str| async move {
        fx.store
            .generation(&t, &p(s))
            .await
            .expect("store works")
            .expect("not refused")
    };
    assert_eq!(gen_of(t.clone(), "nobody").await, 0);
    fx.exec(claim("g-1", 1, binding("alice", 0))).await;
    assert_eq!(gen_of(t.clone(), "alice").await, 0);
    fx.run(revoke("alice")).await;
    fx.run(revoke("alice")).await;
    assert_eq!(gen_of(t.clone(), "alice").await, 2);
    fx.exec(claim("g-2", 1, binding("bob", 3))).await;
    assert_eq!(gen_of(t.clone(), "bob").await, 3);
    assert_eq!(gen_of(other, "alice").await, 0, "tenants never meet");
}

/// SPEC §12: an export holds every record (as `get` shows it), principal
/// and warning task written before it, in canonical order, and a fence
/// floor above every fence it holds.
pub async fn an_export_holds_every_entity_as_stored(fx: &Fixture) {
    let beta = TenantId::new("beta").unwrap();
    let f = fx.exec(claim("settled", 1, binding("alice", 0))).await;
    fx.run(settle("settled", f, 1, binding("alice", 0), completed(4)))
        .await;
    fx.exec(claim("open", 2, binding("alice", 0))).await;
    fx.run_as(&beta, claim("other", 3, binding("bob", 0))).await;
    fx.run(revoke("carol")).await;
    fx.run_as(
        &beta,
        Command::Warn(Warn {
            task: TaskId::new("nightly").unwrap(),
            class: WarningClass::new("slow").unwrap(),
            detail: None,
        }),
    )
    .await;
    let (bytes, summary) = crate::export::export_to(&*fx.store, Vec::new(), |_, _| {})
        .await
        .expect("the store exports");
    let entities: Vec<settle_portable::Entity> = settle_portable::Reader::new(&bytes[..])
        .expect("a header")
        .map(|e| e.expect("a whole file"))
        .collect();
    assert_eq!(
        (summary.records, summary.principals, summary.warning_tasks),
        (3, 1, 1)
    );
    let mut records = 0;
    for e in &entities {
        if let settle_portable::Entity::Record { tenant, record } = e {
            let shown = fx
                .store
                .get(tenant, &record.key)
                .await
                .expect("store works")
                .expect("not refused")
                .expect("exists");
            assert_eq!(&shown, record);
            records += 1;
        }
    }
    assert_eq!(records, 3);
    assert!(entities.iter().any(|e| matches!(e,
        settle_portable::Entity::Principal { principal, state, .. }
            if principal.as_str() == "carol" && state.generation == 1)));
    assert!(entities.iter().any(|e| matches!(e,
        settle_portable::Entity::Warnings { tenant, warnings, .. }
            if *tenant == beta && warnings.len() == 1)));
    assert!(summary.fence_floor > summary.max_fence);
    assert!(fx.store.fence_floor().await.expect("store works") > summary.max_fence);
}
