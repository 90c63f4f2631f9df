//! The binary storage encoding (postcard) of the core's stored types,
//! pinned byte for byte. Engines store these values as they serialize, so
//! a change here is a change of the on-disk format (a version bump and a
//! migration), never a side effect of a refactor or of a renamed field.
//!
//! `SETTLE_BLESS=1 cargo test -p settle-core --test storage_format`
//! rewrites `testdata/postcard.txt` (only for a deliberate format change).

use std::collections::BTreeMap;
use std::path::PathBuf;

use settle_core::testkit::{FullExecute, FullQuarantined, FullReconcile, FullRecord};
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
/// outcome and receipt, a dispute. The shape is the one of the engines'
/// format fixtures (`testkit::FullRecord`), with the values pinned here.
fn record() -> Record {
    FullRecord {
        t0: 1_700_000_000_000,
        key: "order-1",
        fingerprint: 1,
        principal: "svc-billing",
        scopes: &["charge", "refund"],
        generation: 3,
        lease_ms: 30_000,
        result: r#"{"charge":"ch_1","amount":1.50}"#,
        response_sha256: 2,
        execute: FullExecute {
            fence: 7,
            granted_at: 0,
            worker: "w-7",
            settled_at: 100,
            receipt_sha256: 2,
            receipt_at: 500,
            observed_sha256: None,
            error: "reset\nafter 30 s",
            claim_id: Some("Zm9vYmFyYmF6cXV4LTEyMw"),
        },
        reconcile: FullReconcile {
            fence: 9,
            granted_at: 0,
            dispatched: true,
            worker: Some("w-7"),
            observed_at: 400,
            committed_at: 500,
            refused_at: 450,
            refused_status: OutcomeStatus::Failed,
            refused_sha256: 4,
            observations_total: 40,
        },
        quarantined: FullQuarantined {
            at: 450,
            fence: 9,
            reason: RefusalCode::ResultMismatch,
            principal: "svc-billing",
            scopes: &["refund", "charge"],
            generation: 3,
            response_sha256: 4,
            total: 1,
        },
        retention_s: 86_400,
        updated_at: 500,
    }
    .build()
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
