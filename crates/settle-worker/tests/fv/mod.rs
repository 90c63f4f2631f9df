//! What both Rust runners of `sdk/fault-vectors.json` share
//! (`crates/settle-worker/tests/fault_vectors.rs` and
//! `crates/settle-middleware/tests/fault_vectors.rs`, which includes this
//! file by path): the file and its scenarios read strictly (a field, a
//! subject or a step a runner does not know is a failure, so the vectors
//! and the runners cannot drift), a real `settle serve` in this process,
//! a `settle-faultproxy` per scenario in front of it, and the checks of
//! `expect` that do not depend on the subject (the record read directly
//! from the server, the calls from the proxy's log, the next claim).
//! FAULT-VECTORS.md describes the format.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use settle_core::{
    Binding, ClaimDecision, Command, Digest, Key, LeaseMs, Outcome, Principal, Reply, RetentionS,
    Scopes, Settle,
};
use settle_faultproxy::{LoggedCall, Proxy, Rule};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `sdk/fault-vectors.json`.
pub fn vectors() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../sdk/fault-vectors.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A failure of one scenario.
pub type Fail = String;

/// Fails with `msg` unless `ok`.
pub fn ensure(ok: bool, msg: impl FnOnce() -> String) -> Result<(), Fail> {
    if ok { Ok(()) } else { Err(msg()) }
}

/// One scenario, read strictly, with the defaults under its options.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub raw: Value,
    pub id: String,
    pub subject: String,
    pub opts: Opts,
    pub setup: Vec<String>,
    pub faults: Vec<Rule>,
    pub expect: Value,
    pub fresh_ledger: bool,
}

/// The merged options (defaults, then the scenario's).
#[derive(Clone, Debug)]
pub struct Opts {
    pub request: Value,
    pub scopes: Vec<String>,
    pub lease_ms: u64,
    pub deadline_ms: u64,
    pub marks_dispatch: bool,
    pub hook_timeout_ms: Option<u64>,
    pub large_result_bytes: usize,
    pub mw_method: String,
    pub mw_path: String,
    pub mw_body: Value,
    pub max_body_bytes: usize,
    pub release_on: Vec<u16>,
    pub wait_s: u64,
}

const SCENARIO_FIELDS: [&str; 14] = [
    "id",
    "row",
    "subject",
    "note",
    "options",
    "setup",
    "faults",
    "effect",
    "hook",
    "hooks",
    "handler",
    "expect",
    "fresh_ledger",
    "on_replay",
];
const OPTION_FIELDS: [&str; 8] = [
    "request",
    "scopes",
    "lease_ms",
    "deadline_ms",
    "marks_dispatch",
    "hook_timeout_ms",
    "large_result_bytes",
    "mw",
];
const MW_FIELDS: [&str; 6] = [
    "method",
    "path",
    "body",
    "max_body_bytes",
    "release_on",
    "wait_s",
];

/// Every key of `v` is one of `known`.
pub fn only(v: &Value, known: &[&str], what: &str) -> Result<(), Fail> {
    let Some(o) = v.as_object() else {
        return Err(format!("{what} is not an object: {v}"));
    };
    for k in o.keys() {
        ensure(known.contains(&k.as_str()), || {
            format!("{what} has a field this runner does not know: {k:?}")
        })?;
    }
    Ok(())
}

fn u(v: &Value, what: &str) -> Result<u64, Fail> {
    v.as_u64()
        .ok_or_else(|| format!("{what} is not a number: {v}"))
}

fn strings(v: &Value, what: &str) -> Result<Vec<String>, Fail> {
    v.as_array()
        .ok_or_else(|| format!("{what} is not an array: {v}"))?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{what} holds a non-string: {s}"))
        })
        .collect()
}

impl Opts {
    fn read(defaults: &Value, options: Option<&Value>) -> Result<Opts, Fail> {
        only(defaults, &OPTION_FIELDS, "defaults")?;
        let mut d = defaults.clone();
        if let Some(o) = options {
            only(
                o,
                &[&OPTION_FIELDS[..], &["release_on", "wait_s"][..]].concat(),
                "options",
            )?;
            for (k, v) in o.as_object().expect("checked") {
                match k.as_str() {
                    // the middleware's own options may be given flat
                    "release_on" | "wait_s" => {
                        d["mw"][k] = v.clone();
                    }
                    _ => d[k] = v.clone(),
                }
            }
        }
        only(&d["mw"], &MW_FIELDS, "mw")?;
        Ok(Opts {
            request: d["request"].clone(),
            scopes: strings(&d["scopes"], "scopes")?,
            lease_ms: u(&d["lease_ms"], "lease_ms")?,
            deadline_ms: u(&d["deadline_ms"], "deadline_ms")?,
            marks_dispatch: d["marks_dispatch"]
                .as_bool()
                .ok_or("marks_dispatch is not a boolean")?,
            hook_timeout_ms: match &d["hook_timeout_ms"] {
                Value::Null => None,
                v => Some(u(v, "hook_timeout_ms")?),
            },
            large_result_bytes: u(&d["large_result_bytes"], "large_result_bytes")? as usize,
            mw_method: d["mw"]["method"].as_str().ok_or("mw.method")?.to_string(),
            mw_path: d["mw"]["path"].as_str().ok_or("mw.path")?.to_string(),
            mw_body: d["mw"]["body"].clone(),
            max_body_bytes: u(&d["mw"]["max_body_bytes"], "mw.max_body_bytes")? as usize,
            release_on: d["mw"]["release_on"]
                .as_array()
                .ok_or("mw.release_on")?
                .iter()
                .map(|s| u(s, "release_on").map(|n| n as u16))
                .collect::<Result<_, _>>()?,
            wait_s: u(&d["mw"]["wait_s"], "mw.wait_s")?,
        })
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

/// Every scenario of the file, read strictly.
pub fn scenarios(v: &Value) -> Result<Vec<Scenario>, Fail> {
    let defaults = &v["defaults"];
    let mut out = Vec::new();
    for raw in v["scenarios"].as_array().ok_or("no scenarios array")? {
        let id = raw["id"]
            .as_str()
            .ok_or("a scenario without an id")?
            .to_string();
        let read = || -> Result<Scenario, Fail> {
            only(raw, &SCENARIO_FIELDS, "the scenario")?;
            let faults = match raw.get("faults") {
                None => Vec::new(),
                Some(f) => serde_json::from_value::<Vec<Rule>>(f.clone())
                    .map_err(|e| format!("faults: {e}"))?,
            };
            Ok(Scenario {
                raw: raw.clone(),
                id: id.clone(),
                subject: raw["subject"].as_str().ok_or("no subject")?.to_string(),
                opts: Opts::read(defaults, raw.get("options"))?,
                setup: match raw.get("setup") {
                    None => Vec::new(),
                    Some(s) => strings(s, "setup")?,
                },
                faults,
                expect: raw.get("expect").cloned().ok_or("no expect")?,
                fresh_ledger: raw
                    .get("fresh_ledger")
                    .map(|f| f.as_bool().ok_or("fresh_ledger is not a boolean"))
                    .transpose()?
                    .unwrap_or(false),
            })
        };
        out.push(read().map_err(|e| format!("{id}: {e}"))?);
    }
    Ok(out)
}

/// Whether the scenario needs the middleware (its setup or a hook): the
/// middleware runner runs it, since settle-worker cannot depend on
/// settle-middleware (the layering runs the other way).
pub fn needs_middleware(s: &Scenario) -> bool {
    s.subject == "middleware"
        || s.setup.iter().any(|x| x.starts_with("mw_"))
        || s.raw["hooks"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|h| h["middleware"] == json!(true)))
}

/// A scenario's names (FAULT-VECTORS.md "Names").
#[derive(Clone, Debug)]
pub struct Names {
    pub key: String,
    pub principal: String,
}

impl Names {
    pub fn new(run: &str, variant: &str, id: &str) -> Names {
        let key = format!("fv-{run}-{variant}-{id}~");
        Names {
            principal: key.clone(),
            key,
        }
    }
    /// `$key`, `$key:<suffix>`, `$principal` substituted.
    pub fn sub(&self, s: &str) -> String {
        s.replace("$principal", &self.principal)
            .replace("$key", &self.key)
    }
    /// `$key` or `$key:<suffix>` of a setup step's `:<suffix>`.
    pub fn key_of(&self, suffix: Option<&str>) -> String {
        match suffix {
            Some(s) => format!("{}:{s}", self.key),
            None => self.key.clone(),
        }
    }
}

/// A token for this run of the tests: the keys of two runs never meet.
pub fn run_token() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("r{}", n % 1_000_000_000)
}

/// `settle serve` (auth off, the embedded store) in this process.
pub struct Server {
    pub addr: SocketAddr,
    /// A client straight to the server (not through any proxy).
    pub direct: settle_client::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().expect("a temp dir");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an ephemeral port");
        let addr = listener.local_addr().unwrap();
        let config = settle_server::Config::local(addr, dir.path().to_path_buf());
        let store = settle_embedded::EmbeddedStore::open(
            dir.path(),
            settle_embedded::EmbeddedOptions {
                limits: config.limits(),
                ..Default::default()
            },
        )
        .expect("open the embedded store");
        let closer = store.clone();
        let opened = settle_server::OpenedStore::new(store, move || closer.close());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(settle_server::run(config, opened, listener, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            direct: settle_client::Client::new(&format!("http://{addr}")).unwrap(),
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// A proxy in front of this server, with no rules yet.
    pub async fn proxy(&self) -> Proxy {
        Proxy::start("127.0.0.1:0".parse().unwrap(), self.addr)
            .await
            .expect("start the proxy")
    }
}

/// A client of the proxy: every call of the subject goes through it.
pub fn through(proxy: &Proxy) -> settle_client::Client {
    settle_client::Client::new(&format!("http://{}", proxy.addr())).unwrap()
}

/// The binding of a scenario's direct calls (`$principal`, `scopes`, 0).
pub fn binding(n: &Names, o: &Opts) -> Binding {
    Binding {
        principal: Principal::new(n.principal.as_str()).unwrap(),
        scopes: Scopes::from_strs(o.scopes.iter()).unwrap(),
        generation: 0,
    }
}

/// The SDK's canonical fingerprint of `request`.
pub fn fingerprint(o: &Opts) -> Digest {
    settle_worker::fingerprint(&o.request).unwrap()
}

/// Setup `unknown_record` (FAULT-VECTORS.md): claimed directly with the
/// request's fingerprint and settled `unknown`.
pub async fn unknown_record(direct: &settle_client::Client, key: &str, n: &Names, o: &Opts) {
    let fp = fingerprint(o);
    let claim = settle_core::Claim {
        key: Key::new(key).unwrap(),
        fingerprint: fp,
        binding: binding(n, o),
        lease_ms: LeaseMs::new(o.lease_ms).unwrap(),
        worker: None,
        marks_dispatch: false,
        retention_s: RetentionS::DEFAULT,
        claim_id: None,
    };
    let g = match direct.execute(&Command::Claim(claim)).await {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => g,
        other => panic!("setup claim of {key} answered {other:?}"),
    };
    let settle = Command::Settle(Settle {
        key: Key::new(key).unwrap(),
        fence: g.fence,
        fingerprint: fp,
        binding: binding(n, o),
        outcome: Outcome::unknown(None),
    });
    match direct.execute(&settle).await {
        Ok(Reply::Receipt(_)) => {}
        other => panic!("setup settle of {key} answered {other:?}"),
    }
}

/// Setup `completed_record`: claimed directly, settled `completed` with
/// `{"ok": true}` (the next claim is a replay).
pub async fn completed_record(direct: &settle_client::Client, key: &str, n: &Names, o: &Opts) {
    let claim = settle_core::Claim {
        key: Key::new(key).unwrap(),
        fingerprint: fingerprint(o),
        binding: binding(n, o),
        lease_ms: LeaseMs::new(o.lease_ms).unwrap(),
        worker: None,
        marks_dispatch: false,
        retention_s: RetentionS::DEFAULT,
        claim_id: None,
    };
    let g = match direct.execute(&Command::Claim(claim)).await {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => g,
        other => panic!("setup claim of {key} answered {other:?}"),
    };
    let outcome = settle_worker::Done::completed(json!({"ok": true}))
        .outcome()
        .unwrap();
    let settle = Command::Settle(Settle {
        key: Key::new(key).unwrap(),
        fence: g.fence,
        fingerprint: fingerprint(o),
        binding: binding(n, o),
        outcome,
    });
    match direct.execute(&settle).await {
        Ok(Reply::Receipt(_)) => {}
        other => panic!("setup settle of {key} answered {other:?}"),
    }
}

/// `replayed`, `value` and `on_replay_calls` (the replay hook's calls).
pub fn check_replay(
    expect: &Value,
    replayed: Option<bool>,
    value: Option<Value>,
    calls: u64,
) -> Result<(), Fail> {
    if let Some(w) = expect.get("replayed") {
        ensure(json!(replayed) == *w, || {
            format!("replayed: {replayed:?}, expected {w}")
        })?;
    }
    if let Some(w) = expect.get("value") {
        ensure(value.as_ref() == Some(w), || {
            format!("value: {value:?}, expected {w}")
        })?;
    }
    if let Some(w) = expect.get("on_replay_calls") {
        ensure(json!(calls) == *w, || {
            format!("on_replay_calls: {calls}, expected {w}")
        })?;
    }
    Ok(())
}

/// `calls`: how many requests of each call the proxy saw (exact).
pub fn check_calls(expect: &Value, log: &[LoggedCall]) -> Result<(), Fail> {
    let Some(calls) = expect.get("calls") else {
        return Ok(());
    };
    for (name, n) in calls.as_object().ok_or("calls is not an object")? {
        ensure(settle_faultproxy::Call::from_name(name).is_some(), || {
            format!("calls: unknown call {name:?}")
        })?;
        let seen = log.iter().filter(|c| c.call.as_str() == name).count() as u64;
        let want = u(n, "calls")?;
        ensure(seen == want, || {
            format!("calls.{name}: the proxy saw {seen}, expected {want}")
        })?;
    }
    Ok(())
}

/// `list_key_prefix: null`: every listing was asked without `key_prefix`
/// (the proxy's log keeps each call's query), and answered 200.
pub fn check_list_key_prefix(expect: &Value, log: &[LoggedCall]) -> Result<(), Fail> {
    match expect.get("list_key_prefix") {
        None => Ok(()),
        Some(Value::Null) => {
            let lists: Vec<_> = log.iter().filter(|c| c.call.as_str() == "list").collect();
            ensure(!lists.is_empty(), || "no listing was made".into())?;
            for l in lists {
                let query = l.query.as_deref().unwrap_or("");
                ensure(
                    !query.split('&').any(|p| p.starts_with("key_prefix=")),
                    || format!("a listing was asked with key_prefix: ?{query}"),
                )?;
                ensure(l.upstream_status == Some(200), || {
                    format!("a listing was answered {:?}", l.upstream_status)
                })?;
            }
            Ok(())
        }
        Some(other) => Err(format!(
            "list_key_prefix {other}: this runner knows only null"
        )),
    }
}

const RECORD_FIELDS: [&str; 8] = [
    "exists",
    "status",
    "reconcile_required",
    "attempts",
    "quarantined",
    "dispatched",
    "worker",
    "lease",
];

/// `record` of `expect`, read with `get` straight from the server.
pub async fn check_record(
    direct: &settle_client::Client,
    key: &str,
    want: &Value,
    n: &Names,
) -> Result<(), Fail> {
    only(want, &RECORD_FIELDS, "record")?;
    let got = match direct.get(key).await {
        Ok(r) => Some(serde_json::to_value(r).unwrap()),
        Err(e) if e.status() == Some(404) => None,
        Err(e) => return Err(format!("get {key}: {e}")),
    };
    if let Some(exists) = want.get("exists") {
        let exists = exists.as_bool().ok_or("record.exists")?;
        ensure(exists == got.is_some(), || {
            format!("record exists: {}, expected {exists}", got.is_some())
        })?;
    }
    let Some(r) = got else {
        return ensure(want.get("exists") == Some(&json!(false)), || {
            format!("record {key} does not exist")
        });
    };
    let field = |name: &str, got: &Value, want: &Value| {
        ensure(got == want, || {
            format!("record.{name}: {got}, expected {want} (record: {r})")
        })
    };
    if let Some(w) = want.get("status") {
        // `pending` includes a running lease.
        let s = match r["status"].as_str() {
            Some("running") => json!("pending"),
            _ => r["status"].clone(),
        };
        field("status", &s, w)?;
    }
    if let Some(w) = want.get("reconcile_required") {
        field("reconcile_required", &r["reconcile_required"], w)?;
    }
    if let Some(w) = want.get("attempts") {
        field("attempts", &r["attempts_total"], w)?;
    }
    if let Some(w) = want.get("quarantined") {
        field("quarantined", &r["quarantine_total"], w)?;
    }
    if let Some(w) = want.get("dispatched") {
        field("dispatched", &r["lease"]["dispatched"], w)?;
    }
    if let Some(w) = want.get("worker") {
        let w = json!(n.sub(w.as_str().ok_or("record.worker")?));
        field("worker", &r["attempts"][0]["lease"]["worker"], &w)?;
    }
    if let Some(w) = want.get("lease") {
        let lease = &r["lease"];
        let shown = if lease.is_null() {
            json!("none")
        } else if lease["ended"].is_null() {
            json!("open")
        } else {
            json!(format!(
                "ended:{}",
                lease["ended"]["reason"].as_str().unwrap_or("?")
            ))
        };
        field("lease", &shown, w)?;
    }
    Ok(())
}

/// `next_claim`: the decision a direct claim with the same fingerprint
/// and binding gets afterwards.
pub async fn check_next_claim(
    direct: &settle_client::Client,
    key: &str,
    fp: Digest,
    binding: Binding,
    want: &Value,
) -> Result<(), Fail> {
    let claim = settle_core::Claim {
        key: Key::new(key).unwrap(),
        fingerprint: fp,
        binding,
        lease_ms: LeaseMs::DEFAULT,
        worker: None,
        marks_dispatch: false,
        retention_s: RetentionS::DEFAULT,
        claim_id: None,
    };
    let got = match direct.execute(&Command::Claim(claim)).await {
        Ok(Reply::Claim(d)) => d.name().to_string(),
        other => format!("{other:?}"),
    };
    ensure(json!(got) == *want, || {
        format!("next_claim: {got}, expected {want}")
    })
}

/// The counts of a Reconciler sweep, as the vectors name them.
pub fn counts(s: &settle_worker::Sweep) -> Value {
    json!({
        "seen": s.seen, "committed": s.committed, "not_committed": s.not_committed,
        "unavailable": s.unavailable, "skipped": s.skipped, "errors": s.errors,
    })
}

/// A Reconciler hook's `finding` as the runner plays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookAct {
    Committed,
    NotCommitted,
    Unavailable,
    /// `raise`: an error (`Err`) or, in the `panic` variant, a panic.
    Raise,
    Hang,
}

impl HookAct {
    pub fn read(v: &Value) -> Result<HookAct, Fail> {
        Ok(match v.as_str().ok_or("finding is not a string")? {
            "committed" => HookAct::Committed,
            "not_committed" => HookAct::NotCommitted,
            "unavailable" => HookAct::Unavailable,
            "raise" => HookAct::Raise,
            "hang" => HookAct::Hang,
            other => {
                return Err(format!(
                    "a hook finding this runner does not know: {other:?}"
                ));
            }
        })
    }
}

/// The variants a scenario runs through: a hook that raises runs as an
/// `Err` and as a panic (FAULT-VECTORS.md: "in Rust, panics").
pub fn variants(s: &Scenario) -> Vec<&'static str> {
    let raises = |h: &Value| h["finding"] == json!("raise");
    let any_raise = s.raw.get("hook").is_some_and(raises)
        || s.raw["hooks"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(raises));
    if any_raise {
        vec!["err", "panic"]
    } else {
        vec!["one"]
    }
}

/// Runs `f` on every (scenario, variant), `concurrency` at a time, and
/// fails with every failure at the end; prints each one's duration.
pub async fn run_all<F, Fut>(
    label: &str,
    work: Vec<(Scenario, &'static str)>,
    concurrency: usize,
    f: F,
) where
    F: Fn(Scenario, &'static str) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Fail>> + Send + 'static,
{
    let f = Arc::new(f);
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (s, variant) in work {
        let f = f.clone();
        let gate = gate.clone();
        // Named outside the task: a task that panics still names its scenario.
        let name = format!("{}[{variant}]", s.id);
        tasks.push((
            name,
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let t = Instant::now();
                // No scenario may hang the runner.
                let r = match tokio::time::timeout(Duration::from_secs(60), f(s, variant)).await {
                    Ok(r) => r,
                    Err(_) => Err("did not finish within 60 s".into()),
                };
                (t.elapsed(), r)
            }),
        ));
    }
    let mut failures = BTreeMap::new();
    let mut n = 0;
    for (name, t) in tasks {
        let (took, r) = match t.await {
            Ok(x) => x,
            Err(e) => (Duration::ZERO, Err(format!("panicked: {e}"))),
        };
        n += 1;
        println!(
            "{label}: {name} {} ms {}",
            took.as_millis(),
            if r.is_ok() { "ok" } else { "FAILED" }
        );
        if let Err(e) = r {
            failures.insert(name, e);
        }
    }
    println!(
        "{label}: {n} scenario runs in {} ms",
        started.elapsed().as_millis()
    );
    assert!(
        failures.is_empty(),
        "{} of {n} failed:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|(k, v)| format!("  {k}: {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
