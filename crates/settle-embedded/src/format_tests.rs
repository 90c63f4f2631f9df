//! The frozen on-disk formats: log frame format 2 carrying values of
//! format 2 (`codec::FRAME_VERSION`, `codec::FORMAT_VERSION`).
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

use settle_core::testkit::full_record;
use settle_core::{
    Attempt, Digest, Fence, Key, Lease, LeaseMs, Move, Principal, PrincipalState, Purpose, Record,
    Reservation, RetentionS, Scopes, Status, TaskId, TenantId, Text, Timestamp, Warning,
    WarningClass, invariants,
};

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

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

const T0: u64 = 1_764_460_800_000; // 2025-11-30T00:00:00Z

fn t(ms: u64) -> Timestamp {
    Timestamp(T0 + ms)
}
fn d(n: u8) -> Digest {
    Digest([n; 32])
}
fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}
fn alice() -> Principal {
    Principal::new("alice").unwrap()
}
fn pay_refund() -> Scopes {
    Scopes::from_strs(["pay", "refund"]).unwrap()
}
fn lease_ms() -> LeaseMs {
    LeaseMs::new(30_000).unwrap()
}

/// A settled, disputed record: an execute attempt that settled `unknown`
/// with an error, a reconcile attempt that committed the canonical outcome
/// and then met disagreeing evidence, and quarantined evidence (the
/// values of [`full_record`], shared with settle-pg's fixtures).
fn settled_record() -> Record {
    full_record()
}

/// A pending record holding an open execute lease.
fn open_record() -> Record {
    Record {
        key: Key::new("order-2").unwrap(),
        reservation: Reservation {
            fingerprint: d(2),
            principal: alice(),
            scopes: pay_refund(),
            generation: 2,
        },
        status: Status::Pending,
        outcome: None,
        receipt: None,
        reconcile_required: false,
        disputed: false,
        attempts: vec![Attempt {
            number: 1,
            lease: Lease {
                fence: Fence(8),
                purpose: Purpose::Execute,
                generation: 2,
                granted_at: t(3_000),
                expires_at: t(33_000),
                lease_ms: lease_ms(),
                marks_dispatch: false,
                dispatched: false,
                worker: None,
                ended: None,
            },
            receipt: None,
            error: None,
            observations: Vec::new(),
            observations_total: 0,
        }],
        attempts_total: 1,
        quarantine: Vec::new(),
        quarantine_total: 0,
        retention_s: RetentionS::new(86_400).unwrap(),
        created_at: t(3_000),
        updated_at: t(3_000),
        settled_at: None,
    }
}

fn warnings() -> Vec<Warning> {
    let task = TaskId::new("nightly-export").unwrap();
    vec![
        Warning {
            task: task.clone(),
            class: WarningClass::new("slow-remote").unwrap(),
            count: 3,
            detail: Some(Text::new("detail", "p99 above 2 s").unwrap()),
            first_at: t(100),
            last_at: t(900),
            saturated: false,
        },
        Warning {
            task,
            class: WarningClass::new("retry-storm").unwrap(),
            count: 1_000,
            detail: None,
            first_at: t(200),
            last_at: t(800),
            saturated: true,
        },
    ]
}

/// bob at generation 3, with the two moves that brought him there.
fn principal() -> PrincipalState {
    PrincipalState::with_moves(
        3,
        t(1_400),
        &[
            Move { left: 1, at: t(50) },
            Move {
                left: 2,
                at: t(1_400),
            },
        ],
    )
}

/// The frame's entities, with the `open` flag and `expires_at` each entry carries.
fn frame_entities() -> Vec<(EntityKey, Value, bool, Option<u64>)> {
    let settled = settled_record();
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
            Value::Record(open_record()),
            true,
            None,
        ),
        (
            EntityKey::Principal(tenant(), Principal::new("bob").unwrap()),
            Value::Principal(principal()),
            false,
            None,
        ),
        (
            EntityKey::Task(tenant(), TaskId::new("nightly-export").unwrap()),
            Value::Warnings(warnings()),
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
        let w = warnings();
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
            encode_value(&Value::Warnings(warnings())),
        ),
        (
            format!("value-principal-v{FORMAT_VERSION}.bin"),
            encode_value(&Value::Principal(principal())),
        ),
    ]
}

#[test]
fn the_expected_records_are_valid_records() {
    invariants::check_record(&settled_record()).unwrap();
    invariants::check_record(&open_record()).unwrap();
}

#[test]
fn log_frame_v2_fixture_decodes_to_the_expected_batch() {
    let bytes = fixture(FRAME_V2);
    let Frame::Ok(batch, len) = decode_frame(&bytes, FRAME_SEQ, FRAME_OFFSET).unwrap() else {
        panic!("{FRAME_V2} is not a whole frame at segment {FRAME_SEQ} byte {FRAME_OFFSET}");
    };
    assert_eq!(len, bytes.len());
    assert_eq!(
        (batch.version, batch.lsn, batch.next_fence, batch.disputed),
        (2, LSN, NEXT_FENCE, DISPUTED)
    );
    let expected = frame_entities();
    assert_eq!(batch.entries.len(), expected.len());
    for (e, (key, value, open, expires_at)) in batch.entries.iter().zip(&expected) {
        assert_eq!(&EntityKey::from_bytes(e.key).unwrap(), key);
        assert_eq!(&e.decode().unwrap(), value, "{key:?}");
        assert_eq!((e.open, e.expires_at), (*open, *expires_at), "{key:?}");
    }
}

#[test]
fn value_v2_fixtures_decode_to_the_expected_values() {
    for (name, want) in [
        (RECORD_V2, Value::Record(settled_record())),
        (WARNINGS_V2, Value::Warnings(warnings())),
        (PRINCIPAL_V2, Value::Principal(principal())),
    ] {
        assert_eq!(decode_value(&fixture(name)).unwrap(), want, "{name}");
    }
}

#[test]
fn this_build_writes_the_v2_fixtures_byte_for_byte() {
    // Version 2 is the one this build writes. After a deliberate bump,
    // write the new version's fixtures (see the module docs), keep the v2
    // files and their decode tests, and check the new files here instead.
    assert_eq!((FRAME_VERSION, FORMAT_VERSION), (2, 2));
    let names = [FRAME_V2, RECORD_V2, WARNINGS_V2, PRINCIPAL_V2];
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
