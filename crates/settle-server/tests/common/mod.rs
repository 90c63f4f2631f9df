//! The router in process: the app over a store, requests sent with
//! `tower::ServiceExt::oneshot`, and a [`Server`] that stands in for
//! `settle serve` (its store, the embedded one in a directory, and its
//! router, configured as the flags configure them) without a process or a
//! socket. What needs those is tested in `crates/settle/tests/http.rs`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use serde_json::Value;
use settle_client::{Reply, api, operation_path};
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::{Clock, Store};
use settle_server::config::Settings;
use settle_server::{AppState, Config, router};
use tower::ServiceExt;

pub use settle_client::testkit::*;

/// The router over `store`, configured as a loopback test server.
pub fn app(store: Arc<dyn Store>) -> axum::Router {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = Config::local(addr, PathBuf::new());
    // Every scrape reads the store afresh (the gauge tests).
    config.metrics_refresh_ms = 0;
    router(Arc::new(AppState::new(store, &config)))
}

/// Sends a request; the answer's status and its body as JSON (`Null` when it is none).
pub async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let (status, _, text) = call_raw(app, method, path, body).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// Sends a request; the answer's status, headers and body.
pub async fn call_raw(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// `settle serve --data DIR` in process: the embedded store in `data`
/// opened as the binary opens it, and the router over it, both configured
/// by `settings` (the flags' values) as the binary configures them.
pub struct Server {
    app: axum::Router,
    store: Arc<EmbeddedStore>,
    state: Arc<AppState>,
    started: Config,
    settings: Settings,
}

impl Server {
    pub fn start(data: &Path, mut settings: Settings) -> Server {
        settings.data = Some(data.to_path_buf());
        settings.listen.get_or_insert_with(|| "127.0.0.1:0".into());
        let config = Config::from_settings(&settings).expect("valid settings");
        let clock = Clock::system();
        clock.advance(config.clock_skew_ms);
        let store = EmbeddedStore::open(
            data,
            EmbeddedOptions {
                limits: config.limits(),
                clock,
                ..EmbeddedOptions::default()
            },
        )
        .expect("the store opens");
        let state = Arc::new(AppState::new(store.clone(), &config));
        let app = router(state.clone());
        Server {
            app,
            store,
            state,
            started: config,
            settings,
        }
    }

    /// What SIGHUP does to `settle serve`: the configuration read again
    /// (the file, then the same flags), swapped in when it validates.
    pub fn reload(&self) -> settle_server::Reloaded {
        let settings = self.settings.clone();
        let load: settle_server::LoadConfig = Arc::new(move || Config::from_settings(&settings));
        settle_server::reload(&self.state, None, &self.started, &load)
    }

    /// A client without a token.
    pub fn ep(&self) -> Client {
        Client {
            app: self.app.clone(),
            token: None,
        }
    }

    /// A client sending `Authorization: Bearer <token>`.
    pub fn ep_token(&self, token: &str) -> Client {
        Client {
            app: self.app.clone(),
            token: Some(token.to_string()),
        }
    }

    /// Closes the store as the server does at shutdown; another [`Server`]
    /// may then open the same directory.
    pub fn terminate(self) {
        self.store.close();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.store.close();
    }
}

/// Sends requests to a [`Server`]'s router as `settle_client::Client`
/// sends them to a server: `Content-Type: application/json` and the
/// `Content-Length` with a body, the bearer token when it has one.
#[derive(Clone)]
pub struct Client {
    app: axum::Router,
    token: Option<String>,
}

impl Client {
    pub async fn send_raw(&self, method: Method, path: &str, body: Option<Bytes>) -> Reply {
        self.send_with(method, path, &HeaderMap::new(), body).await
    }

    /// [`Client::send_raw`] with more headers (they win over the client's own).
    pub async fn send_with(
        &self,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Option<Bytes>,
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(b) = &body {
            req = req
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_LENGTH, b.len());
        }
        let mut req = req.body(Body::from(body.unwrap_or_default())).unwrap();
        for (name, value) in headers {
            req.headers_mut().insert(name, value.clone());
        }
        reply(self.app.clone().oneshot(req).await.unwrap()).await
    }

    /// Sends a request as built, body and headers as they are.
    pub async fn send(&self, req: Request<Body>) -> Reply {
        reply(self.app.clone().oneshot(req).await.unwrap()).await
    }
}

/// An answer as `settle_client` receives it.
async fn reply(resp: axum::response::Response) -> Reply {
    let (parts, body) = resp.into_parts();
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &axum::http::HeaderValue| v.to_str().ok())
    };
    let content_type = header(header::CONTENT_TYPE).unwrap_or("").to_string();
    let retry_after = header(header::RETRY_AFTER)
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Reply {
        status: parts.status.as_u16(),
        content_type,
        retry_after,
        body,
    }
}

pub async fn post(ep: &Client, path: &str, body: Value) -> Reply {
    let body = Bytes::from(serde_json::to_vec(&body).unwrap());
    ep.send_raw(Method::POST, path, Some(body)).await
}

pub async fn post_raw(ep: &Client, path: &str, body: &[u8]) -> Reply {
    ep.send_raw(Method::POST, path, Some(Bytes::copy_from_slice(body)))
        .await
}

pub async fn get(ep: &Client, path: &str) -> Reply {
    if VIA_BATCH.try_with(|b| *b).unwrap_or(false)
        && let Some(seg) = path.strip_prefix("/v1/operations/")
        && !seg.contains('/')
        && let Some(key) = percent_decode(seg)
    {
        let call = api::BatchCall::new(api::BatchOp::Get, key, &api::EmptyRequest {});
        return batch_one(ep, call).await;
    }
    ep.send_raw(Method::GET, path, None).await
}

pub async fn op(ep: &Client, key: &str, call: &str, body: Value) -> Reply {
    if VIA_BATCH.try_with(|b| *b).unwrap_or(false)
        && let Value::Object(fields) = &body
    {
        let op: api::BatchOp =
            serde_json::from_value(Value::String(call.into())).expect("a batch op");
        let call = api::BatchCall {
            op,
            key: key.into(),
            fields: fields.clone(),
        };
        return batch_one(ep, call).await;
    }
    post(ep, &operation_path(key, call), body).await
}

tokio::task_local! {
    /// Set: [`op`] and [`get`] of an operation go through `POST /v1/batch`
    /// (one call per batch) instead of their single routes, so the same
    /// scenario checks that a batch slot answers what the single call does.
    pub static VIA_BATCH: bool;
}

/// Sends one call as a batch and returns its slot as if it were the single call's answer.
pub async fn batch_one(ep: &Client, call: api::BatchCall) -> Reply {
    let req = api::BatchRequest { calls: vec![call] };
    let r = post(ep, "/v1/batch", serde_json::to_value(&req).unwrap()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.content_type, "application/json");
    // Raw bodies: a slot keeps the single call's exact bytes.
    let v: api::BatchResponse = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v.results.len(), 1, "{v:?}");
    let status = v.results[0].status;
    Reply {
        status,
        content_type: if status == 200 {
            "application/json"
        } else {
            "application/problem+json"
        }
        .to_string(),
        retry_after: None,
        body: Bytes::from(v.results[0].body.get().to_string()),
    }
}

/// Decodes `%XX` escapes (the test's own paths are well formed).
fn percent_decode(seg: &str) -> Option<String> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(seg.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Claims `key` and expects `execute`; returns the fence.
pub async fn execute(ep: &Client, key: &str, f: u8, b: &Value) -> u64 {
    executed(&op(ep, key, "claim", claim_body(f, b)).await)
}

pub fn token_sha256(token: &str) -> String {
    settle_server::auth::token_sha256(token)
}
