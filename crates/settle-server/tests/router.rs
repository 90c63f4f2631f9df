//! The router in process, over stores a real server cannot be made to be:
//! one whose storage fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use settle_core::{Command, Key, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning};
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
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
}

fn app(store: Arc<dyn Store>) -> axum::Router {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = Config::local(addr, PathBuf::new());
    router(Arc::new(AppState::new(store, &config)))
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
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
    let (s, v) = call(&app, "POST", "/v1/principals/p/revoke", "").await;
    assert_eq!((s, v["generation"].as_u64()), (StatusCode::OK, Some(1)));
    let (s, v) = call(&app, "POST", "/v1/principals/p/revoke", r#"{"x":1}"#).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request"))
    );
}
