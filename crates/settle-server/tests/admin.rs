//! The admin endpoint of SPEC §12 on the router in process: who may call
//! `GET /v1/admin/export` (admin tokens only; open while authentication is
//! off), what it streams (a file `settle_portable::verify` accepts, holding
//! every entity written before the request, sent in several chunks), and
//! how it fails (503 `unavailable` for an engine without export, 503 before the stream,
//! an aborted body without a trailer midway).

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::*;
use http_body_util::BodyExt;
use serde_json::json;
use settle_core::{Command, Key, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning};
use settle_ledger::inspect::Scan;
use settle_ledger::{
    BoxFuture, MemStore, Part, Snapshot, Store, StoreError, StoreStats, SweepReport,
};
use settle_portable::{Entity, Reader};
use settle_server::admin::EXPORT_CONTENT_TYPE;
use settle_server::config::Settings;
use tower::ServiceExt;

const EXPORT: &str = "/v1/admin/export";

/// Claims and settles `key` for the client's tenant.
async fn settled(ep: &Client, key: &str, n: u8) {
    let b = binding("svc", 0);
    let fence = execute(ep, key, n, &b).await;
    let r = op(ep, key, "settle", settle_body(fence, n, &b, completed(n))).await;
    assert_eq!(r.status, 200, "{}", r.json());
}

/// The keys of the record lines of an export, as `tenant/key`.
fn record_keys(file: &[u8]) -> Vec<String> {
    Reader::new(file)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entity::Record { tenant, record } => Some(format!("{tenant}/{}", record.key)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn only_admin_tokens_may_export_when_authentication_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        Settings {
            tenants: vec![
                format!("acme={}", token_sha256("tok-acme")),
                format!("beta={}", token_sha256("tok-beta")),
            ],
            admin_tokens_sha256: vec![token_sha256("adm-1"), token_sha256("adm-2")],
            ..Settings::default()
        },
    );
    settled(&s.ep_token("tok-acme"), "a1", 1).await;
    settled(&s.ep_token("tok-beta"), "b1", 2).await;

    for (who, ep) in [
        ("no token", s.ep()),
        ("a tenant's token", s.ep_token("tok-acme")),
        ("an unknown token", s.ep_token("adm-3")),
    ] {
        let r = get(&ep, EXPORT).await;
        assert_problem(&r, 401, "unauthorized");
        assert!(!r.body.is_empty(), "{who}");
    }
    // An admin token is no tenant's: the tenants' routes refuse it.
    assert_problem(
        &get(&s.ep_token("adm-1"), "/v1/operations/a1").await,
        401,
        "unauthorized",
    );

    for admin in ["adm-1", "adm-2"] {
        let r = get(&s.ep_token(admin), EXPORT).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.content_type, EXPORT_CONTENT_TYPE);
        let summary = settle_portable::verify(&r.body[..]).unwrap();
        assert_eq!(summary.engine, "embedded");
        assert_eq!(summary.records, 2);
        // Every tenant's records, whoever asks.
        assert_eq!(record_keys(&r.body), ["acme/a1", "beta/b1"]);
    }
}

#[tokio::test]
async fn tenants_without_admin_tokens_leave_nobody_to_export() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        Settings {
            tenants: vec![format!("acme={}", token_sha256("tok-acme"))],
            ..Settings::default()
        },
    );
    for ep in [s.ep(), s.ep_token("tok-acme")] {
        let r = get(&ep, EXPORT).await;
        assert_problem(&r, 401, "unauthorized");
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("[admin] token_sha256"),
            "{}",
            r.json()
        );
    }
}

#[tokio::test]
async fn with_authentication_off_the_export_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    settled(&s.ep(), "k", 1).await;
    // No token, or any token: ignored, as on the tenants' routes.
    for ep in [s.ep(), s.ep_token("whatever")] {
        let r = get(&ep, EXPORT).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(record_keys(&r.body), ["default/k"]);
    }
}

/// `[admin]` on a loopback server without tenants: the tenants' routes
/// stay open (tenant `default`), the admin endpoint needs the admin token.
#[tokio::test]
async fn admin_tokens_close_the_export_even_without_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        Settings {
            admin_tokens_sha256: vec![token_sha256("adm")],
            ..Settings::default()
        },
    );
    settled(&s.ep(), "k", 1).await;
    assert_problem(&get(&s.ep(), EXPORT).await, 401, "unauthorized");
    assert_problem(
        &get(&s.ep_token("other"), EXPORT).await,
        401,
        "unauthorized",
    );
    let r = get(&s.ep_token("adm"), EXPORT).await;
    assert_eq!(r.status, 200);
    assert_eq!(record_keys(&r.body), ["default/k"]);
}

/// The file holds everything written before the request, entity by
/// entity: records with their receipts and attempts, principals' generations,
/// warning tasks; and the trailer's fence floor covers every fence granted.
#[tokio::test]
async fn the_export_holds_what_was_written_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    let ep = s.ep();
    for i in 0..20u8 {
        settled(&ep, &format!("k{i:02}"), i).await;
    }
    // One left open, under a lease.
    let open_fence = execute(&ep, "open", 1, &binding("svc", 0)).await;
    assert_eq!(
        post(&ep, "/v1/principals/alice/revoke", json!({}))
            .await
            .status,
        200
    );
    assert_eq!(
        post(&ep, "/v1/tasks/t1/warnings/slow", json!({"detail": "x"}))
            .await
            .status,
        200
    );
    let before: Vec<serde_json::Value> = {
        let mut v = Vec::new();
        for i in 0..20u8 {
            v.push(get(&ep, &format!("/v1/operations/k{i:02}")).await.json());
        }
        v
    };

    let r = get(&ep, EXPORT).await;
    assert_eq!(r.status, 200);
    let summary = settle_portable::verify(&r.body[..]).unwrap();
    assert_eq!(
        (summary.records, summary.principals, summary.warning_tasks),
        (21, 1, 1)
    );
    assert_eq!(summary.max_fence, open_fence);
    assert!(summary.fence_floor > open_fence, "{summary:?}");
    assert_eq!(summary.bytes, r.body.len() as u64);

    let mut reader = Reader::new(&r.body[..]).unwrap();
    assert_eq!(reader.header().format, "settle-export");
    let mut records = Vec::new();
    let mut others = Vec::new();
    while let Some(e) = reader.next_entity().unwrap() {
        match e {
            Entity::Record { record, .. } => records.push(record),
            e => others.push(format!("{:?}", e.order())),
        }
    }
    assert_eq!(
        others,
        [r#"(1, "default", "alice")"#, r#"(2, "default", "t1")"#]
    );
    assert_eq!(records.len(), 21);
    for (i, v) in before.iter().enumerate() {
        let rec = &records[i];
        assert_eq!(rec.key.as_str(), v["key"].as_str().unwrap());
        let receipt = rec.receipt.as_ref().expect("settled records have receipts");
        assert_eq!(
            receipt.fence.0,
            v["receipt"]["fence"].as_u64().unwrap(),
            "{v}"
        );
    }
    assert_eq!(records[20].key.as_str(), "open");
}

#[tokio::test]
async fn a_large_export_is_sent_in_several_chunks() {
    let app = app(Arc::new(MemStore::default()));
    claims(&app, 2500).await;
    let req = Request::builder().uri(EXPORT).body(Body::empty()).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store");
    let mut body = resp.into_body();
    let mut frames = 0;
    let mut file = Vec::new();
    while let Some(f) = body.frame().await {
        let f = f.unwrap();
        if let Some(d) = f.data_ref() {
            frames += 1;
            file.extend_from_slice(d);
        }
    }
    // The store hands out 1,024 entities per chunk: three chunks, the
    // trailer after them.
    assert!(frames >= 3, "{frames} frames");
    let summary = settle_portable::verify(&file[..]).unwrap();
    assert_eq!(summary.records, 2500);
}

/// A store of a test: exports as `export` says, over a working memory store.
struct Exporting {
    inner: MemStore,
    export: fn(&MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>>,
    floor: Result<u64, StoreError>,
}

impl Store for Exporting {
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
        self.inner.health()
    }
    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        (self.export)(&self.inner)
    }
    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        let f = self.floor.clone();
        Box::pin(async move { f })
    }
}

fn exporting(
    export: fn(&MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>>,
    floor: Result<u64, StoreError>,
) -> axum::Router {
    app(Arc::new(Exporting {
        inner: MemStore::default(),
        export,
        floor,
    }))
}

/// The body as far as it arrived, and whether it ended in an error.
async fn read_body(app: &axum::Router) -> (StatusCode, Vec<u8>, Option<String>) {
    let req = Request::builder().uri(EXPORT).body(Body::empty()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(e) => return (status, got, Some(e.to_string())),
        }
    }
    (status, got, None)
}

#[tokio::test]
async fn an_engine_without_export_answers_503_unavailable() {
    // `Store::export`'s default: unsupported.
    fn unsupported(_: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async { Err(StoreError::Unsupported("export".into())) })
    }
    let (s, v) = call(&exporting(unsupported, Ok(1)), "GET", EXPORT, "").await;
    assert_eq!((s.as_u16(), v["code"].as_str()), (503, Some("unavailable")));
    assert!(
        v["detail"].as_str().unwrap().contains("cannot export"),
        "{v}"
    );
}

#[tokio::test]
async fn a_store_failure_before_the_stream_is_503() {
    fn poisoned(_: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async { Err(StoreError::Poisoned) })
    }
    let (s, h, text) = call_raw(&exporting(poisoned, Ok(1)), "GET", EXPORT, "").await;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((s.as_u16(), v["code"].as_str()), (503, Some("unavailable")));
    assert_eq!(h[header::CONTENT_TYPE], "application/problem+json");
    assert!(v["correlation_id"].is_string(), "{v}");
}

/// Claims `k00000`, `k00001`, … through the router.
async fn claims(app: &axum::Router, n: usize) {
    let body = claim_body(1, &binding("p", 0)).to_string();
    for i in 0..n {
        let (s, v) = call(app, "POST", &format!("/v1/operations/k{i:05}/claim"), &body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}

/// Every entity of `store`, as its own export hands them out.
async fn entities(store: &MemStore) -> Vec<Entity> {
    let mut snap = store.export().await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = snap.next_chunk().await.unwrap() {
        out.extend(chunk);
    }
    out
}

/// The store fails after the first chunk: the client gets the first
/// chunk's bytes and then an error, never a trailer; what it got does not
/// verify.
#[tokio::test]
async fn a_store_failure_midway_aborts_the_body_without_a_trailer() {
    // The store's entities, then a failure.
    fn fails_midway(inner: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            let all = entities(inner).await;
            let (snap, tx) = Snapshot::channel("memory", 5, 1);
            tokio::spawn(async move {
                tx.send(Ok(Part::Entities(all))).await.unwrap();
                tx.send(Err(StoreError::Io("disk gone".into())))
                    .await
                    .unwrap();
            });
            Ok(snap)
        })
    }
    let app = exporting(fails_midway, Ok(9));
    claims(&app, 2).await;
    let (status, got, err) = read_body(&app).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the head was sent before the failure"
    );
    assert!(err.is_some(), "the body ends in an error");
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains(r#""key":"k00001""#), "{text}");
    assert!(!text.contains("trailer"), "{text}");
    let e = settle_portable::verify(&got[..]).unwrap_err();
    assert!(matches!(e, settle_portable::Error::Truncated { .. }), "{e}");

    // The producer dies after the first chunk without a word (a panic in
    // its task): the channel closes without `End`, and no trailer is
    // written either (before `Part::End`, a closed channel read as the end).
    fn dies_midway(inner: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            let all = entities(inner).await;
            let (snap, tx) = Snapshot::channel("memory", 5, 1);
            tokio::spawn(async move {
                tx.send(Ok(Part::Entities(all))).await.unwrap();
                panic!("the producer dies (injected)");
            });
            Ok(snap)
        })
    }
    let app = exporting(dies_midway, Ok(9));
    claims(&app, 2).await;
    let (status, got, err) = read_body(&app).await;
    assert_eq!(status, StatusCode::OK);
    assert!(err.is_some(), "the body ends in an error");
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains(r#""key":"k00001""#), "{text}");
    assert!(!text.contains("trailer"), "{text}");
    assert!(settle_portable::verify(&got[..]).is_err());

    // The fence counter fails once every entity is out: no trailer either.
    fn whole(inner: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        inner.export()
    }
    let app = exporting(whole, Err(StoreError::Closed));
    claims(&app, 1).await;
    let (_, got, err) = read_body(&app).await;
    assert!(err.is_some());
    assert!(!String::from_utf8_lossy(&got).contains("trailer"));
    assert!(settle_portable::verify(&got[..]).is_err());
    // With it, the same snapshot is a whole file.
    let app = exporting(whole, Ok(7));
    claims(&app, 1).await;
    let (_, got, err) = read_body(&app).await;
    assert_eq!(err, None);
    let s = settle_portable::verify(&got[..]).unwrap();
    assert_eq!((s.records, s.fence_floor), (1, 7));
}

/// The router on a real socket, as `settle serve` runs it (hyper's HTTP/1.1
/// server); the address to reach it at.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Over a real connection, `settle_client::Client::export` streams a
/// whole file; an export the store fails midway reaches the client as an
/// error after the bytes sent so far (hyper ends the chunked body without
/// its terminator), never as a short success.
#[tokio::test]
async fn over_http_an_aborted_export_is_an_error_for_the_client() {
    fn fails_midway(inner: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            let all = entities(inner).await;
            let (snap, tx) = Snapshot::channel("memory", 5, 1);
            tokio::spawn(async move {
                tx.send(Ok(Part::Entities(all))).await.unwrap();
                // The client has the first chunk before the failure.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                tx.send(Err(StoreError::Io("disk gone".into())))
                    .await
                    .unwrap();
            });
            Ok(snap)
        })
    }
    fn whole(inner: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        inner.export()
    }
    type Export = fn(&MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>>;
    for (export, whole_file) in [(whole as Export, true), (fails_midway as Export, false)] {
        let app = exporting(export, Ok(9));
        claims(&app, 3).await;
        let client = settle_client::Client::new(&serve(app).await).unwrap();
        let mut d = client.export().await.unwrap();
        assert_eq!(
            (d.status, d.content_type.as_str()),
            (200, EXPORT_CONTENT_TYPE)
        );
        let mut file = Vec::new();
        let end = loop {
            match d.chunk().await {
                Ok(Some(b)) => file.extend_from_slice(&b),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        assert_eq!(d.received(), file.len() as u64);
        if whole_file {
            end.unwrap();
            assert_eq!(settle_portable::verify(&file[..]).unwrap().records, 3);
        } else {
            let e = end.unwrap_err();
            assert!(e.is_transport(), "{e}");
            assert!(!file.is_empty());
            assert!(settle_portable::verify(&file[..]).is_err());
        }
    }

    // An error status arrives as the problem it is.
    fn unsupported(_: &MemStore) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async { Err(StoreError::Unsupported("export".into())) })
    }
    let client = settle_client::Client::new(&serve(exporting(unsupported, Ok(1))).await).unwrap();
    let e = client.export().await.unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(503), Some(settle_client::api::Code::Unavailable))
    );
}
