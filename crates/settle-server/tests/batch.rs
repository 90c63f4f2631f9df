//! `POST /v1/batch` (SPEC §10) on the router in process: calls apply in
//! order, each fails in its own slot, the limits refuse the whole request.
//! (Every single call also runs through a batch slot in `http_calls.rs`.)

mod common;

use common::*;
use serde_json::json;
use settle_client::operation_path;
use settle_server::config::Settings;

/// SPEC §10: calls apply in order (a later call sees an earlier one, a
/// `get` sees the calls before it), a malformed call fails in its own slot.
/// (That every result is durable before the response is tested against the
/// binary, crates/settle/tests/http.rs.)
#[tokio::test]
async fn batch_calls_apply_in_order_and_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    let ep = s.ep();
    let b = binding("svc", 0);
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [
            batch_call("claim", "b/1", claim_body(1, &b)),
            batch_call("claim", "b%41", claim_body(1, &b)),
            batch_call("claim", "b/1", claim_body(1, &b)),
            batch_call("get", "b/1", json!({})),
            json!({"op": "nope", "key": "x"}),
            json!({"key": "x"}),
            json!({"op": "claim"}),
            json!(5),
            batch_call("claim", "b3", json!({"fingerprint": "zz", "binding": b})),
            batch_call("claim", "", claim_body(1, &b)),
            batch_call("get", "never", json!({})),
            batch_call("settle", "never", settle_body(1, 1, &b, completed(1))),
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let res = v["results"].as_array().unwrap();
    assert_eq!(res.len(), 12, "{v}");
    let status: Vec<u64> = res.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(
        status,
        [200, 200, 200, 200, 422, 422, 422, 400, 422, 422, 404, 404]
    );
    assert_eq!(res[0]["body"]["decision"], "execute");
    assert_eq!(res[1]["body"]["decision"], "execute");
    // `b%41` is the raw key, not "bA".
    assert_eq!(
        get(&ep, "/v1/operations/bA").await.status,
        404,
        "the key of a call is not percent-decoded"
    );
    assert_eq!(res[2]["body"]["decision"], "in_flight");
    assert_eq!(
        res[3]["body"]["status"], "running",
        "get sees the claim before it"
    );
    assert_eq!(
        res[3]["body"]["key"], "b/1",
        "the raw key, not percent-decoded"
    );
    assert_eq!(res[4]["body"]["field"], "op");
    assert_eq!(res[5]["body"]["field"], "op");
    assert_eq!(res[6]["body"]["field"], "key");
    assert_eq!(res[7]["body"]["code"], "bad_request");
    assert_eq!(res[8]["body"]["field"], "fingerprint");
    assert_eq!(res[9]["body"]["field"], "key");
    assert_eq!(res[10]["body"]["code"], "not_found");
    assert_eq!(res[11]["body"]["code"], "not_found");
    let f1 = res[0]["body"]["fence"].as_u64().unwrap();
    let f2 = res[1]["body"]["fence"].as_u64().unwrap();

    // Settle both and replay one in the same batch; the replay sees the settlement.
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [
            batch_call("settle", "b/1", settle_body(f1, 1, &b, completed(1))),
            batch_call("claim", "b/1", claim_body(1, &b)),
            batch_call("settle", "b%41", settle_body(f2, 1, &b, completed(2))),
        ]}),
    )
    .await;
    let v = r.json();
    let res = v["results"].as_array().unwrap();
    assert_eq!(res[0]["status"], 200, "{v}");
    assert_eq!(res[1]["body"]["decision"], "replay");
    assert_eq!(res[1]["body"]["receipt"], res[0]["body"]["receipt"]);
    assert_eq!(res[2]["body"]["receipt"]["status"], "completed");

    // An empty batch is an empty answer.
    let r = post(&ep, "/v1/batch", json!({"calls": []})).await;
    assert_eq!(r.json(), json!({"results": []}));
}

/// The limits of a batch: the whole request is refused, nothing is written.
#[tokio::test]
async fn batch_limits_refuse_the_whole_request() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        Settings {
            max_batch_calls: Some(2),
            max_batch_body_bytes: Some(1000),
            ..Settings::default()
        },
    );
    let ep = s.ep();
    let b = binding("svc", 0);
    let claim = |key: &str| batch_call("claim", key, claim_body(1, &b));
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [claim("l1"), claim("l2"), claim("l3")]}),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    assert_eq!(r.json()["field"], "calls");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("max_batch_calls")
    );
    assert_eq!(get(&ep, &operation_path("l1", "")).await.status, 404);

    let big = "x".repeat(1100);
    let r = post(&ep, "/v1/batch", json!({"calls": [], "pad": big})).await;
    assert_problem(&r, 413, "payload_too_large");
    let r = post(&ep, "/v1/batch", json!({"calls": 1})).await;
    assert_problem(&r, 422, "invalid_request");
    let r = post(&ep, "/v1/batch", json!({"claims": []})).await;
    assert_problem(&r, 422, "invalid_request");
    let r = post_raw(&ep, "/v1/batch", b"[1]").await;
    assert_problem(&r, 400, "bad_request");
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [claim("l1"), claim("l2")]}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(get(&ep, &operation_path("l2", "")).await.status, 200);

    let doc = get(&ep, "/openapi.json").await.json();
    assert!(doc["paths"]["/v1/batch"]["post"].is_object());
}
