//! `sdk/fault-vectors.json` (SPEC §8, §11.10, §11.11) through the tower
//! layer: every `middleware` scenario, and every Reconciler scenario that
//! needs the middleware (a record it left `unknown`, a hook for middleware
//! records: settle-worker's runner cannot build those, since settle-worker
//! cannot depend on this crate). Each scenario has its own key and
//! principal and its own `settle-faultproxy` in front of a real `settle
//! serve` in this process; the layer (on an axum router, called in
//! process) reaches the ledger only through the proxy, over HTTP. Every
//! `expect` field is checked exactly: the record read straight from the
//! server at the ledger key the middleware computes, the calls from the
//! proxy's log. A subject, step or field this runner does not know is a
//! failure, never a skip.
//!
//! `next_request` is the same request again (or with `request_body`), with
//! no faults, through a handler that does the scenario's `write` and then
//! answers 201 (FAULT-VECTORS.md): the retry of a request whose first run
//! said nothing happened (409, a `release_on` 422,
//! `HandlerError::NotSent`) succeeds.

#![allow(clippy::print_stdout)]

#[path = "../../settle-worker/tests/fv/mod.rs"]
mod fv;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use axum::response::IntoResponse;
use fv::{Fail, HookAct, Names, Scenario, Server, ensure, only};
use serde_json::{Value, json};
use settle_core::LeaseMs;
use settle_faultproxy::Proxy;
use settle_middleware::{
    BoxError, HandlerError, HookResponse, IdempotencyLayer, ReconcileRequest, Resolution, principal,
};
use settle_worker::{MiddlewareRecord, Reconciler};
use tokio::sync::{Notify, oneshot};
use tower::ServiceExt as _;

const MIDDLEWARE_EXPECT: [&str; 13] = [
    "status",
    "code",
    "retry_after",
    "retry_after_s",
    "body_bytes_min",
    "handler_calls",
    "remote_writes",
    "calls",
    "hook_saw",
    "record",
    "next_request",
    "next_claim",
    "on_replay_calls",
];
const RECONCILER_EXPECT: [&str; 5] = ["counts", "hook_saw", "record", "next_request", "calls"];
const NEXT_FIELDS: [&str; 7] = [
    "on_replay_calls",
    "request_body",
    "body",
    "status",
    "code",
    "replayed",
    "body_bytes_min",
];
const HOOK_FIELDS: [&str; 5] = ["prefix", "finding", "sleep_ms", "middleware", "response"];
const SAW_FIELDS: [&str; 5] = ["idempotency_key", "principal", "method", "path", "body"];

/// How many scenarios run at once.
const CONCURRENCY: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_middleware_scenario_of_the_fault_vectors() {
    let v = fv::vectors();
    let scenarios = fv::scenarios(&v).unwrap_or_else(|e| panic!("{e}"));
    let mut work = Vec::new();
    for s in scenarios {
        if !fv::needs_middleware(&s) {
            // crates/settle-worker/tests/fault_vectors.rs runs it.
            continue;
        }
        match s.subject.as_str() {
            "middleware" | "reconciler" => {
                for variant in fv::variants(&s) {
                    work.push((s.clone(), variant));
                }
            }
            other => panic!(
                "{}: a middleware scenario with a subject this runner does not know: {other:?}",
                s.id
            ),
        }
    }
    assert!(!work.is_empty(), "no scenario for this runner");
    let server = Arc::new(Server::start().await);
    let run = fv::run_token();
    let shared = server.clone();
    fv::run_all("settle-middleware", work, CONCURRENCY, move |s, variant| {
        let server = shared.clone();
        let run = run.clone();
        async move { scenario(&server, &run, s, variant).await }
    })
    .await;
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop().await;
    }
}

/// What the handler does for the request in hand.
#[derive(Clone, Debug)]
enum Mode {
    /// `mw_unknown_record`: an ordinary error (a panic) escapes it.
    Fail,
    /// `mw_request_held`: it blocks until released, then answers 201.
    Hold,
    /// The scenario's `handler` steps.
    Script(Vec<HStep>),
}

#[derive(Clone, Copy, Debug)]
enum HStep {
    Write,
    Respond(u16),
    RespondLarge(u16),
    RaiseNotSent,
    RaiseOther,
}

fn handler_steps(v: &Value) -> Result<Vec<HStep>, Fail> {
    let status = |s: &str| {
        s.parse::<u16>()
            .map_err(|_| format!("a handler status this runner cannot read: {s:?}"))
    };
    v.as_array()
        .ok_or("handler is not an array")?
        .iter()
        .map(|s| {
            let s = s.as_str().ok_or("a handler step is not a string")?;
            Ok(match s.split_once(':') {
                None if s == "write" => HStep::Write,
                None if s == "raise_not_sent" => HStep::RaiseNotSent,
                None if s == "raise_other" => HStep::RaiseOther,
                Some(("respond", n)) => HStep::Respond(status(n)?),
                Some(("respond_large", n)) => HStep::RespondLarge(status(n)?),
                _ => return Err(format!("a handler step this runner does not know: {s:?}")),
            })
        })
        .collect()
}

/// The handler's state: its mode and what it did.
struct Handler {
    mode: Mutex<Mode>,
    calls: AtomicU64,
    writes: AtomicU64,
    large: usize,
    held_started: Notify,
    release_held: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Handler {
    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }
}

fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn handle(State(h): State<Arc<Handler>>) -> Response<Body> {
    let mode = h.mode.lock().unwrap().clone();
    match mode {
        Mode::Fail => panic!("the handler fails (setup mw_unknown_record)"),
        Mode::Hold => {
            let release = h.release_held.lock().unwrap().take();
            h.held_started.notify_one();
            if let Some(r) = release {
                let _ = r.await;
            }
            json_response(201, &json!({"held": true}))
        }
        Mode::Script(steps) => {
            h.calls.fetch_add(1, Ordering::SeqCst);
            for step in steps {
                match step {
                    HStep::Write => {
                        h.writes.fetch_add(1, Ordering::SeqCst);
                    }
                    HStep::Respond(n) => return json_response(n, &json!({"status": n})),
                    HStep::RespondLarge(n) => {
                        return json_response(n, &json!({"blob": "x".repeat(h.large)}));
                    }
                    HStep::RaiseNotSent => {
                        return HandlerError::not_sent("the handler did nothing").into_response();
                    }
                    HStep::RaiseOther => panic!("the handler fails (a fault-vector scenario)"),
                }
            }
            panic!("the handler's script has no last step")
        }
    }
}

/// What a hook was given, for `hook_saw`.
type Saw = Arc<Mutex<Option<Value>>>;

/// The hook's `committed` response: `{status, body}` or `{status, large}`.
fn hook_response(h: &Value, large: usize) -> Result<HookResponse, Fail> {
    let r = h
        .get("response")
        .ok_or("a committed hook without a response")?;
    only(r, &["status", "body", "large"], "response")?;
    let status = r["status"].as_u64().ok_or("response.status")? as u16;
    let body = if r.get("large") == Some(&json!(true)) {
        json!({"blob": "x".repeat(large)}).to_string()
    } else {
        r.get("body").ok_or("response.body")?.to_string()
    };
    Ok(HookResponse {
        status,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Bytes::from(body),
    })
}

/// A hook's answer as the scenario plays it (after `sleep_ms`).
async fn resolve(
    act: HookAct,
    sleep_ms: u64,
    variant: &'static str,
    response: Option<HookResponse>,
) -> Result<Resolution, BoxError> {
    tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
    match act {
        HookAct::Committed => Ok(Resolution::Committed(
            response.expect("checked: a committed hook has a response"),
        )),
        HookAct::NotCommitted => Ok(Resolution::NotCommitted),
        HookAct::Unavailable => Ok(Resolution::Unavailable),
        HookAct::Raise if variant == "panic" => {
            panic!("the reconcile hook panics (a fault-vector scenario)")
        }
        HookAct::Raise => Err("the reconcile hook failed".into()),
        HookAct::Hang => std::future::pending().await,
    }
}

struct HookSpec {
    act: HookAct,
    sleep_ms: u64,
    response: Option<HookResponse>,
}

fn read_hook(h: &Value, large: usize) -> Result<HookSpec, Fail> {
    only(h, &HOOK_FIELDS, "hook")?;
    let act = HookAct::read(&h["finding"])?;
    Ok(HookSpec {
        act,
        sleep_ms: h.get("sleep_ms").map_or(Ok(0), |v| {
            v.as_u64()
                .ok_or_else(|| "sleep_ms is not a number".to_string())
        })?,
        response: match act {
            HookAct::Committed => Some(hook_response(h, large)?),
            _ => None,
        },
    })
}

/// One scenario's service: the handler behind the layer, over the proxy.
struct App {
    router: Router,
    handler: Arc<Handler>,
    ledger_key: String,
    /// The replay hook's calls (`on_replay: true`).
    replays: Arc<AtomicU64>,
}

fn app(
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
    saw: &Saw,
) -> Result<App, Fail> {
    let o = &s.opts;
    let large = o.max_body_bytes * 4;
    let mut layer =
        IdempotencyLayer::remote(fv::through(proxy), principal::fixed(n.principal.as_str()))
            .lease(LeaseMs::new(o.lease_ms).map_err(|e| e.to_string())?)
            .ledger_deadline(o.deadline())
            .max_stored_body(o.max_body_bytes)
            .release_on(o.release_on.iter().copied());
    if o.wait_s > 0 {
        layer = layer.wait(Duration::from_secs(o.wait_s));
    }
    if let Some(ms) = o.hook_timeout_ms {
        layer = layer.hook_timeout(Duration::from_millis(ms));
    }
    if let Some(h) = s.raw.get("hook") {
        let spec = read_hook(h, large)?;
        let saw = saw.clone();
        layer = layer.reconcile(move |req: ReconcileRequest| {
            *saw.lock().unwrap() = Some(json!({
                "idempotency_key": req.idempotency_key,
                "principal": req.principal,
                "method": req.method.as_str(),
                "path": req.path(),
                "body": serde_json::from_slice::<Value>(&req.body).unwrap_or(Value::Null),
            }));
            resolve(spec.act, spec.sleep_ms, variant, spec.response.clone())
        });
    }
    let replays = Arc::new(AtomicU64::new(0));
    if s.raw.get("on_replay") == Some(&json!(true)) {
        layer = layer.on_replay(replay_hook(replays.clone()));
    }
    let ledger_key = layer.ledger_key(&n.principal, &n.key);
    let handler = Arc::new(Handler {
        mode: Mutex::new(Mode::Fail),
        calls: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        large,
        held_started: Notify::new(),
        release_held: Mutex::new(None),
    });
    let router = Router::new()
        .route(&o.mw_path, axum::routing::post(handle))
        .with_state(handler.clone())
        .layer(layer);
    Ok(App {
        router,
        handler,
        ledger_key,
        replays,
    })
}

/// `on_replay: true`: counts its calls; the stored status, a body of our own.
fn replay_hook(
    calls: Arc<AtomicU64>,
) -> impl Fn(HookResponse, &settle_core::Receipt) -> HookResponse + Send + Sync {
    move |stored, receipt| {
        assert_eq!(
            receipt.status,
            settle_core::Status::Completed,
            "{receipt:?}"
        );
        calls.fetch_add(1, Ordering::SeqCst);
        let body = json!({"replayed_by_hook": true, "status": stored.status});
        HookResponse {
            status: stored.status,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: serde_json::to_vec(&body).expect("JSON").into(),
        }
    }
}

/// `on_replay_calls`: the replay hook's calls so far (exact).
fn check_replays(want: Option<&Value>, a: &App, what: &str) -> Result<(), Fail> {
    let got = a.replays.load(Ordering::SeqCst);
    match want {
        Some(w) => ensure(json!(got) == *w, || {
            format!("{what} on_replay_calls: {got}, expected {w}")
        }),
        None => Ok(()),
    }
}

/// An answer as the client sees it.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn send(router: &Router, s: &Scenario, n: &Names, body: &Value) -> Answer {
    let o = &s.opts;
    let req = Request::builder()
        .method(o.mw_method.as_str())
        .uri(o.mw_path.as_str())
        .header("content-type", "application/json")
        .header("idempotency-key", n.key.as_str())
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    Answer {
        status,
        headers,
        body,
    }
}

async fn scenario(
    shared: &Server,
    run: &str,
    s: Scenario,
    variant: &'static str,
) -> Result<(), Fail> {
    let fresh = if s.fresh_ledger {
        Some(Server::start().await)
    } else {
        None
    };
    let server = fresh.as_ref().unwrap_or(shared);
    let n = Names::new(run, variant, &s.id);
    let proxy = server.proxy().await;
    let outcome = match s.subject.as_str() {
        "middleware" => middleware_scenario(server, &proxy, &s, &n, variant).await,
        "reconciler" => reconciler_scenario(server, &proxy, &s, &n, variant).await,
        other => Err(format!("a subject this runner does not know: {other:?}")),
    };
    proxy.stop().await;
    if let Some(f) = fresh {
        f.stop().await;
    }
    outcome
}

/// The setup, before the faults are set. Answers the held request's task
/// and the sender that lets it finish.
async fn setup(
    a: &App,
    s: &Scenario,
    n: &Names,
) -> Result<Option<(tokio::task::JoinHandle<Answer>, oneshot::Sender<()>)>, Fail> {
    let mut held = None;
    for step in &s.setup {
        match step.as_str() {
            "mw_unknown_record" => {
                a.handler.set(Mode::Fail);
                let ans = send(&a.router, s, n, &s.opts.mw_body).await;
                ensure(ans.status == StatusCode::INTERNAL_SERVER_ERROR, || {
                    format!("setup mw_unknown_record answered {}", ans.status)
                })?;
            }
            "mw_request_held" => {
                let (tx, rx) = oneshot::channel();
                *a.handler.release_held.lock().unwrap() = Some(rx);
                a.handler.set(Mode::Hold);
                let router = a.router.clone();
                let (s2, n2) = (s.clone(), n.clone());
                let task =
                    tokio::spawn(async move { send(&router, &s2, &n2, &s2.opts.mw_body).await });
                tokio::time::timeout(Duration::from_secs(10), a.handler.held_started.notified())
                    .await
                    .map_err(|_| "the held request's handler never started".to_string())?;
                held = Some((task, tx));
            }
            other => return Err(format!("a setup step this runner does not know: {other:?}")),
        }
    }
    Ok(held)
}

fn check_answer(e: &Value, a: &Answer, what: &str) -> Result<(), Fail> {
    if let Some(w) = e.get("status") {
        ensure(json!(a.status.as_u16()) == *w, || {
            format!(
                "{what} status {} ({}), expected {w}",
                a.status,
                String::from_utf8_lossy(&a.body)
            )
        })?;
    }
    if let Some(w) = e.get("code") {
        ensure(a.json()["code"] == *w, || {
            format!("{what} code {}, expected {w}", a.json()["code"])
        })?;
    }
    let retry_after = a.headers.get("retry-after").and_then(|v| v.to_str().ok());
    if let Some(w) = e.get("retry_after") {
        ensure(json!(retry_after.is_some()) == *w, || {
            format!("{what} Retry-After {retry_after:?}, expected present: {w}")
        })?;
    }
    if let Some(w) = e.get("retry_after_s") {
        let got = retry_after.and_then(|r| r.parse::<u64>().ok());
        ensure(got.map(|g| json!(g)).as_ref() == Some(w), || {
            format!("{what} Retry-After {retry_after:?}, expected {w}")
        })?;
    }
    if let Some(w) = e.get("body_bytes_min") {
        let min = w.as_u64().ok_or("body_bytes_min")?;
        ensure(a.body.len() as u64 >= min, || {
            format!(
                "{what} body of {} bytes, expected at least {min}",
                a.body.len()
            )
        })?;
    }
    if let Some(w) = e.get("replayed") {
        let replayed = a
            .headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        ensure(json!(replayed) == *w, || {
            format!("{what} replayed {replayed}, expected {w}")
        })?;
    }
    if let Some(w) = e.get("body") {
        ensure(a.json() == *w, || {
            format!("{what} body {}, expected {w}", a.json())
        })?;
    }
    Ok(())
}

fn check_saw(e: &Value, saw: &Saw, n: &Names) -> Result<(), Fail> {
    let Some(w) = e.get("hook_saw") else {
        return Ok(());
    };
    only(w, &SAW_FIELDS, "hook_saw")?;
    let got = saw
        .lock()
        .unwrap()
        .clone()
        .ok_or("the hook was never asked")?;
    for (k, want) in w.as_object().expect("checked") {
        let want = match want {
            Value::String(s) => json!(n.sub(s)),
            other => other.clone(),
        };
        ensure(got[k] == want, || {
            format!("hook_saw.{k}: {}, expected {want}", got[k])
        })?;
    }
    Ok(())
}

/// `next_request`: the same request (or with `request_body`), no faults,
/// a handler that writes as the scenario's does and answers 201.
async fn check_next(
    a: &App,
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    e: &Value,
) -> Result<(), Fail> {
    let Some(next) = e.get("next_request") else {
        return Ok(());
    };
    only(next, &NEXT_FIELDS, "next_request")?;
    proxy.set_rules(Vec::new());
    let writes = match s.raw.get("handler") {
        Some(h) => handler_steps(h)?
            .into_iter()
            .filter(|x| matches!(x, HStep::Write))
            .collect(),
        None => Vec::new(),
    };
    a.handler
        .set(Mode::Script([writes, vec![HStep::Respond(201)]].concat()));
    let body = next.get("request_body").unwrap_or(&s.opts.mw_body);
    let mut expected = next.clone();
    let fields = expected.as_object_mut().expect("checked");
    fields.remove("request_body");
    let replays = fields.remove("on_replay_calls");
    let ans = send(&a.router, s, n, body).await;
    check_replays(replays.as_ref(), a, "next_request")?;
    check_answer(&expected, &ans, "next_request")
}

async fn middleware_scenario(
    server: &Server,
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
) -> Result<(), Fail> {
    only(&s.expect, &MIDDLEWARE_EXPECT, "expect")?;
    let e = &s.expect;
    let saw: Saw = Arc::default();
    let a = app(proxy, s, n, variant, &saw)?;
    let held = setup(&a, s, n).await?;
    let steps = handler_steps(s.raw.get("handler").ok_or("no handler")?)?;
    a.handler.set(Mode::Script(steps));
    proxy.set_rules(s.faults.clone());
    let ans = send(&a.router, s, n, &s.opts.mw_body).await;
    let log = proxy.log();
    let checked = async {
        check_answer(e, &ans, "the answer")?;
        check_replays(e.get("on_replay_calls"), &a, "the answer")?;
        for (name, counter) in [
            ("handler_calls", &a.handler.calls),
            ("remote_writes", &a.handler.writes),
        ] {
            if let Some(w) = e.get(name) {
                let got = counter.load(Ordering::SeqCst);
                ensure(json!(got) == *w, || format!("{name}: {got}, expected {w}"))?;
            }
        }
        check_saw(e, &saw, n)?;
        fv::check_calls(e, &log)?;
        if let Some(w) = e.get("record") {
            fv::check_record(&server.direct, &a.ledger_key, w, n).await?;
        }
        ensure(e.get("next_claim").is_none(), || {
            "next_claim of a middleware record: this runner does not know its request's fingerprint"
                .into()
        })?;
        check_next(&a, proxy, s, n, e).await
    }
    .await;
    if let Some((task, release)) = held {
        let _ = release.send(());
        let held = task.await.map_err(|e| format!("the held request: {e}"))?;
        ensure(held.status == StatusCode::CREATED, || {
            format!("the held request answered {}", held.status)
        })?;
    }
    checked
}

async fn reconciler_scenario(
    server: &Server,
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
) -> Result<(), Fail> {
    only(&s.expect, &RECONCILER_EXPECT, "expect")?;
    let e = &s.expect;
    let o = &s.opts;
    let saw: Saw = Arc::default();
    let a = app(proxy, s, n, variant, &saw)?;
    ensure(setup(&a, s, n).await?.is_none(), || {
        "a held request in a sweep".into()
    })?;
    let large = o.max_body_bytes * 4;
    let mut r = Reconciler::new(fv::through(proxy))
        .lease(LeaseMs::new(o.lease_ms).map_err(|e| e.to_string())?)
        .deadline(o.deadline())
        .middleware_store(o.max_body_bytes, Vec::<String>::new());
    if let Some(ms) = o.hook_timeout_ms {
        r = r.hook_timeout(Duration::from_millis(ms));
    }
    for h in s.raw["hooks"].as_array().ok_or("no hooks")? {
        ensure(h["middleware"] == json!(true), || {
            "a hook for non-middleware records: the worker runner's".into()
        })?;
        let spec = read_hook(h, large)?;
        let prefix = n.sub(h["prefix"].as_str().ok_or("a hook without a prefix")?);
        let saw = saw.clone();
        r = r.middleware_hook(prefix, move |rec: MiddlewareRecord| {
            *saw.lock().unwrap() = Some(json!({
                "idempotency_key": rec.idempotency_key,
                "principal": rec.principal,
            }));
            resolve(spec.act, spec.sleep_ms, variant, spec.response.clone())
        });
    }
    proxy.set_rules(s.faults.clone());
    let sweep = r.sweep().await;
    let log = proxy.log();
    if let Some(w) = e.get("counts") {
        let got = fv::counts(&sweep);
        ensure(got == *w, || format!("counts {got}, expected {w}"))?;
    }
    check_saw(e, &saw, n)?;
    fv::check_calls(e, &log)?;
    if let Some(w) = e.get("record") {
        fv::check_record(&server.direct, &a.ledger_key, w, n).await?;
    }
    check_next(&a, proxy, s, n, e).await
}
