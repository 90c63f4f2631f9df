//! The router in process, over stores a real server cannot be made to be:
//! one whose storage fails.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{app, call, call_raw};
use settle_core::{Command, Key, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning};
use settle_ledger::inspect::Scan;
use settle_ledger::{BoxFuture, MemStore, Store, StoreError, StoreStats, SweepReport};
use settle_server::{AppState, Config, router};
use tower::ServiceExt;

/// Every call fails as after a failed fsync.
struct FailingStore;

impl Store for FailingStore {
    fn execute<'a>(
        &'a self,
        _: &'a TenantId,
        _: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
    fn get<'a>(
        &'a self,
        _: &'a TenantId,
        _: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async { Err(StoreError::Io("disk gone".into())) })
    }
    fn generation<'a>(
        &'a self,
        _: &'a TenantId,
        _: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
    fn warnings<'a>(
        &'a self,
        _: &'a TenantId,
        _: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async { Err(StoreError::Io("disk gone".into())) })
    }
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
    fn stats(&self, _: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async { Err(StoreError::Closed) })
    }
    fn scan<'a>(
        &'a self,
        _: &'a TenantId,
        _: Option<&'a Key>,
        _: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        Box::pin(async { Err(StoreError::Database("down".into())) })
    }
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
}

/// Everything the server logs in this test process (one global subscriber).
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .try_init()
            .expect("the only subscriber of this test binary");
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A store that fails the way a test sets, over a working in-memory store.
struct Scripted {
    inner: MemStore,
    fail: Mutex<Option<StoreError>>,
    healthy: AtomicBool,
}

impl Scripted {
    fn new() -> Scripted {
        Scripted {
            inner: MemStore::default(),
            fail: Mutex::new(None),
            healthy: AtomicBool::new(true),
        }
    }
    fn failing(&self) -> Option<StoreError> {
        self.fail.lock().unwrap().clone()
    }
}

impl Store for Scripted {
    fn execute<'a>(
        &'a self,
        t: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        match self.failing() {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.inner.execute(t, cmd),
        }
    }
    fn get<'a>(
        &'a self,
        t: &'a TenantId,
        k: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        match self.failing() {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.inner.get(t, k),
        }
    }
    fn warnings<'a>(
        &'a self,
        t: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        self.inner.warnings(t, task)
    }
    fn generation<'a>(
        &'a self,
        t: &'a TenantId,
        p: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        self.inner.generation(t, p)
    }
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        self.inner.sweep()
    }
    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        self.inner.stats(stuck_after_ms)
    }
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        self.inner.now()
    }
    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        self.inner.scan(tenant, after, max)
    }
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let healthy = self.healthy.load(Ordering::SeqCst);
        Box::pin(async move {
            if healthy {
                Ok(())
            } else {
                Err(StoreError::Poisoned)
            }
        })
    }
}

fn claim_body() -> String {
    format!(
        r#"{{"fingerprint":"{}","binding":{{"principal":"p","scopes":[],"generation":0}}}}"#,
        "ab".repeat(32)
    )
}

#[tokio::test]
async fn storage_failures_are_503_unavailable_never_500() {
    let app = app(Arc::new(FailingStore));
    let (s, v) = call(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    let (s, v) = call(&app, "GET", "/v1/operations/k", "").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    let (s, _) = call(&app, "GET", "/v1/tasks/t/warnings", "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let (s, _) = call(&app, "GET", "/readyz", "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    // Liveness does not depend on the store; validation still comes first.
    assert_eq!(call(&app, "GET", "/healthz", "").await.0, StatusCode::OK);
    let (s, _) = call(&app, "POST", "/v1/operations/k/claim", "{").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_router_answers_the_rules_over_any_store() {
    let app = app(Arc::new(MemStore::default()));
    let (s, v) = call(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["decision"], "execute");
    let (s, v) = call(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
    assert_eq!(
        (s, v["decision"].as_str()),
        (StatusCode::OK, Some("in_flight"))
    );
    let (s, v) = call(&app, "GET", "/v1/principals/p", "").await;
    assert_eq!(v, serde_json::json!({"principal": "p", "generation": 0}));
    assert_eq!(s, StatusCode::OK);
    let (s, v) = call(&app, "POST", "/v1/principals/p/revoke", "").await;
    assert_eq!((s, v["generation"].as_u64()), (StatusCode::OK, Some(1)));
    let (_, v) = call(&app, "GET", "/v1/principals/p", "").await;
    assert_eq!(v["generation"], 1, "GET reads what revoke wrote");
    let (s, _) = call(&app, "GET", "/v1/principals/a%20b", "").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, v) = call(&app, "POST", "/v1/principals/p/revoke", r#"{"x":1}"#).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request"))
    );
}

/// Issue 8 item 18: a storage error's text (here a PostgreSQL DETAIL with
/// another tenant's row values) never reaches the client. The 503 carries a
/// generic `detail` and a `correlation_id`; the server log repeats the id
/// with the cause.
#[tokio::test]
async fn storage_error_text_stays_in_the_log_under_a_correlation_id() {
    let log = log();
    let store = Arc::new(Scripted::new());
    let app = app(store.clone());
    let secret = "duplicate key value violates unique constraint; DETAIL: Key (tenant, key)=(globex, payroll-2024-secret) already exists";
    *store.fail.lock().unwrap() = Some(StoreError::Database(secret.into()));
    for (method, path, body) in [
        ("POST", "/v1/operations/k/claim", claim_body()),
        ("GET", "/v1/operations/k", String::new()),
    ] {
        let (s, headers, text) = call_raw(&app, method, path, &body).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !text.contains("globex") && !text.contains("payroll"),
            "{text}"
        );
        assert!(
            !text.contains("DETAIL") && !text.contains("duplicate key"),
            "{text}"
        );
        assert!(headers.get("retry-after").is_none());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["code"], "unavailable");
        let id = v["correlation_id"].as_str().expect("a correlation id");
        assert!(v["detail"].as_str().unwrap().contains(id));
        let logged = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
        let line = logged
            .lines()
            .find(|l| l.contains(id))
            .unwrap_or_else(|| panic!("no log line for {id} in {logged}"));
        assert!(line.contains("payroll-2024-secret"), "{line}");
        // Plain values, not Rust debug text (`key=Some(Key("k"))`).
        assert!(line.contains(" key=k "), "{line}");
        assert!(!line.contains("Some("), "{line}");
    }
    // Two failures, two ids.
    let (_, a) = call(&app, "GET", "/v1/operations/k", "").await;
    let (_, b) = call(&app, "GET", "/v1/operations/k", "").await;
    assert_ne!(a["correlation_id"], b["correlation_id"]);
}

/// An overloaded store answers 503 `unavailable` with `Retry-After` in
/// whole seconds, at least 1; an in-doubt commit is 503 `unavailable`.
#[tokio::test]
async fn overload_carries_retry_after_and_in_doubt_is_unavailable() {
    let store = Arc::new(Scripted::new());
    let app = app(store.clone());
    for (ms, secs) in [(1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (2500, "3")] {
        *store.fail.lock().unwrap() = Some(StoreError::Overloaded { retry_after_ms: ms });
        let (s, headers, text) =
            call_raw(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["retry-after"], secs, "{ms} ms");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["code"], "unavailable");
    }
    *store.fail.lock().unwrap() = Some(StoreError::InDoubt(
        "connection lost during COMMIT to 10.0.0.7".into(),
    ));
    let (s, headers, text) = call_raw(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get("retry-after").is_none());
    assert!(!text.contains("10.0.0.7"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["code"], "unavailable");
    assert!(v["correlation_id"].is_string());
}

/// Issue 8 item 9: `/readyz` reports the store's health, both ways.
#[tokio::test]
async fn readyz_follows_the_stores_health() {
    let store = Arc::new(Scripted::new());
    let app = app(store.clone());
    assert_eq!(call(&app, "GET", "/readyz", "").await.0, StatusCode::OK);
    store.healthy.store(false, Ordering::SeqCst);
    let (s, v) = call(&app, "GET", "/readyz", "").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    assert!(v["correlation_id"].is_string());
    // Liveness is the process, not the store.
    assert_eq!(call(&app, "GET", "/healthz", "").await.0, StatusCode::OK);
    store.healthy.store(true, Ordering::SeqCst);
    assert_eq!(call(&app, "GET", "/readyz", "").await.0, StatusCode::OK);
}

/// Issue 8 item 9 with the real embedded engine: after a failed fsync the
/// store refuses writes, and `/readyz` says so.
#[tokio::test]
async fn readyz_is_503_once_the_embedded_store_is_poisoned() {
    use settle_embedded::{EmbeddedOptions, EmbeddedStore, Faults};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let store = EmbeddedStore::open(
        dir.path(),
        EmbeddedOptions {
            faults: Some(faults.clone()),
            ..EmbeddedOptions::default()
        },
    )
    .unwrap();
    let app = app(store.clone());
    assert_eq!(call(&app, "GET", "/readyz", "").await.0, StatusCode::OK);
    faults.fail_sync.store(true, Ordering::SeqCst);
    let (s, v) = call(&app, "POST", "/v1/operations/k/claim", &claim_body()).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    let (s, v) = call(&app, "GET", "/readyz", "").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    // Still refusing: no write is acknowledged after the failure.
    let (s, _) = call(&app, "POST", "/v1/operations/k2/claim", &claim_body()).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    store.close();
}

/// Issue 8 item 15: the disputed gauge is the store's count (not a counter
/// of this process's events), published on every scrape. Every gauge check
/// of this binary is in this one test: the recorder is process-wide.
#[tokio::test]
async fn the_disputed_gauge_is_read_from_the_store() {
    let store = Arc::new(MemStore::default());
    let app = app(store.clone());
    let gauge = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let (_, _, text) = call_raw(&app, "GET", "/metrics", "").await;
    assert_eq!(gauge(&text, "settle_records_disputed"), Some(0.0), "{text}");
    // Settle, then a disagreeing terminal result from the same fence: disputed.
    let (_, v) = call(&app, "POST", "/v1/operations/d/claim", &claim_body()).await;
    let fence = v["fence"].as_u64().unwrap();
    let settle = |digest: &str| {
        format!(
            r#"{{"fence":{fence},"fingerprint":"{}","binding":{{"principal":"p","scopes":[],"generation":0}},"outcome":{{"status":"completed","result":1,"response_sha256":"{}"}}}}"#,
            "ab".repeat(32),
            digest.repeat(32)
        )
    };
    assert_eq!(
        call(&app, "POST", "/v1/operations/d/settle", &settle("01"))
            .await
            .0,
        StatusCode::OK
    );
    let (s, v) = call(&app, "POST", "/v1/operations/d/settle", &settle("02")).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("result_mismatch"))
    );
    let (_, _, text) = call_raw(&app, "GET", "/metrics", "").await;
    assert_eq!(gauge(&text, "settle_records_disputed"), Some(1.0), "{text}");
    assert_eq!(
        gauge(&text, "settle_records_undecodable"),
        Some(0.0),
        "{text}"
    );
    // A fresh server over the same store (as after a restart) reports the
    // same: the gauge is the store's, not this process's memory.
    let again = crate::app(store.clone());
    let (_, _, text) = call_raw(&again, "GET", "/metrics", "").await;
    assert_eq!(gauge(&text, "settle_records_disputed"), Some(1.0), "{text}");
}

/// Issue 8 item 19 over HTTP: a lease that cannot outlast the margin is 422
/// naming `lease_ms`, for claim and heartbeat alike.
#[tokio::test]
async fn lease_ms_not_above_the_margin_is_422() {
    let app = app(Arc::new(MemStore::default()));
    let body = format!(
        r#"{{"fingerprint":"{}","binding":{{"principal":"p","scopes":[],"generation":0}},"lease_ms":100}}"#,
        "ab".repeat(32)
    );
    let (s, v) = call(&app, "POST", "/v1/operations/m/claim", &body).await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("lease_ms"))
    );
    assert!(
        v["detail"].as_str().unwrap().contains("lease_margin_ms"),
        "{v}"
    );
    assert_eq!(
        call(&app, "GET", "/v1/operations/m", "").await.0,
        StatusCode::NOT_FOUND
    );
    let (_, v) = call(&app, "POST", "/v1/operations/m/claim", &claim_body()).await;
    let fence = v["fence"].as_u64().unwrap();
    let (s, v) = call(
        &app,
        "POST",
        "/v1/operations/m/heartbeat",
        &format!(r#"{{"fence":{fence},"lease_ms":100}}"#),
    )
    .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("lease_ms"))
    );
}

/// Counts the calls that read every record.
struct Counting {
    inner: MemStore,
    stats: std::sync::atomic::AtomicU64,
    scans: std::sync::atomic::AtomicU64,
}

impl Store for Counting {
    fn execute<'a>(
        &'a self,
        t: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        self.inner.execute(t, cmd)
    }
    fn get<'a>(
        &'a self,
        t: &'a TenantId,
        k: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        self.inner.get(t, k)
    }
    fn warnings<'a>(
        &'a self,
        t: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        self.inner.warnings(t, task)
    }
    fn generation<'a>(
        &'a self,
        t: &'a TenantId,
        p: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        self.inner.generation(t, p)
    }
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        self.inner.sweep()
    }
    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        self.stats.fetch_add(1, Ordering::SeqCst);
        self.inner.stats(stuck_after_ms)
    }
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        self.inner.now()
    }
    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.scan(tenant, after, max)
    }
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.health()
    }
}

/// Issue 29 item 3: a scrape storm costs one scan of the store per
/// `metrics_refresh_ms`, and `metrics_token_sha256` puts `/metrics` behind
/// a bearer token (401 without it or with another one, a tenant's included).
#[tokio::test]
async fn metrics_scan_the_store_once_per_interval_behind_an_optional_token() {
    let store = Arc::new(Counting {
        inner: MemStore::default(),
        stats: Default::default(),
        scans: Default::default(),
    });
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = Config::local(addr, PathBuf::new());
    config.metrics_refresh_ms = 3_600_000;
    let digest =
        |t: &str| settle_core::Digest::parse("t", &settle_server::auth::token_sha256(t)).unwrap();
    config.metrics_token_sha256 = Some(digest("scrape-me"));
    let app = router(Arc::new(AppState::new(store.clone(), &config)));
    let scrape = |auth: Option<&str>| {
        let mut req = Request::builder().method("GET").uri("/metrics");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let req = req.body(Body::empty()).unwrap();
        let app = app.clone();
        async move { app.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(scrape(None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(Some("Bearer nope")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        scrape(Some("Basic scrape-me")).await,
        StatusCode::UNAUTHORIZED
    );
    // Refused scrapes read nothing.
    assert_eq!(store.stats.load(Ordering::SeqCst), 0);
    assert_eq!(store.scans.load(Ordering::SeqCst), 0);
    let storm: Vec<_> = (0..20).map(|_| scrape(Some("Bearer scrape-me"))).collect();
    for status in futures::future::join_all(storm).await {
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        store.stats.load(Ordering::SeqCst),
        1,
        "one stats read for 20 scrapes"
    );
    assert_eq!(
        store.scans.load(Ordering::SeqCst),
        1,
        "one scan (an empty store is one page) for 20 scrapes"
    );
}

/// Issue 29 item 4b: a known path with another method is 405 with `Allow`
/// (it was 404); an unknown path stays 404; every body ends with a newline.
#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_allow() {
    let app = app(Arc::new(MemStore::default()));
    for (method, path, allow) in [
        ("TRACE", "/healthz", "GET,HEAD"),
        ("DELETE", "/v1/operations/k", "GET,HEAD"),
        ("GET", "/v1/operations/k/claim", "POST"),
    ] {
        let (s, h, body) = call_raw(&app, method, path, "").await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {body}");
        assert_eq!(h["allow"], allow, "{method} {path}");
        assert_eq!(h["content-type"], "application/problem+json");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], "method_not_allowed");
        assert!(body.ends_with("}\n"), "{body:?}");
    }
    let (s, _, body) = call_raw(&app, "GET", "/v2/nothing", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.ends_with("}\n"), "{body:?}");
    for path in [
        "/v1/stats",
        "/v1/operations",
        "/v1/operations/nope",
        "/openapi.json",
    ] {
        let (_, _, body) = call_raw(&app, "GET", path, "").await;
        assert!(
            body.ends_with('\n') && !body.ends_with("\n\n"),
            "{path}: {body:?}"
        );
    }
    let (_, _, body) = call_raw(
        &app,
        "POST",
        "/v1/batch",
        r#"{"calls":[{"op":"get","key":"k"}]}"#,
    )
    .await;
    assert!(body.ends_with("]}\n"), "{body:?}");
}
