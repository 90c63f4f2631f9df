//! The batch body of SPEC §10, read as `POST /v1/batch` reads it
//! (settle-server `batch::parse_batch`: the same functions as the
//! endpoint, without a store).
//!
//! Input: the request body.
//!
//! Properties: no body panics; a refused body or call is 400 or 422;
//! every call that parses yields a command the core's validation accepts
//! and whose single request body parses back to it; and the batch a
//! client sends for the parsed calls parses to the same calls, in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settle_api as api;
use settle_core::command::Target;
use settle_core::{Command, RetentionS};
use settle_server::batch::{ParsedCall, parse_batch};

const MAX_CALLS: usize = 1000;

fuzz_target!(|data: &[u8]| {
    let calls = match parse_batch(data, MAX_CALLS, RetentionS::DEFAULT) {
        Ok(c) => c,
        Err(p) => return settle_fuzz::check_refusal(&p),
    };
    let mut parsed = Vec::new();
    for call in calls {
        match call {
            Ok(c) => {
                if let ParsedCall::Command(cmd) = &c {
                    settle_fuzz::check_command(cmd);
                }
                parsed.push(c);
            }
            Err(p) => settle_fuzz::check_refusal(&p),
        }
    }
    let calls: Vec<String> = parsed.iter().map(call_for).collect();
    let body = format!("{{\"calls\":[{}]}}", calls.join(","));
    let again = parse_batch(body.as_bytes(), MAX_CALLS, RetentionS::DEFAULT)
        .unwrap_or_else(|p| panic!("a client's batch is refused: {:?}", p.detail));
    assert_eq!(again.len(), parsed.len());
    for (a, b) in again.into_iter().zip(&parsed) {
        let a = a.unwrap_or_else(|p| panic!("a client's call is refused: {:?}", p.detail));
        match (&a, b) {
            (ParsedCall::Command(x), ParsedCall::Command(y)) => assert_eq!(x, y),
            (ParsedCall::Get(x), ParsedCall::Get(y)) => assert_eq!(x, y),
            _ => panic!("{a:?} parsed back from {b:?}"),
        }
    }
});

/// The call a client sends for a parsed call: `op`, `key` and the single
/// call's request body beside them, as text. (Not `api::BatchCall::new`:
/// it goes through `serde_json::Value`, which merges duplicate keys of a
/// result and rounds its numbers; the server keeps a result as sent.)
fn call_for(c: &ParsedCall) -> String {
    let (op, key, body) = match c {
        ParsedCall::Get(key) => ("get", key, "{}".to_string()),
        ParsedCall::Command(cmd) => {
            let body = match cmd {
                Command::Claim(c) => json(&api::ClaimRequest::from(c)),
                Command::Heartbeat(h) => json(&api::HeartbeatRequest::from(h)),
                Command::Dispatch(d) => json(&api::DispatchRequest::from(d)),
                Command::Settle(s) => json(&api::SettleRequest::from(s)),
                Command::Release(r) => json(&api::ReleaseRequest::from(r)),
                Command::Reconcile(r) => json(&api::ReconcileRequest::from(r)),
                other => panic!("a batch call made {}", other.name()),
            };
            let Target::Record(key) = cmd.target() else {
                panic!("a batch call is on a key")
            };
            (cmd.name(), key, body)
        }
    };
    let fields = body.strip_prefix('{').expect("a request body is an object");
    let sep = if fields == "}" { "" } else { "," };
    format!(
        "{{\"op\":\"{op}\",\"key\":{}{sep}{fields}",
        json(&key.as_str())
    )
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("a request body serializes")
}
