//! Reading the wire: path segments and request bodies of SPEC §7. The
//! bodies themselves are the `settle-api` types; this module only turns
//! bytes into them and every failure into the right problem (400 for
//! syntax, 422 naming the field for the schema).

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::problem::Problem;

/// Decodes one raw path segment (SPEC §7): `%XX` is decoded once; a
/// malformed escape, a raw `#` or a raw byte outside 0x21–0x7E is a bad
/// request (400). The decoded bytes are returned unchecked: the caller's
/// type decides whether they fit the key syntax (422 otherwise).
pub fn decode_segment(what: &str, raw: &str) -> Result<Vec<u8>, Problem> {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3).and_then(|h| {
                    let h = std::str::from_utf8(h).ok()?;
                    u8::from_str_radix(h, 16).ok().filter(|_| h.len() == 2)
                });
                match hex {
                    // `u8::from_str_radix` accepts a leading `+`; only hex digits are an escape.
                    Some(v) if b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit() => {
                        out.push(v);
                        i += 3;
                    }
                    _ => {
                        return Err(Problem::bad_request(format!(
                            "the {what} path segment has a malformed percent escape at byte {i}"
                        )));
                    }
                }
            }
            b'#' => {
                return Err(Problem::bad_request(format!(
                    "the {what} path segment contains a raw '#'; encode it as %23"
                )));
            }
            c if !(0x21..=0x7e).contains(&c) => {
                return Err(Problem::bad_request(format!(
                    "the {what} path segment contains the raw byte 0x{c:02x}; percent-encode it"
                )));
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Decodes a segment and validates it with the key syntax of `T` (422 when it does not fit).
pub fn segment<T>(what: &'static str, raw: &str) -> Result<T, Problem>
where
    T: TryFrom<String, Error = settle_core::InvalidInput>,
{
    let bytes = decode_segment(what, raw)?;
    // A non-ASCII decoded byte is outside the key syntax: 422, like any other bad key.
    if let Some(c) = bytes.iter().find(|c| !(0x21..=0x7e).contains(*c)) {
        return Err(Problem::invalid(
            what,
            format!("contains byte 0x{c:02x}; only visible ASCII (0x21-0x7E) is allowed"),
        ));
    }
    let s = String::from_utf8(bytes).expect("visible ASCII is UTF-8");
    T::try_from(s).map_err(|e| Problem::invalid(what, e.reason))
}

/// Parses a request body: empty (or JSON whitespace only) is `{}`; not
/// JSON or not an object is 400; JSON that does not fit the schema is 422
/// naming the field.
pub fn parse_body<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, Problem> {
    // JSON's whitespace only (RFC 8259): a form feed is not, and a body
    // that starts with one is not JSON (400), as serde_json says.
    let start = body
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .unwrap_or(body.len());
    let body = if start == body.len() {
        &b"{}"[..]
    } else {
        &body[start..]
    };
    if body[0] != b'{' {
        return Err(match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => Problem::bad_request("the request body must be a JSON object"),
            Err(e) => Problem::bad_request(format!("the request body is not valid JSON: {e}")),
        });
    }
    // Most bodies are valid: read them without tracking the path (which
    // costs about as much as the parse itself: a String per member name).
    // Only a body that fails is read again, tracked, to name the field; the
    // parse is deterministic, so it fails the same way the second time.
    let mut de = serde_json::Deserializer::from_slice(body);
    if let Ok(v) = T::deserialize(&mut de) {
        return match de.end() {
            Ok(()) => Ok(v),
            Err(e) => Err(Problem::bad_request(format!(
                "the request body is not valid JSON: {e}"
            ))),
        };
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let result = serde_path_to_error::deserialize::<_, T>(&mut de);
    if result.is_ok()
        && let Err(e) = de.end()
    {
        // Trailing characters after the object.
        return Err(Problem::bad_request(format!(
            "the request body is not valid JSON: {e}"
        )));
    }
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            let inner = e.inner();
            // Nesting beyond the parser's limit is a documented limit of
            // the schema (results: MAX_RESULT_DEPTH), not broken JSON: 422
            // naming the field where it happened.
            if inner.to_string().starts_with("recursion limit exceeded") {
                let path = e.path().to_string();
                let field = match path.find("result") {
                    Some(i) => path[..i + "result".len()].to_string(),
                    None if path == "." => String::new(),
                    None => path,
                };
                return Err(Problem::invalid(
                    field,
                    format!(
                        "nests arrays and objects too deeply (results: at most {} levels)",
                        settle_core::MAX_RESULT_DEPTH
                    ),
                ));
            }
            if inner.classify() != serde_json::error::Category::Data {
                return Err(Problem::bad_request(format!(
                    "the request body is not valid JSON: {inner}"
                )));
            }
            // A schema error stops reading early; the rest may still be broken JSON (400).
            if let Err(syntax) = serde_json::from_slice::<IgnoredAny>(body) {
                return Err(Problem::bad_request(format!(
                    "the request body is not valid JSON: {syntax}"
                )));
            }
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            let mut msg = inner.to_string();
            if let Some(at) = msg.rfind(" at line ") {
                msg.truncate(at);
            }
            Err(Problem::invalid(path, msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_api::{ClaimRequest, DispatchRequest, EmptyRequest};
    use settle_core::{Key, RetentionS};

    #[test]
    fn segments_decode_once() {
        assert_eq!(decode_segment("key", "a%2Fb").unwrap(), b"a/b");
        assert_eq!(decode_segment("key", "a%252F").unwrap(), b"a%2F");
        assert_eq!(decode_segment("key", "%7e").unwrap(), b"~");
        for bad in ["a%2", "a%zz", "%+1x", "a#b", "a\u{7f}", "é"] {
            let p = decode_segment("key", bad).unwrap_err();
            assert_eq!(p.status, 400, "{bad}");
        }
        let p = segment::<Key>("key", "a%20b").unwrap_err();
        assert_eq!((p.status, p.code.as_str()), (422, "invalid_request"));
        let p = segment::<Key>("key", "%FF").unwrap_err();
        assert_eq!(p.status, 422);
        let long = "x".repeat(256);
        assert_eq!(segment::<Key>("key", &long).unwrap_err().status, 422);
        assert_eq!(segment::<Key>("key", "a%23b").unwrap().as_str(), "a#b");
    }

    #[test]
    fn bodies_separate_syntax_from_schema() {
        let e = parse_body::<DispatchRequest>(b"{").unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse_body::<DispatchRequest>(b"[1]").unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse_body::<DispatchRequest>(b"{\"fence\": \"x\", ").unwrap_err();
        assert_eq!(
            e.status, 400,
            "broken JSON after a schema error is still 400"
        );
        let e = parse_body::<DispatchRequest>(b"{\"fence\": \"x\"}").unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (422, Some("fence")));
        let e = parse_body::<DispatchRequest>(b"{\"fence\": 1, \"x\": 2}").unwrap_err();
        assert_eq!(e.status, 422);
        assert!(e.detail.contains("unknown field"), "{}", e.detail);
        let e = parse_body::<DispatchRequest>(b"{}").unwrap_err();
        assert!(e.detail.contains("missing field"), "{}", e.detail);
        let e = parse_body::<DispatchRequest>(b"{\"fence\": 1} x").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(parse_body::<EmptyRequest>(b"").is_ok());
        assert!(parse_body::<EmptyRequest>(b"  \n").is_ok());
        let ok: DispatchRequest = parse_body(b" {\"fence\": 3} ").unwrap();
        assert_eq!(ok.fence, 3);
    }

    #[test]
    fn nested_schema_errors_name_the_field() {
        let body = format!(
            r#"{{"fingerprint":"{}","binding":{{"principal":"p","generation":-1}}}}"#,
            "a".repeat(64)
        );
        let e = parse_body::<ClaimRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("binding.generation"));
        let body = r#"{"fingerprint":"ABC","binding":{"principal":"p","generation":0}}"#;
        // Well-formed JSON of the right shape: the conversion into the
        // core's claim names the field.
        let e: Problem = parse_body::<ClaimRequest>(body.as_bytes())
            .unwrap()
            .into_claim(Key::new("k").unwrap(), RetentionS::DEFAULT)
            .unwrap_err()
            .into();
        assert_eq!(e.field.as_deref(), Some("fingerprint"));
    }
}

#[cfg(test)]
mod depth_tests {
    use super::*;
    use settle_api::SettleRequest;
    use settle_core::Key;

    fn settle(body: &str) -> Result<settle_core::Settle, Problem> {
        let b: SettleRequest = parse_body(body.as_bytes())?;
        Ok(b.into_settle(Key::new("k").unwrap())?)
    }

    fn settle_body(result: &str) -> String {
        format!(
            r#"{{"fence":1,"fingerprint":"{d}","binding":{{"principal":"p","generation":0}},"outcome":{{"status":"completed","result":{result},"response_sha256":"{d}"}}}}"#,
            d = "a".repeat(64)
        )
    }

    /// Issue 8 item 21: a deep result is a 422 naming `outcome.result`, at
    /// any depth (below, at and far beyond the parser's own limit of 128).
    #[test]
    fn deep_results_are_422_naming_outcome_result() {
        let ok = format!(
            "{}{}",
            "[".repeat(settle_core::MAX_RESULT_DEPTH),
            "]".repeat(settle_core::MAX_RESULT_DEPTH)
        );
        assert!(settle(&settle_body(&ok)).is_ok());
        for depth in [settle_core::MAX_RESULT_DEPTH + 1, 127, 128, 129, 5000] {
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let e = settle(&settle_body(&deep)).unwrap_err();
            assert_eq!(
                (e.status, e.field.as_deref()),
                (422, Some("outcome.result")),
                "depth {depth}: {e:?}"
            );
        }
        // Deep nesting elsewhere is refused as a schema violation of that field.
        let body = format!(
            r#"{{"fence":1,"fingerprint":{}1{}}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        let e = settle(&body).unwrap_err();
        assert_eq!(e.status, 422, "{e:?}");
    }
}
