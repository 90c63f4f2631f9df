//! The byte layouts of SPEC §8 that every settle middleware shares
//! (`sdk/MIDDLEWARE-KEYS.md`): the `Idempotency-Key` header, the ledger
//! key, the request fingerprint, the principal, and the stored response.
//! The Python and TypeScript middlewares compute the same bytes, so any of
//! them can serve the same endpoints over one ledger;
//! `sdk/middleware-vectors.json` pins them (see this crate's tests). The
//! stored response and the claim's `worker` field are defined in
//! `settle_worker::middleware` (a Reconciler's middleware hook writes and
//! reads them too) and re-exported here.

use std::borrow::Cow;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

// The stored response and the claim's `worker` field are shared with the
// Reconciler's middleware hooks, so they live in `settle-worker` (which
// this crate depends on, never the other way) and are re-exported here.
pub use settle_worker::middleware::{
    DEFAULT_MAX_STORED_BODY, DEFAULT_STORED_HEADERS, StoredResponse, binding_principal,
    decode_response, encode_response, frame, latin1, parse_worker_label, response_sha256,
    worker_label,
};

/// Statuses that say nothing happened: never stored, released with
/// `not_committed` so that the retry runs the handler (SPEC §8).
pub const NOT_COMMITTED_STATUSES: [u16; 4] = [408, 409, 425, 429];

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

/// `application/json` or any `*+json` media type (parameters and ASCII
/// case ignored, spaces and tabs around it trimmed): the bodies the
/// fingerprint reads as JSON.
pub fn is_json_media(content_type: &[u8]) -> bool {
    let media = content_type.split(|&b| b == b';').next().unwrap_or(b"");
    let media = trim_ows(media).to_ascii_lowercase();
    media == b"application/json" || media.ends_with(b"+json")
}

/// A JSON body nested deeper than this (arrays and objects) is
/// fingerprinted as raw bytes, in every SDK (serde_json's own limit is 127).
pub const MAX_JSON_DEPTH: usize = 100;

/// A fingerprint option refused when the middleware is configured: the
/// option it names ([`option`](Self::option): `canonical_json`, `fields`
/// or `exclude`) and the shared vectors' `error`
/// ([`code`](Self::code)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    code: &'static str,
    option: &'static str,
    message: String,
}

impl ConfigError {
    fn new(code: &'static str, option: &'static str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            code,
            option,
            message: message.into(),
        }
    }

    /// `invalid_fields`, `invalid_exclude`, `fields_and_exclude` or
    /// `canonical_json_off`.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The option refused: `canonical_json`, `fields` or `exclude`.
    pub fn option(&self) -> &'static str {
        self.option
    }
}

/// How a request body enters the fingerprint (SPEC §8,
/// `sdk/MIDDLEWARE-KEYS.md`): the RFC 8785 form of JSON bodies (on by
/// default), and at most one of `fields` (keep only these JSON pointers)
/// and `exclude` (leave these out). Checked by [`FingerprintOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintOptions {
    canonical_json: bool,
    fields: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
}

impl Default for FingerprintOptions {
    /// Canonical JSON, the whole body.
    fn default() -> Self {
        FingerprintOptions {
            canonical_json: true,
            fields: None,
            exclude: None,
        }
    }
}

/// The reference tokens of an RFC 6901 pointer (`~1` is `/`, `~0` is `~`).
fn pointer_tokens(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("JSON pointer {p:?} must start with '/'"));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(format!(
                            "JSON pointer {p:?}: '~' must be followed by 0 or 1"
                        ));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

fn pointer_list(
    option: &'static str,
    code: &'static str,
    pointers: Vec<String>,
) -> Result<Vec<String>, ConfigError> {
    if pointers.is_empty() {
        return Err(ConfigError::new(
            code,
            option,
            format!("{option} must name at least one JSON pointer"),
        ));
    }
    for p in &pointers {
        pointer_tokens(p).map_err(|e| ConfigError::new(code, option, format!("{option}: {e}")))?;
    }
    Ok(pointers)
}

impl FingerprintOptions {
    /// The options, checked in this order: `fields` and `exclude` both
    /// given (`fields_and_exclude`); an empty list or a malformed pointer
    /// (`invalid_fields`, `invalid_exclude`); `""` (the whole document)
    /// in `exclude` (`invalid_exclude`); `fields` or `exclude` without
    /// `canonical_json` (`canonical_json_off`).
    pub fn new(
        canonical_json: bool,
        fields: Option<Vec<String>>,
        exclude: Option<Vec<String>>,
    ) -> Result<FingerprintOptions, ConfigError> {
        if fields.is_some() && exclude.is_some() {
            return Err(ConfigError::new(
                "fields_and_exclude",
                "exclude",
                "fields and exclude cannot both be given (fields keeps, exclude leaves out)",
            ));
        }
        let fields = fields
            .map(|f| pointer_list("fields", "invalid_fields", f))
            .transpose()?;
        let exclude = exclude
            .map(|x| pointer_list("exclude", "invalid_exclude", x))
            .transpose()?;
        if exclude
            .as_ref()
            .is_some_and(|x| x.iter().any(String::is_empty))
        {
            return Err(ConfigError::new(
                "invalid_exclude",
                "exclude",
                "exclude cannot hold \"\" (the whole document)",
            ));
        }
        if !canonical_json && (fields.is_some() || exclude.is_some()) {
            let option = if fields.is_some() {
                "fields"
            } else {
                "exclude"
            };
            return Err(ConfigError::new(
                "canonical_json_off",
                option,
                format!(
                    "{option} needs canonical_json (the body is read as JSON, then canonicalised)"
                ),
            ));
        }
        Ok(FingerprintOptions {
            canonical_json,
            fields,
            exclude,
        })
    }

    /// The raw body bytes, always (`canonical_json` off).
    pub fn raw() -> FingerprintOptions {
        FingerprintOptions {
            canonical_json: false,
            fields: None,
            exclude: None,
        }
    }

    /// Whether JSON bodies count by their RFC 8785 form.
    pub fn canonical_json(&self) -> bool {
        self.canonical_json
    }

    /// The pointers kept, when only some count.
    pub fn fields(&self) -> Option<&[String]> {
        self.fields.as_deref()
    }

    /// The pointers left out, when some do not count.
    pub fn exclude(&self) -> Option<&[String]> {
        self.exclude.as_deref()
    }
}

/// True when `v` nests at most `limit` arrays/objects deep.
fn depth_at_most(v: &Value, limit: usize) -> bool {
    let mut stack = vec![(v, 0usize)];
    while let Some((cur, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match cur {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if d + 1 > limit {
            return false;
        }
        stack.extend(children.map(|c| (c, d + 1)));
    }
    true
}

/// The JSON value of a body the fingerprint reads as JSON: strict UTF-8
/// (a BOM makes it not JSON), JSON, at most [`MAX_JSON_DEPTH`] deep, and
/// accepted whole by the fingerprint helper (its canonical text is the
/// second half). `None`: the raw bytes count.
fn parse_json_body(body: &[u8]) -> Option<(Value, String)> {
    let text = std::str::from_utf8(body).ok()?;
    let value: Value = serde_json::from_str(text).ok()?;
    if !depth_at_most(&value, MAX_JSON_DEPTH) {
        return None;
    }
    let canonical = settle_worker::canonicalize(&value).ok()?;
    Some((value, canonical))
}

/// The RFC 8785 canonical text of a JSON body, or `None` when it is not
/// JSON the fingerprint reads (see [`fingerprint_body`]).
pub fn canonical_json_body(body: &[u8]) -> Option<Vec<u8>> {
    parse_json_body(body).map(|(_, c)| c.into_bytes())
}

/// An array index of RFC 6901: `0` or digits without a leading zero.
fn array_index(t: &str) -> Option<usize> {
    let ok =
        !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && (t == "0" || !t.starts_with('0'));
    if ok { t.parse().ok() } else { None }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Index(usize),
    Member(String),
}

/// `value` without the values at `pointers` (`sdk/MIDDLEWARE-KEYS.md`):
/// every pointer is resolved in the document as given (before any
/// removal; one that does not resolve is ignored), then each value found
/// is removed, an object member by its name, an array element by its
/// index (later elements shift down). Removed last-first, deepest first,
/// so the order of the pointers does not matter. `""` (the whole
/// document) and malformed pointers are refused before anything is removed.
pub fn exclude_pointers<S: AsRef<str>>(
    value: &mut Value,
    pointers: &[S],
) -> Result<(), ConfigError> {
    let mut paths: Vec<Vec<Step>> = Vec::new();
    for p in pointers {
        let tokens = pointer_tokens(p.as_ref())
            .map_err(|e| ConfigError::new("invalid_exclude", "exclude", format!("exclude: {e}")))?;
        if tokens.is_empty() {
            return Err(ConfigError::new(
                "invalid_exclude",
                "exclude",
                "exclude cannot hold \"\" (the whole document)",
            ));
        }
        let mut cur = &*value;
        let mut path = Vec::with_capacity(tokens.len());
        let mut found = true;
        for t in tokens {
            let next = match cur {
                Value::Object(m) => m.get(t.as_str()).map(|v| (v, Step::Member(t))),
                Value::Array(a) => {
                    array_index(&t).and_then(|i| a.get(i).map(|v| (v, Step::Index(i))))
                }
                _ => None,
            };
            let Some((v, step)) = next else {
                found = false;
                break;
            };
            path.push(step);
            cur = v;
        }
        if found {
            paths.push(path);
        }
    }
    // Descending: a later array index before an earlier one, a descendant
    // before its ancestor; equal paths are one. Siblings share a container,
    // so they are both indices or both names.
    paths.sort_by(|a, b| b.cmp(a));
    paths.dedup();
    for path in paths {
        let Some((last, parents)) = path.split_last() else {
            continue;
        };
        let mut parent = &mut *value;
        for step in parents {
            parent = match (parent, step) {
                (Value::Object(m), Step::Member(k)) => {
                    m.get_mut(k.as_str()).expect("resolved above")
                }
                (Value::Array(a), Step::Index(i)) => a.get_mut(*i).expect("resolved above"),
                _ => unreachable!("resolved above"),
            };
        }
        match (parent, last) {
            (Value::Object(m), Step::Member(k)) => {
                m.remove(k.as_str());
            }
            (Value::Array(a), Step::Index(i)) => {
                a.remove(*i);
            }
            _ => unreachable!("resolved above"),
        }
    }
    Ok(())
}

/// The body bytes that enter the fingerprint. With `canonical_json`, when
/// the media type is JSON ([`is_json_media`]) and the body is not empty,
/// is strict UTF-8 (a BOM makes it not JSON), parses as JSON, nests at
/// most [`MAX_JSON_DEPTH`] deep and is accepted whole by the fingerprint
/// helper: its RFC 8785 text, after `fields` (the selection `{pointer:
/// value}` of `settle_worker::select_fields`) or `exclude`
/// ([`exclude_pointers`]). Any other body: the raw bytes.
pub fn fingerprint_body<'a>(
    options: &FingerprintOptions,
    content_type: &[u8],
    body: &'a [u8],
) -> Cow<'a, [u8]> {
    if !options.canonical_json || body.is_empty() || !is_json_media(content_type) {
        return Cow::Borrowed(body);
    }
    let Some((mut value, whole)) = parse_json_body(body) else {
        return Cow::Borrowed(body);
    };
    let text = if let Some(fields) = &options.fields {
        settle_worker::select_fields(&value, fields).and_then(|v| settle_worker::canonicalize(&v))
    } else if let Some(exclude) = &options.exclude {
        match exclude_pointers(&mut value, exclude) {
            Ok(()) => settle_worker::canonicalize(&value),
            Err(_) => return Cow::Borrowed(body), // checked by FingerprintOptions::new
        }
    } else {
        Ok(whole)
    };
    match text {
        Ok(t) => Cow::Owned(t.into_bytes()),
        Err(_) => Cow::Borrowed(body),
    }
}

/// [`request_fingerprint`] with the body as [`fingerprint_body`] makes it
/// under `options` (what the layer computes).
pub fn request_fingerprint_with(
    input: FingerprintInput<'_>,
    options: &FingerprintOptions,
) -> String {
    let body = fingerprint_body(options, input.content_type, input.body);
    request_fingerprint(
        FingerprintInput {
            body: &body,
            ..input
        },
        None,
    )
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

/// `Retry-After` of 409 `request_in_progress`: whole seconds, at least 1.
pub fn retry_after_header(retry_after_ms: u64) -> String {
    retry_after_ms.div_ceil(1000).max(1).to_string()
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
