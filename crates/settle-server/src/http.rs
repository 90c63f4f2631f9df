//! The routes of SPEC §7. Handlers only translate between the wire and the
//! core's `Command`/`Reply`; every decision is the rules'.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::response::Response;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use settle_api as api;
use settle_core::{
    ClaimDecision, Command, Key, Principal, RefusalCode, Reply, RetentionS, Revoke, TaskId,
    TenantId, WarningClass,
};
use settle_ledger::{Store, StoreError};
use tracing::{Instrument as _, debug, error, warn};

use crate::live::Live;
use crate::metrics as m;
use crate::openapi::V1Errors;
use crate::problem::{PROBLEM_JSON, Problem};
use crate::wire::{parse_body, segment};
use arc_swap::ArcSwap;

/// Everything a handler needs; built once, shared by reference.
pub struct AppState {
    /// The ledger's store; handlers run commands on it.
    pub store: Arc<dyn Store>,
    /// The reloadable configuration (SPEC §12 "Reload"): a request loads
    /// it once ([`AppState::live`]) and runs under it to its end.
    live: ArcSwap<Live>,
    /// The record counts behind `max_records`.
    pub records: crate::quota::RecordCounts,
    /// Larger outcome results are answered 422 (fixed at start: the store
    /// was opened with the same limit).
    pub max_result_bytes: usize,
    /// How long a request body may take to arrive (408 past it).
    pub body_timeout: Duration,
    /// The Prometheus recorder; `None` when another recorder was installed first.
    pub metrics: Option<PrometheusHandle>,
    /// The OpenAPI document served at `/openapi.json`, rendered once.
    pub openapi: Bytes,
    /// False once shutdown began (`/readyz` answers 503).
    pub ready: AtomicBool,
    /// The gauges that scan the store, refreshed at most once per interval.
    pub gauges: crate::metrics::Gauges,
}

impl AppState {
    /// The state for `config`, over `store`; installs the metrics recorder once per process.
    pub fn new(store: Arc<dyn Store>, config: &crate::config::Config) -> AppState {
        AppState {
            store,
            live: ArcSwap::from_pointee(Live::new(config, None)),
            records: crate::quota::RecordCounts::default(),
            max_result_bytes: config.max_result_bytes,
            body_timeout: Duration::from_millis(config.request_timeout_ms),
            metrics: m::install(),
            openapi: Bytes::from(crate::openapi::document(config.lease_margin_ms)),
            ready: AtomicBool::new(true),
            gauges: crate::metrics::Gauges::new(Duration::from_millis(config.metrics_refresh_ms)),
        }
    }

    /// The configuration a request runs under, from its start to its end.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Swaps in the reloadable part of `config` (tenants, tokens, admin,
    /// limits, quotas); requests in flight keep the one they started with.
    pub fn reload(&self, config: &crate::config::Config) {
        let previous = self.live.load_full();
        self.live
            .store(Arc::new(Live::new(config, Some(&previous))));
    }
}

type St = State<Arc<AppState>>;

/// The router over a shared state.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/operations/{key}/claim", post(claim))
        .route("/v1/operations/{key}/heartbeat", post(heartbeat))
        .route("/v1/operations/{key}/dispatch", post(dispatch))
        .route("/v1/operations/{key}/settle", post(settle))
        .route("/v1/operations/{key}/release", post(release))
        .route("/v1/operations/{key}/reconcile", post(reconcile))
        .route("/v1/operations", get(crate::inspect::list))
        .route("/v1/stats", get(crate::inspect::stats))
        .route("/v1/operations/{key}", get(get_record))
        .route("/v1/principals/{principal}", get(principal))
        .route("/v1/principals/{principal}/revoke", post(revoke))
        .route("/v1/tasks/{task}/warnings/{class}", post(warn))
        .route("/v1/tasks/{task}/warnings", get(warnings))
        .route("/v1/batch", post(crate::batch::batch))
        .route(api::EXPORT_PATH, get(crate::admin::export))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route("/console", get(crate::inspect::console_redirect))
        .route("/console/", get(crate::inspect::console))
        .route("/console/{file}", get(crate::inspect::console))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

// ---- plumbing ----

/// A response body's bytes.
fn json_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Room for a receipt (~350 bytes): serde_json's 128 grew twice.
    let mut out = Vec::with_capacity(512);
    serde_json::to_writer(&mut out, value).expect("responses always serialize");
    out
}

fn json<T: Serialize + ?Sized>(value: &T) -> Response {
    json_response(json_bytes(value))
}

fn json_response(mut body: Vec<u8>) -> Response {
    // A body ends with a newline, so a terminal shows the prompt after it.
    body.push(b'\n');
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The answer to settle and to `reconcile(committed)`.
fn receipt(r: &settle_core::Receipt) -> Vec<u8> {
    json_bytes(&api::ReceiptResponse { receipt: r.into() })
}

/// Counts the request and turns an error into problem+json.
pub(crate) fn finish(route: Route, result: Result<Response, Problem>) -> Response {
    let resp = match result {
        Ok(r) => r,
        Err(p) => p.into_response(),
    };
    m::count_request(route as usize, resp.status().as_u16());
    resp
}

/// Index into [`m::ROUTES`] (the `route` label).
#[derive(Clone, Copy)]
pub(crate) enum Route {
    Claim,
    Heartbeat,
    Dispatch,
    Settle,
    Release,
    Reconcile,
    Get,
    Revoke,
    Warn,
    Warnings,
    List,
    Stats,
    Healthz,
    Readyz,
    Metrics,
    Openapi,
    Unmatched,
    Batch,
    Principal,
    AdminExport,
}

/// The reply does not fit the command: a bug, answered 503 (never 500).
fn unexpected(call: &str, reply: &Reply) -> Problem {
    let correlation_id = crate::problem::correlation_id();
    error!(
        call,
        %correlation_id,
        reply = reply.label(),
        "the rules answered with an unexpected reply"
    );
    let mut p = Problem::unavailable(format!(
        "internal error (the server log has it under correlation_id {correlation_id})"
    ));
    p.correlation_id = Some(correlation_id);
    p
}

/// A storage failure: counted, logged with its cause under a fresh
/// correlation id, answered without the cause (SPEC §7).
pub(crate) fn store_error(call: &'static str, key: Option<&Key>, e: &StoreError) -> Problem {
    metrics::counter!(m::STORE_ERRORS, "call" => call).increment(1);
    let correlation_id = crate::problem::correlation_id();
    error!(call, key = key.map(tracing::field::display), %correlation_id, error = %e, "store failure");
    Problem::store_failure(e, correlation_id)
}

/// The raw (still percent-encoded) path segment number `n` (0 = `v1`).
fn raw_segment(parts: &Parts, n: usize) -> &str {
    parts.uri.path().split('/').nth(n + 1).unwrap_or("")
}

/// What a command's answer is counted and logged with (the store consumes the command).
pub(crate) struct Sent {
    call: &'static str,
    fence: Option<settle_core::Fence>,
    key: Option<Key>,
    /// Settle and reconcile carry evidence that may be quarantined; the
    /// rule that says so needs the command.
    evidence: Option<Command>,
}

impl AppState {
    /// The request body, refused with 413 beyond `limit` bytes.
    pub(crate) async fn body_up_to(
        &self,
        parts: &Parts,
        body: Body,
        limit: usize,
    ) -> Result<Bytes, Problem> {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(Problem::payload_too_large(limit));
        }
        match tokio::time::timeout(self.body_timeout, axum::body::to_bytes(body, limit)).await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => {
                // The limit error is wrapped by axum; look for it down the source chain.
                let too_large =
                    std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |s| {
                        s.source()
                    })
                    .any(|s| s.is::<http_body_util::LengthLimitError>());
                if too_large {
                    Err(Problem::payload_too_large(limit))
                } else {
                    Err(Problem::bad_request(format!(
                        "could not read the request body: {e}"
                    )))
                }
            }
            Err(_) => Err(Problem::request_timeout()),
        }
    }

    /// Runs one command and keeps the counters. Refusals become problems.
    async fn execute(&self, tenant: &TenantId, cmd: Command) -> Result<Reply, Problem> {
        let sent = self.prepare(&cmd)?;
        let result = if crate::trace::on() {
            self.store
                .execute(tenant, cmd)
                .instrument(crate::trace::commit_span(sent.call))
                .await
        } else {
            self.store.execute(tenant, cmd).await
        };
        self.answer(sent, result)
    }

    /// Checks the server's limits on a command about to be sent to the store.
    pub(crate) fn prepare(&self, cmd: &Command) -> Result<Sent, Problem> {
        cmd.check_limits(self.max_result_bytes)?;
        Ok(Sent {
            call: cmd.name(),
            fence: cmd.fence(),
            key: match cmd.target() {
                settle_core::Target::Record(k) => Some(k.clone()),
                _ => None,
            },
            evidence: matches!(cmd, Command::Settle(_) | Command::Reconcile(_))
                .then(|| cmd.clone()),
        })
    }

    /// Counts and logs the store's answer to a sent command; refusals and
    /// failures become problems.
    pub(crate) fn answer(
        &self,
        sent: Sent,
        result: Result<Reply, StoreError>,
    ) -> Result<Reply, Problem> {
        let Sent {
            call,
            fence,
            key,
            evidence,
        } = sent;
        let reply = match result {
            Ok(r) => r,
            Err(e) => {
                debug!(
                    call,
                    key = key.as_ref().map(tracing::field::display),
                    fence = fence.map(tracing::field::display),
                    "store failure"
                );
                return Err(store_error(call, key.as_ref(), &e));
            }
        };
        let decision = reply.label();
        m::count_decision(call, decision);
        if crate::trace::on() {
            crate::trace::record("decision", decision);
            // A claim's fence is in its answer; the other calls carry theirs.
            let granted = match &reply {
                Reply::Claim(ClaimDecision::Execute(g) | ClaimDecision::Reconcile(g)) => {
                    Some(g.fence)
                }
                _ => None,
            };
            if let Some(f) = fence.or(granted) {
                crate::trace::record("fence", tracing::field::display(f));
            }
        }
        if let Some(ev) = &evidence
            && reply.quarantined(ev)
        {
            metrics::counter!(m::QUARANTINED, "call" => call).increment(1);
            warn!(
                call,
                key = key.as_ref().map(tracing::field::display),
                fence = fence.map(tracing::field::display),
                code = decision,
                "evidence quarantined"
            );
        }
        if matches!(reply, Reply::Refused(RefusalCode::ResultMismatch)) {
            metrics::counter!(m::DISPUTED).increment(1);
            warn!(
                call,
                key = key.as_ref().map(tracing::field::display),
                fence = fence.map(tracing::field::display),
                "disputed: terminal results disagree"
            );
        }
        debug!(
            call,
            key = key.as_ref().map(tracing::field::display),
            fence = fence.map(tracing::field::display),
            decision,
            "ledger call"
        );
        match reply {
            Reply::Refused(code) => Err(Problem::refusal(code)),
            // An argument rule of the store's limits (e.g. lease_ms not
            // above lease_margin_ms): 422, nothing written.
            Reply::Invalid(e) => Err(e.into()),
            r => Ok(r),
        }
    }
}

/// The operation calls on a key (SPEC §7): their routes and the batch
/// (SPEC §10) turn a request body into a command and a reply into a
/// response body through the same functions, so both answer alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyOp {
    Claim,
    Heartbeat,
    Dispatch,
    Settle,
    Release,
    Reconcile,
}

impl KeyOp {
    fn route(self) -> Route {
        match self {
            KeyOp::Claim => Route::Claim,
            KeyOp::Heartbeat => Route::Heartbeat,
            KeyOp::Dispatch => Route::Dispatch,
            KeyOp::Settle => Route::Settle,
            KeyOp::Release => Route::Release,
            KeyOp::Reconcile => Route::Reconcile,
        }
    }

    /// The command a request body asks for (400/422 when it does not parse).
    /// `default_retention` is the server's (a claim without `retention_s`).
    /// `bindings`: the batch's cache of converted bindings (`None` for a
    /// single call: nothing to share, and a cache costs a copy).
    pub(crate) fn command(
        self,
        default_retention: RetentionS,
        key: Key,
        body: &[u8],
        bindings: Option<&mut api::BindingCache>,
    ) -> Result<Command, Problem> {
        Ok(match self {
            KeyOp::Claim => {
                let req = parse_body::<api::ClaimRequest>(body)?;
                Command::Claim(match bindings {
                    Some(c) => req.into_claim_cached(key, default_retention, c)?,
                    None => req.into_claim(key, default_retention)?,
                })
            }
            KeyOp::Heartbeat => {
                Command::Heartbeat(parse_body::<api::HeartbeatRequest>(body)?.into_heartbeat(key)?)
            }
            KeyOp::Dispatch => {
                Command::Dispatch(parse_body::<api::DispatchRequest>(body)?.into_dispatch(key)?)
            }
            KeyOp::Settle => {
                let req = parse_body::<api::SettleRequest>(body)?;
                Command::Settle(match bindings {
                    Some(c) => req.into_settle_cached(key, c)?,
                    None => req.into_settle(key)?,
                })
            }
            KeyOp::Release => {
                Command::Release(parse_body::<api::ReleaseRequest>(body)?.into_release(key)?)
            }
            KeyOp::Reconcile => {
                Command::Reconcile(parse_body::<api::ReconcileRequest>(body)?.into_reconcile(key)?)
            }
        })
    }

    /// The response body of a reply (a reply that does not fit the call is a bug: 503).
    pub(crate) fn body(self, reply: Reply) -> Result<Vec<u8>, Problem> {
        match (self, reply) {
            (KeyOp::Claim, Reply::Claim(d)) => Ok(json_bytes(&api::ClaimDecision::from(&d))),
            (KeyOp::Heartbeat, Reply::Heartbeat(l)) => Ok(json_bytes(&api::LeaseInfo::from(&l))),
            (KeyOp::Dispatch, Reply::Dispatched(l)) => Ok(json_bytes(&api::Dispatched::from(&l))),
            (KeyOp::Settle | KeyOp::Reconcile, Reply::Receipt(r)) => Ok(receipt(&r)),
            (KeyOp::Release | KeyOp::Reconcile, Reply::Released { fence }) => {
                Ok(json_bytes(&api::Released::new(fence)))
            }
            (KeyOp::Reconcile, Reply::Claim(d @ ClaimDecision::Execute(_))) => {
                Ok(json_bytes(&api::ClaimDecision::from(&d)))
            }
            (op, r) => Err(unexpected(op.name(), &r)),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            KeyOp::Claim => "claim",
            KeyOp::Heartbeat => "heartbeat",
            KeyOp::Dispatch => "dispatch",
            KeyOp::Settle => "settle",
            KeyOp::Release => "release",
            KeyOp::Reconcile => "reconcile",
        }
    }
}

/// One operation call on its route: authenticate, decode the key segment,
/// read and parse the body, run the command, answer.
async fn key_call(st: &AppState, req: Request, op: KeyOp) -> Response {
    let result = async {
        let (parts, body) = req.into_parts();
        let live = st.live();
        let tenant = live.admit(&parts.headers)?;
        let key: Key = segment("key", raw_segment(&parts, 2))?;
        crate::trace::record("key", key.as_str());
        let bytes = st.body_up_to(&parts, body, live.max_body_bytes).await?;
        // `max_records` (SPEC §12) is checked before the rules, for a claim
        // that would create a record.
        let max_records = match op {
            KeyOp::Claim => live.max_records(tenant),
            _ => None,
        };
        if let Some(max) = max_records
            && st.records.headroom(&*st.store, tenant, max).await? == 0
        {
            crate::quota::RecordCounts::existing_or_refuse(&*st.store, tenant, &key, max).await?;
        }
        let cmd = op.command(live.default_retention, key, &bytes, None)?;
        let reply = st.execute(tenant, cmd).await?;
        if max_records.is_some() && crate::quota::creates_record(&reply) {
            st.records.created(tenant, 1);
        }
        Ok(json_response(op.body(reply)?))
    }
    .await;
    finish(op.route(), result)
}

/// The `get` answer for a key (shared with the batch).
pub(crate) fn record_body(
    key: &Key,
    found: Result<Result<Option<settle_core::Record>, RefusalCode>, StoreError>,
) -> Result<Vec<u8>, Problem> {
    match found {
        Ok(Ok(Some(record))) => Ok(json_bytes(&api::RecordView::from(&record))),
        Ok(Ok(None)) => Err(Problem::refusal(RefusalCode::NotFound)),
        Ok(Err(code)) => Err(Problem::refusal(code)),
        Err(e) => Err(store_error("get", Some(key), &e)),
    }
}

// ---- operations ----

/// Reserve the key and get permission to execute (SPEC §4 claim).
#[utoipa::path(
    post, path = "/v1/operations/{key}/claim", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key, one percent-encoded segment")),
    request_body = api::ClaimRequest,
    responses(
        (status = 200, description = "execute, reconcile, in_flight or replay", body = api::ClaimDecision),
        (status = 409, description = "fingerprint_mismatch, binding_mismatch, stale_binding", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn claim(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Claim).await
}

/// Extend the lease held by `fence`.
#[utoipa::path(
    post, path = "/v1/operations/{key}/heartbeat", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    request_body = api::HeartbeatRequest,
    responses(
        (status = 200, description = "success", body = api::LeaseInfo),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "stale_fence, lease_expired", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn heartbeat(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Heartbeat).await
}

/// Record durably that the remote write is about to start.
#[utoipa::path(
    post, path = "/v1/operations/{key}/dispatch", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    request_body = api::DispatchRequest,
    responses(
        (status = 200, description = "success", body = api::Dispatched),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "stale_fence, lease_expired, wrong_purpose", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn dispatch(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Dispatch).await
}

/// Record the outcome and release the lease in one durable commit.
#[utoipa::path(
    post, path = "/v1/operations/{key}/settle", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    request_body = api::SettleRequest,
    responses(
        (status = 200, description = "success", body = api::ReceiptResponse),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "stale_fence, lease_expired, wrong_purpose, fingerprint_mismatch, binding_mismatch, stale_binding, result_mismatch", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn settle(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Settle).await
}

/// Release an execute lease that never dispatched.
#[utoipa::path(
    post, path = "/v1/operations/{key}/release", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    request_body = api::ReleaseRequest,
    responses(
        (status = 200, description = "success", body = api::Released),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "receipt_required, stale_fence, lease_expired, wrong_purpose", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn release(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Release).await
}

/// Report what a reconciling worker found out about the remote effect.
#[utoipa::path(
    post, path = "/v1/operations/{key}/reconcile", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    request_body = api::ReconcileRequest,
    responses(
        (status = 200, description = "not_committed: execute; committed: receipt; unavailable: released", body = api::ReconcileResponse),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "stale_fence, lease_expired, wrong_purpose, fingerprint_mismatch, binding_mismatch, stale_binding, result_mismatch", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn reconcile(State(st): St, req: Request) -> Response {
    key_call(&st, req, KeyOp::Reconcile).await
}

/// The tenant's inspection view of one operation.
#[utoipa::path(
    get, path = "/v1/operations/{key}", tag = "operations",
    params(("key" = api::Token, Path, description = "The idempotency key")),
    responses(
        (status = 200, description = "success", body = api::RecordView),
        (status = 404, description = "not_found: unknown key", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn get_record(State(st): St, req: Request) -> Response {
    finish(Route::Get, get_inner(&st, req).await)
}

async fn get_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, _body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let key: Key = segment("key", raw_segment(&parts, 2))?;
    let found = st.store.get(tenant, &key).await;
    Ok(json_response(record_body(&key, found)?))
}

/// A principal's current generation (0 for one never seen): what a
/// reconciler claims with (SPEC §7, §11.10).
#[utoipa::path(
    get, path = "/v1/principals/{principal}", tag = "principals",
    params(("principal" = api::Token, Path, description = "The principal, one percent-encoded segment")),
    responses(
        (status = 200, description = "success", body = api::PrincipalGeneration),
        V1Errors,
    )
)]
pub async fn principal(State(st): St, req: Request) -> Response {
    finish(Route::Principal, principal_inner(&st, req).await)
}

async fn principal_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, _body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let principal: Principal = segment("principal", raw_segment(&parts, 2))?;
    match st.store.generation(tenant, &principal).await {
        Ok(Ok(generation)) => Ok(json(&api::PrincipalGeneration {
            principal: principal.to_string(),
            generation,
        })),
        Ok(Err(code)) => Err(Problem::refusal(code)),
        Err(e) => Err(store_error("principal", None, &e)),
    }
}

/// Raise the principal's generation: every older lease and settlement is refused.
#[utoipa::path(
    post, path = "/v1/principals/{principal}/revoke", tag = "principals",
    params(("principal" = api::Token, Path, description = "The principal, one percent-encoded segment")),
    request_body(content = Option<api::EmptyRequest>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "success", body = api::Revoked),
        V1Errors,
    )
)]
pub async fn revoke(State(st): St, req: Request) -> Response {
    finish(Route::Revoke, revoke_inner(&st, req).await)
}

async fn revoke_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let principal: Principal = segment("principal", raw_segment(&parts, 2))?;
    let bytes = st.body_up_to(&parts, body, live.max_body_bytes).await?;
    let _: api::EmptyRequest = parse_body(&bytes)?;
    match st
        .execute(tenant, Command::Revoke(Revoke { principal }))
        .await?
    {
        Reply::Revoked {
            principal,
            generation,
        } => Ok(json(&api::Revoked {
            principal: principal.to_string(),
            generation,
        })),
        r => Err(unexpected("revoke", &r)),
    }
}

/// Record (or count again) a bounded warning.
#[utoipa::path(
    post, path = "/v1/tasks/{task}/warnings/{class}", tag = "warnings",
    params(
        ("task" = api::Token, Path, description = "The task, one percent-encoded segment"),
        ("class" = api::Token, Path, description = "The warning class, one percent-encoded segment"),
    ),
    request_body(content = Option<api::WarnRequest>, description = "Empty is `{}`"),
    responses(
        (status = 200, description = "success", body = api::Warning),
        (status = 409, description = "too_many_classes", body = api::Problem, content_type = PROBLEM_JSON),
        V1Errors,
    )
)]
pub async fn warn(State(st): St, req: Request) -> Response {
    finish(Route::Warn, warn_inner(&st, req).await)
}

async fn warn_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let task: TaskId = segment("task", raw_segment(&parts, 2))?;
    let class: WarningClass = segment("class", raw_segment(&parts, 4))?;
    let bytes = st.body_up_to(&parts, body, live.max_body_bytes).await?;
    let b: api::WarnRequest = parse_body(&bytes)?;
    let cmd = Command::Warn(b.into_warn(task, class)?);
    match st.execute(tenant, cmd).await? {
        Reply::Warning(w) => Ok(json(&api::Warning::from(&w))),
        r => Err(unexpected("warn", &r)),
    }
}

/// The warnings of a task.
#[utoipa::path(
    get, path = "/v1/tasks/{task}/warnings", tag = "warnings",
    params(("task" = api::Token, Path, description = "The task, one percent-encoded segment")),
    responses(
        (status = 200, description = "Empty list for a task without warnings", body = api::Warnings),
        V1Errors,
    )
)]
pub async fn warnings(State(st): St, req: Request) -> Response {
    finish(Route::Warnings, warnings_inner(&st, req).await)
}

async fn warnings_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, _body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let task: TaskId = segment("task", raw_segment(&parts, 2))?;
    match st.store.warnings(tenant, &task).await {
        Ok(w) => Ok(json(&api::Warnings {
            warnings: w.iter().map(Into::into).collect(),
        })),
        Err(e) => Err(store_error("warnings", None, &e)),
    }
}

// ---- operational endpoints (no token) ----

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "success", body = api::Health)))]
pub async fn healthz() -> Response {
    finish(
        Route::Healthz,
        Ok(json(&api::Health {
            status: api::HealthStatus::Ok,
        })),
    )
}

/// Readiness: the store answers and the server is not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "success", body = api::Health),
        (status = 503, description = "record_refused or unavailable", body = api::Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn readyz(State(st): St) -> Response {
    let result = if !st.ready.load(Ordering::Relaxed) {
        Err(Problem::unavailable("shutting down"))
    } else {
        match st.store.health().await {
            Ok(_) => Ok(json(&api::Health {
                status: api::HealthStatus::Ready,
            })),
            Err(e) => {
                // No token is needed here, so the cause stays in the log.
                let correlation_id = crate::problem::correlation_id();
                warn!(%correlation_id, error = %e, "store not ready");
                let mut p = Problem::store_failure(&e, correlation_id);
                p.detail = format!("the store is not ready: {}", p.detail);
                Err(p)
            }
        }
    };
    finish(Route::Readyz, result)
}

/// Prometheus text exposition.
///
/// Open unless the server sets `metrics_token_sha256` (then a bearer token
/// with that SHA-256, else 401). The gauges that scan the store (open
/// records, quarantined evidence) are refreshed at most once per
/// `metrics_refresh_ms`, whatever the scrape rate: a scrape never costs
/// more than reading what the last refresh left.
#[utoipa::path(get, path = "/metrics", tag = "operations", security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "`metrics_token_sha256` is set and the bearer token is missing or another", body = api::Problem, content_type = "application/problem+json"),
    ))]
pub async fn metrics(State(st): St, headers: axum::http::HeaderMap) -> Response {
    if let Err(p) = crate::auth::check_token(st.live().metrics_token.as_ref(), &headers) {
        return finish(Route::Metrics, Err(p));
    }
    st.gauges.refresh(&st).await;
    let result = match &st.metrics {
        Some(h) => {
            h.run_upkeep();
            let mut resp = Response::new(Body::from(h.render()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(resp)
        }
        None => Err(Problem::unavailable(
            "another metrics recorder was installed in this process",
        )),
    };
    finish(Route::Metrics, result)
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "OpenAPI 3.1 document", body = Object)))]
pub async fn openapi_json(State(st): St) -> Response {
    let mut resp = Response::new(Body::from(st.openapi.clone()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    finish(Route::Openapi, Ok(resp))
}

/// A known path with a method it does not take: 405, and axum adds the
/// `Allow` header listing the ones it does.
async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    finish(
        Route::Unmatched,
        Err(Problem::new(
            api::Code::MethodNotAllowed,
            format!("{} does not take {method}", uri.path()),
        )),
    )
}

async fn no_route(method: Method, uri: axum::http::Uri) -> Response {
    finish(
        Route::Unmatched,
        Err(Problem::not_found(format!(
            "no route for {method} {}",
            uri.path()
        ))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_indices_match_their_labels() {
        let pairs = [
            (Route::Claim, "claim"),
            (Route::Heartbeat, "heartbeat"),
            (Route::Dispatch, "dispatch"),
            (Route::Settle, "settle"),
            (Route::Release, "release"),
            (Route::Reconcile, "reconcile"),
            (Route::Get, "get"),
            (Route::Revoke, "revoke"),
            (Route::Warn, "warn"),
            (Route::Warnings, "warnings"),
            (Route::Healthz, "healthz"),
            (Route::Readyz, "readyz"),
            (Route::Metrics, "metrics"),
            (Route::Openapi, "openapi"),
            (Route::Unmatched, "unmatched"),
            (Route::Batch, "batch"),
            (Route::Principal, "principal"),
            (Route::AdminExport, "admin_export"),
        ];
        for (r, label) in pairs {
            assert_eq!(m::ROUTES[r as usize], label);
        }
    }
}
