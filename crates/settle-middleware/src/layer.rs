//! The tower [`Layer`] and its [`Service`]: the layer's options, and the
//! service that runs SPEC §8's table against the ledger around any
//! axum/hyper service. One request's run is `run.rs`; capturing the
//! handler's response and recording the outcome, `capture.rs`; the answers
//! the layer makes itself (refusals, replays), `answer.rs`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::HeaderName;
use axum::http::request::Parts;
use axum::http::{Method, Request, Response};
use settle_core::{Fence, LeaseMs, RetentionS};
use tower::{Layer, Service};

use crate::backend::{BoxFuture, Transport};
use crate::layout;
use crate::principal::{Identity, PrincipalFn};
use crate::run::Run;
use crate::table::RoutePolicy;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
                fingerprint: layout::FingerprintOptions::default(),
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
