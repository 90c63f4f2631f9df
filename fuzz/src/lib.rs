//! The properties the fuzz targets assert, shared between them (a decoded
//! record is checked alike whether it came out of a log frame, an index
//! value or a PostgreSQL row). See docs/testing.md, "Fuzzing".
//!
//! Every check panics on a broken property: that is how libFuzzer learns
//! of it (a crash, its input saved under `artifacts/`).

use serde::Serialize;
use settle_api as api;
use settle_core::{Command, Limits, Record, RetentionS};
use settle_embedded::codec::{self, Value};
use settle_server::problem::Problem;
use settle_server::wire::parse_body;

/// The limits under which a parsed command must validate: the rules that
/// depend on the server's configuration (the lease margin, the result
/// size) are the server's to apply after parsing, not the parser's.
pub fn permissive_limits() -> Limits {
    Limits {
        lease_margin_ms: 0,
        warning_cap: u64::MAX,
        max_result_bytes: usize::MAX,
    }
}

/// A request that fails to parse is the client's fault: 400 (syntax) or
/// 422 (schema), never a server error.
pub fn check_refusal(p: &Problem) {
    assert!(
        p.status == 400 || p.status == 422,
        "a bad request answered {}: {:?}",
        p.status,
        p.detail
    );
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("a request body serializes")
}

/// The command a client would send for `cmd`, parsed again as the server
/// parses it (`From<&settle_core::…>` → JSON → `parse_body` → `into_*`).
pub fn reparse(cmd: &Command) -> Command {
    let back = match cmd {
        Command::Claim(c) => parse_body::<api::ClaimRequest>(&json(&api::ClaimRequest::from(c)))
            .map(|r| {
                r.into_claim(c.key.clone(), RetentionS::DEFAULT)
                    .map(Command::Claim)
            }),
        Command::Heartbeat(h) => {
            parse_body::<api::HeartbeatRequest>(&json(&api::HeartbeatRequest::from(h)))
                .map(|r| r.into_heartbeat(h.key.clone()).map(Command::Heartbeat))
        }
        Command::Dispatch(d) => {
            parse_body::<api::DispatchRequest>(&json(&api::DispatchRequest::from(d)))
                .map(|r| r.into_dispatch(d.key.clone()).map(Command::Dispatch))
        }
        Command::Settle(s) => parse_body::<api::SettleRequest>(&json(&api::SettleRequest::from(s)))
            .map(|r| r.into_settle(s.key.clone()).map(Command::Settle)),
        Command::Release(r) => {
            parse_body::<api::ReleaseRequest>(&json(&api::ReleaseRequest::from(r)))
                .map(|b| b.into_release(r.key.clone()).map(Command::Release))
        }
        Command::Reconcile(r) => {
            parse_body::<api::ReconcileRequest>(&json(&api::ReconcileRequest::from(r)))
                .map(|b| b.into_reconcile(r.key.clone()).map(Command::Reconcile))
        }
        Command::Warn(w) => {
            parse_body::<api::WarnRequest>(&json(&api::WarnRequest::from(w))).map(|b| {
                b.into_warn(w.task.clone(), w.class.clone())
                    .map(Command::Warn)
            })
        }
        other => panic!("no request body makes {}", other.name()),
    };
    match back {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!("the request sent for {cmd:?} is refused: {e:?}"),
        Err(p) => panic!(
            "the request sent for {cmd:?} does not parse: {:?}",
            p.detail
        ),
    }
}

/// A command parsed from a request: the core accepts it (its fields hold
/// the core's validation) and what a client sends for it parses back to
/// the same command.
pub fn check_command(cmd: &Command) {
    if let Err(e) = cmd.validate(&permissive_limits()) {
        panic!("a parsed command fails the core's validation ({e:?}): {cmd:?}");
    }
    if let settle_core::command::Target::Record(key) = cmd.target() {
        assert!(
            settle_core::Key::new(key.as_str()).is_ok(),
            "the command's key is not a key: {key:?}"
        );
    }
    let back = reparse(cmd);
    assert_eq!(
        &back, cmd,
        "the command does not survive its own request body"
    );
}

/// A stored record that decodes can be used: it renders as the wire's
/// record view (served by `get`), and its PostgreSQL columns derive.
pub fn check_record(r: &Record) {
    let view = api::RecordView::from(r);
    let text = serde_json::to_vec(&view).expect("a record view serializes");
    serde_json::from_slice::<serde_json::Value>(&text).expect("a record view is JSON");
    let _ = settle_pg::codec::RecordColumns::of(r);
    // The embedded log describes it without panicking (open, expiry).
    let blob = codec::encode_for_log(&Value::Record(r.clone()));
    let _ = codec::Entry::new(b"k", &Value::Record(r.clone()), &blob);
}

/// A value decoded (by `decode_value`) from `input`: its encoding decodes
/// to the same value, that encoding is a fixed point, it is no longer than
/// the input (decoding only drops non-canonical or trailing bytes, and
/// compacts a result's whitespace) but for what format 3 adds to a format-2
/// value (one `claim_id` tag per attempt's lease), and its content is usable.
pub fn check_value(v: &Value, input: &[u8]) {
    let enc = codec::encode_value(v);
    let added = match (input.first(), v) {
        (Some(&codec::FORMAT_VERSION_2), Value::Record(r)) => r.attempts.len(),
        _ => 0,
    };
    assert!(
        enc.len() <= input.len() + added,
        "re-encoding grew {} bytes to {} (format 3 adds {added})",
        input.len(),
        enc.len()
    );
    let back = codec::decode_value(&enc).expect("an encoded value decodes");
    assert_eq!(&back, v, "a value does not survive its own encoding");
    assert_eq!(
        codec::encode_value(&back),
        enc,
        "encoding is not a fixed point"
    );
    match v {
        Value::Record(r) => check_record(r),
        Value::Principal(st) => {
            let cols = settle_pg::codec::PrincipalColumns::of(st).expect("principal columns");
            let _ = cols;
        }
        Value::Warnings(_) | Value::Gone => {}
        Value::Undecodable(_) => panic!("decoding made an in-memory-only value"),
    }
}
