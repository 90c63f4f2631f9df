//! The frozen on-disk formats: log frame format 2 carrying values of
//! format 3 (`codec::FRAME_VERSION`, `codec::FORMAT_VERSION`), and values
//! of format 2 (leases without `claim_id`) still read.
//!
//! `tests/fixtures/` holds bytes written once by the build that introduced
//! each version. Every later build must decode them to the values built
//! here (as redb's backward-compatibility tests do), and while a version is
//! the current one, encoding those values must give the same bytes. A
//! change to a stored type (a field added, removed, renamed into another
//! position, a serde attribute, an enum variant reordered) fails these
//! tests: it is a format change, which needs a version bump and a
//! converter (ARCHITECTURE.md, "Architecture invariant: stored formats").
//!
//! New fixtures are written deliberately, never by a normal test run:
//! `cargo test -p settle-embedded --lib write_format_fixtures -- --ignored`
//! writes the fixtures of the versions this build writes, and refuses to
//! overwrite any that exists (see `tests/fixtures/README.md`).

use std::io::Write;
use std::path::PathBuf;

use settle_core::testkit::{
    fixture_open_record, fixture_principal, fixture_warnings, full_record, without_claim_ids,
};
use settle_core::{Key, Principal, Record, TaskId, TenantId, invariants};

use crate::codec::{
    Batch, EntityKey, Entry, FORMAT_VERSION, FRAME_VERSION, Frame, Value, decode_frame,
    decode_value, encode_for_log, encode_frame, encode_frame_of, encode_value, place_frame,
};

/// Where the fixture frame lives: byte 4096 of segment 7 (the header
/// checksum is bound to both).
const FRAME_SEQ: u64 = 7;
const FRAME_OFFSET: u64 = 4096;

const FRAME_V2: &str = "log-frame-v2-values-v2.bin";
const RECORD_V2: &str = "value-record-v2.bin";
const WARNINGS_V2: &str = "value-warnings-v2.bin";
const PRINCIPAL_V2: &str = "value-principal-v2.bin";
const FRAME_V2_VALUES_V3: &str = "log-frame-v2-values-v3.bin";
const RECORD_V3: &str = "value-record-v3.bin";
const WARNINGS_V3: &str = "value-warnings-v3.bin";
const PRINCIPAL_V3: &str = "value-principal-v3.bin";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

// The fixtures' epoch (`FullRecord::t0`), 2025-11-30T00:00:00Z.
const T0: u64 = 1_764_460_800_000;

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// A settled, disputed record: an execute attempt that settled `unknown`
/// with an error, a reconcile attempt that committed the canonical outcome
/// and then met disagreeing evidence, and quarantined evidence (the
/// values of [`full_record`], shared with settle-pg's fixtures).
fn settled_record() -> Record {
    full_record()
}

/// The frame's entities, with the `open` flag and `expires_at` each entry carries.
fn frame_entities() -> Vec<(EntityKey, Value, bool, Option<u64>)> {
    frame_entities_of(settled_record())
}

/// [`frame_entities`] as values of format 2 read them: no `claim_id`s.
fn frame_entities_v2() -> Vec<(EntityKey, Value, bool, Option<u64>)> {
    frame_entities_of(without_claim_ids(settled_record()))
}

fn frame_entities_of(settled: Record) -> Vec<(EntityKey, Value, bool, Option<u64>)> {
    let expires = T0 + 2_000 + 604_800_000;
    vec![
        (
            EntityKey::Record(tenant(), settled.key.clone()),
            Value::Record(settled),
            false,
            Some(expires),
        ),
        (
            EntityKey::Record(tenant(), Key::new("order-2").unwrap()),
            Value::Record(fixture_open_record()),
            true,
            None,
        ),
        (
            EntityKey::Principal(tenant(), Principal::new("bob").unwrap()),
            Value::Principal(fixture_principal()),
            false,
            None,
        ),
        (
            EntityKey::Task(tenant(), TaskId::new("nightly-export").unwrap()),
            Value::Warnings(fixture_warnings()),
            false,
            None,
        ),
        // A collected record: an empty value.
        (
            EntityKey::Record(tenant(), Key::new("collected-1").unwrap()),
            Value::Gone,
            false,
            None,
        ),
    ]
}

const LSN: u64 = 42;
const NEXT_FENCE: u64 = 9;
const DISPUTED: u64 = 1;

/// The frame this build writes for [`frame_entities`] at the fixture's
/// position (the writer's own encoder).
fn encode_fixture_frame() -> Vec<u8> {
    let ents = frame_entities();
    let keys: Vec<Vec<u8>> = ents.iter().map(|e| e.0.to_bytes()).collect();
    let mut out = Vec::new();
    encode_frame_of(
        LSN,
        NEXT_FENCE,
        DISPUTED,
        keys.iter().zip(&ents).map(|(k, e)| (&k[..], &e.1)),
        &mut out,
    );
    place_frame(&mut out, FRAME_SEQ, FRAME_OFFSET);
    out
}

/// The frame of `ents` through serde's derive of [`Batch`] (what the
/// decoder reads), each value encoded on its own first.
fn serde_frame(lsn: u64, ents: &[(Vec<u8>, Value)]) -> Vec<u8> {
    let blobs: Vec<Vec<u8>> = ents.iter().map(|e| encode_for_log(&e.1)).collect();
    let entries = ents
        .iter()
        .zip(&blobs)
        .map(|(e, b)| Entry::new(&e.0, &e.1, b))
        .collect();
    let batch = Batch {
        version: FRAME_VERSION,
        lsn,
        next_fence: NEXT_FENCE,
        disputed: DISPUTED,
        entries,
    };
    let mut out = Vec::new();
    encode_frame(&batch, &mut out);
    out
}

/// The writer encodes values straight into the frame; the bytes are those
/// of the serde encoding, whatever the lengths of the values (their length
/// prefixes take one, two or three bytes) and of the header's integers.
#[test]
fn the_writers_frame_encoder_writes_the_serde_encoding() {
    let key = |s: &str| EntityKey::Record(tenant(), Key::new(s).unwrap()).to_bytes();
    let many_warnings = |n: usize| {
        let w = fixture_warnings();
        Value::Warnings((0..n).map(|i| w[i % 2].clone()).collect())
    };
    let mut ents: Vec<(Vec<u8>, Value)> = frame_entities()
        .into_iter()
        .map(|e| (e.0.to_bytes(), e.1))
        .collect();
    for n in [0, 1, 2, 3, 4, 100, 200, 400, 1000] {
        ents.push((key(&format!("w-{n}")), many_warnings(n)));
    }
    let long = "x".repeat(250);
    ents.push((key(&long), Value::Gone));
    let lengths: Vec<usize> = ents.iter().map(|e| encode_for_log(&e.1).len()).collect();
    assert!(lengths.iter().any(|&l| l < 128), "{lengths:?}");
    assert!(lengths.iter().any(|&l| (128..16_384).contains(&l)));
    assert!(lengths.iter().any(|&l| l >= 16_384));
    for lsn in [0, 1, 127, 128, 300, u64::MAX] {
        for n in [0, 1, ents.len()] {
            let part = &ents[..n];
            let mut direct = vec![0xAB];
            encode_frame_of(
                lsn,
                NEXT_FENCE,
                DISPUTED,
                part.iter().map(|e| (&e.0[..], &e.1)),
                &mut direct,
            );
            assert_eq!(direct[0], 0xAB, "appended after what was there");
            assert_eq!(
                direct[1..],
                serde_frame(lsn, part)[..],
                "lsn {lsn}, {n} entries"
            );
        }
    }
}

/// (file name, bytes) of the fixtures of the versions this build writes.
fn current_fixtures() -> Vec<(String, Vec<u8>)> {
    vec![
        (
            format!("log-frame-v{FRAME_VERSION}-values-v{FORMAT_VERSION}.bin"),
            encode_fixture_frame(),
        ),
        (
            format!("value-record-v{FORMAT_VERSION}.bin"),
            encode_value(&Value::Record(settled_record())),
        ),
        (
            format!("value-warnings-v{FORMAT_VERSION}.bin"),
            encode_value(&Value::Warnings(fixture_warnings())),
        ),
        (
            format!("value-principal-v{FORMAT_VERSION}.bin"),
            encode_value(&Value::Principal(fixture_principal())),
        ),
    ]
}

#[test]
fn the_expected_records_are_valid_records() {
    invariants::check_record(&settled_record()).unwrap();
    invariants::check_record(&fixture_open_record()).unwrap();
}

#[test]
fn log_frame_v2_fixture_decodes_to_the_expected_batch() {
    frame_fixture_decodes_to(FRAME_V2, frame_entities_v2());
}

#[test]
fn log_frame_v2_values_v3_fixture_decodes_to_the_expected_batch() {
    frame_fixture_decodes_to(FRAME_V2_VALUES_V3, frame_entities());
}

fn frame_fixture_decodes_to(name: &str, expected: Vec<(EntityKey, Value, bool, Option<u64>)>) {
    let bytes = fixture(name);
    let Frame::Ok(batch, len) = decode_frame(&bytes, FRAME_SEQ, FRAME_OFFSET).unwrap() else {
        panic!("{name} is not a whole frame at segment {FRAME_SEQ} byte {FRAME_OFFSET}");
    };
    assert_eq!(len, bytes.len());
    assert_eq!(
        (batch.version, batch.lsn, batch.next_fence, batch.disputed),
        (2, LSN, NEXT_FENCE, DISPUTED)
    );
    assert_eq!(batch.entries.len(), expected.len());
    for (e, (key, value, open, expires_at)) in batch.entries.iter().zip(&expected) {
        assert_eq!(&EntityKey::from_bytes(e.key).unwrap(), key);
        assert_eq!(&e.decode().unwrap(), value, "{key:?}");
        assert_eq!((e.open, e.expires_at), (*open, *expires_at), "{key:?}");
    }
}

#[test]
fn value_v2_fixtures_decode_to_the_expected_values() {
    // Format 2 had no claim_id: its leases read back without one.
    for (name, want) in [
        (
            RECORD_V2,
            Value::Record(without_claim_ids(settled_record())),
        ),
        (WARNINGS_V2, Value::Warnings(fixture_warnings())),
        (PRINCIPAL_V2, Value::Principal(fixture_principal())),
    ] {
        assert_eq!(decode_value(&fixture(name)).unwrap(), want, "{name}");
    }
    assert_ne!(without_claim_ids(settled_record()), settled_record());
}

#[test]
fn value_v3_fixtures_decode_to_the_expected_values() {
    for (name, want) in [
        (RECORD_V3, Value::Record(settled_record())),
        (WARNINGS_V3, Value::Warnings(fixture_warnings())),
        (PRINCIPAL_V3, Value::Principal(fixture_principal())),
    ] {
        assert_eq!(decode_value(&fixture(name)).unwrap(), want, "{name}");
    }
}

#[test]
fn this_build_writes_the_v3_fixtures_byte_for_byte() {
    // Frame version 2 with values of version 3 is what this build writes.
    // After a deliberate bump, write the new version's fixtures (see the
    // module docs), keep these files and their decode tests, and check the
    // new files here instead.
    assert_eq!((FRAME_VERSION, FORMAT_VERSION), (2, 3));
    let names = [FRAME_V2_VALUES_V3, RECORD_V3, WARNINGS_V3, PRINCIPAL_V3];
    for ((name, bytes), want) in current_fixtures().into_iter().zip(names) {
        assert_eq!(name, want);
        assert!(
            bytes == fixture(&name),
            "{name}: this build encodes the stored values differently from the frozen \
             format; a change to a stored type is a format change (ARCHITECTURE.md)"
        );
    }
}

/// Writes the fixtures of the versions this build writes, once. Refuses
/// to overwrite: a released version's fixture is frozen.
#[test]
#[ignore = "writes format fixtures; run deliberately after a format version bump"]
fn write_format_fixtures() {
    let dir = fixture_dir();
    let files = current_fixtures();
    for (name, _) in &files {
        let p = dir.join(name);
        assert!(
            !p.exists(),
            "{} exists: the fixtures of a released format version are frozen and never \
             overwritten. A changed encoding needs a new version number (ARCHITECTURE.md).",
            p.display()
        );
    }
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(&name))
            .unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap();
        println!("wrote {}", dir.join(&name).display());
    }
}
