use proptest::prelude::*;
use settle_core::testkit::{
    FullRecord, fixture_open_record, fixture_principal, fixture_warnings, full_record,
};
use settle_core::{Key, Principal, TaskId, TenantId};

use super::*;

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

/// `r` under the key `key`, its receipts with it.
fn rekey(r: &mut Record, key: &str) {
    r.key = Key::new(key).unwrap();
    for rc in r
        .attempts
        .iter_mut()
        .filter_map(|a| a.receipt.as_mut())
        .chain(r.receipt.as_mut())
    {
        rc.key = r.key.clone();
    }
}

fn sample() -> Vec<Entity> {
    let mut open = fixture_open_record();
    rekey(&mut open, "order-2");
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
        // The records' principal (generation 3, above theirs: 2).
        Entity::Principal {
            tenant: tenant("acme"),
            principal: Principal::new("alice").unwrap(),
            state: fixture_principal(),
        },
        Entity::Principal {
            tenant: tenant("acme"),
            principal: Principal::new("bob").unwrap(),
            state: fixture_principal(),
        },
        Entity::Principal {
            tenant: tenant("beta"),
            principal: Principal::new("alice").unwrap(),
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
    let mut w = Writer::new(Vec::new(), Header::new("memory", floor, 1)).unwrap();
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
    assert_eq!(written.principals, 3);
    assert_eq!(written.warning_tasks, 1);
    assert_eq!(
        written.max_fence, 8,
        "the open record's lease holds fence 8"
    );
    assert_eq!(written.fence_floor, 12, "the higher of header and trailer");
    assert_eq!(written.bytes, bytes.len() as u64);
    assert_eq!(written.tenants.len(), 2);
    assert_eq!(written.tenants["acme"].records, 2);
    assert_eq!(written.import_floor(1_000).unwrap(), 1_012);
    assert_eq!(verify(&bytes[..]).unwrap(), written);
}

#[test]
fn results_survive_byte_for_byte() {
    let mut r = FullRecord {
        result: r#"{"b":1.50,"a":[1e2, "\u00e9"],"z":null}"#,
        ..FullRecord::default()
    }
    .build();
    rekey(&mut r, "spaced");
    let e = Entity::Record {
        tenant: tenant("acme"),
        record: r,
    };
    let (bytes, _) = write(&consistent(vec![e.clone()]), 1, 1);
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
    let mut w = Writer::new(Vec::new(), Header::new("memory", 1, 1)).unwrap();
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
    let mut h = Header::new("memory", 1, 1);
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
            rekey(&mut record, &k);
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

/// `entities` as a store could hold them: in canonical order, each once,
/// every record with fences of its own and its principal (`alice`, at
/// generation 3) present.
fn consistent(mut entities: Vec<Entity>) -> Vec<Entity> {
    let mut tenants = Vec::new();
    for (i, e) in entities.iter_mut().enumerate() {
        if let Entity::Record { tenant, record } = e {
            let shift = |f: &mut settle_core::Fence| f.0 += 100 * i as u64;
            for a in &mut record.attempts {
                shift(&mut a.lease.fence);
                if let Some(rc) = &mut a.receipt {
                    shift(&mut rc.fence);
                }
            }
            if let Some(rc) = &mut record.receipt {
                shift(&mut rc.fence);
            }
            tenants.push(tenant.clone());
        }
    }
    for t in tenants {
        entities.push(Entity::Principal {
            tenant: t,
            principal: Principal::new("alice").unwrap(),
            state: fixture_principal(),
        });
    }
    entities.sort_by(|a, b| a.order().cmp(&b.order()));
    entities.dedup_by(|a, b| a.order() == b.order());
    entities
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any set of entities, written in canonical order, reads back equal.
    #[test]
    fn write_then_read_is_the_identity(entities in prop::collection::vec(entity_strategy(), 0..40)) {
        let entities = consistent(entities);
        let (bytes, written) = write(&entities, 5, 6);
        let (back, summary) = read(&bytes).unwrap();
        prop_assert_eq!(back, entities);
        prop_assert_eq!(summary, written);
    }
}

/// `lines` (JSON texts, header first, trailer last) framed again, the
/// trailer's digest recomputed: what someone re-signing an edited file
/// makes. Every checksum holds; only what import trusts can refuse it.
fn resigned(lines: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in &lines[..lines.len() - 1] {
        out.extend(framed(l.as_bytes()));
    }
    // The digest replaced in the text: the rest stays as edited.
    let last = &lines[lines.len() - 1];
    let t: serde_json::Value = serde_json::from_str(last).unwrap();
    let old = t["sha256"].as_str().unwrap();
    let last = last.replace(old, &hex::encode(Sha256::digest(&out)));
    out.extend(framed(last.as_bytes()));
    out
}

fn json_lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| l[9..].to_string())
        .collect()
}

/// The reason and offset a damaged file is refused with.
fn refused(bytes: &[u8]) -> (u64, String) {
    match read(bytes) {
        Err(Error::Damaged { offset, reason }) => (offset, reason),
        other => panic!("read: {:?}", other.map(|o| o.1)),
    }
}

/// Where line `n` (0: the header) starts.
fn line_start(bytes: &[u8], n: usize) -> u64 {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .take(n)
        .map(|l| l.len() as u64)
        .sum()
}

#[test]
fn a_resigned_file_reads_back_unchanged() {
    // The helper itself: re-signing what the writer wrote changes nothing.
    let (bytes, _) = write(&sample(), 3, 3);
    assert_eq!(resigned(&json_lines(&bytes)), bytes);
}

#[test]
fn a_header_not_as_this_build_writes_it_is_refused() {
    let (bytes, _) = write(&sample(), 3, 3);
    let lines = json_lines(&bytes);
    let header = &lines[0];
    let cases = [
        (
            header.replace("\"engine\":\"memory\"", "\"engine\":\"whatever\""),
            "engine",
        ),
        (
            regex_lite_replace(header, "\"created_at\":\"", "not a time"),
            "created_at",
        ),
        (
            header.replace(",\"fence_floor\"", ", \"fence_floor\""),
            "canonical",
        ),
        (
            // Members in another order.
            header.replacen("{\"kind\":\"header\",", "{", 1).replacen(
                "}",
                ",\"kind\":\"header\"}",
                1,
            ),
            "canonical",
        ),
        (
            header.replace(",\"fences_per_claim_max\":1", ""),
            "fences_per_claim_max",
        ),
        (
            header.replace("\"fences_per_claim_max\":1", "\"fences_per_claim_max\":0"),
            "fences_per_claim_max",
        ),
        (
            header.replace("\"version\":2", "\"version\":0"),
            "does not exist",
        ),
    ];
    for (forged, why) in cases {
        assert_ne!(&forged, header, "the case {why} edits the header");
        let mut l = lines.clone();
        l[0] = forged;
        let (offset, reason) = refused(&resigned(&l));
        assert_eq!(offset, 0, "{reason}");
        assert!(reason.contains(why), "{why}: {reason}");
    }
}

/// `s` with the string value that follows `prefix` replaced by `value`.
fn regex_lite_replace(s: &str, prefix: &str, value: &str) -> String {
    let start = s.find(prefix).unwrap() + prefix.len();
    let end = start + s[start..].find('"').unwrap();
    format!("{}{value}{}", &s[..start], &s[end..])
}

#[test]
fn a_trailer_not_in_canonical_form_is_refused() {
    let (bytes, _) = write(&sample(), 3, 3);
    let mut lines = json_lines(&bytes);
    let n = lines.len() - 1;
    lines[n] = lines[n].replace(",\"principals\"", ", \"principals\"");
    let (offset, reason) = refused(&resigned(&lines));
    assert_eq!(offset, line_start(&bytes, n));
    assert!(reason.contains("canonical"), "{reason}");
}

#[test]
fn a_record_breaking_an_invariant_is_refused_at_its_line() {
    let mut e = sample();
    let Entity::Record { record, .. } = &mut e[1] else {
        panic!()
    };
    // A terminal status without its receipt.
    record.status = settle_core::Status::Completed;
    let (bytes, _) = write(&e, 3, 3);
    let (offset, reason) = refused(&bytes);
    assert_eq!(offset, line_start(&bytes, 2), "the second record's line");
    assert!(reason.contains("terminal-has-receipt"), "{reason}");
}

#[test]
fn a_fence_granted_twice_within_a_tenant_is_refused() {
    let mut e = sample();
    let Entity::Record { record, .. } = &mut e[1] else {
        panic!()
    };
    // The open record's lease takes a fence of the completed one (5).
    record.attempts.last_mut().unwrap().lease.fence = settle_core::Fence(5);
    let (bytes, _) = write(&e, 3, 3);
    let (offset, reason) = refused(&bytes);
    assert_eq!(offset, line_start(&bytes, 2));
    assert!(reason.contains("fence 5"), "{reason}");
    // The same fence in two tenants is not a violation (sample: beta's
    // record holds acme's first record's fences).
    let (bytes, _) = write(&sample(), 3, 3);
    read(&bytes).unwrap();
}

#[test]
fn a_principal_out_of_shape_is_refused() {
    let mut e = sample();
    let Entity::Principal { state, .. } = &mut e[4] else {
        panic!()
    };
    state.moves_len = 200;
    let (bytes, _) = write(&e, 3, 3);
    let (offset, reason) = refused(&bytes);
    assert_eq!(offset, line_start(&bytes, 5));
    assert!(reason.contains("bounded-moves"), "{reason}");
}

#[test]
fn a_record_above_its_principals_generation_is_refused() {
    // alice at generation 1: the records hold 2.
    let mut e = sample();
    let Entity::Principal { state, .. } = &mut e[3] else {
        panic!()
    };
    *state = settle_core::PrincipalState::with_moves(
        1,
        state.moved_at,
        &[settle_core::Move {
            left: 0,
            at: state.moved_at,
        }],
    );
    let (bytes, _) = write(&e, 3, 3);
    let (offset, reason) = refused(&bytes);
    assert_eq!(offset, line_start(&bytes, 4), "alice's line");
    assert!(reason.contains("generation 2"), "{reason}");
    // No line for beta's alice: generation 0, refused at beta's record.
    let mut e = sample();
    e.remove(5);
    let (bytes, _) = write(&e, 3, 3);
    let (offset, reason) = refused(&bytes);
    assert_eq!(offset, line_start(&bytes, 3), "beta's record");
    assert!(reason.contains("no line"), "{reason}");
}

#[test]
fn the_import_floor_is_bounded() {
    let (_, s) = write(&sample(), 3, 3);
    assert_eq!(s.import_floor(0).unwrap(), 9, "past fence 8");
    assert_eq!(
        s.import_floor(MAX_FENCE_MARGIN).unwrap(),
        9 + MAX_FENCE_MARGIN
    );
    let over = s.import_floor(MAX_FENCE_MARGIN + 1).unwrap_err();
    assert!(over.to_string().contains("2^50"), "{over}");
    let mut high = s.clone();
    high.fence_floor = MAX_FENCE_FLOOR;
    assert_eq!(high.import_floor(0).unwrap(), MAX_FENCE_FLOOR);
    let past = high.import_floor(1).unwrap_err();
    assert!(past.to_string().contains("2^53 - 1 - 2^32"), "{past}");
    high.fence_floor = u64::MAX;
    assert!(matches!(high.import_floor(0), Err(Error::FenceBound(_))));
    high.fence_floor = 0;
    high.max_fence = u64::MAX;
    assert!(matches!(high.import_floor(0), Err(Error::FenceBound(_))));
}

#[test]
fn the_header_says_how_many_claims_a_margin_covers() {
    let (_, s) = write(&sample(), 3, 3);
    assert_eq!(s.fences_per_claim_max, 1);
    assert_eq!(s.claims_covered(1_000), 1_000);
    let mut pg = s.clone();
    pg.fences_per_claim_max = 129;
    assert_eq!(pg.claims_covered(1_000_000_000), 7_751_937);
    // A version 1 header: what its engine did then.
    let mut h = Header::new("postgres", 1, 129);
    h.fences_per_claim_max = None;
    assert_eq!(h.fences_per_claim(), 129);
    h.engine = "embedded".into();
    assert_eq!(h.fences_per_claim(), 1);
}
