//! The tower [`Layer`] and its [`Service`]: SPEC §8's table performed
//! against the ledger, around any axum/hyper service.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{Method, Request, Response, StatusCode};
use futures::FutureExt as _;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use settle_core::{
    Binding, ClaimDecision, Command, Digest, Dispatch, ErrorText, Fence, Finding, Grant, Heartbeat,
    Key, LeaseMs, Outcome, Principal, Reconcile, RefusalCode, Release, ReleaseReason, Reply,
    ResultJson, RetentionS, Scopes, Settle, Text,
};
use sha2::{Digest as _, Sha256};
use tower::{Layer, Service};

use crate::backend::{BoxFuture, CallError, Transport, call};
use crate::layout::{self, FingerprintInput, StoredResponse};
use crate::principal::{Identity, PrincipalFn};
use crate::table::{self, AfterClaim, Arrival, Disposition, LedgerFailure, Problem, RoutePolicy};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header a replay carries.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Put this in a response's extensions to say that nothing happened (like
/// 408, 409, 425, 429): the response is not stored, the lease is released
/// with `not_committed`, and the retry runs the handler again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retryable;

/// What the reconcile hook found out about an earlier attempt whose
/// outcome is unknown (SPEC §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The earlier attempt happened and this is the response it made (for
    /// a payment: the payment the provider has under this key): it is
    /// settled as the stored response and replayed; the handler does not run.
    Committed(HookResponse),
    /// The earlier attempt did not happen: run the handler, under the same fence.
    NotCommitted,
    /// It cannot be told now: retries keep getting 409 `outcome_unknown`.
    Unavailable,
}

/// The response a reconcile hook reports for an attempt that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookResponse {
    /// The status.
    pub status: u16,
    /// Headers (name, value); the configured stored headers are kept.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Bytes,
}

/// Picks the policy of a route (`None`: not wrapped).
pub type RoutesFn = Arc<dyn Fn(&Method, &str) -> Option<RoutePolicy> + Send + Sync>;
/// The reconcile hook: ledger key, fence and the retried request's parts.
pub type ReconcileFn =
    Arc<dyn Fn(&str, Fence, &Parts) -> BoxFuture<'static, Resolution> + Send + Sync>;
/// Turns a JSON body into its canonical text (`None`: not JSON).
pub type CanonicalFn = Arc<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

#[derive(Clone)]
struct Settings {
    backend: Arc<dyn Transport>,
    namespace: String,
    methods: Vec<Method>,
    routes: Option<RoutesFn>,
    principal: PrincipalFn,
    stored_headers: Vec<String>,
    fingerprint_headers: Vec<String>,
    canonical: Option<CanonicalFn>,
    max_stored_body: usize,
    max_request_body: usize,
    lease_ms: LeaseMs,
    retention_s: RetentionS,
    policy: RoutePolicy,
    unavailable_retry_after_s: u64,
    reconcile: Option<ReconcileFn>,
}

/// SPEC §8 as a tower layer:
///
/// ```no_run
/// # async fn demo(client: settle_client::Client) {
/// use axum::{Router, routing::post};
/// use settle_middleware::{IdempotencyLayer, principal};
///
/// let layer = IdempotencyLayer::remote(client, principal::fixed("svc-checkout"));
/// let app: Router = Router::new()
///     .route("/payments", post(|| async { "paid" }))
///     .layer(layer.namespace("payments"));
/// # }
/// ```
///
/// The principal extractor is required (SPEC §8: it names the caller's
/// account, never a credential; [`principal::fixed`](crate::principal::fixed)
/// and [`principal::from_extension`](crate::principal::from_extension) cover
/// the common cases). Every other option has the default SPEC §8 names:
/// POST and PATCH wrapped and requiring a key, `content-type` and
/// `location` stored, 32 KiB stored body (a larger response is streamed
/// to the client and settled as not stored), 1 MiB request body, 30 s
/// lease heartbeated every 10 s, no handler timeout, fail closed.
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

impl IdempotencyLayer {
    /// Over any [`Transport`] of the worker SDK (the in-process ledger,
    /// the HTTP client, a simulated network), with the principal extractor.
    pub fn new(
        transport: impl Transport + 'static,
        principal: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        IdempotencyLayer::with_transport(Arc::new(transport), principal)
    }

    /// Over a shared [`Transport`].
    pub fn with_transport(
        backend: Arc<dyn Transport>,
        principal: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                backend,
                namespace: "default".into(),
                methods: vec![Method::POST, Method::PATCH],
                routes: None,
                principal: Arc::new(principal),
                stored_headers: layout::DEFAULT_STORED_HEADERS
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                fingerprint_headers: Vec::new(),
                canonical: None,
                max_stored_body: layout::DEFAULT_MAX_STORED_BODY,
                max_request_body: 1024 * 1024,
                lease_ms: LeaseMs::DEFAULT,
                retention_s: RetentionS::DEFAULT,
                policy: RoutePolicy::default(),
                unavailable_retry_after_s: 1,
                reconcile: None,
            }),
        }
    }

    /// Over the embedded ledger in-process, for one tenant. With the
    /// `local` feature.
    #[cfg(feature = "local")]
    pub fn embedded(
        ledger: settle_ledger::Ledger,
        tenant: settle_core::TenantId,
        principal: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        IdempotencyLayer::new(
            settle_worker::LedgerTransport::for_tenant(ledger, tenant),
            principal,
        )
    }

    /// Over a remote `settle serve`.
    pub fn remote(
        client: settle_client::Client,
        principal: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        IdempotencyLayer::new(client, principal)
    }

    fn with(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// Separates the keys of services sharing one ledger (default `default`).
    pub fn namespace(self, ns: impl Into<String>) -> Self {
        let ns = ns.into();
        self.with(|s| s.namespace = ns)
    }

    /// The methods wrapped when no [`routes`](Self::routes) function is set
    /// (default POST and PATCH).
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let m = methods.into_iter().collect();
        self.with(|s| s.methods = m)
    }

    /// Route selection: the policy for a method and path, `None` for a
    /// route that is not wrapped. A policy without a timeout takes the
    /// layer's.
    pub fn routes(
        self,
        f: impl Fn(&Method, &str) -> Option<RoutePolicy> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.routes = Some(Arc::new(f)))
    }

    /// Replaces the principal extractor. Keys of different principals never meet.
    pub fn principal(self, f: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static) -> Self {
        self.with(|s| s.principal = Arc::new(f))
    }

    /// Response headers stored and replayed besides `content-type` and
    /// `location`.
    pub fn stored_headers<I: IntoIterator<Item = S>, S: Into<String>>(self, names: I) -> Self {
        let names: Vec<String> = names
            .into_iter()
            .map(|n| n.into().to_ascii_lowercase())
            .collect();
        self.with(|s| {
            for n in names {
                if !s.stored_headers.contains(&n) {
                    s.stored_headers.push(n);
                }
            }
        })
    }

    /// Request headers that are part of the fingerprint.
    pub fn fingerprint_headers<I: IntoIterator<Item = S>, S: Into<String>>(self, names: I) -> Self {
        let names = names
            .into_iter()
            .map(|n| n.into().to_ascii_lowercase())
            .collect();
        self.with(|s| s.fingerprint_headers = names)
    }

    /// Fingerprints JSON bodies (`application/json`, `*+json`) by their
    /// RFC 8785 canonical form, so that key order and whitespace do not
    /// make another request (default off: the raw bytes count).
    pub fn canonical_json(self, yes: bool) -> Self {
        self.with(|s| s.canonical = yes.then(|| Arc::new(crate::canonical_json) as CanonicalFn))
    }

    /// Fingerprints JSON bodies by this canonical form instead.
    pub fn canonical_body(
        self,
        f: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.canonical = Some(Arc::new(f)))
    }

    /// Largest response body stored for replay (default 32 KiB); a larger
    /// one is streamed to the client as the handler produces it (never held
    /// whole), settled as not stored, and a replay answers 409
    /// `response_not_stored`.
    pub fn max_stored_body(self, bytes: usize) -> Self {
        self.with(|s| s.max_stored_body = bytes)
    }

    /// Largest request body (default 1 MiB); above: 413 `payload_too_large`.
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.with(|s| s.max_request_body = bytes)
    }

    /// The lease of each request (default 30 s), heartbeated every third.
    pub fn lease(self, lease: LeaseMs) -> Self {
        self.with(|s| s.lease_ms = lease)
    }

    /// How long settled responses are kept (default one day).
    pub fn retention(self, r: RetentionS) -> Self {
        self.with(|s| s.retention_s = r)
    }

    /// How long a duplicate waits for the first request's outcome on every
    /// route (default none: 409 `request_in_progress` at once); a route's
    /// own policy may set its own.
    pub fn wait(self, w: Duration) -> Self {
        self.with(|s| s.policy.wait = Some(w))
    }

    /// The handler timeout of every route (default none): past it, the
    /// request answers 500 and the record becomes `unknown`.
    pub fn timeout(self, t: Duration) -> Self {
        self.with(|s| s.policy.timeout = Some(t))
    }

    /// Runs the handler without idempotency when the ledger is unreachable
    /// (no answer, or its 503 `unavailable`; logged) instead of answering
    /// 503 — default off: fail closed. A ledger that answers with a
    /// refusal (`stale_binding`, `record_refused`, 429, an invalid call)
    /// never runs the handler.
    pub fn fail_open(self, yes: bool) -> Self {
        self.with(|s| s.policy.fail_open = yes)
    }

    /// The `Retry-After` of 503 `idempotency_unavailable` (default 1 s).
    pub fn unavailable_retry_after(self, seconds: u64) -> Self {
        self.with(|s| s.unavailable_retry_after_s = seconds)
    }

    /// The hook that finds out whether an earlier attempt with an unknown
    /// outcome happened (default: none; retries get 409 `outcome_unknown`
    /// until an operator reconciles the record).
    pub fn reconcile(
        self,
        f: impl Fn(&str, Fence, &Parts) -> BoxFuture<'static, Resolution> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.reconcile = Some(Arc::new(f)))
    }

    /// The ledger key a request with this principal and key is recorded
    /// under (for operators and tests).
    pub fn ledger_key(&self, principal: &str, key: &str) -> String {
        layout::ledger_key(&self.settings.namespace, principal, key)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;
    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            settings: self.settings.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around a handler.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S, B, RB> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let settings = self.settings.clone();
        Box::pin(Run { settings, inner }.request(req))
    }
}

/// One request's run.
struct Run<S> {
    settings: Arc<Settings>,
    inner: S,
}

/// The request as claimed.
struct Claimed {
    key: String,
    lkey: Key,
    fingerprint: Digest,
    binding: Binding,
    parts: Parts,
    body: Bytes,
}

/// What the handler left behind.
enum Handled<E> {
    Response(axum::http::response::Parts, Bytes),
    /// A body past the stored limit: what was read, and the rest, unread.
    Streamed(axum::http::response::Parts, Bytes, Body),
    /// A panic, a timeout, a body that broke: the outcome is unknown.
    Failed(&'static str),
    /// The inner service returned an error (it goes up unchanged).
    Error(E),
}

impl<S, RB> Run<S>
where
    S: Service<Request<Body>, Response = Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    async fn request<B>(self, req: Request<B>) -> Result<Response<Body>, S::Error>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let policy = self.policy(req.method(), req.uri().path());
        let lines: Vec<&[u8]> = req
            .headers()
            .get_all(&IDEMPOTENCY_KEY)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let key = match table::arrival(policy.as_ref(), &lines) {
            Arrival::Unwrapped => return self.pass(req.map(Body::new)).await,
            Arrival::Refuse(p) => return Ok(refuse(&p, None)),
            Arrival::Wrapped { key } => key,
        };
        let policy = policy.expect("a wrapped request has a policy");
        let (parts, body) = req.into_parts();
        let Some(identity) = (self.settings.principal)(&parts) else {
            return Ok(refuse(&table::PRINCIPAL_MISSING, Some(&key)));
        };
        let body = match Limited::new(body, self.settings.max_request_body)
            .collect()
            .await
        {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Ok(refuse(&table::PAYLOAD_TOO_LARGE, Some(&key)));
            }
            Err(e) => {
                // The client went away (or sent a broken body) before its
                // request arrived: nothing was claimed.
                tracing::debug!(key, error = %e, "idempotency: the request body could not be read");
                return Ok(problem(&Problem {
                    status: 400,
                    code: "bad_request",
                    detail: "the request body could not be read",
                    retry_after: None,
                }));
            }
        };
        let claimed = match self.claimed(key, &identity, parts, body) {
            Ok(c) => c,
            Err((c, why)) => return self.unavailable(&policy, c, why).await,
        };
        self.claim(policy, claimed).await
    }

    fn policy(&self, method: &Method, path: &str) -> Option<RoutePolicy> {
        let s = &self.settings;
        match &s.routes {
            Some(f) => f(method, path).map(|mut p| {
                p.timeout = p.timeout.or(s.policy.timeout);
                p.wait = p.wait.or(s.policy.wait);
                p
            }),
            None => s.methods.contains(method).then_some(s.policy),
        }
    }

    async fn pass(mut self, req: Request<Body>) -> Result<Response<Body>, S::Error> {
        Ok(self.inner.call(req).await?.map(Body::new))
    }

    /// The ledger key, fingerprint and binding of a request (SPEC §8
    /// scope); `Err` when the ledger types refuse them (cannot happen with
    /// the layouts, but fails closed if it does).
    #[allow(clippy::result_large_err)]
    fn claimed(
        &self,
        key: String,
        identity: &Identity,
        parts: Parts,
        body: Bytes,
    ) -> Result<Claimed, ((Parts, Bytes), String)> {
        let s = &self.settings;
        let principal = &identity.principal;
        let target = match parts.uri.query() {
            Some(q) if !q.is_empty() => format!("{}?{q}", parts.uri.path()),
            _ => parts.uri.path().to_string(),
        };
        let fp_headers: Vec<(String, Vec<u8>)> = s
            .fingerprint_headers
            .iter()
            .map(|n| {
                let lines: Vec<&[u8]> = parts
                    .headers
                    .get_all(n.as_str())
                    .iter()
                    .map(HeaderValue::as_bytes)
                    .collect();
                (n.clone(), lines.join(&b", "[..]))
            })
            .collect();
        let fp = layout::request_fingerprint(
            FingerprintInput {
                method: parts.method.as_str(),
                target: &target,
                content_type: parts
                    .headers
                    .get(CONTENT_TYPE)
                    .map_or(&b""[..], HeaderValue::as_bytes),
                body: &body,
                headers: &fp_headers,
            },
            s.canonical
                .as_deref()
                .map(|f| f as layout::Canonicalize<'_>),
        );
        let built = (|| {
            Ok::<_, settle_core::InvalidInput>((
                Key::new(layout::ledger_key(&s.namespace, principal, &key))?,
                Digest::parse("fingerprint", &fp)?,
                Binding {
                    principal: Principal::new(layout::binding_principal(principal))?,
                    scopes: Scopes::new(Vec::new())?,
                    generation: identity.generation,
                },
            ))
        })();
        match built {
            Ok((lkey, fingerprint, binding)) => Ok(Claimed {
                key,
                lkey,
                fingerprint,
                binding,
                parts,
                body,
            }),
            Err(e) => Err(((parts, body), e.to_string())),
        }
    }

    async fn claim(self, policy: RoutePolicy, c: Claimed) -> Result<Response<Body>, S::Error> {
        let s = &self.settings;
        let principal = c.binding.principal.as_str();
        let worker = Text::new(
            "worker",
            format!("idempotency-key={} principal={principal}", c.key),
        )
        .ok();
        let claim = settle_core::Claim {
            key: c.lkey.clone(),
            fingerprint: c.fingerprint,
            binding: c.binding.clone(),
            lease_ms: s.lease_ms,
            worker,
            marks_dispatch: true,
            retention_s: s.retention_s,
        };
        // With the route's `wait`, a duplicate claims again until the
        // first request's outcome arrives or the wait is over.
        let until = policy.wait.map(|w| Instant::now() + w);
        let mut answer = call(&*s.backend, Command::Claim(claim.clone())).await;
        loop {
            return match table::after_claim(answer, s.unavailable_retry_after_s) {
                AfterClaim::Execute(g) => self.execute(policy, c, g).await,
                AfterClaim::Reconcile(g) => match reconcile(&self.settings, &c, g).await {
                    Reconciled::Execute(g) => self.execute(policy, c, g).await,
                    Reconciled::Replay(stored) => Ok(replay(stored, &c.key)),
                    Reconciled::Unknown => Ok(refuse(&table::OUTCOME_UNKNOWN, Some(&c.key))),
                },
                AfterClaim::Replay(stored) => Ok(replay(stored, &c.key)),
                AfterClaim::InFlight {
                    retry_after_ms,
                    problem,
                } => {
                    let left = until.map_or(Duration::ZERO, |u| {
                        u.saturating_duration_since(Instant::now())
                    });
                    if left.is_zero() {
                        return Ok(refuse(&problem, Some(&c.key)));
                    }
                    note("waited");
                    tokio::time::sleep(Duration::from_millis(retry_after_ms).min(left)).await;
                    answer = call(&*s.backend, Command::Claim(claim.clone())).await;
                    continue;
                }
                AfterClaim::Refuse(p) => Ok(refuse(&p, Some(&c.key))),
                AfterClaim::Unavailable(why) => {
                    self.unavailable(&policy, (c.parts, c.body), why).await
                }
            };
        }
    }

    async fn unavailable(
        self,
        policy: &RoutePolicy,
        (parts, body): (Parts, Bytes),
        why: String,
    ) -> Result<Response<Body>, S::Error> {
        let s = &self.settings;
        if policy.fail_open {
            note("fail_open");
            tracing::warn!(
                error = why,
                path = parts.uri.path(),
                "idempotency: ledger unreachable; the request runs WITHOUT idempotency (fail_open)"
            );
            return self
                .pass(Request::from_parts(parts, Body::from(body)))
                .await;
        }
        tracing::warn!(
            error = why,
            path = parts.uri.path(),
            "idempotency: ledger unreachable"
        );
        Ok(refuse(
            &table::unavailable(s.unavailable_retry_after_s),
            None,
        ))
    }

    async fn execute(
        mut self,
        policy: RoutePolicy,
        c: Claimed,
        g: Grant,
    ) -> Result<Response<Body>, S::Error> {
        let s = self.settings.clone();
        let dispatch = Command::Dispatch(Dispatch {
            key: c.lkey.clone(),
            fence: g.fence,
        });
        // A lost answer is retried under the same fence (dispatch is
        // idempotent), for half the lease: the other half is left to hand
        // the lease back if the ledger stays silent.
        let half_lease = Duration::from_millis(s.lease_ms.get() / 2);
        if let Err(e) = retry(&s.backend, dispatch, half_lease).await {
            // The handler never ran. Hand the lease back: `not_dispatched`
            // while no dispatch is recorded; if one was (its answer lost),
            // `not_committed`, which is true: nothing was applied.
            let release = |reason| {
                Command::Release(Release {
                    key: c.lkey.clone(),
                    fence: g.fence,
                    reason,
                })
            };
            if let Err(CallError::Refused(RefusalCode::ReceiptRequired)) =
                call(&*s.backend, release(ReleaseReason::NotDispatched)).await
            {
                let _ = call(&*s.backend, release(ReleaseReason::NotCommitted)).await;
            }
            return match table::ledger_failure(&e, s.unavailable_retry_after_s) {
                LedgerFailure::Unreachable(why) => {
                    self.unavailable(&policy, (c.parts, c.body), why).await
                }
                LedgerFailure::Refused(p) => Ok(refuse(&p, Some(&c.key))),
            };
        }
        let mut pending = Unsettled {
            settings: s.clone(),
            key: c.key.clone(),
            lkey: c.lkey.clone(),
            fence: g.fence,
            fingerprint: c.fingerprint,
            binding: c.binding.clone(),
            state: Some(Command::Settle(Settle {
                key: c.lkey.clone(),
                fence: g.fence,
                fingerprint: c.fingerprint,
                binding: c.binding.clone(),
                outcome: Outcome::unknown(ErrorText::new("error", "handler cancelled").ok()),
            })),
            ended: false,
        };
        note("executed");
        let req = Request::from_parts(c.parts, Body::from(c.body));
        // A service may panic in `call` itself, before any future exists.
        let handler = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(f) => f,
            Err(_) => {
                pending.unknown("panic").await;
                return Ok(refuse(&table::HANDLER_FAILED, Some(&c.key)));
            }
        };
        let max_stored = s.max_stored_body;
        let handled = {
            let run = async {
                match handler.await {
                    Ok(resp) => {
                        let (parts, body) = resp.into_parts();
                        match read_up_to(body, max_stored).await {
                            Ok(Read::Whole(b)) => Handled::Response(parts, b),
                            Ok(Read::Over(prefix, rest)) => Handled::Streamed(parts, prefix, rest),
                            Err(_) => Handled::Failed("response body failed"),
                        }
                    }
                    Err(e) => Handled::Error(e),
                }
            };
            let caught = AssertUnwindSafe(run).catch_unwind();
            let timed = async {
                match policy.timeout {
                    Some(t) => tokio::time::timeout(t, caught)
                        .await
                        .unwrap_or(Ok(Handled::Failed("timeout"))),
                    None => caught.await,
                }
            };
            tokio::select! {
                r = timed => r.unwrap_or(Handled::Failed("panic")),
                never = heartbeat(s.backend.clone(), c.lkey.clone(), g.fence, s.lease_ms) => match never {},
            }
        };
        match handled {
            Handled::Response(parts, body) => Ok(pending.finish(parts, body).await),
            Handled::Streamed(parts, prefix, rest) => Ok(pending.stream(parts, prefix, rest).await),
            Handled::Failed(why) => {
                pending.unknown(why).await;
                Ok(refuse(&table::HANDLER_FAILED, Some(&c.key)))
            }
            Handled::Error(e) => {
                pending.unknown("service error").await;
                Err(e)
            }
        }
    }
}

/// What reporting the hook's finding led to.
enum Reconciled {
    /// `not_committed`: the same fence, now an execute lease.
    Execute(Grant),
    /// `committed`: the hook's response, settled; replay it.
    Replay(StoredResponse),
    /// `unavailable` (or the report failed): 409 `outcome_unknown`.
    Unknown,
}

/// A `reconcile` lease: the hook's finding, reported.
async fn reconcile(s: &Settings, c: &Claimed, g: Grant) -> Reconciled {
    let resolution = match &s.reconcile {
        Some(hook) => {
            match AssertUnwindSafe(hook(c.lkey.as_str(), g.fence, &c.parts))
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => {
                    tracing::error!(key = c.key, "idempotency: the reconcile hook panicked");
                    Resolution::Unavailable
                }
            }
        }
        None => Resolution::Unavailable,
    };
    let mut stored = None;
    let finding = match resolution {
        Resolution::Committed(r) => {
            let (result, digest) = layout::encode_response(
                r.status,
                &r.headers,
                &r.body,
                &s.stored_headers,
                s.max_stored_body,
            );
            let d = match table::disposition(r.status, false) {
                Disposition::Failed => Disposition::Failed,
                _ => Disposition::Completed,
            };
            let committed = stored_outcome(d, &result, &digest)
                .and_then(|o| Finding::committed(c.fingerprint, c.binding.clone(), o));
            match committed {
                Ok(f) => {
                    stored = layout::decode_response(&result);
                    f
                }
                Err(e) => {
                    tracing::error!(key = c.key, error = %e, "idempotency: the hook's response cannot be stored");
                    Finding::Unavailable
                }
            }
        }
        Resolution::NotCommitted => Finding::NotCommitted,
        Resolution::Unavailable => Finding::Unavailable,
    };
    let cmd = Command::Reconcile(Reconcile {
        key: c.lkey.clone(),
        fence: g.fence,
        finding,
    });
    match call(&*s.backend, cmd).await {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => Reconciled::Execute(g),
        Ok(Reply::Receipt(_)) => match stored {
            Some(st) if st.body.is_some() => Reconciled::Replay(st),
            _ => Reconciled::Unknown,
        },
        Ok(_) => Reconciled::Unknown,
        Err(e) => {
            tracing::warn!(key = c.key, error = %e, "idempotency: reconcile got no answer");
            Reconciled::Unknown
        }
    }
}

/// Heartbeats the lease every third of `lease_ms` until it is lost; never
/// returns (the caller stops polling it when the handler is done).
async fn heartbeat(
    backend: Arc<dyn Transport>,
    key: Key,
    fence: Fence,
    lease_ms: LeaseMs,
) -> Infallible {
    let every = Duration::from_millis(lease_ms.get() / 3);
    loop {
        tokio::time::sleep(every).await;
        let cmd = Command::Heartbeat(Heartbeat {
            key: key.clone(),
            fence,
            lease_ms: None,
        });
        match call(&*backend, cmd).await {
            Ok(_) => {}
            Err(e) if e.is_retryable() => {
                tracing::debug!(key = key.as_str(), error = %e, "idempotency: heartbeat got no answer");
            }
            Err(e) => {
                // The lease is lost (expired, revoked): its settle will be
                // refused; the handler keeps running, nothing more to beat.
                tracing::warn!(key = key.as_str(), error = %e, "idempotency: lease lost while the handler runs");
                return std::future::pending().await;
            }
        }
    }
}

/// A lease whose outcome is not recorded yet. Dropped while armed (the
/// framework cancelled the request: the client disconnected), it records
/// what it has in a task of its own: `unknown` while the handler ran, the
/// response once it was captured.
struct Unsettled {
    settings: Arc<Settings>,
    key: String,
    lkey: Key,
    fence: Fence,
    fingerprint: Digest,
    binding: Binding,
    /// The call that records the outcome known so far (`None`: recorded).
    state: Option<Command>,
    /// A streamed response ended: dropping records its outcome, nothing
    /// was cancelled.
    ended: bool,
}

impl Unsettled {
    fn settle_cmd(&self, outcome: Outcome) -> Command {
        Command::Settle(Settle {
            key: self.lkey.clone(),
            fence: self.fence,
            fingerprint: self.fingerprint,
            binding: self.binding.clone(),
            outcome,
        })
    }

    async fn unknown(&mut self, why: &'static str) {
        note("outcome_unknown");
        tracing::warn!(
            key = self.key,
            why,
            "idempotency: the handler failed; outcome unknown"
        );
        let cmd = self.settle_cmd(Outcome::unknown(
            ErrorText::new("error", format!("handler failed: {why}")).ok(),
        ));
        self.state = Some(cmd.clone());
        self.record(cmd).await;
    }

    async fn record(&mut self, cmd: Command) {
        let deadline = Duration::from_millis(self.settings.lease_ms.get() + 1000);
        let unknown_already =
            matches!(&cmd, Command::Settle(st) if !st.outcome.status().is_terminal());
        match retry(&self.settings.backend, cmd, deadline).await {
            Ok(_) => {}
            Err(CallError::Invalid(e)) if !unknown_already => {
                // The ledger will not take this record (a stored response over
                // its max_result_bytes, a server without release(not_committed)):
                // the safe record is unknown, at once rather than at lease expiry.
                tracing::error!(key = self.key, error = %e, "idempotency: the ledger refused the outcome; recording unknown");
                let unknown = self.settle_cmd(Outcome::unknown(
                    ErrorText::new("error", "outcome refused by the ledger").ok(),
                ));
                if let Err(e) = retry(&self.settings.backend, unknown, deadline).await {
                    tracing::error!(key = self.key, error = %e, "idempotency: the outcome could not be recorded");
                }
            }
            Err(e) => {
                // The lease lapses after dispatch: the ledger marks it unknown.
                tracing::error!(key = self.key, error = %e, "idempotency: the outcome could not be recorded");
            }
        }
        self.state = None;
    }

    /// Records the handler's response and answers it.
    async fn finish(&mut self, parts: axum::http::response::Parts, body: Bytes) -> Response<Body> {
        let s = self.settings.clone();
        let status = parts.status.as_u16();
        let cmd = match table::disposition(status, parts.extensions.get::<Retryable>().is_some()) {
            Disposition::NotCommitted => {
                note("not_committed");
                Command::Release(Release {
                    key: self.lkey.clone(),
                    fence: self.fence,
                    reason: ReleaseReason::NotCommitted,
                })
            }
            d => {
                let headers: Vec<(String, Vec<u8>)> = parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                    .collect();
                let (result, digest) = layout::encode_response(
                    status,
                    &headers,
                    &body,
                    &s.stored_headers,
                    s.max_stored_body,
                );
                match stored_outcome(d, &result, &digest) {
                    Ok(o) => self.settle_cmd(o),
                    Err(e) => {
                        tracing::error!(key = self.key, error = %e, "idempotency: the response cannot be stored");
                        self.settle_cmd(Outcome::unknown(
                            ErrorText::new("error", "response not storable").ok(),
                        ))
                    }
                }
            }
        };
        self.state = Some(cmd.clone());
        self.record(cmd).await;
        let mut resp = Response::from_parts(parts, Body::from(body));
        // The body goes out whole: a framing header of a stream is wrong now.
        resp.headers_mut()
            .remove(axum::http::header::TRANSFER_ENCODING);
        resp
    }
}

impl Unsettled {
    /// A response past the stored limit: nothing to replay is stored, so
    /// the body goes to the client as the handler produces it; the outcome
    /// (its status, and the body's length and digest once the stream
    /// ends) is recorded when the body ends or is dropped, the lease
    /// heartbeated until then.
    async fn stream(
        mut self,
        parts: axum::http::response::Parts,
        prefix: Bytes,
        rest: Body,
    ) -> Response<Body> {
        let s = self.settings.clone();
        let status = parts.status.as_u16();
        let disposition = table::disposition(status, parts.extensions.get::<Retryable>().is_some());
        if disposition == Disposition::NotCommitted {
            note("not_committed");
            let cmd = Command::Release(Release {
                key: self.lkey.clone(),
                fence: self.fence,
                reason: ReleaseReason::NotCommitted,
            });
            self.state = Some(cmd.clone());
            self.record(cmd).await;
            let body = Streamed::plain(prefix, rest);
            return Response::from_parts(parts, Body::new(body));
        }
        let headers: Vec<(String, Vec<u8>)> = parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        // Until the stream ends, what is known: the status, not the body.
        let (result, digest) =
            layout::encode_streamed_response(status, &headers, &s.stored_headers, None);
        self.state = Some(self.streamed_cmd(disposition, &result, &digest));
        let beat = tokio::spawn(heartbeat(
            s.backend.clone(),
            self.lkey.clone(),
            self.fence,
            s.lease_ms,
        ));
        let body = Streamed {
            settle: Some(StreamSettle {
                pending: self,
                disposition,
                status,
                headers,
                heartbeat: beat,
            }),
            digest: Some(Sha256::new()),
            ..Streamed::plain(prefix, rest)
        };
        Response::from_parts(parts, Body::new(body))
    }

    fn streamed_cmd(&self, d: Disposition, result: &serde_json::Value, digest: &str) -> Command {
        match stored_outcome(d, result, digest) {
            Ok(o) => self.settle_cmd(o),
            Err(e) => {
                tracing::error!(key = self.key, error = %e, "idempotency: the response cannot be stored");
                self.settle_cmd(Outcome::unknown(
                    ErrorText::new("error", "response not storable").ok(),
                ))
            }
        }
    }
}

/// What a streamed response records when its body ends or is dropped.
struct StreamSettle {
    pending: Unsettled,
    disposition: Disposition,
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    heartbeat: tokio::task::JoinHandle<Infallible>,
}

impl Drop for StreamSettle {
    fn drop(&mut self) {
        // The lease needs no more beats; `pending` records the outcome.
        self.heartbeat.abort();
    }
}

/// A response body past the stored limit: the part read first, then the
/// rest as the handler produces it, digested on the way. One frame is
/// always held back, so the client has the whole body only once its
/// outcome is recorded (a retry right after it gets `response_not_stored`,
/// not `request_in_progress`).
struct Streamed {
    prefix: Option<Bytes>,
    rest: Body,
    digest: Option<Sha256>,
    len: u64,
    held: Option<http_body::Frame<Bytes>>,
    /// `None` for a body nothing is recorded for (released `not_committed`).
    settle: Option<StreamSettle>,
    /// Recording the outcome, before the held frame and the end go out.
    recording: Option<BoxFuture<'static, ()>>,
    done: bool,
}

impl Streamed {
    fn plain(prefix: Bytes, rest: Body) -> Streamed {
        Streamed {
            prefix: Some(prefix),
            rest,
            digest: None,
            len: 0,
            held: None,
            settle: None,
            recording: None,
            done: false,
        }
    }

    /// The body ended: what records it, with its length and digest.
    fn record_end(&mut self) -> Option<BoxFuture<'static, ()>> {
        let mut st = self.settle.take()?;
        let digest = self.digest.take().expect("digested while it is recorded");
        let body = (self.len, hex::encode(digest.finalize()));
        let stored = st.pending.settings.stored_headers.clone();
        let (result, response) =
            layout::encode_streamed_response(st.status, &st.headers, &stored, Some(body));
        let cmd = st.pending.streamed_cmd(st.disposition, &result, &response);
        st.pending.state = Some(cmd.clone());
        st.pending.ended = true;
        Some(Box::pin(async move {
            st.pending.record(cmd).await;
        }))
    }
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(rec) = &mut this.recording {
                ready!(rec.as_mut().poll(cx));
                this.recording = None;
            }
            if this.done {
                return Poll::Ready(this.held.take().map(Ok));
            }
            let next = match this.prefix.take() {
                Some(p) => Some(Ok(http_body::Frame::data(p))),
                None => ready!(std::pin::Pin::new(&mut this.rest).poll_frame(cx)),
            };
            match next {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        if let Some(d) = &mut this.digest {
                            d.update(data);
                        }
                        this.len += data.len() as u64;
                    }
                    if let Some(out) = this.held.replace(frame) {
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
                // The handler's body broke: what went out stays out; the
                // outcome is recorded without the body's digest (on drop).
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    this.recording = this.record_end();
                }
            }
        }
    }
}

/// A response body read up to the stored limit.
enum Read {
    /// All of it (within the limit).
    Whole(Bytes),
    /// Past the limit: what was read, and the rest, unread.
    Over(Bytes, Body),
}

/// Reads `body` until it ends or passes `max` bytes (trailers are not kept,
/// as before).
async fn read_up_to<B>(body: B, max: usize) -> Result<Read, BoxError>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut buf = axum::body::Bytes::new();
    let mut parts: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            parts.push(data);
            if len > max {
                let prefix = join(parts);
                return Ok(Read::Over(prefix, Body::new(body)));
            }
        }
    }
    if !parts.is_empty() {
        buf = join(parts);
    }
    Ok(Read::Whole(buf))
}

/// The chunks as one buffer (no copy for one chunk).
fn join(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in &parts {
        out.extend_from_slice(p);
    }
    Bytes::from(out)
}

fn stored_outcome(
    d: Disposition,
    result: &serde_json::Value,
    digest: &str,
) -> Result<Outcome, settle_core::InvalidInput> {
    let result = ResultJson::from_value(result, usize::MAX)?;
    let digest = Digest::parse("response_sha256", digest)?;
    Ok(match d {
        Disposition::Failed => Outcome::failed(result, digest, None),
        _ => Outcome::completed(result, digest),
    })
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let Some(cmd) = self.state.take() else {
            return;
        };
        if self.ended {
            tracing::debug!(
                key = self.key,
                "idempotency: streamed response sent; recording it"
            );
        } else {
            note("cancelled");
            tracing::warn!(
                key = self.key,
                "idempotency: the request was cancelled (client gone); recording its outcome"
            );
        }
        let backend = self.settings.backend.clone();
        let deadline = Duration::from_millis(self.settings.lease_ms.get() + 1000);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = retry(&backend, cmd, deadline).await {
                    tracing::error!(error = %e, "idempotency: the outcome of a cancelled request could not be recorded");
                }
            });
        }
    }
}

/// Sends `cmd` until it answers or `deadline` passes: only "no answer" is
/// retried (SPEC §11: the same settle under the same fence; rule 0 returns
/// the receipt of one that committed), with growing, jittered pauses.
async fn retry(
    backend: &Arc<dyn Transport>,
    cmd: Command,
    deadline: Duration,
) -> Result<Reply, CallError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        match call(&**backend, cmd.clone()).await {
            Err(e) if e.is_retryable() && start.elapsed() + pause < deadline => {
                tokio::time::sleep(jitter(pause).max(e.retry_after().unwrap_or_default())).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

/// Half to all of `d` (so that many retries do not arrive together).
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    d / 2 + d.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// Counts and logs an answer of the middleware (SPEC §8: every replay and
/// refusal is counted in metrics and logged with the key).
fn note(answer: &'static str) {
    metrics::counter!("settle_middleware_requests_total", "answer" => answer).increment(1);
}

fn refuse(p: &Problem, key: Option<&str>) -> Response<Body> {
    note(p.code);
    tracing::info!(
        key,
        code = p.code,
        status = p.status,
        "idempotency: refused"
    );
    problem(p)
}

fn problem(p: &Problem) -> Response<Body> {
    let body = layout::problem_body(p.status, p.code, p.detail);
    let mut r = Response::new(Body::from(body.clone()));
    *r.status_mut() = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some(ra) = &p.retry_after
        && let Ok(v) = HeaderValue::from_str(ra)
    {
        h.insert(RETRY_AFTER, v);
    }
    r
}

/// The stored response, as it went out the first time, plus
/// `Idempotent-Replayed: true`.
fn replay(stored: StoredResponse, key: &str) -> Response<Body> {
    let Some(body) = stored.body else {
        return refuse(&table::RESPONSE_NOT_STORED, Some(key));
    };
    note("replayed");
    tracing::info!(key, "idempotency: replay");
    let mut r = Response::new(Body::from(body.clone()));
    *r.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let h = r.headers_mut();
    for (n, v) in stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_bytes(&v),
        ) {
            h.append(n, v);
        }
    }
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    r
}
