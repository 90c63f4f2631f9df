//! The tower [`Layer`] and its [`Service`]: the layer's options, and the
//! service that runs SPEC §8's table against the ledger around any
//! axum/hyper service. One request's run is `run.rs`; capturing the
//! handler's response and recording the outcome, `capture.rs`; the answers
//! the layer makes itself (refusals, replays), `answer.rs`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::future::Future;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::HeaderName;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Request, Response, Uri};
use settle_core::{Fence, LeaseMs, RetentionS};
use tower::{Layer, Service};

use crate::backend::{BoxFuture, Transport};
use crate::layout;
use crate::principal::{Identity, PrincipalFn};
use crate::run::Run;
use crate::table::{ReleaseOn, RoutePolicy};

pub use settle_worker::BoxError;
/// The reconcile hook's answer and response, shared with a
/// `settle_worker::Reconciler`'s middleware hooks (defined in
/// `settle_worker::middleware`).
pub use settle_worker::{HookResponse, Resolution};

/// How long the layer retries a claim (and a dispatch) that got no answer,
/// 503 or 429, before it answers 503 `idempotency_unavailable`.
pub const DEFAULT_LEDGER_DEADLINE: Duration = Duration::from_secs(2);

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header a replay carries.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Put this in a response's extensions to say that nothing happened (like
/// 408, 409, 425, 429): the response is not stored, the lease is released
/// with `not_committed`, and the retry runs the handler again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retryable;

/// The retried request a reconcile hook is asked about (SPEC §8): a retry
/// found the record `unknown`. It has the ledger key and the reconcile
/// lease's fence, the whole request (method, path with query, headers,
/// body) and the client's `Idempotency-Key` value and principal, so that
/// the hook can ask the remote under the key the handler used. A
/// `settle_worker::Reconciler`'s middleware hook gets the same
/// `idempotency_key` and `principal` (in a `MiddlewareRecord`), so one
/// function of them serves both.
#[derive(Debug, Clone)]
pub struct ReconcileRequest {
    /// The ledger key (`mw-…`).
    pub ledger_key: String,
    /// The fence of the reconcile lease (the handler runs under it after
    /// `NotCommitted`).
    pub fence: Fence,
    /// The method.
    pub method: Method,
    /// The path and query as sent.
    pub uri: Uri,
    /// The request's headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The `Idempotency-Key` value the client sent (unquoted).
    pub idempotency_key: String,
    /// The principal the extractor gave.
    pub principal: String,
}

impl ReconcileRequest {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.uri.path()
    }
    /// The path with its query (what the fingerprint covers).
    pub fn target(&self) -> &str {
        self.uri
            .path_and_query()
            .map_or_else(|| self.uri.path(), |pq| pq.as_str())
    }
}

/// Picks the policy of a route (`None`: not wrapped).
pub type RoutesFn = Arc<dyn Fn(&Method, &str) -> Option<RoutePolicy> + Send + Sync>;
/// The replay hook ([`IdempotencyLayer::on_replay`]): the stored response
/// and the record's receipt → the response to send instead.
pub type ReplayFn = Arc<dyn Fn(HookResponse, &settle_core::Receipt) -> HookResponse + Send + Sync>;
/// The reconcile hook, boxed: the retried request → its resolution (an
/// error counts as `Unavailable`, logged).
pub type ReconcileFn =
    Arc<dyn Fn(ReconcileRequest) -> BoxFuture<'static, Result<Resolution, BoxError>> + Send + Sync>;
/// Turns a JSON body into its canonical text (`None`: not JSON).
pub type CanonicalFn = Arc<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) backend: Arc<dyn Transport>,
    pub(crate) namespace: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) routes: Option<RoutesFn>,
    pub(crate) principal: PrincipalFn,
    pub(crate) stored_headers: Vec<String>,
    pub(crate) fingerprint_headers: Vec<String>,
    pub(crate) canonical: Option<CanonicalFn>,
    pub(crate) fingerprint: layout::FingerprintOptions,
    pub(crate) max_stored_body: usize,
    pub(crate) max_request_body: usize,
    pub(crate) lease_ms: LeaseMs,
    pub(crate) retention_s: RetentionS,
    pub(crate) policy: RoutePolicy,
    pub(crate) unavailable_retry_after_s: u64,
    pub(crate) reconcile: Option<ReconcileFn>,
    pub(crate) hook_timeout: Option<Duration>,
    pub(crate) ledger_deadline: Duration,
    pub(crate) on_replay: Option<ReplayFn>,
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
/// `location` stored, JSON bodies fingerprinted by their RFC 8785
/// canonical form (the whole body), 32 KiB stored body (a larger response is streamed
/// to the client and settled as not stored), 1 MiB request body, 30 s
/// lease heartbeated every 10 s, no handler timeout, fail closed, 408,
/// 409, 425 and 429 released, ledger calls retried for 2 s.
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
                fingerprint: layout::FingerprintOptions::default(),
                max_stored_body: layout::DEFAULT_MAX_STORED_BODY,
                max_request_body: 1024 * 1024,
                lease_ms: LeaseMs::DEFAULT,
                retention_s: RetentionS::DEFAULT,
                policy: RoutePolicy::default(),
                unavailable_retry_after_s: 1,
                reconcile: None,
                hook_timeout: None,
                on_replay: None,
                ledger_deadline: DEFAULT_LEDGER_DEADLINE,
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
    /// RFC 8785 canonical form, so that key order and whitespace never make
    /// a retry a mismatch (default **on**; off: the raw bytes count). A JSON
    /// body that does not parse counts by its raw bytes either way.
    ///
    /// # Panics
    ///
    /// Off while [`fields`](Self::fields) or [`exclude`](Self::exclude) is
    /// set (they read the body as JSON): a configuration error that names
    /// the option.
    pub fn canonical_json(self, yes: bool) -> Self {
        let o = &self.settings.fingerprint;
        let checked = layout::FingerprintOptions::new(
            yes,
            o.fields().map(<[String]>::to_vec),
            o.exclude().map(<[String]>::to_vec),
        );
        self.fingerprint_options(
            checked.unwrap_or_else(|e| panic!("IdempotencyLayer::canonical_json: {e}")),
        )
    }

    /// Only these RFC 6901 pointers of a JSON body count in the
    /// fingerprint: the object `{pointer: value}` of those that resolve
    /// (the selection of `settle_worker::select_fields`). A body that is
    /// not JSON counts by its raw bytes.
    ///
    /// # Panics
    ///
    /// An empty list, a malformed pointer, [`exclude`](Self::exclude) also
    /// set, or [`canonical_json`](Self::canonical_json) off: a
    /// configuration error that names the option (or use
    /// [`fingerprint_options`](Self::fingerprint_options) with a checked
    /// [`FingerprintOptions::new`](layout::FingerprintOptions::new)).
    pub fn fields<I: IntoIterator<Item = S>, S: Into<String>>(self, pointers: I) -> Self {
        assert!(
            self.settings.canonical.is_none(),
            "IdempotencyLayer::fields: not with canonical_body (it replaces the built-in canonical_json)"
        );
        let pointers = pointers.into_iter().map(Into::into).collect();
        let o = &self.settings.fingerprint;
        let checked = layout::FingerprintOptions::new(
            o.canonical_json(),
            Some(pointers),
            o.exclude().map(<[String]>::to_vec),
        );
        self.fingerprint_options(
            checked.unwrap_or_else(|e| panic!("IdempotencyLayer::fields: {e}")),
        )
    }

    /// These RFC 6901 pointers of a JSON body do not count in the
    /// fingerprint (e.g. a client timestamp): each pointer is resolved in
    /// the body as received, the values found are removed (an array
    /// element's removal shifts the later ones), one that does not resolve
    /// is ignored. A body that is not JSON counts by its raw bytes.
    ///
    /// # Panics
    ///
    /// An empty list, a malformed pointer, `""` (the whole document),
    /// [`fields`](Self::fields) also set, or
    /// [`canonical_json`](Self::canonical_json) off: a configuration error
    /// that names the option.
    pub fn exclude<I: IntoIterator<Item = S>, S: Into<String>>(self, pointers: I) -> Self {
        assert!(
            self.settings.canonical.is_none(),
            "IdempotencyLayer::exclude: not with canonical_body (it replaces the built-in canonical_json)"
        );
        let pointers = pointers.into_iter().map(Into::into).collect();
        let o = &self.settings.fingerprint;
        let checked = layout::FingerprintOptions::new(
            o.canonical_json(),
            o.fields().map(<[String]>::to_vec),
            Some(pointers),
        );
        self.fingerprint_options(
            checked.unwrap_or_else(|e| panic!("IdempotencyLayer::exclude: {e}")),
        )
    }

    /// The body options of the fingerprint at once, checked beforehand by
    /// [`FingerprintOptions::new`](layout::FingerprintOptions::new) (which
    /// answers a [`ConfigError`](layout::ConfigError) instead of panicking).
    /// Replaces a [`canonical_body`](Self::canonical_body) function.
    pub fn fingerprint_options(self, options: layout::FingerprintOptions) -> Self {
        self.with(|s| {
            s.canonical = None;
            s.fingerprint = options;
        })
    }

    /// Fingerprints JSON bodies by this canonical form instead (it gets
    /// the body of a JSON media type, `None`: the raw bytes count).
    ///
    /// # Panics
    ///
    /// With [`fields`](Self::fields) or [`exclude`](Self::exclude) set: the
    /// function replaces the JSON handling they are part of.
    pub fn canonical_body(
        self,
        f: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        let o = &self.settings.fingerprint;
        if o.fields().is_some() || o.exclude().is_some() {
            panic!(
                "IdempotencyLayer::canonical_body: not with fields or exclude (they need the built-in canonical_json)"
            );
        }
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
    /// until an operator or a `settle_worker::Reconciler` resolves the
    /// record). It gets the retried request whole ([`ReconcileRequest`]:
    /// the client's key and principal too) and answers
    /// [`Resolution::Committed`] (settled and answered, as a replay;
    /// over `max_stored_body` it is settled with its digest, answered as
    /// given, and later replays get 409 `response_not_stored`),
    /// `NotCommitted` (the handler runs under the same fence) or
    /// `Unavailable` (409 `outcome_unknown`). The lease is heartbeated while
    /// it runs; an error, a panic or running past
    /// [`hook_timeout`](Self::hook_timeout) counts as `Unavailable`.
    ///
    /// ```no_run
    /// # fn demo(layer: settle_middleware::IdempotencyLayer) {
    /// use settle_middleware::{HookResponse, Resolution};
    /// let layer = layer.reconcile(|req: settle_middleware::ReconcileRequest| async move {
    ///     // Ask the provider for a charge under the client's key and account.
    ///     let _ = (&req.idempotency_key, &req.principal, &req.body);
    ///     Ok::<_, settle_middleware::BoxError>(Resolution::NotCommitted)
    /// });
    /// # }
    /// ```
    pub fn reconcile<F, Fut>(self, f: F) -> Self
    where
        F: Fn(ReconcileRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resolution, BoxError>> + Send + 'static,
    {
        let boxed: ReconcileFn = Arc::new(move |req| Box::pin(f(req)));
        self.with(|s| s.reconcile = Some(boxed))
    }

    /// A replay hook (like AWS Powertools' `response_hook`): called on
    /// every replay of a stored response (the key was answered before;
    /// the handler does not run) with that response (the stored headers,
    /// lower-case names) and the record's receipt; what it returns is sent
    /// instead, with `Idempotent-Replayed: true` and its own
    /// `content-length`. Not called when the hook of
    /// [`reconcile`](Self::reconcile) resolves a record, nor for a response
    /// too large to have been stored (409 `response_not_stored`).
    ///
    /// ```no_run
    /// # fn demo(layer: settle_middleware::IdempotencyLayer) {
    /// let layer = layer.on_replay(|mut stored, _receipt| {
    ///     stored.headers.push(("x-replayed-from".into(), b"settle".to_vec()));
    ///     stored
    /// });
    /// # }
    /// ```
    pub fn on_replay(
        self,
        f: impl Fn(HookResponse, &settle_core::Receipt) -> HookResponse + Send + Sync + 'static,
    ) -> Self {
        let hook: ReplayFn = Arc::new(f);
        self.with(|s| s.on_replay = Some(hook))
    }

    /// How long the reconcile hook may take (default: the lease); past it
    /// the hook counts as `Unavailable` (409 `outcome_unknown`).
    pub fn hook_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.hook_timeout = Some(timeout))
    }

    /// How long a claim (and a dispatch, for at most half the lease) that
    /// got no answer, 503 or 429 from settle is retried before the request
    /// is answered 503 `idempotency_unavailable` (default 2 s). A claim
    /// whose answer was lost is retried with the same `claim_id`, so it is
    /// answered with the lease it was granted (SPEC §4 rule 5a).
    pub fn ledger_deadline(self, deadline: Duration) -> Self {
        self.with(|s| s.ledger_deadline = deadline)
    }

    /// The statuses that say nothing happened, on every route (default
    /// 408, 409, 425, 429; a route's own policy may set its own): not
    /// stored, released `not_committed`, the retry runs the handler. The
    /// statuses added beyond those four (a framework's 422 for a request it
    /// refused itself) are released with `forget` (SPEC §8): no record is
    /// kept, and the corrected request with the same key runs.
    pub fn release_on(self, statuses: impl IntoIterator<Item = u16>) -> Self {
        let set = ReleaseOn::new(statuses);
        self.with(|s| s.policy.release_on = Some(set))
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
