//! Golden JSON of every request and response body, built from real core
//! values. Renaming a field of a core type cannot change these bodies
//! silently: the conversions stop compiling, or these files differ.
//!
//! `SETTLE_BLESS=1 cargo test -p settle-api --test golden` rewrites the
//! files (then review the diff: it is an API change).

mod common;

use std::path::PathBuf;

use serde::Serialize;
use settle_api as api;
use settle_core::testkit::*;
use settle_core::*;

use common::*;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/golden")
}

/// The body the HTTP API answers for `reply`.
pub fn response_body(reply: &Reply) -> String {
    fn s<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }
    match reply {
        Reply::Claim(d) => s(&api::ClaimDecision::from(d)),
        Reply::Heartbeat(l) => s(&api::LeaseInfo::from(l)),
        Reply::Dispatched(l) => s(&api::Dispatched::from(l)),
        Reply::Receipt(r) => s(&api::ReceiptResponse { receipt: r.into() }),
        Reply::Released { fence } => s(&api::Released::new(*fence)),
        Reply::Revoked {
            principal,
            generation,
        } => s(&api::Revoked {
            principal: principal.to_string(),
            generation: *generation,
        }),
        Reply::Warning(w) => s(&api::Warning::from(w)),
        Reply::Refused(c) => s(&api::Problem::refusal(*c)),
        other => panic!("no HTTP body for {other:?}"),
    }
}

fn check(name: &str, actual: &str, failures: &mut Vec<String>) {
    let path = golden_dir().join(format!("{name}.json"));
    if std::env::var_os("SETTLE_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, format!("{actual}\n")).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with SETTLE_BLESS=1)", path.display()));
    if expected.trim_end() != actual {
        failures.push(format!(
            "{name}:\n  expected {}\n  actual   {actual}",
            expected.trim_end()
        ));
    }
}

#[test]
fn every_response_body_matches_its_golden_file() {
    let sc = scenario();
    let mut failures = vec![];
    for (name, reply) in &sc.replies {
        check(
            &format!("response_{name}"),
            &response_body(reply),
            &mut failures,
        );
    }
    for (name, record) in &sc.records {
        let view = serde_json::to_string(&api::RecordView::from(record)).unwrap();
        check(&format!("response_get_{name}"), &view, &mut failures);
    }
    let warnings = api::Warnings {
        warnings: sc.warnings.iter().map(Into::into).collect(),
    };
    check(
        "response_warnings",
        &serde_json::to_string(&warnings).unwrap(),
        &mut failures,
    );
    let health = api::Health {
        status: api::HealthStatus::Ready,
    };
    check(
        "response_readyz",
        &serde_json::to_string(&health).unwrap(),
        &mut failures,
    );
    let mut problems = vec![
        api::Problem::invalid("binding.generation", "is above 2^53-1"),
        {
            let mut p = api::Problem::new(api::Code::Unavailable, "storage failure");
            p.correlation_id = Some("0a1b2c3d-000001".into());
            p
        },
    ];
    problems.extend(RefusalCode::ALL.iter().map(|c| api::Problem::refusal(*c)));
    let problems: Vec<String> = problems
        .iter()
        .map(|p| serde_json::to_string(p).unwrap())
        .collect();
    check(
        "problems",
        &format!("[{}]", problems.join(",")),
        &mut failures,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
/// Every request body a client sends for a core command, and back: the
/// server's conversion yields the same command.
#[test]
fn every_request_body_matches_its_golden_file_and_converts_back() {
    let b = binding_scopes("svc-billing", &["refund", "charge"], 2);
    let k = key("order-1");
    let mut failures = vec![];
    let mut claim = Claim::new(k.clone(), fp(1), b.clone());
    claim.worker = Some(Text::new("worker", "w-7").unwrap());
    claim.marks_dispatch = true;
    let body = api::ClaimRequest::from(&claim);
    check(
        "request_claim",
        &serde_json::to_string(&body).unwrap(),
        &mut failures,
    );
    let back: api::ClaimRequest =
        serde_json::from_str(&serde_json::to_string(&body).unwrap()).unwrap();
    assert_eq!(
        back.into_claim(k.clone(), RetentionS::DEFAULT).unwrap(),
        claim
    );

    let Command::Heartbeat(hb) = heartbeat("order-1", Fence(7), Some(5000)) else {
        unreachable!()
    };
    let body = api::HeartbeatRequest::from(&hb);
    check(
        "request_heartbeat",
        &serde_json::to_string(&body).unwrap(),
        &mut failures,
    );
    assert_eq!(body.into_heartbeat(k.clone()).unwrap(), hb);

    let Command::Dispatch(d) = dispatch("order-1", Fence(7)) else {
        unreachable!()
    };
    let body = api::DispatchRequest::from(&d);
    check(
        "request_dispatch",
        &serde_json::to_string(&body).unwrap(),
        &mut failures,
    );
    assert_eq!(body.into_dispatch(k.clone()).unwrap(), d);

    for (name, outcome) in [
        ("request_settle_completed", completed(1)),
        ("request_settle_failed", failed(2)),
        (
            "request_settle_unknown",
            Outcome::unknown_with_response(
                Some(ErrorText::new("outcome.error", "reset\nafter 30 s").unwrap()),
                fp(9),
            ),
        ),
    ] {
        let Command::Settle(s) = settle("order-1", Fence(7), 1, b.clone(), outcome) else {
            unreachable!()
        };
        let text = serde_json::to_string(&api::SettleRequest::from(&s)).unwrap();
        check(name, &text, &mut failures);
        let back: api::SettleRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_settle(k.clone()).unwrap(), s);
    }

    let Command::Release(r) = release_not_committed("order-1", Fence(7)) else {
        unreachable!()
    };
    let body = api::ReleaseRequest::from(&r);
    check(
        "request_release",
        &serde_json::to_string(&body).unwrap(),
        &mut failures,
    );
    assert_eq!(body.into_release(k.clone()).unwrap(), r);

    for (name, finding) in [
        (
            "request_reconcile_committed",
            committed(1, b.clone(), completed(1)),
        ),
        ("request_reconcile_not_committed", Finding::NotCommitted),
        ("request_reconcile_unavailable", Finding::Unavailable),
    ] {
        let Command::Reconcile(r) = reconcile("order-1", Fence(7), finding) else {
            unreachable!()
        };
        let text = serde_json::to_string(&api::ReconcileRequest::from(&r)).unwrap();
        check(name, &text, &mut failures);
        let back: api::ReconcileRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_reconcile(k.clone()).unwrap(), r);
    }

    let w = Warn {
        task: TaskId::new("nightly").unwrap(),
        class: WarningClass::new("slow").unwrap(),
        detail: Some(Text::new("detail", "took 3 s").unwrap()),
    };
    let body = api::WarnRequest::from(&w);
    check(
        "request_warn",
        &serde_json::to_string(&body).unwrap(),
        &mut failures,
    );
    assert_eq!(body.into_warn(w.task.clone(), w.class.clone()).unwrap(), w);
    check(
        "request_revoke",
        &serde_json::to_string(&api::EmptyRequest {}).unwrap(),
        &mut failures,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A client reads the answers back into the core's replies.
#[test]
fn responses_convert_back_into_the_cores_replies() {
    let sc = scenario();
    for name in [
        "claim_execute",
        "claim_in_flight",
        "claim_replay",
        "claim_reconcile",
    ] {
        let Reply::Claim(d) = sc.reply(name) else {
            panic!("{name}")
        };
        let text = serde_json::to_string(&api::ClaimDecision::from(d)).unwrap();
        let back: api::ClaimDecision = serde_json::from_str(&text).unwrap();
        assert_eq!(&ClaimDecision::try_from(back).unwrap(), d, "{name}");
    }
    let Reply::Receipt(r) = sc.reply("settle") else {
        panic!()
    };
    let text = serde_json::to_string(&api::ReceiptResponse { receipt: r.into() }).unwrap();
    let back: api::ReceiptResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(&Receipt::try_from(back.receipt).unwrap(), r);
    let Reply::Heartbeat(l) = sc.reply("heartbeat") else {
        panic!()
    };
    let back: api::LeaseInfo =
        serde_json::from_str(&serde_json::to_string(&api::LeaseInfo::from(l)).unwrap()).unwrap();
    assert_eq!(&LeaseInfo::from(back), l);
    // Every record view parses back as the same view.
    for (name, r) in &sc.records {
        let v = api::RecordView::from(r);
        let back: api::RecordView =
            serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(back, v, "{name}");
    }
    // Reconcile answers are told apart by shape.
    for (name, want) in [
        ("reconcile_not_committed", "execute"),
        ("reconcile_committed", "receipt"),
        ("reconcile_unavailable", "released"),
    ] {
        let parsed: api::ReconcileResponse =
            serde_json::from_str(&response_body(sc.reply(name))).unwrap();
        let got = match parsed {
            api::ReconcileResponse::Execute(_) => "execute",
            api::ReconcileResponse::Receipt(_) => "receipt",
            api::ReconcileResponse::Released(_) => "released",
        };
        assert_eq!(got, want, "{name}");
    }
}
