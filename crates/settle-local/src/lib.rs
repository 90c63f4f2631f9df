//! # settle-local: settle's HTTP API in process
//!
//! The Python package `settle-local` and the Node package `@settle/local`
//! put a whole settle server inside the caller's process, without a
//! socket: a request goes from the SDK's transport straight into the
//! server's own router ([`settle_server::answer`]), over the in-memory
//! store or the embedded engine. The same handlers, validation, problem
//! codes and rules answer as over HTTP, so an SDK behaves the same on a
//! [`LocalLedger`] as on `settle serve`.
//!
//! Each call blocks its thread until the store has answered (durably, on
//! the embedded engine); the bindings call it with the GIL released (Python)
//! or on libuv's thread pool (Node), never on an event loop.
//!
//! The in-memory store keeps nothing past the process: its receipts say
//! `durable: false` (the one difference on the wire; see [`LocalLedger::call`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::BodyExt;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::{Clock, MemStore, Store, StoreError};
use settle_server::{AppState, Config, router};

/// Why opening or calling a local ledger failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The embedded store could not be opened (already open in another
    /// process, unreadable, …).
    #[error("cannot open the settle data directory {dir}: {source}")]
    Open {
        /// The directory.
        dir: PathBuf,
        /// What the engine said.
        source: StoreError,
    },
    /// The ledger was closed; open a new one.
    #[error("this local ledger is closed")]
    Closed,
    /// A request that is not HTTP (a bad method, header name or value).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The response body could not be read (not expected: bodies are in memory).
    #[error("reading the response failed: {0}")]
    Body(String),
}

/// The `segment_bytes` of a local ledger on disk unless told otherwise:
/// 4 MiB, so a data directory starts at about 8 MB (two segments) rather
/// than `settle serve`'s 129 MB. A local ledger is one process's; a small
/// segment only means more frequent checkpoints.
pub const LOCAL_SEGMENT_BYTES: u64 = 4 * 1024 * 1024;

/// The bounds of `segment_bytes`, as `settle serve --segment-bytes` takes it.
pub const SEGMENT_BYTES_RANGE: std::ops::RangeInclusive<u64> = 65_536..=1_073_741_824;

/// How a local ledger is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The embedded log's segment size (unused in memory); within
    /// [`SEGMENT_BYTES_RANGE`].
    pub segment_bytes: u64,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            segment_bytes: LOCAL_SEGMENT_BYTES,
        }
    }
}

/// One answer: what `settle serve` would have sent on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body's bytes.
    pub body: Vec<u8>,
}

/// The part of an answer an SDK reads ([`LocalLedger::exchange`]): no
/// header list is built for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body's bytes (JSON for every API route).
    pub body: Vec<u8>,
    /// The `Retry-After` header, if any (seconds).
    pub retry_after: Option<String>,
}

/// The runtime every local ledger of the process shares: two workers run
/// the sweep and the handlers' spawned work; callers drive their own
/// request with `block_on` on their thread.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("settle-local")
            .enable_all()
            .build()
            .expect("a tokio runtime (threads, timers) can be built")
    })
}

struct Open {
    app: axum::Router,
    sweep: tokio::task::JoinHandle<()>,
    close: Box<dyn FnOnce() + Send>,
}

/// A settle server in this process: the in-memory store, or the embedded
/// engine on a directory. Authentication is off (one tenant, `default`), as
/// on a loopback `settle serve` without tenants.
pub struct LocalLedger {
    open: Mutex<Option<Open>>,
    durable: bool,
    dir: Option<PathBuf>,
}

impl LocalLedger {
    /// Opens a ledger: in memory when `data` is `None` (nothing survives
    /// the process), else the embedded engine in `data` (created if
    /// missing, recovered if it was left by a crash).
    pub fn open(data: Option<&Path>) -> Result<LocalLedger, LocalError> {
        LocalLedger::open_with(data, &LocalOptions::default())
    }

    /// [`LocalLedger::open`] with options; a `segment_bytes` outside
    /// [`SEGMENT_BYTES_RANGE`] is [`LocalError::Invalid`].
    pub fn open_with(
        data: Option<&Path>,
        options: &LocalOptions,
    ) -> Result<LocalLedger, LocalError> {
        if !SEGMENT_BYTES_RANGE.contains(&options.segment_bytes) {
            return Err(LocalError::Invalid(format!(
                "segment_bytes must be within [{}, {}], not {}",
                SEGMENT_BYTES_RANGE.start(),
                SEGMENT_BYTES_RANGE.end(),
                options.segment_bytes
            )));
        }
        let dir = data.map(Path::to_path_buf);
        let config = Config::local(
            "127.0.0.1:0".parse().expect("a socket address"),
            dir.clone().unwrap_or_default(),
        );
        let (store, close): (Arc<dyn Store>, Box<dyn FnOnce() + Send>) = match &dir {
            None => (
                Arc::new(MemStore::new(config.limits(), Clock::system())),
                Box::new(|| {}),
            ),
            Some(d) => {
                let store = EmbeddedStore::open(
                    d,
                    EmbeddedOptions {
                        limits: config.limits(),
                        segment_bytes: options.segment_bytes,
                        ..EmbeddedOptions::default()
                    },
                )
                .map_err(|source| LocalError::Open {
                    dir: d.clone(),
                    source,
                })?;
                let closer = store.clone();
                (store, Box::new(move || closer.close()))
            }
        };
        let state = Arc::new(AppState::new(store.clone(), &config));
        let sweep = runtime().spawn(settle_server::sweep_loop(
            store,
            Duration::from_millis(config.sweep_interval_ms),
            state.metrics.clone(),
        ));
        Ok(LocalLedger {
            open: Mutex::new(Some(Open {
                app: router(state),
                sweep,
                close,
            })),
            durable: dir.is_some(),
            dir,
        })
    }

    /// Whether receipts survive the process (the embedded engine: yes).
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// The data directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Answers one request (`target` is the path with its query) as
    /// `settle serve` would, blocking until the store has answered. Must
    /// not be called from inside an async runtime's worker.
    ///
    /// On the in-memory store, every `"durable": true` of a JSON answer
    /// (receipts are the only objects with that field) says `false`: the
    /// engine's rules hand out receipts as durable, and only this layer
    /// knows that nothing under it is.
    pub fn call(
        &self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<Reply, LocalError> {
        let (status, headers, body) = self.respond(method, target, headers, body, false, |h| {
            h.iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect()
        })?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// [`LocalLedger::call`] for an SDK: the status, the body and
    /// `Retry-After`, the only parts of an answer the clients read (the
    /// same handlers answer; only the header list is not built). A
    /// non-empty `body` is JSON: `content-type: application/json` is
    /// implied unless `headers` name one.
    pub fn exchange(
        &self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<Answer, LocalError> {
        let (status, retry_after, body) =
            self.respond(method, target, headers, body, true, |h| {
                h.get("retry-after")
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            })?;
        Ok(Answer {
            status,
            body,
            retry_after,
        })
    }

    /// One request through the router (`json`: a body without a
    /// content-type is JSON): the status, what `read` takes of the
    /// headers, and the body (on the in-memory store with every receipt's
    /// `durable` false).
    fn respond<H>(
        &self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
        json: bool,
        read: impl FnOnce(&axum::http::HeaderMap) -> H,
    ) -> Result<(u16, H, Vec<u8>), LocalError> {
        let app = self.app()?;
        let req = request(method, target, headers, body, json)?;
        let (status, json, taken, body) = runtime().block_on(async move {
            let resp = settle_server::answer(app, req).await;
            let status = resp.status().as_u16();
            let json = resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            let taken = read(resp.headers());
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| LocalError::Body(e.to_string()))?
                .to_bytes()
                .to_vec();
            Ok::<_, LocalError>((status, json, taken, body))
        })?;
        let body = if self.durable || !json {
            body
        } else {
            not_durable(body)
        };
        Ok((status, taken, body))
    }

    fn app(&self) -> Result<axum::Router, LocalError> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.as_ref()
            .map(|o| o.app.clone())
            .ok_or(LocalError::Closed)
    }

    /// Stops the sweep and closes the store (the embedded engine syncs and
    /// releases its directory). Later calls answer [`LocalError::Closed`];
    /// closing twice does nothing.
    pub fn close(&self) {
        let taken = self.open.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(open) = taken {
            open.sweep.abort();
            drop(open.app);
            (open.close)();
        }
    }
}

impl Drop for LocalLedger {
    fn drop(&mut self) {
        self.close();
    }
}

fn request(
    method: &str,
    target: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    json: bool,
) -> Result<Request<Body>, LocalError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| LocalError::Invalid(format!("{what}: {e}"));
    let method = Method::from_bytes(method.as_bytes()).map_err(|e| bad("method", &e))?;
    let implied = json && !body.is_empty();
    let mut req = Request::builder()
        .method(method)
        .uri(target)
        .body(Body::from(body))
        .map_err(|e| bad("request target", &e))?;
    for (name, value) in headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad("header name", &e))?;
        let v = HeaderValue::from_str(value).map_err(|e| bad("header value", &e))?;
        req.headers_mut().append(n, v);
    }
    if implied && !req.headers().contains_key(CONTENT_TYPE) {
        req.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    Ok(req)
}

/// A JSON body with every `"durable": true` set to false.
fn not_durable(body: Vec<u8>) -> Vec<u8> {
    if !body.windows(9).any(|w| w == b"\"durable\"") {
        return body;
    }
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return body;
    };
    mark_not_durable(&mut value);
    let mut out = serde_json::to_vec(&value).expect("a JSON value serializes");
    out.push(b'\n');
    out
}

fn mark_not_durable(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(d @ serde_json::Value::Bool(true)) = map.get_mut("durable") {
                *d = serde_json::Value::Bool(false);
            }
            map.values_mut().for_each(mark_not_durable);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(mark_not_durable),
        _ => {}
    }
}
