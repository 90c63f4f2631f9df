//! SPEC §11 step 1: the shared fingerprint vectors of all three SDKs
//! (`testdata/fingerprint-vectors.json`), in Rust.

use serde_json::Value;
use settle_worker::{canonicalize, fingerprint, fingerprint_fields};

fn vectors() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/fingerprint-vectors.json"
    );
    let text = std::fs::read_to_string(path).expect("read the shared vectors");
    serde_json::from_str(&text).expect("the vectors are JSON")
}

#[test]
fn step1_every_shared_vector_canonicalizes_and_hashes_as_in_the_other_sdks() {
    let vectors = vectors();
    assert!(vectors.len() > 90, "the vector file lost entries");
    let mut failures = Vec::new();
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        let input = &v["input"];
        let fields: Option<Vec<String>> = v.get("fields").map(|f| {
            f.as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_owned())
                .collect()
        });
        let got = match &fields {
            None => fingerprint(input),
            Some(f) => fingerprint_fields(input, f),
        };
        if let Some(code) = v.get("error") {
            match got {
                Err(e) if e.code() == code.as_str().unwrap() => {}
                other => failures.push(format!("{name}: want error {code}, got {other:?}")),
            }
            continue;
        }
        let want_canonical = v["canonical"].as_str().unwrap();
        let canonical = match &fields {
            None => canonicalize(input),
            Some(f) => settle_worker::select_fields(input, f).and_then(|s| canonicalize(&s)),
        };
        match (canonical, got) {
            (Ok(c), Ok(d)) => {
                if c != want_canonical {
                    failures.push(format!("{name}: canonical {c:?}, want {want_canonical:?}"));
                }
                if d.to_hex() != v["sha256"].as_str().unwrap() {
                    failures.push(format!("{name}: sha256 {}", d.to_hex()));
                }
            }
            (c, d) => failures.push(format!("{name}: {c:?} {d:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn step1_member_order_does_not_change_the_fingerprint() {
    let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":null}}"#).unwrap();
    let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2]},"b":1}"#).unwrap();
    assert_eq!(fingerprint(&a), fingerprint(&b));
    let c: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[2,1]},"b":1}"#).unwrap();
    assert_ne!(fingerprint(&a), fingerprint(&c));
}
