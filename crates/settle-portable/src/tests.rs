use proptest::prelude::*;
use settle_core::testkit::{
    FullRecord, fixture_open_record, fixture_principal, fixture_warnings, full_record,
};
use settle_core::{Key, Principal, TaskId, TenantId};

use super::*;

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

fn sample() -> Vec<Entity> {
    let mut open = fixture_open_record();
    open.key = Key::new("order-2").unwrap();
    vec![
        Entity::Record {
            tenant: tenant("acme"),
            record: full_record(),
        },
        Entity::Record {
            tenant: tenant("acme"),
            record: open,
        },
        Entity::Record {
            tenant: tenant("beta"),
            record: full_record(),
        },
        Entity::Principal {
            tenant: tenant("acme"),
            principal: Principal::new("bob").unwrap(),
            state: fixture_principal(),
        },
        Entity::Warnings {
            tenant: tenant("beta"),
            task: TaskId::new("nightly-export").unwrap(),
            warnings: fixture_warnings(),
        },
    ]
}

fn write(entities: &[Entity], floor: u64, end: u64) -> (Vec<u8>, Summary) {
    let mut w = Writer::new(Vec::new(), Header::new("memory", floor)).unwrap();
    for e in entities {
        w.write(e).unwrap();
    }
    w.finish(end).unwrap()
}

fn read(bytes: &[u8]) -> Result<(Vec<Entity>, Summary), Error> {
    let mut r = Reader::new(bytes)?;
    let mut out = Vec::new();
    while let Some(e) = r.next_entity()? {
        out.push(e);
    }
    Ok((out, r.summary().unwrap().clone()))
}

#[test]
fn a_file_reads_back_every_entity_and_the_writers_summary() {
    let entities = sample();
    let (bytes, written) = write(&entities, 9, 12);
    let (back, read_summary) = read(&bytes).unwrap();
    assert_eq!(back, entities);
    assert_eq!(read_summary, written);
    assert_eq!(written.records, 3);
    assert_eq!(written.principals, 1);
    assert_eq!(written.warning_tasks, 1);
    assert_eq!(
        written.max_fence, 8,
        "the open record's lease holds fence 8"
    );
    assert_eq!(written.fence_floor, 12, "the higher of header and trailer");
    assert_eq!(written.bytes, bytes.len() as u64);
    assert_eq!(written.tenants.len(), 2);
    assert_eq!(written.tenants["acme"].records, 2);
    assert_eq!(written.import_floor(1_000), 1_012);
    assert_eq!(verify(&bytes[..]).unwrap(), written);
}

#[test]
fn results_survive_byte_for_byte() {
    let mut r = FullRecord {
        result: r#"{"b":1.50,"a":[1e2, "\u00e9"],"z":null}"#,
        ..FullRecord::default()
    }
    .build();
    r.key = Key::new("spaced").unwrap();
    let e = Entity::Record {
        tenant: tenant("acme"),
        record: r,
    };
    let (bytes, _) = write(std::slice::from_ref(&e), 1, 1);
    let (back, _) = read(&bytes).unwrap();
    let Entity::Record { record, .. } = &back[0] else {
        panic!("a record")
    };
    let Entity::Record { record: sent, .. } = &e else {
        unreachable!()
    };
    let text = |r: &Record| {
        r.outcome
            .as_ref()
            .and_then(|o| o.result())
            .map(|j| j.as_str().to_string())
    };
    assert_eq!(text(record), text(sent));
    assert!(text(record).unwrap().contains("1.50"));
}

#[test]
fn same_entities_same_tenant_digests() {
    let (_, a) = write(&sample(), 1, 1);
    let (_, b) = write(&sample(), 50, 70);
    assert_eq!(
        a.tenants, b.tenants,
        "the fence counters are not part of a tenant's digest"
    );
    let mut fewer = sample();
    fewer.remove(2);
    let (_, c) = write(&fewer, 1, 1);
    assert_eq!(a.tenants["acme"], c.tenants["acme"]);
    assert_ne!(a.tenants.get("beta"), c.tenants.get("beta"));
}

#[test]
fn a_writer_refuses_entities_out_of_order_or_twice() {
    let e = sample();
    let mut w = Writer::new(Vec::new(), Header::new("memory", 1)).unwrap();
    w.write(&e[1]).unwrap();
    assert!(matches!(w.write(&e[0]), Err(Error::Write(_))));
    assert!(matches!(w.write(&e[1]), Err(Error::Write(_))));
    // A principal after a later tenant's record: sections come first.
    w.write(&e[2]).unwrap();
    w.write(&e[3]).unwrap();
}

#[test]
fn every_flipped_byte_is_refused() {
    let (bytes, _) = write(&sample(), 3, 3);
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x20;
        let got = read(&damaged);
        assert!(
            got.is_err(),
            "byte {i} flipped was read back: {:?}",
            got.map(|g| g.1)
        );
    }
}

#[test]
fn every_truncation_is_refused_with_its_offset() {
    let (bytes, _) = write(&sample(), 3, 3);
    for cut in 0..bytes.len() {
        match read(&bytes[..cut]) {
            Err(Error::Truncated { offset, .. }) => assert!(offset <= cut as u64),
            Err(Error::NotAnExport(_)) => {
                assert!(cut < bytes.iter().position(|b| *b == b'\n').unwrap() + 1)
            }
            other => panic!("cut at {cut}: {:?}", other.map(|o| o.1)),
        }
    }
}

#[test]
fn bytes_after_the_trailer_are_refused() {
    let (mut bytes, _) = write(&sample(), 3, 3);
    bytes.extend_from_slice(b"\n");
    assert!(matches!(read(&bytes), Err(Error::Damaged { .. })));
}

#[test]
fn a_newer_version_and_a_foreign_file_are_refused_by_name() {
    let mut h = Header::new("memory", 1);
    h.version = VERSION + 1;
    let json = serde_json::to_vec(&h).unwrap();
    let line = framed(&json);
    assert!(matches!(
        Reader::new(&line[..]),
        Err(Error::NewerVersion { found }) if found == VERSION + 1
    ));
    assert!(matches!(
        Reader::new(&b"hello\n"[..]),
        Err(Error::NotAnExport(_))
    ));
    assert!(matches!(Reader::new(&b""[..]), Err(Error::NotAnExport(_))));
}

#[test]
fn a_line_with_a_good_checksum_but_a_wrong_count_is_refused() {
    // Rewrite the trailer's count and its checksum: the digest still catches
    // nothing (it covers the lines before), the count check does.
    let (bytes, _) = write(&sample(), 3, 3);
    let text = String::from_utf8(bytes).unwrap();
    let (body, trailer) = text.trim_end().rsplit_once('\n').unwrap();
    let json = trailer[9..].replace("\"records\":3", "\"records\":4");
    let forged = format!(
        "{body}\n{}",
        String::from_utf8(framed(json.as_bytes())).unwrap()
    );
    let err = read(forged.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("counts 4 records"), "{err}");
}

fn entity_strategy() -> impl Strategy<Value = Entity> {
    let tenants = prop::sample::select(vec!["acme", "beta", "c-1"]);
    let names = "[a-z0-9]{1,8}";
    prop_oneof![
        (tenants.clone(), names, 0..3u8, "[a-z ]{0,12}").prop_map(|(t, k, kind, text)| {
            let mut record = if kind == 0 {
                fixture_open_record()
            } else {
                let result: &'static str =
                    Box::leak(serde_json::to_string(&text).unwrap().into_boxed_str());
                FullRecord {
                    result,
                    ..FullRecord::default()
                }
                .build()
            };
            record.key = Key::new(&k).unwrap();
            Entity::Record {
                tenant: tenant(t),
                record,
            }
        }),
        (tenants.clone(), names).prop_map(|(t, p)| Entity::Principal {
            tenant: tenant(t),
            principal: Principal::new(&p).unwrap(),
            state: fixture_principal(),
        }),
        (tenants, names).prop_map(|(t, task)| Entity::Warnings {
            tenant: tenant(t),
            task: TaskId::new(&task).unwrap(),
            warnings: fixture_warnings(),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any set of entities, written in canonical order, reads back equal.
    #[test]
    fn write_then_read_is_the_identity(mut entities in prop::collection::vec(entity_strategy(), 0..40)) {
        entities.sort_by(|a, b| a.order().cmp(&b.order()));
        entities.dedup_by(|a, b| a.order() == b.order());
        let (bytes, written) = write(&entities, 5, 6);
        let (back, summary) = read(&bytes).unwrap();
        prop_assert_eq!(back, entities);
        prop_assert_eq!(summary, written);
    }
}
