//! The service edge on the router in process (SPEC §12): reload swaps
//! tenants, tokens and quotas whole or not at all; per-tenant quotas
//! answer 429 `rate_limited` (with `Retry-After`) and `quota_exceeded`
//! while existing records keep working. That SIGHUP reaches the reload,
//! and TLS, are tested against the binary (crates/settle/tests/edge.rs).

mod common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};
use settle_client::Reply;
use settle_server::Reloaded;
use settle_server::config::Settings;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn tenant(name: &str, tokens: &[&str], extra: &str) -> String {
    let list: Vec<String> = tokens
        .iter()
        .map(|t| format!("\"{}\"", token_sha256(t)))
        .collect();
    format!(
        "[[tenants]]\nname = \"{name}\"\ntoken_sha256 = [{}]\n{extra}\n",
        list.join(", ")
    )
}

fn start(dir: &Path, file: &str) -> Server {
    let config = dir.join("settle.toml");
    write(&config, file);
    Server::start(
        &dir.join("data"),
        Settings {
            config: Some(config),
            ..Settings::default()
        },
    )
}

async fn status_of_get(s: &Server, token: &str, key: &str) -> u16 {
    get(&s.ep_token(token), &format!("/v1/operations/{key}"))
        .await
        .status
}

#[tokio::test]
async fn a_reload_adds_and_removes_a_token_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("settle.toml");
    let s = start(dir.path(), &tenant("acme", &["old"], ""));
    let b = binding("svc", 0);
    execute(&s.ep_token("old"), "k", 1, &b).await;
    assert_eq!(status_of_get(&s, "new", "k").await, 401);

    // Rotation, step 1: both tokens are acme's.
    write(&config, &tenant("acme", &["old", "new"], ""));
    assert_eq!(s.reload(), Reloaded::Applied { kept: vec![] });
    assert_eq!(status_of_get(&s, "old", "k").await, 200);
    assert_eq!(
        status_of_get(&s, "new", "k").await,
        200,
        "same tenant, same record"
    );

    // Step 2: the old token is gone.
    write(&config, &tenant("acme", &["new"], ""));
    assert_eq!(s.reload(), Reloaded::Applied { kept: vec![] });
    assert_eq!(status_of_get(&s, "old", "k").await, 401);
    assert_eq!(status_of_get(&s, "new", "k").await, 200);
}

#[tokio::test]
async fn an_invalid_file_is_refused_whole_and_the_running_configuration_stays() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("settle.toml");
    let s = start(dir.path(), &tenant("acme", &["a"], ""));
    let b = binding("svc", 0);
    execute(&s.ep_token("a"), "k", 1, &b).await;

    let bad = [
        // Not TOML.
        "[[tenants]\nname = ".to_string(),
        // A new token and a bad quota in the same file: neither applies.
        tenant("acme", &["a", "b"], "rate_per_s = 0"),
        // A new tenant and a malformed digest of another.
        format!(
            "{}[[tenants]]\nname = \"beta\"\ntoken_sha256 = \"nothex\"\n",
            tenant("acme", &["b"], "")
        ),
        // An unknown key.
        format!("{}colour = \"red\"\n", tenant("acme", &["b"], "")),
    ];
    for text in bad {
        write(&config, &text);
        match s.reload() {
            Reloaded::Refused(reason) => assert!(!reason.is_empty()),
            other => panic!("{text:?} was not refused: {other:?}"),
        }
        assert_eq!(status_of_get(&s, "a", "k").await, 200, "{text:?}");
        assert_eq!(status_of_get(&s, "b", "k").await, 401, "{text:?}");
    }
    // A missing file is refused too.
    std::fs::remove_file(&config).unwrap();
    assert!(matches!(s.reload(), Reloaded::Refused(_)));
    assert_eq!(status_of_get(&s, "a", "k").await, 200);
}

#[tokio::test]
async fn settings_fixed_until_a_restart_are_named_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("settle.toml");
    let s = start(dir.path(), &tenant("acme", &["a"], ""));
    write(
        &config,
        &format!(
            "lease_margin_ms = 250\nmax_body_bytes = 64\n{}",
            tenant("acme", &["a"], "")
        ),
    );
    assert_eq!(
        s.reload(),
        Reloaded::Applied {
            kept: vec!["lease_margin_ms"]
        }
    );
    // max_body_bytes is reloadable: a claim body is larger than 64 bytes.
    let b = binding("svc", 0);
    let r = op(&s.ep_token("a"), "k", "claim", claim_body(1, &b)).await;
    assert_problem(&r, 413, "payload_too_large");
}

#[tokio::test]
async fn over_its_rate_a_tenant_gets_429_rate_limited_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // One request per 100 s after a burst of 2: the third is refused
    // however slow the machine.
    let file = format!(
        "{}{}",
        tenant("acme", &["a"], "rate_per_s = 0.01\nburst = 2"),
        tenant("beta", &["b"], "")
    );
    let s = start(dir.path(), &file);
    let acme = s.ep_token("a");
    // A wrong token is refused before the rate and spends nothing.
    for _ in 0..3 {
        assert_eq!(status_of_get(&s, "wrong", "k").await, 401);
    }
    assert_eq!(get(&acme, "/v1/stats").await.status, 200);
    assert_eq!(get(&acme, "/v1/operations/k").await.status, 404);
    let r = get(&acme, "/v1/operations/k").await;
    assert_problem(&r, 429, "rate_limited");
    let retry = r.retry_after.expect("Retry-After").as_secs();
    assert!((1..=100).contains(&retry), "{retry}");
    // Every route of the tenant counts, a batch as one request.
    let r = post(&acme, "/v1/batch", json!({"calls": []})).await;
    assert_problem(&r, 429, "rate_limited");
    // Other tenants are not limited.
    for _ in 0..5 {
        assert_eq!(status_of_get(&s, "b", "k").await, 404);
    }
    // A reload that keeps the rate keeps the bucket (still spent) …
    let config = dir.path().join("settle.toml");
    write(&config, &format!("{file}\n"));
    assert_eq!(s.reload(), Reloaded::Applied { kept: vec![] });
    assert_eq!(status_of_get(&s, "a", "k").await, 429);
    // … and one that lifts it admits again.
    write(
        &config,
        &format!(
            "{}{}",
            tenant("acme", &["a"], ""),
            tenant("beta", &["b"], "")
        ),
    );
    assert_eq!(s.reload(), Reloaded::Applied { kept: vec![] });
    assert_eq!(status_of_get(&s, "a", "k").await, 404);
}

fn decision(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    v["decision"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn past_max_records_a_new_key_is_refused_and_existing_records_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &tenant("acme", &["a"], "max_records = 2"));
    let acme = s.ep_token("a");
    let b = binding("svc", 0);
    let f1 = execute(&acme, "k1", 1, &b).await;
    execute(&acme, "k2", 2, &b).await;

    let r = op(&acme, "k3", "claim", claim_body(3, &b)).await;
    assert_problem(&r, 429, "quota_exceeded");
    assert_eq!(r.retry_after, None);
    // Nothing was written for k3.
    assert_eq!(get(&acme, "/v1/operations/k3").await.status, 404);
    // Existing keys: settle, replay, reads.
    let r = op(&acme, "k1", "settle", settle_body(f1, 1, &b, completed(1))).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        decision(&op(&acme, "k1", "claim", claim_body(1, &b)).await),
        "replay"
    );
    assert_eq!(
        decision(&op(&acme, "k2", "claim", claim_body(2, &b)).await),
        "in_flight"
    );
    assert_eq!(get(&acme, "/v1/stats").await.status, 200);
    assert_eq!(get(&acme, "/v1/operations/k1").await.status, 200);

    // A batch counts each claim: an existing key goes through, a new one is refused in its slot.
    let r = post(
        &acme,
        "/v1/batch",
        json!({"calls": [
            {"op": "claim", "key": "k1", "fingerprint": fp(1), "binding": b},
            {"op": "claim", "key": "k4", "fingerprint": fp(4), "binding": b},
        ]}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["results"][0]["status"], 200, "{v}");
    assert_eq!(v["results"][0]["body"]["decision"], "replay");
    assert_eq!(v["results"][1]["status"], 429, "{v}");
    assert_eq!(v["results"][1]["body"]["code"], "quota_exceeded");

    let m = get(&s.ep(), "/metrics").await;
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.lines()
            .any(|l| l.starts_with("settle_quota_refusals_total{code=\"quota_exceeded\"}")),
        "{text}"
    );
    assert!(!text.contains("acme"), "no tenant label (SPEC §7)");
}

#[tokio::test]
async fn a_batch_of_new_keys_stops_at_max_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &tenant("acme", &["a"], "max_records = 3"));
    let acme = s.ep_token("a");
    let b = binding("svc", 0);
    let calls: Vec<Value> = (1..=5u8)
        .map(|i| json!({"op": "claim", "key": format!("n{i}"), "fingerprint": fp(i), "binding": b}))
        .collect();
    let r = post(&acme, "/v1/batch", json!({ "calls": calls })).await;
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let statuses: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{v}");
    // The count carries over to single calls.
    let r = op(&acme, "n6", "claim", claim_body(6, &b)).await;
    assert_problem(&r, 429, "quota_exceeded");
}
