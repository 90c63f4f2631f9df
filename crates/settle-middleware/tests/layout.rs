//! The byte layouts match the vectors the Python and TypeScript
//! middlewares are checked against (`sdk/middleware-vectors.json`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::Value;
use std::collections::HashMap;

use settle_middleware::FingerprintOptions;
use settle_middleware::layout::{self, FingerprintInput};

fn vectors() -> Value {
    let text = include_str!("../../../sdk/middleware-vectors.json");
    serde_json::from_str(text).unwrap()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap()
}

#[test]
fn ledger_keys() {
    let v = vectors();
    let cases = v["ledger_keys"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        let got = layout::ledger_key(s(&c["namespace"]), s(&c["principal"]), s(&c["key"]));
        assert_eq!(got, s(&c["ledger_key"]), "{c}");
    }
}

#[test]
fn idempotency_key_header() {
    let v = vectors();
    for c in v["idempotency_key_header"].as_array().unwrap() {
        let lines: Vec<&[u8]> = c["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| s(l).as_bytes())
            .collect();
        let got = layout::parse_idempotency_key(&lines);
        match c.get("error") {
            Some(_) => assert!(got.is_err(), "{c} accepted: {got:?}"),
            None => assert_eq!(got.unwrap().as_deref(), c["key"].as_str(), "{c}"),
        }
    }
}

fn pointers(v: &Value) -> Option<Vec<String>> {
    v.as_array()
        .map(|a| a.iter().map(|p| s(p).to_string()).collect())
}

#[test]
fn request_fingerprints() {
    let v = vectors();
    let cases = v["fingerprints"].as_array().unwrap();
    let (mut canonical_cases, mut fields_cases, mut exclude_cases) = (0, 0, 0);
    let mut groups: HashMap<&str, &str> = HashMap::new();
    for c in cases {
        let body = B64.decode(s(&c["body_b64"])).unwrap();
        let headers: Vec<(String, Vec<u8>)> = c["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (s(&h[0]).to_string(), s(&h[1]).as_bytes().to_vec()))
            .collect();
        let input = FingerprintInput {
            method: s(&c["method"]),
            target: s(&c["target"]),
            content_type: s(&c["content_type"]).as_bytes(),
            body: &body,
            headers: &headers,
        };
        let canonical = c["canonical_json"].as_bool().unwrap();
        let fields = pointers(&c["fields"]);
        let exclude = pointers(&c["exclude"]);
        canonical_cases += usize::from(canonical);
        fields_cases += usize::from(fields.is_some());
        exclude_cases += usize::from(exclude.is_some());
        let options = FingerprintOptions::new(canonical, fields.clone(), exclude.clone()).unwrap();
        let fp_body = layout::fingerprint_body(&options, input.content_type, &body);
        assert_eq!(
            B64.encode(&fp_body),
            s(&c["fingerprinted_body_b64"]),
            "{c}: {}",
            String::from_utf8_lossy(&fp_body)
        );
        assert_eq!(
            layout::request_fingerprint_with(input, &options),
            s(&c["sha256"]),
            "{c}"
        );
        // The older entry point agrees where it can express the case.
        if fields.is_none() && exclude.is_none() {
            let old = if canonical {
                layout::request_fingerprint(
                    input,
                    Some(&|b: &[u8]| settle_middleware::canonical_json(b)),
                )
            } else {
                layout::request_fingerprint(input, None)
            };
            assert_eq!(old, s(&c["sha256"]), "{c}");
        }
        if let Some(g) = c["same"].as_str() {
            let want = *groups.entry(g).or_insert(s(&c["sha256"]));
            assert_eq!(s(&c["sha256"]), want, "group {g}");
        }
    }
    assert!(canonical_cases > 0 && fields_cases > 0 && exclude_cases > 0);
    assert!(groups.len() >= 5);
}

#[test]
fn refused_fingerprint_options() {
    let v = vectors();
    let cases = v["fingerprint_options_refused"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        let got = FingerprintOptions::new(
            c["canonical_json"].as_bool().unwrap(),
            pointers(&c["fields"]),
            pointers(&c["exclude"]),
        );
        let err = got.expect_err(&c.to_string());
        assert_eq!(err.code(), s(&c["error"]), "{c}");
        assert!(err.to_string().contains(err.option()), "{c}: {err}");
    }
}

#[test]
fn canonical_json_is_the_default() {
    let d = FingerprintOptions::default();
    assert!(d.canonical_json() && d.fields().is_none() && d.exclude().is_none());
    let a = layout::fingerprint_body(&d, b"application/json", br#"{"b":1,"a":2}"#);
    assert_eq!(&*a, br#"{"a":2,"b":1}"#);
    let raw = layout::fingerprint_body(
        &FingerprintOptions::raw(),
        b"application/json",
        br#"{"b":1,"a":2}"#,
    );
    assert_eq!(&*raw, br#"{"b":1,"a":2}"#);
}

#[test]
fn binding_principals_and_worker_label() {
    let v = vectors();
    // SPEC §8 (amended): there is no default principal, so no vectors for one.
    assert!(v.get("default_principal").is_none());
    for c in v["binding_principal"].as_array().unwrap() {
        assert_eq!(
            layout::binding_principal(s(&c["principal"])),
            s(&c["binding_principal"]),
            "{c}"
        );
    }
    for c in v["worker_label"].as_array().unwrap() {
        assert_eq!(
            layout::worker_label(s(&c["key"]), s(&c["principal"])),
            s(&c["worker"]),
            "{c}"
        );
    }
}

#[test]
fn stored_responses_round_trip() {
    let v = vectors();
    for c in v["responses"].as_array().unwrap() {
        let status = u16::try_from(c["status"].as_u64().unwrap()).unwrap();
        let headers: Vec<(String, Vec<u8>)> = c["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (s(&h[0]).to_string(), s(&h[1]).as_bytes().to_vec()))
            .collect();
        let body = B64.decode(s(&c["body_b64"])).unwrap();
        let stored: Vec<String> = c["stored_headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| s(h).to_string())
            .collect();
        let max = usize::try_from(c["max_stored_body"].as_u64().unwrap()).unwrap();
        let (result, digest) = layout::encode_response(status, &headers, &body, &stored, max);
        assert_eq!(result, c["result"], "{c}");
        assert_eq!(digest, s(&c["response_sha256"]), "{c}");
        let back = layout::decode_response(&result).unwrap();
        assert_eq!(back.status, status);
        match back.body {
            Some(b) => assert_eq!(b, body),
            None => assert!(body.len() > max),
        }
    }
    assert!(layout::decode_response(&serde_json::json!({"charge": 1})).is_none());
    assert!(
        layout::decode_response(
            &serde_json::json!({"v": 2, "status": 200, "headers": [], "body": ""})
        )
        .is_none()
    );
}

#[test]
fn retry_after() {
    let v = vectors();
    for c in v["retry_after"].as_array().unwrap() {
        assert_eq!(
            layout::retry_after_header(c["retry_after_ms"].as_u64().unwrap()),
            s(&c["header"]),
            "{c}"
        );
    }
}

/// The layer's builder refuses a bad combination when it is configured,
/// naming the option.
#[test]
fn the_layer_refuses_bad_fingerprint_options() {
    use settle_middleware::{IdempotencyLayer, principal};
    let dir = tempfile::tempdir().unwrap();
    let store = settle_embedded::EmbeddedStore::open(dir.path(), Default::default()).unwrap();
    let ledger = settle_ledger::Ledger::new(store);
    let layer = || {
        IdempotencyLayer::embedded(
            ledger.clone(),
            settle_core::TenantId::default_tenant(),
            principal::fixed("acct-1"),
        )
    };
    type Make<'a> = Box<dyn Fn() -> IdempotencyLayer + 'a>;
    let refused: Vec<(&str, Make<'_>)> = vec![
        ("fields", Box::new(|| layer().fields(Vec::<String>::new()))),
        ("fields", Box::new(|| layer().fields(["a"]))),
        ("exclude", Box::new(|| layer().exclude([""]))),
        ("exclude", Box::new(|| layer().exclude(["/a~2"]))),
        (
            "exclude",
            Box::new(|| layer().fields(["/a"]).exclude(["/b"])),
        ),
        (
            "fields",
            Box::new(|| layer().canonical_json(false).fields(["/a"])),
        ),
        (
            "canonical_json",
            Box::new(|| layer().exclude(["/a"]).canonical_json(false)),
        ),
        (
            "fields",
            Box::new(|| layer().canonical_body(|b| Some(b.to_vec())).fields(["/a"])),
        ),
    ];
    for (option, make) in refused {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
            .err()
            .unwrap_or_else(|| panic!("accepted ({option})"));
        let msg = err
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap();
        assert!(msg.contains(option), "{option}: {msg}");
    }
    // And what is fine is accepted.
    let _ = layer().exclude(["/client_ts"]).canonical_json(true);
    let _ = layer().fields(["/a"]);
    let _ = layer().canonical_json(false);
}
