//! The typed `Ledger` API over the in-memory store: values the rules would
//! refuse cannot be built, and every argument rule holds whoever calls.

use std::sync::Arc;

use settle_core::invariants::check_record;
use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::{Clock, Ledger, LedgerConfig, LedgerError, MemStore, Store};

fn ledger(limits: Limits) -> (Ledger, Arc<MemStore>) {
    let store = Arc::new(MemStore::new(limits, Clock::system()));
    (Ledger::new(store.clone()), store)
}

fn tenant() -> TenantId {
    TenantId::default_tenant()
}

async fn reconciling(l: &Ledger, k: &str) -> Fence {
    let ClaimDecision::Execute(g) = l
        .claim(&tenant(), Claim::new(key(k), fp(1), binding("alice", 0)))
        .await
        .unwrap()
    else {
        panic!()
    };
    l.settle(
        &tenant(),
        Settle {
            key: key(k),
            fence: g.fence,
            fingerprint: fp(1),
            binding: binding("alice", 0),
            outcome: unknown(),
        },
    )
    .await
    .unwrap();
    let ClaimDecision::Reconcile(g) = l
        .claim(&tenant(), Claim::new(key(k), fp(1), binding("alice", 0)))
        .await
        .unwrap()
    else {
        panic!()
    };
    g.fence
}

/// A committed finding with an `unknown`
/// outcome used to reach a release-mode `assert!` on the store's writer.
/// It cannot be built any more, and the store keeps answering.
#[tokio::test]
async fn example_a_a_committed_finding_with_an_unknown_outcome_cannot_reach_the_store() {
    let (l, _) = ledger(Limits::default());
    let f = reconciling(&l, "a").await;
    let e = Finding::committed(fp(1), binding("alice", 0), Outcome::unknown(None)).unwrap_err();
    assert_eq!(e.field, "outcome.status");
    let before = l.get(&tenant(), &key("a")).await.unwrap();
    // The store is alive and the record untouched: a valid finding settles.
    let finding = Finding::committed(fp(1), binding("alice", 0), completed(1)).unwrap();
    let r = l.reconcile(&tenant(), key("a"), f, finding).await.unwrap();
    assert!(matches!(r, settle_ledger::Reconciled::Receipt(_)));
    assert_eq!(before.status, Status::Unknown);
}

/// A `completed` outcome without
/// `response_sha256` used to be persisted, and the store then refused to
/// reopen. It cannot be built (in code or from JSON), so it never reaches
/// a store.
#[tokio::test]
async fn example_b_a_completed_outcome_without_its_digest_is_never_persisted() {
    let (l, _) = ledger(Limits::default());
    let ClaimDecision::Execute(g) = l
        .claim(&tenant(), Claim::new(key("b"), fp(1), binding("alice", 0)))
        .await
        .unwrap()
    else {
        panic!()
    };
    let result = ResultJson::from_text(r#"{"charge":"ch_1"}"#, 1024).unwrap();
    let e = Outcome::new(OutcomeStatus::Completed, Some(result), None, None).unwrap_err();
    assert_eq!(e.field, "outcome.response_sha256");
    assert!(
        serde_json::from_str::<Outcome>(r#"{"status":"completed","result":{"charge":"ch_1"}}"#)
            .is_err()
    );
    let r = l.get(&tenant(), &key("b")).await.unwrap();
    assert_eq!(r.status, Status::Pending);
    assert!(r.open_lease().is_some_and(|lease| lease.fence == g.fence));
    check_record(&r).unwrap();
}

/// The result size limit is the store's too: a command that skips the
/// `Ledger` and goes straight to `Store::execute` is refused all the same,
/// and nothing is written.
#[tokio::test]
async fn the_result_limit_holds_without_the_ledger() {
    let limits = Limits {
        max_result_bytes: 32,
        ..Limits::default()
    };
    let (l, store) = ledger(limits);
    let ClaimDecision::Execute(g) = l
        .claim(&tenant(), Claim::new(key("c"), fp(1), binding("alice", 0)))
        .await
        .unwrap()
    else {
        panic!()
    };
    let big = Outcome::completed(
        ResultJson::from_text(&format!("\"{}\"", "x".repeat(64)), 1 << 20).unwrap(),
        fp(9),
    );
    let cmd = settle("c", g.fence, 1, binding("alice", 0), big.clone());
    let reply = store.execute(&tenant(), cmd).await.unwrap();
    assert!(
        matches!(&reply, Reply::Invalid(e) if e.field == "outcome.result"),
        "{reply:?}"
    );
    let r = store
        .get(&tenant(), &key("c"))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.status, Status::Pending);
    assert!(r.attempts[0].receipt.is_none());
    // Through a Ledger configured more generously, the store's limit still wins.
    let generous = Ledger::with_config(
        store.clone(),
        LedgerConfig {
            max_result_bytes: 1 << 20,
        },
    );
    let e = generous
        .settle(
            &tenant(),
            Settle {
                key: key("c"),
                fence: g.fence,
                fingerprint: fp(1),
                binding: binding("alice", 0),
                outcome: big,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, LedgerError::Invalid(ref i) if i.field == "outcome.result"),
        "{e:?}"
    );
}

/// A lease that cannot outlast the margin is refused up front.
#[tokio::test]
async fn a_lease_not_longer_than_the_margin_is_invalid() {
    let (l, _) = ledger(Limits {
        lease_margin_ms: 250,
        ..Limits::default()
    });
    let mut c = Claim::new(key("d"), fp(1), binding("alice", 0));
    c.lease_ms = LeaseMs::new(250).unwrap();
    let e = l.claim(&tenant(), c.clone()).await.unwrap_err();
    let LedgerError::Invalid(i) = e else {
        panic!("{e:?}")
    };
    assert_eq!(i.field, "lease_ms");
    assert!(i.reason.contains("250"), "{}", i.reason);
    assert!(matches!(
        l.get(&tenant(), &key("d")).await.unwrap_err(),
        LedgerError::Refused(RefusalCode::NotFound)
    ));
    c.lease_ms = LeaseMs::new(251).unwrap();
    assert!(matches!(
        l.claim(&tenant(), c).await.unwrap(),
        ClaimDecision::Execute(_)
    ));
}

/// Through the library: `release(not_committed)` after
/// `dispatch` ends the lease, and the next claim executes.
#[tokio::test]
async fn release_not_committed_through_the_ledger() {
    let (l, _) = ledger(Limits::default());
    let mut c = Claim::new(key("e"), fp(1), binding("alice", 0));
    c.marks_dispatch = true;
    let ClaimDecision::Execute(g) = l.claim(&tenant(), c.clone()).await.unwrap() else {
        panic!()
    };
    l.dispatch(&tenant(), key("e"), g.fence).await.unwrap();
    let released = l
        .release(
            &tenant(),
            Release {
                key: key("e"),
                fence: g.fence,
                reason: ReleaseReason::NotCommitted,
                forget: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(released, g.fence);
    let r = l.get(&tenant(), &key("e")).await.unwrap();
    assert_eq!(r.status, Status::Pending);
    assert!(!r.reconcile_required);
    assert_eq!(
        r.attempts[0].lease.ended.unwrap().reason,
        LeaseEnd::NotCommitted
    );
    assert!(matches!(
        l.claim(&tenant(), c).await.unwrap(),
        ClaimDecision::Execute(_)
    ));
}
