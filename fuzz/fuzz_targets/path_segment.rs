//! Percent-decoding of path segments (settle-server `wire`): the `{key}`
//! of `/v1/operations/{key}` and the other token segments (SPEC §7).
//!
//! Input: the raw segment (UTF-8, as a URI path yields it).
//!
//! Properties: the decoder accepts exactly the segments that are well
//! formed by an independent reading of SPEC §7 (visible ASCII, no raw `#`,
//! every `%` followed by two hex digits) and refuses the rest with 400; an
//! accepted segment decodes as the `percent-encoding` crate decodes it,
//! and encoding the result again decodes back to it; the typed `segment`
//! accepts exactly the decoded bytes that are a valid key (422 otherwise).
#![no_main]

use libfuzzer_sys::fuzz_target;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, percent_encode};
use settle_core::Key;
use settle_server::wire::{decode_segment, segment};

/// What a client must encode in a segment: everything outside visible
/// ASCII, the escape itself, and the characters a path gives meaning to.
const SEGMENT: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'#').add(b'/').add(b'?');

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = decode_segment("key", raw);
    assert_eq!(
        decoded.is_ok(),
        well_formed(raw.as_bytes()),
        "{raw:?}: {:?}",
        decoded.as_ref().err().map(|p| &p.detail)
    );
    let typed = segment::<Key>("key", raw);
    let bytes = match decoded {
        Err(p) => {
            assert_eq!(p.status, 400, "a malformed segment is a bad request");
            let e = typed.expect_err("a malformed segment is no key");
            assert_eq!(e.status, 400);
            return;
        }
        Ok(b) => b,
    };
    let reference: Vec<u8> = percent_decode_str(raw).collect();
    assert_eq!(
        bytes, reference,
        "{raw:?} decodes as the reference decodes it"
    );
    let again = percent_encode(&bytes, SEGMENT).to_string();
    assert_eq!(
        decode_segment("key", &again).expect("an encoded segment is well formed"),
        bytes,
        "{again:?} decodes back"
    );
    let valid_key = std::str::from_utf8(&bytes)
        .ok()
        .filter(|s| s.bytes().all(|c| (0x21..=0x7e).contains(&c)))
        .is_some_and(|s| Key::new(s).is_ok());
    match typed {
        Ok(k) => {
            assert!(valid_key);
            assert_eq!(k.as_str().as_bytes(), &bytes[..]);
        }
        Err(p) => {
            assert!(
                !valid_key,
                "{raw:?} is a valid key, refused: {:?}",
                p.detail
            );
            assert_eq!(p.status, 422, "a segment that is no key is unprocessable");
        }
    }
});

/// SPEC §7's syntax, read independently of the decoder: visible ASCII
/// (0x21–0x7E), no raw `#`, and `%` only as `%XX` with two hex digits.
fn well_formed(raw: &[u8]) -> bool {
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hex = raw.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b'#' => return false,
            0x21..=0x7e => i += 1,
            _ => return false,
        }
    }
    true
}
