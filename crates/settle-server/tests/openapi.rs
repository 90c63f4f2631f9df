//! The served `/openapi.json` and the answers agree: every body the router
//! answers in a walk through every route (successes and problems) validates
//! against the schema the document names for that route and status, and a
//! success body reads as the `settle-api` type of that name and writes back
//! byte for byte. The document describes every route and every problem
//! code, and says that fences and generations are I-JSON safe integers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use settle_api as api;
use settle_ledger::MemStore;
use settle_server::{AppState, Config, router};
use tower::ServiceExt;

/// One router for the whole test binary: the metrics recorder is global.
fn app() -> axum::Router {
    static APP: OnceLock<axum::Router> = OnceLock::new();
    APP.get_or_init(|| {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = Config::local(addr, PathBuf::new());
        router(Arc::new(AppState::new(
            Arc::new(MemStore::default()),
            &config,
        )))
    })
    .clone()
}

struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

async fn call(method: &str, path: &str, body: Option<String>) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let resp = app().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22)
        .await
        .unwrap();
    Answer {
        status,
        content_type,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn served_document() -> Value {
    let a = call("GET", "/openapi.json", None).await;
    assert_eq!(
        (a.status, a.content_type.as_str()),
        (200, "application/json")
    );
    serde_json::from_str(&a.body).unwrap()
}

// ---- a small JSON Schema (2020-12 subset) validator ----

fn resolve<'a>(doc: &'a Value, r: &str) -> &'a Value {
    let name = r
        .strip_prefix("#/components/schemas/")
        .unwrap_or_else(|| panic!("unexpected $ref {r}"));
    let s = &doc["components"]["schemas"][name];
    assert!(s.is_object(), "the document has no schema {name}");
    s
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "number" => v.is_number(),
        "integer" => v.is_u64() || v.is_i64(),
        other => panic!("unknown type {other}"),
    }
}

/// The errors of `v` against `schema` (empty: valid).
fn errors(doc: &Value, schema: &Value, v: &Value, path: &str) -> Vec<String> {
    let mut out = vec![];
    let mut fail = |m: String| out.push(format!("{path}: {m}"));
    if let Some(r) = schema["$ref"].as_str() {
        return errors(doc, resolve(doc, r), v, path);
    }
    match &schema["type"] {
        Value::String(t) if !type_matches(t, v) => fail(format!("{v} is not {t}")),
        Value::Array(ts) if !ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)) => {
            fail(format!("{v} is none of {ts:?}"))
        }
        _ => {}
    }
    if let Some(e) = schema["enum"].as_array()
        && !e.contains(v)
    {
        fail(format!("{v} is not one of {e:?}"));
    }
    if !schema["const"].is_null() && schema["const"] != *v {
        fail(format!("{v} is not {}", schema["const"]));
    }
    if let (Some(n), Some(min)) = (v.as_f64(), schema["minimum"].as_f64())
        && n < min
    {
        fail(format!("{n} < minimum {min}"));
    }
    if let (Some(n), Some(max)) = (v.as_u64(), schema["maximum"].as_u64())
        && n > max
    {
        fail(format!("{n} > maximum {max}"));
    }
    if let (Some(s), Some(max)) = (v.as_str(), schema["maxLength"].as_u64())
        && s.chars().count() as u64 > max
    {
        fail(format!("longer than {max}"));
    }
    if let (Some(s), Some(min)) = (v.as_str(), schema["minLength"].as_u64())
        && (s.chars().count() as u64) < min
    {
        fail(format!("shorter than {min}"));
    }
    if let Some(obj) = v.as_object() {
        let props = schema["properties"].as_object();
        for r in schema["required"].as_array().into_iter().flatten() {
            if !obj.contains_key(r.as_str().unwrap()) {
                fail(format!("required {r} missing"));
            }
        }
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(p) => out.extend(errors(doc, p, x, &format!("{path}.{k}"))),
                None if schema["additionalProperties"] == json!(false) => {
                    out.push(format!("{path}: unknown property {k}"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            out.extend(errors(doc, items, x, &format!("{path}[{i}]")));
        }
    }
    for s in schema["allOf"].as_array().into_iter().flatten() {
        out.extend(errors(doc, s, v, path));
    }
    if let Some(alts) = schema["oneOf"].as_array() {
        let ok = alts
            .iter()
            .filter(|s| errors(doc, s, v, path).is_empty())
            .count();
        if ok != 1 {
            out.push(format!(
                "{path}: {v} matches {ok} of the oneOf alternatives"
            ));
        }
    }
    if let Some(alts) = schema["anyOf"].as_array()
        && !alts.iter().any(|s| errors(doc, s, v, path).is_empty())
    {
        out.push(format!("{path}: {v} matches none of anyOf"));
    }
    if schema.get("not").is_some() && errors(doc, &schema["not"], v, path).is_empty() {
        out.push(format!("{path}: {v} matches `not`"));
    }
    if let Some(cond) = schema.get("if") {
        let branch = if errors(doc, cond, v, path).is_empty() {
            schema.get("then")
        } else {
            schema.get("else")
        };
        if let Some(b) = branch {
            out.extend(errors(doc, b, v, path));
        }
    }
    out
}

/// The path template of the document that `path` is an instance of.
fn template<'a>(doc: &'a Value, path: &str) -> &'a str {
    let segs: Vec<&str> = path.split('?').next().unwrap().split('/').collect();
    doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .find(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            ts.len() == segs.len()
                && ts
                    .iter()
                    .zip(&segs)
                    .all(|(t, s)| t.starts_with('{') || t == s)
        })
        .unwrap_or_else(|| panic!("no path of the document matches {path}"))
}

/// The `settle-api` type the document names, read from `body` and written
/// back: the bytes must not change.
fn round_trip(name: &str, body: &str) {
    fn rt<T: DeserializeOwned + Serialize>(body: &str) -> String {
        let v: T = serde_json::from_str(body).unwrap();
        // Every body ends with a newline (a terminal's prompt follows it).
        serde_json::to_string(&v).unwrap() + "\n"
    }
    let again = match name {
        "ClaimDecision" => rt::<api::ClaimDecision>(body),
        "LeaseInfo" => rt::<api::LeaseInfo>(body),
        "Dispatched" => rt::<api::Dispatched>(body),
        "ReceiptResponse" => rt::<api::ReceiptResponse>(body),
        "Released" => rt::<api::Released>(body),
        "ReconcileResponse" => rt::<api::ReconcileResponse>(body),
        "Record" => rt::<api::RecordView>(body),
        "Revoked" => rt::<api::Revoked>(body),
        "PrincipalGeneration" => rt::<api::PrincipalGeneration>(body),
        "Warning" => rt::<api::Warning>(body),
        "Warnings" => rt::<api::Warnings>(body),
        "Health" => rt::<api::Health>(body),
        "ListResponse" => rt::<api::ListResponse>(body),
        "Stats" => rt::<api::Stats>(body),
        "Problem" => rt::<api::Problem>(body),
        "BatchResponse" => rt::<api::BatchResponse>(body),
        other => panic!("no settle-api type for schema {other}"),
    };
    assert_eq!(again, body, "{name} does not write its body back unchanged");
}

/// Validates one answer against the document; returns the schema name.
fn check(doc: &Value, method: &str, path: &str, a: &Answer) -> String {
    let t = template(doc, path);
    let op = &doc["paths"][t][method.to_ascii_lowercase()];
    assert!(op.is_object(), "{method} {t} is not documented");
    let resp = &op["responses"][a.status.to_string()];
    assert!(
        resp.is_object(),
        "{method} {path}: status {} is not documented ({})",
        a.status,
        a.body
    );
    let media = resp["content"][a.content_type.as_str()].clone();
    assert!(
        media.is_object(),
        "{method} {path} {}: content type {} is not documented",
        a.status,
        a.content_type
    );
    let schema = &media["schema"];
    let name = schema["$ref"]
        .as_str()
        .map(|r| r.rsplit('/').next().unwrap().to_string())
        .unwrap_or_default();
    if a.content_type.contains("json") && t != "/openapi.json" {
        let v: Value = serde_json::from_str(&a.body).unwrap();
        let e = errors(doc, schema, &v, "body");
        assert!(e.is_empty(), "{method} {path} {}: {e:#?}\n{v}", a.status);
        round_trip(&name, &a.body);
    }
    name
}

fn fp(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn binding(generation: u64) -> Value {
    json!({"principal": "svc", "scopes": ["pay"], "generation": generation})
}

fn completed(n: u8) -> Value {
    json!({"status": "completed", "result": {"charge": n}, "response_sha256": fp(100 + n)})
}

/// Every route, every success shape and the problems a client can provoke
/// without a failing store (those are in `tests/router.rs`).
#[tokio::test]
#[allow(clippy::too_many_lines)] // one walk through every route, kept whole
async fn every_answer_validates_against_the_served_document() {
    let doc = served_document().await;
    let mut seen = std::collections::BTreeSet::new();
    let mut step = async |method: &str, path: &str, body: Option<Value>| {
        let a = call(method, path, body.map(|b| b.to_string())).await;
        let name = check(&doc, method, path, &a);
        seen.insert((template(&doc, path).to_string(), a.status));
        (a, name)
    };
    let b = binding(0);
    let claim = json!({"fingerprint": fp(1), "binding": b, "marks_dispatch": true, "worker": "w"});
    let (a, _) = step("POST", "/v1/operations/k1/claim", Some(claim.clone())).await;
    let fence = serde_json::from_str::<Value>(&a.body).unwrap()["fence"].clone();
    step("POST", "/v1/operations/k1/claim", Some(claim.clone())).await; // in_flight
    step(
        "POST",
        "/v1/operations/k1/heartbeat",
        Some(json!({"fence": fence})),
    )
    .await;
    step(
        "POST",
        "/v1/operations/k1/dispatch",
        Some(json!({"fence": fence})),
    )
    .await;
    step(
        "POST",
        "/v1/operations/k1/release",
        Some(json!({"fence": fence})),
    )
    .await; // 409
    let settle =
        json!({"fence": fence, "fingerprint": fp(1), "binding": b, "outcome": completed(1)});
    let (a, name) = step("POST", "/v1/operations/k1/settle", Some(settle.clone())).await;
    assert_eq!((a.status, name.as_str()), (200, "ReceiptResponse"));
    let (_, name) = step("POST", "/v1/operations/k1/claim", Some(claim.clone())).await; // replay
    assert_eq!(name, "ClaimDecision");
    let mut other = settle.clone();
    other["outcome"] = completed(2);
    step("POST", "/v1/operations/k1/settle", Some(other)).await; // result_mismatch
    step("GET", "/v1/operations/k1", None).await;

    // An unknown outcome, then every reconcile finding (each answers its
    // own shape: released, a receipt, an execute lease).
    let fence_of = |a: &Answer| serde_json::from_str::<Value>(&a.body).unwrap()["fence"].clone();
    for (key, findings) in [
        ("k2", vec!["unavailable", "committed"]),
        ("k4", vec!["not_committed"]),
    ] {
        let path = |call: &str| format!("/v1/operations/{key}/{call}");
        let (a, _) = step("POST", &path("claim"), Some(claim.clone())).await;
        let unknown = json!({"fence": fence_of(&a), "fingerprint": fp(1), "binding": b,
            "outcome": {"status": "unknown", "error": "reset"}});
        step("POST", &path("settle"), Some(unknown)).await;
        for finding in findings {
            let (a, _) = step("POST", &path("claim"), Some(claim.clone())).await;
            let mut body = json!({"fence": fence_of(&a), "finding": finding});
            if finding == "committed" {
                body["fingerprint"] = json!(fp(1));
                body["binding"] = b.clone();
                body["outcome"] = completed(3);
            }
            let (a, name) = step("POST", &path("reconcile"), Some(body)).await;
            assert_eq!(
                (a.status, name.as_str()),
                (200, "ReconcileResponse"),
                "{}",
                a.body
            );
        }
    }
    step("GET", "/v1/operations/k2", None).await;

    step("GET", "/v1/principals/svc", None).await;
    step("POST", "/v1/principals/svc/revoke", None).await;
    step("POST", "/v1/principals/svc/revoke", Some(json!({}))).await;
    step("GET", "/v1/principals/svc", None).await;
    step("POST", "/v1/operations/k3/claim", Some(claim.clone())).await; // stale_binding
    let mut mismatch = claim.clone();
    mismatch["fingerprint"] = json!(fp(9));
    step("POST", "/v1/operations/k1/claim", Some(mismatch)).await;
    step(
        "POST",
        "/v1/tasks/t/warnings/c",
        Some(json!({"detail": "slow"})),
    )
    .await;
    step("GET", "/v1/tasks/t/warnings", None).await;
    let mut call = claim.clone();
    call["op"] = json!("claim");
    call["key"] = json!("kb");
    step(
        "POST",
        "/v1/batch",
        Some(json!({"calls": [call, {"op": "get", "key": "kb"}]})),
    )
    .await;
    // The inspection API (SPEC §9): a page with a cursor, the counts, a bad filter.
    let (a, name) = step("GET", "/v1/operations?limit=1", None).await;
    assert_eq!(
        (a.status, name.as_str()),
        (200, "ListResponse"),
        "{}",
        a.body
    );
    let next = serde_json::from_str::<Value>(&a.body).unwrap()["next"].clone();
    step(
        "GET",
        &format!(
            "/v1/operations?limit=1&status=unknown,completed&after={}",
            next.as_str().unwrap()
        ),
        None,
    )
    .await;
    let (_, name) = step("GET", "/v1/stats", None).await;
    assert_eq!(name, "Stats");
    step("GET", "/v1/operations?limit=0", None).await;
    for i in 0..64 {
        step("POST", &format!("/v1/tasks/full/warnings/c{i}"), None).await;
    }
    step("POST", "/v1/tasks/full/warnings/one-more", None).await; // too_many_classes

    // Problems before the rules: syntax, schema, unknown key, a bad segment.
    step("POST", "/v1/operations/k1/claim", Some(json!([1]))).await;
    step("POST", "/v1/operations/k1/claim", Some(json!({"x": 1}))).await;
    step("POST", "/v1/operations/a%zz/claim", Some(claim.clone())).await;
    step(
        "POST",
        "/v1/operations/nope/heartbeat",
        Some(json!({"fence": 1})),
    )
    .await;
    step("GET", "/v1/operations/nope", None).await;

    // The admin export (SPEC §12): open here, authentication is off.
    let (a, _) = step("GET", "/v1/admin/export", None).await;
    assert_eq!(a.status, 200);
    settle_portable::verify(a.body.as_bytes()).unwrap();
    // The walk's records (other tests of this binary share the store).
    let keys: Vec<String> = settle_portable::Reader::new(a.body.as_bytes())
        .unwrap()
        .map(|e| e.unwrap().order().2.to_string())
        .collect();
    for k in ["k1", "k2", "k4", "svc", "t"] {
        assert!(keys.iter().any(|x| x == k), "{k} not in {keys:?}");
    }

    step("GET", "/healthz", None).await;
    step("GET", "/readyz", None).await;
    step("GET", "/metrics", None).await;
    step("GET", "/openapi.json", None).await;

    // The walk reached every route and the problems it set out to provoke.
    let routes: std::collections::BTreeSet<_> = seen.iter().map(|(t, _)| t.clone()).collect();
    assert_eq!(
        routes.len(),
        doc["paths"].as_object().unwrap().len(),
        "{routes:?}"
    );
    for (t, status) in [
        ("/v1/operations/{key}/claim", 409),
        ("/v1/operations/{key}/claim", 400),
        ("/v1/operations/{key}/claim", 422),
        ("/v1/operations/{key}/release", 409),
        ("/v1/operations/{key}/settle", 409),
        ("/v1/operations/{key}/heartbeat", 404),
        ("/v1/operations/{key}", 404),
        ("/v1/tasks/{task}/warnings/{class}", 409),
    ] {
        assert!(
            seen.contains(&(t.to_string(), status)),
            "{t} {status} not reached"
        );
    }
}

#[tokio::test]
async fn the_document_describes_every_route_and_problem_code() {
    let doc = served_document().await;
    assert_eq!(doc["openapi"].as_str().unwrap().get(..3), Some("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    let mut want = vec![
        "/v1/operations/{key}/claim",
        "/v1/operations/{key}/heartbeat",
        "/v1/operations/{key}/dispatch",
        "/v1/operations/{key}/settle",
        "/v1/operations/{key}/release",
        "/v1/operations/{key}/reconcile",
        "/v1/operations/{key}",
        "/v1/principals/{principal}",
        "/v1/principals/{principal}/revoke",
        "/v1/tasks/{task}/warnings/{class}",
        "/v1/tasks/{task}/warnings",
        "/v1/operations",
        "/v1/stats",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/batch",
        "/v1/admin/export",
    ];
    let mut have: Vec<&str> = paths.keys().map(String::as_str).collect();
    want.sort();
    have.sort();
    assert_eq!(have, want);

    // The admin export needs an admin token, not a tenant's (SPEC §12).
    assert_eq!(
        paths["/v1/admin/export"]["get"]["security"],
        json!([{"admin": []}])
    );
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["admin"]["scheme"], "bearer");
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(doc["security"], json!([{"bearer": []}]));

    // Every /v1 operation lists the errors that come before its rules,
    // and every path segment has the key syntax.
    let mut ops = 0;
    let mut described = String::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            for r in op["responses"].as_object().unwrap().values() {
                described.push_str(r["description"].as_str().unwrap());
                described.push('\n');
            }
            if !path.starts_with("/v1/") {
                continue;
            }
            ops += 1;
            for status in ["200", "400", "401", "408", "413", "422", "503"] {
                assert!(
                    op["responses"][status].is_object(),
                    "{method} {path} lacks {status}"
                );
            }
            for p in op["parameters"].as_array().into_iter().flatten() {
                if p["in"] != "path" {
                    continue;
                }
                let s = resolve(&doc, p["schema"]["$ref"].as_str().unwrap());
                assert_eq!(s["pattern"], "^[!-~]{1,255}$", "{path} {}", p["name"]);
            }
        }
    }
    assert_eq!(ops, 15, "all fifteen /v1 operations");

    // The closed list of codes, each named where a route can answer it.
    let codes: Vec<Value> = api::Code::ALL.iter().map(|c| json!(c.as_str())).collect();
    assert_eq!(doc["components"]["schemas"]["Code"]["enum"], json!(codes));
    assert_eq!(
        doc["components"]["schemas"]["Problem"]["properties"]["code"]["$ref"],
        "#/components/schemas/Code"
    );
    for c in api::Code::ALL {
        assert!(described.contains(c.as_str()), "no route names {c}");
    }
}

/// Every fence and generation of every schema, request or response, is an
/// int64 in [0, 2^53 − 1]; the exceptions are the generation revoke and
/// `GET /v1/principals` answer, which may be 2^53 or more once a principal was revoked at the
/// top of the range (SPEC §2 only refuses revoke at 2^64 − 1).
#[tokio::test]
async fn fences_and_generations_are_documented_as_safe_integers() {
    let doc = served_document().await;
    let mut n = 0;
    for (name, s) in doc["components"]["schemas"].as_object().unwrap() {
        for (field, p) in s["properties"].as_object().into_iter().flatten() {
            if field != "fence" && field != "generation" {
                continue;
            }
            n += 1;
            assert_eq!(p["format"], "int64", "{name}.{field}");
            assert!(p["minimum"].as_u64().is_some(), "{name}.{field}: {p}");
            // A generation past 2^53 − 1 is reported as it is (revoked at
            // the top of the range; no claim can carry it any more).
            if name == "Revoked" || name == "PrincipalGeneration" {
                continue;
            }
            assert_eq!(
                p["maximum"].as_u64(),
                Some(api::MAX_SAFE_INTEGER),
                "{name}.{field}: {p}"
            );
        }
    }
    assert!(n >= 14, "only {n} fences and generations found");
    // SPEC §2: fences start at 1 (requests too: fence 0 is a 422),
    // generations at 0.
    for (name, field, min) in [
        ("DispatchRequest", "fence", 1),
        ("HeartbeatRequest", "fence", 1),
        ("SettleRequest", "fence", 1),
        ("ReleaseRequest", "fence", 1),
        ("ReconcileRequest", "fence", 1),
        ("Binding", "generation", 0),
    ] {
        assert_eq!(
            doc["components"]["schemas"][name]["properties"][field]["minimum"], min,
            "{name}.{field}"
        );
    }
}

/// SPEC §2: a fence or generation above 2^53 − 1 in any request is a 422
/// `invalid_request` naming the field, and changes nothing.
#[tokio::test]
async fn larger_fences_and_generations_are_422() {
    let max = api::MAX_SAFE_INTEGER;
    let claim =
        |g: Value| json!({"fingerprint": fp(1), "binding": {"principal": "big", "generation": g}});
    let settle = |f: Value, g: Value| {
        json!({"fence": f, "fingerprint": fp(1),
               "binding": {"principal": "big", "generation": g}, "outcome": completed(1)})
    };
    let too_big = [json!(max + 1), json!(u64::MAX), json!(1e300)];
    for big in &too_big {
        let cases = [
            ("claim", claim(big.clone()), "binding.generation"),
            ("heartbeat", json!({"fence": big}), "fence"),
            ("dispatch", json!({"fence": big}), "fence"),
            ("release", json!({"fence": big}), "fence"),
            ("settle", settle(big.clone(), json!(0)), "fence"),
            (
                "settle",
                settle(json!(1), big.clone()),
                "binding.generation",
            ),
            (
                "reconcile",
                json!({"fence": big, "finding": "unavailable"}),
                "fence",
            ),
            (
                "reconcile",
                json!({"fence": 1, "finding": "committed", "fingerprint": fp(1),
                       "binding": {"principal": "big", "generation": big}, "outcome": completed(1)}),
                "binding.generation",
            ),
        ];
        for (call_name, body, field) in cases {
            let a = call(
                "POST",
                &format!("/v1/operations/big/{call_name}"),
                Some(body.to_string()),
            )
            .await;
            let p: api::Problem = serde_json::from_str(&a.body).unwrap();
            assert_eq!(
                (a.status, p.code, p.field.as_deref()),
                (422, api::Code::InvalidRequest, Some(field)),
                "{call_name} with {big}: {}",
                a.body
            );
        }
    }
    // Nothing was written, and the largest safe values are accepted.
    let a = call("GET", "/v1/operations/big", None).await;
    assert_eq!(a.status, 404, "{}", a.body);
    let a = call(
        "POST",
        "/v1/operations/big/claim",
        Some(claim(json!(max)).to_string()),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = call(
        "POST",
        "/v1/operations/big/heartbeat",
        Some(json!({"fence": max}).to_string()),
    )
    .await;
    assert_eq!(
        a.status, 409,
        "the largest fence is a stale one: {}",
        a.body
    );
}

/// The validator above refuses what it should (it is what the other tests
/// trust): a missing field, a wrong type, an out-of-range fence, an unknown
/// field of a closed schema, a broken cross-field rule.
#[tokio::test]
async fn the_validator_refuses_bad_bodies() {
    let doc = served_document().await;
    let r = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let t = "2023-11-14T22:13:20.123Z";
    let good = json!({"fence": 3, "lease_expires_at": t});
    assert!(errors(&doc, &r("LeaseInfo"), &good, "b").is_empty());
    for bad in [
        json!({"fence": 3}),
        json!({"fence": "3", "lease_expires_at": t}),
        json!({"fence": api::MAX_SAFE_INTEGER + 1, "lease_expires_at": t}),
    ] {
        assert!(
            !errors(&doc, &r("LeaseInfo"), &bad, "b").is_empty(),
            "{bad}"
        );
    }
    assert!(
        !errors(
            &doc,
            &r("DispatchRequest"),
            &json!({"fence": 1, "x": 1}),
            "b"
        )
        .is_empty()
    );
    let no_result = json!({"status": "completed", "response_sha256": fp(1)});
    assert!(!errors(&doc, &r("Outcome"), &no_result, "b").is_empty());
    let unknown_with_result = json!({"status": "unknown", "result": 1});
    assert!(!errors(&doc, &r("Outcome"), &unknown_with_result, "b").is_empty());
    let decision = json!({"decision": "replay", "fence": 1});
    assert!(!errors(&doc, &r("ClaimDecision"), &decision, "b").is_empty());
}
