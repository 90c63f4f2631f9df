//! The calls of SPEC §7 on the router in process, over the embedded store
//! in a temporary directory (`common::Server`): answers, refusals, the
//! record a call leaves, percent-decoded keys, racing claims. Most
//! scenarios run twice, through their single routes and through
//! `POST /v1/batch` (SPEC §10).

mod common;

use axum::http::Method;
use common::*;
use serde_json::json;
use settle_client::{api, operation_path};
use settle_server::config::Settings;

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
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    let ep = s.ep();
    let r = post(&ep, "/v1/principals/svc%2Fa/revoke", json!({})).await;
    assert_eq!(typed::<api::Revoked>(&r).generation, 1);
    assert_eq!(r.json(), json!({"principal": "svc/a", "generation": 1}));
    // An empty body reads as {}.
    let r = ep
        .send_raw(Method::POST, "/v1/principals/svc%2Fa/revoke", None)
        .await;
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
    let r = ep.send_raw(Method::GET, "/v1/operations/max2", None).await;
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
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        Settings {
            warning_cap: Some(2),
            ..Settings::default()
        },
    );
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
    let dir = tempfile::tempdir().unwrap();
    // A margin longer than a short lease makes that lease too short to settle, whatever the timing.
    let s = Server::start(
        dir.path(),
        Settings {
            lease_margin_ms: Some(1000),
            ..Settings::default()
        },
    );
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
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
    let r = ep.send_raw(Method::DELETE, "/v1/operations/k", None).await;
    assert_problem(&r, 405, "method_not_allowed");
    assert_problem(
        &get(&ep, "/v1/operations/k/claim").await,
        405,
        "method_not_allowed",
    );
    // No such path at all: 404.
    assert_problem(&get(&ep, "/v1/operations/k/nope").await, 404, "not_found");
}

async fn percent_encoded_keys_are_decoded_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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

// Several threads: the claims really run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_on_a_fresh_key_execute_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    let b = binding("svc", 0);
    let conns: Vec<Client> = (0..24).map(|_| s.ep()).collect();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(24));
    let mut tasks = Vec::new();
    for c in conns {
        let body = serde_json::to_vec(&claim_body(1, &b)).unwrap();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = c
                .send_raw(Method::POST, "/v1/operations/race/claim", Some(body.into()))
                .await;
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

/// Issue 10 item 0: `release` with `reason: not_committed` after `dispatch`:
/// the status stays, no flag, the attempt records it, the next claim executes.
/// (Through the CLI: `crates/settle/tests/http.rs`.)
#[tokio::test]
async fn release_not_committed_after_dispatch() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
/// Issue 8 item 14: a replay returns the compact text that was settled, byte
/// for byte (floats too), and JSON `null` is a result. (Through the CLI:
/// `crates/settle/tests/http.rs`.)
async fn results_replay_byte_for_byte_and_null_is_a_result() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
}

/// Issue 8 items 14 and 20: `outcome.error` is any text up to the limit;
/// an `unknown` settlement keeps it (and its digest) on the attempt, shown
/// by `get`; a result on `unknown` is refused.
async fn unknown_keeps_its_error_and_refuses_a_result() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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

#[tokio::test]
async fn health_readiness_and_openapi() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
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
