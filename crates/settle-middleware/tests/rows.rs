//! Every row of SPEC §8's table, on the payments example's router (the
//! same `app` the example binary serves) and on routers of its own where a
//! row needs a handler the example does not have; each test runs over the
//! embedded ledger and over a real `settle serve`.

mod common;

#[allow(dead_code)]
#[path = "../examples/payments.rs"]
mod payments;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{Answer, Ledgers, Mode, lkey, post as req, send};
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use settle_core::LeaseMs;
use settle_middleware::{IdempotencyLayer, Identity, Resolution, Retryable, principal};
use tokio::sync::Notify;
use tower::ServiceExt as _;

const PAY: &str = r#"{"amount": 10, "currency": "EUR"}"#;

/// Runs a test body once per ledger mode.
macro_rules! both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                ($body)(Ledgers::start(Mode::Embedded).await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn remote() {
                ($body)(Ledgers::start(Mode::Remote).await).await
            }
        }
    };
}

async fn count(router: &Router) -> u64 {
    let a = send(
        router,
        Request::get("/executions").body(Body::empty()).unwrap(),
    )
    .await;
    a.json()["count"].as_u64().unwrap()
}

/// Waits until the handler has started `n` times (the example counts
/// first, before anything else).
async fn started(router: &Router, n: u64) {
    while count(router).await < n {
        tokio::task::yield_now().await;
    }
}

both!(
    row_first_request_runs_the_handler_once,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let a = send(&app, req("/payments", Some("k1"), PAY)).await;
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.header("location"), Some("/payments/pay_1"));
        assert_eq!(
            a.json(),
            serde_json::json!({"id": "pay_1", "amount": 10, "currency": "EUR"})
        );
        assert!(!a.replayed());
        assert_eq!(count(&app).await, 1);
        assert_eq!(l.record(&lkey("k1")).await, ("completed".into(), false));
    }
);

both!(
    row_same_request_after_completion_is_replayed_byte_for_byte,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let first = send(&app, req("/payments", Some("k1"), PAY)).await;
        for _ in 0..2 {
            let again = send(&app, req("/payments", Some("k1"), PAY)).await;
            assert_eq!(again.status, first.status);
            assert_eq!(again.body, first.body, "the same body bytes");
            for h in ["content-type", "location"] {
                assert_eq!(again.header(h), first.header(h), "{h}");
            }
            assert_eq!(
                again.header("content-length"),
                Some(first.body.len().to_string().as_str())
            );
            assert!(again.replayed());
        }
        assert_eq!(count(&app).await, 1);
    }
);

both!(
    row_50_concurrent_duplicates_execute_once,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let body = r#"{"amount": 7, "currency": "EUR", "delay_ms": 300}"#;
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { send(&app, req("/payments", Some("dup"), body)).await })
            })
            .collect();
        let mut answers: Vec<Answer> = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert_eq!(count(&app).await, 1, "exactly one execution");
        let created: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .collect();
        assert!(!created.is_empty());
        assert_eq!(
            created.iter().filter(|a| !a.replayed()).count(),
            1,
            "one original answer"
        );
        for a in &answers {
            match a.status {
                StatusCode::CREATED => assert_eq!(a.body, created[0].body),
                StatusCode::CONFLICT => {
                    assert_eq!(a.code(), "request_in_progress");
                    let ra: u64 = a.header("retry-after").unwrap().parse().unwrap();
                    assert!(ra >= 1);
                }
                s => panic!("unexpected {s}: {:?}", a.body),
            }
        }
        // After the dust settles, every duplicate gets the replay.
        let last = send(&app, req("/payments", Some("dup"), body)).await;
        assert!(last.replayed());
        assert_eq!(last.body, created[0].body);
    }
);

both!(
    row_same_key_different_request_is_422,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let first = send(&app, req("/payments", Some("k1"), PAY)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        for other in [
            req(
                "/payments",
                Some("k1"),
                r#"{"amount": 11, "currency": "EUR"}"#,
            ),
            req("/payments?x=1", Some("k1"), PAY),
            Request::patch("/payments")
                .header("content-type", "application/json")
                .header("idempotency-key", "k1")
                .body(Body::from(PAY))
                .unwrap(),
        ] {
            let a = send(&app, other).await;
            assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(a.code(), "idempotency_key_reused");
            assert!(!a.replayed());
        }
        assert_eq!(count(&app).await, 1);
        // The original is untouched.
        let again = send(&app, req("/payments", Some("k1"), PAY)).await;
        assert_eq!(again.body, first.body);
    }
);

both!(row_key_missing_or_invalid_is_400, |l: Ledgers| async move {
    let (app, _) = payments::app(l.layer());
    let a = send(&app, req("/payments", None, PAY)).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (StatusCode::BAD_REQUEST, "idempotency_key_missing")
    );
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let twice = Request::post("/payments")
        .header("idempotency-key", "a")
        .header("idempotency-key", "a")
        .body(Body::from(PAY))
        .unwrap();
    for r in [
        twice,
        req("/payments", Some("\"unterminated"), PAY),
        req("/payments", Some("a b"), PAY),
    ] {
        let a = send(&app, r).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::BAD_REQUEST, "idempotency_key_invalid")
        );
    }
    assert_eq!(count(&app).await, 0, "the handler never ran");
});

/// A handler that says when it started and answers 201 only when the test
/// opens its gate.
struct Gated {
    app: Router,
    started: Arc<Notify>,
    gate: Arc<Notify>,
    runs: Arc<AtomicU64>,
}

fn gated(layer: IdempotencyLayer) -> Gated {
    let (started, gate, runs) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let (s, g, r) = (started.clone(), gate.clone(), runs.clone());
    let app = Router::new()
        .route(
            "/op",
            post(move || {
                let (s, g, r) = (s.clone(), g.clone(), r.clone());
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    s.notify_one();
                    g.notified().await;
                    (StatusCode::CREATED, "done")
                }
            }),
        )
        .layer(layer);
    Gated {
        app,
        started,
        gate,
        runs,
    }
}

both!(
    row_while_running_is_409_request_in_progress,
    |l: Ledgers| async move {
        let g = gated(l.layer());
        let first = tokio::spawn({
            let app = g.app.clone();
            async move { send(&app, req("/op", Some("slow"), "{}")).await }
        });
        g.started.notified().await;
        let a = send(&g.app, req("/op", Some("slow"), "{}")).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::CONFLICT, "request_in_progress")
        );
        // Retry-After is the running lease's time left (30 s, heartbeated),
        // not the ledger's 1 s polling hint (SPEC §8 amended, §7).
        let ra: u64 = a.header("retry-after").unwrap().parse().unwrap();
        assert!((20..=31).contains(&ra), "Retry-After {ra}");
        g.gate.notify_one();
        assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
        assert_eq!(g.runs.load(Ordering::SeqCst), 1);
    }
);

both!(
    row_handler_panic_is_unknown_then_409,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let neg = r#"{"amount": -1, "currency": "EUR"}"#;
        let a = send(&app, req("/payments", Some("neg"), neg)).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "outcome_unknown")
        );
        assert_eq!(l.record(&lkey("neg")).await, ("unknown".into(), true));
        for _ in 0..2 {
            let again = send(&app, req("/payments", Some("neg"), neg)).await;
            assert_eq!(
                (again.status, again.code().as_str()),
                (StatusCode::CONFLICT, "outcome_unknown")
            );
        }
        assert_eq!(count(&app).await, 1, "never a silent second run");
    }
);

both!(row_handler_timeout_is_unknown, |l: Ledgers| async move {
    let (app, _) = payments::app(l.layer().timeout(Duration::from_millis(100)));
    let slow = r#"{"amount": 1, "currency": "EUR", "delay_ms": 10000}"#;
    let a = send(&app, req("/payments", Some("t"), slow)).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "outcome_unknown")
    );
    assert_eq!(l.record(&lkey("t")).await, ("unknown".into(), true));
    let again = send(&app, req("/payments", Some("t"), slow)).await;
    assert_eq!(again.code(), "outcome_unknown");
    assert_eq!(count(&app).await, 1);
});

both!(
    row_client_disconnect_after_the_handler_started_is_unknown,
    |l: Ledgers| async move {
        // An hour's lease: the record can only become unknown through the
        // middleware noticing the cancellation, not through lease expiry.
        let (app, _) = payments::app(l.layer().lease(LeaseMs::new(3_600_000).unwrap()));
        let slow = r#"{"amount": 1, "currency": "EUR", "delay_ms": 10000}"#;
        let request = tokio::spawn({
            let app = app.clone();
            async move { send(&app, req("/payments", Some("gone"), slow)).await }
        });
        started(&app, 1).await;
        // What hyper does when the connection closes: drop the request's future.
        request.abort();
        assert!(request.await.unwrap_err().is_cancelled());
        // The outcome is recorded by a task of its own; wait for it.
        let recorded = async {
            while l.record(&lkey("gone")).await.0 != "unknown" {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), recorded)
            .await
            .expect("the cancelled request was recorded unknown");
        assert!(l.record(&lkey("gone")).await.1, "reconcile required");
        let again = send(&app, req("/payments", Some("gone"), slow)).await;
        assert_eq!(
            (again.status, again.code().as_str()),
            (StatusCode::CONFLICT, "outcome_unknown")
        );
        assert_eq!(count(&app).await, 1);
    }
);

both!(
    row_handler_400_is_stored_and_replayed,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let zero = r#"{"amount": 0, "currency": "EUR"}"#;
        let a = send(&app, req("/payments", Some("z"), zero)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert_eq!(a.json()["error"], "amount must not be zero");
        let again = send(&app, req("/payments", Some("z"), zero)).await;
        assert_eq!((again.status, &again.body), (a.status, &a.body));
        assert!(again.replayed());
        assert_eq!(count(&app).await, 1);
    }
);

both!(
    row_ledger_unreachable_fails_closed,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.unreachable().await);
        let a = send(&app, req("/payments", Some("k"), PAY)).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "idempotency_unavailable")
        );
        assert_eq!(a.header("retry-after"), Some("1"));
        assert_eq!(count(&app).await, 0, "the handler did not run");
        // The explicit fail-open option runs it, unwrapped.
        let (open, _) = payments::app(l.unreachable().await.fail_open(true));
        let a = send(&open, req("/payments", Some("k"), PAY)).await;
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(count(&open).await, 1);
    }
);

both!(
    row_response_too_large_to_store_is_not_replayed,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer().max_stored_body(10));
        let a = send(&app, req("/payments", Some("big"), PAY)).await;
        assert_eq!(
            a.status,
            StatusCode::CREATED,
            "the first answer goes out whole"
        );
        assert!(a.body.len() > 10);
        let again = send(&app, req("/payments", Some("big"), PAY)).await;
        assert_eq!(
            (again.status, again.code().as_str()),
            (StatusCode::CONFLICT, "response_not_stored")
        );
        assert_eq!(count(&app).await, 1, "never run twice");
    }
);

/// A handler whose answers a test scripts: the n-th run answers `script[n]`.
fn scripted(layer: IdempotencyLayer, script: Vec<(u16, bool)>) -> (Router, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let script = Arc::new(script);
    let app = Router::new()
        .route(
            "/op",
            post(move || {
                let (r, script) = (r.clone(), script.clone());
                async move {
                    let n = r.fetch_add(1, Ordering::SeqCst) as usize;
                    let (status, retryable) = script[n.min(script.len() - 1)];
                    let mut resp: Response =
                        (StatusCode::from_u16(status).unwrap(), format!("run {n}")).into_response();
                    if retryable {
                        resp.extensions_mut().insert(Retryable);
                    }
                    resp
                }
            }),
        )
        .layer(layer);
    (app, runs)
}

both!(
    row_responses_that_say_nothing_happened_are_not_stored,
    |l: Ledgers| async move {
        for first in [
            (408, false),
            (409, false),
            (425, false),
            (429, false),
            (200, true),
        ] {
            let key = format!("nc-{}-{}", first.0, first.1);
            let (app, runs) = scripted(l.layer(), vec![first, (201, false)]);
            let a = send(&app, req("/op", Some(&key), "{}")).await;
            assert_eq!(a.status.as_u16(), first.0);
            assert!(!a.replayed());
            let (status, flagged) = l.record(&lkey(&key)).await;
            assert!(!flagged, "released not_committed: no reconcile needed");
            assert!(status == "pending" || status == "running", "{status}");
            let b = send(&app, req("/op", Some(&key), "{}")).await;
            assert_eq!(b.status, StatusCode::CREATED, "the retry runs the handler");
            assert_eq!(&b.body[..], b"run 1");
            let c = send(&app, req("/op", Some(&key), "{}")).await;
            assert!(c.replayed());
            assert_eq!(runs.load(Ordering::SeqCst), 2);
        }
    }
);

both!(
    row_returned_5xx_is_stored_failed_and_replayed,
    |l: Ledgers| async move {
        let (app, runs) = scripted(l.layer(), vec![(503, false), (201, false)]);
        let a = send(&app, req("/op", Some("f"), "{}")).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(l.record(&lkey("f")).await, ("failed".into(), false));
        let b = send(&app, req("/op", Some("f"), "{}")).await;
        assert_eq!((b.status, &b.body), (a.status, &a.body));
        assert!(b.replayed());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
);

both!(
    lease_is_heartbeated_while_the_handler_runs,
    |l: Ledgers| async move {
        // A 300 ms lease and a handler held for 1 s: without heartbeats the
        // lease lapses (a duplicate would be told `reconcile`, the settle
        // refused, the record unknown).
        let g = gated(l.layer().lease(LeaseMs::new(300).unwrap()));
        let first = tokio::spawn({
            let app = g.app.clone();
            async move { send(&app, req("/op", Some("hb"), "{}")).await }
        });
        g.started.notified().await;
        // Time passing beyond the lease is what is tested here.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let a = send(&g.app, req("/op", Some("hb"), "{}")).await;
        assert_eq!(a.code(), "request_in_progress", "the lease is still held");
        g.gate.notify_one();
        let first = first.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!(l.record(&lkey("hb")).await, ("completed".into(), false));
        let again = send(&g.app, req("/op", Some("hb"), "{}")).await;
        assert!(again.replayed());
        assert_eq!(g.runs.load(Ordering::SeqCst), 1);
    }
);

both!(
    reconcile_hook_not_committed_runs_the_handler_again,
    |l: Ledgers| async move {
        let asked = Arc::new(Notify::new());
        let hook_asked = asked.clone();
        let layer = l.layer().reconcile(move |_| {
            hook_asked.notify_one();
            async { Ok::<_, settle_middleware::BoxError>(Resolution::NotCommitted) }
        });
        let (app, _) = payments::app(layer);
        let neg = r#"{"amount": -1, "currency": "EUR"}"#;
        let a = send(&app, req("/payments", Some("r"), neg)).await;
        assert_eq!(a.code(), "outcome_unknown");
        // The retry is reconciled (the hook says nothing happened) and runs again.
        let b = send(&app, req("/payments", Some("r"), neg)).await;
        asked.notified().await;
        assert_eq!(
            (b.status, b.code().as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "outcome_unknown")
        );
        assert_eq!(count(&app).await, 2);
    }
);

// SPEC §8 `wait`: a duplicate that arrives while the first runs waits for
// its outcome and answers as the replay, instead of 409.
both!(
    wait_answers_a_duplicate_with_the_replay,
    |l: Ledgers| async move {
        let tap = Arc::new(InFlightTap {
            inner: l.transport(),
            seen: Notify::new(),
        });
        let layer =
            IdempotencyLayer::with_transport(tap.clone(), principal::fixed(common::PRINCIPAL))
                .namespace("payments-example")
                .wait(Duration::from_secs(20));
        let g = gated(layer);
        let first = tokio::spawn({
            let app = g.app.clone();
            async move { send(&app, req("/op", Some("w"), "{}")).await }
        });
        g.started.notified().await;
        let dup = tokio::spawn({
            let app = g.app.clone();
            async move { send(&app, req("/op", Some("w"), "{}")).await }
        });
        // The duplicate was told in_flight (and waits) before the first ends.
        tap.seen.notified().await;
        assert!(
            !dup.is_finished(),
            "the duplicate waits instead of answering 409"
        );
        g.gate.notify_one();
        let first = first.await.unwrap();
        let dup = dup.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!((dup.status, &dup.body), (first.status, &first.body));
        assert!(dup.replayed());
        assert_eq!(g.runs.load(Ordering::SeqCst), 1);
    }
);

/// A transport that says when a claim was answered `in_flight`.
struct InFlightTap {
    inner: Arc<dyn settle_middleware::Transport>,
    seen: Notify,
}

impl settle_middleware::Transport for InFlightTap {
    fn execute(
        &self,
        cmd: settle_core::Command,
    ) -> settle_middleware::BoxFuture<'_, Result<settle_core::Reply, settle_worker::TransportError>>
    {
        Box::pin(async move {
            let r = self.inner.execute(cmd).await;
            if let Ok(settle_core::Reply::Claim(settle_core::ClaimDecision::InFlight { .. })) = &r {
                self.seen.notify_one();
            }
            r
        })
    }
}

/// The example's fake payment provider: what it charged, by key. A hook
/// asks it whether the attempt whose handler was killed made a payment.
fn provider_hook(
    charged: Arc<std::sync::Mutex<Vec<String>>>,
) -> impl Fn(
    settle_middleware::ReconcileRequest,
) -> settle_middleware::BoxFuture<'static, Result<Resolution, settle_middleware::BoxError>>
+ Send
+ Sync
+ 'static {
    move |req: settle_middleware::ReconcileRequest| {
        let found = charged.lock().unwrap().contains(&req.ledger_key);
        Box::pin(async move {
            Ok(if found {
                Resolution::Committed(settle_middleware::HookResponse {
                    status: 201,
                    headers: vec![
                        ("content-type".into(), b"application/json".to_vec()),
                        ("location".into(), b"/payments/pay_found".to_vec()),
                    ],
                    body: Bytes::from_static(br#"{"id":"pay_found"}"#),
                })
            } else {
                Resolution::Unavailable
            })
        })
    }
}

// SPEC §8 amended, the reconcile hook's `committed`: the response the
// earlier attempt made is settled and replayed; the handler does not run.
both!(
    the_reconcile_hook_committed_settles_and_replays_its_response,
    |l: Ledgers| async move {
        let charged = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (app, _) = payments::app(l.layer());
        // The handler dies (panics) after the provider charged: unknown.
        let neg = r#"{"amount": -1, "currency": "EUR"}"#;
        let a = send(&app, req("/payments", Some("killed"), neg)).await;
        assert_eq!(a.code(), "outcome_unknown");
        assert_eq!(l.record(&lkey("killed")).await, ("unknown".into(), true));
        charged.lock().unwrap().push(lkey("killed"));
        let (app2, _) = payments::app(l.layer().reconcile(provider_hook(charged.clone())));
        let b = send(&app2, req("/payments", Some("killed"), neg)).await;
        assert_eq!(b.status, StatusCode::CREATED, "{:?}", b.body);
        assert!(b.replayed());
        assert_eq!(b.header("location"), Some("/payments/pay_found"));
        assert_eq!(&b.body[..], br#"{"id":"pay_found"}"#);
        assert_eq!(count(&app2).await, 0, "the handler did not run again");
        assert_eq!(l.record(&lkey("killed")).await, ("completed".into(), false));
        // Settled: later retries replay it from the ledger.
        let c = send(&app, req("/payments", Some("killed"), neg)).await;
        assert_eq!((c.status, &c.body), (b.status, &b.body));
        // A key the provider does not know stays unknown (409).
        let d = send(&app, req("/payments", Some("lost"), neg)).await;
        assert_eq!(d.code(), "outcome_unknown");
        let e = send(&app2, req("/payments", Some("lost"), neg)).await;
        assert_eq!(
            (e.status, e.code().as_str()),
            (StatusCode::CONFLICT, "outcome_unknown")
        );
    }
);

// The example's reconcile hook asks its payment provider: a
// handler killed after charging is resolved on retry (the payment,
// replayed; the handler not run again); one killed before charging runs
// again (the provider has no such payment: nothing happened).
both!(
    the_examples_hook_resolves_a_handler_killed_after_charging,
    |l: Ledgers| async move {
        let state = Arc::new(payments::Payments::default());
        let layer = l.layer().reconcile(state.clone().reconcile_hook());
        let (app, _) = payments::app_with(state.clone(), layer);
        let crash = r#"{"amount": 5, "currency": "EUR", "crash_after_charge": true}"#;
        let a = send(&app, req("/payments", Some("crash"), crash)).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "outcome_unknown")
        );
        assert_eq!(l.record(&lkey("crash")).await, ("unknown".into(), true));
        let b = send(&app, req("/payments", Some("crash"), crash)).await;
        assert_eq!(b.status, StatusCode::CREATED, "{:?}", b.body);
        assert!(b.replayed());
        assert_eq!(
            b.json(),
            serde_json::json!({"id": "pay_1", "amount": 5, "currency": "EUR"})
        );
        assert_eq!(b.header("location"), Some("/payments/pay_1"));
        assert_eq!(count(&app).await, 1, "charged once, run once");
        assert_eq!(l.record(&lkey("crash")).await, ("completed".into(), false));
        let neg = r#"{"amount": -1, "currency": "EUR"}"#;
        let c = send(&app, req("/payments", Some("neg"), neg)).await;
        assert_eq!(c.code(), "outcome_unknown");
        let d = send(&app, req("/payments", Some("neg"), neg)).await;
        assert_eq!(d.code(), "outcome_unknown");
        assert_eq!(
            count(&app).await,
            3,
            "no payment under neg: the handler ran again"
        );
    }
);

both!(
    routes_not_selected_are_not_wrapped,
    |l: Ledgers| async move {
        let layer = l
            .layer()
            .routes(|m, p| (m == "POST" && p == "/payments").then(Default::default));
        let (app, runs) = scripted(layer, vec![(201, false)]);
        // /op is not selected: no key needed, every request runs.
        for _ in 0..2 {
            let a = send(&app, req("/op", Some("k"), "{}")).await;
            assert_eq!(a.status, StatusCode::CREATED);
            assert!(!a.replayed());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
);

/// The account an authentication layer in front found for a token: the
/// test's stand-in for a real one (two tokens of alice's, one of bob's).
#[derive(Clone)]
struct Account(String);

fn with_accounts(app: Router) -> Router {
    app.layer(axum::middleware::map_request(
        |mut req: Request<Body>| async move {
            let account = match req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
            {
                Some("Bearer alice-token-1" | "Bearer alice-token-2") => Some("alice"),
                Some("Bearer bob-token") => Some("bob"),
                _ => None,
            };
            if let Some(a) = account {
                req.extensions_mut().insert(Account(a.into()));
            }
            req
        },
    ))
}

fn as_account(l: &Ledgers) -> IdempotencyLayer {
    l.layer()
        .principal(principal::from_extension(|a: &Account| {
            Some(Identity::new(a.0.clone()))
        }))
}

fn with_token(token: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/payments")
        .header("content-type", "application/json")
        .header("idempotency-key", "same");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Body::from(PAY)).unwrap()
}

both!(principals_never_share_keys, |l: Ledgers| async move {
    let (app, _) = payments::app(as_account(&l));
    let app = with_accounts(app);
    let alice = send(&app, with_token(Some("alice-token-1"))).await;
    let bob = send(&app, with_token(Some("bob-token"))).await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        !bob.replayed(),
        "another principal's key is another operation"
    );
    assert_ne!(alice.body, bob.body);
    assert_eq!(count(&app).await, 2);
});

// The principal is the account, not the credential: a
// retry sent after a token refresh replays (it ran again when the default
// principal was a hash of the Authorization header).
both!(
    a_retry_with_a_refreshed_token_replays,
    |l: Ledgers| async move {
        let (app, _) = payments::app(as_account(&l));
        let app = with_accounts(app);
        let first = send(&app, with_token(Some("alice-token-1"))).await;
        assert_eq!(first.status, StatusCode::CREATED);
        let refreshed = send(&app, with_token(Some("alice-token-2"))).await;
        assert!(refreshed.replayed(), "{:?}", refreshed.body);
        assert_eq!(refreshed.body, first.body);
        assert_eq!(count(&app).await, 1);
    }
);

// SPEC §8: no identity → 401 `idempotency_principal_missing`, handler not run.
both!(a_request_without_identity_is_401, |l: Ledgers| async move {
    let (app, _) = payments::app(as_account(&l));
    let app = with_accounts(app);
    for token in [None, Some("stranger")] {
        let a = send(&app, with_token(token)).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::UNAUTHORIZED, "idempotency_principal_missing")
        );
    }
    assert_eq!(count(&app).await, 0);
});

// A ledger refusal never runs the handler, fail-open or
// not: a revoked principal's retry of a completed request is 403
// `idempotency_forbidden` (it ran the handler again under fail_open), and
// an extractor that moves the principal to the new generation replays.
both!(
    a_revoked_principal_with_fail_open_never_runs_a_completed_request_again,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer().fail_open(true));
        let first = send(&app, req("/payments", Some("k"), PAY)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        l.revoke(common::PRINCIPAL).await;
        for key in ["k", "fresh"] {
            let a = send(&app, req("/payments", Some(key), PAY)).await;
            assert_eq!(
                (a.status, a.code().as_str()),
                (StatusCode::FORBIDDEN, "idempotency_forbidden"),
                "{key}"
            );
        }
        assert_eq!(count(&app).await, 1, "the handler did not run again");
        let moved = l.layer().fail_open(true).principal(principal::fixed(
            Identity::new(common::PRINCIPAL).generation(1),
        ));
        let (app2, _) = payments::app(moved);
        let again = send(&app2, req("/payments", Some("k"), PAY)).await;
        assert!(again.replayed(), "{:?}", again.body);
        assert_eq!(again.body, first.body);
        assert_eq!(count(&app2).await, 0);
    }
);

// A service that panics in `call` itself (before any
// future exists) is a failed handler: 500 `outcome_unknown`, the record
// `unknown`, retries 409 — not a panic out of the layer.
both!(
    a_synchronous_panic_in_call_is_outcome_unknown,
    |l: Ledgers| async move {
        let svc = tower::service_fn(
            |_req: Request<Body>| -> std::future::Ready<Result<Response, Infallible>> {
                panic!("the service panicked in call")
            },
        );
        let app = Router::new().route_service(
            "/op",
            tower::ServiceBuilder::new().layer(l.layer()).service(svc),
        );
        let a = send(&app, req("/op", Some("sync"), "{}")).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "outcome_unknown")
        );
        assert_eq!(l.record(&lkey("sync")).await, ("unknown".into(), true));
        let again = send(&app, req("/op", Some("sync"), "{}")).await;
        assert_eq!(
            (again.status, again.code().as_str()),
            (StatusCode::CONFLICT, "outcome_unknown")
        );
    }
);

// A response past `max_stored_body` goes to the client
// as the handler produces it (it was buffered whole): the client reads the
// first part while the handler still holds the rest back; the record is
// settled as not stored, and a retry is 409 `response_not_stored`.
both!(
    a_response_past_the_stored_limit_is_streamed,
    |l: Ledgers| async move {
        let gate = Arc::new(Notify::new());
        let g = gate.clone();
        let app = Router::new()
            .route(
                "/big",
                post(move || {
                    let g = g.clone();
                    async move {
                        let first = futures::stream::iter([
                            Ok::<_, Infallible>(Bytes::from(vec![b'a'; 4096])),
                            Ok(Bytes::from(vec![b'b'; 4096])),
                        ]);
                        let rest = futures::stream::once(async move {
                            g.notified().await;
                            Ok::<_, Infallible>(Bytes::from(vec![b'c'; 4096]))
                        });
                        (StatusCode::CREATED, Body::from_stream(first.chain(rest)))
                    }
                }),
            )
            .layer(l.layer().max_stored_body(1024));
        let resp = app
            .clone()
            .oneshot(req("/big", Some("big"), "{}"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let mut body = resp.into_body();
        // The first part arrives while the handler holds the rest back (a
        // layer that buffers whole never answers: the guard fails it).
        let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the first part is streamed before the handler finishes")
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(&first[..], &[b'a'; 4096][..]);
        gate.notify_one();
        let rest = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        assert_eq!(&rest[..4096], &[b'b'; 4096][..]);
        assert_eq!(&rest[4096..], &[b'c'; 4096][..]);
        // Settled as not stored before the body ended.
        assert_eq!(l.record(&lkey("big")).await, ("completed".into(), false));
        let again = send(&app, req("/big", Some("big"), "{}")).await;
        assert_eq!(
            (again.status, again.code().as_str()),
            (StatusCode::CONFLICT, "response_not_stored")
        );
    }
);

// SPEC §8 / issue 47: a response past `max_stored_body` whose body breaks
// mid-stream is a handler failure: the record is `unknown` (as for a body
// under the limit that breaks), not `completed` with an unknown body; the
// client gets the error after what went out, and a retry is 409
// `outcome_unknown`.
both!(
    a_streamed_response_whose_body_breaks_is_unknown,
    |l: Ledgers| async move {
        let app = Router::new()
            .route(
                "/broken",
                post(|| async {
                    let parts = futures::stream::iter([
                        Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 4096])),
                        Ok(Bytes::from(vec![b'b'; 4096])),
                        Err(std::io::Error::other("the upstream went away")),
                    ]);
                    (StatusCode::CREATED, Body::from_stream(parts))
                }),
            )
            .layer(l.layer().max_stored_body(1024));
        let resp = app
            .clone()
            .oneshot(req("/broken", Some("broken"), "{}"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert!(
            axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .is_err(),
            "the body's error reaches the client"
        );
        assert_eq!(l.record(&lkey("broken")).await, ("unknown".into(), true));
        let again = send(&app, req("/broken", Some("broken"), "{}")).await;
        assert_eq!(
            (again.status, again.code().as_str()),
            (StatusCode::CONFLICT, "outcome_unknown")
        );
    }
);

// SPEC §8, §11.10: the claim's `worker` names the client's key and the
// principal; a Reconciler's middleware hook is told both (for a request
// its client never retries), and its reconcile claim copies the field, so
// it survives the 32-attempt bound.
both!(
    a_reconcile_claim_copies_the_middleware_worker_field,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let neg = r#"{"amount": -1, "currency": "EUR"}"#;
        let a = send(&app, req("/payments", Some("copy/me:1"), neg)).await;
        assert_eq!(a.code(), "outcome_unknown");
        let told = Arc::new(std::sync::Mutex::new(None));
        let t = told.clone();
        let s = l
            .reconciler()
            .middleware_hook("mw-", move |rec: settle_worker::MiddlewareRecord| {
                *t.lock().unwrap() = Some((rec.idempotency_key, rec.principal));
                async { Ok::<_, settle_middleware::BoxError>(Resolution::Unavailable) }
            })
            .sweep()
            .await;
        assert_eq!((s.seen, s.unavailable, s.errors), (1, 1, 0), "{s:?}");
        assert_eq!(
            told.lock().unwrap().clone(),
            Some(("copy/me:1".to_string(), common::PRINCIPAL.to_string()))
        );
        let workers = l.workers(&lkey("copy/me:1")).await;
        let written = Some(format!(
            "idempotency-key=copy%2Fme%3A1 principal={}",
            common::PRINCIPAL
        ));
        assert_eq!(workers, vec![written.clone(), written], "{workers:?}");
    }
);

/// A transport that loses the answer of the first dispatch it forwards.
struct LosesFirstDispatch {
    inner: Arc<dyn settle_middleware::Transport>,
    lost: std::sync::atomic::AtomicBool,
}

impl settle_middleware::Transport for LosesFirstDispatch {
    fn execute(
        &self,
        cmd: settle_core::Command,
    ) -> settle_middleware::BoxFuture<'_, Result<settle_core::Reply, settle_worker::TransportError>>
    {
        Box::pin(async move {
            let dispatch = matches!(cmd, settle_core::Command::Dispatch(_));
            let r = self.inner.execute(cmd).await;
            if dispatch && !self.lost.swap(true, Ordering::SeqCst) {
                return Err(settle_worker::TransportError::NoAnswer {
                    detail: "the answer was lost".into(),
                });
            }
            r
        })
    }
}

// A lost dispatch answer is retried under the same
// fence and the handler runs (the fallback release(not_dispatched) got
// receipt_required and left the record unknown, the handler never run).
both!(
    a_lost_dispatch_answer_is_retried_under_the_same_fence,
    |l: Ledgers| async move {
        let t = LosesFirstDispatch {
            inner: l.transport(),
            lost: Default::default(),
        };
        let layer = IdempotencyLayer::new(t, principal::fixed(common::PRINCIPAL))
            .namespace("payments-example");
        let (app, _) = payments::app(layer);
        let a = send(&app, req("/payments", Some("lost"), PAY)).await;
        assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
        assert_eq!(count(&app).await, 1);
        assert_eq!(l.record(&lkey("lost")).await, ("completed".into(), false));
    }
);

both!(
    request_body_over_the_limit_is_413,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer().max_request_body(8));
        let a = send(&app, req("/payments", Some("k"), PAY)).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        );
        assert_eq!(count(&app).await, 0);
    }
);

both!(
    canonical_json_by_default_makes_key_order_and_whitespace_irrelevant,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer());
        let first = send(
            &app,
            req("/payments", Some("c"), r#"{"amount":10,"currency":"EUR"}"#),
        )
        .await;
        let same = send(
            &app,
            req(
                "/payments",
                Some("c"),
                r#"{ "currency": "EUR", "amount": 10.0 }"#,
            ),
        )
        .await;
        assert!(same.replayed());
        assert_eq!(same.body, first.body);
        let other = send(
            &app,
            req("/payments", Some("c"), r#"{"currency":"EUR","amount":11}"#),
        )
        .await;
        assert_eq!(other.code(), "idempotency_key_reused");
        // With the option off the bytes count.
        let (raw, _) = payments::app(l.layer().canonical_json(false));
        let a = send(
            &raw,
            req("/payments", Some("c2"), r#"{"amount":10,"currency":"EUR"}"#),
        )
        .await;
        assert_eq!(a.status, StatusCode::CREATED);
        let b = send(
            &raw,
            req("/payments", Some("c2"), r#"{"currency":"EUR","amount":10}"#),
        )
        .await;
        assert_eq!(b.code(), "idempotency_key_reused");
    }
);

both!(
    exclude_leaves_a_field_out_and_fields_keep_only_theirs,
    |l: Ledgers| async move {
        let (app, _) = payments::app(l.layer().exclude(["/client_ts"]));
        let first = send(
            &app,
            req(
                "/payments",
                Some("x"),
                r#"{"amount":10,"currency":"EUR","client_ts":"14:00:00"}"#,
            ),
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
        // Reordered, and the excluded field changed: the same request.
        let same = send(
            &app,
            req(
                "/payments",
                Some("x"),
                r#"{ "client_ts": "14:00:09", "currency": "EUR", "amount": 10 }"#,
            ),
        )
        .await;
        assert!(same.replayed());
        assert_eq!(same.body, first.body);
        // A field that counts changed: another request.
        let other = send(
            &app,
            req(
                "/payments",
                Some("x"),
                r#"{"amount":11,"currency":"EUR","client_ts":"14:00:00"}"#,
            ),
        )
        .await;
        assert_eq!(other.code(), "idempotency_key_reused");
        assert_eq!(count(&app).await, 1);

        let (kept, _) = payments::app(l.layer().fields(["/amount", "/currency"]));
        let first = send(
            &kept,
            req(
                "/payments",
                Some("f"),
                r#"{"amount":10,"currency":"EUR","note":"a"}"#,
            ),
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
        let same = send(
            &kept,
            req(
                "/payments",
                Some("f"),
                r#"{"note":"b","currency":"EUR","amount":10.0}"#,
            ),
        )
        .await;
        assert!(same.replayed());
        let other = send(
            &kept,
            req(
                "/payments",
                Some("f"),
                r#"{"amount":10,"currency":"USD","note":"a"}"#,
            ),
        )
        .await;
        assert_eq!(other.code(), "idempotency_key_reused");
        assert_eq!(count(&kept).await, 1);
    }
);

both!(
    a_response_the_ledger_refuses_to_store_is_unknown_at_once,
    |l: Ledgers| async move {
        // A stored body above the ledger's max_result_bytes (64 KiB): the
        // settle is invalid, so the record becomes unknown right away (not at
        // lease expiry, an hour away here).
        let runs = Arc::new(AtomicU64::new(0));
        let r = runs.clone();
        let layer = l
            .layer()
            .max_stored_body(1 << 20)
            .lease(LeaseMs::new(3_600_000).unwrap());
        let app = Router::new()
            .route(
                "/big",
                post(move || {
                    r.fetch_add(1, Ordering::SeqCst);
                    async { "x".repeat(100_000) }
                }),
            )
            .layer(layer);
        let a = send(&app, req("/big", Some("big"), "{}")).await;
        assert_eq!(a.status, StatusCode::OK, "the response still goes out");
        assert_eq!(a.body.len(), 100_000);
        assert_eq!(l.record(&lkey("big")).await, ("unknown".into(), true));
        let b = send(&app, req("/big", Some("big"), "{}")).await;
        assert_eq!(b.code(), "outcome_unknown");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
);
