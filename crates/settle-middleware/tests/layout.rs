//! The byte layouts match the vectors the Python and TypeScript
//! middlewares are checked against (`sdk/middleware-vectors.json`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::Value;
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

#[test]
fn request_fingerprints() {
    let v = vectors();
    let cases = v["fingerprints"].as_array().unwrap();
    let mut canonical_cases = 0;
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
        if canonical {
            canonical_cases += 1;
            let got = layout::request_fingerprint(
                input,
                Some(&|b: &[u8]| settle_middleware::canonical_json(b)),
            );
            assert_eq!(got, s(&c["sha256"]), "{c}");
        } else {
            assert_eq!(
                layout::request_fingerprint(input, None),
                s(&c["sha256"]),
                "{c}"
            );
        }
    }
    assert!(canonical_cases > 0);
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
