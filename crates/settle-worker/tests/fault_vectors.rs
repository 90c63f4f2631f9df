//! `sdk/fault-vectors.json` (SPEC §11.11, §11.10) through the Rust worker
//! SDK: every `run_once`, `reconciler` and `reconciler_lifecycle`
//! scenario, each with its own key and principal, through a
//! `settle-faultproxy` of its own in front of a real `settle serve` in
//! this process (its rules set after the setup); every `expect` field is
//! checked exactly, the record read straight from the server, the calls
//! from the proxy's log.
//!
//! The scenarios that need the middleware (its setup, or a Reconciler
//! hook for middleware records) run in
//! `crates/settle-middleware/tests/fault_vectors.rs`: this crate cannot
//! depend on settle-middleware. A subject, step, finding or `expect`
//! field this runner does not know is a failure, never a skip.
//!
//! Result kinds (the vectors' `result`) → `RunError`: see
//! [`kind`] and the table on `settle_worker::RunError`.

#![allow(clippy::print_stdout)]

mod fv;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fv::{Fail, HookAct, Names, Scenario, Server, ensure, only};
use serde_json::{Value, json};
use settle_core::{Fence, Key, LeaseMs};
use settle_faultproxy::Proxy;
use settle_worker::{
    BoxError, Done, EffectContext, EffectError, Finding, Reconcile, ReconcileHook, Reconciler,
    ReconcilerError, RunError, RunOptions, RunResult, run_once,
};
use tokio::sync::Notify;

const RUN_ONCE_EXPECT: [&str; 10] = [
    "result",
    "cause",
    "effect_calls",
    "remote_writes",
    "calls",
    "record",
    "next_claim",
    "replayed",
    "value",
    "on_replay_calls",
];
const RECONCILER_EXPECT: [&str; 6] = [
    "counts",
    "list_key_prefix",
    "record",
    "records",
    "calls",
    "next_claim",
];
const LIFECYCLE_EXPECT: [&str; 3] = ["second_start", "stop_timeout_ms", "stop_returns"];
const HOOK_FIELDS: [&str; 5] = ["prefix", "finding", "sleep_ms", "middleware", "response"];

/// How many scenarios run at once (the machine has 2 cores; most of a
/// scenario's time is waiting out a deadline or a lease).
const CONCURRENCY: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_scenario_of_the_fault_vectors() {
    let v = fv::vectors();
    let scenarios = fv::scenarios(&v).unwrap_or_else(|e| panic!("{e}"));
    let mut work = Vec::new();
    for s in scenarios {
        if fv::needs_middleware(&s) {
            // crates/settle-middleware/tests/fault_vectors.rs runs it.
            continue;
        }
        match s.subject.as_str() {
            "run_once" | "reconciler" | "reconciler_lifecycle" => {
                for variant in fv::variants(&s) {
                    work.push((s.clone(), variant));
                }
            }
            other => panic!("{}: a subject this runner does not know: {other:?}", s.id),
        }
    }
    assert!(!work.is_empty(), "no scenario for this runner");
    let server = Arc::new(Server::start().await);
    let run = fv::run_token();
    let shared = server.clone();
    fv::run_all("settle-worker", work, CONCURRENCY, move |s, variant| {
        let server = shared.clone();
        let run = run.clone();
        async move { scenario(&server, &run, s, variant).await }
    })
    .await;
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop().await;
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
    let outcome = async {
        for step in &s.setup {
            match step.split_once(':') {
                None if step == "unknown_record" => {
                    fv::unknown_record(&server.direct, &n.key, &n, &s.opts).await;
                }
                Some(("unknown_record", suffix)) => {
                    fv::unknown_record(&server.direct, &n.key_of(Some(suffix)), &n, &s.opts).await;
                }
                None if step == "completed_record" => {
                    fv::completed_record(&server.direct, &n.key, &n, &s.opts).await;
                }
                _ => return Err(format!("a setup step this runner does not know: {step:?}")),
            }
        }
        proxy.set_rules(s.faults.clone());
        match s.subject.as_str() {
            "run_once" => run_once_scenario(server, &proxy, &s, &n, variant).await,
            "reconciler" => reconciler_scenario(server, &proxy, &s, &n, variant).await,
            "reconciler_lifecycle" => lifecycle_scenario(&proxy, &s, &n, variant).await,
            other => Err(format!("a subject this runner does not know: {other:?}")),
        }
    }
    .await;
    proxy.stop().await;
    if let Some(f) = fresh {
        f.stop().await;
    }
    outcome
}

/// A step of a `run_once` effect (FAULT-VECTORS.md "What the subject does").
#[derive(Clone, Copy, Debug)]
enum Step {
    Dispatch,
    DispatchIgnoreError,
    Write,
    Revoke,
    WaitLeaseLost,
    Complete,
    CompleteLarge,
    RaiseNotSent,
    RaiseRefused,
    RaiseOther,
}

fn steps(v: &Value) -> Result<Vec<Step>, Fail> {
    let steps = v.as_array().ok_or("effect is not an array")?;
    steps
        .iter()
        .map(|s| {
            Ok(match s.as_str().ok_or("an effect step is not a string")? {
                "dispatch" => Step::Dispatch,
                "dispatch_ignore_error" => Step::DispatchIgnoreError,
                "write" => Step::Write,
                "revoke" => Step::Revoke,
                "wait_lease_lost" => Step::WaitLeaseLost,
                "complete" => Step::Complete,
                "complete_large" => Step::CompleteLarge,
                "raise_not_sent" => Step::RaiseNotSent,
                "raise_refused" => Step::RaiseRefused,
                "raise_other" => Step::RaiseOther,
                other => {
                    return Err(format!(
                        "an effect step this runner does not know: {other:?}"
                    ));
                }
            })
        })
        .collect()
}

/// The result kind of a run (SPEC §11.11; `RunError`'s table).
fn kind(r: &Result<RunResult, RunError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(RunError::NotSent { .. }) => "not_sent".into(),
        Err(RunError::EffectRefused { .. }) => "effect_refused".into(),
        Err(RunError::Refused { code, .. }) => format!("refused:{}", code.code()),
        Err(RunError::OutcomeUnknown { .. } | RunError::ReconcileFailed { .. }) => {
            "outcome_unknown".into()
        }
        Err(RunError::DeadlineExceeded { .. }) => "deadline".into(),
        Err(RunError::ReconcileRequired { .. }) => "reconcile_required".into(),
        Err(other) => format!("no result kind ({other})"),
    }
}

/// Whether the error was caused by the SDK's deadline (its own, or the
/// error it carries).
fn caused_by_deadline(e: &RunError) -> bool {
    match e {
        RunError::DeadlineExceeded { .. } => true,
        RunError::NotSent { source }
        | RunError::EffectRefused { source }
        | RunError::OutcomeUnknown { source, .. }
        | RunError::ReconcileFailed { source, .. } => source
            .downcast_ref::<RunError>()
            .is_some_and(caused_by_deadline),
        _ => false,
    }
}

/// A reconcile hook as the scenario plays it: `sleep_ms`, then its
/// finding; `raise` is an `Err`, or a panic in the `panic` variant;
/// `started` is told when it is entered.
fn hook(
    act: HookAct,
    sleep_ms: u64,
    variant: &'static str,
    started: Option<Arc<Notify>>,
) -> impl ReconcileHook + Clone + 'static {
    move |_key: Key, _fence: Fence| {
        let started = started.clone();
        async move {
            if let Some(s) = started {
                s.notify_one();
            }
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            match act {
                HookAct::Committed => Ok(Finding::Committed(Done::completed(json!({"ok": true})))),
                HookAct::NotCommitted => Ok(Finding::NotCommitted),
                HookAct::Unavailable => Ok(Finding::Unavailable),
                HookAct::Raise if variant == "panic" => {
                    panic!("the reconcile hook panics (a fault-vector scenario)")
                }
                HookAct::Raise => Err::<Finding, BoxError>("the reconcile hook failed".into()),
                HookAct::Hang => std::future::pending().await,
            }
        }
    }
}

fn read_hook(h: &Value) -> Result<(HookAct, u64), Fail> {
    only(h, &HOOK_FIELDS, "hook")?;
    ensure(
        h.get("middleware").is_none() && h.get("response").is_none(),
        || "a middleware hook: the middleware runner's".into(),
    )?;
    let sleep = h.get("sleep_ms").map_or(Ok(0), |v| {
        v.as_u64()
            .ok_or_else(|| "sleep_ms is not a number".to_string())
    })?;
    Ok((HookAct::read(&h["finding"])?, sleep))
}

/// What the effect did.
#[derive(Default)]
struct Counters {
    effect_calls: AtomicU64,
    remote_writes: AtomicU64,
}

async fn effect(
    ctx: &EffectContext<'_>,
    steps: &[Step],
    c: &Counters,
    direct: &settle_client::Client,
    n: &Names,
    large: usize,
) -> Result<Done, EffectError> {
    c.effect_calls.fetch_add(1, Ordering::SeqCst);
    for step in steps {
        match step {
            Step::Dispatch => ctx.dispatch().await?,
            Step::DispatchIgnoreError => {
                let _ = ctx.dispatch().await;
            }
            Step::Write => {
                c.remote_writes.fetch_add(1, Ordering::SeqCst);
            }
            Step::Revoke => {
                direct
                    .revoke(&n.principal)
                    .await
                    .map_err(|e| EffectError::not_sent(format!("the runner's revoke: {e}")))?;
            }
            Step::WaitLeaseLost => {
                // Bounded: a lease that is never lost fails the checks.
                let _ = tokio::time::timeout(Duration::from_secs(10), ctx.lease_lost().cancelled())
                    .await;
            }
            Step::Complete => return Ok(Done::completed(json!({"ok": true}))),
            Step::CompleteLarge => {
                return Ok(Done::completed(json!({"blob": "x".repeat(large)})));
            }
            Step::RaiseNotSent => return Err(EffectError::not_sent("the effect sent nothing")),
            Step::RaiseRefused => {
                return Err(EffectError::refused("the remote refused the effect"));
            }
            Step::RaiseOther => return Err(EffectError::unknown("the effect failed")),
        }
    }
    Err(EffectError::unknown("the effect's script has no last step"))
}

async fn run_once_scenario(
    server: &Server,
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
) -> Result<(), Fail> {
    only(&s.expect, &RUN_ONCE_EXPECT, "expect")?;
    let o = &s.opts;
    let script = steps(s.raw.get("effect").ok_or("no effect")?)?;
    let mut options = RunOptions::new(n.principal.as_str())
        .scopes(o.scopes.iter())
        .lease(o.lease())
        .marks_dispatch(o.marks_dispatch)
        .deadline(Some(o.deadline()));
    if let Some(ms) = o.hook_timeout_ms {
        options = options.hook_timeout(Duration::from_millis(ms));
    }
    if let Some(h) = s.raw.get("hook") {
        let (act, sleep) = read_hook(h)?;
        options = options.reconcile(Reconcile::hook(hook(act, sleep, variant, None)));
    }
    let replays = Arc::new(AtomicU64::new(0));
    if s.raw.get("on_replay") == Some(&json!(true)) {
        options = options.on_replay(replay_hook(replays.clone()));
    }
    let client = fv::through(proxy);
    let counters = Counters::default();
    let large = o.large_result_bytes;
    let result = run_once(
        &client,
        &n.key,
        &o.request,
        async |ctx: &EffectContext<'_>| {
            effect(ctx, &script, &counters, &server.direct, n, large).await
        },
        &options,
    )
    .await;
    let log = proxy.log();
    let e = &s.expect;
    let got = kind(&result);
    ensure(json!(got) == e["result"], || {
        format!("result {got} ({result:?}), expected {}", e["result"])
    })?;
    match e.get("cause") {
        None => {}
        Some(c) if c == "deadline" => {
            let caused = result.as_ref().err().is_some_and(caused_by_deadline);
            ensure(caused, || format!("not caused by the deadline: {result:?}"))?;
        }
        Some(c) => return Err(format!("a cause this runner does not know: {c}")),
    }
    for (name, counter) in [
        ("effect_calls", &counters.effect_calls),
        ("remote_writes", &counters.remote_writes),
    ] {
        if let Some(w) = e.get(name) {
            let got = counter.load(Ordering::SeqCst);
            ensure(json!(got) == *w, || format!("{name}: {got}, expected {w}"))?;
        }
    }
    fv::check_replay(
        e,
        result.as_ref().ok().map(|r| r.replayed),
        result
            .as_ref()
            .ok()
            .and_then(|r| r.outcome.result().map(|v| v.to_value())),
        replays.load(Ordering::SeqCst),
    )?;
    fv::check_calls(e, &log)?;
    if let Some(w) = e.get("record") {
        fv::check_record(&server.direct, &n.key, w, n).await?;
    }
    if let Some(w) = e.get("next_claim") {
        fv::check_next_claim(
            &server.direct,
            &n.key,
            fv::fingerprint(o),
            fv::binding(n, o),
            w,
        )
        .await?;
    }
    Ok(())
}

/// `on_replay: true`: counts its calls; the run's outcome is the stored
/// result wrapped, `{"replayed_by_hook": <stored>}`.
fn replay_hook(
    calls: Arc<AtomicU64>,
) -> impl Fn(settle_core::Outcome, &settle_core::Receipt) -> settle_core::Outcome + Send + Sync {
    move |stored, receipt| {
        assert_eq!(
            receipt.status,
            settle_core::Status::Completed,
            "{receipt:?}"
        );
        calls.fetch_add(1, Ordering::SeqCst);
        let was = stored.result().map(|r| r.to_value());
        Done::completed(json!({ "replayed_by_hook": was }))
            .outcome()
            .expect("a small JSON result")
    }
}

/// The Reconciler a scenario sweeps with, over the proxy.
fn reconciler(
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
    started: Option<Arc<Notify>>,
) -> Result<Reconciler, Fail> {
    let o = &s.opts;
    let mut r = Reconciler::new(fv::through(proxy))
        .lease(LeaseMs::new(o.lease_ms).map_err(|e| e.to_string())?)
        .deadline(o.deadline());
    if let Some(ms) = o.hook_timeout_ms {
        r = r.hook_timeout(Duration::from_millis(ms));
    }
    for h in s.raw["hooks"].as_array().ok_or("no hooks")? {
        let (act, sleep) = read_hook(h)?;
        let prefix = n.sub(h["prefix"].as_str().ok_or("a hook without a prefix")?);
        r = r.hook(prefix, hook(act, sleep, variant, started.clone()));
    }
    Ok(r)
}

async fn reconciler_scenario(
    server: &Server,
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
) -> Result<(), Fail> {
    only(&s.expect, &RECONCILER_EXPECT, "expect")?;
    let sweep = reconciler(proxy, s, n, variant, None)?.sweep().await;
    let log = proxy.log();
    let e = &s.expect;
    if let Some(w) = e.get("counts") {
        let got = fv::counts(&sweep);
        ensure(got == *w, || format!("counts {got}, expected {w}"))?;
    }
    fv::check_list_key_prefix(e, &log)?;
    fv::check_calls(e, &log)?;
    if let Some(w) = e.get("record") {
        fv::check_record(&server.direct, &n.key, w, n).await?;
    }
    if let Some(rs) = e.get("records") {
        for (suffix, w) in rs.as_object().ok_or("records is not an object")? {
            let key = n.key_of(Some(suffix));
            fv::check_record(&server.direct, &key, w, n)
                .await
                .map_err(|e| format!("records.{suffix}: {e}"))?;
        }
    }
    if let Some(w) = e.get("next_claim") {
        let o = &s.opts;
        fv::check_next_claim(
            &server.direct,
            &n.key,
            fv::fingerprint(o),
            fv::binding(n, o),
            w,
        )
        .await?;
    }
    Ok(())
}

async fn lifecycle_scenario(
    proxy: &Proxy,
    s: &Scenario,
    n: &Names,
    variant: &'static str,
) -> Result<(), Fail> {
    only(&s.expect, &LIFECYCLE_EXPECT, "expect")?;
    let e = &s.expect;
    let started = Arc::new(Notify::new());
    let r = reconciler(proxy, s, n, variant, Some(started.clone()))?;
    r.start(Duration::from_millis(20))
        .map_err(|e| format!("the first start() was refused: {e}"))?;
    let second = r.start(Duration::from_millis(20));
    match e.get("second_start") {
        Some(w) if w == "refused" => {
            ensure(second == Err(ReconcilerError::AlreadyRunning), || {
                format!("the second start() answered {second:?}")
            })?
        }
        None => {}
        Some(w) => {
            return Err(format!(
                "second_start {w}: this runner knows only \"refused\""
            ));
        }
    }
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .map_err(|_| "the hook never started".to_string())?;
    let timeout = Duration::from_millis(
        e["stop_timeout_ms"]
            .as_u64()
            .ok_or("stop_timeout_ms is not a number")?,
    );
    let t = Instant::now();
    let ended = r.stop(timeout).await;
    let took = t.elapsed();
    match e.get("stop_returns") {
        Some(w) if w == true => {
            // Within its timeout (and a scheduling margin on a loaded
            // 2-core machine).
            ensure(took <= timeout + Duration::from_millis(250), || {
                format!("stop({timeout:?}) returned after {took:?} (ended: {ended})")
            })?;
        }
        None => {}
        Some(w) => return Err(format!("stop_returns {w}: this runner knows only true")),
    }
    ensure(!r.is_running(), || {
        "the loop still runs after stop()".into()
    })
}
