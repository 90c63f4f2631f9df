//! The connection pool, timeouts, the bearer token and the trusted CAs of
//! an `https://` URL; the typed calls.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Uri};
use serde::de::DeserializeOwned;
use settle_api::{
    BatchRequest, BatchResponse, ClaimDecision, ClaimRequest, DispatchRequest, Dispatched, Health,
    HeartbeatRequest, LeaseInfo, ListResponse, PrincipalGeneration, ReceiptResponse,
    ReconcileRequest, ReconcileResponse, RecordView, ReleaseRequest, Released, Revoked,
    SettleRequest, Stats, WarnRequest, Warning, Warnings,
};

use crate::call::{self, Call};
use crate::download::Download;
use crate::error::ClientError;
use crate::reply::Reply;
use crate::tls::Trust;
use crate::transport::{Target, Transport};

/// Defaults of [`ClientBuilder`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A settle call answers after one durable commit; 30 s is far beyond it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle pooled connections are closed after this long.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    token: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    pool_idle_timeout: Duration,
    pool_max_idle: usize,
    single_connection: bool,
    trust: Trust,
}

impl ClientBuilder {
    /// The bearer token of the caller's tenant (none: a server without
    /// tenants on loopback). An empty token is none.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let t = token.into();
        self.token = (!t.is_empty()).then_some(t);
        self
    }
    /// How long to wait for a TCP connection (an `https://` URL's TLS
    /// handshake then counts towards the request timeout).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// How long a call may take from sending to the last byte of the answer.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
    /// How long an idle keep-alive connection stays in the pool.
    pub fn pool_idle_timeout(mut self, d: Duration) -> Self {
        self.pool_idle_timeout = d;
        self
    }
    /// At most this many idle connections are kept (default: no limit;
    /// connections are opened as concurrent calls need them). A client
    /// used by one task at a time keeps exactly one connection.
    pub fn pool_max_idle(mut self, n: usize) -> Self {
        self.pool_max_idle = n;
        self
    }

    /// One dedicated connection instead of a pool: calls take turns on it
    /// (concurrent calls wait for each other), with the least work per
    /// call. For load generators and clients owned by one task; a
    /// connection the server closed is replaced on the next call.
    pub fn single_connection(mut self) -> Self {
        self.single_connection = true;
        self
    }

    /// Also trusts the CA certificates in `pem` (one or more
    /// `-----BEGIN CERTIFICATE-----` blocks, e.g. the contents of
    /// `/etc/settle/ca.pem`) to sign the certificate of an `https://`
    /// server: how to reach a server whose certificate a private CA
    /// issued. Each call adds; the platform's trusted roots stay trusted
    /// unless [`ClientBuilder::tls_only_custom_roots`]. A PEM that holds
    /// no certificate, or one rustls cannot use, makes
    /// [`ClientBuilder::build`] fail with [`ClientError::Tls`] (whatever
    /// the URL's scheme).
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/settle/ca.pem")?;
    /// let client = settle_client::Client::builder("https://settle.internal:7411")
    ///     .add_root_certificate_pem(&ca)
    ///     .token("secret")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn add_root_certificate_pem(mut self, pem: &[u8]) -> Self {
        self.trust.add_pem(pem);
        self
    }

    /// Trusts only the CAs added with
    /// [`ClientBuilder::add_root_certificate_pem`], not the platform's
    /// roots: a server certificate that a public CA issued is then refused.
    /// (Without any added CA, [`ClientBuilder::build`] of an `https://`
    /// URL fails.)
    pub fn tls_only_custom_roots(mut self) -> Self {
        self.trust.only_custom();
        self
    }

    /// Checks the URL, the token and the added CA certificates and builds
    /// the client (for an `https://` URL, with the TLS settings; the
    /// platform's roots are read once per process). Needs a tokio runtime
    /// when calls are made, not here.
    pub fn build(self) -> Result<Client, ClientError> {
        let url = parse_url(&self.url)?;
        let auth = match &self.token {
            Some(t) => Some(HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                ClientError::Request("the token is not a valid header value".into())
            })?),
            None => None,
        };
        let custom_roots = self.trust.custom_roots()?;
        let tls = if url.https {
            Some(self.trust.config(custom_roots)?)
        } else {
            None
        };
        let target = Target::new(url.authority, url.prefix)?;
        let transport = if self.single_connection {
            Transport::single(self.connect_timeout, tls, &target)?
        } else {
            Transport::pooled(
                self.connect_timeout,
                self.pool_idle_timeout,
                self.pool_max_idle,
                tls,
            )
        };
        Ok(Client {
            inner: Arc::new(Inner {
                transport,
                target,
                auth,
                request_timeout: self.request_timeout,
            }),
        })
    }
}

/// A server URL, taken apart.
#[derive(Debug, PartialEq)]
struct ServerUrl {
    /// `https://`, not `http://`.
    https: bool,
    /// `HOST:PORT` (the scheme's port when the URL has none).
    authority: String,
    /// `/PREFIX` without a trailing `/`, or empty.
    prefix: String,
}

/// `http[s]://HOST[:PORT][/PREFIX]`.
fn parse_url(url: &str) -> Result<ServerUrl, ClientError> {
    const EXPECTED: &str = "expected http://HOST:PORT or https://HOST:PORT";
    let bad = |reason| ClientError::Url {
        url: url.to_string(),
        reason,
    };
    let uri: Uri = url.parse().map_err(|_| bad(EXPECTED))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(bad(EXPECTED)),
    };
    let Some(a) = uri.authority() else {
        return Err(bad(EXPECTED));
    };
    if a.host().is_empty() || a.as_str().contains('@') {
        return Err(bad(EXPECTED));
    }
    if uri.query().is_some() {
        return Err(bad("a server URL has no query"));
    }
    let default_port = if https { 443 } else { 80 };
    Ok(ServerUrl {
        https,
        authority: format!("{}:{}", a.host(), a.port_u16().unwrap_or(default_port)),
        prefix: uri.path().trim_end_matches('/').to_string(),
    })
}

/// A settle server: cheap to clone (clones share one pool of keep-alive
/// HTTP/1.1 connections), safe to use from many tasks at once.
///
/// Calls come in three forms: typed methods (`claim`, `settle`, ...),
/// [`Client::call`] with a [`Call`] value, and [`Client::send`] /
/// [`Client::send_raw`] for the answer as received. Errors are
/// [`ClientError`]: transport (no answer) or HTTP (the server's problem).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    target: Target,
    auth: Option<HeaderValue>,
    request_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Client")
            .field("server", &self.inner.target.authority)
            .field("token", &self.inner.auth.as_ref().map(|_| "…"))
            .field("request_timeout", &self.inner.request_timeout)
            .finish()
    }
}

impl Client {
    /// A client for `url` (`http://HOST:PORT` or `https://HOST:PORT`,
    /// optionally with a path prefix) with the default settings and no
    /// token; an `https://` server's certificate must be signed by a CA
    /// the platform trusts (a private CA:
    /// [`ClientBuilder::add_root_certificate_pem`]).
    pub fn new(url: &str) -> Result<Client, ClientError> {
        Client::builder(url).build()
    }

    /// Settings for a client of `url`.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_string(),
            token: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            pool_max_idle: usize::MAX,
            single_connection: false,
            trust: Trust::default(),
        }
    }

    /// `host:port` of the server.
    pub fn authority(&self) -> &str {
        &self.inner.target.authority
    }

    /// Sends `call` and reads its answer; an error status is a
    /// [`ClientError::Http`].
    pub async fn call<T: DeserializeOwned>(&self, call: &Call<T>) -> Result<T, ClientError> {
        call.parse(&self.send(call).await?)
    }

    /// Sends `call` and returns the answer as received, whatever its
    /// status; only a transport failure is an error.
    pub async fn send<T>(&self, call: &Call<T>) -> Result<Reply, ClientError> {
        self.send_raw(call.method.clone(), &call.path, call.body.clone())
            .await
    }

    /// Sends any request (`path` starts with `/`, segments already
    /// encoded; `body` is sent as `application/json`). For tools and tests
    /// that need requests the typed calls do not make.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Reply, ClientError> {
        let i = &self.inner;
        let req = self.request(method, path, body)?;
        match tokio::time::timeout(i.request_timeout, self.exchange(req)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout {
                authority: i.target.authority.clone(),
                after: i.request_timeout,
            }),
        }
    }

    /// A request for `path` with the token and, with a body, its content type.
    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let i = &self.inner;
        let mut req = Request::builder()
            .method(method)
            .uri(i.transport.uri(&i.target, path));
        if let Some(a) = &i.auth {
            req = req.header(AUTHORIZATION, a.clone());
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        #[cfg(feature = "opentelemetry")]
        if let Some(headers) = req.headers_mut() {
            crate::trace::inject(headers);
        }
        req.body(Full::new(body.unwrap_or_default()))
            .map_err(|e| ClientError::Request(e.to_string()))
    }

    /// `GET path`, answered as soon as the head arrives: the body is read
    /// piece by piece ([`Download::chunk`]), for answers too large to hold
    /// in memory. The request timeout bounds the wait for the head, and
    /// then each wait for the next piece of the body, not the whole
    /// download. An error status is read whole and returned as
    /// [`ClientError::Http`].
    pub async fn download(&self, path: &str) -> Result<Download, ClientError> {
        let i = &self.inner;
        let req = self.request(Method::GET, path, None)?;
        let timeout = || ClientError::Timeout {
            authority: i.target.authority.clone(),
            after: i.request_timeout,
        };
        let resp = tokio::time::timeout(i.request_timeout, i.transport.request(&i.target, req))
            .await
            .map_err(|_| timeout())??;
        let mut d = Download::new(resp, i.target.authority.clone(), i.request_timeout);
        if (200..300).contains(&d.status) {
            return Ok(d);
        }
        let mut body = Vec::new();
        while let Some(b) = d.chunk().await? {
            body.extend_from_slice(&b);
        }
        let reply = Reply {
            status: d.status,
            content_type: d.content_type,
            retry_after: d.retry_after,
            body: Bytes::from(body),
        };
        Err(reply.error().into())
    }

    /// `GET /v1/admin/export` (SPEC §12, with an admin token): a
    /// consistent snapshot of the whole store in the portable format,
    /// streamed. The download is whole only if the body ends normally (a
    /// server whose store failed midway aborts it: [`Download::chunk`]
    /// then fails) and its last line is the trailer; check the file with
    /// `settle_portable::verify` before trusting it.
    pub async fn export(&self) -> Result<Download, ClientError> {
        let d = self.download(settle_api::EXPORT_PATH).await?;
        if !d.content_type.starts_with(settle_api::EXPORT_MEDIA_TYPE) {
            return Err(ClientError::UnexpectedBody {
                status: d.status,
                reason: format!(
                    "the content type is {:?}, not {}",
                    d.content_type,
                    settle_api::EXPORT_MEDIA_TYPE
                ),
            });
        }
        Ok(d)
    }

    /// One request and its whole answer.
    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<Reply, ClientError> {
        let i = &self.inner;
        let resp = i.transport.request(&i.target, req).await?;
        let status = resp.status().as_u16();
        let header = |name| {
            resp.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let content_type = header(CONTENT_TYPE).unwrap_or("").to_string();
        let retry_after = header(RETRY_AFTER)
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Transport {
                authority: i.target.authority.clone(),
                source: e.into(),
            })?
            .to_bytes();
        Ok(Reply {
            status,
            content_type,
            retry_after,
            body,
        })
    }

    /// Reserves `key` and asks for permission to execute (SPEC §4 claim).
    pub async fn claim(&self, key: &str, req: &ClaimRequest) -> Result<ClaimDecision, ClientError> {
        self.call(&call::claim(key, req)?).await
    }
    /// Extends a lease.
    pub async fn heartbeat(
        &self,
        key: &str,
        req: &HeartbeatRequest,
    ) -> Result<LeaseInfo, ClientError> {
        self.call(&call::heartbeat(key, req)?).await
    }
    /// Records that the remote write is about to start.
    pub async fn dispatch(
        &self,
        key: &str,
        req: &DispatchRequest,
    ) -> Result<Dispatched, ClientError> {
        self.call(&call::dispatch(key, req)?).await
    }
    /// Records the outcome and releases the lease, in one durable commit.
    pub async fn settle(
        &self,
        key: &str,
        req: &SettleRequest,
    ) -> Result<ReceiptResponse, ClientError> {
        self.call(&call::settle(key, req)?).await
    }
    /// Releases an execute lease without a receipt.
    pub async fn release(&self, key: &str, req: &ReleaseRequest) -> Result<Released, ClientError> {
        self.call(&call::release(key, req)?).await
    }
    /// Reports what reconciliation found.
    pub async fn reconcile(
        &self,
        key: &str,
        req: &ReconcileRequest,
    ) -> Result<ReconcileResponse, ClientError> {
        self.call(&call::reconcile(key, req)?).await
    }
    /// The record of `key`.
    pub async fn get(&self, key: &str) -> Result<RecordView, ClientError> {
        self.call(&call::get(key)).await
    }
    /// Raises a principal's generation (revokes its older leases).
    pub async fn revoke(&self, principal: &str) -> Result<Revoked, ClientError> {
        self.call(&call::revoke(principal)?).await
    }
    /// A principal's current generation (0 for one never seen).
    pub async fn principal(&self, principal: &str) -> Result<PrincipalGeneration, ClientError> {
        self.call(&call::principal(principal)).await
    }
    /// Records a bounded warning.
    pub async fn warn(
        &self,
        task: &str,
        class: &str,
        req: &WarnRequest,
    ) -> Result<Warning, ClientError> {
        self.call(&call::warn(task, class, req)?).await
    }
    /// A task's warnings.
    pub async fn warnings(&self, task: &str) -> Result<Warnings, ClientError> {
        self.call(&call::warnings(task)).await
    }
    /// Many calls in one request (SPEC §10); each result is what the
    /// single call would have answered ([`settle_api::BatchResult::parse`]).
    pub async fn batch(&self, req: &BatchRequest) -> Result<BatchResponse, ClientError> {
        self.call(&call::batch(req)?).await
    }
    /// One page of the tenant's operations (SPEC §9).
    pub async fn list(&self, params: &call::ListParams) -> Result<ListResponse, ClientError> {
        self.call(&call::list(params)).await
    }
    /// The tenant's counts (SPEC §9).
    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.call(&call::stats()).await
    }
    /// `/healthz`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(&call::health()).await
    }
    /// `/readyz`.
    pub async fn ready(&self) -> Result<Health, ClientError> {
        self.call(&call::ready()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let url = |https, authority: &str, prefix: &str| ServerUrl {
            https,
            authority: authority.into(),
            prefix: prefix.into(),
        };
        for (text, expected) in [
            ("http://127.0.0.1:7411", url(false, "127.0.0.1:7411", "")),
            (
                "http://localhost/prefix/",
                url(false, "localhost:80", "/prefix"),
            ),
            (
                "https://settle.internal",
                url(true, "settle.internal:443", ""),
            ),
            ("HTTPS://h:7411/p", url(true, "h:7411", "/p")),
            ("https://[::1]:7411", url(true, "[::1]:7411", "")),
        ] {
            assert_eq!(parse_url(text).unwrap(), expected, "{text}");
        }
        for bad in [
            "x:1",
            "https://",
            "http://",
            "http://u@h:1",
            "http://h:1/?q",
            "ftp://h",
        ] {
            assert!(
                matches!(parse_url(bad), Err(ClientError::Url { .. })),
                "{bad}"
            );
        }
        assert!(Client::builder("http://h:1").token("a\nb").build().is_err());
    }
}
