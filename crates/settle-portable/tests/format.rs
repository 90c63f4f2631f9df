//! The frozen export format: `tests/fixtures/export-v1.settle` was written
//! once by the build that introduced version 1. Every later build must read
//! it to the entities built here, and while version 1 is the one written,
//! write the same bytes (a changed stored type changes the format: a new
//! version, docs/export-format.md).
//!
//! `cargo test -p settle-portable --test format write_fixture -- --ignored`
//! writes it when it does not exist.

use std::path::PathBuf;

use settle_core::testkit::{fixture_open_record, fixture_principal, fixture_warnings, full_record};
use settle_core::{Principal, TaskId, TenantId};
use settle_portable::{Entity, Header, Reader, VERSION, Writer};

const FIXTURE: &str = "export-v1.settle";

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE)
}

fn entities() -> Vec<Entity> {
    let acme = TenantId::new("acme").unwrap();
    vec![
        Entity::Record {
            tenant: acme.clone(),
            record: full_record(),
        },
        Entity::Record {
            tenant: acme.clone(),
            record: fixture_open_record(),
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
    let mut header = Header::new("embedded", 9);
    header.created_at = "2025-11-30T00:00:03.000Z".into();
    let mut w = Writer::new(Vec::new(), header).unwrap();
    for e in entities() {
        w.write(&e).unwrap();
    }
    w.finish(11).unwrap().0
}

#[test]
fn the_v1_fixture_reads_back_to_the_expected_entities() {
    let bytes = std::fs::read(path()).unwrap();
    let mut r = Reader::new(&bytes[..]).unwrap();
    assert_eq!(r.header().version, 1);
    let mut got = Vec::new();
    while let Some(e) = r.next_entity().unwrap() {
        got.push(e);
    }
    assert_eq!(got, entities());
    let s = r.summary().unwrap();
    assert_eq!((s.records, s.principals, s.warning_tasks), (2, 1, 1));
    assert_eq!(s.fence_floor, 11);
}

#[test]
fn this_build_writes_the_v1_fixture_byte_for_byte() {
    assert_eq!(VERSION, 1, "a new version gets a fixture of its own");
    assert!(
        written() == std::fs::read(path()).unwrap(),
        "this build writes the export format differently from the frozen version 1; a \
         change to a stored type is a format change (docs/export-format.md)"
    );
}

#[test]
#[ignore = "writes the format fixture; run deliberately for a new format version"]
fn write_fixture() {
    let p = path();
    assert!(
        !p.exists(),
        "{} exists: a released version's fixture is frozen",
        p.display()
    );
    std::fs::write(&p, written()).unwrap();
}
