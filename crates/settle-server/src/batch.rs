//! `POST /v1/batch` (SPEC §10): many operation calls in one request.
//!
//! Each call is parsed and answered exactly as its single route would
//! (the same functions of [`crate::http::KeyOp`] build its command and
//! render its reply); a malformed call answers 400/422 in its own slot.
//! The commands are applied in order through [`settle_ledger::Store::execute_batch`]
//! — on the embedded store one group commit for the whole batch — and the
//! response goes out only once every result is durable. A `get` sees every
//! call before it: the commands before it are committed first.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::Response;
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;
use settle_core::{Command, Key, RetentionS, TenantId};

use settle_api as api;

use crate::http::{AppState, KeyOp, Route, Sent, finish, record_body};
use crate::openapi::V1Errors;
use crate::problem::Problem;
use crate::wire::parse_body;

/// The request envelope as serde reads it, for the bodies [`split_calls`]
/// does not take; each call is kept as raw text and parsed on its own
/// (borrowed from the body: no copy per call).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow)]
    calls: Vec<&'a RawValue>,
}

/// What one call asks for, once parsed.
enum Call {
    Command(KeyOp, Command),
    Get(Key),
}

/// The answer of one slot: a JSON body (status 200) or a problem.
type Slot = Option<Result<Vec<u8>, Problem>>;

/// Run many operation calls in order; one result per call.
/// Run many operation calls in order; one result per call (SPEC §10).
///
/// At most `max_batch_calls` calls (default 1000; more: 422 for the whole
/// request, field `calls`) in at most `max_batch_body_bytes` (default
/// 16 MiB; more: 413). Each call is `op`, the raw `key` and the fields of
/// that call's request body; its result is the status and the body the
/// single call would have answered (a problem object when not 200), and a
/// malformed call answers 400/422 in its own slot. Calls are applied in
/// order (a key may appear more than once); the batch is not atomic, but
/// every result is durable before the response is sent.
#[utoipa::path(
    post, path = "/v1/batch", tag = "operations",
    request_body = api::BatchRequest,
    responses(
        (status = 200, description = "one result per call, in order", body = api::BatchResponse),
        V1Errors,
    )
)]
pub async fn batch(State(st): State<Arc<AppState>>, req: Request) -> Response {
    finish(Route::Batch, batch_inner(&st, req).await)
}

async fn batch_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let bytes = st
        .body_up_to(&parts, body, live.max_batch_body_bytes)
        .await?;
    let calls = parse_calls(&bytes, live.max_batch_calls, live.default_retention)?;
    let mut slots: Vec<Slot> = (0..calls.len()).map(|_| None).collect();
    let mut pending: Vec<(usize, KeyOp, Sent, Command)> = Vec::with_capacity(calls.len());
    // `max_records` (SPEC §12): each claim counts; while there is room a
    // claim takes one (it may be a replay: the room is recounted before
    // any claim is refused).
    let max_records = live.max_records(tenant);
    let mut room = match max_records {
        Some(max) => st.records.headroom(&*st.store, tenant, max).await?,
        None => u64::MAX,
    };
    for (i, call) in calls.into_iter().enumerate() {
        if let (Ok(Call::Command(KeyOp::Claim, cmd)), Some(max)) = (&call, max_records) {
            if room == 0 {
                // The calls before this one first, in order: their records count.
                commit(st, tenant, &mut pending, &mut slots).await;
                room = st.records.headroom(&*st.store, tenant, max).await?;
            }
            if room > 0 {
                room -= 1;
            } else if let settle_core::Target::Record(key) = cmd.target()
                && let Err(p) =
                    crate::quota::RecordCounts::existing_or_refuse(&*st.store, tenant, key, max)
                        .await
            {
                slots[i] = Some(Err(p));
                continue;
            }
        }
        match call {
            Err(p) => slots[i] = Some(Err(p)),
            Ok(Call::Command(op, cmd)) => match st.prepare(&cmd) {
                Ok(sent) => pending.push((i, op, sent, cmd)),
                Err(p) => slots[i] = Some(Err(p)),
            },
            Ok(Call::Get(key)) => {
                commit(st, tenant, &mut pending, &mut slots).await;
                let found = st.store.get(tenant, &key).await;
                slots[i] = Some(record_body(&key, found));
            }
        }
    }
    commit(st, tenant, &mut pending, &mut slots).await;
    let mut resp = Response::new(render(slots).into());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The envelope of a batch body, refused whole (422 `calls`) beyond `max_calls` calls.
fn parse_envelope(bytes: &[u8], max_calls: usize) -> Result<Envelope<'_>, Problem> {
    let env: Envelope = parse_body(bytes)?;
    if env.calls.len() > max_calls {
        return Err(Problem::invalid(
            "calls",
            format!(
                "holds {} calls; at most {max_calls} are allowed (max_batch_calls)",
                env.calls.len(),
            ),
        ));
    }
    Ok(env)
}

/// What one call of a batch asks for, as [`parse_batch`] reads it.
#[doc(hidden)]
#[derive(Debug)]
pub enum ParsedCall {
    /// An operation call's command.
    Command(Command),
    /// A `get` of this key.
    Get(Key),
}

/// Reads a batch body exactly as the endpoint does (the same functions),
/// without a store: the problem that refuses the whole request, or per
/// call its command (or the key of a `get`) or the problem its slot
/// answers. Public only for the fuzz targets (fuzz/, docs/testing.md).
#[doc(hidden)]
pub fn parse_batch(
    body: &[u8],
    max_calls: usize,
    default_retention: RetentionS,
) -> Result<Vec<Result<ParsedCall, Problem>>, Problem> {
    Ok(parse_calls(body, max_calls, default_retention)?
        .into_iter()
        .map(|call| call.map(ParsedCall::from))
        .collect())
}

/// [`parse_batch`] the slow way (the envelope parsed whole by serde, then
/// each call): the reference the fast path is held to. Public only for
/// the fuzz targets.
#[doc(hidden)]
pub fn parse_batch_by_envelope(
    body: &[u8],
    max_calls: usize,
    default_retention: RetentionS,
) -> Result<Vec<Result<ParsedCall, Problem>>, Problem> {
    Ok(
        parse_calls_from_envelope(body, max_calls, default_retention)?
            .into_iter()
            .map(|call| call.map(ParsedCall::from))
            .collect(),
    )
}

impl From<Call> for ParsedCall {
    fn from(call: Call) -> ParsedCall {
        match call {
            Call::Command(_, cmd) => ParsedCall::Command(cmd),
            Call::Get(key) => ParsedCall::Get(key),
        }
    }
}

/// Every call of a batch body, parsed (before any runs), or the problem
/// that refuses the whole request.
///
/// Most bodies have the layout clients send, `{"calls":[{…},{…}]}`: their
/// calls are cut out by [`split_calls`] and each parsed once. Parsing the
/// envelope with serde first read every byte of every call twice (a
/// `RawValue` is validated as it is read): about an eighth of the server's
/// instructions per pair in the HTTP batch benchmark. The whole body must
/// still be valid JSON, as before: a call that parsed is (its parse read it
/// whole), a call that did not is validated on its own, and any body the
/// splitter does not take, or with an invalid call, goes the old way, which
/// gives exactly the old answer. `parse_calls_agrees_with_the_envelope_parse`
/// (tests) holds the two ways to the same results.
fn parse_calls(
    body: &[u8],
    max_calls: usize,
    default_retention: RetentionS,
) -> Result<Vec<Result<Call, Problem>>, Problem> {
    if let Some(texts) = split_calls(body).filter(|t| t.len() <= max_calls) {
        let mut buf = Vec::new();
        let mut bindings = api::BindingCache::default();
        let calls: Vec<Result<Call, Problem>> = texts
            .iter()
            .map(|t| parse_call(default_retention, t, &mut buf, &mut bindings))
            .collect();
        // A call that parsed was read whole (the op and key the compact
        // layout slices out are a known op name and a key, which has no
        // control characters and no backslash there: valid JSON strings).
        let valid = calls
            .iter()
            .zip(&texts)
            .all(|(call, text)| call.is_ok() || serde_json::from_str::<&RawValue>(text).is_ok());
        if valid {
            return Ok(calls);
        }
    }
    parse_calls_from_envelope(body, max_calls, default_retention)
}

/// [`parse_calls`] the old way: the envelope parsed whole by serde, then
/// each call.
fn parse_calls_from_envelope(
    body: &[u8],
    max_calls: usize,
    default_retention: RetentionS,
) -> Result<Vec<Result<Call, Problem>>, Problem> {
    let env = parse_envelope(body, max_calls)?;
    let mut buf = Vec::new();
    let mut bindings = api::BindingCache::default();
    Ok(env
        .calls
        .iter()
        .map(|raw| parse_call(default_retention, raw.get(), &mut buf, &mut bindings))
        .collect())
}

/// Deeper calls go the old way (serde's recursion limit applies to the
/// whole body, calls included).
const SPLIT_MAX_DEPTH: usize = 64;

/// The text of each call of `{"calls":[…]}` (JSON whitespace allowed
/// between tokens) when every call is an object; `None` for any other
/// body, which [`parse_calls`] leaves to serde. The calls' insides are
/// not validated here, only delimited: strings (with their escapes) are
/// skipped, brackets counted.
fn split_calls(body: &[u8]) -> Option<Vec<&str>> {
    let text = std::str::from_utf8(body).ok()?;
    let b = text.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    };
    let token = |i: usize, t: &[u8]| {
        let i = ws(i);
        b[i..].starts_with(t).then_some(i + t.len())
    };
    let mut i = token(0, b"{")?;
    i = token(i, br#""calls""#)?;
    i = token(i, b":")?;
    i = token(i, b"[")?;
    let mut calls = Vec::new();
    if let Some(end) = token(i, b"]") {
        i = end;
    } else {
        loop {
            let start = ws(i);
            let end = object_end(b, start)?;
            calls.push(&text[start..end]);
            if let Some(next) = token(end, b",") {
                i = next;
            } else {
                i = token(end, b"]")?;
                break;
            }
        }
    }
    i = token(i, b"}")?;
    (ws(i) == b.len()).then_some(calls)
}

/// The end (exclusive) of the object starting at `start`, by its brackets
/// (strings skipped); `None` if it is not an object, not closed, or nested
/// deeper than [`SPLIT_MAX_DEPTH`].
fn object_end(b: &[u8], start: usize) -> Option<usize> {
    if b.get(start) != Some(&b'{') {
        return None;
    }
    let mut depth = 0usize;
    let mut i = start;
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => {
                depth += 1;
                if depth > SPLIT_MAX_DEPTH {
                    return None;
                }
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b'"' => {
                // To the closing quote, over escapes.
                i += 1;
                loop {
                    i += memchr::memchr2(b'"', b'\\', &b[i..])?;
                    if b[i] == b'"' {
                        break;
                    }
                    i += 2;
                    if i >= b.len() {
                        return None;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Runs the pending commands as one store batch and fills their slots.
async fn commit(
    st: &AppState,
    tenant: &TenantId,
    pending: &mut Vec<(usize, KeyOp, Sent, Command)>,
    slots: &mut [Slot],
) {
    if pending.is_empty() {
        return;
    }
    let mut meta = Vec::with_capacity(pending.len());
    let mut cmds = Vec::with_capacity(pending.len());
    for (i, op, sent, cmd) in pending.drain(..) {
        meta.push((i, op, sent));
        cmds.push(cmd);
    }
    let results = if crate::trace::on() {
        use tracing::Instrument as _;
        st.store
            .execute_batch(tenant, cmds)
            .instrument(crate::trace::commit_span("batch"))
            .await
    } else {
        st.store.execute_batch(tenant, cmds).await
    };
    assert_eq!(results.len(), meta.len(), "one result per command");
    let mut created = 0;
    for ((i, op, sent), result) in meta.into_iter().zip(results) {
        if matches!(&result, Ok(r) if crate::quota::creates_record(r)) {
            created += 1;
        }
        slots[i] = Some(st.answer(sent, result).and_then(|reply| op.body(reply)));
    }
    st.records.created(tenant, created);
}

/// `{"results":[{"status":…,"body":…},…]}`, bodies spliced in as rendered.
fn render(slots: Vec<Slot>) -> Vec<u8> {
    let slots: Vec<(u16, Vec<u8>)> = slots
        .into_iter()
        .map(|slot| match slot.expect("every call is answered") {
            Ok(body) => (200, body),
            Err(p) => (p.status, p.to_json()),
        })
        .collect();
    // Sized once: the bodies plus `{"status":NNN,"body":}` and a comma each.
    let size = slots.iter().map(|(_, b)| b.len() + 24).sum::<usize>();
    let mut out = Vec::with_capacity(17 + size);
    out.extend_from_slice(b"{\"results\":[");
    for (i, (status, body)) in slots.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"status\":");
        if (100..1000).contains(status) {
            // An HTTP status has three digits: written without fmt.
            out.extend_from_slice(&[
                b'0' + (status / 100) as u8,
                b'0' + (status / 10 % 10) as u8,
                b'0' + (status % 10) as u8,
            ]);
        } else {
            out.extend_from_slice(status.to_string().as_bytes());
        }
        out.extend_from_slice(b",\"body\":");
        out.extend_from_slice(body);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}\n");
    out
}

/// The op of a call (SPEC §10).
#[derive(Clone, Copy)]
enum Op {
    Key(KeyOp),
    Get,
}

const OPS: &str = "claim, heartbeat, dispatch, settle, release, reconcile or get";

fn unknown_op() -> Problem {
    Problem::invalid("op", format!("must be one of {OPS}"))
}

fn op_named(name: &str) -> Option<Op> {
    Some(match name {
        "claim" => Op::Key(KeyOp::Claim),
        "heartbeat" => Op::Key(KeyOp::Heartbeat),
        "dispatch" => Op::Key(KeyOp::Dispatch),
        "settle" => Op::Key(KeyOp::Settle),
        "release" => Op::Key(KeyOp::Release),
        "reconcile" => Op::Key(KeyOp::Reconcile),
        "get" => Op::Get,
        _ => return None,
    })
}

/// A call's members in order, values as raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses one call: its `op`, its raw `key`, and the rest as the single
/// call's request body (so a bad field is reported as the single call
/// would report it). `buf` holds that body; it is reused from call to call.
fn parse_call(
    default_retention: RetentionS,
    text: &str,
    buf: &mut Vec<u8>,
    bindings: &mut api::BindingCache,
) -> Result<Call, Problem> {
    buf.clear();
    let (op, key) = match compact_head(text) {
        Some((op, key, fields)) => {
            buf.push(b'{');
            buf.extend_from_slice(fields.as_bytes());
            (op_named(op).ok_or_else(unknown_op)?, key.to_string())
        }
        None => split_call(text, buf)?,
    };
    let key = Key::new(key).map_err(|e| Problem::invalid("key", e.reason))?;
    match op {
        Op::Key(op) => Ok(Call::Command(
            op,
            op.command(default_retention, key, buf, Some(bindings))?,
        )),
        Op::Get => {
            let _: api::EmptyRequest = parse_body(buf)?;
            Ok(Call::Get(key))
        }
    }
}

/// The layout clients send (settle's own, and most serializers):
/// `{"op":"…","key":"…",<fields>}` with `op` and `key` first, no
/// whitespace and no escapes in either. Then the op, the key and the
/// fields after the key with the closing brace (`}` alone when there are
/// none), sliced out of the text instead of read member by member and
/// written out again. Any other layout is `None` and goes through
/// [`split_call`]; both give the same body, member for member in order.
/// `text` is valid JSON (the envelope parsed it), so a string without a
/// backslash is its own value.
fn compact_head(text: &str) -> Option<(&str, &str, &str)> {
    let rest = text.strip_prefix(r#"{"op":""#)?;
    let (op, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(r#","key":""#)?;
    let (key, rest) = rest.split_once('"')?;
    if op.contains('\\') || key.contains('\\') {
        return None;
    }
    let fields = match rest.strip_prefix(',') {
        // `,}` after the key is a trailing comma, not JSON: `{` + `}`
        // would parse as an empty body, so it goes the slow way (400).
        Some(fields)
            if !fields
                .trim_start_matches([' ', '\t', '\n', '\r'])
                .starts_with('}') =>
        {
            fields
        }
        Some(_) => return None,
        None if rest == "}" => rest,
        None => return None,
    };
    Some((op, key, fields))
}

/// Any layout: the first `op` and `key` members out, every other member
/// written into `buf` as a body of its own, in order; an absent or
/// unknown op, an absent key or one that is not a string is a problem.
fn split_call(text: &str, buf: &mut Vec<u8>) -> Result<(Op, String), Problem> {
    if !text.starts_with('{') {
        return Err(Problem::bad_request("a call must be a JSON object"));
    }
    let Members(members) = serde_json::from_str(text)
        .map_err(|e| Problem::bad_request(format!("the call is not valid JSON: {e}")))?;
    let mut op = None;
    let mut key = None;
    buf.push(b'{');
    for (name, value) in &members {
        match name.as_str() {
            "op" if op.is_none() => op = Some(*value),
            "key" if key.is_none() => key = Some(*value),
            _ => {
                if buf.len() > 1 {
                    buf.push(b',');
                }
                serde_json::to_writer(&mut *buf, name).expect("a string serializes");
                buf.push(b':');
                buf.extend_from_slice(value.get().as_bytes());
            }
        }
    }
    buf.push(b'}');
    let op = op.ok_or_else(|| Problem::invalid("op", "is required"))?;
    let op = serde_json::from_str::<&str>(op.get())
        .ok()
        .and_then(op_named)
        .ok_or_else(unknown_op)?;
    let key = key.ok_or_else(|| Problem::invalid("key", "is required"))?;
    let key: String = serde_json::from_str(key.get())
        .map_err(|_| Problem::invalid("key", "must be a string (the raw key)"))?;
    Ok((op, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Calls of every kind the two ways must agree on: valid ones in the
    /// compact and in other layouts, ones with a bad field (422 in their
    /// slot), escapes, nesting, and text that is not JSON at all.
    fn call_texts() -> Vec<String> {
        let fp = "07".repeat(32);
        let b = r#"{"principal":"a","scopes":["pay"],"generation":0}"#;
        let out = format!(
            r#"{{"status":"completed","result":{{"n":[1,2.5,"x\"]}}]"}},"response_sha256":"{fp}"}}"#
        );
        vec![
            format!(r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b}}}"#),
            format!(
                r#"{{"op":"settle","key":"k1","fence":3,"fingerprint":"{fp}","binding":{b},"outcome":{out}}}"#
            ),
            r#"{"op":"get","key":"k1"}"#.to_string(),
            format!(
                r#"{{ "key" : "k\u0032", "op":"claim", "fingerprint":"{fp}", "binding":{b} }}"#
            ),
            format!(r#"{{"op":"claim","key":"k3","fingerprint":7,"binding":{b}}}"#),
            r#"{"op":"nope","key":"k4"}"#.to_string(),
            r#"{"op":"claim"}"#.to_string(),
            r#"{"op":"get","key":"k"5"}"#.to_string(),
            r#"{"op":"get","key":"k5","x":[[[{"y":null}]],true,false,-0.5e3]}"#.to_string(),
            // Trailing commas: not JSON.
            r#"{"op":"get","key":"k1",}"#.to_string(),
            format!(r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b}, }}"#),
            "[1,2]".to_string(),
            r#""text""#.to_string(),
            "{}".to_string(),
        ]
    }

    fn both_ways(body: &[u8], max: usize) -> (String, String) {
        let show = |r: Result<Vec<Result<Call, Problem>>, Problem>| {
            format!(
                "{:?}",
                r.map(|v| v
                    .into_iter()
                    .map(|c| c.map(ParsedCall::from))
                    .collect::<Vec<_>>())
            )
        };
        (
            show(parse_calls(body, max, RetentionS::DEFAULT)),
            show(parse_calls_from_envelope(body, max, RetentionS::DEFAULT)),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The split parse and the envelope parse give the same answer,
        /// per call or for the whole body, for any body: made of the calls
        /// above with any whitespace, then cut short, a byte changed, or a
        /// byte inserted (which makes most of them invalid JSON somewhere).
        #[test]
        fn parse_calls_agrees_with_the_envelope_parse(
            picks in proptest::collection::vec(0usize..14, 0..6),
            spaces in proptest::collection::vec(prop_oneof![Just(""), Just(" "), Just("\n\t"), Just("\r")], 8),
            edit in 0usize..4,
            at in any::<proptest::sample::Index>(),
            byte in prop_oneof![
                Just(b'"'), Just(b'\\'), Just(b'{'), Just(b'}'), Just(b'['), Just(b']'),
                Just(b','), Just(b':'), Just(b' '), Just(0x01u8), Just(b'a'), Just(0xffu8), Just(b'0'),
            ],
            max in prop_oneof![Just(1000usize), Just(2)],
        ) {
            let texts = call_texts();
            let calls: Vec<&str> = picks.iter().map(|&i| texts[i].as_str()).collect();
            let s = &spaces;
            let body = format!(
                "{}{{{}\"calls\"{}:{}[{}{}]{}}}{}",
                s[0], s[1], s[2], s[3], s[4],
                calls.join(&format!("{},{}", s[5], s[6])),
                s[7], s[0],
            );
            let mut body = body.into_bytes();
            if !body.is_empty() {
                let i = at.index(body.len());
                match edit {
                    0 => {}
                    1 => body.truncate(i),
                    2 => body[i] = byte,
                    _ => body.insert(i, byte),
                }
            }
            let (split, envelope) = both_ways(&body, max);
            prop_assert_eq!(split, envelope, "body: {}", String::from_utf8_lossy(&body));
        }
    }

    /// A body that is not JSON is 400 `bad_request`, whichever way it is
    /// read: a trailing comma after the key once slipped through the
    /// compact layout as an empty body.
    #[test]
    fn a_trailing_comma_is_not_json() {
        for body in [
            r#"{"calls":[{"op":"get","key":"k1",}]}"#,
            r#"{"calls":[{"op":"get","key":"k1", }]}"#,
            "{\"calls\":[{\"op\":\"get\",\"key\":\"k1\",\n}]}",
            r#"{"calls":[{"op":"get","key":"k1"},]}"#,
            r#"{"calls":[{"op":"get","key":"k1"}],}"#,
            // A form feed is not JSON whitespace (it was trimmed as if it were).
            "\u{c}{\"calls\":[{}]}",
        ] {
            match parse_calls(body.as_bytes(), 1000, RetentionS::DEFAULT) {
                Err(p) => assert_eq!((p.status, p.code), (400, api::Code::BadRequest), "{body}"),
                Ok(calls) => panic!("{body} accepted: {} calls", calls.len()),
            }
        }
        let ok = r#"{"calls":[{"op":"get","key":"k1"}]}"#;
        assert!(parse_calls(ok.as_bytes(), 1000, RetentionS::DEFAULT).is_ok());
    }

    /// Bodies the splitter takes, and ones it leaves to serde.
    #[test]
    fn the_splitter_takes_the_common_layout_only() {
        fn calls(b: &str) -> Option<Vec<&str>> {
            split_calls(b.as_bytes())
        }
        assert_eq!(calls(r#"{"calls":[]}"#), Some(vec![]));
        assert_eq!(
            calls(" {\n\"calls\" : [ {\"a\":\"}\\\"{\"} , {\"b\":[{}]} ] } \n"),
            Some(vec![r#"{"a":"}\"{"}"#, r#"{"b":[{}]}"#])
        );
        // Not objects, another member, an escaped name, something after.
        for b in [
            r#"{"calls":[1]}"#,
            r#"{"calls":[],"x":1}"#,
            r#"{"x":1,"calls":[]}"#,
            r#"{"\u0063alls":[]}"#,
            r#"{"calls":[{}]}x"#,
            r#"{"calls":[{"a":"}]}"#,
            r#"{"calls":[{}"#,
        ] {
            assert_eq!(calls(b), None, "{b}");
        }
        let deep = format!(r#"{{"calls":[{}{}]}}"#, "[".repeat(70), "]".repeat(70));
        assert_eq!(calls(&deep), None);
        let deep_obj = format!(
            r#"{{"calls":[{{"a":{}1{}}}]}}"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        assert_eq!(calls(&deep_obj), None, "deeper than SPLIT_MAX_DEPTH");
    }

    /// The calls of a batch share converted bindings (`api::BindingCache`):
    /// each command still carries exactly the binding its call sent, and a
    /// bad binding fails only its own slot.
    #[test]
    fn each_call_keeps_its_own_binding() {
        let fp = "07".repeat(32);
        let bind = |p: &str, scope: &str, g: u64| {
            format!(r#"{{"principal":"{p}","scopes":["{scope}"],"generation":{g}}}"#)
        };
        let out = format!(r#"{{"status":"completed","result":1,"response_sha256":"{fp}"}}"#);
        let bindings = [
            bind("a", "pay", 0),
            bind("a", "pay", 0),
            bind("a", "pay", 1),
            bind("a", "", 1),
            bind("b", "pay", 1),
            bind("a", "pay", 0),
        ];
        let calls: Vec<String> = bindings
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if i % 2 == 0 {
                    format!(r#"{{"op":"claim","key":"k{i}","fingerprint":"{fp}","binding":{b}}}"#)
                } else {
                    format!(
                        r#"{{"op":"settle","key":"k{i}","fence":3,"fingerprint":"{fp}","binding":{b},"outcome":{out}}}"#
                    )
                }
            })
            .collect();
        let body = format!(r#"{{"calls":[{}]}}"#, calls.join(","));
        let parsed = parse_batch(body.as_bytes(), 1000, RetentionS::DEFAULT).unwrap();
        let seen: Vec<Option<(String, Vec<String>, u64)>> = parsed
            .iter()
            .map(|c| {
                let b = match c {
                    Ok(ParsedCall::Command(Command::Claim(c))) => &c.binding,
                    Ok(ParsedCall::Command(Command::Settle(s))) => &s.binding,
                    Err(p) => {
                        assert_eq!(p.status, 422);
                        return None;
                    }
                    other => panic!("{other:?}"),
                };
                let scopes = b.scopes.as_slice().iter().map(|s| s.to_string()).collect();
                Some((b.principal.to_string(), scopes, b.generation))
            })
            .collect();
        let want = |p: &str, g: u64| Some((p.to_string(), vec!["pay".to_string()], g));
        assert_eq!(
            seen,
            vec![
                want("a", 0),
                want("a", 0),
                want("a", 1),
                None,
                want("b", 1),
                want("a", 0)
            ]
        );
    }

    /// The compact layout is sliced (`compact_head`), any other layout is
    /// read member by member (`split_call`): the same call in either layout
    /// must answer the same, command or problem.
    #[test]
    fn compact_and_general_layouts_answer_alike() {
        let fp = "07".repeat(32);
        let b = r#"{"principal":"p","scopes":["a"],"generation":0}"#;
        let out = format!(
            r#"{{"status":"completed","result":{{"x": [1, 2.50, 1e400]}},"response_sha256":"{fp}"}}"#
        );
        let calls = [
            format!(r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b}}}"#),
            format!(
                r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b},"lease_ms":50}}"#
            ),
            format!(r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b},"bogus":1}}"#),
            format!(r#"{{"op":"claim","key":"k1","op":"get","fingerprint":"{fp}","binding":{b}}}"#),
            format!(r#"{{"op":"claim","key":"k1","key":"k2","fingerprint":"{fp}","binding":{b}}}"#),
            format!(
                r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b},"fingerprint":"{fp}"}}"#
            ),
            format!(r#"{{"op":"claim","key":"k 1","fingerprint":"{fp}","binding":{b}}}"#),
            format!(r#"{{"op":"claim","key":"","fingerprint":"{fp}","binding":{b}}}"#),
            format!(
                r#"{{"op":"claim","key":"k1","fingerprint":"{fp}","binding":{b}, "worker" : "w"}}"#
            ),
            format!(
                r#"{{"op":"settle","key":"k1","fence":3,"fingerprint":"{fp}","binding":{b},"outcome":{out}}}"#
            ),
            format!(
                r#"{{"op":"settle","key":"k1","fence":0,"fingerprint":"{fp}","binding":{b},"outcome":{out}}}"#
            ),
            format!(
                r#"{{"op":"settle","key":"k1","fence":"3","fingerprint":"{fp}","binding":{b},"outcome":{out}}}"#
            ),
            r#"{"op":"dispatch","key":"k1","fence":2}"#.to_string(),
            r#"{"op":"heartbeat","key":"k1"}"#.to_string(),
            r#"{"op":"release","key":"k1","fence":2,"reason":"not_committed"}"#.to_string(),
            r#"{"op":"get","key":"k1"}"#.to_string(),
            r#"{"op":"get","key":"k1","x":1}"#.to_string(),
            r#"{"op":"nope","key":"k1"}"#.to_string(),
            r#"{"op":"","key":"k1"}"#.to_string(),
            r#"{"op":"claim","key":"\u006b1"}"#.to_string(),
            r#"{"op":"cl\u0061im","key":"k1"}"#.to_string(),
            r#"{"op":"claim","key":"a\"b"}"#.to_string(),
        ];
        for call in &calls {
            // A space after the brace leaves the compact layout.
            assert!(
                compact_head(call).is_some() || call.contains('\\'),
                "{call}"
            );
            let spaced = format!("{{ {}", &call[1..]);
            let compact: &RawValue = serde_json::from_str(call).unwrap();
            let general: &RawValue = serde_json::from_str(&spaced).unwrap();
            let mut buf = Vec::new();
            let mut bindings = api::BindingCache::default();
            let a =
                parse_call(RetentionS::DEFAULT, compact.get(), &mut buf, &mut bindings).map(|c| {
                    match c {
                        Call::Command(op, cmd) => format!("{op:?} {cmd:?}"),
                        Call::Get(k) => format!("get {k:?}"),
                    }
                });
            let b =
                parse_call(RetentionS::DEFAULT, general.get(), &mut buf, &mut bindings).map(|c| {
                    match c {
                        Call::Command(op, cmd) => format!("{op:?} {cmd:?}"),
                        Call::Get(k) => format!("get {k:?}"),
                    }
                });
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{call}");
        }
    }

    #[test]
    fn results_are_spliced_in_order() {
        let slots = vec![
            Some(Ok(br#"{"a":1}"#.to_vec())),
            Some(Err(Problem::invalid("op", "is required"))),
        ];
        let v: serde_json::Value = serde_json::from_slice(&render(slots)).unwrap();
        assert_eq!(v["results"][0]["status"], 200);
        assert_eq!(v["results"][0]["body"]["a"], 1);
        assert_eq!(v["results"][1]["status"], 422);
        assert_eq!(v["results"][1]["body"]["code"], "invalid_request");
        assert_eq!(v["results"][1]["body"]["field"], "op");
    }
}
