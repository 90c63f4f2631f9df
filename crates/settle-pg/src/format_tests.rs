//! The frozen PostgreSQL row encoding: record format 3 (`codec::FORMAT`)
//! in schema version 2 (`schema::SCHEMA_VERSION`), and format 2 still read.
//!
//! `tests/fixtures/` holds, as the engine writes them, the `value` bytea of
//! a record and of a task's warnings, a principal's `moves`, and the
//! derived columns of a record row and a principal row (as text, one
//! `column=value` a line). Every later build must decode the bytes to the
//! values built here (as redb's backward-compatibility tests do); while
//! format 3 is the one written, encoding those values must give the same
//! bytes and columns. A change to a stored type is a format change: a new
//! format number and a converter, or a clear refusal (ARCHITECTURE.md,
//! "Architecture invariant: stored formats"). `tests/format.rs` loads the
//! same rows into a real schema and reads them through the store.
//!
//! New fixtures are written deliberately, never by a normal test run:
//! `cargo test -p settle-pg --lib write_format_fixtures -- --ignored`
//! writes the fixtures of the format and schema version this build writes,
//! and refuses to overwrite any that exists (see `tests/fixtures/README.md`).

use std::io::Write;
use std::path::PathBuf;

use settle_core::testkit::{
    fixture_open_record, fixture_principal, fixture_warnings, full_record, without_claim_ids,
};
use settle_core::{Record, invariants};

use crate::codec::{
    FORMAT, FORMAT_POSTCARD_V2, PrincipalColumns, RecordColumns, decode_record, decode_warnings,
    encode, principal_state,
};
use crate::schema::SCHEMA_VERSION;

const RECORD_2: &str = "record-format2.bin";
const RECORD_COLUMNS_2: &str = "record-columns-format2-schema2.txt";
const OPEN_RECORD_2: &str = "open-record-format2.bin";
const OPEN_RECORD_COLUMNS_2: &str = "open-record-columns-format2-schema2.txt";
const WARNINGS_2: &str = "warnings-format2.bin";
const MOVES_2: &str = "principal-moves-format2.bin";
const PRINCIPAL_COLUMNS_2: &str = "principal-columns-schema2.txt";
const RECORD_3: &str = "record-format3.bin";
const RECORD_COLUMNS_3: &str = "record-columns-format3-schema2.txt";
const OPEN_RECORD_3: &str = "open-record-format3.bin";
const OPEN_RECORD_COLUMNS_3: &str = "open-record-columns-format3-schema2.txt";
const WARNINGS_3: &str = "warnings-format3.bin";
const MOVES_3: &str = "principal-moves-format3.bin";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// A settled, disputed record: an execute attempt that settled `unknown`
/// with an error, a reconcile attempt that committed the canonical outcome
/// and later met disagreeing evidence, and quarantined evidence (the
/// values of [`full_record`], shared with the embedded engine's fixtures).
fn settled_record() -> Record {
    full_record()
}

/// A record row's columns besides tenant, key and value, as the engine
/// writes them (`format` and the derived columns), one `name=value` a line.
fn record_columns_text(r: &Record) -> String {
    let c = RecordColumns::of(r);
    let opt = |v: Option<String>| v.unwrap_or_else(|| "NULL".into());
    [
        format!("format={FORMAT}"),
        format!("owner={}", c.owner),
        format!("status={}", c.status),
        format!("reconcile={}", c.reconcile),
        format!(
            "lease_expires_at={}",
            opt(c.lease_expires_at.map(|v| v.to_string()))
        ),
        format!("lease_generation={}", opt(c.lease_generation)),
        format!("updated_at={}", c.updated_at),
        format!("collect_at={}", opt(c.collect_at.map(|v| v.to_string()))),
        format!("receipt_at={}", opt(c.receipt_at.map(|v| v.to_string()))),
        format!("disputed={}", c.disputed),
        String::new(),
    ]
    .join("\n")
}

/// A principal row's `generation` and `moved_at` (its `moves` are [`MOVES_2`]).
fn principal_columns_text(c: &PrincipalColumns) -> String {
    format!("generation={}\nmoved_at={}\n", c.generation, c.moved_at)
}

/// `column=value` lines back into pairs.
fn parse_columns(text: &[u8]) -> Vec<(String, String)> {
    std::str::from_utf8(text)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("column=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn column<'a>(cols: &'a [(String, String)], name: &str) -> &'a str {
    &cols.iter().find(|(k, _)| k == name).expect(name).1
}

/// (file name, bytes) of the fixtures of the format and schema this build writes.
fn current_fixtures() -> Vec<(String, Vec<u8>)> {
    let p = PrincipalColumns::of(&fixture_principal()).unwrap();
    vec![
        (
            format!("record-format{FORMAT}.bin"),
            encode(&settled_record()).unwrap(),
        ),
        (
            format!("record-columns-format{FORMAT}-schema{SCHEMA_VERSION}.txt"),
            record_columns_text(&settled_record()).into_bytes(),
        ),
        (
            format!("open-record-format{FORMAT}.bin"),
            encode(&fixture_open_record()).unwrap(),
        ),
        (
            format!("open-record-columns-format{FORMAT}-schema{SCHEMA_VERSION}.txt"),
            record_columns_text(&fixture_open_record()).into_bytes(),
        ),
        (
            format!("warnings-format{FORMAT}.bin"),
            encode(&fixture_warnings()).unwrap(),
        ),
        (
            format!("principal-moves-format{FORMAT}.bin"),
            p.moves.clone(),
        ),
        (
            format!("principal-columns-schema{SCHEMA_VERSION}.txt"),
            principal_columns_text(&p).into_bytes(),
        ),
    ]
}

#[test]
fn the_expected_records_are_valid_records() {
    invariants::check_record(&settled_record()).unwrap();
    invariants::check_record(&fixture_open_record()).unwrap();
}

#[test]
fn format_2_fixtures_decode_to_the_expected_values() {
    let two = Some(FORMAT_POSTCARD_V2);
    // Format 2 had no claim_id: its leases read back without one.
    assert_eq!(
        decode_record(two, Some(&fixture(RECORD_2))).unwrap(),
        Some(without_claim_ids(settled_record()))
    );
    assert_ne!(without_claim_ids(settled_record()), settled_record());
    assert_eq!(
        decode_record(two, Some(&fixture(OPEN_RECORD_2))).unwrap(),
        Some(fixture_open_record())
    );
    assert_eq!(
        decode_warnings(two, Some(&fixture(WARNINGS_2))).unwrap(),
        fixture_warnings()
    );
    let cols = fixture(PRINCIPAL_COLUMNS_2);
    let cols = parse_columns(&cols);
    let st = principal_state(
        Some(column(&cols, "generation").to_string()),
        Some(column(&cols, "moved_at").parse().unwrap()),
        Some(fixture(MOVES_2)),
    )
    .unwrap();
    assert_eq!(st, fixture_principal());
}

#[test]
fn the_record_columns_fixtures_describe_the_expected_records() {
    // The derived columns are written, never read back into a record: what
    // is frozen is what the sweep's and the stats' SQL find in them.
    let cols = fixture(RECORD_COLUMNS_2);
    let cols = parse_columns(&cols);
    let r = settled_record();
    assert_eq!(column(&cols, "format"), "2");
    assert_eq!(column(&cols, "owner"), r.reservation.principal.as_str());
    assert_eq!(column(&cols, "status"), "4", "the rank of completed");
    assert_eq!(column(&cols, "lease_expires_at"), "NULL", "no open lease");
    let collect_at = r.settled_at.unwrap().millis() + r.retention_s.get() * 1000;
    assert_eq!(column(&cols, "collect_at"), collect_at.to_string());
    assert_eq!(column(&cols, "disputed"), "true");
    let cols = fixture(OPEN_RECORD_COLUMNS_2);
    let cols = parse_columns(&cols);
    let lease = fixture_open_record().open_lease().unwrap().clone();
    assert_eq!(column(&cols, "status"), "0", "the rank of pending");
    let expires = lease.expires_at.millis().to_string();
    assert_eq!(column(&cols, "lease_expires_at"), expires);
    assert_eq!(column(&cols, "lease_generation"), "2");
    assert_eq!(column(&cols, "collect_at"), "NULL");
    assert_eq!(column(&cols, "disputed"), "false");
}

#[test]
fn format_3_fixtures_decode_to_the_expected_values() {
    let three = Some(crate::codec::FORMAT_POSTCARD_V3);
    assert_eq!(
        decode_record(three, Some(&fixture(RECORD_3))).unwrap(),
        Some(settled_record())
    );
    assert_eq!(
        decode_record(three, Some(&fixture(OPEN_RECORD_3))).unwrap(),
        Some(fixture_open_record())
    );
    assert_eq!(
        decode_warnings(three, Some(&fixture(WARNINGS_3))).unwrap(),
        fixture_warnings()
    );
}

#[test]
fn this_build_writes_the_format_3_fixtures_byte_for_byte() {
    // Format 3 in schema 2 is what this build writes. After a deliberate
    // bump, write the new fixtures (see the module docs), keep these files
    // and their decode test, and check the new files here instead.
    assert_eq!((FORMAT, SCHEMA_VERSION), (3, 2));
    let names = [
        RECORD_3,
        RECORD_COLUMNS_3,
        OPEN_RECORD_3,
        OPEN_RECORD_COLUMNS_3,
        WARNINGS_3,
        MOVES_3,
        PRINCIPAL_COLUMNS_2,
    ];
    for ((name, bytes), want) in current_fixtures().into_iter().zip(names) {
        assert_eq!(name, want);
        assert!(
            bytes == fixture(&name),
            "{name}: this build writes rows differently from the frozen format; a \
             change to a stored type is a format change (ARCHITECTURE.md)"
        );
    }
}

/// Writes the fixtures of the format and schema this build writes, once.
/// Refuses to overwrite: a released version's fixture is frozen.
#[test]
#[ignore = "writes format fixtures; run deliberately after a format or schema version bump"]
fn write_format_fixtures() {
    let dir = fixture_dir();
    let files = current_fixtures();
    // A fixture of a version that did not change (the schema's, when only
    // the record format moved) exists already with these very bytes: kept.
    let files: Vec<_> = files
        .into_iter()
        .filter(|(name, bytes)| {
            let p = dir.join(name);
            if !p.exists() {
                return true;
            }
            assert!(
                std::fs::read(&p).unwrap() == *bytes,
                "{} exists with other bytes: the fixtures of a released format version are \
                 frozen and never overwritten. A changed encoding needs a new version number \
                 (ARCHITECTURE.md).",
                p.display()
            );
            false
        })
        .collect();
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
