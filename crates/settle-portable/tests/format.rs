//! The frozen export format: `tests/fixtures/export-v<N>.settle` was written
//! once by the build that introduced version N. Every later build must read
//! each to the entities built here, and while a version is the one written,
//! write the same bytes (a changed stored type changes the format: a new
//! version, docs/export-format.md).
//!
//! `cargo test -p settle-portable --test format write_fixture -- --ignored`
//! writes the current version's when it does not exist.

use std::path::PathBuf;

use settle_core::testkit::{
    fixture_open_record, fixture_principal, fixture_warnings, full_record, without_claim_ids,
};
use settle_core::{Principal, TaskId, TenantId};
use settle_portable::{Entity, Header, Reader, VERSION, Writer};

const FIXTURE_V1: &str = "export-v1.settle";
const FIXTURE_V2: &str = "export-v2.settle";

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn entities() -> Vec<Entity> {
    entities_of(full_record())
}

/// [`entities`] as a version 1 file holds them: leases without `claim_id`.
fn entities_v1() -> Vec<Entity> {
    entities_of(without_claim_ids(full_record()))
}

fn entities_of(full: settle_core::Record) -> Vec<Entity> {
    let acme = TenantId::new("acme").unwrap();
    vec![
        Entity::Record {
            tenant: acme.clone(),
            record: full,
        },
        Entity::Record {
            tenant: acme.clone(),
            record: fixture_open_record(),
        },
        // The records' principal: a file holds no record above its
        // principal's generation (SPEC §12, what import trusts).
        Entity::Principal {
            tenant: acme.clone(),
            principal: Principal::new("alice").unwrap(),
            state: fixture_principal(),
        },
        Entity::Principal {
            tenant: acme.clone(),
            principal: Principal::new("bob").unwrap(),
            state: fixture_principal(),
        },
        Entity::Warnings {
            tenant: acme,
            task: TaskId::new("nightly-export").unwrap(),
            warnings: fixture_warnings(),
        },
    ]
}

fn written() -> Vec<u8> {
    let mut header = Header::new("embedded", 9, 1);
    header.created_at = "2025-11-30T00:00:03.000Z".into();
    let mut w = Writer::new(Vec::new(), header).unwrap();
    for e in entities() {
        w.write(&e).unwrap();
    }
    w.finish(11).unwrap().0
}

fn read_back(name: &str) -> (u32, Vec<Entity>, settle_portable::Summary) {
    let bytes = std::fs::read(path(name)).unwrap();
    let mut r = Reader::new(&bytes[..]).unwrap();
    let version = r.header().version;
    let mut got = Vec::new();
    while let Some(e) = r.next_entity().unwrap() {
        got.push(e);
    }
    (version, got, r.summary().unwrap().clone())
}

#[test]
fn the_v1_fixture_reads_back_to_the_expected_entities() {
    let (version, got, s) = read_back(FIXTURE_V1);
    assert_eq!(version, 1);
    assert_eq!(got, entities_v1());
    assert_eq!((s.records, s.principals, s.warning_tasks), (2, 2, 1));
    assert_eq!(s.fence_floor, 11);
}

#[test]
fn the_v2_fixture_reads_back_to_the_expected_entities() {
    let (version, got, s) = read_back(FIXTURE_V2);
    assert_eq!(version, 2);
    assert_eq!(got, entities());
    assert_ne!(entities(), entities_v1(), "version 2 carries a claim_id");
    assert_eq!((s.records, s.principals, s.warning_tasks), (2, 2, 1));
    assert_eq!(s.fence_floor, 11);
}

/// A version 1 line that carries a `claim_id` is not a version 1 line.
#[test]
fn a_v1_file_with_a_claim_id_is_not_in_canonical_form() {
    let bytes = std::fs::read(path(FIXTURE_V2)).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    // Only the header's version differs (and version 1 has no
    // fences_per_claim_max): the file then fails its line
    // checksum first; rebuild it as a version 1 writer would frame it.
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header = lines[0]
        .split_once(' ')
        .unwrap()
        .1
        .replace("\"version\":2", "\"version\":1")
        .replace(",\"fences_per_claim_max\":1", "");
    lines[0] = format!("{:08x} {header}", crc32fast::hash(header.as_bytes()));
    let file = lines.join("\n") + "\n";
    let mut r = Reader::new(file.as_bytes()).unwrap();
    let err = loop {
        match r.next_entity() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a v1 file with a claim_id was read"),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("canonical form"), "{err}");
}

#[test]
fn this_build_writes_the_v2_fixture_byte_for_byte() {
    assert_eq!(VERSION, 2, "a new version gets a fixture of its own");
    assert!(
        written() == std::fs::read(path(FIXTURE_V2)).unwrap(),
        "this build writes the export format differently from the frozen version 2; a \
         change to a stored type is a format change (docs/export-format.md)"
    );
}

#[test]
#[ignore = "writes the format fixture; run deliberately for a new format version"]
fn write_fixture() {
    let p = path(&format!("export-v{VERSION}.settle"));
    assert!(
        !p.exists(),
        "{} exists: a released version's fixture is frozen",
        p.display()
    );
    std::fs::write(&p, written()).unwrap();
}
