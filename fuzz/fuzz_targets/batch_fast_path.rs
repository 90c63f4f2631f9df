//! The batch body's fast path (settle-server `batch::parse_batch`: the
//! calls cut out of `{"calls":[…]}` and parsed one by one) against the
//! slow, obviously right way (`parse_batch_by_envelope`: serde reads the
//! envelope whole, then each call) and against serde_json's own verdict
//! on whether the body is JSON at all.
//!
//! Input: the request body.
//!
//! Properties: a body serde_json refuses is refused whole with 400
//! `bad_request` (never 200 with calls), except an empty body (or JSON
//! whitespace only),
//! which SPEC §7 reads as `{}`; and the two ways give the same
//! answer: the same problem for the whole request, or per call the same
//! command, key or problem.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settle_core::RetentionS;
use settle_server::batch::{parse_batch, parse_batch_by_envelope};

const MAX_CALLS: usize = 1000;

fuzz_target!(|data: &[u8]| {
    let fast = parse_batch(data, MAX_CALLS, RetentionS::DEFAULT);
    let blank = data.iter().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if !blank && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_err() {
        match &fast {
            Err(p) => assert_eq!(p.status, 400, "a body that is not JSON: {:?}", p.detail),
            Ok(calls) => panic!("a body that is not JSON was accepted with {} calls", calls.len()),
        }
    }
    let slow = parse_batch_by_envelope(data, MAX_CALLS, RetentionS::DEFAULT);
    assert_eq!(format!("{fast:?}"), format!("{slow:?}"), "the fast path disagrees");
});
