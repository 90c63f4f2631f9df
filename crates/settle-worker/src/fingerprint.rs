//! The canonical fingerprint of SPEC §11 step 1: the lowercase hex SHA-256
//! of the RFC 8785 (JCS) canonical UTF-8 text of a JSON request, or of the
//! fields of it that JSON pointers (RFC 6901) choose.
//!
//! The rules are the RFC's, and the Python and TypeScript SDKs follow the
//! same ones (the shared vectors are `testdata/fingerprint-vectors.json`):
//!
//! * object members sorted by the UTF-16 code units of their names;
//! * no whitespace; strings escaped as ECMAScript's `JSON.stringify` does
//!   (`\b \t \n \f \r \" \\`, other controls as lowercase `\u00xx`,
//!   everything else literally as UTF-8, no Unicode normalisation);
//! * every number is an IEEE 754 double written as ECMAScript's
//!   `Number.prototype.toString` writes it: an integer beyond 2^53 is
//!   rounded to the nearest double, exactly as `JSON.parse` would.
//!
//! Field selection (the SDKs' convention, `sdk/MIDDLEWARE-KEYS.md`): the
//! fingerprint covers the object `{pointer: value}` of the pointers that
//! resolve; a pointer that does not resolve is left out, so an absent field
//! differs from a null one. A malformed pointer or an empty list is refused.
//!
//! No maintained crate is right on every shared vector (the candidates write
//! integers above 2^53 as they were given, so `9007199254740993` would not
//! fingerprint like the other SDKs' `9007199254740992`), so this is written
//! here over `ryu-js`, which formats doubles as ECMAScript does.

use serde_json::{Map, Value};
use settle_core::Digest;
use sha2::{Digest as _, Sha256};

/// Nesting deeper than this is refused (as in the other SDKs).
pub const MAX_DEPTH: usize = 1000;

/// Why a value or a field list cannot be fingerprinted; [`code`](Self::code)
/// is the `error` of the shared vectors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FingerprintError {
    /// The value is not canonicalisable JSON (e.g. nested deeper than
    /// [`MAX_DEPTH`], or a number that is not finite).
    #[error("invalid value: {0}")]
    InvalidValue(String),
    /// The field list is empty or holds a malformed JSON pointer.
    #[error("invalid fields: {0}")]
    InvalidFields(String),
}

impl FingerprintError {
    /// `invalid_value` or `invalid_fields`.
    pub fn code(&self) -> &'static str {
        match self {
            FingerprintError::InvalidValue(_) => "invalid_value",
            FingerprintError::InvalidFields(_) => "invalid_fields",
        }
    }
}

/// The RFC 8785 canonical text of `value`.
pub fn canonicalize(value: &Value) -> Result<String, FingerprintError> {
    let mut out = String::with_capacity(128);
    write_value(value, &mut out, 0)?;
    Ok(out)
}

/// SPEC §11.1: the SHA-256 of the canonical text of `value`.
pub fn fingerprint(value: &Value) -> Result<Digest, FingerprintError> {
    Ok(sha256(canonicalize(value)?.as_bytes()))
}

/// SPEC §11.1 over chosen fields: the SHA-256 of the canonical text of
/// [`select_fields`]`(value, fields)`.
pub fn fingerprint_fields<S: AsRef<str>>(
    value: &Value,
    fields: &[S],
) -> Result<Digest, FingerprintError> {
    fingerprint(&select_fields(value, fields)?)
}

/// The object `{pointer: value}` of the pointers that resolve in `value`
/// (RFC 6901; `""` is the whole document, `"-"` and indices with a leading
/// zero are never array elements). Every pointer is checked before any is
/// resolved: a malformed one, or an empty list, is
/// [`FingerprintError::InvalidFields`].
pub fn select_fields<S: AsRef<str>>(
    value: &Value,
    fields: &[S],
) -> Result<Value, FingerprintError> {
    if fields.is_empty() {
        return Err(FingerprintError::InvalidFields(
            "fields must name at least one JSON pointer".into(),
        ));
    }
    let parsed = fields
        .iter()
        .map(|p| parse_pointer(p.as_ref()).map(|t| (p.as_ref(), t)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Map::new();
    for (p, tokens) in parsed {
        if let Some(v) = resolve(value, &tokens) {
            out.insert(p.to_owned(), v.clone());
        }
    }
    Ok(Value::Object(out))
}

/// The SHA-256 of `bytes` as a [`Digest`].
pub fn sha256(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

fn parse_pointer(p: &str) -> Result<Vec<String>, FingerprintError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(FingerprintError::InvalidFields(format!(
            "JSON pointer {p:?} must start with '/'"
        )));
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
                        return Err(FingerprintError::InvalidFields(format!(
                            "JSON pointer {p:?}: '~' must be followed by 0 or 1"
                        )));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

fn array_index(t: &str) -> Option<usize> {
    let canonical = t == "0" || (!t.starts_with('0') && t.bytes().all(|b| b.is_ascii_digit()));
    if t.is_empty() || !canonical {
        return None;
    }
    t.parse().ok()
}

fn resolve<'v>(doc: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get(t.as_str())?,
            Value::Array(a) => a.get(array_index(t)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn write_value(v: &Value, out: &mut String, depth: usize) -> Result<(), FingerprintError> {
    if depth > MAX_DEPTH {
        return Err(FingerprintError::InvalidValue(format!(
            "nesting deeper than {MAX_DEPTH}"
        )));
    }
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            // Every JSON number is a double to the other SDKs; as_f64 rounds
            // an integer beyond 2^53 to the nearest one, as JSON.parse does.
            let x = n.as_f64().ok_or_else(|| {
                FingerprintError::InvalidValue(format!("number {n} is not a double"))
            })?;
            write_number(x, out)?;
        }
        Value::String(s) => write_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            // RFC 8785 §3.2.3: by UTF-16 code units, not by code points
            // (they differ for U+E000..U+FFFF against astral characters).
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(item, out, depth + 1)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// ECMAScript `Number::toString` of a finite double (RFC 8785 §3.2.2.3).
fn write_number(x: f64, out: &mut String) -> Result<(), FingerprintError> {
    if !x.is_finite() {
        return Err(FingerprintError::InvalidValue(
            "NaN and Infinity are not JSON".into(),
        ));
    }
    if x == 0.0 {
        out.push('0'); // also -0
        return Ok(());
    }
    out.push_str(ryu_js::Buffer::new().format_finite(x));
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0c => "\\f",
            0x0d => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            out.push_str(&format!("\\u{b:04x}"));
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_print_as_ecmascript_does() {
        let cases = [
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (-0.0, "0"),
            (5e-324, "5e-324"),
            (333_333_333.333_333_3, "333333333.3333333"),
        ];
        for (x, want) in cases {
            let mut s = String::new();
            write_number(x, &mut s).unwrap();
            assert_eq!(s, want, "{x:e}");
        }
    }

    #[test]
    fn too_deep_is_an_invalid_value() {
        let mut v = json!(1);
        for _ in 0..=MAX_DEPTH {
            v = Value::Array(vec![v]);
        }
        let e = canonicalize(&v).unwrap_err();
        assert_eq!(e.code(), "invalid_value");
    }

    #[test]
    fn an_empty_field_list_is_refused() {
        let e = fingerprint_fields::<&str>(&json!({"a": 1}), &[]).unwrap_err();
        assert_eq!(e.code(), "invalid_fields");
    }
}
