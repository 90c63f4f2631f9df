//! `settle-client` against a real `settle serve`: every typed call of
//! SPEC §7, `execute` answering like `Ledger::execute`, results replayed
//! byte for byte.

mod common;

use common::*;
use serde_json::value::RawValue;
use settle_client::api::{
    Binding, ClaimDecision, ClaimRequest, Code, DispatchRequest, Finding, HealthStatus,
    HeartbeatRequest, Outcome, OutcomeStatus, ReconcileRequest, ReconcileResponse, RecordStatus,
    ReleaseReason, ReleaseRequest, SettleRequest, WarnRequest,
};
use settle_client::{Client, ClientError};
use settle_core::testkit;
use settle_core::{ClaimDecision as CoreDecision, Command, RefusalCode, Reply};

fn wire_binding() -> Binding {
    Binding {
        principal: "svc".into(),
        scopes: vec!["pay".into()],
        generation: 0,
    }
}

fn claim_req(marks_dispatch: bool) -> ClaimRequest {
    ClaimRequest {
        fingerprint: fp(1),
        binding: wire_binding(),
        lease_ms: Some(30_000),
        worker: Some("w1".into()),
        marks_dispatch,
        retention_s: None,
        claim_id: None,
    }
}

fn outcome(status: OutcomeStatus, result: Option<&str>) -> Outcome {
    Outcome {
        status,
        result: result.map(|r| RawValue::from_string(r.into()).unwrap()),
        response_sha256: result.map(|_| fp(101)),
        error: None,
    }
}

async fn execute_fence(c: &Client, key: &str, marks_dispatch: bool) -> u64 {
    match c.claim(key, &claim_req(marks_dispatch)).await.unwrap() {
        ClaimDecision::Execute(g) => g.fence,
        other => panic!("{key}: {other:?}"),
    }
}

#[tokio::test]
async fn typed_calls_cover_the_api() {
    let dir = TempDir::new("client-calls");
    let s = Server::start(dir.path(), &[]);
    let c = s.ep();
    assert_eq!(c.health().await.unwrap().status, HealthStatus::Ok);
    assert_eq!(c.ready().await.unwrap().status, HealthStatus::Ready);

    let fence = execute_fence(&c, "k", true).await;
    let l = c
        .heartbeat(
            "k",
            &HeartbeatRequest {
                fence,
                lease_ms: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(l.fence, fence);
    let d = c.dispatch("k", &DispatchRequest { fence }).await.unwrap();
    assert!(d.dispatched);
    let settle = SettleRequest {
        fence,
        fingerprint: fp(1),
        binding: wire_binding(),
        outcome: outcome(OutcomeStatus::Completed, Some(r#"{"charge":1}"#)),
    };
    let rc = c.settle("k", &settle).await.unwrap().receipt;
    assert_eq!((rc.fence, rc.durable, rc.key.as_str()), (fence, true, "k"));
    // A retry replays the receipt; the record shows it.
    match c.claim("k", &claim_req(true)).await.unwrap() {
        ClaimDecision::Replay { receipt, .. } => assert_eq!(receipt, rc),
        other => panic!("{other:?}"),
    }
    let r = c.get("k").await.unwrap();
    assert_eq!(
        (r.status, r.receipt.as_ref()),
        (RecordStatus::Completed, Some(&rc))
    );

    // Release, then an unknown outcome and its reconciliation.
    let f = execute_fence(&c, "r", false).await;
    let rel = ReleaseRequest {
        fence: f,
        reason: Some(ReleaseReason::NotCommitted),
        forget: false,
    };
    assert_eq!(c.release("r", &rel).await.unwrap().fence, f);
    let f = execute_fence(&c, "r", false).await;
    let unknown = SettleRequest {
        fence: f,
        fingerprint: fp(1),
        binding: wire_binding(),
        outcome: outcome(OutcomeStatus::Unknown, None),
    };
    c.settle("r", &unknown).await.unwrap();
    let g = match c.claim("r", &claim_req(false)).await.unwrap() {
        ClaimDecision::Reconcile(g) => g,
        other => panic!("{other:?}"),
    };
    let rec = ReconcileRequest {
        fence: g.fence,
        finding: Finding::NotCommitted,
        fingerprint: None,
        binding: None,
        outcome: None,
    };
    match c.reconcile("r", &rec).await.unwrap() {
        ReconcileResponse::Execute(ClaimDecision::Execute(e)) => assert_eq!(e.fence, g.fence),
        other => panic!("{other:?}"),
    }

    // Warnings and revoke.
    let w = WarnRequest {
        detail: Some("slow".into()),
    };
    assert_eq!(c.warn("t", "c/1", &w).await.unwrap().count, 1);
    let ws = c.warnings("t").await.unwrap().warnings;
    assert_eq!((ws.len(), ws[0].class.as_str()), (1, "c/1"));
    assert_eq!(c.revoke("svc").await.unwrap().generation, 1);
    // A refusal is a typed error.
    let e = c.claim("k", &claim_req(true)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::StaleBinding), "{e}");
    assert_eq!(e.refusal(), Some(RefusalCode::StaleBinding));
}

/// The same commands and replies as `Ledger::execute`: refusals are
/// replies, transport and server failures are errors.
#[tokio::test]
async fn execute_answers_like_the_ledger() {
    let dir = TempDir::new("client-execute");
    let s = Server::start(dir.path(), &[]);
    let c = s.ep();
    let b = testkit::binding("svc", 0);
    let fence = match c.execute(&testkit::claim("k", 1, b.clone())).await.unwrap() {
        Reply::Claim(CoreDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };
    let settle = testkit::settle("k", fence, 1, b.clone(), testkit::completed(1));
    let receipt = match c.execute(&settle).await.unwrap() {
        Reply::Receipt(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(receipt.durable && receipt.fence == fence);
    match c.execute(&testkit::claim("k", 1, b.clone())).await.unwrap() {
        Reply::Claim(CoreDecision::Replay {
            receipt: r,
            outcome,
        }) => {
            assert_eq!(r, receipt);
            assert_eq!(outcome, testkit::completed(1));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.execute(&testkit::claim("k", 2, b.clone())).await.unwrap(),
        Reply::Refused(RefusalCode::FingerprintMismatch)
    );
    assert_eq!(
        c.execute(&testkit::dispatch("nope", fence)).await.unwrap(),
        Reply::Refused(RefusalCode::NotFound)
    );
    // A lease not longer than the server's margin is invalid (422).
    let short = testkit::claim_with("s", 1, b.clone(), 100, false);
    assert!(matches!(
        c.execute(&short).await.unwrap(),
        Reply::Invalid(_)
    ));
    let revoke = Command::Revoke(settle_core::Revoke {
        principal: settle_core::Principal::new("svc").unwrap(),
    });
    assert!(matches!(
        c.execute(&revoke).await.unwrap(),
        Reply::Revoked { generation: 1, .. }
    ));
    // The server's housekeeping is not an API call.
    let expire = Command::Expire {
        key: testkit::key("k"),
    };
    assert!(matches!(
        c.execute(&expire).await,
        Err(ClientError::Request(_))
    ));
}

/// A result keeps its exact text (number spelling, key order) through the
/// typed client, as `settle --json` shows it.
#[tokio::test]
async fn a_replayed_result_keeps_its_text() {
    let dir = TempDir::new("client-raw");
    let s = Server::start(dir.path(), &[]);
    let c = s.ep();
    let text = r#"{"z":1.50,"a":[1e3,-0.0],"u":"\u00e9"}"#;
    let fence = execute_fence(&c, "k", false).await;
    let settle = SettleRequest {
        fence,
        fingerprint: fp(1),
        binding: wire_binding(),
        outcome: outcome(OutcomeStatus::Failed, Some(text)),
    };
    c.settle("k", &settle).await.unwrap();
    match c.claim("k", &claim_req(false)).await.unwrap() {
        ClaimDecision::Replay { outcome, .. } => {
            assert_eq!(outcome.result.unwrap().get(), text)
        }
        other => panic!("{other:?}"),
    }
    let r = c.get("k").await.unwrap();
    assert_eq!(r.outcome.unwrap().result.unwrap().get(), text);
}
