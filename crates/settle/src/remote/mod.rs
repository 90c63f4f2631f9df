//! The client subcommands: one call of SPEC §7 each, against a running
//! server. Without `--json` they print a summary; with it, the server's
//! answer as received.

mod summary;

use clap::Args;
use hyper::Method;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use settle::client::{Endpoint, HttpReply, encode_segment, operation_path};

use crate::exit::{self, Failure};

/// Where the server is, and how to print its answer.
#[derive(Args)]
pub struct Remote {
    /// Server URL.
    #[arg(long, env = "SETTLE_URL", default_value = "http://127.0.0.1:7411")]
    url: String,
    /// Bearer token (not needed when the server runs without tenants on loopback).
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the server's JSON answer as received instead of a summary.
    #[arg(long)]
    json: bool,
}

/// The operation's idempotency key.
#[derive(Args)]
pub struct KeyArg {
    /// The operation's idempotency key (1–255 visible ASCII characters).
    #[arg(value_name = "KEY")]
    key: String,
}

/// The lease a call acts under.
#[derive(Args)]
pub struct FenceArg {
    /// The fence your claim returned (`fence=` in its output).
    #[arg(long, value_name = "FENCE")]
    fence: u64,
}

#[derive(Args)]
pub struct BindingArgs {
    /// The principal the operation runs as (the binding's principal).
    #[arg(long, value_name = "PRINCIPAL")]
    principal: String,
    /// A scope of the binding (repeatable: --scope a --scope b).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// The principal's generation the binding was issued under.
    #[arg(long, value_name = "N", default_value_t = 0)]
    generation: u64,
}

impl BindingArgs {
    fn json(&self) -> Value {
        json!({"principal": self.principal, "scopes": self.scopes, "generation": self.generation})
    }
}

#[derive(Args)]
pub struct OutcomeArgs {
    /// completed, failed or unknown.
    #[arg(long, value_name = "STATUS")]
    status: String,
    /// The result as a JSON document (completed/failed; `null` is one),
    /// sent as written: the server keeps its exact text.
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// SHA-256 (hex) of the upstream's raw response (completed/failed;
    /// optional with unknown).
    #[arg(long, value_name = "HEX")]
    response_sha256: Option<String>,
    /// Error text (any text; kept on the attempt, also with unknown).
    #[arg(long, value_name = "TEXT")]
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
    fn body(&self) -> Result<OutcomeBody, Failure> {
        let result = match &self.result {
            Some(r) => Some(
                RawValue::from_string(r.trim().to_string())
                    .map_err(|e| Failure::usage(format!("--result is not JSON: {e}")))?,
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

#[derive(Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    key: KeyArg,
    /// Lowercase hex SHA-256 of the request's effect-defining fields (the
    /// same on every retry of the same request).
    #[arg(long, value_name = "HEX")]
    fingerprint: String,
    #[command(flatten)]
    binding: BindingArgs,
    /// Lease duration in milliseconds (server default 30000).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,
    /// Free text naming the worker (shown in the record).
    #[arg(long, value_name = "TEXT")]
    worker: Option<String>,
    /// The worker will call `dispatch` before the remote write.
    #[arg(long)]
    marks_dispatch: bool,
    /// Keep the settled record this many seconds (server default 86400).
    #[arg(long, value_name = "SECONDS")]
    retention_s: Option<u64>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct HeartbeatArgs {
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    fence: FenceArg,
    /// New lease duration from now, in milliseconds (default: the lease's
    /// original duration).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct DispatchArgs {
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    fence: FenceArg,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    fence: FenceArg,
    /// not_dispatched (default): the claim used --marks-dispatch and
    /// dispatch was never called. not_committed: the remote definitively
    /// refused the effect (a validation error, 409, 425, 429); allowed
    /// after dispatch.
    #[arg(long, value_parser = ["not_dispatched", "not_committed"])]
    reason: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct SettleArgs {
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    fence: FenceArg,
    /// The claim's fingerprint (lowercase hex SHA-256).
    #[arg(long, value_name = "HEX")]
    fingerprint: String,
    #[command(flatten)]
    binding: BindingArgs,
    #[command(flatten)]
    outcome: OutcomeArgs,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    key: KeyArg,
    /// The fence of the reconcile lease your claim returned.
    #[arg(long, value_name = "FENCE")]
    fence: u64,
    /// What reconciliation found: committed, not_committed or unavailable.
    #[arg(long, value_name = "FINDING")]
    finding: String,
    /// committed: the claim's fingerprint.
    #[arg(long, value_name = "HEX")]
    fingerprint: Option<String>,
    /// committed: the binding's principal.
    #[arg(long, value_name = "PRINCIPAL")]
    principal: Option<String>,
    /// committed: a scope of the binding (repeatable).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// committed: the binding's generation.
    #[arg(long, value_name = "N", default_value_t = 0)]
    generation: u64,
    /// committed: the outcome found, completed or failed.
    #[arg(long, value_name = "STATUS")]
    status: Option<String>,
    /// committed: the result as a JSON document, sent as written.
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// committed: SHA-256 (hex) of the upstream's raw response.
    #[arg(long, value_name = "HEX")]
    response_sha256: Option<String>,
    /// committed: error text kept on the attempt.
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct RevokeArgs {
    /// The principal whose generation is raised.
    #[arg(value_name = "PRINCIPAL")]
    principal: String,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct WarnArgs {
    /// The task the warning is about (1–255 visible ASCII characters).
    #[arg(value_name = "TASK")]
    task: String,
    /// The warning's class within the task (at most 64 per task).
    #[arg(value_name = "CLASS")]
    class: String,
    /// Replaces the stored detail; omitted keeps it.
    #[arg(long, value_name = "TEXT")]
    detail: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct WarningsArgs {
    /// The task whose warnings are listed.
    #[arg(value_name = "TASK")]
    task: String,
    #[command(flatten)]
    remote: Remote,
}

fn post<'a>(a: &'a Remote, path: &str, body: &impl serde::Serialize) -> Call<'a> {
    Call {
        remote: a,
        method: Method::POST,
        path: path.to_string(),
        body: Some(serde_json::to_vec(body).unwrap_or_default()),
    }
}

pub async fn claim(a: ClaimArgs) -> Result<(), Failure> {
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
    post(&a.remote, &operation_path(&a.key.key, "claim"), &body)
        .run()
        .await
}

pub async fn heartbeat(a: HeartbeatArgs) -> Result<(), Failure> {
    let mut body = json!({"fence": a.fence.fence});
    if let Some(v) = a.lease_ms {
        body["lease_ms"] = json!(v);
    }
    post(&a.remote, &operation_path(&a.key.key, "heartbeat"), &body)
        .run()
        .await
}

pub async fn dispatch(a: DispatchArgs) -> Result<(), Failure> {
    let body = json!({"fence": a.fence.fence});
    post(&a.remote, &operation_path(&a.key.key, "dispatch"), &body)
        .run()
        .await
}

pub async fn release(a: ReleaseArgs) -> Result<(), Failure> {
    let mut body = json!({"fence": a.fence.fence});
    if let Some(r) = &a.reason {
        body["reason"] = json!(r);
    }
    post(&a.remote, &operation_path(&a.key.key, "release"), &body)
        .run()
        .await
}

#[derive(serde::Serialize)]
struct SettleBody {
    fence: u64,
    fingerprint: String,
    binding: Value,
    outcome: OutcomeBody,
}

pub async fn settle(a: SettleArgs) -> Result<(), Failure> {
    let body = SettleBody {
        fence: a.fence.fence,
        fingerprint: a.fingerprint.clone(),
        binding: a.binding.json(),
        outcome: a.outcome.body()?,
    };
    post(&a.remote, &operation_path(&a.key.key, "settle"), &body)
        .run()
        .await
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

pub async fn reconcile(a: ReconcileArgs) -> Result<(), Failure> {
    let outcome = match &a.status {
        Some(s) => Some(
            OutcomeArgs {
                status: s.clone(),
                result: a.result.clone(),
                response_sha256: a.response_sha256.clone(),
                error: a.error.clone(),
            }
            .body()?,
        ),
        None => None,
    };
    let body = ReconcileBody {
        fence: a.fence,
        finding: a.finding.clone(),
        fingerprint: a.fingerprint.clone(),
        binding: a
            .principal
            .as_ref()
            .map(|p| json!({"principal": p, "scopes": a.scopes, "generation": a.generation})),
        outcome,
    };
    post(&a.remote, &operation_path(&a.key.key, "reconcile"), &body)
        .run()
        .await
}

pub async fn get(a: GetArgs) -> Result<(), Failure> {
    Call {
        remote: &a.remote,
        method: Method::GET,
        path: operation_path(&a.key.key, ""),
        body: None,
    }
    .run()
    .await
}

pub async fn revoke(a: RevokeArgs) -> Result<(), Failure> {
    let path = format!("/v1/principals/{}/revoke", encode_segment(&a.principal));
    post(&a.remote, &path, &json!({})).run().await
}

pub async fn warn(a: WarnArgs) -> Result<(), Failure> {
    let path = format!(
        "/v1/tasks/{}/warnings/{}",
        encode_segment(&a.task),
        encode_segment(&a.class)
    );
    let body = match &a.detail {
        Some(d) => json!({"detail": d}),
        None => json!({}),
    };
    post(&a.remote, &path, &body).run().await
}

pub async fn warnings(a: WarningsArgs) -> Result<(), Failure> {
    Call {
        remote: &a.remote,
        method: Method::GET,
        path: format!("/v1/tasks/{}/warnings", encode_segment(&a.task)),
        body: None,
    }
    .run()
    .await
}

/// One request, its answer printed; the status mapped to an exit code.
struct Call<'a> {
    remote: &'a Remote,
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
}

impl Call<'_> {
    async fn run(self) -> Result<(), Failure> {
        let r = self.remote;
        let ep = Endpoint::new(&r.url, r.token.as_deref()).map_err(Failure::usage)?;
        let reply = ep
            .send(self.method, &self.path, self.body)
            .await
            .map_err(Failure::unreachable)?;
        if reply.is_success() {
            if r.json {
                // The server's answer as sent: a replayed result keeps its exact text.
                println!("{}", String::from_utf8_lossy(&reply.body));
            } else {
                summary::print(&reply.json(), summary::raw_result(&reply.body).as_deref());
            }
            return Ok(());
        }
        if r.json {
            println!("{}", String::from_utf8_lossy(&reply.body));
        }
        Err(Failure::new(
            exit::for_status(reply.status),
            error_line(&reply),
        ))
    }
}

/// One line for an error answer: what kind of failure, the status and the
/// code once, then the detail (`refused (409 stale_fence): the fence does
/// not hold the current lease`).
fn error_line(reply: &HttpReply) -> String {
    let v = reply.json();
    let code = v["code"].as_str().unwrap_or("error");
    let detail = v["detail"].as_str().unwrap_or("");
    // The server's detail may begin with the code itself; say it once.
    let detail = detail
        .strip_prefix(code)
        .and_then(|d| d.strip_prefix(": "))
        .unwrap_or(detail);
    let kind = match reply.status {
        409 => "refused",
        s if s >= 500 => "unavailable",
        _ => "invalid",
    };
    let mut line = format!("{kind} ({} {code}): {detail}", reply.status);
    if let Some(id) = v["correlation_id"].as_str()
        && !detail.contains(id)
    {
        line.push_str(&format!(" (correlation_id {id})"));
    }
    line
}
