//! `run_once` (SPEC §11), step by step, against the in-process ledger and a
//! real settle server (each scenario is two tests: `::in_process` and
//! `::over_http`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use settle_core::{Fence, Key, OutcomeStatus, RefusalCode, Status};
use settle_worker::{
    Done, EffectContext, EffectError, Finding, RunError, RunOptions, RunResult, Transport, run_once,
};

use common::{Tap, TestLedger};

const PRINCIPAL: &str = "svc-billing";

fn options() -> RunOptions {
    RunOptions::new(PRINCIPAL).scopes(["charge"])
}

fn payment(amount: u64) -> Value {
    json!({"amount": amount, "currency": "EUR"})
}

/// A guard against a scenario that hangs: a failure, not a synchronisation.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the scenario finished within 30 s")
}

/// Runs an effect that counts its executions and completes with `result`.
async fn run_counting(
    t: &dyn Transport,
    key: &str,
    request: &Value,
    result: Value,
    runs: &AtomicUsize,
    o: &RunOptions,
) -> Result<RunResult, RunError> {
    run_once(
        t,
        key,
        request,
        async |_ctx: &EffectContext<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Done::completed(result))
        },
        o,
    )
    .await
}

both_ledgers!(
    step6_a_replay_returns_the_stored_outcome_without_the_effect,
    step5_fifty_concurrent_duplicates_execute_once,
    step3_a_settle_whose_answer_was_lost_is_retried_and_gets_the_same_receipt,
    step3_a_lease_lost_mid_effect_cancels_the_effect_and_its_settle_is_refused,
    step3_a_zombie_workers_settle_is_refused,
    step3_nothing_sent_releases_and_the_next_run_executes,
    step3_a_remote_refusal_after_dispatch_releases_not_committed,
    step3_an_effect_that_cannot_tell_settles_unknown_and_step4_reconciles_it,
    step3_a_panicking_effect_leaves_the_outcome_unknown,
    step7_refusals_are_typed_and_never_retried,
);

async fn step6_a_replay_returns_the_stored_outcome_without_the_effect(l: &TestLedger) {
    let t = &*l.transport;
    let runs = AtomicUsize::new(0);
    let first = run_counting(
        t,
        "order-1",
        &payment(10),
        json!({"id": "pay_1"}),
        &runs,
        &options(),
    )
    .await
    .unwrap();
    assert!(!first.replayed);
    assert_eq!(first.receipt.status, Status::Completed);
    assert_eq!(first.fence, Some(first.receipt.fence));
    let again = run_counting(
        t,
        "order-1",
        &payment(10),
        json!({"id": "other"}),
        &runs,
        &options(),
    )
    .await
    .unwrap();
    assert!(again.replayed, "the second run is a replay");
    assert_eq!(again.fence, None);
    assert_eq!(again.receipt, first.receipt);
    assert_eq!(
        again.outcome, first.outcome,
        "the stored outcome, not the new effect's"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    // The fingerprint is the canonical one: member order does not matter.
    let reordered: Value = serde_json::from_str(r#"{"currency":"EUR","amount":10}"#).unwrap();
    let third = run_counting(t, "order-1", &reordered, json!(null), &runs, &options())
        .await
        .unwrap();
    assert!(third.replayed);
}

async fn step5_fifty_concurrent_duplicates_execute_once(l: &TestLedger) {
    let tap = Tap::new(l.transport.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let tap = tap.clone();
        let runs = runs.clone();
        tasks.push(tokio::spawn(async move {
            let waiting = tap.clone();
            run_once(
                &*tap,
                "order-dup",
                &payment(99),
                async move |ctx: &EffectContext<'_>| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Hold the lease until the other 49 were told in_flight.
                    while waiting.in_flight.load(Ordering::SeqCst) < 49 {
                        let seen = waiting.in_flight_seen.notified();
                        if waiting.in_flight.load(Ordering::SeqCst) >= 49 {
                            break;
                        }
                        seen.await;
                    }
                    Ok(Done::completed(
                        json!({"id": "pay_dup", "fence": ctx.fence().0}),
                    ))
                },
                &options(),
            )
            .await
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(bounded(t).await.unwrap().unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one execution");
    let executed: Vec<&RunResult> = results.iter().filter(|r| !r.replayed).collect();
    assert_eq!(executed.len(), 1, "one run executed, 49 replayed");
    for r in &results {
        assert_eq!(
            r.receipt, executed[0].receipt,
            "everyone gets the one receipt"
        );
        assert_eq!(r.outcome, executed[0].outcome);
    }
    assert!(tap.in_flight.load(Ordering::SeqCst) >= 49);
}

async fn step3_a_settle_whose_answer_was_lost_is_retried_and_gets_the_same_receipt(l: &TestLedger) {
    let tap = Tap::new(l.transport.clone());
    tap.lose_settle_answers.store(1, Ordering::SeqCst);
    let runs = AtomicUsize::new(0);
    let r = run_counting(
        &*tap,
        "order-lost-ack",
        &payment(5),
        json!({"id": "p"}),
        &runs,
        &options(),
    )
    .await
    .unwrap();
    assert_eq!(
        tap.settles.load(Ordering::SeqCst),
        2,
        "the settle was sent again"
    );
    let lost = tap.lost_answers.lock().unwrap().clone();
    let [settle_core::Reply::Receipt(first)] = lost.as_slice() else {
        panic!("the first settle was applied: {lost:?}")
    };
    assert_eq!(
        &r.receipt, first,
        "the retry got the original receipt (rule 0)"
    );
    assert_eq!(r.fence, Some(first.fence), "under the same fence");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replay = run_counting(
        &*tap,
        "order-lost-ack",
        &payment(5),
        json!(0),
        &runs,
        &options(),
    )
    .await
    .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.receipt, r.receipt);
}

async fn step3_a_lease_lost_mid_effect_cancels_the_effect_and_its_settle_is_refused(
    l: &TestLedger,
) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let o = options().lease(Duration::from_millis(600));
    let request = payment(7);
    let run = run_once(
        &*l.transport,
        "order-revoked",
        &request,
        async move |ctx: &EffectContext<'_>| {
            let _ = started_tx.send(());
            bounded(ctx.lease_lost().cancelled()).await;
            // A zombie that carries on regardless: its settle must be refused.
            Ok(Done::completed(
                json!({"cancelled": ctx.lease_lost().is_cancelled()}),
            ))
        },
        &o,
    );
    let revoke = async {
        started_rx.await.unwrap();
        l.revoke(PRINCIPAL).await;
    };
    let (r, ()) = bounded(async { tokio::join!(run, revoke) }).await;
    match r {
        Err(RunError::Refused {
            call: "settle",
            code: RefusalCode::LeaseExpired | RefusalCode::StaleFence,
        }) => {}
        other => panic!("the settle after the lease was lost must be refused: {other:?}"),
    }
}

async fn step3_a_zombie_workers_settle_is_refused(l: &TestLedger) {
    // Worker A's heartbeats are lost (a partition); its lease runs out.
    let a_side = Tap::new(l.transport.clone());
    a_side.drop_heartbeats.store(true, Ordering::SeqCst);
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<Fence>();
    let (b_done_tx, b_done_rx) = tokio::sync::oneshot::channel::<()>();
    let same = json!({"id": "pay_z"});
    let a_options = options().lease(Duration::from_millis(400));
    let request = payment(3);
    let a = run_once(
        &*a_side,
        "order-zombie",
        &request,
        async |ctx: &EffectContext<'_>| {
            bounded(ctx.lease_lost().cancelled()).await;
            let _ = lost_tx.send(ctx.fence());
            b_done_rx.await.unwrap();
            Ok(Done::completed(same.clone()))
        },
        &a_options,
    );
    // Worker B takes over: A's lease expired after A may have sent, so the
    // ledger asks B to reconcile first; the remote says nothing happened.
    let b = async {
        let a_fence = lost_rx.await.unwrap();
        let b_options =
            options().reconcile(|_key: Key, _fence: Fence| async { Ok(Finding::NotCommitted) });
        let runs = AtomicUsize::new(0);
        let r = run_counting(
            &*l.transport,
            "order-zombie",
            &payment(3),
            same.clone(),
            &runs,
            &b_options,
        )
        .await
        .unwrap();
        assert!(r.fence.unwrap() > a_fence, "B holds a newer fence");
        let _ = b_done_tx.send(());
        r
    };
    let (a, b) = bounded(async { tokio::join!(a, b) }).await;
    assert_eq!(b.receipt.status, Status::Completed);
    match a {
        Err(RunError::Refused {
            call: "settle",
            code: RefusalCode::StaleFence,
        }) => {}
        other => panic!("the zombie's settle must be refused stale_fence: {other:?}"),
    }
    // The canonical outcome is B's.
    let runs = AtomicUsize::new(0);
    let replay = run_counting(
        &*l.transport,
        "order-zombie",
        &payment(3),
        json!(1),
        &runs,
        &options(),
    )
    .await
    .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.receipt, b.receipt);
}

async fn step3_nothing_sent_releases_and_the_next_run_executes(l: &TestLedger) {
    let tap = Tap::new(l.transport.clone());
    let o = options().marks_dispatch(true);
    let r = run_once(
        &*tap,
        "order-not-sent",
        &payment(1),
        async |_ctx: &EffectContext<'_>| Err(EffectError::not_sent("the remote was down")),
        &o,
    )
    .await;
    assert!(matches!(r, Err(RunError::NotSent { .. })), "{r:?}");
    assert_eq!(*tap.releases.lock().unwrap(), ["not_dispatched"]);
    let runs = AtomicUsize::new(0);
    let next = run_once(
        &*tap,
        "order-not-sent",
        &payment(1),
        async |ctx: &EffectContext<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            ctx.dispatch().await?;
            assert!(ctx.dispatched());
            Ok(Done::completed(json!({"attempt": ctx.attempt()})))
        },
        &o,
    )
    .await
    .unwrap();
    assert!(!next.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the next run executed");
    assert_eq!(
        next.outcome.result().unwrap().to_value(),
        json!({"attempt": 2})
    );
}

async fn step3_a_remote_refusal_after_dispatch_releases_not_committed(l: &TestLedger) {
    let tap = Tap::new(l.transport.clone());
    let o = options().marks_dispatch(true);
    let r = run_once(
        &*tap,
        "order-refused",
        &payment(2),
        async |ctx: &EffectContext<'_>| {
            ctx.dispatch().await?;
            Err(EffectError::refused("the remote answered 409"))
        },
        &o,
    )
    .await;
    assert!(matches!(r, Err(RunError::EffectRefused { .. })), "{r:?}");
    assert_eq!(*tap.releases.lock().unwrap(), ["not_committed"]);
    // The status stays pending and no flag is set: the next claim executes.
    let runs = AtomicUsize::new(0);
    let next = run_counting(&*tap, "order-refused", &payment(2), json!(2), &runs, &o)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(next.receipt.status, Status::Completed);
}

async fn step3_an_effect_that_cannot_tell_settles_unknown_and_step4_reconciles_it(l: &TestLedger) {
    let t = &*l.transport;
    let key = "order-unknown";
    let r = run_once(
        t,
        key,
        &payment(4),
        async |_ctx: &EffectContext<'_>| Err(EffectError::unknown("timed out after sending")),
        &options(),
    )
    .await;
    let Err(RunError::OutcomeUnknown {
        receipt: Some(receipt),
        ..
    }) = r
    else {
        panic!("an effect that cannot tell is settled unknown: {r:?}")
    };
    assert_eq!(receipt.status, Status::Unknown);
    // Step 4 without a hook: a typed error, the lease handed back.
    let runs = AtomicUsize::new(0);
    let r = run_counting(t, key, &payment(4), json!(0), &runs, &options()).await;
    let Err(RunError::ReconcileRequired { fence, .. }) = r else {
        panic!("no hook: reconcile required: {r:?}")
    };
    assert!(fence > receipt.fence);
    // A hook that fails: the same, with its error.
    let failing = options().reconcile(|_k: Key, _f: Fence| async {
        Err::<Finding, _>("the remote's status API is down".into())
    });
    let r = run_counting(t, key, &payment(4), json!(0), &runs, &failing).await;
    assert!(matches!(r, Err(RunError::ReconcileFailed { .. })), "{r:?}");
    // A hook that finds the effect applied records it; the effect never runs.
    let found = options().reconcile(|_k: Key, _f: Fence| async {
        Ok(Finding::Committed(Done::completed(
            json!({"id": "pay_found"}),
        )))
    });
    let r = run_counting(t, key, &payment(4), json!(0), &runs, &found)
        .await
        .unwrap();
    assert!(r.reconciled && !r.replayed);
    assert_eq!(r.receipt.status, Status::Completed);
    assert_eq!(r.outcome.status(), OutcomeStatus::Completed);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the effect was never called"
    );
    let replay = run_counting(t, key, &payment(4), json!(0), &runs, &options())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(
        replay.outcome.result().unwrap().to_value(),
        json!({"id": "pay_found"})
    );
}

async fn step3_a_panicking_effect_leaves_the_outcome_unknown(l: &TestLedger) {
    let t = l.transport.clone();
    let panicked = tokio::spawn(async move {
        run_once(
            &*t,
            "order-panic",
            &payment(6),
            async |_ctx: &EffectContext<'_>| -> Result<Done, EffectError> {
                panic!("the effect blew up")
            },
            &options(),
        )
        .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic(), "the panic resumes");
    let runs = AtomicUsize::new(0);
    let r = run_counting(
        &*l.transport,
        "order-panic",
        &payment(6),
        json!(0),
        &runs,
        &options(),
    )
    .await;
    assert!(
        matches!(r, Err(RunError::ReconcileRequired { .. })),
        "a panic after the effect started is unknown: {r:?}"
    );
}

async fn step7_refusals_are_typed_and_never_retried(l: &TestLedger) {
    let tap = Tap::new(l.transport.clone());
    let runs = AtomicUsize::new(0);
    run_counting(&*tap, "order-7", &payment(70), json!(1), &runs, &options())
        .await
        .unwrap();
    let claims = tap.claims.load(Ordering::SeqCst);
    // Another request under the same key.
    let r = run_counting(&*tap, "order-7", &payment(71), json!(1), &runs, &options()).await;
    assert_eq!(
        r.as_ref().err().and_then(RunError::refusal),
        Some(RefusalCode::FingerprintMismatch),
        "{r:?}"
    );
    assert!(matches!(r, Err(RunError::Refused { call: "claim", .. })));
    // Another caller's scopes.
    let other = RunOptions::new(PRINCIPAL).scopes(["refund"]);
    let r = run_counting(&*tap, "order-7", &payment(70), json!(1), &runs, &other).await;
    assert_eq!(
        r.as_ref().err().and_then(RunError::refusal),
        Some(RefusalCode::BindingMismatch),
        "{r:?}"
    );
    assert_eq!(
        tap.claims.load(Ordering::SeqCst),
        claims + 2,
        "one claim each, no retries"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Only chosen fields: a request that differs elsewhere is the same operation.
    let fields = options().fields(["/amount", "/currency"]);
    let mut with_note = payment(70);
    with_note["note"] = json!("retry");
    let r = run_counting(&*tap, "order-7", &with_note, json!(1), &runs, &fields).await;
    assert_eq!(
        r.as_ref().err().and_then(RunError::refusal),
        Some(RefusalCode::FingerprintMismatch),
        "the field selection is its own fingerprint: {r:?}"
    );
}

#[tokio::test]
async fn step7_no_answer_backs_off_and_retries_the_same_claim_until_the_deadline() {
    let l = TestLedger::in_process();
    let tap = Tap::new(l.transport.clone());
    tap.black_hole.store(true, Ordering::SeqCst);
    let o = options().deadline(Some(Duration::from_millis(400)));
    let runs = AtomicUsize::new(0);
    let r = run_counting(&*tap, "order-void", &payment(1), json!(0), &runs, &o).await;
    match r {
        Err(RunError::DeadlineExceeded {
            what: "claim",
            last: Some(settle_worker::TransportError::NoAnswer { .. }),
        }) => {}
        other => panic!("{other:?}"),
    }
    let claims = tap.claims.load(Ordering::SeqCst);
    // The first wait is at most 50 ms, well inside the 400 ms deadline.
    assert!(claims >= 2, "the claim was sent again: {claims}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn step3_an_effect_that_fails_before_dispatch_hands_the_lease_back() {
    let l = TestLedger::in_process();
    let tap = Tap::new(l.transport.clone());
    let o = options().marks_dispatch(true);
    let r = run_once(
        &*tap,
        "order-early",
        &payment(1),
        async |_ctx: &EffectContext<'_>| {
            Err(EffectError::unknown("failed while building the request"))
        },
        &o,
    )
    .await;
    assert!(matches!(r, Err(RunError::NotSent { .. })), "{r:?}");
    assert_eq!(*tap.releases.lock().unwrap(), ["not_dispatched"]);
    assert_eq!(
        tap.settles.load(Ordering::SeqCst),
        0,
        "nothing settled unknown"
    );
    let runs = AtomicUsize::new(0);
    let next = run_counting(&*tap, "order-early", &payment(1), json!(1), &runs, &o)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the next run executes");
    assert!(!next.replayed);
}

#[tokio::test]
async fn step1_an_invalid_field_list_is_refused_before_anything_is_sent() {
    let l = TestLedger::in_process();
    let tap = Tap::new(l.transport.clone());
    let runs = AtomicUsize::new(0);
    let o = options().fields(["amount"]);
    let r = run_counting(&*tap, "order-f", &payment(1), json!(0), &runs, &o).await;
    assert!(matches!(r, Err(RunError::Fingerprint(_))), "{r:?}");
    assert_eq!(tap.claims.load(Ordering::SeqCst), 0);
}

/// The value of a counter, by name and labels (0 when never recorded).
fn counter(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        metrics_util::debugging::DebugValue,
    )],
    name: &str,
    labels: &[(&str, &str)],
) -> u64 {
    snapshot
        .iter()
        .filter(|(k, ..)| {
            k.key().name() == name
                && labels
                    .iter()
                    .all(|(l, v)| k.key().labels().any(|x| x.key() == *l && x.value() == *v))
        })
        .map(|(.., v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "current_thread")]
async fn step6_and_step7_metrics_count_replays_and_refusals() {
    // A recorder for this thread only; the current-thread runtime polls
    // every future of the test here.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let l = TestLedger::in_process();
    let t = &*l.transport;
    let runs = AtomicUsize::new(0);
    for _ in 0..3 {
        run_counting(t, "order-m", &payment(1), json!(1), &runs, &options())
            .await
            .unwrap();
    }
    let r = run_counting(t, "order-m", &payment(2), json!(1), &runs, &options()).await;
    assert!(r.is_err());
    let snapshot = snapshots.snapshot().into_vec();
    assert_eq!(counter(&snapshot, settle_worker::names::REPLAYS, &[]), 2);
    assert_eq!(
        counter(
            &snapshot,
            settle_worker::names::REFUSALS,
            &[("call", "claim"), ("code", "fingerprint_mismatch")]
        ),
        1
    );
}
