//! What the core shows other crates besides the rules: wire names, labels,
//! conversions and the small helpers of its types. The server, the stores
//! and the CLI print and store these, so each is pinned here exactly.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use settle_core::*;

/// The serde name of a unit variant, as the wire and the stores spell it.
fn wire<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .expect("a unit variant serializes as a string")
        .to_owned()
}

#[test]
fn every_refusal_code_is_its_wire_name_and_leads_its_message() {
    let mut seen = std::collections::HashSet::new();
    for c in RefusalCode::ALL {
        assert_eq!(c.code(), wire(c));
        assert!(
            c.to_string().starts_with(&format!("{}: ", c.code())),
            "{c:?}: {c}"
        );
        assert!(seen.insert(c.code()), "{c:?} repeats a code");
    }
    assert_eq!(RefusalCode::StaleFence.code(), "stale_fence");
}

#[test]
fn statuses_have_their_wire_names_ranks_and_terminality() {
    use Status::*;
    let table = [
        (Pending, 0, false),
        (Unknown, 1, false),
        (Conflict, 2, false),
        (Failed, 3, true),
        (Completed, 4, true),
    ];
    for (s, rank, terminal) in table {
        assert_eq!(s.as_str(), wire(s));
        assert_eq!(s.rank(), rank, "{s:?}");
        assert_eq!(s.is_terminal(), terminal, "{s:?}");
        for (o, orank, _) in table {
            let joined = s.merge(o);
            assert_eq!(joined.rank(), rank.max(orank), "{s:?} ⊔ {o:?}");
        }
    }
}

#[test]
fn outcome_statuses_map_onto_the_lattice() {
    assert_eq!(OutcomeStatus::Completed.status(), Status::Completed);
    assert_eq!(OutcomeStatus::Failed.status(), Status::Failed);
    assert_eq!(OutcomeStatus::Unknown.status(), Status::Unknown);
    assert!(OutcomeStatus::Completed.is_terminal());
    assert!(OutcomeStatus::Failed.is_terminal());
    assert!(!OutcomeStatus::Unknown.is_terminal());
}

#[test]
fn only_expiry_and_revocation_are_lapses() {
    use LeaseEnd::*;
    for (end, lapsed) in [
        (Expired, true),
        (Revoked, true),
        (Settled, false),
        (Refused, false),
        (Released, false),
        (Unavailable, false),
        (NotCommitted, false),
    ] {
        assert_eq!(end.lapsed(), lapsed, "{end:?}");
    }
}

#[test]
fn a_lease_may_have_dispatched_unless_it_promised_to_mark_and_did_not() {
    let mut h = H::new();
    let f = h.exec(claim_with("a", 1, binding("alice", 0), 1000, true));
    let mut l = h.rec("a").lease().unwrap().clone();
    assert_eq!(l.fence, f);
    assert!(l.is_open());
    for (marks, dispatched, may) in [
        (false, false, true),
        (false, true, true),
        (true, false, false),
        (true, true, true),
    ] {
        l.marks_dispatch = marks;
        l.dispatched = dispatched;
        assert_eq!(
            l.may_have_dispatched(),
            may,
            "marks {marks} dispatched {dispatched}"
        );
    }
}

#[test]
fn release_reasons_have_their_wire_names() {
    for r in [ReleaseReason::NotDispatched, ReleaseReason::NotCommitted] {
        assert_eq!(r.as_str(), wire(r));
    }
    assert_eq!(ReleaseReason::default(), ReleaseReason::NotDispatched);
}

/// One command of every kind, with the name, fence and binding principal it must report.
fn every_command() -> Vec<(Command, &'static str, Option<u64>, Option<&'static str>)> {
    let warn = Command::Warn(Warn {
        task: TaskId::new("t").unwrap(),
        class: WarningClass::new("c").unwrap(),
        detail: None,
    });
    vec![
        (
            claim("k", 1, binding("alice", 0)),
            "claim",
            None,
            Some("alice"),
        ),
        (heartbeat("k", Fence(2), None), "heartbeat", Some(2), None),
        (dispatch("k", Fence(3)), "dispatch", Some(3), None),
        (
            settle("k", Fence(4), 1, binding("bob", 0), completed(1)),
            "settle",
            Some(4),
            Some("bob"),
        ),
        (release("k", Fence(5)), "release", Some(5), None),
        (
            reconcile(
                "k",
                Fence(6),
                committed(1, binding("carol", 0), completed(1)),
            ),
            "reconcile",
            Some(6),
            Some("carol"),
        ),
        (
            reconcile("k", Fence(7), Finding::Unavailable),
            "reconcile",
            Some(7),
            None,
        ),
        (revoke("dave"), "revoke", None, Some("dave")),
        (warn, "warn", None, None),
        (Command::Expire { key: key("k") }, "expire", None, None),
        (Command::Collect { key: key("k") }, "collect", None, None),
    ]
}

#[test]
fn commands_name_their_call_fence_principal_and_target() {
    for (cmd, name, fence, principal) in every_command() {
        assert_eq!(cmd.name(), name);
        assert_eq!(cmd.fence(), fence.map(Fence), "{name}");
        assert_eq!(
            cmd.binding_principal().map(|p| p.as_str()),
            principal,
            "{name}"
        );
        match (name, cmd.target()) {
            ("revoke", Target::Principal(p)) => assert_eq!(p.as_str(), "dave"),
            ("warn", Target::Task(t)) => assert_eq!(t.as_str(), "t"),
            ("revoke" | "warn", t) => panic!("{name} targets {t:?}"),
            (_, Target::Record(k)) => assert_eq!(k.as_str(), "k"),
            (_, t) => panic!("{name} targets {t:?}"),
        }
    }
}

#[test]
fn only_settle_and_committed_findings_carry_an_outcome() {
    for (cmd, name, _, _) in every_command() {
        let carries = matches!(
            &cmd,
            Command::Settle(_)
                | Command::Reconcile(Reconcile {
                    finding: Finding::Committed(_),
                    ..
                })
        );
        assert_eq!(cmd.outcome().is_some(), carries, "{name}");
    }
    let s = settle("k", Fence(4), 1, binding("bob", 0), failed(3));
    assert_eq!(s.outcome(), Some(&failed(3)));
}

#[test]
fn claim_decisions_are_named_as_their_wire_tag() {
    let g = Grant {
        fence: Fence(1),
        lease_expires_at: Timestamp(5),
        attempt: 1,
    };
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    let decisions = [
        (ClaimDecision::Execute(g), Some(g)),
        (ClaimDecision::Reconcile(g), Some(g)),
        (
            ClaimDecision::InFlight {
                retry_after_ms: 10,
                lease_expires_at: Timestamp(5),
            },
            None,
        ),
        (
            ClaimDecision::Replay {
                outcome: completed(1),
                receipt: rc,
            },
            None,
        ),
    ];
    for (d, grant) in decisions {
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["decision"], d.name());
        assert_eq!(d.grant(), grant.as_ref(), "{}", d.name());
    }
}

#[test]
fn replies_are_labelled_for_metrics() {
    let info = LeaseInfo {
        fence: Fence(1),
        lease_expires_at: Timestamp(2),
    };
    let mut h = H::new();
    let f = h.exec(claim("a", 1, binding("alice", 0)));
    let rc = receipt(h.run(settle("a", f, 1, binding("alice", 0), completed(1))));
    let w = match h.run(Command::Warn(Warn {
        task: TaskId::new("t").unwrap(),
        class: WarningClass::new("c").unwrap(),
        detail: None,
    })) {
        Reply::Warning(w) => w,
        other => panic!("{other:?}"),
    };
    let table = [
        (
            Reply::Claim(ClaimDecision::InFlight {
                retry_after_ms: 10,
                lease_expires_at: Timestamp(5),
            }),
            "in_flight",
        ),
        (Reply::Heartbeat(info), "heartbeat"),
        (Reply::Dispatched(info), "dispatched"),
        (Reply::Receipt(rc), "receipt"),
        (Reply::Released { fence: Fence(1) }, "released"),
        (
            Reply::Revoked {
                principal: Principal::new("p").unwrap(),
                generation: 1,
            },
            "revoked",
        ),
        (Reply::Warning(w), "warning"),
        (Reply::Expired { ended: true }, "expired"),
        (Reply::Collected { removed: false }, "collected"),
        (Reply::Refused(RefusalCode::WrongPurpose), "wrong_purpose"),
        (
            Reply::Invalid(InvalidInput::new("fence", "x")),
            "invalid_request",
        ),
    ];
    for (reply, label) in table {
        assert_eq!(reply.label(), label, "{reply:?}");
    }
}

#[test]
fn only_refused_evidence_of_settle_and_reconcile_counts_as_quarantined() {
    let s = settle("k", Fence(4), 1, binding("bob", 0), completed(1));
    let r = reconcile("k", Fence(6), Finding::NotCommitted);
    let hb = heartbeat("k", Fence(2), None);
    for code in RefusalCode::ALL {
        let kept = !matches!(code, RefusalCode::NotFound | RefusalCode::RecordRefused);
        assert_eq!(Reply::Refused(code).quarantined(&s), kept, "{code:?}");
        assert_eq!(Reply::Refused(code).quarantined(&r), kept, "{code:?}");
        assert!(!Reply::Refused(code).quarantined(&hb), "{code:?}");
    }
    assert!(!Reply::Released { fence: Fence(6) }.quarantined(&r));
}

#[test]
fn token_types_convert_display_and_debug_as_their_text() {
    let k = Key::try_from("order-1").unwrap();
    assert_eq!(Key::try_from(String::from("order-1")).unwrap(), k);
    assert_eq!(k.to_string(), "order-1");
    assert_eq!(format!("{k:?}"), "\"order-1\"");
    assert_eq!(AsRef::<str>::as_ref(&k), "order-1");
    assert_eq!(String::from(k.clone()), "order-1");
    assert_eq!(serde_json::to_string(&k).unwrap(), "\"order-1\"");
    assert!(serde_json::from_str::<Key>("\"a b\"").is_err());
    assert_eq!(TenantId::default_tenant().as_str(), "default");
    let e = TaskId::new("").unwrap_err();
    assert_eq!(e.field, "task");
    assert_eq!(e.to_string(), "task: must not be empty");
    assert_eq!(WarningClass::new(" ").unwrap_err().field, "class");
    assert_eq!(Principal::new("").unwrap_err().field, "principal");
    assert_eq!(Scope::new("").unwrap_err().field, "scope");
    assert_eq!(TenantId::new("").unwrap_err().field, "tenant");
    // The edges of visible ASCII.
    assert!(Key::new("!~").is_ok());
    assert!(Key::new("\u{7f}").is_err());
}

#[test]
fn digests_are_hex_for_people_and_bytes_for_stores() {
    let d = Digest([0xab; 32]);
    assert_eq!(d.to_string(), "ab".repeat(32));
    assert_eq!(format!("{d:?}"), format!("Digest({})", "ab".repeat(32)));
    let stored = postcard::to_allocvec(&d).unwrap();
    assert_eq!(stored.len(), 33, "a length byte and the 32 bytes");
    assert_eq!(postcard::from_bytes::<Digest>(&stored).unwrap(), d);
    let short = postcard::to_allocvec(&serde_bytes_of(&[1u8; 31])).unwrap();
    assert!(postcard::from_bytes::<Digest>(&short).is_err());
    let e = Digest::parse("fingerprint", &"0".repeat(65)).unwrap_err();
    assert!(e.reason.contains("65 characters"), "{e}");
    assert!(Digest::parse("fingerprint", &"f".repeat(64)).is_ok());
    assert!(Digest::parse("fingerprint", &"9".repeat(64)).is_ok());
    // A value of the wrong type says what a digest is.
    let e = serde_json::from_str::<Digest>("5").unwrap_err().to_string();
    assert!(
        e.contains("expected a SHA-256 digest as 64 lowercase hex characters"),
        "{e}"
    );
}

/// A byte string as a serializer sees one (what `Digest` writes to a store).
fn serde_bytes_of(b: &[u8]) -> impl serde::Serialize + '_ {
    struct Bytes<'a>(&'a [u8]);
    impl serde::Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    Bytes(b)
}

#[test]
fn scopes_serialize_sorted_and_debug_as_a_list() {
    let s = Scopes::from_strs(["b", "a"]).unwrap();
    assert_eq!(serde_json::to_string(&s).unwrap(), r#"["a","b"]"#);
    assert_eq!(format!("{s:?}"), r#"["a", "b"]"#);
    let back: Scopes = serde_json::from_str(r#"["b","a","a"]"#).unwrap();
    assert_eq!(back, s);
    assert!(serde_json::from_str::<Scopes>(r#"["a b"]"#).is_err());
    let exactly: Vec<String> = (0..64).map(|i| format!("s{i}")).collect();
    assert_eq!(Scopes::from_strs(exactly).unwrap().as_slice().len(), 64);
}

#[test]
fn labels_are_non_empty_bounded_text_without_control_characters() {
    let t = Text::new("worker", "w-1 é").unwrap();
    assert_eq!(t.as_str(), "w-1 é");
    assert_eq!(t.to_string(), "w-1 é");
    assert_eq!(format!("{t:?}"), "\"w-1 é\"");
    assert_eq!(String::from(t), "w-1 é");
    assert_eq!(Text::new("worker", "").unwrap_err().field, "worker");
    assert!(Text::new("worker", "a\nb").is_err());
    assert!(Text::new("worker", "x".repeat(Text::MAX_BYTES)).is_ok());
    let e = Text::new("worker", "x".repeat(Text::MAX_BYTES + 1)).unwrap_err();
    assert!(e.reason.contains("4097"), "{e}");
    assert!(serde_json::from_str::<Text>("\"\"").is_err());
    assert_eq!(
        serde_json::from_str::<Text>("\"ok\"").unwrap().as_str(),
        "ok"
    );
}

#[test]
fn error_texts_are_any_text_up_to_the_limit() {
    let e = ErrorText::new("outcome.error", "").unwrap();
    assert_eq!(e.as_str(), "");
    let e = ErrorText::try_from(String::from("line 1\nline 2")).unwrap();
    assert_eq!(e.to_string(), "line 1\nline 2");
    assert_eq!(format!("{e:?}"), "\"line 1\\nline 2\"");
    assert_eq!(String::from(e), "line 1\nline 2");
    assert!(ErrorText::new("outcome.error", "x".repeat(ErrorText::MAX_BYTES)).is_ok());
    let too_long = ErrorText::try_from("x".repeat(ErrorText::MAX_BYTES + 1)).unwrap_err();
    assert_eq!(too_long.field, "outcome.error");
}

#[test]
fn lease_and_retention_lengths_convert_and_default_to_the_spec() {
    assert_eq!(LeaseMs::default().get(), 30_000);
    assert_eq!(u64::from(LeaseMs::new(250).unwrap()), 250);
    assert_eq!(LeaseMs::try_from(3_600_000).unwrap().get(), 3_600_000);
    assert_eq!(
        serde_json::to_string(&LeaseMs::new(100).unwrap()).unwrap(),
        "100"
    );
    assert_eq!(RetentionS::default().get(), 86_400);
    assert_eq!(u64::from(RetentionS::new(1).unwrap()), 1);
    assert_eq!(RetentionS::try_from(7).unwrap().get(), 7);
    assert!(RetentionS::try_from(0).is_err());
    assert_eq!(serde_json::from_str::<RetentionS>("9").unwrap().get(), 9);
    assert_eq!(RetentionS::new(0).unwrap_err().field, "retention_s");
    assert_eq!(LeaseMs::new(0).unwrap_err().field, "lease_ms");
}

#[test]
fn results_keep_their_text_and_measure_it() {
    let r = ResultJson::from_text(" [1 ,\t{\"a b\" : \"x \\\" y\"}]\n", 1024).unwrap();
    assert_eq!(r.as_str(), r#"[1,{"a b":"x \" y"}]"#);
    assert_eq!(r.len(), r.as_str().len());
    assert!(!r.is_empty());
    assert_eq!(r.to_value(), serde_json::json!([1, {"a b": "x \" y"}]));
    assert_eq!(format!("{r:?}"), format!("ResultJson({})", r.as_str()));
    assert!(r.check_size(r.len()).is_ok());
    let e = r.check_size(r.len() - 1).unwrap_err();
    assert_eq!(e.field, "outcome.result");
    assert!(ResultJson::from_text("[1", 1024).is_err());
    assert!(ResultJson::from_text("[1]", 2).is_err());
    // Stored as text (not as a JSON value) and checked again when read.
    let stored = postcard::to_allocvec(&r).unwrap();
    assert_eq!(postcard::from_bytes::<ResultJson>(&stored).unwrap(), r);
    let not_json = postcard::to_allocvec("[1").unwrap();
    assert!(postcard::from_bytes::<ResultJson>(&not_json).is_err());
}

#[test]
fn results_may_nest_exactly_to_the_limit() {
    let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let mixed = |n: usize| format!("{}0{}", "{\"a\":".repeat(n), "}".repeat(n));
    for text in [nest(MAX_RESULT_DEPTH), mixed(MAX_RESULT_DEPTH)] {
        assert!(ResultJson::from_text(&text, 1 << 20).is_ok());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(ResultJson::from_value(&v, 1 << 20).is_ok());
    }
    for text in [nest(MAX_RESULT_DEPTH + 1), mixed(MAX_RESULT_DEPTH + 1)] {
        assert!(ResultJson::from_text(&text, 1 << 20).is_err());
        let mut v = serde_json::json!(0);
        for _ in 0..=MAX_RESULT_DEPTH {
            v = if text.starts_with('[') {
                serde_json::json!([v])
            } else {
                serde_json::json!({ "a": v })
            };
        }
        let e = ResultJson::from_value(&v, 1 << 20).unwrap_err();
        assert!(e.reason.contains("deeper than 64"), "{e}");
    }
    // Siblings do not nest: a hundred arrays side by side are two levels.
    let siblings = format!("[{}]", vec!["[]"; 100].join(","));
    assert!(ResultJson::from_text(&siblings, 1 << 20).is_ok());
    let v: serde_json::Value = serde_json::from_str(&siblings).unwrap();
    assert!(ResultJson::from_value(&v, 1 << 20).is_ok());
    // Brackets inside strings do not nest.
    let in_string = format!("[\"{}\"]", "[".repeat(100));
    assert!(ResultJson::from_text(&in_string, 1 << 20).is_ok());
}

#[test]
fn timestamps_saturate_and_convert() {
    let t = Timestamp::from_millis(1_000);
    assert_eq!(t.millis(), 1_000);
    assert_eq!(t.plus_ms(500), Timestamp(1_500));
    assert_eq!(Timestamp(u64::MAX - 1).plus_ms(5), Timestamp(u64::MAX));
    assert_eq!(t.ms_since(Timestamp(400)), 600);
    assert_eq!(Timestamp(400).ms_since(t), 0);
    assert_eq!(
        t.to_system_time(),
        UNIX_EPOCH + Duration::from_millis(1_000)
    );
    assert_eq!(
        Timestamp::from_system_time(UNIX_EPOCH + Duration::from_micros(2_500_999)),
        Timestamp(2_500)
    );
    assert_eq!(
        Timestamp::from_system_time(UNIX_EPOCH - Duration::from_secs(1)),
        Timestamp(0)
    );
    assert_eq!(format!("{:?}", Timestamp(0)), "1970-01-01T00:00:00.000Z");
}

#[test]
fn fences_convert_and_display_as_their_number() {
    assert_eq!(Fence::from(7), Fence(7));
    assert_eq!(u64::from(Fence(7)), 7);
    assert_eq!(Fence(7).to_string(), "7");
    assert_eq!(serde_json::to_string(&Fence(7)).unwrap(), "7");
}

#[test]
fn a_present_null_result_is_a_result_and_an_absent_one_is_none() {
    let digest = "ab".repeat(32);
    let json = format!(r#"{{"status":"completed","result":null,"response_sha256":"{digest}"}}"#);
    let o: Outcome = serde_json::from_str(&json).unwrap();
    assert_eq!(o.result().map(|r| r.as_str()), Some("null"));
    assert_eq!(o.response_sha256(), Some(Digest([0xab; 32])));
    let o: Outcome = serde_json::from_str(r#"{"status":"unknown","error":"timeout"}"#).unwrap();
    assert_eq!(o.result(), None);
    assert_eq!(o.error().map(|e| e.as_str()), Some("timeout"));
    // Stored outcomes carry the option itself, both ways.
    for o in [completed(1), unknown()] {
        let stored = postcard::to_allocvec(&o).unwrap();
        assert_eq!(postcard::from_bytes::<Outcome>(&stored).unwrap(), o);
    }
}
