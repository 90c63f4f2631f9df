//! Validated input types.
//!
//! Construction (including deserialization) is the only way to obtain these
//! values and it validates, so an invalid key, digest, principal or lease can
//! never reach the rules. Every error names the field and the reason.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An input that violates SPEC §2/§4 syntax or ranges.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidInput {
    /// The offending field, in the wire's naming (`binding.scopes`, `lease_ms`, ...).
    pub field: String,
    /// Why it was refused.
    pub reason: String,
}

impl InvalidInput {
    /// An input error for `field` (wire naming) with a human-readable `reason`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Checks the key syntax shared by keys, principals, scopes, tasks, classes
/// and tenant names: 1–255 bytes of visible ASCII (0x21–0x7E).
pub fn check_token(field: &str, s: &str) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if s.len() > 255 {
        return Err(InvalidInput::new(
            field,
            format!("is {} bytes long; at most 255 are allowed", s.len()),
        ));
    }
    if let Some(b) = s.bytes().find(|b| !(0x21..=0x7e).contains(b)) {
        return Err(InvalidInput::new(
            field,
            format!("contains byte 0x{b:02x}; only visible ASCII (0x21-0x7E) is allowed"),
        ));
    }
    Ok(())
}

macro_rules! token_type {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(Arc<str>);

        // A string, as `into = "String"` wrote it, without a String per
        // value: the same bytes, and no allocation when a record is stored.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl $name {
            /// Validates and wraps `s`.
            pub fn new(s: impl Into<String>) -> Result<Self, InvalidInput> {
                let s = s.into();
                check_token($field, &s)?;
                Ok($name(s.into()))
            }
            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl TryFrom<String> for $name {
            type Error = InvalidInput;
            fn try_from(s: String) -> Result<Self, InvalidInput> {
                $name::new(s)
            }
        }
        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(s: &str) -> Result<Self, InvalidInput> {
                $name::new(s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0.to_string()
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
    };
}

token_type!(
    /// The idempotency key of an operation: 1–255 bytes of visible ASCII.
    Key,
    "key"
);
token_type!(
    /// The principal of a binding: 1–255 bytes of visible ASCII.
    Principal,
    "principal"
);
token_type!(
    /// One authorization scope (key syntax).
    Scope,
    "scope"
);
token_type!(
    /// A task identifier for warnings (key syntax).
    TaskId,
    "task"
);
token_type!(
    /// A warning class (key syntax).
    WarningClass,
    "class"
);
token_type!(
    /// A tenant name (key syntax). Derived from the API token, never from a request.
    TenantId,
    "tenant"
);

/// A claim's own id (SPEC §4 claim rule 5a): 16–64 of `[A-Za-z0-9_-]`,
/// drawn at random by the caller for one claim and sent again only when it
/// retries that claim because the answer was lost.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct ClaimId(Arc<str>);

impl Serialize for ClaimId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl ClaimId {
    /// Shortest accepted id: 16 characters of 64 symbols are 96 bits.
    pub const MIN_LEN: usize = 16;
    /// Longest accepted id.
    pub const MAX_LEN: usize = 64;
    /// Validates and wraps `s`.
    pub fn new(s: impl Into<String>) -> Result<ClaimId, InvalidInput> {
        let s = s.into();
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&s.len()) {
            return Err(InvalidInput::new(
                "claim_id",
                format!(
                    "is {} characters long; {}-{} of [A-Za-z0-9_-] are allowed (draw at least 96 random bits)",
                    s.len(),
                    Self::MIN_LEN,
                    Self::MAX_LEN
                ),
            ));
        }
        if let Some(b) = s
            .bytes()
            .find(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-'))
        {
            return Err(InvalidInput::new(
                "claim_id",
                format!("contains byte 0x{b:02x}; only [A-Za-z0-9_-] is allowed"),
            ));
        }
        Ok(ClaimId(s.into()))
    }
    /// The validated text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ClaimId {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, InvalidInput> {
        ClaimId::new(s)
    }
}

impl fmt::Display for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TenantId {
    /// The tenant used when authentication is off.
    pub fn default_tenant() -> TenantId {
        TenantId(Arc::from("default"))
    }
}

/// A lowercase-hex SHA-256 digest (64 characters on the wire, 32 bytes in store).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Parses 64 lowercase hex characters.
    pub fn parse(field: &str, s: &str) -> Result<Digest, InvalidInput> {
        if s.len() != 64 {
            return Err(InvalidInput::new(
                field,
                format!(
                    "must be 64 lowercase hex characters (a SHA-256), got {} characters",
                    s.len()
                ),
            ));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(InvalidInput::new(
                field,
                "must be lowercase hex (0-9, a-f) of a SHA-256",
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| InvalidInput::new(field, e.to_string()))?;
        Ok(Digest(out))
    }
    /// The 64 lowercase hex characters of the wire form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            s.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Digest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SHA-256 digest as 64 lowercase hex characters")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Digest, E> {
                Digest::parse("digest", v).map_err(|e| E::custom(e.reason))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Digest, E> {
                let arr: [u8; 32] = v
                    .try_into()
                    .map_err(|_| E::custom("a digest must be 32 bytes"))?;
                Ok(Digest(arr))
            }
        }
        if d.is_human_readable() {
            d.deserialize_str(V)
        } else {
            d.deserialize_bytes(V)
        }
    }
}

/// The set of scopes of a binding: sorted, de-duplicated, at most 64.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Scopes(Arc<[Scope]>);

impl Serialize for Scopes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0[..].serialize(s)
    }
}

/// At most this many scopes in a binding.
pub const MAX_SCOPES: usize = 64;

impl Scopes {
    /// Normalises (sorts, de-duplicates) and validates.
    pub fn new(mut scopes: Vec<Scope>) -> Result<Scopes, InvalidInput> {
        scopes.sort();
        scopes.dedup();
        if scopes.len() > MAX_SCOPES {
            return Err(InvalidInput::new(
                "binding.scopes",
                format!(
                    "has {} distinct scopes; at most {MAX_SCOPES} are allowed",
                    scopes.len()
                ),
            ));
        }
        Ok(Scopes(scopes.into()))
    }
    /// Validates each string and normalises.
    pub fn from_strs<I, S>(items: I) -> Result<Scopes, InvalidInput>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut v = Vec::new();
        for (i, s) in items.into_iter().enumerate() {
            let s = s.into();
            // The field's name is written only for an error: a `format!`
            // per scope per call showed in the HTTP profile.
            check_token("binding.scopes", &s)
                .map_err(|e| InvalidInput::new(format!("binding.scopes[{i}]"), e.reason))?;
            v.push(Scope(s.into()));
        }
        Scopes::new(v)
    }
    /// The scopes, sorted and de-duplicated.
    pub fn as_slice(&self) -> &[Scope] {
        &self.0
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scopes, D::Error> {
        let raw = Vec::<String>::deserialize(d)?;
        Scopes::from_strs(raw).map_err(serde::de::Error::custom)
    }
}

/// The authorization an operation runs under.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// Who the operation runs as; fixed by the reservation (SPEC §2).
    pub principal: Principal,
    /// The granted scopes; fixed by the reservation. Absent on the wire means none.
    #[serde(default)]
    pub scopes: Scopes,
    /// The principal generation the caller authenticated under, in [0, 2^53 − 1]
    /// at the API (SPEC §2). Only moves up on the reservation (claim rule 4).
    pub generation: u64,
}

/// A lease duration in milliseconds, within [100, 3 600 000].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct LeaseMs(u32);

impl LeaseMs {
    /// The shortest lease, in ms.
    pub const MIN: u64 = 100;
    /// The longest lease, in ms (one hour).
    pub const MAX: u64 = 3_600_000;
    /// The lease granted when a claim names none: 30 000 ms (SPEC §4 claim).
    pub const DEFAULT: LeaseMs = LeaseMs(30_000);
    /// Validates `ms` against [[`LeaseMs::MIN`], [`LeaseMs::MAX`]] (field `lease_ms`).
    pub fn new(ms: u64) -> Result<LeaseMs, InvalidInput> {
        if !(Self::MIN..=Self::MAX).contains(&ms) {
            return Err(InvalidInput::new(
                "lease_ms",
                format!("{ms} is outside [{}, {}]", Self::MIN, Self::MAX),
            ));
        }
        Ok(LeaseMs(ms as u32))
    }
    /// The duration in ms.
    pub fn get(self) -> u64 {
        self.0 as u64
    }
}
impl TryFrom<u64> for LeaseMs {
    type Error = InvalidInput;
    fn try_from(v: u64) -> Result<Self, InvalidInput> {
        LeaseMs::new(v)
    }
}
impl From<LeaseMs> for u64 {
    fn from(v: LeaseMs) -> u64 {
        v.get()
    }
}
impl Default for LeaseMs {
    fn default() -> Self {
        LeaseMs::DEFAULT
    }
}

/// How long a terminal record is kept after settlement, in seconds, within [1, 31 536 000].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct RetentionS(u32);

impl RetentionS {
    /// The shortest retention, in seconds.
    pub const MIN: u64 = 1;
    /// The longest retention, in seconds (365 days).
    pub const MAX: u64 = 31_536_000;
    /// The retention when a claim names none: 86 400 s (one day, SPEC §4 claim).
    pub const DEFAULT: RetentionS = RetentionS(86_400);
    /// Validates `s` against [[`RetentionS::MIN`], [`RetentionS::MAX`]] (field `retention_s`).
    pub fn new(s: u64) -> Result<RetentionS, InvalidInput> {
        if !(Self::MIN..=Self::MAX).contains(&s) {
            return Err(InvalidInput::new(
                "retention_s",
                format!("{s} is outside [{}, {}]", Self::MIN, Self::MAX),
            ));
        }
        Ok(RetentionS(s as u32))
    }
    /// The retention in seconds.
    pub fn get(self) -> u64 {
        self.0 as u64
    }
}
impl TryFrom<u64> for RetentionS {
    type Error = InvalidInput;
    fn try_from(v: u64) -> Result<Self, InvalidInput> {
        RetentionS::new(v)
    }
}
impl From<RetentionS> for u64 {
    fn from(v: RetentionS) -> u64 {
        v.get()
    }
}
impl Default for RetentionS {
    fn default() -> Self {
        RetentionS::DEFAULT
    }
}

/// Free text labels (worker names, warning details): 1–4096 bytes of
/// UTF-8 without control characters.
#[derive(Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Text(Arc<str>);

// A string, as `into = "String"` wrote it, without a String per value.
impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl Text {
    /// The longest label, in bytes of UTF-8.
    pub const MAX_BYTES: usize = 4096;
    /// Validates `s` as a label; errors name `field`.
    pub fn new(field: &str, s: impl Into<String>) -> Result<Text, InvalidInput> {
        let s = s.into();
        if s.is_empty() {
            return Err(InvalidInput::new(field, "must not be empty"));
        }
        if s.len() > Self::MAX_BYTES {
            return Err(InvalidInput::new(
                field,
                format!(
                    "is {} bytes; at most {} are allowed",
                    s.len(),
                    Self::MAX_BYTES
                ),
            ));
        }
        if s.chars().any(|c| c.is_control()) {
            return Err(InvalidInput::new(
                field,
                "must not contain control characters",
            ));
        }
        Ok(Text(s.into()))
    }
    /// The validated text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
impl TryFrom<String> for Text {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, InvalidInput> {
        Text::new("text", s)
    }
}
impl From<Text> for String {
    fn from(v: Text) -> String {
        v.0.to_string()
    }
}
impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}
impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Free text that is data rather than a label (`outcome.error`): any UTF-8
/// string of at most 4096 bytes, empty and multi-line included. An upstream's
/// error message is whatever the upstream said; refusing it would lose the
/// evidence a reconciling operator needs.
#[derive(Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct ErrorText(Arc<str>);

// A string, as `into = "String"` wrote it, without a String per value.
impl Serialize for ErrorText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl ErrorText {
    /// The longest error text, in bytes of UTF-8 (the same as [`Text::MAX_BYTES`]).
    pub const MAX_BYTES: usize = Text::MAX_BYTES;
    /// Checks only the length of `s`; errors name `field`.
    pub fn new(field: &str, s: impl Into<String>) -> Result<ErrorText, InvalidInput> {
        let s = s.into();
        if s.len() > Self::MAX_BYTES {
            return Err(InvalidInput::new(
                field,
                format!(
                    "is {} bytes; at most {} are allowed",
                    s.len(),
                    Self::MAX_BYTES
                ),
            ));
        }
        Ok(ErrorText(s.into()))
    }
    /// The text as given (it may be empty).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
impl TryFrom<String> for ErrorText {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, InvalidInput> {
        ErrorText::new("outcome.error", s)
    }
}
impl From<ErrorText> for String {
    fn from(v: ErrorText) -> String {
        v.0.to_string()
    }
}
impl fmt::Debug for ErrorText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}
impl fmt::Display for ErrorText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The default result size limit (SPEC: configurable, 64 KiB by default).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 * 1024;

/// Arrays and objects nest at most this deep in a result. A documented
/// limit of our own, well inside every JSON parser's (serde_json stops at
/// 128 levels for a whole document), so a stored result can always be
/// parsed and served again, and a deeper one is a clear 422 on
/// `outcome.result` rather than a parser error.
pub const MAX_RESULT_DEPTH: usize = 64;

/// Removes insignificant whitespace from JSON text and measures how deep
/// arrays and objects nest. Strings and numbers are copied byte for byte
/// (nothing is parsed), so `1.0`, `1e5` or `"\u00e9"` keep their spelling.
/// Iterative: any depth is measured without recursion.
fn compact_json(text: &str) -> (String, usize) {
    let mut out = Vec::with_capacity(text.len());
    let (mut depth, mut max_depth) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in text.as_bytes() {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => continue,
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        out.push(b);
    }
    // Only ASCII whitespace was removed, so the bytes are still UTF-8.
    let s = String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    (s, max_depth)
}

/// A settled result: a JSON document kept as the compact text the caller
/// sent (insignificant whitespace removed, nothing else changed).
///
/// Kept as text rather than a parsed value so it can be stored by any
/// serializer (binary log, SQL) and returned byte for byte: numbers keep
/// their exact spelling (no float rounding), keys their order, strings
/// their escapes. JSON `null` is a result like any other.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResultJson(Arc<str>);

impl ResultJson {
    /// Wraps a JSON value, refusing it when its compact text exceeds
    /// `max_bytes` or it nests deeper than [`MAX_RESULT_DEPTH`].
    pub fn from_value(v: &serde_json::Value, max_bytes: usize) -> Result<ResultJson, InvalidInput> {
        // Measured before serializing: a value nested far too deep must
        // not reach a recursive serializer.
        if value_depth(v) > MAX_RESULT_DEPTH {
            return Err(Self::too_deep());
        }
        let text = serde_json::to_string(v)
            .map_err(|e| InvalidInput::new("outcome.result", e.to_string()))?;
        let r = ResultJson(text.into());
        r.check_size(max_bytes)?;
        Ok(r)
    }
    /// Takes JSON text as it is (whitespace between tokens removed),
    /// refusing invalid JSON, results nested deeper than
    /// [`MAX_RESULT_DEPTH`] and results over `max_bytes`.
    pub fn from_text(text: &str, max_bytes: usize) -> Result<ResultJson, InvalidInput> {
        let r = Self::from_raw(text)?;
        r.check_size(max_bytes)?;
        Ok(r)
    }
    /// [`ResultJson::from_text`] without the size limit (the command's
    /// validation applies the configured one).
    fn from_raw(text: &str) -> Result<ResultJson, InvalidInput> {
        let (compact, depth) = compact_json(text);
        if depth > MAX_RESULT_DEPTH {
            return Err(Self::too_deep());
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&compact)
            .map_err(|e| InvalidInput::new("outcome.result", format!("is not valid JSON: {e}")))?;
        Ok(ResultJson(compact.into()))
    }
    fn too_deep() -> InvalidInput {
        InvalidInput::new(
            "outcome.result",
            format!("nests arrays and objects deeper than {MAX_RESULT_DEPTH} levels"),
        )
    }
    /// Refuses a result larger than `max_bytes` (the configured `max_result_bytes`).
    pub fn check_size(&self, max_bytes: usize) -> Result<(), InvalidInput> {
        if self.0.len() > max_bytes {
            return Err(InvalidInput::new(
                "outcome.result",
                format!("is {} bytes; at most {max_bytes} are allowed", self.0.len()),
            ));
        }
        Ok(())
    }
    /// The compact JSON text, exactly as settled and as it is replayed.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The result parsed (numbers as `serde_json` reads them; the exact
    /// text is [`ResultJson::as_str`]).
    pub fn to_value(&self) -> serde_json::Value {
        // Construction validated the text and its depth, so this parses.
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }
    /// The length of the compact text in bytes (what `max_result_bytes` limits).
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Never true for a constructed result (valid JSON is at least one byte);
    /// the companion of [`ResultJson::len`].
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How deep arrays and objects nest in `v` (iterative).
fn value_depth(v: &serde_json::Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            serde_json::Value::Array(a) => {
                max = max.max(d + 1);
                if d < MAX_RESULT_DEPTH {
                    stack.extend(a.iter().map(|x| (x, d + 1)));
                }
            }
            serde_json::Value::Object(o) => {
                max = max.max(d + 1);
                if d < MAX_RESULT_DEPTH {
                    stack.extend(o.values().map(|x| (x, d + 1)));
                }
            }
            _ => {}
        }
    }
    max
}

impl fmt::Debug for ResultJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResultJson({})", self.0)
    }
}

impl Serialize for ResultJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            // Emitted verbatim: the settled text, byte for byte.
            let raw: &serde_json::value::RawValue =
                serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
            raw.serialize(s)
        } else {
            s.serialize_str(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for ResultJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ResultJson, D::Error> {
        if d.is_human_readable() {
            // The raw text as sent (no float rounding, no re-encoding);
            // serde_json skips a raw value without recursion, so depth is
            // ours to check.
            let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
            ResultJson::from_raw(raw.get()).map_err(|e| serde::de::Error::custom(e.reason))
        } else {
            // Stored text is checked again: a record that does not hold a
            // servable result fails to decode (fail closed) instead of
            // failing later while being answered.
            let text = String::deserialize(d)?;
            ResultJson::from_raw(&text).map_err(|e| serde::de::Error::custom(e.reason))
        }
    }
}

/// Milliseconds since the Unix epoch, from the store's clock.
///
/// Serialized as the integer (the stored formats); the wire's RFC 3339
/// text is `settle-api`'s business. `Display` shows RFC 3339 for logs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The instant `ms` milliseconds after the Unix epoch.
    pub fn from_millis(ms: u64) -> Timestamp {
        Timestamp(ms)
    }
    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> u64 {
        self.0
    }
    /// `ms` milliseconds later, saturating at the end of time instead of wrapping.
    pub fn plus_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn ms_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
    /// The same instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }
    /// The instant `t`, truncated to whole milliseconds; instants before the
    /// epoch become the epoch itself.
    pub fn from_system_time(t: SystemTime) -> Timestamp {
        Timestamp(
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        )
    }
    /// RFC 3339 in UTC with milliseconds (`2023-11-14T22:13:20.123Z`), the JSON form.
    ///
    /// RFC 3339 ends with year 9999: a later instant (only a damaged
    /// store, or a clock set absurdly far ahead, holds one) reads as
    /// [`LAST_RFC3339_MS`], the end of time, instead of failing.
    pub fn to_rfc3339(self) -> String {
        let t = Timestamp(self.0.min(LAST_RFC3339_MS));
        humantime::format_rfc3339_millis(t.to_system_time()).to_string()
    }
}

/// The last instant RFC 3339 can write, `9999-12-31T23:59:59.999Z`, in
/// milliseconds since the Unix epoch.
pub const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Logs show what is there, even past RFC 3339's range.
        if self.0 > LAST_RFC3339_MS {
            return write!(f, "{} ms after the epoch (past year 9999)", self.0);
        }
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        Ok(Timestamp(u64::deserialize(d)?))
    }
}

/// A fencing token: strictly increasing across the whole store, never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(from = "u64", into = "u64")]
pub struct Fence(pub u64);

impl From<u64> for Fence {
    fn from(v: u64) -> Fence {
        Fence(v)
    }
}
impl From<Fence> for u64 {
    fn from(f: Fence) -> u64 {
        f.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_id_syntax_and_text() {
        let id = ClaimId::new("Ab0_-Ab0_-Ab0_-A").unwrap();
        assert_eq!(id.as_str(), "Ab0_-Ab0_-Ab0_-A");
        assert_eq!(format!("{id}"), "Ab0_-Ab0_-Ab0_-A");
        assert_eq!(format!("{id:?}"), "\"Ab0_-Ab0_-Ab0_-A\"");
        assert!(ClaimId::new("x".repeat(64)).is_ok());
        for bad in ["x".repeat(15), "x".repeat(65), "abcdefghijklmno.".into()] {
            assert_eq!(ClaimId::new(bad).unwrap_err().field, "claim_id");
        }
    }

    #[test]
    fn key_syntax() {
        assert!(Key::new("order-1").is_ok());
        assert!(Key::new("~!\"#$%&'()*+,-./").is_ok());
        let e = Key::new("").unwrap_err();
        assert_eq!(e.field, "key");
        assert!(Key::new("a b").unwrap_err().reason.contains("0x20"));
        assert!(Key::new("é").is_err());
        assert!(Key::new("x".repeat(255)).is_ok());
        assert!(
            Key::new("x".repeat(256))
                .unwrap_err()
                .reason
                .contains("256")
        );
    }

    #[test]
    fn digest_syntax() {
        let good = "a".repeat(64);
        assert!(Digest::parse("fingerprint", &good).is_ok());
        assert!(Digest::parse("fingerprint", &"A".repeat(64)).is_err());
        assert!(Digest::parse("fingerprint", &"a".repeat(63)).is_err());
        assert!(Digest::parse("fingerprint", &"g".repeat(64)).is_err());
        let d = Digest::parse("fingerprint", &good).unwrap();
        assert_eq!(d.to_hex(), good);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{good}\""));
        assert!(serde_json::from_str::<Digest>("\"ABC\"").is_err());
    }

    #[test]
    fn scopes_are_sorted_and_deduplicated() {
        let s = Scopes::from_strs(["b", "a", "b"]).unwrap();
        let names: Vec<&str> = s.as_slice().iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let many: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
        assert!(Scopes::from_strs(many).unwrap_err().reason.contains("65"));
        let e = Scopes::from_strs(["ok", "not ok"]).unwrap_err();
        assert_eq!(e.field, "binding.scopes[1]");
    }

    #[test]
    fn ranges() {
        assert!(LeaseMs::new(99).is_err());
        assert!(LeaseMs::new(100).is_ok());
        assert!(LeaseMs::new(3_600_000).is_ok());
        assert!(LeaseMs::new(3_600_001).is_err());
        assert!(RetentionS::new(0).is_err());
        assert!(RetentionS::new(31_536_000).is_ok());
        assert!(RetentionS::new(31_536_001).is_err());
        assert!(serde_json::from_str::<LeaseMs>("50").is_err());
    }

    #[test]
    fn result_size_is_enforced() {
        let v = serde_json::json!({"a": "x".repeat(100)});
        assert!(ResultJson::from_value(&v, 50).is_err());
        let r = ResultJson::from_value(&v, 1000).unwrap();
        assert_eq!(r.to_value(), v);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap(), v);
    }

    #[test]
    fn results_keep_their_key_order() {
        let r: ResultJson =
            serde_json::from_str(r#"{"z": 1, "a": [2, {"y": 3, "b": 4}]}"#).unwrap();
        assert_eq!(r.as_str(), r#"{"z":1,"a":[2,{"y":3,"b":4}]}"#);
    }

    #[test]
    fn timestamps_display_rfc3339_and_serialize_as_millis() {
        let t = Timestamp(1_700_000_000_123);
        assert_eq!(t.to_string(), "2023-11-14T22:13:20.123Z");
        // One form for every serializer (the wire's text is settle-api's).
        assert_eq!(serde_json::to_string(&t).unwrap(), "1700000000123");
        assert_eq!(
            serde_json::from_str::<Timestamp>("1700000000123").unwrap(),
            t
        );
    }

    /// Found by the fuzz targets (a stored record past year 9999): its
    /// `Debug` and `Display` panicked, as humantime refuses the instant.
    #[test]
    fn instants_past_year_9999_display_without_panicking() {
        let last = Timestamp(LAST_RFC3339_MS);
        assert_eq!(last.to_string(), "9999-12-31T23:59:59.999Z");
        let past = last.plus_ms(1);
        assert_eq!(past.to_rfc3339(), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            format!("{past:?}"),
            "253402300800000 ms after the epoch (past year 9999)"
        );
        assert_eq!(Timestamp(u64::MAX).to_rfc3339(), "9999-12-31T23:59:59.999Z");
    }
}
