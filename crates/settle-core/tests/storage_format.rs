//! The binary storage encoding (postcard) of the core's stored types,
//! pinned byte for byte. Engines store these values as they serialize, so
//! a change here is a change of the on-disk format (a version bump and a
//! migration), never a side effect of a refactor or of a renamed field.
//!
//! `SETTLE_BLESS=1 cargo test -p settle-core --test storage_format`
//! rewrites `testdata/postcard.txt` (only for a deliberate format change).

use std::collections::BTreeMap;
use std::path::PathBuf;

use settle_core::*;

fn d(n: u8) -> Digest {
    Digest([n; 32])
}

fn t(ms: u64) -> Timestamp {
    Timestamp(1_700_000_000_000 + ms)
}

fn binding() -> Binding {
    Binding {
        principal: Principal::new("svc-billing").unwrap(),
        scopes: Scopes::from_strs(["refund", "charge"]).unwrap(),
        generation: 3,
    }
}

fn lease(fence: u64, ended: Option<Ended>) -> Lease {
    Lease {
        fence: Fence(fence),
        purpose: Purpose::Execute,
        generation: 3,
        granted_at: t(0),
        expires_at: t(30_000),
        lease_ms: LeaseMs::new(30_000).unwrap(),
        marks_dispatch: true,
        dispatched: true,
        worker: Some(Text::new("worker", "w-7").unwrap()),
        ended,
    }
}

fn receipt(fence: u64, status: Status) -> Receipt {
    Receipt {
        key: Key::new("order-1").unwrap(),
        fingerprint: d(1),
        response_sha256: Some(d(2)),
        status,
        fence: Fence(fence),
        committed_at: t(500),
        durable: true,
    }
}

fn result() -> ResultJson {
    ResultJson::from_text(r#"{"charge":"ch_1","amount":1.50}"#, 1024).unwrap()
}

/// A record with every part filled: two attempts (one `unknown` with an
/// error, one settled), observations, a quarantine entry, a canonical
/// outcome and receipt, a dispute.
fn record() -> Record {
    let unknown = Attempt {
        number: 1,
        lease: lease(
            7,
            Some(Ended {
                reason: LeaseEnd::Settled,
                at: t(100),
            }),
        ),
        receipt: Some(receipt(7, Status::Unknown)),
        error: Some(ErrorText::new("outcome.error", "reset\nafter 30 s").unwrap()),
        observations: vec![Observation {
            at: t(100),
            call: Call::Settle,
            status: Some(OutcomeStatus::Unknown),
            finding: None,
            response_sha256: None,
            accepted: true,
            code: None,
        }],
        observations_total: 1,
    };
    let settled = Attempt {
        number: 2,
        lease: Lease {
            purpose: Purpose::Reconcile,
            ..lease(
                9,
                Some(Ended {
                    reason: LeaseEnd::Settled,
                    at: t(500),
                }),
            )
        },
        receipt: Some(receipt(9, Status::Completed)),
        error: None,
        observations: vec![
            Observation {
                at: t(400),
                call: Call::Reconcile,
                status: Some(OutcomeStatus::Completed),
                finding: Some(FindingKind::Committed),
                response_sha256: Some(d(2)),
                accepted: true,
                code: None,
            },
            Observation {
                at: t(450),
                call: Call::Settle,
                status: Some(OutcomeStatus::Failed),
                finding: None,
                response_sha256: Some(d(4)),
                accepted: false,
                code: Some(RefusalCode::ResultMismatch),
            },
        ],
        observations_total: 40,
    };
    Record {
        key: Key::new("order-1").unwrap(),
        reservation: Reservation {
            fingerprint: d(1),
            principal: Principal::new("svc-billing").unwrap(),
            scopes: Scopes::from_strs(["charge", "refund"]).unwrap(),
            generation: 3,
        },
        status: Status::Completed,
        outcome: Some(Outcome::completed(result(), d(2))),
        receipt: Some(receipt(9, Status::Completed)),
        reconcile_required: false,
        disputed: true,
        attempts: vec![unknown, settled],
        attempts_total: 2,
        quarantine: vec![QuarantineEntry {
            at: t(450),
            fence: Fence(9),
            reason: RefusalCode::ResultMismatch,
            call: Call::Settle,
            status: Some(OutcomeStatus::Failed),
            finding: None,
            fingerprint: Some(d(1)),
            binding: Some(binding()),
            response_sha256: Some(d(4)),
        }],
        quarantine_total: 1,
        retention_s: RetentionS::new(86_400).unwrap(),
        created_at: t(0),
        updated_at: t(500),
        settled_at: Some(t(500)),
    }
}

fn values() -> Vec<(&'static str, Vec<u8>)> {
    let enc = |v: &dyn erased::Enc| v.enc();
    vec![
        ("digest", enc(&d(0xab))),
        ("timestamp", enc(&t(123))),
        ("fence", enc(&Fence(1 << 40))),
        ("lease_ms", enc(&LeaseMs::new(30_000).unwrap())),
        ("result_json", enc(&result())),
        ("binding", enc(&binding())),
        (
            "outcome_completed",
            enc(&Outcome::completed(result(), d(2))),
        ),
        (
            "outcome_failed_null",
            enc(&Outcome::failed(
                ResultJson::from_text("null", 16).unwrap(),
                d(3),
                Some(ErrorText::new("outcome.error", "declined").unwrap()),
            )),
        ),
        ("outcome_unknown", enc(&Outcome::unknown(None))),
        ("receipt", enc(&receipt(9, Status::Completed))),
        ("record", enc(&record())),
        (
            "warning",
            enc(&Warning {
                task: TaskId::new("nightly").unwrap(),
                class: WarningClass::new("slow-upstream").unwrap(),
                count: 1000,
                detail: Some(Text::new("detail", "took 40 s").unwrap()),
                first_at: t(0),
                last_at: t(9_000),
                saturated: true,
            }),
        ),
        (
            "warning_no_detail",
            enc(&Warning {
                task: TaskId::new("nightly").unwrap(),
                class: WarningClass::new("c").unwrap(),
                count: 1,
                detail: None,
                first_at: t(0),
                last_at: t(0),
                saturated: false,
            }),
        ),
        (
            "principal_state",
            enc(&PrincipalState::at(0, t(0))
                .moved(4, t(10))
                .moved(5, t(20))
                .moved(1 << 53, t(30))),
        ),
    ]
}

mod erased {
    pub trait Enc {
        fn enc(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Enc for T {
        fn enc(&self) -> Vec<u8> {
            postcard::to_allocvec(self).unwrap()
        }
    }
}

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/postcard.txt")
}

#[test]
fn stored_types_keep_their_postcard_bytes() {
    let actual: BTreeMap<&str, String> = values()
        .into_iter()
        .map(|(n, b)| (n, hex::encode(b)))
        .collect();
    if std::env::var_os("SETTLE_BLESS").is_some() {
        let text: String = actual.iter().map(|(n, h)| format!("{n} {h}\n")).collect();
        std::fs::write(path(), text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(path()).unwrap();
    let expected: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        actual.keys().collect::<Vec<_>>()
    );
    for (name, hex) in &actual {
        assert_eq!(expected[name], hex, "{name}: the storage encoding changed");
    }
}

#[test]
fn stored_bytes_decode_to_the_same_values() {
    let text = std::fs::read_to_string(path()).unwrap();
    let bytes = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap();
        hex::decode(line.split_once(' ').unwrap().1).unwrap()
    };
    let rec: Record = postcard::from_bytes(&bytes("record")).unwrap();
    assert_eq!(rec, record());
    let r: ResultJson = postcard::from_bytes(&bytes("result_json")).unwrap();
    assert_eq!(r.as_str(), r#"{"charge":"ch_1","amount":1.50}"#);
    let dg: Digest = postcard::from_bytes(&bytes("digest")).unwrap();
    assert_eq!(dg, d(0xab));
    let ts: Timestamp = postcard::from_bytes(&bytes("timestamp")).unwrap();
    assert_eq!(ts, t(123));
    let f: Fence = postcard::from_bytes(&bytes("fence")).unwrap();
    assert_eq!(f, Fence(1 << 40));
    let p: PrincipalState = postcard::from_bytes(&bytes("principal_state")).unwrap();
    assert_eq!(p.generation, 1 << 53);
    assert_eq!(p.moves().len(), 3);
    let o: Outcome = postcard::from_bytes(&bytes("outcome_unknown")).unwrap();
    assert_eq!(o, Outcome::unknown(None));
    let o: Outcome = postcard::from_bytes(&bytes("outcome_failed_null")).unwrap();
    assert_eq!(o.result().unwrap().as_str(), "null");
}
