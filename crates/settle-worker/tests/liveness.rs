//! Uncertainty resolves itself (SPEC §11.8–10): failure classes, resend,
//! 429 retried like 503, and the reconciler, against the in-process ledger
//! and a real settle server.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use settle_core::{Command, Fence, Key, Reply, Status};
use settle_worker::{
    BoxFuture, Done, EffectContext, EffectError, Finding, Reconcile, RunError, RunOptions,
    Transport, TransportError, run_once,
};

use common::TestLedger;

fn options() -> RunOptions {
    RunOptions::new("svc-billing").scopes(["charge"])
}

/// A remote that de-duplicates by key, as one that honours an
/// `Idempotency-Key` does: a second send of a key it applied answers the
/// first result without applying anything.
#[derive(Default)]
struct Remote {
    applied: Mutex<HashMap<String, Value>>,
    applies: AtomicUsize,
}

impl Remote {
    fn send(&self, key: &str, n: u64) -> Value {
        let mut a = self.applied.lock().unwrap();
        a.entry(key.to_string())
            .or_insert_with(|| {
                self.applies.fetch_add(1, Ordering::SeqCst);
                json!({"charge": format!("ch_{n}")})
            })
            .clone()
    }
    fn has(&self, key: &str) -> Option<Value> {
        self.applied.lock().unwrap().get(key).cloned()
    }
}

/// Leaves `key` unknown (reconcile required) the way a killed worker does:
/// the effect reached the remote after the dispatch mark, and the worker
/// could not tell.
async fn left_unknown(t: &dyn Transport, key: &str, remote: &Remote) {
    let r = run_once(
        t,
        key,
        &json!({"key": key}),
        async |ctx: &EffectContext<'_>| {
            ctx.dispatch().await?;
            remote.send(key, 1);
            Err(EffectError::unknown("the connection broke after sending"))
        },
        &options().marks_dispatch(true),
    )
    .await;
    assert!(matches!(r, Err(RunError::OutcomeUnknown { .. })), "{r:?}");
}

async fn record(l: &TestLedger, key: &str) -> (Status, bool) {
    let t = &*l.transport;
    let _ = t;
    match (&l.local, &l.client) {
        (Some(local), _) => {
            let r = local
                .ledger()
                .get(local.tenant(), &Key::new(key).unwrap())
                .await
                .unwrap();
            (r.status, r.reconcile_required)
        }
        (_, Some(c)) => {
            let v = serde_json::to_value(c.get(key).await.unwrap()).unwrap();
            let status = match v["status"].as_str().unwrap() {
                "pending" => Status::Pending,
                "unknown" => Status::Unknown,
                "completed" => Status::Completed,
                "failed" => Status::Failed,
                other => panic!("{other}"),
            };
            (status, v["reconcile_required"].as_bool().unwrap())
        }
        _ => unreachable!(),
    }
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_process() {
                let l = $crate::common::TestLedger::in_process();
                super::$name(&l).await;
                l.stop().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http() {
                let l = $crate::common::TestLedger::over_http().await;
                super::$name(&l).await;
                l.stop().await;
            }
        }
    )*};
}

both!(
    resend_resolves_through_the_remotes_own_deduplication,
    the_reconciler_resolves_what_its_hooks_can_tell_and_nothing_else,
    a_429_from_settle_is_retried_like_a_503,
    an_unrecordable_result_before_the_dispatch_mark_is_not_sent,
);

/// SPEC §11.9: with `Reconcile::Resend` the effect runs again under the
/// reconcile lease with the same key; the remote answers its first result
/// without applying it again, and that is recorded `committed`.
async fn resend_resolves_through_the_remotes_own_deduplication(l: &TestLedger) {
    let t = &*l.transport;
    let remote = Remote::default();
    left_unknown(t, "resend-1", &remote).await;
    assert_eq!(record(l, "resend-1").await, (Status::Unknown, true));
    let sends = AtomicUsize::new(0);
    let r = run_once(
        t,
        "resend-1",
        &json!({"key": "resend-1"}),
        async |ctx: &EffectContext<'_>| {
            sends.fetch_add(1, Ordering::SeqCst);
            ctx.dispatch().await?; // a local no-op under the reconcile lease
            Ok(Done::completed(remote.send("resend-1", 2)))
        },
        &options().marks_dispatch(true).reconcile(Reconcile::Resend),
    )
    .await
    .unwrap();
    assert!(r.reconciled);
    assert_eq!(r.receipt.status, Status::Completed);
    assert_eq!(
        r.outcome.result().unwrap().to_value(),
        json!({"charge": "ch_1"})
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1, "sent again once");
    assert_eq!(
        remote.applies.load(Ordering::SeqCst),
        1,
        "applied once: the remote de-duplicated"
    );
    assert_eq!(record(l, "resend-1").await, (Status::Completed, false));
    // A resend that fails reports unavailable: the record stays unknown.
    left_unknown(t, "resend-2", &remote).await;
    let r = run_once(
        t,
        "resend-2",
        &json!({"key": "resend-2"}),
        async |_ctx: &EffectContext<'_>| Err(EffectError::not_sent("the remote is down")),
        &options().marks_dispatch(true).reconcile(Reconcile::Resend),
    )
    .await;
    assert!(matches!(r, Err(RunError::ReconcileFailed { .. })), "{r:?}");
    assert_eq!(record(l, "resend-2").await, (Status::Unknown, true));
}

/// SPEC §11.10: records left unknown by killed workers are resolved by the
/// hooks that can tell (applied → committed with the remote's result; not
/// applied → the next claim executes), and the ones whose hook cannot tell
/// stay unknown: nothing is guessed.
async fn the_reconciler_resolves_what_its_hooks_can_tell_and_nothing_else(l: &TestLedger) {
    let t = &*l.transport;
    let remote = Arc::new(Remote::default());
    for i in 0..4 {
        left_unknown(t, &format!("pay-{i}"), &remote).await;
    }
    // pay-1 and pay-3 never reached the remote after all (the provider
    // has no such payment).
    remote
        .applied
        .lock()
        .unwrap()
        .retain(|k, _| k != "pay-1" && k != "pay-3");
    for i in 0..3 {
        left_unknown(t, &format!("mail-{i}"), &remote).await;
    }
    let provider = remote.clone();
    let r = l
        .reconciler()
        .hook("pay-", move |key: Key, _fence: Fence| {
            let found = provider.has(key.as_str());
            async move {
                Ok::<_, settle_worker::BoxError>(match found {
                    Some(result) => Finding::Committed(Done::completed(result)),
                    None => Finding::NotCommitted,
                })
            }
        })
        .hook("mail-", |_key: Key, _fence: Fence| async {
            Ok::<_, settle_worker::BoxError>(Finding::Unavailable)
        });
    let s = r.sweep().await;
    assert_eq!(
        (
            s.seen,
            s.committed,
            s.not_committed,
            s.unavailable,
            s.skipped,
            s.errors
        ),
        (7, 2, 2, 3, 0, 0),
        "{s:?}"
    );
    assert_eq!(record(l, "pay-0").await, (Status::Completed, false));
    assert_eq!(record(l, "pay-2").await, (Status::Completed, false));
    for k in ["mail-0", "mail-1", "mail-2"] {
        assert_eq!(record(l, k).await, (Status::Unknown, true), "{k}");
    }
    // Not committed: the next run executes (the effect runs once more).
    let runs = AtomicUsize::new(0);
    let again = run_once(
        t,
        "pay-1",
        &json!({"key": "pay-1"}),
        async |_ctx: &EffectContext<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Done::completed(json!({"charge": "ch_again"})))
        },
        &options().marks_dispatch(true),
    )
    .await
    .unwrap();
    assert!(!again.replayed && !again.reconciled);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The next sweep sees only what is still unknown: the mail records
    // (pay-3 was released not_committed and waits for its next run).
    let s = r.sweep().await;
    assert_eq!((s.seen, s.unavailable), (3, 3), "{s:?}");
}

/// A transport whose first claim answers 429 (a tenant's quota) with a hint.
struct LimitedOnce {
    inner: Arc<dyn Transport>,
    limited: AtomicUsize,
    claims: AtomicUsize,
}

impl Transport for LimitedOnce {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        Box::pin(async move {
            if matches!(cmd, Command::Claim(_)) {
                self.claims.fetch_add(1, Ordering::SeqCst);
                if self.limited.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(TransportError::Limited {
                        retry_after: Some(std::time::Duration::from_millis(50)),
                        detail: "429 rate_limited".into(),
                    });
                }
            }
            self.inner.execute(cmd).await
        })
    }
}

/// SPEC §11.8: 429 from settle is retried like 503, honouring its hint.
async fn a_429_from_settle_is_retried_like_a_503(l: &TestLedger) {
    let t = LimitedOnce {
        inner: l.transport.clone(),
        limited: AtomicUsize::new(0),
        claims: AtomicUsize::new(0),
    };
    let r = run_once(
        &t,
        "limited-1",
        &json!({}),
        async |_ctx: &EffectContext<'_>| Ok(Done::completed(json!(1))),
        &options(),
    )
    .await
    .unwrap();
    assert_eq!(r.receipt.status, Status::Completed);
    assert_eq!(
        t.claims.load(Ordering::SeqCst),
        2,
        "the limited claim was sent again"
    );
}

/// SPEC §11.8: under `marks_dispatch`, a result that cannot be recorded
/// (here nested deeper than a stored result may be) before the dispatch
/// mark counts as not sent: the lease is released and the next run
/// executes — never `unknown`, never re-run blindly after the mark.
async fn an_unrecordable_result_before_the_dispatch_mark_is_not_sent(l: &TestLedger) {
    let t = &*l.transport;
    let mut deep = json!(0);
    for _ in 0..100 {
        deep = json!([deep]);
    }
    let runs = AtomicUsize::new(0);
    let r = run_once(
        t,
        "deep-1",
        &json!({}),
        async |_ctx: &EffectContext<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Done::completed(deep.clone()))
        },
        &options().marks_dispatch(true),
    )
    .await;
    assert!(matches!(r, Err(RunError::Invalid { .. })), "{r:?}");
    assert_eq!(
        record(l, "deep-1").await,
        (Status::Pending, false),
        "released, not unknown"
    );
    let r = run_once(
        t,
        "deep-1",
        &json!({}),
        async |_ctx: &EffectContext<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Done::completed(json!("ok")))
        },
        &options().marks_dispatch(true),
    )
    .await
    .unwrap();
    assert_eq!(r.receipt.status, Status::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the next run executed");
}
