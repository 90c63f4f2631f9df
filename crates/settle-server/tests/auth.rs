//! Authentication on the router in process: bearer tokens map to tenants
//! (from the config file's `[[tenants]]` and the `--tenant` values, as
//! `settle serve` reads them), tenants are isolated, records written with
//! authentication off belong to tenant `default`, and the token may follow
//! several spaces. (That the server refuses to start with authentication
//! off on a non-loopback address is tested against the binary.)

mod common;

use axum::http::{HeaderMap, HeaderValue, Method, header};
use common::*;
use serde_json::json;
use settle_server::config::Settings;

#[tokio::test]
async fn auth_maps_tokens_to_tenants_and_isolates_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("settle.toml");
    std::fs::write(
        &config,
        format!(
            "[[tenants]]\nname = \"acme\"\ntoken_sha256 = \"{}\"\n",
            token_sha256("tok-acme")
        ),
    )
    .unwrap();
    let beta = format!("beta={}", token_sha256("tok-beta"));
    let s = Server::start(
        &dir.path().join("data"),
        Settings {
            config: Some(config),
            tenants: vec![beta],
            ..Settings::default()
        },
    );
    let b = binding("svc", 0);

    let r = op(&s.ep(), "k", "claim", claim_body(1, &b)).await;
    assert_problem(&r, 401, "unauthorized");
    let r = op(&s.ep_token("wrong"), "k", "claim", claim_body(1, &b)).await;
    assert_problem(&r, 401, "unauthorized");
    assert_problem(
        &get(&s.ep_token("wrong"), "/v1/operations/k").await,
        401,
        "unauthorized",
    );
    assert_problem(
        &get(&s.ep(), "/v1/tasks/t/warnings").await,
        401,
        "unauthorized",
    );
    // Unauthenticated attempts wrote nothing.
    let acme = s.ep_token("tok-acme");
    assert_problem(&get(&acme, "/v1/operations/k").await, 404, "not_found");

    let fence = execute(&acme, "k", 1, &b).await;
    op(
        &acme,
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await;
    post(&acme, "/v1/tasks/t/warnings/c", json!({})).await;
    post(&acme, "/v1/principals/svc/revoke", json!({})).await;

    // Another tenant sees none of it: not the record, not the warning, not the generation.
    let beta = s.ep_token("tok-beta");
    assert_problem(&get(&beta, "/v1/operations/k").await, 404, "not_found");
    assert_eq!(
        get(&beta, "/v1/tasks/t/warnings").await.json(),
        json!({"warnings": []})
    );
    let fence = execute(&beta, "k", 2, &b).await;
    let r = op(
        &beta,
        "k",
        "settle",
        settle_body(fence, 2, &b, completed(2)),
    )
    .await;
    assert_eq!(r.status, 200);
    // acme's revocation moved only acme's principal; acme's own record is intact.
    let r = op(&acme, "k", "claim", claim_body(1, &binding("svc", 1))).await;
    assert_eq!(
        r.json()["outcome"]["result"],
        json!({"charge": 1}),
        "{}",
        r.json()
    );
    assert_problem(
        &op(&acme, "k9", "claim", claim_body(1, &b)).await,
        409,
        "stale_binding",
    );

    // Operational endpoints need no token.
    for p in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(get(&s.ep(), p).await.status, 200, "{p}");
    }
}

/// Records written with authentication off belong to tenant `default`; once
/// `[[tenants]]` are configured, only a tenant named `default` reaches them
/// (docs/http-api.md, "Authentication").
#[tokio::test]
async fn records_written_without_auth_belong_to_the_default_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let b = binding("svc", 0);
    let s = Server::start(&data, Settings::default());
    let fence = execute(&s.ep(), "k", 1, &b).await;
    let r = op(
        &s.ep(),
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await;
    assert_eq!(r.status, 200);
    s.terminate();

    // Auth on, without a `default` tenant: the record is out of every tenant's reach.
    let acme = format!("acme={}", token_sha256("tok-acme"));
    let s = Server::start(
        &data,
        Settings {
            tenants: vec![acme.clone()],
            ..Settings::default()
        },
    );
    let r = get(&s.ep_token("tok-acme"), "/v1/operations/k").await;
    assert_problem(&r, 404, "not_found");
    s.terminate();

    // A tenant named `default` brings it back, receipt intact; acme still sees nothing.
    let default = format!("default={}", token_sha256("tok-default"));
    let s = Server::start(
        &data,
        Settings {
            tenants: vec![acme, default],
            ..Settings::default()
        },
    );
    let r = get(&s.ep_token("tok-default"), "/v1/operations/k").await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["status"], "completed");
    let r = op(&s.ep_token("tok-default"), "k", "claim", claim_body(1, &b)).await;
    assert_eq!(
        r.json()["outcome"]["result"],
        json!({"charge": 1}),
        "{}",
        r.json()
    );
    let r = get(&s.ep_token("tok-acme"), "/v1/operations/k").await;
    assert_problem(&r, 404, "not_found");
}

/// Issue 8 item 23: RFC 9110 §11.4 allows several spaces after `Bearer`.
#[tokio::test]
async fn bearer_tokens_may_follow_several_spaces() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = format!("acme={}", token_sha256("tok-acme"));
    let s = Server::start(
        dir.path(),
        Settings {
            tenants: vec![tenant],
            ..Settings::default()
        },
    );
    let warnings = |auth: &'static str| {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static(auth));
        let ep = s.ep();
        async move {
            ep.send_with(Method::GET, "/v1/tasks/t/warnings", &h, None)
                .await
        }
    };
    for auth in ["Bearer tok-acme", "Bearer   tok-acme", "bearer  tok-acme"] {
        let r = warnings(auth).await;
        let text = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, 200, "{auth:?}: {text}");
    }
    assert_eq!(warnings("Bearer   nope").await.status, 401);
}
