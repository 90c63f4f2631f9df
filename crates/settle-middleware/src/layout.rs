//! The byte layouts of SPEC §8 that every settle middleware shares
//! (`sdk/MIDDLEWARE-KEYS.md`): the `Idempotency-Key` header, the ledger
//! key, the request fingerprint, the principal, and the stored response.
//! The Python and TypeScript middlewares compute the same bytes, so any of
//! them can serve the same endpoints over one ledger;
//! `sdk/middleware-vectors.json` pins them (see this crate's tests).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

/// Statuses that say nothing happened: never stored, released with
/// `not_committed` so that the retry runs the handler (SPEC §8).
pub const NOT_COMMITTED_STATUSES: [u16; 4] = [408, 409, 425, 429];
/// Response headers always stored with a response.
pub const DEFAULT_STORED_HEADERS: [&str; 2] = ["content-type", "location"];
/// Largest response body stored for replay (fits the server's 64 KiB
/// `max_result_bytes` once base64-encoded with its headers).
pub const DEFAULT_MAX_STORED_BODY: usize = 32 * 1024;
/// The version tag of the stored `result`.
const RESULT_VERSION: u64 = 1;

/// A malformed `Idempotency-Key` header (400 `idempotency_key_invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyInvalid(pub &'static str);

fn visible(s: &[u8]) -> bool {
    (1..=255).contains(&s.len()) && s.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The key carried by the `Idempotency-Key` field lines `values`: `None`
/// when absent; an RFC 8941 sf-string Item (`"abc"`, optionally followed
/// by parameters, `"abc";a=1`, which are parsed and ignored) or a bare
/// value (`abc`, taken whole), 1–255 visible ASCII after unquoting. Two
/// lines are invalid.
pub fn parse_idempotency_key(values: &[&[u8]]) -> Result<Option<String>, KeyInvalid> {
    let v = match values {
        [] => return Ok(None),
        [one] => *one,
        _ => {
            return Err(KeyInvalid(
                "the Idempotency-Key header was sent more than once",
            ));
        }
    };
    let v = trim_ows(v);
    let key: Vec<u8> = if v.starts_with(b"\"") {
        let (key, rest) = sf_string(v)?;
        parameters(rest)?;
        key
    } else {
        v.to_vec()
    };
    if !visible(&key) {
        return Err(KeyInvalid(
            "the Idempotency-Key must be 1-255 visible ASCII characters",
        ));
    }
    // Visible ASCII is UTF-8.
    Ok(Some(String::from_utf8(key).map_err(|_| {
        KeyInvalid("the Idempotency-Key must be 1-255 visible ASCII characters")
    })?))
}

/// An RFC 8941 sf-string at the start of `v` (which starts with `"`): its
/// unescaped value and what follows the closing quote.
fn sf_string(v: &[u8]) -> Result<(Vec<u8>, &[u8]), KeyInvalid> {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 1;
    loop {
        match v.get(i) {
            None => return Err(KeyInvalid("unterminated sf-string in Idempotency-Key")),
            Some(b'"') => return Ok((out, &v[i + 1..])),
            Some(b'\\') => match v.get(i + 1) {
                Some(&e @ (b'"' | b'\\')) => {
                    out.push(e);
                    i += 2;
                }
                _ => return Err(KeyInvalid("bad escape in the Idempotency-Key sf-string")),
            },
            Some(&c @ 0x20..=0x7e) => {
                out.push(c);
                i += 1;
            }
            Some(_) => {
                return Err(KeyInvalid("bad character in the Idempotency-Key sf-string"));
            }
        }
    }
}

/// RFC 8941 parameters after an Item: `*( ";" *SP key [ "=" bare-item ] )`
/// and nothing else. Checked, then ignored.
fn parameters(mut rest: &[u8]) -> Result<(), KeyInvalid> {
    const BAD: KeyInvalid = KeyInvalid("bad parameters after the Idempotency-Key sf-string");
    let taken = |s: &[u8], ok: &dyn Fn(u8) -> bool| s.iter().take_while(|&&c| ok(c)).count();
    while !rest.is_empty() {
        rest = rest.strip_prefix(b";").ok_or(BAD)?;
        rest = &rest[taken(rest, &|c| c == b' ')..];
        // key: lcalpha / "*", then lcalpha / DIGIT / "_" / "-" / "." / "*"
        match rest.first() {
            Some(c) if c.is_ascii_lowercase() || *c == b'*' => {}
            _ => return Err(BAD),
        }
        rest = &rest[taken(rest, &|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'.' | b'*')
        })..];
        if let Some(after) = rest.strip_prefix(b"=") {
            rest = bare_item(after)?;
        }
    }
    Ok(())
}

/// One RFC 8941 bare item at the start of `v`; what follows it.
fn bare_item(v: &[u8]) -> Result<&[u8], KeyInvalid> {
    const BAD: KeyInvalid = KeyInvalid("bad parameter value after the Idempotency-Key sf-string");
    let taken = |s: &[u8], ok: &dyn Fn(u8) -> bool| s.iter().take_while(|&&c| ok(c)).count();
    match v.first() {
        Some(b'"') => sf_string(v).map(|(_, rest)| rest).map_err(|_| BAD),
        Some(b'?') => match v.get(1) {
            Some(b'0' | b'1') => Ok(&v[2..]),
            _ => Err(BAD),
        },
        Some(b':') => {
            let n = taken(&v[1..], &|c| {
                c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=')
            });
            v.get(1 + n)
                .filter(|&&c| c == b':')
                .map(|_| &v[n + 2..])
                .ok_or(BAD)
        }
        Some(c) if c.is_ascii_digit() || *c == b'-' => {
            let sign = usize::from(*c == b'-');
            let int = taken(&v[sign..], &|c| c.is_ascii_digit());
            let at = sign + int;
            if v.get(at) == Some(&b'.') {
                let frac = taken(&v[at + 1..], &|c| c.is_ascii_digit());
                if !(1..=12).contains(&int) || !(1..=3).contains(&frac) {
                    return Err(BAD);
                }
                Ok(&v[at + 1 + frac..])
            } else if (1..=15).contains(&int) {
                Ok(&v[at..])
            } else {
                Err(BAD)
            }
        }
        Some(c) if c.is_ascii_alphabetic() || *c == b'*' => {
            let n = taken(&v[1..], &|c| {
                c.is_ascii_alphanumeric() || b"!#$%&'*+.^_`|~:/-".contains(&c)
            });
            Ok(&v[1 + n..])
        }
        _ => Err(BAD),
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
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

/// SPEC §8 scope: `mw-` + hex SHA-256 of the framed namespace, principal
/// and (unquoted) header value, all UTF-8. 67 characters, always inside
/// the key syntax.
pub fn ledger_key(namespace: &str, principal: &str, key: &str) -> String {
    let digest = sha256_hex(&frame([
        namespace.as_bytes(),
        principal.as_bytes(),
        key.as_bytes(),
    ]));
    format!("mw-{digest}")
}

fn is_json_media(content_type: &[u8]) -> bool {
    let media = content_type.split(|&b| b == b';').next().unwrap_or(b"");
    let media = trim_ows(media).to_ascii_lowercase();
    media == b"application/json" || media.ends_with(b"+json")
}

/// Turns a JSON body into its canonical text (`None`: not JSON it accepts).
pub type Canonicalize<'a> = &'a dyn Fn(&[u8]) -> Option<Vec<u8>>;

/// What the request fingerprint is computed over (SPEC §8).
#[derive(Debug, Clone, Copy)]
pub struct FingerprintInput<'a> {
    /// The method (upper-cased before hashing).
    pub method: &'a str,
    /// The path as sent, plus `?query` when the query is not empty.
    pub target: &'a str,
    /// The `content-type` as sent, empty when absent.
    pub content_type: &'a [u8],
    /// The raw body.
    pub body: &'a [u8],
    /// The configured headers: lower-case name and all field lines joined
    /// with `", "` (empty when absent).
    pub headers: &'a [(String, Vec<u8>)],
}

/// SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
/// request target, the content-type, the body, then each configured
/// header as name (lower case) and value, sorted by name. `canonical`
/// turns a JSON body into its RFC 8785 text (the `canonical_json`
/// option); it answers `None` when the body is not JSON it accepts, and
/// then the raw bytes count.
pub fn request_fingerprint(
    input: FingerprintInput<'_>,
    canonical: Option<Canonicalize<'_>>,
) -> String {
    let canon = match canonical {
        Some(c) if !input.body.is_empty() && is_json_media(input.content_type) => c(input.body),
        _ => None,
    };
    let body = canon.as_deref().unwrap_or(input.body);
    let method = input.method.to_ascii_uppercase();
    let mut headers: Vec<(String, &[u8])> = input
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.as_slice()))
        .collect();
    headers.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let mut parts: Vec<&[u8]> = vec![
        method.as_bytes(),
        input.target.as_bytes(),
        input.content_type,
        body,
    ];
    for (n, v) in &headers {
        parts.push(n.as_bytes());
        parts.push(v);
    }
    sha256_hex(&frame(parts))
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

/// The claim's `worker` field, for operators.
pub fn worker_label(key: &str, principal: &str) -> String {
    format!(
        "idempotency-key={key} principal={}",
        binding_principal(principal)
    )
}

/// `Retry-After` of 409 `request_in_progress`: whole seconds, at least 1.
pub fn retry_after_header(retry_after_ms: u64) -> String {
    retry_after_ms.div_ceil(1000).max(1).to_string()
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

/// The settled `result` of a response whose body went to the client as
/// the handler produced it, past the stored limit (the Rust layer streams
/// such bodies instead of holding them whole): like [`encode_response`]'s
/// not-stored form, with the body's length and SHA-256 once the stream
/// ended (`None`: it did not, the client went away). Its
/// `response_sha256` is the hex SHA-256 of `F(status) || F(body_sha256)`
/// (the hex text, empty when unknown): the body's own digest stands in
/// for the body, which is never held whole.
pub fn encode_streamed_response(
    status: u16,
    headers: &[(String, Vec<u8>)],
    stored: &[String],
    body: Option<(u64, String)>,
) -> (Value, String) {
    let (mut result, _) = encode_response(status, headers, b"", stored, 0);
    let o = result
        .as_object_mut()
        .expect("encode_response writes an object");
    o.insert("body".into(), Value::Null);
    let digest = body.as_ref().map_or("", |(_, d)| d.as_str());
    o.insert(
        "body_bytes".into(),
        body.as_ref().map_or(Value::Null, |(n, _)| json!(n)),
    );
    o.insert(
        "body_sha256".into(),
        body.as_ref().map_or(Value::Null, |(_, d)| json!(d)),
    );
    let response = sha256_hex(&frame([status.to_string().as_bytes(), digest.as_bytes()]));
    (result, response)
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

/// The title of each problem code the middleware answers.
pub fn problem_title(code: &str) -> &'static str {
    match code {
        "idempotency_key_missing" => "Idempotency-Key missing",
        "idempotency_key_invalid" => "Idempotency-Key invalid",
        "idempotency_key_reused" => "Idempotency-Key reused",
        "request_in_progress" => "Request in progress",
        "outcome_unknown" => "Outcome unknown",
        "idempotency_unavailable" => "Idempotency unavailable",
        "response_not_stored" => "Response not stored",
        "payload_too_large" => "Payload too large",
        _ => "Error",
    }
}

/// An RFC 9457 problem+json body with the extra `code` member, members in
/// the order the other SDKs write them.
pub fn problem_body(status: u16, code: &str, detail: &str) -> Vec<u8> {
    let body = json!({
        "type": format!("urn:settle:problem:{code}"),
        "title": problem_title(code),
        "status": status,
        "detail": detail,
        "code": code,
    });
    serde_json::to_vec(&body).expect("a JSON value serializes")
}
