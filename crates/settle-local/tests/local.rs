//! The in-process server answers as `settle serve` does, and tells the
//! truth about durability.

use serde_json::{Value, json};
use settle_local::{LocalError, LocalLedger, LocalOptions, Reply};

const FP: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const SHA: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn post(l: &LocalLedger, target: &str, body: Value) -> Reply {
    l.call(
        "POST",
        target,
        &[("content-type".into(), "application/json".into())],
        serde_json::to_vec(&body).unwrap(),
    )
    .unwrap()
}

fn json_of(r: &Reply) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn binding() -> Value {
    json!({"principal": "svc", "scopes": [], "generation": 0})
}

/// Claims and settles `key`; returns the settle answer.
fn claim_and_settle(l: &LocalLedger, key: &str) -> Reply {
    let r = post(
        l,
        &format!("/v1/operations/{key}/claim"),
        json!({"fingerprint": FP, "binding": binding()}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let grant = json_of(&r);
    assert_eq!(grant["decision"], "execute");
    post(
        l,
        &format!("/v1/operations/{key}/settle"),
        json!({"fence": grant["fence"], "fingerprint": FP, "binding": binding(),
               "outcome": {"status": "completed", "result": {"charge": 7}, "response_sha256": SHA}}),
    )
}

#[test]
fn in_memory_receipts_say_they_are_not_durable() {
    let l = LocalLedger::open(None).unwrap();
    assert!(!l.durable());
    let r = claim_and_settle(&l, "order-1");
    assert_eq!(r.status, 200);
    assert_eq!(json_of(&r)["receipt"]["durable"], false);
    assert_eq!(json_of(&r)["receipt"]["status"], "completed");
    // The replay and the record carry the same receipt, also not durable.
    let replay = post(
        &l,
        "/v1/operations/order-1/claim",
        json!({"fingerprint": FP, "binding": binding()}),
    );
    let v = json_of(&replay);
    assert_eq!(v["decision"], "replay");
    assert_eq!(v["receipt"]["durable"], false);
    assert_eq!(v["outcome"]["result"], json!({"charge": 7}));
    let rec = l
        .call("GET", "/v1/operations/order-1", &[], Vec::new())
        .unwrap();
    assert_eq!(rec.status, 200);
    assert_eq!(json_of(&rec)["receipt"]["durable"], false);
    assert!(rec.body.ends_with(b"\n"));
}

#[test]
fn on_disk_receipts_are_durable_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let l = LocalLedger::open(Some(dir.path())).unwrap();
    assert!(l.durable());
    let r = claim_and_settle(&l, "order-2");
    assert_eq!(json_of(&r)["receipt"]["durable"], true);
    // The directory is locked while open.
    assert!(matches!(
        LocalLedger::open(Some(dir.path())),
        Err(LocalError::Open { .. })
    ));
    l.close();
    assert!(matches!(
        l.call("GET", "/v1/stats", &[], Vec::new()),
        Err(LocalError::Closed)
    ));
    l.close(); // twice: nothing

    let again = LocalLedger::open(Some(dir.path())).unwrap();
    let rec = again
        .call("GET", "/v1/operations/order-2", &[], Vec::new())
        .unwrap();
    assert_eq!(rec.status, 200);
    let v = json_of(&rec);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["receipt"]["durable"], true);
}

#[test]
fn bad_input_gets_the_servers_problems() {
    let l = LocalLedger::open(None).unwrap();
    // A malformed claim: 422 problem+json naming the field, nothing written.
    let r = post(
        &l,
        "/v1/operations/k/claim",
        json!({"fingerprint": "nope", "binding": binding()}),
    );
    assert_eq!(r.status, 422);
    assert!(
        r.headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == "application/problem+json")
    );
    assert_eq!(json_of(&r)["code"], "invalid_request");
    let miss = l.call("GET", "/v1/operations/k", &[], Vec::new()).unwrap();
    assert_eq!(miss.status, 404);
    assert_eq!(json_of(&miss)["code"], "not_found");
    // An over-long target is refused before routing, as on a socket.
    let long = format!("/v1/operations/{}", "a".repeat(9000));
    assert_eq!(l.call("GET", &long, &[], Vec::new()).unwrap().status, 414);
    // A request that is not HTTP is an error of the call, not an answer.
    assert!(matches!(
        l.call(
            "GET",
            "/v1/stats",
            &[("bad name".into(), "x".into())],
            Vec::new()
        ),
        Err(LocalError::Invalid(_))
    ));
}

#[test]
fn concurrent_callers_on_threads_each_get_their_answer() {
    let l = std::sync::Arc::new(LocalLedger::open(None).unwrap());
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let l = l.clone();
            std::thread::spawn(move || claim_and_settle(&l, &format!("k-{i}")).status)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    let stats = json_of(&l.call("GET", "/v1/stats", &[], Vec::new()).unwrap());
    assert_eq!(stats["by_status"]["completed"], 8);
}

#[test]
fn exchange_answers_what_call_answers_without_the_header_list() {
    let l = LocalLedger::open(None).unwrap();
    let h = [("content-type".to_owned(), "application/json".to_owned())];
    let claim = serde_json::to_vec(&json!({"fingerprint": FP, "binding": binding()})).unwrap();
    let a = l
        .exchange("POST", "/v1/operations/x/claim", &h, claim.clone())
        .unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.retry_after, None);
    let grant: Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(grant["decision"], "execute");
    // In flight: a 200 with the wait in the body; a problem keeps its
    // Retry-After (here none) and its body.
    let again = l
        .exchange("POST", "/v1/operations/x/claim", &h, claim)
        .unwrap();
    let v: Value = serde_json::from_slice(&again.body).unwrap();
    assert_eq!(v["decision"], "in_flight");
    let settle = serde_json::to_vec(
        &json!({"fence": grant["fence"], "fingerprint": FP, "binding": binding(),
        "outcome": {"status": "completed", "result": {"n": 1}, "response_sha256": SHA}}),
    )
    .unwrap();
    let done = l
        .exchange("POST", "/v1/operations/x/settle", &h, settle)
        .unwrap();
    assert_eq!(done.status, 200);
    let v: Value = serde_json::from_slice(&done.body).unwrap();
    // In memory, exchange's receipts say so too.
    assert_eq!(v["receipt"]["durable"], false);
    l.close();
    assert!(matches!(
        l.exchange("GET", "/v1/stats", &[], Vec::new()),
        Err(LocalError::Closed)
    ));
}

#[test]
fn segment_bytes_is_checked_and_sizes_the_log() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [0, 65_535, 1_073_741_825] {
        let opts = LocalOptions { segment_bytes: bad };
        assert!(matches!(
            LocalLedger::open_with(Some(dir.path()), &opts),
            Err(LocalError::Invalid(m)) if m.contains("segment_bytes")
        ));
    }
    let l = LocalLedger::open(Some(dir.path())).unwrap();
    claim_and_settle(&l, "k");
    l.close();
    let wal: u64 = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    // Two preallocated segments of the local default (4 MiB), not 2 × 64 MiB.
    assert_eq!(wal, 2 * settle_local::LOCAL_SEGMENT_BYTES);
}
