//! SPEC §9 against a real `settle serve` process: `GET /v1/operations`,
//! `GET /v1/stats`, `settle list` / `settle stats`, and the Prometheus
//! gauges checked against the stats.

mod common;

use std::collections::HashSet;
use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// Records in every state an operator watches, under tenant `acme` via `ep`:
/// running, unknown (reconcile required, stuck with `--stuck-after-s 0`),
/// disputed, quarantined, and `n` completed ones.
async fn populate(ep: &settle_client::Client, n: usize) -> Vec<String> {
    let b = binding("svc", 0);
    let mut keys = Vec::new();
    execute(ep, "running", 1, &b).await;
    keys.push("running".to_string());
    let f = execute(ep, "unknown", 1, &b).await;
    let r = op(
        ep,
        "unknown",
        "settle",
        settle_body(f, 1, &b, json!({"status": "unknown"})),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    keys.push("unknown".into());
    let f = execute(ep, "disputed", 1, &b).await;
    assert_eq!(
        op(
            ep,
            "disputed",
            "settle",
            settle_body(f, 1, &b, completed(1))
        )
        .await
        .status,
        200
    );
    let r = op(
        ep,
        "disputed",
        "settle",
        settle_body(f, 1, &b, completed(2)),
    )
    .await;
    assert_problem(&r, 409, "result_mismatch");
    keys.push("disputed".into());
    let f = execute(ep, "quarantined", 1, &b).await;
    let r = op(
        ep,
        "quarantined",
        "settle",
        settle_body(f + 1000, 1, &b, completed(1)),
    )
    .await;
    assert_problem(&r, 409, "stale_fence");
    keys.push("quarantined".into());
    for i in 0..n {
        let k = format!("done-{i:03}");
        let f = execute(ep, &k, 1, &b).await;
        assert_eq!(
            op(ep, &k, "settle", settle_body(f, 1, &b, completed(1)))
                .await
                .status,
            200
        );
        keys.push(k);
    }
    keys.sort();
    keys
}

async fn list_all(ep: &settle_client::Client, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/operations?{query}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let r = get(ep, &path).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        out.extend(v["operations"].as_array().unwrap().iter().cloned());
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => {
                assert!(v["next"].is_null());
                return out;
            }
        }
    }
}

fn keys(ops: &[Value]) -> Vec<String> {
    ops.iter()
        .map(|o| o["key"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
#[allow(clippy::too_many_lines)] // one scenario, kept whole
async fn listing_and_stats_are_per_tenant_and_page_exactly_once() {
    let dir = TempDir::new("inspect");
    let acme = format!("acme={}", token_sha256("tok-acme"));
    let beta = format!("beta={}", token_sha256("tok-beta"));
    let s = Server::start(
        dir.path(),
        &["--tenant", &acme, "--tenant", &beta, "--stuck-after-s", "0"],
    );
    let ep = s.ep_token("tok-acme");
    let ours = populate(&ep, 7).await;
    let theirs = s.ep_token("tok-beta");
    execute(&theirs, "beta-only", 1, &binding("svc", 0)).await;

    let all = list_all(&ep, "limit=3").await;
    assert_eq!(
        keys(&all),
        ours,
        "every record once, in key order, only acme's"
    );
    let set: HashSet<String> = keys(&all).into_iter().collect();
    assert_eq!(set.len(), all.len());
    assert_eq!(keys(&list_all(&theirs, "limit=1").await), ["beta-only"]);

    // The summary's fields (SPEC §9).
    let q = all.iter().find(|o| o["key"] == "quarantined").unwrap();
    assert_eq!(q["status"], "running");
    assert_eq!(q["rank"], 0);
    assert_eq!(q["quarantined"], 1);
    assert_eq!(q["attempts"], 1);
    assert_eq!(q["lease"]["purpose"], "execute");
    assert_eq!(q["lease"]["dispatched"], false);
    assert!(q["lease"]["fence"].is_u64() && q["lease"]["expires_at"].is_string());
    assert!(q["created_at"].is_string() && q["updated_at"].is_string());
    assert!(q["expires_at"].is_null());
    let d = all.iter().find(|o| o["key"] == "disputed").unwrap();
    assert_eq!(
        (d["status"].clone(), d["disputed"].clone()),
        (json!("completed"), json!(true))
    );
    assert!(d["lease"].is_null() && d["expires_at"].is_string());

    // Filters.
    assert_eq!(keys(&list_all(&ep, "stuck=true").await), ["unknown"]);
    assert_eq!(
        keys(&list_all(&ep, "reconcile_required=true").await),
        ["unknown"]
    );
    assert_eq!(keys(&list_all(&ep, "disputed=true").await), ["disputed"]);
    assert_eq!(
        keys(&list_all(&ep, "status=running").await),
        ["quarantined", "running"]
    );
    assert_eq!(
        keys(&list_all(&ep, "status=unknown,failed&limit=1").await),
        ["unknown"]
    );
    assert_eq!(
        keys(&list_all(&ep, "quarantined=true").await),
        ["disputed", "quarantined"]
    );
    assert_eq!(list_all(&ep, "key_prefix=done-").await.len(), 7);

    // Counts.
    let st = get(&ep, "/v1/stats").await.json();
    assert_eq!(
        st,
        json!({
            "by_status": {"pending": 0, "running": 2, "unknown": 1, "conflict": 0,
                          "failed": 0, "completed": 8},
            "total": 11, "reconcile_required": 1, "disputed": 1, "stuck": 1,
            "quarantined": 2, "quarantined_records": 2, "refused": 0
        })
    );
    assert_eq!(get(&theirs, "/v1/stats").await.json()["total"], 1);

    // Bad input and no token.
    for bad in [
        "limit=0",
        "limit=1001",
        "status=bogus",
        "after=nothex",
        "stuck=maybe",
        "x=1",
    ] {
        assert_problem(
            &get(&ep, &format!("/v1/operations?{bad}")).await,
            422,
            "invalid_request",
        );
    }
    assert_problem(&get(&s.ep(), "/v1/operations").await, 401, "unauthorized");
    assert_problem(&get(&s.ep(), "/v1/stats").await, 401, "unauthorized");
    assert_problem(
        &get(&s.ep_token("wrong"), "/v1/stats").await,
        401,
        "unauthorized",
    );

    // The CLI, live.
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--url", &s.url()])
            .env("SETTLE_TOKEN", "tok-acme")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = cli(&["list", "--stuck"]);
    assert!(text.starts_with("unknown  status=unknown"), "{text}");
    assert!(
        text.contains("reconcile_required") && text.contains("end of listing"),
        "{text}"
    );
    let page: Value = serde_json::from_str(&cli(&["list", "--limit", "2", "--json"])).unwrap();
    assert_eq!(keys(page["operations"].as_array().unwrap()), ours[..2]);
    let cursor = page["next"].as_str().unwrap();
    let next: Value = serde_json::from_str(&cli(&[
        "list", "--limit", "2", "--cursor", cursor, "--json",
    ]))
    .unwrap();
    assert_eq!(keys(next["operations"].as_array().unwrap()), ours[2..4]);
    let text = cli(&["list", "--status", "running,unknown", "--limit", "1"]);
    assert!(text.contains("next: --cursor "), "{text}");
    let text = cli(&["stats"]);
    assert!(
        text.contains("total=11") && text.contains("stuck=1"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&cli(&["stats", "--json"])).unwrap();
    assert_eq!(v, st);
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
        .round() as u64
}

/// The gauges an operator alerts on agree with `/v1/stats` (one tenant, so
/// store-wide equals per tenant).
#[tokio::test]
async fn gauges_equal_the_stats_of_the_only_tenant() {
    let dir = TempDir::new("gauges");
    let acme = format!("acme={}", token_sha256("tok-acme"));
    let s = Server::start(dir.path(), &["--tenant", &acme, "--stuck-after-s", "0"]);
    let ep = s.ep_token("tok-acme");
    populate(&ep, 2).await;
    let st = get(&ep, "/v1/stats").await.json();
    let text = String::from_utf8(get(&s.ep(), "/metrics").await.body.to_vec()).unwrap();
    for (g, field) in [
        ("settle_records_unknown", &st["by_status"]["unknown"]),
        ("settle_records_stuck", &st["stuck"]),
        (
            "settle_records_reconcile_required",
            &st["reconcile_required"],
        ),
        ("settle_records_disputed", &st["disputed"]),
        ("settle_records_quarantined", &st["quarantined"]),
        (
            "settle_records_quarantined_records",
            &st["quarantined_records"],
        ),
    ] {
        assert_eq!(gauge(&text, g), field.as_u64().unwrap(), "{g}");
    }
    // Not all zero: the comparison means something.
    assert_eq!(gauge(&text, "settle_records_quarantined"), 2);
    assert_eq!(gauge(&text, "settle_records_unknown"), 1);
}
