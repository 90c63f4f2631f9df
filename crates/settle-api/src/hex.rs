//! Digests as the wire's 64 lowercase hex characters, without the `hex`
//! crate's per-character iterator and its growing `String` (two to three
//! of them per call were several percent of a call's CPU). The same text
//! and the same refusals as `Digest::to_hex` and `Digest::parse`.

use settle_core::{Digest, InvalidInput};

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `Digest::to_hex`, written straight into a string of the right size.
pub(crate) fn encode(d: &Digest) -> String {
    let mut out = Vec::with_capacity(64);
    for b in d.0 {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0xf)]);
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// `Digest::parse`: 64 lowercase hex characters are decoded here; anything
/// else goes to `Digest::parse` for its refusal, word for word.
pub(crate) fn decode(field: &str, s: &str) -> Result<Digest, InvalidInput> {
    let b = s.as_bytes();
    if b.len() == 64 {
        let mut out = [0u8; 32];
        let mut ok = true;
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(h), Some(l)) => *o = h << 4 | l,
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            return Ok(Digest(out));
        }
    }
    Digest::parse(field, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_text_and_refusals_as_the_core() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..1000 {
            let mut d = [0u8; 32];
            for b in &mut d {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let d = Digest(d);
            assert_eq!(encode(&d), d.to_hex());
            assert_eq!(decode("f", &d.to_hex()).unwrap(), d);
        }
        let good = "0123456789abcdef".repeat(4);
        let bad = [
            String::new(),
            "ab".into(),
            good.to_uppercase(),
            format!("{}g", &good[..63]),
            format!("{}A", &good[..63]),
            format!("{good}0"),
            format!("{}é", &good[..62]),
            " ".repeat(64),
        ];
        for s in bad.iter().chain([&good]) {
            let mine = decode("f", s).map_err(|e| (e.field, e.reason));
            let core = Digest::parse("f", s).map_err(|e| (e.field, e.reason));
            assert_eq!(mine, core, "{s:?}");
        }
    }
}
