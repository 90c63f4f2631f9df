//! SPEC §7 against a real `settle serve` process.

mod common;

use common::*;
use hyper::Method;
use serde_json::{Value, json};
use settle_client::{api, operation_path};

/// These scenarios run twice: through their single routes, and with every
/// operation call and `get` sent through `POST /v1/batch` instead (one call
/// per batch; see `common::VIA_BATCH`): a batch slot must answer exactly
/// what the single call answers (SPEC §10).
macro_rules! single_and_batch {
    ($($name:ident),* $(,)?) => {
        mod single {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name().await
                }
            )*
        }
        mod via_batch {
            $(
                #[tokio::test]
                async fn $name() {
                    super::common::VIA_BATCH.scope(true, super::$name()).await
                }
            )*
        }
    };
}

single_and_batch!(
    claim_settle_replay_and_the_record,
    heartbeat_dispatch_release_and_reconcile,
    revoke_and_warnings,
    protocol_refusals_are_409_with_their_code,
    percent_encoded_keys_are_decoded_once,
    results_replay_byte_for_byte_and_null_is_a_result,
    unknown_keeps_its_error_and_refuses_a_result,
);

async fn claim_settle_replay_and_the_record() {
    let dir = TempDir::new("walk");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);

    let r = op(&ep, "order-1", "claim", claim_body(1, &b)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/json");
    let api::ClaimDecision::Execute(grant) = typed(&r) else {
        panic!("expected execute")
    };
    let v = r.json();
    assert_eq!(v["decision"], "execute");
    assert_eq!(v["fence"], grant.fence);
    assert_eq!(v["attempt"], 1);
    assert!(v["lease_expires_at"].as_str().unwrap().ends_with('Z'));
    let fence = v["fence"].as_u64().unwrap();

    let r = op(
        &ep,
        "order-1",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let typed_receipt = typed::<api::ReceiptResponse>(&r).receipt;
    assert_eq!(typed_receipt.status, api::Status::Completed);
    let receipt = r.json()["receipt"].clone();
    assert_eq!(receipt["status"], "completed");
    assert_eq!(receipt["fence"], fence);
    assert_eq!(receipt["durable"], true);
    assert_eq!(receipt["key"], "order-1");
    assert_eq!(receipt["response_sha256"], fp(101));

    // The retry learns the one true outcome.
    let r = op(&ep, "order-1", "claim", claim_body(1, &b)).await;
    let api::ClaimDecision::Replay {
        receipt: replayed, ..
    } = typed(&r)
    else {
        panic!("expected replay")
    };
    assert_eq!(replayed, typed_receipt);
    let v = r.json();
    assert_eq!(v["decision"], "replay");
    assert_eq!(v["outcome"]["result"], json!({"charge": 1}));
    assert_eq!(v["receipt"], receipt);

    // A lost acknowledgement: the same settle again returns the same receipt.
    let r = op(
        &ep,
        "order-1",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await;
    assert_eq!(r.json()["receipt"], receipt);

    let r = get(&ep, &operation_path("order-1", "")).await;
    let view: api::RecordView = typed(&r);
    assert_eq!(view.receipt, Some(typed_receipt));
    let rec = r.json();
    for f in [
        "key",
        "status",
        "reservation",
        "lease",
        "outcome",
        "receipt",
        "reconcile_required",
        "disputed",
        "attempts",
        "quarantine",
        "created_at",
        "updated_at",
        "expires_at",
    ] {
        assert!(rec.get(f).is_some(), "record lacks {f}: {rec}");
    }
    assert_eq!(rec["status"], "completed");
    assert_eq!(rec["reservation"]["fingerprint"], fp(1));
    assert_eq!(rec["reservation"]["principal"], "svc");
    assert_eq!(rec["receipt"], receipt);
    assert_eq!(rec["disputed"], false);
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
async fn heartbeat_dispatch_release_and_reconcile() {
    let dir = TempDir::new("calls");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);

    // marks_dispatch: release is allowed before dispatch.
    let mut c = claim_body(1, &b);
    c["marks_dispatch"] = json!(true);
    c["worker"] = json!("w-1");
    c["lease_ms"] = json!(60_000);
    let r = op(&ep, "k-rel", "claim", c.clone()).await;
    let fence = r.json()["fence"].as_u64().unwrap();
    let r = op(
        &ep,
        "k-rel",
        "heartbeat",
        json!({"fence": fence, "lease_ms": 120_000}),
    )
    .await;
    assert_eq!(typed::<api::LeaseInfo>(&r).fence, fence);
    assert!(r.json()["lease_expires_at"].is_string());
    let r = op(
        &ep,
        "k-rel",
        "release",
        json!({"fence": fence, "reason": "not_dispatched"}),
    )
    .await;
    assert_eq!(
        typed::<api::Released>(&r),
        api::Released {
            fence,
            released: true
        }
    );
    assert_eq!(r.json(), json!({"fence": fence, "released": true}));
    // Nothing could have been sent: the next claim may execute again.
    let fence2 = execute(&ep, "k-rel", 1, &b).await;
    assert!(fence2 > fence);

    // After dispatch, release needs a receipt.
    let r = op(&ep, "k-disp", "claim", c.clone()).await;
    let fence = r.json()["fence"].as_u64().unwrap();
    let r = op(&ep, "k-disp", "dispatch", json!({"fence": fence})).await;
    assert!(typed::<api::Dispatched>(&r).dispatched);
    assert_eq!(r.json()["fence"], fence);
    assert_eq!(r.json()["dispatched"], true);
    let r = op(&ep, "k-disp", "release", json!({"fence": fence})).await;
    assert_problem(&r, 409, "receipt_required");

    // unknown → reconcile → not_committed → execute under the same fence → settle.
    let fence = execute(&ep, "k-rec", 1, &b).await;
    let unknown = json!({"status": "unknown", "error": "timeout"});
    let r = op(&ep, "k-rec", "settle", settle_body(fence, 1, &b, unknown)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["receipt"]["status"], "unknown");
    let r = op(&ep, "k-rec", "claim", claim_body(1, &b)).await;
    let v = r.json();
    assert_eq!(v["decision"], "reconcile", "{v}");
    let rfence = v["fence"].as_u64().unwrap();
    // A reconcile lease cannot dispatch or settle.
    let r = op(&ep, "k-rec", "dispatch", json!({"fence": rfence})).await;
    assert_problem(&r, 409, "wrong_purpose");
    let r = op(
        &ep,
        "k-rec",
        "reconcile",
        json!({"fence": rfence, "finding": "not_committed"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["decision"], "execute");
    assert_eq!(r.json()["fence"], rfence);
    let r = op(
        &ep,
        "k-rec",
        "settle",
        settle_body(rfence, 1, &b, completed(2)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["receipt"]["status"], "completed");

    // reconcile(unavailable) releases; reconcile(committed) settles.
    let fence = execute(&ep, "k-rec2", 1, &b).await;
    let unknown = json!({"status": "unknown"});
    op(&ep, "k-rec2", "settle", settle_body(fence, 1, &b, unknown)).await;
    let rfence = op(&ep, "k-rec2", "claim", claim_body(1, &b)).await.json()["fence"]
        .as_u64()
        .unwrap();
    let r = op(
        &ep,
        "k-rec2",
        "reconcile",
        json!({"fence": rfence, "finding": "unavailable"}),
    )
    .await;
    assert_eq!(r.json(), json!({"fence": rfence, "released": true}));
    let v = op(&ep, "k-rec2", "claim", claim_body(1, &b)).await.json();
    assert_eq!(
        v["decision"], "reconcile",
        "still needs reconciliation: {v}"
    );
    let rfence = v["fence"].as_u64().unwrap();
    // committed without its evidence is a schema error.
    let r = op(
        &ep,
        "k-rec2",
        "reconcile",
        json!({"fence": rfence, "finding": "committed"}),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    let r = op(
        &ep,
        "k-rec2",
        "reconcile",
        json!({"fence": rfence, "finding": "committed", "fingerprint": fp(1), "binding": b, "outcome": completed(3)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["receipt"]["status"], "completed");
    assert_eq!(r.json()["receipt"]["fence"], rfence);
}

async fn revoke_and_warnings() {
    let dir = TempDir::new("rw");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let r = post(&ep, "/v1/principals/svc%2Fa/revoke", json!({})).await;
    assert_eq!(typed::<api::Revoked>(&r).generation, 1);
    assert_eq!(r.json(), json!({"principal": "svc/a", "generation": 1}));
    // An empty body reads as {}.
    let r = ep
        .send_raw(Method::POST, "/v1/principals/svc%2Fa/revoke", None)
        .await
        .unwrap();
    assert_eq!(r.json()["generation"], 2);
    // The old generation is refused on claim (rule 1), the current one executes.
    let r = op(&ep, "k", "claim", claim_body(1, &binding("svc/a", 1))).await;
    assert_problem(&r, 409, "stale_binding");
    execute(&ep, "k", 1, &binding("svc/a", 2)).await;

    // Generations are integers in [0, 2^53-1] (SPEC §2): the largest one
    // claims, one more is a 422 naming the field, and nothing is written.
    let max = settle_client::api::MAX_SAFE_INTEGER;
    execute(&ep, "max", 1, &binding("maxed", max)).await;
    let r = op(
        &ep,
        "max2",
        "claim",
        claim_body(1, &binding("maxed", max + 1)),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    assert_eq!(r.json()["field"], "binding.generation");
    let r = ep
        .send_raw(Method::GET, "/v1/operations/max2", None)
        .await
        .unwrap();
    assert_problem(&r, 404, "not_found");
    // Revoking at 2^53-1 still works (only 2^64-1 cannot be raised, SPEC
    // §2); no claim can then carry the new generation.
    let r = post(&ep, "/v1/principals/maxed/revoke", json!({})).await;
    assert_eq!(r.json()["generation"], max + 1);
    let r = op(&ep, "max3", "claim", claim_body(1, &binding("maxed", max))).await;
    assert_problem(&r, 409, "stale_binding");

    let r = post(
        &ep,
        "/v1/tasks/nightly/warnings/slow",
        json!({"detail": "took 3 s"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let w = r.json();
    assert_eq!(
        (w["task"].clone(), w["class"].clone(), w["count"].clone()),
        (json!("nightly"), json!("slow"), json!(1))
    );
    assert_eq!(w["saturated"], false);
    // Without detail the stored one stays.
    let w = post(&ep, "/v1/tasks/nightly/warnings/slow", json!({}))
        .await
        .json();
    assert_eq!(
        (w["count"].clone(), w["detail"].clone()),
        (json!(2), json!("took 3 s"))
    );
    let r = get(&ep, "/v1/tasks/nightly/warnings").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["warnings"].as_array().unwrap().len(), 1);
    let r = get(&ep, "/v1/tasks/other/warnings").await;
    assert_eq!(r.json(), json!({"warnings": []}));
    for i in 1..64 {
        let r = post(&ep, &format!("/v1/tasks/nightly/warnings/c{i}"), json!({})).await;
        assert_eq!(r.status, 200);
    }
    let r = post(&ep, "/v1/tasks/nightly/warnings/one-too-many", json!({})).await;
    assert_problem(&r, 409, "too_many_classes");
}

#[tokio::test]
async fn warning_counts_saturate_at_the_configured_cap() {
    let dir = TempDir::new("cap");
    let s = Server::start(dir.path(), &["--warning-cap", "2"]);
    let ep = s.ep();
    for _ in 0..3 {
        post(&ep, "/v1/tasks/t/warnings/c", json!({})).await;
    }
    let w = post(&ep, "/v1/tasks/t/warnings/c", json!({})).await.json();
    assert_eq!(
        (w["count"].clone(), w["saturated"].clone()),
        (json!(2), json!(true))
    );
}

async fn protocol_refusals_are_409_with_their_code() {
    let dir = TempDir::new("409");
    // A margin longer than a short lease makes that lease too short to settle, whatever the timing.
    let s = Server::start(dir.path(), &["--lease-margin-ms", "1000"]);
    let ep = s.ep();
    let b = binding("svc", 0);

    let fence = execute(&ep, "k1", 1, &b).await;
    let r = op(&ep, "k1", "claim", claim_body(2, &b)).await;
    assert_problem(&r, 409, "fingerprint_mismatch");
    let r = op(&ep, "k1", "claim", claim_body(1, &binding("other", 0))).await;
    assert_problem(&r, 409, "binding_mismatch");
    let r = op(&ep, "k1", "claim", claim_body(1, &b)).await;
    assert_eq!(r.json()["decision"], "in_flight");
    assert!(r.json()["retry_after_ms"].as_u64().unwrap() <= 1000);
    let r = op(
        &ep,
        "k1",
        "settle",
        settle_body(fence + 1000, 1, &b, completed(1)),
    )
    .await;
    assert_problem(&r, 409, "stale_fence");
    let r = op(&ep, "k1", "settle", settle_body(fence, 1, &b, completed(1))).await;
    assert_eq!(r.status, 200);
    // Same fence, disagreeing terminal result: disputed, canonical unchanged.
    let r = op(&ep, "k1", "settle", settle_body(fence, 1, &b, completed(9))).await;
    assert_problem(&r, 409, "result_mismatch");
    let rec = get(&ep, &operation_path("k1", "")).await.json();
    assert_eq!(rec["disputed"], true);
    assert_eq!(rec["outcome"]["result"], json!({"charge": 1}));
    // The stale fence and the disagreeing result were both quarantined.
    let reasons: Vec<&str> = rec["quarantine"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["stale_fence", "result_mismatch"]);

    // A lease not longer than the margin could never be settled: refused
    // up front (SPEC §4 claim), naming the setting, and nothing is written.
    for ms in [500, 1000] {
        let mut c = claim_body(1, &b);
        c["lease_ms"] = json!(ms);
        let r = op(&ep, "k2", "claim", c).await;
        assert_problem(&r, 422, "invalid_request");
        assert_eq!(r.json()["field"], "lease_ms");
        let detail = r.json()["detail"].as_str().unwrap().to_string();
        assert!(detail.contains("lease_margin_ms (1000 ms)"), "{detail}");
    }
    assert_eq!(get(&ep, &operation_path("k2", "")).await.status, 404);

    // The holder settling the wrong intent: mismatch, record becomes conflict.
    let fence = execute(&ep, "k3", 1, &b).await;
    let r = op(&ep, "k3", "settle", settle_body(fence, 2, &b, completed(1))).await;
    assert_problem(&r, 409, "fingerprint_mismatch");
    assert_eq!(
        get(&ep, &operation_path("k3", "")).await.json()["status"],
        "conflict"
    );

    // Revocation: the old lease is refused.
    let fence = execute(&ep, "k4", 1, &b).await;
    post(&ep, "/v1/principals/svc/revoke", json!({})).await;
    let r = op(&ep, "k4", "settle", settle_body(fence, 1, &b, completed(1))).await;
    assert_problem(&r, 409, "lease_expired");
    let r = op(&ep, "k5", "claim", claim_body(1, &b)).await;
    assert_problem(&r, 409, "stale_binding");
}

#[tokio::test]
async fn not_found_for_unknown_keys_and_routes() {
    let dir = TempDir::new("404");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    assert_problem(&get(&ep, "/v1/operations/nope").await, 404, "not_found");
    for call in ["heartbeat", "dispatch", "release"] {
        let r = op(&ep, "nope", call, json!({"fence": 1})).await;
        assert_problem(&r, 404, "not_found");
    }
    let r = op(
        &ep,
        "nope",
        "settle",
        settle_body(1, 1, &binding("p", 0), completed(1)),
    )
    .await;
    assert_problem(&r, 404, "not_found");
    let r = op(
        &ep,
        "nope",
        "reconcile",
        json!({"fence": 1, "finding": "unavailable"}),
    )
    .await;
    assert_problem(&r, 404, "not_found");
    assert_problem(&get(&ep, "/v2/nothing").await, 404, "not_found");
    // A known path with another method: 405 (the router's tests check `Allow`).
    let r = post(&ep, "/v1/operations/k", json!({})).await;
    assert_problem(&r, 405, "method_not_allowed");
    let r = ep
        .send_raw(Method::DELETE, "/v1/operations/k", None)
        .await
        .unwrap();
    assert_problem(&r, 405, "method_not_allowed");
    assert_problem(
        &get(&ep, "/v1/operations/k/claim").await,
        405,
        "method_not_allowed",
    );
    // No such path at all: 404.
    assert_problem(&get(&ep, "/v1/operations/k/nope").await, 404, "not_found");
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
#[tokio::test]
async fn bad_input_gets_4xx_and_writes_nothing() {
    let dir = TempDir::new("bad");
    let s = Server::start(
        dir.path(),
        &["--max-body-bytes", "4096", "--max-result-bytes", "100"],
    );
    let ep = s.ep();
    let b = binding("svc", 0);
    let good = claim_body(1, &b);
    let path = operation_path("fresh", "claim");

    // 400: syntax, not an object, trailing garbage.
    for body in [
        &b"{"[..],
        b"[1,2]",
        b"\"x\"",
        b"{\"fingerprint\": 1,",
        b"{} {}",
    ] {
        let r = post_raw(&ep, &path, body).await;
        assert_problem(&r, 400, "bad_request");
    }
    // 422: schema violations name the field.
    let mut cases: Vec<(Value, &str)> = vec![];
    let mut v = good.clone();
    v["extra"] = json!(1);
    cases.push((v, ""));
    let mut v = good.clone();
    v["lease_ms"] = json!("long");
    cases.push((v, "lease_ms"));
    let mut v = good.clone();
    v["lease_ms"] = json!(99);
    cases.push((v, "lease_ms"));
    let mut v = good.clone();
    v["retention_s"] = json!(0);
    cases.push((v, "retention_s"));
    let mut v = good.clone();
    v["fingerprint"] = json!("ABC");
    cases.push((v, "fingerprint"));
    let mut v = good.clone();
    v["fingerprint"] = json!("A".repeat(64));
    cases.push((v, "fingerprint"));
    let mut v = good.clone();
    v["binding"]["principal"] = json!("has space");
    cases.push((v, "binding.principal"));
    let mut v = good.clone();
    v["binding"]["generation"] = json!(-1);
    cases.push((v, "binding.generation"));
    let mut v = good.clone();
    v["binding"]["unknown"] = json!(true);
    cases.push((v, "binding.unknown"));
    cases.push((json!({}), ""));
    for (body, field) in cases {
        let r = post(&ep, &path, body.clone()).await;
        assert_problem(&r, 422, "invalid_request");
        if !field.is_empty() {
            assert_eq!(r.json()["field"], field, "{body}");
        }
    }
    // Bad keys: decoded value outside the key syntax → 422; bad segment → 400.
    let r = post(&ep, "/v1/operations/a%20b/claim", good.clone()).await;
    assert_problem(&r, 422, "invalid_request");
    let long = format!("/v1/operations/{}/claim", "k".repeat(256));
    assert_problem(
        &post(&ep, &long, good.clone()).await,
        422,
        "invalid_request",
    );
    assert_problem(
        &post(&ep, "/v1/operations/a%ZZ/claim", good.clone()).await,
        400,
        "bad_request",
    );
    assert_problem(
        &post(&ep, "/v1/operations/a%2/claim", good.clone()).await,
        400,
        "bad_request",
    );
    // A raw byte outside 0x21–0x7E never reaches a handler; the HTTP parser answers 400.
    let (st, _) = raw_status(
        &s.addr,
        b"POST /v1/operations/a\xffb/claim HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    assert_eq!(st, 400);
    // 413: over max_body_bytes, with and without a declared length.
    let mut big = good.clone();
    big["worker"] = json!("w".repeat(5000));
    assert_problem(
        &post(&ep, &path, big.clone()).await,
        413,
        "payload_too_large",
    );
    let chunked = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        5000,
        "x".repeat(5000)
    );
    let (st, text) = raw_status(&s.addr, chunked.as_bytes()).await;
    assert_eq!(st, 413, "{text}");
    assert!(text.contains("payload_too_large"));

    // Nothing was written: the key is still fresh, the server healthy.
    assert_problem(
        &get(&ep, &operation_path("fresh", "")).await,
        404,
        "not_found",
    );
    assert_problem(
        &get(&ep, "/v1/operations/a%20b").await,
        422,
        "invalid_request",
    );
    assert_eq!(get(&ep, "/healthz").await.status, 200);
    let fence = execute(&ep, "fresh", 1, &b).await;
    let rec = get(&ep, &operation_path("fresh", "")).await.json();
    assert_eq!(rec["attempts_total"], 1);

    // 422 for a result over max_result_bytes and a bad digest in the outcome; nothing settled.
    let big_result = json!({"status": "completed", "result": {"blob": "x".repeat(200)}, "response_sha256": fp(1)});
    let r = op(
        &ep,
        "fresh",
        "settle",
        settle_body(fence, 1, &b, big_result),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    let bad_digest = json!({"status": "completed", "result": {}, "response_sha256": "xyz"});
    let r = op(
        &ep,
        "fresh",
        "settle",
        settle_body(fence, 1, &b, bad_digest),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    let no_digest = json!({"status": "completed", "result": {}});
    let r = op(&ep, "fresh", "settle", settle_body(fence, 1, &b, no_digest)).await;
    assert_problem(&r, 422, "invalid_request");
    let r = op(&ep, "fresh", "heartbeat", json!({"fence": "1"})).await;
    assert_problem(&r, 422, "invalid_request");
    let rec = get(&ep, &operation_path("fresh", "")).await.json();
    assert_eq!(rec["status"], "running");
    assert_eq!(rec["quarantine_total"], 0);
    assert!(
        rec["attempts"][0]["observations"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let r = op(
        &ep,
        "fresh",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await;
    assert_eq!(r.status, 200);
}

async fn percent_encoded_keys_are_decoded_once() {
    let dir = TempDir::new("enc");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let key = "tenant/order#7?x=%41";
    execute(&ep, key, 1, &b).await;
    let rec = get(&ep, &operation_path(key, "")).await.json();
    assert_eq!(rec["key"], key);
    // %2541 decodes to "%41", not "A": a different key from "A".
    let r = get(&ep, "/v1/operations/A").await;
    assert_problem(&r, 404, "not_found");
    let r = post(&ep, "/v1/operations/%41/claim", claim_body(1, &b)).await;
    assert_eq!(r.json()["decision"], "execute");
    assert_eq!(get(&ep, "/v1/operations/A").await.status, 200);
}

#[tokio::test]
async fn racing_claims_on_a_fresh_key_execute_once() {
    let dir = TempDir::new("race");
    let s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    // Connect first so the claims go out together.
    let mut conns = Vec::new();
    for _ in 0..24 {
        let c = s.ep();
        c.health().await.unwrap();
        conns.push(c);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(24));
    let mut tasks = Vec::new();
    for c in conns {
        let body = serde_json::to_vec(&claim_body(1, &b)).unwrap();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = c
                .send_raw(Method::POST, "/v1/operations/race/claim", Some(body.into()))
                .await
                .unwrap();
            assert_eq!(r.status, 200);
            r.json()["decision"].as_str().unwrap().to_string()
        }));
    }
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.push(t.await.unwrap());
    }
    let execute = decisions.iter().filter(|d| *d == "execute").count();
    let in_flight = decisions.iter().filter(|d| *d == "in_flight").count();
    assert_eq!((execute, in_flight), (1, 23), "{decisions:?}");
}

#[tokio::test]
async fn auth_maps_tokens_to_tenants_and_isolates_them() {
    let dir = TempDir::new("auth");
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
        &["--config", config.to_str().unwrap(), "--tenant", &beta],
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

#[tokio::test]
async fn auth_off_needs_loopback() {
    let dir = TempDir::new("open");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.path())
        .env_remove("SETTLE_TENANTS")
        .env_remove("SETTLE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "it must not listen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tenants"), "{err}");

    // On loopback without tenants everything is tenant `default`, no token needed,
    // and a token is ignored rather than refused.
    let s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    execute(&s.ep(), "k", 1, &b).await;
    let r = get(&s.ep_token("anything"), "/v1/operations/k").await;
    assert_eq!(r.status, 200);
}

/// Records written with authentication off belong to tenant `default`; once
/// `[[tenants]]` are configured, only a tenant named `default` reaches them
/// (docs/http-api.md, "Authentication").
#[tokio::test]
async fn records_written_without_auth_belong_to_the_default_tenant() {
    let dir = TempDir::new("default-tenant");
    let data = dir.path().join("data");
    let b = binding("svc", 0);
    let mut s = Server::start(&data, &[]);
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
    let mut s = Server::start(&data, &["--tenant", &acme]);
    let r = get(&s.ep_token("tok-acme"), "/v1/operations/k").await;
    assert_problem(&r, 404, "not_found");
    s.terminate();

    // A tenant named `default` brings it back, receipt intact; acme still sees nothing.
    let default = format!("default={}", token_sha256("tok-default"));
    let s = Server::start(&data, &["--tenant", &acme, "--tenant", &default]);
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

#[tokio::test]
async fn metrics_count_requests_decisions_and_evidence() {
    let dir = TempDir::new("metrics");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let fence = execute(&ep, "m1", 1, &b).await;
    op(
        &ep,
        "m1",
        "settle",
        settle_body(fence + 99, 1, &b, completed(1)),
    )
    .await; // stale_fence, quarantined
    op(&ep, "m1", "settle", settle_body(fence, 1, &b, completed(1))).await;
    op(&ep, "m1", "settle", settle_body(fence, 1, &b, completed(2))).await; // result_mismatch
    let fence = execute(&ep, "m2", 1, &b).await;
    op(
        &ep,
        "m2",
        "settle",
        settle_body(fence, 1, &b, json!({"status": "unknown"})),
    )
    .await;
    get(&ep, "/nowhere").await;

    let r = get(&ep, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/plain"));
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(text.contains("settle_http_requests_total{"));
    assert!(text.contains(r#"route="claim""#) && text.contains(r#"status="200""#));
    assert!(text.contains(r#"route="unmatched""#) && text.contains(r#"status="404""#));
    assert!(text.contains(r#"decision="execute""#));
    assert!(text.contains(r#"decision="stale_fence""#));
    assert_eq!(value("settle_quarantined_total{call=\"settle\"}"), 2.0);
    assert_eq!(value("settle_disputed_total"), 1.0);
    assert_eq!(value("settle_records_unknown"), 1.0);
    assert_eq!(value("settle_records_reconcile_required"), 1.0);
    assert!(text.contains("settle_records_stuck"));
    assert!(
        text.contains("settle_commit_batch_size_bucket"),
        "commit histogram from the store"
    );
    assert!(text.contains("settle_commit_duration_seconds_bucket"));
    // No tenant or key labels.
    assert!(!text.contains("tenant=") && !text.contains("key="));
    assert!(!text.contains("m1") && !text.contains("m2"));
}

#[tokio::test]
async fn health_readiness_and_openapi() {
    let dir = TempDir::new("ops");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    assert_eq!(get(&ep, "/healthz").await.json(), json!({"status": "ok"}));
    assert_eq!(get(&ep, "/readyz").await.json(), json!({"status": "ready"}));
    let r = get(&ep, "/openapi.json").await;
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.contains_key("/v1/operations/{key}/claim"));
    assert!(paths.contains_key("/v1/tasks/{task}/warnings/{class}"));
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for n in [
        "ClaimRequest",
        "ClaimDecision",
        "Receipt",
        "Record",
        "Problem",
        "Warning",
    ] {
        assert!(schemas.contains_key(n), "{n}");
    }
}

#[tokio::test]
async fn sigterm_stops_gracefully_and_the_data_survives() {
    let dir = TempDir::new("term");
    let mut s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    let fence = execute(&s.ep(), "k", 1, &b).await;
    let receipt = op(
        &s.ep(),
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await
    .json();
    // One record of each kind `inspect` lists.
    op(
        &s.ep(),
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(2)),
    )
    .await; // disputed, quarantined
    let f2 = execute(&s.ep(), "u", 1, &b).await;
    op(
        &s.ep(),
        "u",
        "settle",
        settle_body(f2, 1, &b, json!({"status": "unknown"})),
    )
    .await;
    execute(&s.ep(), "r", 1, &b).await;
    // An idle keep-alive connection must not hold shutdown up.
    let idle = s.ep();
    assert_eq!(
        idle.send_raw(Method::GET, "/healthz", None)
            .await
            .unwrap()
            .status,
        200
    );
    let status = s.terminate();
    assert!(status.success(), "{status:?}");

    let out = std::process::Command::new(BIN)
        .args(["inspect", "--json", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], 3, "{v}");
    assert_eq!(v["by_status"]["completed"], 1);
    assert_eq!(v["by_status"]["unknown"], 1);
    assert_eq!(v["by_status"]["running"], 1);
    assert_eq!(v["unknown"], json!(["default/u"]));
    assert_eq!(v["reconcile_required"], json!(["default/u"]));
    assert_eq!(v["disputed"], json!(["default/k"]));
    assert_eq!(v["quarantined"], json!(["default/k (1)"]));
    assert_eq!(v["refused"], json!([]));
    assert_eq!(v["violations"], json!([]));
    // `check` passes on this store.
    let out = std::process::Command::new(BIN)
        .args(["check", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // With no grace, the unknown record without a lease counts as stuck.
    let out = std::process::Command::new(BIN)
        .args(["inspect", "--json", "--stuck-after-s", "0", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stuck"], json!(["default/u"]));

    let s = Server::start(dir.path(), &[]);
    let r = op(&s.ep(), "k", "claim", claim_body(1, &b)).await.json();
    assert_eq!(r["decision"], "replay");
    assert_eq!(r["receipt"], receipt["receipt"]);
}

#[tokio::test]
async fn a_record_from_the_future_is_refused_with_503() {
    let dir = TempDir::new("future");
    let b = binding("svc", 0);
    {
        // Write a receipt with the store's clock one hour ahead, then stop.
        let mut s = Server::start(dir.path(), &["--clock-skew-ms", "3600000"]);
        let fence = execute(&s.ep(), "k", 1, &b).await;
        let r = op(
            &s.ep(),
            "k",
            "settle",
            settle_body(fence, 1, &b, completed(1)),
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(s.terminate().success());
    }
    let mut s = Server::start(dir.path(), &[]);
    assert_problem(
        &op(&s.ep(), "k", "claim", claim_body(1, &b)).await,
        503,
        "record_refused",
    );
    assert_problem(
        &get(&s.ep(), "/v1/operations/k").await,
        503,
        "record_refused",
    );
    assert!(s.terminate().success());
    // `check` reports it and fails (SPEC §6.9).
    let out = std::process::Command::new(BIN)
        .args(["check", "--json", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["refused"], json!(["default/k"]));
}

#[tokio::test]
async fn cli_prints_summaries_and_documented_exit_codes() {
    let dir = TempDir::new("cli");
    let s = Server::start(dir.path(), &[]);
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(1);
    let claim = [
        "claim",
        "cli-1",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ];
    let out = run(&claim);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("execute  fence="), "{text}");
    let out = run(&[&claim[..], &["--json"]].concat());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["decision"], "in_flight");
    let out = run(&["get", "missing"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));
    let other = fp(2);
    let out = run(&[
        "claim",
        "cli-1",
        "--fingerprint",
        &other,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ]);
    assert_eq!(out.status.code(), Some(5));
    let out = run(&["warn", "t", "c", "--detail", "d"]);
    assert_eq!(out.status.code(), Some(0));
    let out = run(&["get", "x", "--url", "http://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(3));
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("slow");
    let s = Server::start(dir.path(), &["--request-timeout-ms", "200"]);
    // A body that never finishes: 408 request_timeout.
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    c.write_all(
        b"POST /v1/operations/k/claim HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"fi",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = c.read(&mut chunk).await.unwrap_or(0);
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || String::from_utf8_lossy(&buf).contains("request_timeout") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server never gave up on the slow body");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"));
    // Headers that never finish: the connection is closed.
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    c.write_all(b"POST /v1/operations/k/claim HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed =
        tokio::time::timeout(std::time::Duration::from_secs(30), c.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the server never closed a connection with a slow head"
    );
    // Nothing was written and the server is fine.
    assert_problem(&get(&s.ep(), "/v1/operations/k").await, 404, "not_found");
}

/// Receipts the server answered to settle calls, by its metrics.
async fn settle_receipts(s: &Server) -> f64 {
    let m = String::from_utf8(get(&s.ep(), "/metrics").await.body.to_vec()).unwrap();
    m.lines()
        .find(|l| {
            l.starts_with("settle_decisions_total")
                && l.contains("call=\"settle\"")
                && l.contains("decision=\"receipt\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// `settle bench --url U --batch N`: pairs through `POST /v1/batch`, each
/// counted pair settled on the server.
#[tokio::test]
async fn bench_runs_in_batches_over_http() {
    let dir = TempDir::new("bench-batch");
    let s = Server::start(dir.path(), &[]);
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--url",
            &s.url(),
            "--batch",
            "8",
            "--connections",
            "2",
            "--duration",
            "0.3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["batch"].as_u64()),
        (Some("http_batch"), Some(8))
    );
    assert_eq!(v["errors"], 0);
    let pairs = v["pairs"].as_u64().unwrap();
    assert!(
        pairs > 0 && pairs.is_multiple_of(8),
        "whole batches of pairs: {v}"
    );
    let receipts = settle_receipts(&s).await;
    assert!(receipts >= pairs as f64);
}

#[tokio::test]
async fn bench_runs_over_http_and_in_process() {
    let dir = TempDir::new("bench");
    let s = Server::start(dir.path(), &[]);
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--url",
            &s.url(),
            "--connections",
            "4",
            "--duration",
            "0.3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "http");
    assert_eq!(v["errors"], 0);
    assert!(v["pairs"].as_u64().unwrap() > 0);
    for f in ["pairs_per_s", "p50_ms", "p99_ms", "p999_ms"] {
        assert!(v[f].as_f64().unwrap() > 0.0, "{f}: {v}");
    }
    assert!(v.get("cpu_us_per_pair").is_none(), "{v}");
    // Every counted pair was settled on the server.
    let receipts = settle_receipts(&s).await;
    assert!(receipts >= v["pairs"].as_f64().unwrap());

    let data = TempDir::new("bench-data");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--concurrency",
            "4",
            "--duration",
            "0.3",
            "--json",
            "--data",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "in_process");
    assert!(v["pairs"].as_u64().unwrap() > 0);
    // In process, the CPU the process spent per pair (Linux: /proc);
    // over HTTP the client's CPU says nothing of the server's: absent.
    if cfg!(target_os = "linux") {
        // (In clock ticks: a run this short may have taken none.)
        assert!(v["cpu_us_per_pair"].as_f64().unwrap() >= 0.0, "{v}");
    }
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_request_finish() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("inflight");
    let mut s = Server::start(dir.path(), &[]);
    let body = serde_json::to_vec(&claim_body(1, &binding("svc", 0))).unwrap();
    let (first, rest) = body.split_at(10);
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    let head = format!(
        "POST /v1/operations/late/claim HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(first).await.unwrap();
    // Make sure the server is reading this request before shutdown starts.
    c.flush().await.unwrap();
    let (st, _) = raw_status(
        &s.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(st, 200);

    let pid = s.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Shutdown has begun once the listener stops accepting.
    let mut refused = false;
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(&s.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(refused, "the server kept accepting after SIGTERM");
    // The in-flight request still completes.
    c.write_all(rest).await.unwrap();
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"decision\":\"execute\""), "{text}");
    assert!(s.child.wait().unwrap().success());

    // And it was committed before the store closed.
    let s = Server::start(dir.path(), &[]);
    let r = get(&s.ep(), "/v1/operations/late").await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn bench_lists_of_concurrency_and_the_fill_mode_report_each_run() {
    let data = TempDir::new("bench-list");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--concurrency",
            "1,4",
            "--duration",
            "0.2",
            "--json",
            "--data",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["concurrency"], 1);
    assert_eq!(runs[1]["concurrency"], 4);

    let fill = TempDir::new("bench-fill");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--records",
            "500",
            "--concurrency",
            "16",
            "--json",
            "--data",
        ])
        .arg(fill.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_fill = lines.iter().rev().find(|v| v["mode"] == "fill").unwrap();
    assert_eq!(last_fill["records"], 500);
    assert!(last_fill["rss_mib"].as_f64().unwrap() > 0.0);
    let reopen = lines.iter().find(|v| v["mode"] == "reopen").unwrap();
    assert_eq!(reopen["found"], true);
    // The records really are in the store.
    let mut settled = 0;
    settle_embedded::scan(fill.path(), |_, r| {
        if r.status == settle_core::Status::Completed {
            settled += 1;
        }
    })
    .unwrap();
    assert_eq!(settled, 500);
}

// ---------------------------------------------------------------- issue 8 and issue 10 item 0

/// Issue 10 item 0: `release` with `reason: not_committed` after `dispatch`:
/// the status stays, no flag, the attempt records it, the next claim executes.
/// Over HTTP and through the CLI.
#[tokio::test]
async fn release_not_committed_over_http_and_the_cli() {
    let dir = TempDir::new("notcommitted");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let mut c = claim_body(1, &b);
    c["marks_dispatch"] = json!(true);
    let fence = op(&ep, "nc", "claim", c.clone()).await.json()["fence"]
        .as_u64()
        .unwrap();
    assert_eq!(
        op(&ep, "nc", "dispatch", json!({"fence": fence}))
            .await
            .status,
        200
    );
    // not_dispatched is no longer true after dispatch.
    let r = op(&ep, "nc", "release", json!({"fence": fence})).await;
    assert_problem(&r, 409, "receipt_required");
    let r = op(
        &ep,
        "nc",
        "release",
        json!({"fence": fence, "reason": "not_committed"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json(), json!({"fence": fence, "released": true}));
    let rec = get(&ep, &operation_path("nc", "")).await.json();
    assert_eq!(rec["status"], "pending");
    assert_eq!(rec["reconcile_required"], false);
    assert_eq!(
        rec["attempts"][0]["lease"]["ended"]["reason"],
        "not_committed"
    );
    assert_eq!(
        op(&ep, "nc", "claim", c).await.json()["decision"],
        "execute"
    );
    let r = op(
        &ep,
        "nc",
        "release",
        json!({"fence": fence, "reason": "maybe"}),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");

    // The CLI: settle release KEY --fence F --reason not_committed.
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(1);
    let out = run(&[
        "claim",
        "cli-nc",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--json",
    ]);
    let fence = serde_json::from_slice::<Value>(&out.stdout).unwrap()["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = run(&[
        "release",
        "cli-nc",
        "--fence",
        &fence,
        "--reason",
        "not_committed",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("released  fence={fence}")
    );
    let out = run(&[
        "release", "cli-nc", "--fence", &fence, "--reason", "whatever",
    ]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
/// Issue 8 item 14: a replay returns the compact text that was settled, byte
/// for byte (floats too), and JSON `null` is a result. Over HTTP and the CLI.
async fn results_replay_byte_for_byte_and_null_is_a_result() {
    let dir = TempDir::new("rawresult");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let sent = "{ \"amount\": 0.1000000000000000055511151231257827,\n  \"big\": 1e400, \"e\": 1E+2, \"n\": [1.0, -0.0, 12345678901234567890123],\n  \"s\": \"caf\\u00e9\" }";
    let compact = "{\"amount\":0.1000000000000000055511151231257827,\"big\":1e400,\"e\":1E+2,\"n\":[1.0,-0.0,12345678901234567890123],\"s\":\"caf\\u00e9\"}";
    let fence = execute(&ep, "raw", 1, &b).await;
    let body = format!(
        r#"{{"fence":{fence},"fingerprint":"{}","binding":{},"outcome":{{"status":"completed","result":{sent},"response_sha256":"{}"}}}}"#,
        fp(1),
        b,
        fp(7)
    );
    let r = post_raw(&ep, &operation_path("raw", "settle"), body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = op(&ep, "raw", "claim", claim_body(1, &b)).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.contains(&format!("\"result\":{compact}")), "{text}");
    let rec = get(&ep, &operation_path("raw", "")).await;
    let text = String::from_utf8_lossy(&rec.body).into_owned();
    assert!(text.contains(&format!("\"result\":{compact}")), "{text}");

    // null is a result for completed and failed.
    let fence = execute(&ep, "null", 1, &b).await;
    let r = op(
        &ep,
        "null",
        "settle",
        settle_body(
            fence,
            1,
            &b,
            json!({"status": "failed", "result": null, "response_sha256": fp(8)}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let r = op(&ep, "null", "claim", claim_body(1, &b)).await;
    assert_eq!(r.json()["decision"], "replay");
    assert!(String::from_utf8_lossy(&r.body).contains("\"result\":null"));
    // Absent is still refused for a terminal status.
    let fence = execute(&ep, "absent", 1, &b).await;
    let r = op(
        &ep,
        "absent",
        "settle",
        settle_body(
            fence,
            1,
            &b,
            json!({"status": "completed", "response_sha256": fp(8)}),
        ),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("outcome.result")
    );

    // The CLI sends --result as written and prints the replay as received.
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(2);
    let claim = [
        "claim",
        "cli-raw",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ];
    let out = run(&[&claim[..], &["--json"]].concat());
    let fence = serde_json::from_slice::<Value>(&out.stdout).unwrap()["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let digest = fp(9);
    let out = run(&[
        "settle",
        "cli-raw",
        "--fence",
        &fence,
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
        "--status",
        "completed",
        "--result",
        "{\"x\": 0.30000000000000004441}",
        "--response-sha256",
        &digest,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&claim);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("result: {\"x\":0.30000000000000004441}"),
        "{text}"
    );
    let out = run(&[&claim[..], &["--json"]].concat());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("\"result\":{\"x\":0.30000000000000004441}"),
        "{text}"
    );
}

/// Issue 8 items 14 and 20: `outcome.error` is any text up to the limit;
/// an `unknown` settlement keeps it (and its digest) on the attempt, shown
/// by `get`; a result on `unknown` is refused.
async fn unknown_keeps_its_error_and_refuses_a_result() {
    let dir = TempDir::new("unknownerr");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let fence = execute(&ep, "u", 1, &b).await;
    let r = op(
        &ep,
        "u",
        "settle",
        settle_body(
            fence,
            1,
            &b,
            json!({"status": "unknown", "result": {"partial": true}}),
        ),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("outcome.result")
    );
    let error = "upstream reset the connection\nafter 30 s\t(retry 3)";
    let r = op(
        &ep,
        "u",
        "settle",
        settle_body(
            fence,
            1,
            &b,
            json!({"status": "unknown", "error": error, "response_sha256": fp(5)}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["receipt"]["status"], "unknown");
    let rec = get(&ep, &operation_path("u", "")).await.json();
    assert_eq!(rec["attempts"][0]["error"], error);
    assert_eq!(rec["attempts"][0]["receipt"]["response_sha256"], fp(5));
    // An empty error is an error text too; over the limit is not.
    let fence = execute(&ep, "u2", 1, &b).await;
    let r = op(
        &ep,
        "u2",
        "settle",
        settle_body(fence, 1, &b, json!({"status": "unknown", "error": ""})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let fence = execute(&ep, "u3", 1, &b).await;
    let r = op(
        &ep,
        "u3",
        "settle",
        settle_body(
            fence,
            1,
            &b,
            json!({"status": "unknown", "error": "x".repeat(4097)}),
        ),
    )
    .await;
    assert_problem(&r, 422, "invalid_request");
}

/// Issue 8 item 21: a result nested deeper than the documented limit (64)
/// is a 422 naming `outcome.result`, also far beyond the parser's own limit.
#[tokio::test]
async fn deep_results_are_422_naming_outcome_result() {
    let dir = TempDir::new("deep");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let fence = execute(&ep, "deep", 1, &b).await;
    for depth in [65, 200, 10_000] {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = format!(
            r#"{{"fence":{fence},"fingerprint":"{}","binding":{},"outcome":{{"status":"completed","result":{deep},"response_sha256":"{}"}}}}"#,
            fp(1),
            b,
            fp(7)
        );
        let r = post_raw(&ep, &operation_path("deep", "settle"), body.as_bytes()).await;
        assert_problem(&r, 422, "invalid_request");
        assert_eq!(r.json()["field"], "outcome.result", "depth {depth}");
    }
    assert_eq!(
        get(&ep, &operation_path("deep", "")).await.json()["status"],
        "running",
        "nothing was written"
    );
}

/// Issue 8 item 23: RFC 9110 §11.4 allows several spaces after `Bearer`.
#[tokio::test]
async fn bearer_tokens_may_follow_several_spaces() {
    let dir = TempDir::new("bearer");
    let tenant = format!("acme={}", token_sha256("tok-acme"));
    let s = Server::start(dir.path(), &["--tenant", &tenant]);
    for auth in ["Bearer tok-acme", "Bearer   tok-acme", "bearer  tok-acme"] {
        let req = format!(
            "GET /v1/tasks/t/warnings HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
        );
        let (st, text) = raw_status(&s.addr, req.as_bytes()).await;
        assert_eq!(st, 200, "{auth:?}: {text}");
    }
    let req = "GET /v1/tasks/t/warnings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer   nope\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_status(&s.addr, req.as_bytes()).await.0, 401);
}

/// SPEC §10: calls apply in order (a later call sees an earlier one, a
/// `get` sees the calls before it), a malformed call fails in its own slot,
/// every result is durable before the response.
#[tokio::test]
async fn batch_calls_apply_in_order_and_fail_alone() {
    let dir = TempDir::new("batch");
    let mut s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let call = |op: &str, key: &str, body: Value| {
        let mut c = body;
        c["op"] = json!(op);
        c["key"] = json!(key);
        c
    };
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [
            call("claim", "b/1", claim_body(1, &b)),
            call("claim", "b%41", claim_body(1, &b)),
            call("claim", "b/1", claim_body(1, &b)),
            call("get", "b/1", json!({})),
            json!({"op": "nope", "key": "x"}),
            json!({"key": "x"}),
            json!({"op": "claim"}),
            json!(5),
            call("claim", "b3", json!({"fingerprint": "zz", "binding": b})),
            call("claim", "", claim_body(1, &b)),
            call("get", "never", json!({})),
            call("settle", "never", settle_body(1, 1, &b, completed(1))),
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
            call("settle", "b/1", settle_body(f1, 1, &b, completed(1))),
            call("claim", "b/1", claim_body(1, &b)),
            call("settle", "b%41", settle_body(f2, 1, &b, completed(2))),
        ]}),
    )
    .await;
    let v = r.json();
    let res = v["results"].as_array().unwrap();
    assert_eq!(res[0]["status"], 200, "{v}");
    assert_eq!(res[1]["body"]["decision"], "replay");
    assert_eq!(res[1]["body"]["receipt"], res[0]["body"]["receipt"]);
    assert_eq!(res[2]["body"]["receipt"]["status"], "completed");

    // Acknowledged means durable: SIGKILL, restart, the receipts are there.
    s.kill9();
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    for key in ["b/1", "b%41"] {
        let rec = get(&ep, &operation_path(key, "")).await;
        assert_eq!(rec.json()["status"], "completed", "{key}");
    }
    // An empty batch is an empty answer.
    let r = post(&ep, "/v1/batch", json!({"calls": []})).await;
    assert_eq!(r.json(), json!({"results": []}));
}

/// The limits of a batch: the whole request is refused, nothing is written.
#[tokio::test]
async fn batch_limits_refuse_the_whole_request() {
    let dir = TempDir::new("batchlim");
    let s = Server::start(
        dir.path(),
        &["--max-batch-calls", "2", "--max-batch-body-bytes", "1000"],
    );
    let ep = s.ep();
    let b = binding("svc", 0);
    let claim = |key: &str| {
        let mut c = claim_body(1, &b);
        c["op"] = json!("claim");
        c["key"] = json!(key);
        c
    };
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

/// Issue 29 item 4: an over-long request target answers 414 problem+json,
/// code `uri_too_long`, like every other error: over the server's limit
/// (8 KiB) and over hyper's own (64 KiB, which hyper refuses before the
/// server sees a request, with an empty body until the server replaced it).
#[tokio::test]
async fn an_over_long_target_is_414_problem_json() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = TempDir::new("uri");
    let s = Server::start(dir.path(), &[]);
    for len in [9_000usize, 70_000] {
        let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
        let req = format!(
            "GET /v1/operations/{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            "a".repeat(len)
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out);
        let (head, body) = text.split_once("\r\n\r\n").expect("a response");
        assert!(head.starts_with("HTTP/1.1 414 "), "{len}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{len}: {head}"
        );
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{len}: {e}: {body:?}"));
        assert_eq!(
            (v["status"].as_u64(), v["code"].as_str()),
            (Some(414), Some("uri_too_long")),
            "{len}"
        );
        assert!(body.ends_with("}\n"), "{len}: {body:?}");
    }
    // The server still serves.
    assert_eq!(get(&s.ep(), "/healthz").await.status, 200);
}
