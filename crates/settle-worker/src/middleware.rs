//! What the Idempotency-Key middleware (`settle-middleware`, SPEC §8) and
//! the [`Reconciler`](crate::Reconciler) share: the claim's `worker` field
//! that names the client's key and principal, the stored response a
//! middleware replays, and the reconcile hook's answer.
//!
//! It lives here, not in `settle-middleware`, because the layering runs
//! one way (ARCHITECTURE.md: the middleware depends on this crate): a
//! Reconciler's [`middleware_hook`](crate::Reconciler::middleware_hook)
//! must store a response exactly as the middleware would, and read the
//! `worker` field exactly as the middleware writes it. `settle-middleware`
//! re-exports all of it (`settle_middleware::layout`, `Resolution`,
//! `HookResponse`), so one definition serves both. The byte layouts are
//! those of `sdk/MIDDLEWARE-KEYS.md`, the same in the Python and
//! TypeScript SDKs.

use std::future::Future;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};
use settle_client::Bytes;
use settle_core::{Digest, Fence, InvalidInput, Key, Outcome, ResultJson, Text};
use sha2::{Digest as _, Sha256};

use crate::error::BoxError;
use crate::transport::BoxFuture;

/// Response headers always stored with a response.
pub const DEFAULT_STORED_HEADERS: [&str; 2] = ["content-type", "location"];
/// Largest response body stored for replay (fits the server's 64 KiB
/// `max_result_bytes` once base64-encoded with its headers).
pub const DEFAULT_MAX_STORED_BODY: usize = 32 * 1024;
/// The version tag of the stored `result`.
const RESULT_VERSION: u64 = 1;

/// 1–255 bytes of visible ASCII: the ledger's key syntax.
pub(crate) fn visible(s: &[u8]) -> bool {
    (1..=255).contains(&s.len()) && s.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// Each field as a 4-byte big-endian length followed by its bytes.
pub fn frame<'a>(fields: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let n = u32::try_from(f.len()).expect("a framed field is under 4 GiB (bodies are limited)");
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The claim's `binding.principal`: the principal itself when it fits the
/// key syntax, else `sha256:` + its hex digest.
pub fn binding_principal(principal: &str) -> String {
    if visible(principal.as_bytes()) {
        principal.to_string()
    } else {
        format!("sha256:{}", sha256_hex(principal.as_bytes()))
    }
}

/// Every byte outside `A-Za-z0-9-._~` of `value`'s UTF-8 as uppercase `%XX`.
fn pct(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`pct`]; `None` for a malformed `%XX` or bytes that are
/// not UTF-8.
fn unpct(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The claim's `worker` field (SPEC §8): `idempotency-key=<key>
/// principal=<principal>`, the header value after unquoting and the
/// principal the extractor gave (not the binding's `sha256:` form), every
/// byte outside `A-Za-z0-9-._~` as uppercase `%XX`, so that a Reconciler
/// can hand a middleware hook both for a request that is never retried. A
/// principal whose encoded form would make the field longer than the
/// ledger's 4096 bytes is written in its binding form instead.
pub fn worker_label(key: &str, principal: &str) -> String {
    let label = format!("idempotency-key={} principal={}", pct(key), pct(principal));
    if label.len() <= Text::MAX_BYTES {
        return label;
    }
    format!(
        "idempotency-key={} principal={}",
        pct(key),
        pct(&binding_principal(principal))
    )
}

/// The client's `Idempotency-Key` value and principal of a `worker` field
/// written by [`worker_label`], or `None` when it is not one.
pub fn parse_worker_label(worker: &str) -> Option<(String, String)> {
    let rest = worker.strip_prefix("idempotency-key=")?;
    let (key, principal) = rest.split_once(" principal=")?;
    let allowed = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'%'))
    };
    if key.is_empty() || !allowed(key) || !allowed(principal) {
        return None;
    }
    Some((unpct(key)?, unpct(principal)?))
}

/// `response_sha256` = hex SHA-256 of `F(status as decimal ASCII) || F(body)`.
pub fn response_sha256(status: u16, body: &[u8]) -> String {
    sha256_hex(&frame([status.to_string().as_bytes(), body]))
}

/// A header value as a string: each byte one character (Latin-1), so that
/// any value the HTTP layer accepted round-trips.
pub fn latin1(v: &[u8]) -> String {
    v.iter().map(|&b| char::from(b)).collect()
}

fn from_latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

/// The settled `result` of a response and its `response_sha256`.
/// `headers` are the response's (name, value) pairs in order; only names
/// in `stored` are kept (never `content-length` or `transfer-encoding`).
/// A body over `max_body` is kept as its length and digest only
/// (`"body": null`): a replay answers 409 `response_not_stored`.
pub fn encode_response(
    status: u16,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
    stored: &[String],
    max_body: usize,
) -> (Value, String) {
    let kept: Vec<Value> = headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v))
        .filter(|(n, _)| {
            n != "content-length"
                && n != "transfer-encoding"
                && stored.iter().any(|s| s.eq_ignore_ascii_case(n))
        })
        .map(|(n, v)| json!([n, latin1(v)]))
        .collect();
    let mut result = Map::new();
    result.insert("v".into(), json!(RESULT_VERSION));
    result.insert("status".into(), json!(status));
    result.insert("headers".into(), Value::Array(kept));
    if body.len() <= max_body {
        result.insert("body".into(), json!(B64.encode(body)));
    } else {
        result.insert("body".into(), Value::Null);
        result.insert("body_bytes".into(), json!(body.len()));
        result.insert("body_sha256".into(), json!(sha256_hex(body)));
    }
    (Value::Object(result), response_sha256(status, body))
}

/// A response read back from the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status.
    pub status: u16,
    /// The stored headers, lower-case names, in response order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body; `None` when it was too large to store (only its digest was).
    pub body: Option<Vec<u8>>,
}

/// The stored response in a settled `result`, or `None` when `result` is
/// not one (written by something else: answered `response_not_stored`).
pub fn decode_response(result: &Value) -> Option<StoredResponse> {
    let o = result.as_object()?;
    if o.get("v")?.as_u64()? != RESULT_VERSION {
        return None;
    }
    let status = u16::try_from(o.get("status")?.as_u64()?).ok()?;
    if !(100..=999).contains(&status) {
        return None;
    }
    let mut headers = Vec::new();
    for h in o.get("headers")?.as_array()? {
        let [n, v] = h.as_array()?.as_slice() else {
            return None;
        };
        headers.push((n.as_str()?.to_string(), from_latin1(v.as_str()?)?));
    }
    let body = match o.get("body")? {
        Value::Null => None,
        Value::String(b) => Some(B64.decode(b).ok()?),
        _ => return None,
    };
    Some(StoredResponse {
        status,
        headers,
        body,
    })
}

/// The outcome a stored response is settled with: `failed` for a status
/// of 500 and above (the handler *returned* a 5xx: a response, replayed as
/// Stripe does), else `completed`.
pub fn response_outcome(
    status: u16,
    result: &Value,
    digest: &str,
) -> Result<Outcome, InvalidInput> {
    let result = ResultJson::from_value(result, usize::MAX)?;
    let digest = Digest::parse("response_sha256", digest)?;
    Ok(if status >= 500 {
        Outcome::failed(result, digest, None)
    } else {
        Outcome::completed(result, digest)
    })
}

/// What a middleware's reconcile hook found out about an earlier attempt
/// whose outcome is unknown (SPEC §8), in the middleware and in a
/// Reconciler's [`middleware_hook`](crate::Reconciler::middleware_hook).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The earlier attempt happened and this is the response it made (for
    /// a payment: the payment the provider has under this key): it is
    /// settled as the stored response and replayed; the handler does not run.
    Committed(HookResponse),
    /// The earlier attempt did not happen: the middleware runs the handler
    /// under the same fence (a Reconciler hands the lease back, and the
    /// client's retry runs it).
    NotCommitted,
    /// It cannot be told now: retries keep getting 409 `outcome_unknown`.
    Unavailable,
}

/// The response a reconcile hook reports for an attempt that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookResponse {
    /// The status.
    pub status: u16,
    /// Headers (name, value); the configured stored headers are kept.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body (stored up to the stored-body limit; above it, its digest).
    pub body: Bytes,
}

/// What a Reconciler's middleware hook is told about a record of the
/// Idempotency-Key middleware: the ledger key and the reconcile lease's
/// fence, and the client's `Idempotency-Key` value and principal, read
/// from the claim's `worker` field ([`parse_worker_label`]). The
/// middleware's own hook gets a request with the same
/// `idempotency_key` and `principal` fields, so one function of them
/// serves both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiddlewareRecord {
    /// The ledger key (`mw-…`).
    pub ledger_key: Key,
    /// The fence of the reconcile lease.
    pub fence: Fence,
    /// The `Idempotency-Key` value the client sent (unquoted).
    pub idempotency_key: String,
    /// The principal the middleware's extractor gave.
    pub principal: String,
}

/// A Reconciler's hook for records of the Idempotency-Key middleware
/// ([`Reconciler::middleware_hook`](crate::Reconciler::middleware_hook)):
/// any `Fn(MiddlewareRecord) -> impl Future<Output = Result<Resolution,
/// BoxError>>` is one. An error counts as the hook failing (`errors`, the
/// record reported `unavailable`).
pub trait MiddlewareHook: Send + Sync {
    /// Finds out whether the request recorded under `record` happened.
    fn reconcile(&self, record: MiddlewareRecord) -> BoxFuture<'_, Result<Resolution, BoxError>>;
}

impl<F, Fut> MiddlewareHook for F
where
    F: Fn(MiddlewareRecord) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Resolution, BoxError>> + Send + 'static,
{
    fn reconcile(&self, record: MiddlewareRecord) -> BoxFuture<'_, Result<Resolution, BoxError>> {
        Box::pin(self(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_field_round_trips_and_encodes_every_byte_outside_the_unreserved_set() {
        let w = worker_label("order 7/ä", "acct-1");
        assert_eq!(w, "idempotency-key=order%207%2F%C3%A4 principal=acct-1");
        assert_eq!(
            parse_worker_label(&w),
            Some(("order 7/ä".to_string(), "acct-1".to_string()))
        );
        assert_eq!(
            worker_label("k", "has space"),
            "idempotency-key=k principal=has%20space"
        );
        for bad in [
            "settle-reconciler",
            "idempotency-key= principal=p",
            "idempotency-key=k principal=a b",
            "idempotency-key=k%2 principal=p",
            "idempotency-key=k%FF principal=p",
        ] {
            assert_eq!(parse_worker_label(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_principal_too_long_for_the_field_is_written_in_its_binding_form() {
        let long = "ü".repeat(2000);
        let w = worker_label("k", &long);
        assert!(w.len() <= Text::MAX_BYTES);
        let (_, p) = parse_worker_label(&w).unwrap();
        assert_eq!(p, binding_principal(&long));
    }

    #[test]
    fn a_5xx_is_stored_failed_and_anything_else_completed() {
        let (r, d) = encode_response(201, &[], b"{}", &[], 10);
        assert!(
            response_outcome(201, &r, &d)
                .unwrap()
                .status()
                .is_terminal()
        );
        let (r5, d5) = encode_response(503, &[], b"", &[], 10);
        assert_eq!(
            response_outcome(503, &r5, &d5)
                .unwrap()
                .status()
                .status()
                .as_str(),
            "failed"
        );
        let (over, _) = encode_response(200, &[], b"0123456789", &[], 4);
        assert_eq!(decode_response(&over).unwrap().body, None);
    }
}
