//! The client subcommands: one call of SPEC §7 each, against a running
//! server, through `settle-client` and the wire types of `settle-api`.
//! Without `--json` they print a summary; with it, the server's answer as
//! received.

mod summary;

use clap::Args;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use settle_client::api::{
    Binding, ClaimRequest, DispatchRequest, HeartbeatRequest, Outcome, ReconcileRequest,
    ReleaseRequest, SettleRequest, WarnRequest,
};
use settle_client::{Call, Client, ClientError, calls};

use crate::exit::{self, Failure};
use summary::Summary;

#[derive(Args)]
pub struct Remote {
    /// Server URL.
    #[arg(long, env = "SETTLE_URL", default_value = "http://127.0.0.1:7411")]
    url: String,
    /// Bearer token (not needed when the server runs without tenants on loopback).
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of a CA to trust for an https:// URL (besides the system's roots).
    #[arg(long, env = "SETTLE_CA_CERT", value_name = "FILE")]
    ca_cert: Option<std::path::PathBuf>,
    /// Print the server's JSON answer as received instead of a summary.
    #[arg(long)]
    json: bool,
}

/// A client of `url` with `token`, trusting the CA in `ca_cert` besides
/// the system's roots (shared by the remote commands and `settle backup`).
pub fn client_for(
    url: &str,
    token: Option<&str>,
    ca_cert: Option<&std::path::Path>,
) -> Result<Client, Failure> {
    let mut b = Client::builder(url).token(token.unwrap_or_default());
    if let Some(pem) = read_ca_cert(ca_cert)? {
        if !url.starts_with("https://") {
            eprintln!("warning: --ca-cert is ignored: {url} is not an https:// URL");
        }
        b = b.add_root_certificate_pem(&pem);
    }
    b.build().map_err(Failure::usage)
}

/// The PEM bytes of `--ca-cert FILE`, if given (a usage error when unreadable).
pub fn read_ca_cert(path: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, Failure> {
    path.map(|p| {
        let pem = std::fs::read(p)
            .map_err(|e| Failure::usage(format!("cannot read --ca-cert {}: {e}", p.display())))?;
        if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(Failure::usage(format!(
                "--ca-cert {} holds no PEM certificate (no -----BEGIN CERTIFICATE----- block)",
                p.display()
            )));
        }
        Ok(pem)
    })
    .transpose()
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
    fn wire(&self) -> Binding {
        Binding {
            principal: self.principal.clone(),
            scopes: self.scopes.clone(),
            generation: self.generation,
        }
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
    /// This claim's own id (16-64 of A-Za-z0-9_-, random): send the same id
    /// again only to retry this claim after a lost answer; while the lease
    /// granted to it lives, the retry gets the same grant.
    #[arg(long, value_name = "ID")]
    claim_id: Option<String>,
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
    /// Remove the record as if collected (only a pending record with no
    /// receipt, no reconciliation owed, no dispute and no quarantine): for a
    /// request refused before any work.
    #[arg(long)]
    forget: bool,
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
    /// The operation's idempotency key (or --key-prefix for many).
    #[arg(
        value_name = "KEY",
        required_unless_present = "key_prefix",
        requires = "fence"
    )]
    key: Option<String>,
    /// The fence of the reconcile lease your claim returned.
    #[arg(long, value_name = "FENCE")]
    fence: Option<u64>,
    /// Instead of KEY and --fence: every record that requires
    /// reconciliation and whose key starts with PREFIX ("" for all), each
    /// claimed and reported with --finding not_committed (the only finding
    /// that needs no outcome per record): the next claim of each executes.
    #[arg(long, value_name = "PREFIX", conflicts_with_all = ["key", "fence", "fingerprint", "principal", "status", "result"])]
    key_prefix: Option<String>,
    /// With --key-prefix: do not ask for confirmation.
    #[arg(long, requires = "key_prefix")]
    yes: bool,
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
    /// The operation's idempotency key (1–255 visible ASCII characters).
    #[arg(value_name = "KEY", required_unless_present = "idempotency_key")]
    key: Option<String>,
    /// Instead of KEY: the `Idempotency-Key` header value a client sent to
    /// a settle middleware (quoted or bare); the ledger key is computed as
    /// the middleware does (SPEC §8: `mw-` + SHA-256 of namespace,
    /// principal and key).
    #[arg(
        long,
        value_name = "VALUE",
        conflicts_with = "key",
        requires = "principal"
    )]
    idempotency_key: Option<String>,
    /// With --idempotency-key: the principal the middleware's extractor
    /// gave for that client (its account, not the binding's `sha256:` form).
    #[arg(long, value_name = "PRINCIPAL", requires = "idempotency_key")]
    principal: Option<String>,
    /// With --idempotency-key: the middleware's namespace.
    #[arg(
        long,
        value_name = "NAMESPACE",
        default_value = "default",
        requires = "idempotency_key"
    )]
    namespace: String,
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

#[derive(Args)]
pub struct ListArgs {
    /// Only these statuses (pending, running, unknown, conflict, failed,
    /// completed); repeat or separate with commas. pending includes running.
    #[arg(long, value_delimiter = ',')]
    status: Vec<String>,
    /// Only records that need a human: not terminal, no open lease,
    /// untouched for the server's stuck_after_s.
    #[arg(long)]
    stuck: bool,
    /// Only records that require reconciliation.
    #[arg(long)]
    reconcile_required: bool,
    /// Only disputed records.
    #[arg(long)]
    disputed: bool,
    /// Only records holding quarantined evidence.
    #[arg(long)]
    quarantined: bool,
    /// Only keys starting with this (the scan starts at the prefix).
    #[arg(long, value_name = "PREFIX")]
    key_prefix: Option<String>,
    /// key (default), updated (most recently updated first) or attention
    /// (reconcile required, disputed, stuck, then the rest).
    #[arg(long, value_name = "ORDER", value_parser = ["key", "updated", "attention"])]
    order: Option<String>,
    /// Records per page (1-1000; the server's default is 100).
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Start after this cursor (the `next` a previous page printed).
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    remote: Remote,
}

impl Remote {
    fn client(&self) -> Result<Client, Failure> {
        client_for(&self.url, self.token.as_deref(), self.ca_cert.as_deref())
    }

    /// Sends `call` and prints its answer; the status becomes the exit code.
    async fn run<T: DeserializeOwned + Summary>(
        &self,
        call: Result<Call<T>, ClientError>,
    ) -> Result<(), Failure> {
        let call = call.map_err(Failure::local)?;
        let reply = self
            .client()?
            .send(&call)
            .await
            .map_err(exit::client_failure)?;
        if self.json {
            // The server's answer as sent: a replayed result keeps its exact text.
            println!("{}", String::from_utf8_lossy(&reply.body));
        }
        if !reply.is_success() {
            let code = exit::for_status(reply.status);
            return Err(Failure::new(code, reply.error().to_string()));
        }
        if !self.json {
            call.parse(&reply).map_err(Failure::local)?.print();
        }
        Ok(())
    }
}

/// A value of a wire enum (`completed`, `not_committed`, ...) as the wire
/// spells it. A bad one is refused as invalid (exit 4), as the server
/// would refuse it.
fn wire_value<T: DeserializeOwned>(flag: &str, v: &str) -> Result<T, Failure> {
    serde_json::from_value(serde_json::Value::String(v.to_string()))
        .map_err(|e| Failure::new(exit::INVALID, format!("error: invalid {flag}: {e}")))
}

impl OutcomeArgs {
    /// The outcome; the result is sent as written (raw JSON text): going
    /// through a parsed value would respell numbers before the server
    /// sees them.
    fn wire(&self) -> Result<Outcome, Failure> {
        let result = match &self.result {
            Some(r) => Some(
                RawValue::from_string(r.trim().to_string())
                    .map_err(|e| Failure::usage(format!("--result is not JSON: {e}")))?,
            ),
            None => None,
        };
        Ok(Outcome {
            status: wire_value("--status", &self.status)?,
            result,
            response_sha256: self.response_sha256.clone(),
            error: self.error.clone(),
        })
    }
}

pub async fn claim(a: ClaimArgs) -> Result<(), Failure> {
    let req = ClaimRequest {
        fingerprint: a.fingerprint.clone(),
        binding: a.binding.wire(),
        lease_ms: a.lease_ms,
        worker: a.worker.clone(),
        marks_dispatch: a.marks_dispatch,
        retention_s: a.retention_s,
        claim_id: a.claim_id.clone(),
    };
    a.remote.run(calls::claim(&a.key.key, &req)).await
}

pub async fn heartbeat(a: HeartbeatArgs) -> Result<(), Failure> {
    let req = HeartbeatRequest {
        fence: a.fence.fence,
        lease_ms: a.lease_ms,
    };
    a.remote.run(calls::heartbeat(&a.key.key, &req)).await
}

pub async fn dispatch(a: DispatchArgs) -> Result<(), Failure> {
    let req = DispatchRequest {
        fence: a.fence.fence,
    };
    a.remote.run(calls::dispatch(&a.key.key, &req)).await
}

pub async fn release(a: ReleaseArgs) -> Result<(), Failure> {
    let reason = match &a.reason {
        Some(r) => Some(wire_value("--reason", r)?),
        None => None,
    };
    let req = ReleaseRequest {
        fence: a.fence.fence,
        reason,
        forget: a.forget,
    };
    a.remote.run(calls::release(&a.key.key, &req)).await
}

pub async fn settle(a: SettleArgs) -> Result<(), Failure> {
    let req = SettleRequest {
        fence: a.fence.fence,
        fingerprint: a.fingerprint.clone(),
        binding: a.binding.wire(),
        outcome: a.outcome.wire()?,
    };
    a.remote.run(calls::settle(&a.key.key, &req)).await
}

pub async fn reconcile(a: ReconcileArgs) -> Result<(), Failure> {
    if let Some(prefix) = &a.key_prefix {
        return reconcile_many(&a, prefix).await;
    }
    let (Some(key), Some(fence)) = (&a.key, a.fence) else {
        return Err(Failure::usage("give KEY and --fence, or --key-prefix"));
    };
    let outcome = match &a.status {
        Some(s) => Some(
            OutcomeArgs {
                status: s.clone(),
                result: a.result.clone(),
                response_sha256: a.response_sha256.clone(),
                error: a.error.clone(),
            }
            .wire()?,
        ),
        None => None,
    };
    let req = ReconcileRequest {
        fence,
        finding: wire_value("--finding", &a.finding)?,
        fingerprint: a.fingerprint.clone(),
        binding: a.principal.as_ref().map(|p| Binding {
            principal: p.clone(),
            scopes: a.scopes.clone(),
            generation: a.generation,
        }),
        outcome,
    };
    a.remote.run(calls::reconcile(key, &req)).await
}

/// `settle reconcile --key-prefix P --finding not_committed`: the
/// operator attests that none of these records' effects reached the
/// remote; each is claimed with its stored reservation (the reconciler of
/// SPEC §11.10 with a hook that says `not_committed`), so the next claim of
/// each executes. Asks first, unless `--yes`.
async fn reconcile_many(a: &ReconcileArgs, prefix: &str) -> Result<(), Failure> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if a.finding != "not_committed" {
        return Err(Failure::usage(
            "--key-prefix takes --finding not_committed only (committed needs an outcome per record: reconcile one KEY at a time)",
        ));
    }
    let client = a.remote.client()?;
    let keys = reconcile_required_keys(&client, prefix).await?;
    if keys.is_empty() {
        if a.remote.json {
            println!(
                "{}",
                serde_json::json!({"seen": 0, "not_committed": 0, "skipped": 0, "errors": 0, "keys": []})
            );
        } else {
            println!("no record whose key starts with {prefix:?} requires reconciliation");
        }
        return Ok(());
    }
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::usage(format!(
                "{} records would be reconciled as not_committed; add --yes to do it without a terminal to confirm on",
                keys.len()
            )));
        }
        eprint!(
            "{} records whose key starts with {prefix:?} require reconciliation ({}{}).\n\
             Report each as not_committed (nothing reached the remote), so that its next claim executes again? [y/N] ",
            keys.len(),
            keys.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if keys.len() > 3 { ", ..." } else { "" },
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err(Failure::usage("not confirmed; nothing was changed"));
        }
    }
    let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let asked = done.clone();
    let sweep = settle_worker::Reconciler::new(client)
        .hook(
            prefix,
            move |key: settle_core::Key, _fence: settle_core::Fence| {
                asked
                    .lock()
                    .expect("not poisoned")
                    .push(key.as_str().to_string());
                async { Ok::<_, settle_worker::BoxError>(settle_worker::Finding::NotCommitted) }
            },
        )
        .sweep()
        .await;
    let done = done.lock().expect("not poisoned").clone();
    if a.remote.json {
        println!(
            "{}",
            serde_json::json!({
                "seen": sweep.seen, "not_committed": sweep.not_committed,
                "skipped": sweep.skipped, "errors": sweep.errors, "keys": done,
            })
        );
    } else {
        for k in &done {
            println!("not_committed  {k}");
        }
        println!(
            "{} reconciled as not_committed, {} skipped (resolved meanwhile or held by a live lease), {} errors",
            sweep.not_committed, sweep.skipped, sweep.errors
        );
    }
    if sweep.errors > 0 {
        return Err(Failure::new(
            crate::exit::UNAVAILABLE,
            format!(
                "{} records could not be reconciled (see the log with SETTLE_LOG=warn)",
                sweep.errors
            ),
        ));
    }
    Ok(())
}

/// Every key that requires reconciliation and starts with `prefix`.
async fn reconcile_required_keys(client: &Client, prefix: &str) -> Result<Vec<String>, Failure> {
    let mut keys = Vec::new();
    let mut after = None;
    loop {
        let params = settle_client::ListParams {
            reconcile_required: Some(true),
            key_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            after: after.take(),
            limit: Some(1000),
            ..Default::default()
        };
        let page = client.list(&params).await.map_err(client_failure)?;
        keys.extend(page.operations.into_iter().map(|o| o.key));
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(keys),
        }
    }
}

use exit::client_failure;

pub async fn get(a: GetArgs) -> Result<(), Failure> {
    let key = match (&a.key, &a.idempotency_key, &a.principal) {
        (Some(k), None, _) => k.clone(),
        (None, Some(header), Some(principal)) => {
            let key = settle_middleware::layout::parse_idempotency_key(&[header.as_bytes()])
                .map_err(|e| Failure::usage(format!("--idempotency-key: {e}")))?
                .ok_or_else(|| Failure::usage("--idempotency-key: empty"))?;
            let ledger_key = settle_middleware::layout::ledger_key(&a.namespace, principal, &key);
            if !a.remote.json {
                eprintln!("ledger key: {ledger_key}");
            }
            ledger_key
        }
        _ => {
            return Err(Failure::usage(
                "give KEY, or --idempotency-key with --principal",
            ));
        }
    };
    a.remote.run(Ok(calls::get(&key))).await
}

pub async fn revoke(a: RevokeArgs) -> Result<(), Failure> {
    a.remote.run(calls::revoke(&a.principal)).await
}

pub async fn warn(a: WarnArgs) -> Result<(), Failure> {
    let req = WarnRequest {
        detail: a.detail.clone(),
    };
    a.remote.run(calls::warn(&a.task, &a.class, &req)).await
}

pub async fn warnings(a: WarningsArgs) -> Result<(), Failure> {
    a.remote.run(Ok(calls::warnings(&a.task))).await
}

pub async fn list(a: ListArgs) -> Result<(), Failure> {
    let yes = |b: bool| b.then_some(true);
    let params = settle_client::ListParams {
        status: a.status,
        reconcile_required: yes(a.reconcile_required),
        disputed: yes(a.disputed),
        stuck: yes(a.stuck),
        quarantined: yes(a.quarantined),
        key_prefix: a.key_prefix,
        order: a.order,
        limit: a.limit,
        after: a.cursor,
    };
    a.remote.run(Ok(calls::list(&params))).await
}

pub async fn stats(a: StatsArgs) -> Result<(), Failure> {
    a.remote.run(Ok(calls::stats())).await
}
