//! The stored-record decoders: the embedded engine's index values and
//! entity keys (settle-embedded `codec`) and the PostgreSQL row codec
//! (settle-pg `codec`), which both read the core's `Record`,
//! `PrincipalState`, `Warning` and `Move` back with postcard.
//!
//! Input: a selector byte, then the stored bytes.
//!
//! Properties: decoding never panics; a value that decodes re-encodes into
//! bytes no longer than the input that decode to the same value (and
//! encode to themselves); a decoded record can be served (its record view
//! renders) and described (its columns, its log entry); an entity key
//! re-encodes to its exact bytes; a principal read from its columns
//! survives the columns written for it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settle_core::{Move, Record, Warning};
use settle_embedded::codec::{self, EntityKey};
use settle_pg::codec as pg;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Ok(v) = codec::decode_value(bytes) {
                settle_fuzz::check_value(&v, bytes);
            }
        }
        1 => {
            if let Ok(k) = EntityKey::from_bytes(bytes) {
                assert_eq!(k.to_bytes(), bytes, "an entity key re-encodes to itself");
            }
        }
        2 => pg_record(bytes),
        3 => pg_warnings(bytes, which & 0x80 != 0),
        4 => pg_moves(bytes),
        _ => pg_principal(bytes),
    }
});

fn pg_record(bytes: &[u8]) {
    let Ok(Some(r)) = pg::decode_record(Some(pg::FORMAT), Some(bytes)) else {
        return;
    };
    let enc = pg::encode(&r).expect("a record encodes");
    assert!(enc.len() <= bytes.len(), "re-encoding grew the record");
    let back: Option<Record> = pg::decode_record(Some(pg::FORMAT), Some(&enc)).unwrap();
    assert_eq!(
        back.as_ref(),
        Some(&r),
        "a record survives its own encoding"
    );
    settle_fuzz::check_record(&r);
}

fn pg_warnings(bytes: &[u8], format_1: bool) {
    // Warnings kept their layout in format 2: format 1 rows are read alike.
    let format = if format_1 {
        pg::FORMAT_POSTCARD_V1
    } else {
        pg::FORMAT
    };
    let Ok(ws) = pg::decode_warnings(Some(format), Some(bytes)) else {
        return;
    };
    let enc = pg::encode(&ws).expect("warnings encode");
    assert!(enc.len() <= bytes.len(), "re-encoding grew the warnings");
    let back: Vec<Warning> = pg::decode("warnings", pg::FORMAT, &enc).unwrap();
    assert_eq!(back, ws, "warnings survive their own encoding");
}

fn pg_moves(bytes: &[u8]) {
    let Ok(moves) = pg::decode::<Vec<Move>>("principal moves", pg::FORMAT, bytes) else {
        return;
    };
    let enc = pg::encode(&moves).expect("moves encode");
    assert!(enc.len() <= bytes.len(), "re-encoding grew the moves");
    let back: Vec<Move> = pg::decode("principal moves", pg::FORMAT, &enc).unwrap();
    assert_eq!(back, moves, "moves survive their own encoding");
}

/// A principal row: `moved_at` (8 bytes, i64), the generation's text up to
/// a 0 byte, then the moves column (absent when the input ends there).
fn pg_principal(bytes: &[u8]) {
    let Some((m, rest)) = bytes.split_first_chunk::<8>() else {
        return;
    };
    let moved_at = i64::from_le_bytes(*m);
    let (text, moves) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], Some(rest[i + 1..].to_vec())),
        None => (rest, None),
    };
    let gen_text = String::from_utf8_lossy(text).into_owned();
    let Ok(st) = pg::principal_state(Some(gen_text), Some(moved_at), moves) else {
        return;
    };
    let cols = pg::PrincipalColumns::of(&st).expect("principal columns");
    let back = pg::principal_state(
        Some(cols.generation.clone()),
        Some(cols.moved_at),
        Some(cols.moves.clone()),
    )
    .expect("the columns written for a principal read back");
    assert_eq!(back, st, "a principal survives its own columns");
}
