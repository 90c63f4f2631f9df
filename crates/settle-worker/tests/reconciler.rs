//! The Reconciler in the background (SPEC §11.10): one panicking hook does
//! not end the loop (issue 47, defect 4), against the in-process ledger
//! and a real settle server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use settle_core::{Fence, Key};
use settle_worker::{
    BoxError, Done, EffectContext, EffectError, Finding, RunError, RunOptions, Transport, run_once,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use common::TestLedger;

/// Leaves `key` unknown (reconcile required), as a worker whose effect
/// failed after it may have sent.
async fn left_unknown(t: &dyn Transport, key: &str) {
    let r = run_once(
        t,
        key,
        &json!({"key": key}),
        async |_ctx: &EffectContext<'_>| Err::<Done, _>(EffectError::unknown("cannot tell")),
        &RunOptions::new("svc-billing"),
    )
    .await;
    assert!(matches!(r, Err(RunError::OutcomeUnknown { .. })), "{r:?}");
}

fn boom() -> Result<Finding, BoxError> {
    panic!("a hook that panics")
}

/// A hook that panics on every record of one prefix leaves the loop
/// running: a record of another prefix that becomes unknown after the
/// panic is resolved by a later sweep of the same loop.
async fn a_panicking_hook_does_not_end_the_background_loop(l: &TestLedger) {
    let t = &*l.transport;
    left_unknown(t, "boom-1").await;
    let panicked = Arc::new(Notify::new());
    let resolved = Arc::new(Notify::new());
    let (p, r) = (panicked.clone(), resolved.clone());
    let rec = Arc::new(
        l.reconciler()
            .hook("boom-", move |_k: Key, _f: Fence| {
                p.notify_one();
                async { boom() }
            })
            .hook("fine-", move |_k: Key, _f: Fence| {
                r.notify_one();
                async { Ok::<_, BoxError>(Finding::Committed(Done::completed(json!({"ok": 1})))) }
            }),
    );
    let stop = CancellationToken::new();
    let looping = {
        let (rec, stop) = (rec.clone(), stop.clone());
        tokio::spawn(async move { rec.run(Duration::from_millis(10), stop).await })
    };
    tokio::time::timeout(Duration::from_secs(10), panicked.notified())
        .await
        .expect("the panicking hook was asked");
    left_unknown(t, "fine-1").await;
    tokio::time::timeout(Duration::from_secs(10), resolved.notified())
        .await
        .expect("a later sweep of the same loop asked the other hook");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), looping)
        .await
        .expect("the loop ends when stopped")
        .expect("the loop did not panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_hook_does_not_end_the_background_loop_in_process() {
    let l = TestLedger::in_process();
    a_panicking_hook_does_not_end_the_background_loop(&l).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_hook_does_not_end_the_background_loop_over_http() {
    let l = TestLedger::over_http().await;
    a_panicking_hook_does_not_end_the_background_loop(&l).await;
    l.stop().await;
}
