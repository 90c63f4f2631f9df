//! Request bodies and answer checks for the HTTP tests of a server: the
//! spawned binary's (`crates/settle/tests`) and the router's in process
//! (`crates/settle-server/tests`). They panic on a bad answer, which is
//! what a test wants.
//!
//! The request bodies are built from the `settle-api` types (what every
//! client sends) and handed to the tests as JSON values, so a test may
//! still break one field on purpose.

use serde_json::Value;

use crate::Reply;
use crate::api;

/// A digest (fingerprint or response SHA-256) made of the byte `n` 32 times, in hex.
pub fn fp(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn value<T: serde::Serialize>(body: &T) -> Value {
    serde_json::to_value(body).unwrap()
}

/// Principal `p` with the scope `pay` at `generation`.
pub fn binding(p: &str, generation: u64) -> Value {
    value(&api::Binding {
        principal: p.to_string(),
        scopes: vec!["pay".to_string()],
        generation,
    })
}

fn api_binding(b: &Value) -> api::Binding {
    serde_json::from_value(b.clone()).expect("a binding body")
}

/// A claim with fingerprint [`fp`]`(f)` and the spec's defaults.
pub fn claim_body(f: u8, b: &Value) -> Value {
    value(&api::ClaimRequest {
        fingerprint: fp(f),
        binding: api_binding(b),
        lease_ms: None,
        worker: None,
        marks_dispatch: false,
        retention_s: None,
        claim_id: None,
    })
}

/// A `completed` outcome `{"charge": n}` with the digest [`fp`]`(100 + n)`.
pub fn completed(n: u8) -> Value {
    value(&api::Outcome {
        status: api::OutcomeStatus::Completed,
        result: Some(
            serde_json::value::RawValue::from_string(format!(r#"{{"charge":{n}}}"#)).unwrap(),
        ),
        response_sha256: Some(fp(100 + n)),
        error: None,
    })
}

/// A settle under `fence` with fingerprint [`fp`]`(f)`.
pub fn settle_body(fence: u64, f: u8, b: &Value, outcome: Value) -> Value {
    let outcome: api::Outcome = serde_json::from_value(outcome).expect("an outcome body");
    value(&api::SettleRequest {
        fence,
        fingerprint: fp(f),
        binding: api_binding(b),
        outcome,
    })
}

/// A call of a `POST /v1/batch` body (SPEC §10): `body` with its `op` and `key`.
pub fn batch_call(op: &str, key: &str, body: Value) -> Value {
    let mut c = body;
    c["op"] = Value::from(op);
    c["key"] = Value::from(key);
    c
}

/// The fence of a claim's `execute` answer; panics on any other answer.
#[track_caller]
pub fn executed(r: &Reply) -> u64 {
    assert_eq!(r.status, 200, "{:?}", r.json());
    match r.parse::<api::ClaimDecision>() {
        Ok(api::ClaimDecision::Execute(g)) => g.fence,
        other => panic!("expected execute, got {other:?}"),
    }
}

/// Asserts a problem+json answer with this status and code.
#[track_caller]
pub fn assert_problem(r: &Reply, status: u16, code: &str) {
    assert_eq!(
        (r.status, r.problem().map(|p| p.code.as_str())),
        (status, Some(code)),
        "body: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.content_type, "application/problem+json");
    let v = r.json();
    assert_eq!(v["status"], status);
    assert!(v["title"].is_string() && v["type"].is_string() && v["detail"].is_string());
}

/// Reads a 200 answer as the `settle-api` type `T` and checks that the type
/// writes it back byte for byte (the server's bodies are these types).
#[track_caller]
pub fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(r: &Reply) -> T {
    assert_eq!(r.status, 200, "body: {}", String::from_utf8_lossy(&r.body));
    let v: T = r.parse().expect("the body reads as its settle-api type");
    // A response body ends with a newline; a batch slot's body (which the
    // tests' `op` hands back when it sends calls through `POST /v1/batch`)
    // has none.
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(
        serde_json::to_string(&v).unwrap(),
        body.strip_suffix('\n').unwrap_or(&body),
        "the settle-api type writes the body back unchanged"
    );
    v
}
