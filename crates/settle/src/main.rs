//! `settle`: the server, a client for it, an offline inspector and a benchmark.
//!
//! Exit codes (also in README.md):
//! 0 success · 1 local failure (cannot open the store, bad config, ...) ·
//! 2 usage error · 3 the server cannot be reached · 4 the request was refused
//! as invalid (400, 401, 404, 408, 413, 422) · 5 protocol refusal (409) ·
//! 6 the server is unavailable (503 and other 5xx).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args, Parser, Subcommand};
use hyper::Method;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use settle::client::{ClientError, Endpoint, HttpReply, encode_segment, operation_path};
use settle_server::ServeArgs;

const EXIT_LOCAL: u8 = 1;
const EXIT_UNREACHABLE: u8 = 3;
const EXIT_INVALID: u8 = 4;
const EXIT_REFUSED: u8 = 5;
const EXIT_UNAVAILABLE: u8 = 6;

#[derive(Parser)]
#[command(
    name = "settle",
    version,
    about = "A durable ledger that makes retried side effects happen at most once.",
    after_help = "Exit codes: 0 success, 1 local failure, 2 usage error, 3 server unreachable, \
                  4 invalid request (400/401/404/408/413/422), 5 protocol refusal (409), \
                  6 server unavailable (5xx)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the HTTP server (SPEC §7).
    Serve(ServeArgs),
    /// Reserve a key and ask for permission to execute.
    Claim(ClaimArgs),
    /// Extend a lease.
    Heartbeat(HeartbeatArgs),
    /// Record that the remote write is about to start.
    Dispatch(FenceArgs),
    /// Record the outcome and release the lease (one durable commit).
    Settle(SettleArgs),
    /// Release an execute lease without a receipt: nothing was sent
    /// (not_dispatched), or the remote definitively refused the effect
    /// (not_committed).
    Release(ReleaseArgs),
    /// Report what reconciliation found out.
    Reconcile(ReconcileArgs),
    /// Show an operation record.
    Get(KeyArgs),
    /// Raise a principal's generation (revokes its older leases).
    Revoke(RevokeArgs),
    /// Record a bounded warning.
    Warn(WarnArgs),
    /// List a task's warnings.
    Warnings(WarningsArgs),
    /// Read a stopped embedded store offline.
    Inspect(InspectArgs),
    /// Check every record of a stopped embedded store against SPEC §6;
    /// exits 1 if any record violates an invariant or is refused.
    Check(InspectArgs),
    /// Measure claim+settle pairs per second.
    Bench(BenchArgs),
}

#[derive(Args)]
struct Remote {
    /// Server URL.
    #[arg(long, env = "SETTLE_URL", default_value = "http://127.0.0.1:7411")]
    url: String,
    /// Bearer token (not needed when the server runs without tenants on loopback).
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the server's JSON answer instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BindingArgs {
    /// Principal of the binding.
    #[arg(long)]
    principal: String,
    /// A scope of the binding (repeatable).
    #[arg(long = "scope")]
    scopes: Vec<String>,
    /// Binding generation.
    #[arg(long, default_value_t = 0)]
    generation: u64,
}

impl BindingArgs {
    fn json(&self) -> Value {
        json!({"principal": self.principal, "scopes": self.scopes, "generation": self.generation})
    }
}

#[derive(Args)]
struct OutcomeArgs {
    /// completed, failed or unknown.
    #[arg(long)]
    status: String,
    /// The result as a JSON document (completed/failed; `null` is one),
    /// sent as written: the server keeps its exact text.
    #[arg(long)]
    result: Option<String>,
    /// SHA-256 of the upstream's raw response (completed/failed; optional with unknown).
    #[arg(long)]
    response_sha256: Option<String>,
    /// Error text (any text; kept on the attempt, also with unknown).
    #[arg(long)]
    error: Option<String>,
}

/// An outcome on the wire. The result is raw JSON text: going through a
/// parsed value would respell numbers (floats) before the server sees them.
#[derive(serde::Serialize)]
struct OutcomeBody {
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl OutcomeArgs {
    fn body(&self) -> Result<OutcomeBody, String> {
        let result = match &self.result {
            Some(r) => Some(
                RawValue::from_string(r.trim().to_string())
                    .map_err(|e| format!("--result is not JSON: {e}"))?,
            ),
            None => None,
        };
        Ok(OutcomeBody {
            status: self.status.clone(),
            result,
            response_sha256: self.response_sha256.clone(),
            error: self.error.clone(),
        })
    }
}

#[derive(serde::Serialize)]
struct SettleBody {
    fence: u64,
    fingerprint: String,
    binding: Value,
    outcome: OutcomeBody,
}

#[derive(serde::Serialize)]
struct ReconcileBody {
    fence: u64,
    finding: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binding: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<OutcomeBody>,
}

#[derive(Args)]
struct ClaimArgs {
    key: String,
    /// Lowercase hex SHA-256 of the request's effect-defining fields.
    #[arg(long)]
    fingerprint: String,
    #[command(flatten)]
    binding: BindingArgs,
    #[arg(long)]
    lease_ms: Option<u64>,
    #[arg(long)]
    worker: Option<String>,
    /// The worker will call `dispatch` before the remote write.
    #[arg(long)]
    marks_dispatch: bool,
    #[arg(long)]
    retention_s: Option<u64>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct HeartbeatArgs {
    key: String,
    #[arg(long)]
    fence: u64,
    #[arg(long)]
    lease_ms: Option<u64>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct FenceArgs {
    key: String,
    #[arg(long)]
    fence: u64,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct ReleaseArgs {
    key: String,
    #[arg(long)]
    fence: u64,
    /// not_dispatched: the claim used --marks-dispatch and dispatch was never
    /// called. not_committed: the remote definitively refused the effect (a
    /// validation error, 409, 425, 429); allowed after dispatch.
    #[arg(long, value_parser = ["not_dispatched", "not_committed"])]
    reason: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct SettleArgs {
    key: String,
    #[arg(long)]
    fence: u64,
    #[arg(long)]
    fingerprint: String,
    #[command(flatten)]
    binding: BindingArgs,
    #[command(flatten)]
    outcome: OutcomeArgs,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct ReconcileArgs {
    key: String,
    #[arg(long)]
    fence: u64,
    /// committed, not_committed or unavailable.
    #[arg(long)]
    finding: String,
    /// committed: the fingerprint.
    #[arg(long)]
    fingerprint: Option<String>,
    /// committed: principal of the binding.
    #[arg(long)]
    principal: Option<String>,
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long, default_value_t = 0)]
    generation: u64,
    /// committed: completed or failed.
    #[arg(long)]
    status: Option<String>,
    #[arg(long)]
    result: Option<String>,
    #[arg(long)]
    response_sha256: Option<String>,
    #[arg(long)]
    error: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct KeyArgs {
    key: String,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct RevokeArgs {
    principal: String,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct WarnArgs {
    task: String,
    class: String,
    #[arg(long)]
    detail: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct WarningsArgs {
    task: String,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct InspectArgs {
    /// Directory of a stopped embedded store.
    #[arg(long, default_value = settle_server::config::DEFAULT_DATA)]
    data: PathBuf,
    /// A non-terminal record without a live lease, untouched this long, is stuck.
    #[arg(long, default_value_t = 3600)]
    stuck_after_s: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(group(ArgGroup::new("target").required(true).args(["url", "data", "store"])))]
struct BenchArgs {
    /// Benchmark a running server over HTTP.
    #[arg(long)]
    url: Option<String>,
    /// Benchmark the embedded store in this process (no HTTP).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Benchmark settle on PostgreSQL (postgres://…) against the raw SQL
    /// protocol (bench/pg-baseline.sql), in the same run.
    #[arg(long)]
    store: Option<String>,
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// HTTP connections, in-process workers (--data) or PostgreSQL clients
    /// (--store). A comma-separated list (1,64,1024) runs each in turn.
    #[arg(
        long,
        visible_alias = "concurrency",
        default_value = "64",
        value_delimiter = ','
    )]
    connections: Vec<usize>,
    /// Seconds to run (each concurrency).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Threads of the HTTP load generator (it shares the machine with the server).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// With --data: after each run, the PostgreSQL raw-protocol baseline
    /// (postgres://…) at the same concurrency, capped at 64 clients.
    #[arg(long, requires = "data")]
    postgres_baseline: Option<String>,
    /// With --data: fill the store with this many settled records, reporting
    /// the resident memory at 1M, 10M, … and at the end, then close it and
    /// time the reopen.
    #[arg(long, requires = "data")]
    records: Option<u64>,
    /// With --store: alternating rounds of baseline and settle per client count.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// One JSON object per run, one per line.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.cmd).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}

async fn run(cmd: Cmd) -> Result<(), u8> {
    match cmd {
        Cmd::Serve(args) => settle_server::serve_main(args).await.map_err(|e| {
            eprintln!("error: {e}");
            EXIT_LOCAL
        }),
        Cmd::Claim(a) => {
            let mut body = json!({"fingerprint": a.fingerprint, "binding": a.binding.json()});
            if let Some(v) = a.lease_ms {
                body["lease_ms"] = json!(v);
            }
            if let Some(v) = &a.worker {
                body["worker"] = json!(v);
            }
            if a.marks_dispatch {
                body["marks_dispatch"] = json!(true);
            }
            if let Some(v) = a.retention_s {
                body["retention_s"] = json!(v);
            }
            call(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "claim"),
                Some(body),
            )
            .await
        }
        Cmd::Heartbeat(a) => {
            let mut body = json!({"fence": a.fence});
            if let Some(v) = a.lease_ms {
                body["lease_ms"] = json!(v);
            }
            call(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "heartbeat"),
                Some(body),
            )
            .await
        }
        Cmd::Dispatch(a) => {
            let body = json!({"fence": a.fence});
            call(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "dispatch"),
                Some(body),
            )
            .await
        }
        Cmd::Release(a) => {
            let mut body = json!({"fence": a.fence});
            if let Some(r) = &a.reason {
                body["reason"] = json!(r);
            }
            call(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "release"),
                Some(body),
            )
            .await
        }
        Cmd::Settle(a) => {
            let body = SettleBody {
                fence: a.fence,
                fingerprint: a.fingerprint.clone(),
                binding: a.binding.json(),
                outcome: a.outcome.body().map_err(usage)?,
            };
            call_bytes(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "settle"),
                Some(serde_json::to_vec(&body).expect("JSON serializes")),
            )
            .await
        }
        Cmd::Reconcile(a) => {
            let outcome = match &a.status {
                Some(s) => Some(
                    OutcomeArgs {
                        status: s.clone(),
                        result: a.result.clone(),
                        response_sha256: a.response_sha256.clone(),
                        error: a.error.clone(),
                    }
                    .body()
                    .map_err(usage)?,
                ),
                None => None,
            };
            let body = ReconcileBody {
                fence: a.fence,
                finding: a.finding.clone(),
                fingerprint: a.fingerprint.clone(),
                binding: a.principal.as_ref().map(
                    |p| json!({"principal": p, "scopes": a.scopes, "generation": a.generation}),
                ),
                outcome,
            };
            call_bytes(
                &a.remote,
                Method::POST,
                &operation_path(&a.key, "reconcile"),
                Some(serde_json::to_vec(&body).expect("JSON serializes")),
            )
            .await
        }
        Cmd::Get(a) => call(&a.remote, Method::GET, &operation_path(&a.key, ""), None).await,
        Cmd::Revoke(a) => {
            let path = format!("/v1/principals/{}/revoke", encode_segment(&a.principal));
            call(&a.remote, Method::POST, &path, Some(json!({}))).await
        }
        Cmd::Warn(a) => {
            let path = format!(
                "/v1/tasks/{}/warnings/{}",
                encode_segment(&a.task),
                encode_segment(&a.class)
            );
            let body = match &a.detail {
                Some(d) => json!({"detail": d}),
                None => json!({}),
            };
            call(&a.remote, Method::POST, &path, Some(body)).await
        }
        Cmd::Warnings(a) => {
            let path = format!("/v1/tasks/{}/warnings", encode_segment(&a.task));
            call(&a.remote, Method::GET, &path, None).await
        }
        Cmd::Inspect(a) => inspect(a, false),
        Cmd::Check(a) => inspect(a, true),
        Cmd::Bench(a) => bench(a).await,
    }
}

fn usage(msg: String) -> u8 {
    eprintln!("error: {msg}");
    2
}

/// Sends one request and prints the answer; maps the status to an exit code.
async fn call(remote: &Remote, method: Method, path: &str, body: Option<Value>) -> Result<(), u8> {
    let body = body.map(|b| serde_json::to_vec(&b).expect("JSON serializes"));
    call_bytes(remote, method, path, body).await
}

/// [`call`] with the body already encoded.
async fn call_bytes(
    remote: &Remote,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(), u8> {
    let ep = Endpoint::new(&remote.url, remote.token.as_deref()).map_err(|e| {
        eprintln!("error: {e}");
        2
    })?;
    let reply = ep
        .send(method, path, body)
        .await
        .map_err(|e: ClientError| {
            eprintln!("error: {e}");
            EXIT_UNREACHABLE
        })?;
    if reply.is_success() {
        if remote.json {
            // The server's answer as sent: a replayed result keeps its exact text.
            println!("{}", String::from_utf8_lossy(&reply.body));
        } else {
            print_summary(&reply.json(), raw_result(&reply.body).as_deref());
        }
        return Ok(());
    }
    report_error(&reply, remote.json);
    Err(match reply.status {
        409 => EXIT_REFUSED,
        s if s >= 500 => EXIT_UNAVAILABLE,
        _ => EXIT_INVALID,
    })
}

fn report_error(reply: &HttpReply, as_json: bool) {
    let v = reply.json();
    if as_json && !v.is_null() {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    let code = v["code"].as_str().unwrap_or("error");
    let detail = v["detail"].as_str().unwrap_or("");
    eprintln!("error: HTTP {} {code}: {detail}", reply.status);
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn receipt_line(r: &Value) -> String {
    format!(
        "receipt  status={} fence={} committed_at={} response_sha256={} durable={}",
        s(&r["status"]),
        s(&r["fence"]),
        s(&r["committed_at"]),
        s(&r["response_sha256"]),
        s(&r["durable"])
    )
}

/// The exact text of `outcome.result` in an answer (a replay or a record).
fn raw_result(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Outer {
        outcome: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        // Not an Option: a JSON null result is the text `null`.
        result: Box<RawValue>,
    }
    let o: Outer = serde_json::from_slice(body).ok()?;
    Some(o.outcome?.result.get().to_string())
}

/// A short human-readable rendering of each answer shape; `result` is the
/// exact text of the answer's `outcome.result`, if it has one.
fn print_summary(v: &Value, result: Option<&str>) {
    let result = result.unwrap_or("-");
    if let Some(d) = v["decision"].as_str() {
        match d {
            "execute" | "reconcile" => println!(
                "{d}  fence={} attempt={} lease_expires_at={}",
                s(&v["fence"]),
                s(&v["attempt"]),
                s(&v["lease_expires_at"])
            ),
            "in_flight" => println!("in_flight  retry_after_ms={}", s(&v["retry_after_ms"])),
            "replay" => {
                println!("replay  status={}", s(&v["outcome"]["status"]));
                println!("{}", receipt_line(&v["receipt"]));
                println!("result: {result}");
            }
            _ => println!("{v}"),
        }
    } else if v.get("receipt").is_some() && v.get("reservation").is_none() {
        println!("{}", receipt_line(&v["receipt"]));
    } else if v.get("released").is_some() {
        println!("released  fence={}", s(&v["fence"]));
    } else if v.get("reservation").is_some() {
        println!("key:                {}", s(&v["key"]));
        println!("status:             {}", s(&v["status"]));
        let r = &v["reservation"];
        println!(
            "reservation:        fingerprint={} principal={} scopes={} generation={}",
            s(&r["fingerprint"]),
            s(&r["principal"]),
            r["scopes"],
            s(&r["generation"])
        );
        let l = &v["lease"];
        if l.is_object() {
            let state = if l["ended"].is_null() {
                "live".to_string()
            } else {
                format!("ended ({})", s(&l["ended"]["reason"]))
            };
            println!(
                "lease:              fence={} purpose={} expires_at={} dispatched={} {state}",
                s(&l["fence"]),
                s(&l["purpose"]),
                s(&l["expires_at"]),
                s(&l["dispatched"])
            );
        }
        println!("reconcile_required: {}", s(&v["reconcile_required"]));
        println!("disputed:           {}", s(&v["disputed"]));
        println!("attempts:           {}", s(&v["attempts_total"]));
        println!("quarantined:        {}", s(&v["quarantine_total"]));
        if v["receipt"].is_object() {
            println!("{}", receipt_line(&v["receipt"]));
        }
        if v["outcome"].is_object() {
            println!("result: {result}");
        }
        for a in v["attempts"].as_array().into_iter().flatten() {
            if !a["error"].is_null() || !a["receipt"].is_null() {
                println!(
                    "attempt {}:          receipt={} error={:?}",
                    s(&a["number"]),
                    s(&a["receipt"]["status"]),
                    a["error"].as_str().unwrap_or("-")
                );
            }
        }
        println!("expires_at:         {}", s(&v["expires_at"]));
    } else if let Some(ws) = v["warnings"].as_array() {
        if ws.is_empty() {
            println!("no warnings");
        }
        for w in ws {
            println!(
                "{}/{}  count={}{} last_at={} detail={}",
                s(&w["task"]),
                s(&w["class"]),
                s(&w["count"]),
                if w["saturated"] == json!(true) {
                    " (saturated)"
                } else {
                    ""
                },
                s(&w["last_at"]),
                s(&w["detail"])
            );
        }
    } else if v.get("class").is_some() {
        println!(
            "{}/{}  count={} saturated={} detail={}",
            s(&v["task"]),
            s(&v["class"]),
            s(&v["count"]),
            s(&v["saturated"]),
            s(&v["detail"])
        );
    } else if v.get("generation").is_some() {
        println!("{}  generation={}", s(&v["principal"]), s(&v["generation"]));
    } else if v.get("lease_expires_at").is_some() {
        println!(
            "fence={} lease_expires_at={}{}",
            s(&v["fence"]),
            s(&v["lease_expires_at"]),
            if v["dispatched"] == json!(true) {
                " dispatched"
            } else {
                ""
            }
        );
    } else {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

// ---- inspect ----

/// `inspect` lists; `check` also fails on any violation or refused record.
fn inspect(a: InspectArgs, check: bool) -> Result<(), u8> {
    use settle_core::{Status, Timestamp};
    use std::collections::BTreeMap;

    if !a.data.is_dir() {
        eprintln!("error: {} is not a directory", a.data.display());
        return Err(EXIT_LOCAL);
    }
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let stuck_ms = a.stuck_after_s.saturating_mul(1000);
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut stuck, mut unknown, mut disputed, mut quarantined, mut refused, mut reconcile) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut violations = vec![];
    // Read-only: a store recovery would refuse is reported, never repaired.
    let report = settle_embedded::scan(&a.data, |tenant, r| {
        let id = format!("{tenant}/{}", r.key);
        if let Err(v) = settle_core::invariants::check_record(r) {
            violations.push(format!("{id}: {v}"));
        }
        if r.is_from_the_future(now) {
            refused.push(id.clone());
        }
        let status = if r.status == Status::Pending && r.open_lease().is_some() {
            "running"
        } else {
            r.status.as_str()
        };
        *counts.entry(status).or_default() += 1;
        if r.is_stuck(now, stuck_ms) {
            stuck.push(id.clone());
        }
        if r.status == Status::Unknown {
            unknown.push(id.clone());
        }
        if r.disputed {
            disputed.push(id.clone());
        }
        if r.quarantine_total > 0 {
            quarantined.push(format!("{id} ({})", r.quarantine_total));
        }
        if r.reconcile_required {
            reconcile.push(id);
        }
    })
    .map_err(|e| {
        eprintln!("error: cannot read {}: {e}", a.data.display());
        EXIT_LOCAL
    })?;
    let total: u64 = counts.values().sum();
    // Stored values that do not decode: refused on every call (record_refused).
    let undecodable = report.undecodable;
    let failed = !(violations.is_empty() && refused.is_empty() && undecodable.is_empty());
    if a.json {
        let v = json!({
            "records": total,
            "by_status": counts,
            "stuck": stuck,
            "unknown": unknown,
            "disputed": disputed,
            "quarantined": quarantined,
            "refused": refused,
            "reconcile_required": reconcile,
            "violations": violations,
            "undecodable": undecodable,
            "torn_tail": report.torn_tail,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return if check && failed {
            Err(EXIT_LOCAL)
        } else {
            Ok(())
        };
    }
    println!("{total} records in {}", a.data.display());
    for (status, n) in &counts {
        println!("  {status:<10} {n}");
    }
    for (title, list) in [
        ("stuck", &stuck),
        ("unknown", &unknown),
        ("reconcile_required", &reconcile),
        ("disputed", &disputed),
        ("quarantined", &quarantined),
        ("refused (receipt dated in the future)", &refused),
        ("violations of SPEC §6", &violations),
        ("undecodable (refused on every call)", &undecodable),
    ] {
        println!("{title}: {}", list.len());
        for id in list.iter() {
            println!("  {id}");
        }
    }
    if let Some(t) = &report.torn_tail {
        println!("torn log tail (never acknowledged; cut when the store next opens): {t}");
    }
    if check && failed {
        Err(EXIT_LOCAL)
    } else {
        Ok(())
    }
}

// ---- bench ----

#[derive(serde::Deserialize)]
struct ClaimAnswer {
    decision: String,
    fence: Option<u64>,
}

fn progress_bar(duration: Duration) -> Option<indicatif::ProgressBar> {
    if duration < Duration::from_secs(2) {
        return None;
    }
    let pb = indicatif::ProgressBar::new(duration.as_secs());
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} s  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(pb)
}

async fn bench(a: BenchArgs) -> Result<(), u8> {
    let duration = Duration::from_secs_f64(a.duration.max(0.1));
    if let Some(url) = &a.store {
        return postgres_bench(url, &a, duration).await;
    }
    if let (Some(dir), Some(n)) = (&a.data, a.records) {
        return fill_bench(
            dir,
            n,
            a.connections.first().copied().unwrap_or(1024),
            a.json,
        )
        .await;
    }
    let mut errors_total = 0;
    for &c in &a.connections {
        let (mode, stats, errors) = bench_once(&a, c.max(1), duration).await?;
        errors_total += errors;
        report(mode, &stats, errors, a.json);
        if let Some(pg) = &a.postgres_baseline {
            let clients = c.clamp(1, 64);
            let b = settle_pg::bench::baseline(pg, clients, duration).await;
            report("postgres_baseline", &b, 0, a.json);
        }
    }
    if errors_total > 0 {
        Err(EXIT_UNAVAILABLE)
    } else {
        Ok(())
    }
}

/// One run at one concurrency, with a progress bar on long runs.
async fn bench_once(
    a: &BenchArgs,
    concurrency: usize,
    duration: Duration,
) -> Result<(&'static str, settle_ledger::bench::PairStats, u64), u8> {
    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pb = progress_bar(duration);
    let ticker = pb.clone().map(|pb| {
        let progress = progress.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let secs = start.elapsed().as_secs_f64();
                let n = progress.load(Ordering::Relaxed);
                pb.set_position(secs as u64);
                pb.set_message(format!("{n} pairs, {:.0}/s", n as f64 / secs.max(1e-3)));
            }
        })
    });
    let result = if let Some(url) = &a.url {
        http_bench(
            url,
            a.token.as_deref(),
            concurrency,
            duration,
            progress,
            stop.clone(),
        )
        .await
        .map(|(stats, errors)| ("http", stats, errors))
    } else {
        let dir = a
            .data
            .clone()
            .expect("clap requires --url, --data or --store");
        let store = open_embedded(&dir)?;
        let prefix = format!("bench-{}", run_id());
        let result = settle_ledger::bench::run_pairs(
            store.clone(),
            settle_core::TenantId::default_tenant(),
            &prefix,
            concurrency,
            duration,
            progress,
        )
        .await;
        store.close();
        result.map(|stats| ("in_process", stats, 0)).map_err(|e| {
            eprintln!("error: {e}");
            EXIT_LOCAL
        })
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.await;
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    result
}

fn open_embedded(dir: &std::path::Path) -> Result<Arc<settle_embedded::EmbeddedStore>, u8> {
    settle_embedded::EmbeddedStore::open(dir, Default::default()).map_err(|e| {
        eprintln!("error: cannot open {}: {e}", dir.display());
        EXIT_LOCAL
    })
}

fn stats_json(mode: &str, s: &settle_ledger::bench::PairStats, errors: u64) -> Value {
    json!({
        "mode": mode,
        "concurrency": s.concurrency,
        "connections": s.concurrency,
        "duration_s": s.duration_s,
        "pairs": s.pairs,
        "pairs_per_s": s.pairs_per_s,
        "p50_ms": s.p50_ms,
        "p99_ms": s.p99_ms,
        "p999_ms": s.p999_ms,
        "max_ms": s.max_ms,
        "errors": errors,
    })
}

fn report(mode: &str, s: &settle_ledger::bench::PairStats, errors: u64, as_json: bool) {
    if as_json {
        println!("{}", stats_json(mode, s, errors));
    } else {
        println!(
            "{mode}: {} pairs in {:.1} s at concurrency {}: {:.0} pairs/s; latency p50 {:.2} ms, \
             p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms; {errors} errors",
            s.pairs,
            s.duration_s,
            s.concurrency,
            s.pairs_per_s,
            s.p50_ms,
            s.p99_ms,
            s.p999_ms,
            s.max_ms
        );
    }
}

/// settle on PostgreSQL against the raw protocol, alternating rounds.
async fn postgres_bench(url: &str, a: &BenchArgs, duration: Duration) -> Result<(), u8> {
    let rows = settle_pg::bench::compare(
        url,
        &settle_pg::PgOptions::default(),
        &a.connections,
        duration,
        Duration::from_secs(1),
        a.rounds,
    )
    .await;
    for r in rows {
        if a.json {
            let mut v = stats_json("postgres", &r.settle, 0);
            v["baseline"] = stats_json("postgres_baseline", &r.baseline, 0);
            v["ratio"] = json!(r.ratio);
            println!("{v}");
        } else {
            report("postgres_baseline", &r.baseline, 0, false);
            report("postgres_settle", &r.settle, 0, false);
            println!(
                "ratio settle/baseline at {} clients: {:.1} %",
                r.clients,
                100.0 * r.ratio
            );
        }
    }
    Ok(())
}

/// This process's resident set size in MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Fills the store with `n` settled records (claim+settle pairs at
/// `concurrency`), reporting RSS at each power of ten from one million and
/// at the end; then closes it and times the reopen.
async fn fill_bench(
    dir: &std::path::Path,
    n: u64,
    concurrency: usize,
    as_json: bool,
) -> Result<(), u8> {
    let store = open_embedded(dir)?;
    let tenant = settle_core::TenantId::default_tenant();
    let prefix = format!("fill-{}", run_id());
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let pb = (n >= 100_000).then(|| {
        let pb = indicatif::ProgressBar::new(n);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} records  {per_sec}  eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (store, tenant, prefix, next, done) = (
            store.clone(),
            tenant.clone(),
            prefix.clone(),
            next.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            use settle_core::testkit::{binding, completed, key};
            use settle_core::{Claim, ClaimDecision, Command, Digest, Reply, Settle};
            use settle_ledger::Store;
            let fp = Digest([9; 32]);
            let b = binding("fill", 0);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), settle_ledger::StoreError>(());
                }
                let k = key(&format!("{prefix}-{i}"));
                let fence = match store
                    .execute(
                        &tenant,
                        Command::Claim(Claim::new(k.clone(), fp, b.clone())),
                    )
                    .await?
                {
                    Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
                    other => panic!("fill key was not fresh: {other:?}"),
                };
                let r = store
                    .execute(
                        &tenant,
                        Command::Settle(Settle {
                            key: k,
                            fence,
                            fingerprint: fp,
                            binding: b.clone(),
                            outcome: completed(1),
                        }),
                    )
                    .await?;
                assert!(matches!(r, Reply::Receipt(_)), "{r:?}");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Sample RSS at each milestone while the fill runs.
    let mut milestone = 1_000_000u64;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let d = done.load(Ordering::Relaxed);
        if let Some(pb) = &pb {
            pb.set_position(d);
        }
        while milestone <= n && d >= milestone {
            let v = json!({"mode": "fill", "records": milestone, "rss_mib": rss_mib(),
                           "resident_entities": store.resident(), "elapsed_s": start.elapsed().as_secs_f64()});
            println!(
                "{}",
                if as_json {
                    v.to_string()
                } else {
                    format!("{v:#}")
                }
            );
            milestone *= 10;
        }
        if d >= n || tasks.iter().all(|t| t.is_finished()) {
            break;
        }
    }
    for t in tasks {
        t.await.expect("fill task").map_err(|e| {
            eprintln!("error: {e}");
            EXIT_LOCAL
        })?;
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let v = json!({"mode": "fill", "records": n, "rss_mib": rss_mib(), "resident_entities": store.resident(),
                   "elapsed_s": elapsed, "pairs_per_s": n as f64 / elapsed});
    println!(
        "{}",
        if as_json {
            v.to_string()
        } else {
            format!("{v:#}")
        }
    );
    store.close();
    drop(store);

    let t0 = Instant::now();
    let store = open_embedded(dir)?;
    let opened = t0.elapsed().as_secs_f64() * 1000.0;
    use settle_ledger::Store;
    let probe = settle_core::Key::new(format!("{prefix}-0")).expect("key");
    let found = matches!(store.get(&tenant, &probe).await, Ok(Ok(Some(_))));
    let first_get = t0.elapsed().as_secs_f64() * 1000.0;
    let v = json!({"mode": "reopen", "records": n, "reopen_ms": opened, "first_get_ms": first_get,
                   "found": found, "rss_mib": rss_mib()});
    println!(
        "{}",
        if as_json {
            v.to_string()
        } else {
            format!("{v:#}")
        }
    );
    store.close();
    if found { Ok(()) } else { Err(EXIT_LOCAL) }
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos ^ ((std::process::id() as u128) << 64))
}

/// `connections` keep-alive connections, each looping claim (fresh key) +
/// settle `completed`, until `duration` has passed.
async fn http_bench(
    url: &str,
    token: Option<&str>,
    connections: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<(settle_ledger::bench::PairStats, u64), u8> {
    let ep = Endpoint::new(url, token).map_err(|e| {
        eprintln!("error: {e}");
        2
    })?;
    let run = run_id();
    let fingerprint = "07".repeat(32);
    let response_sha256 = "65".repeat(32);
    let binding = r#"{"principal":"bench","scopes":["pay"],"generation":0}"#;
    let claim_body: Arc<Vec<u8>> =
        Arc::new(format!(r#"{{"fingerprint":"{fingerprint}","binding":{binding}}}"#).into_bytes());
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(ep.connect().await.map_err(|e| {
            eprintln!("error: {e}");
            EXIT_UNREACHABLE
        })?);
    }
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(connections);
    for (c, mut conn) in conns.into_iter().enumerate() {
        let (stop, progress, errors) = (stop.clone(), progress.clone(), errors.clone());
        let claim_body = claim_body.clone();
        let run = run.clone();
        let fingerprint = fingerprint.clone();
        let response_sha256 = response_sha256.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 16);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("bench-{run}-{c}-{n}");
                n += 1;
                let t0 = Instant::now();
                let Ok(r) = conn
                    .send(Method::POST, &operation_path(&key, "claim"), Some(claim_body.to_vec()))
                    .await
                else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                let fence = match serde_json::from_slice::<ClaimAnswer>(&r.body) {
                    Ok(ClaimAnswer { decision, fence: Some(f) }) if decision == "execute" => f,
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let body = format!(
                    r#"{{"fence":{fence},"fingerprint":"{fingerprint}","binding":{binding},"outcome":{{"status":"completed","result":{{"ok":true}},"response_sha256":"{response_sha256}"}}}}"#
                );
                match conn
                    .send(Method::POST, &operation_path(&key, "settle"), Some(body.into_bytes()))
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
            lat
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let stats = settle_ledger::bench::summarize(connections, start.elapsed(), all);
    Ok((stats, errors.load(Ordering::Relaxed)))
}
