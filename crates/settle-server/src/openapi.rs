//! `/openapi.json`: the OpenAPI 3.1 document, generated with utoipa.
//!
//! The response schemas below describe the JSON the core's types serialize
//! to (the core stays free of utoipa). A test serializes real core values
//! and checks every field against these schemas, so they cannot drift
//! silently.

#![allow(dead_code)] // The schema types are only read by utoipa.

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::wire;

/// The authorization an operation runs under.
#[derive(Serialize, ToSchema)]
#[schema(as = Binding)]
pub struct BindingSchema {
    /// 1–255 bytes of visible ASCII.
    principal: String,
    /// Order irrelevant; stored sorted and de-duplicated; at most 64.
    #[serde(default)]
    scopes: Vec<String>,
    generation: u64,
}

/// A reported outcome. `completed` and `failed` require `result` and
/// `response_sha256`; `unknown` refuses `result` and may carry
/// `response_sha256` and `error`.
#[derive(Serialize, ToSchema)]
#[schema(as = Outcome)]
pub struct OutcomeSchema {
    status: OutcomeStatusSchema,
    /// Any JSON document (`null` included): at most `max_result_bytes` of
    /// compact text, arrays and objects nested at most 64 deep. Stored as
    /// sent (whitespace between tokens removed) and replayed byte for byte.
    result: Option<serde_json::Value>,
    #[schema(pattern = "^[0-9a-f]{64}$")]
    response_sha256: Option<String>,
    /// Any text of at most 4096 bytes (empty and multi-line included).
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = OutcomeStatus)]
pub enum OutcomeStatusSchema {
    Completed,
    Failed,
    Unknown,
}

/// Canonical status (`running` appears only in the record view's `status`).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = Status)]
pub enum StatusSchema {
    Pending,
    Unknown,
    Conflict,
    Failed,
    Completed,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = Finding)]
pub enum FindingSchema {
    Committed,
    NotCommitted,
    Unavailable,
}

/// The durable proof of a settlement.
#[derive(Serialize, ToSchema)]
#[schema(as = Receipt)]
pub struct ReceiptSchema {
    key: String,
    fingerprint: String,
    response_sha256: Option<String>,
    status: StatusSchema,
    fence: u64,
    #[schema(format = DateTime)]
    committed_at: String,
    /// Always true.
    durable: bool,
}

/// The answer to a claim.
// A schema description only, never built at run time: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Serialize, ToSchema)]
#[serde(tag = "decision", rename_all = "snake_case")]
#[schema(as = ClaimDecision)]
pub enum ClaimDecisionSchema {
    /// Go ahead under this fence.
    Execute {
        fence: u64,
        #[schema(format = DateTime)]
        lease_expires_at: String,
        attempt: u32,
    },
    /// Find out whether the remote effect happened before writing anything.
    Reconcile {
        fence: u64,
        #[schema(format = DateTime)]
        lease_expires_at: String,
        attempt: u32,
    },
    /// Another worker holds a live lease.
    InFlight { retry_after_ms: u64 },
    /// Already settled: the one true outcome.
    Replay {
        outcome: OutcomeSchema,
        receipt: ReceiptSchema,
    },
}

/// A live lease after heartbeat.
#[derive(Serialize, ToSchema)]
#[schema(as = LeaseInfo)]
pub struct LeaseInfoSchema {
    fence: u64,
    #[schema(format = DateTime)]
    lease_expires_at: String,
}

/// The answer to dispatch.
#[derive(Serialize, ToSchema)]
#[schema(as = Dispatched)]
pub struct DispatchedSchema {
    fence: u64,
    #[schema(format = DateTime)]
    lease_expires_at: String,
    dispatched: bool,
}

/// The answer to settle and to `reconcile(committed)`.
#[derive(Serialize, ToSchema)]
#[schema(as = ReceiptResponse)]
pub struct ReceiptResponseSchema {
    receipt: ReceiptSchema,
}

/// The answer to release and to `reconcile(unavailable)`: the lease ended without a receipt.
#[derive(Serialize, ToSchema)]
#[schema(as = Released)]
pub struct ReleasedSchema {
    fence: u64,
    released: bool,
}

/// The answer to reconcile, by finding.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = ReconcileResponse)]
pub enum ReconcileResponseSchema {
    /// `not_committed`: an execute lease under the same fence.
    Execute(ClaimDecisionSchema),
    /// `committed`.
    Receipt(ReceiptResponseSchema),
    /// `unavailable`.
    Released(ReleasedSchema),
}

#[derive(Serialize, ToSchema)]
#[schema(as = Reservation)]
pub struct ReservationSchema {
    fingerprint: String,
    principal: String,
    scopes: Vec<String>,
    generation: u64,
}

#[derive(Serialize, ToSchema)]
#[schema(as = LeaseEnded)]
pub struct EndedSchema {
    /// expired, revoked, settled, refused, released, unavailable or
    /// not_committed (`release(not_committed)`: the holder's attestation).
    reason: String,
    #[schema(format = DateTime)]
    at: String,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Lease)]
pub struct LeaseSchema {
    fence: u64,
    /// execute or reconcile.
    purpose: String,
    generation: u64,
    #[schema(format = DateTime)]
    granted_at: String,
    #[schema(format = DateTime)]
    expires_at: String,
    lease_ms: u64,
    marks_dispatch: bool,
    dispatched: bool,
    worker: Option<String>,
    /// Null while the lease is live.
    ended: Option<EndedSchema>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Observation)]
pub struct ObservationSchema {
    #[schema(format = DateTime)]
    at: String,
    /// settle or reconcile.
    call: String,
    status: Option<OutcomeStatusSchema>,
    finding: Option<FindingSchema>,
    response_sha256: Option<String>,
    accepted: bool,
    /// The refusal code when not accepted.
    code: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Attempt)]
pub struct AttemptSchema {
    number: u32,
    lease: LeaseSchema,
    receipt: Option<ReceiptSchema>,
    /// The `error` the attempt reported with its receipt (`unknown` included).
    error: Option<String>,
    observations: Vec<ObservationSchema>,
    observations_total: u32,
}

#[derive(Serialize, ToSchema)]
#[schema(as = QuarantineEntry)]
pub struct QuarantineEntrySchema {
    #[schema(format = DateTime)]
    at: String,
    fence: u64,
    /// The refusal code.
    reason: String,
    call: String,
    status: Option<OutcomeStatusSchema>,
    finding: Option<FindingSchema>,
    fingerprint: Option<String>,
    binding: Option<BindingSchema>,
    response_sha256: Option<String>,
}

/// The record of `get`.
#[derive(Serialize, ToSchema)]
#[schema(as = Record)]
pub struct RecordSchema {
    key: String,
    /// pending, running (pending with a live lease), unknown, conflict, failed or completed.
    status: String,
    /// Rank in the lattice (0–4).
    rank: u8,
    reservation: ReservationSchema,
    /// The current lease, live or ended.
    lease: Option<LeaseSchema>,
    outcome: Option<OutcomeSchema>,
    receipt: Option<ReceiptSchema>,
    reconcile_required: bool,
    disputed: bool,
    attempts: Vec<AttemptSchema>,
    attempts_total: u32,
    quarantine: Vec<QuarantineEntrySchema>,
    quarantine_total: u64,
    retention_s: u64,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
    #[schema(format = DateTime)]
    settled_at: Option<String>,
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Revoked)]
pub struct RevokedSchema {
    principal: String,
    generation: u64,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Warning)]
pub struct WarningSchema {
    task: String,
    class: String,
    count: u64,
    detail: Option<String>,
    #[schema(format = DateTime)]
    first_at: String,
    #[schema(format = DateTime)]
    last_at: String,
    saturated: bool,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Warnings)]
pub struct WarningsSchema {
    warnings: Vec<WarningSchema>,
}

/// RFC 9457 problem details (`application/problem+json`).
#[derive(Serialize, ToSchema)]
#[schema(as = Problem)]
pub struct ProblemSchema {
    #[serde(rename = "type")]
    kind: String,
    title: String,
    status: u16,
    detail: String,
    /// bad_request, unauthorized, not_found, payload_too_large, request_timeout,
    /// invalid_request, fingerprint_mismatch, binding_mismatch, stale_binding,
    /// stale_fence, lease_expired, wrong_purpose, result_mismatch,
    /// receipt_required, too_many_classes, record_refused, unavailable.
    code: String,
    /// The offending field (422).
    field: Option<String>,
    /// 503 `unavailable`: names the server log line that holds the cause
    /// (the cause itself is never sent).
    correlation_id: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = Health)]
pub struct HealthSchema {
    status: String,
}

/// `POST /v1/batch` (SPEC §10): at most `max_batch_calls` calls (default
/// 1000), applied in order; a key may appear more than once.
#[derive(Serialize, ToSchema)]
#[schema(as = BatchRequest)]
pub struct BatchRequestSchema {
    calls: Vec<BatchCallSchema>,
}

/// One call: `op`, the raw `key` (a JSON string, not percent-encoded) and
/// the fields of that call's request body beside them (`get` has none).
#[derive(Serialize, ToSchema)]
#[schema(as = BatchCall)]
pub struct BatchCallSchema {
    op: BatchOpSchema,
    key: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BatchOp)]
pub enum BatchOpSchema {
    Claim,
    Heartbeat,
    Dispatch,
    Settle,
    Release,
    Reconcile,
    Get,
}

/// One result per call, in order.
#[derive(Serialize, ToSchema)]
#[schema(as = BatchResponse)]
pub struct BatchResponseSchema {
    results: Vec<BatchResultSchema>,
}

/// What the single call would have answered.
#[derive(Serialize, ToSchema)]
#[schema(as = BatchResult)]
pub struct BatchResultSchema {
    /// 200, or the problem's status (4xx, 503).
    status: u16,
    /// The single call's response body, or a problem object.
    body: serde_json::Value,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "settle",
        description = "A durable ledger that makes retried side effects happen at most once: \
                       idempotency keys, fenced leases and a monotonic settlement rule (SPEC §7).",
    ),
    paths(
        crate::http::claim,
        crate::http::heartbeat,
        crate::http::dispatch,
        crate::http::settle,
        crate::http::release,
        crate::http::reconcile,
        crate::http::get_record,
        crate::http::revoke,
        crate::http::warn,
        crate::http::warnings,
        crate::http::healthz,
        crate::http::readyz,
        crate::http::metrics,
        crate::http::openapi_json,
        crate::batch::batch,
    ),
    components(schemas(
        wire::ClaimRequest,
        wire::HeartbeatRequest,
        wire::DispatchRequest,
        wire::SettleRequest,
        wire::ReleaseRequest,
        wire::ReconcileRequest,
        wire::WarnRequest,
        wire::EmptyRequest,
        BindingSchema,
        OutcomeSchema,
        ClaimDecisionSchema,
        ReceiptSchema,
        LeaseInfoSchema,
        DispatchedSchema,
        ReceiptResponseSchema,
        ReleasedSchema,
        ReconcileResponseSchema,
        RecordSchema,
        RevokedSchema,
        WarningSchema,
        WarningsSchema,
        ProblemSchema,
        HealthSchema,
        BatchRequestSchema,
        BatchCallSchema,
        BatchResponseSchema,
        BatchResultSchema,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as JSON bytes (built once at start).
pub fn document() -> Vec<u8> {
    let mut doc: serde_json::Value = serde_json::from_str(
        &ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serializes"),
    )
    .expect("utoipa emits JSON");
    add_common_errors(&mut doc);
    add_syntax(&mut doc);
    serde_json::to_vec(&doc).expect("the OpenAPI document serializes")
}

/// The key syntax of SPEC §2 (1–255 bytes of visible ASCII) on every path
/// segment, principal and scope, the free-text rule on `worker` and
/// `detail`, and the plain length limit on `outcome.error`, so generated
/// clients and fuzzers send what the server accepts.
fn add_syntax(doc: &mut serde_json::Value) {
    use serde_json::json;
    let token =
        json!({"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"});
    let text = |nullable: bool| {
        json!({
            "type": if nullable { json!(["string", "null"]) } else { json!("string") },
            "minLength": 1, "maxLength": 4096,
            "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
        })
    };
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            for op in item
                .as_object_mut()
                .into_iter()
                .flat_map(|o| o.values_mut())
            {
                let params = op.get_mut("parameters").and_then(|p| p.as_array_mut());
                for p in params.into_iter().flatten() {
                    if p["in"] == "path" {
                        p["schema"] = token.clone();
                    }
                }
            }
        }
    }
    let schemas = &mut doc["components"]["schemas"];
    if schemas["Binding"].is_object() {
        schemas["Binding"]["properties"]["principal"] = token.clone();
        schemas["Binding"]["properties"]["scopes"]["items"] = token.clone();
        schemas["Binding"]["additionalProperties"] = json!(false);
    }
    for (schema, field) in [("ClaimRequest", "worker"), ("WarnRequest", "detail")] {
        if schemas[schema]["properties"][field].is_object() {
            schemas[schema]["properties"][field] = text(true);
        }
    }
    if schemas["Outcome"].is_object() {
        schemas["Outcome"]["additionalProperties"] = json!(false);
    }
    // completed and failed need a result (JSON null is one) and the
    // response digest; unknown carries no result (SPEC §4).
    if schemas["Outcome"].is_object() {
        schemas["Outcome"]["if"] = json!({"properties": {"status": {"enum": ["completed", "failed"]}}, "required": ["status"]});
        schemas["Outcome"]["then"] = json!({
            "required": ["result", "response_sha256"],
            "properties": {"response_sha256": {"type": "string"}}
        });
        schemas["Outcome"]["else"] = json!({"not": {"required": ["result"]}});
        // outcome.error is data, not a label: any text up to the limit.
        schemas["Outcome"]["properties"]["error"] =
            json!({"type": ["string", "null"], "maxLength": 4096});
    }
    // A committed finding carries the evidence; the others carry none.
    if schemas["ReconcileRequest"].is_object() {
        schemas["ReconcileRequest"]["if"] =
            json!({"properties": {"finding": {"const": "committed"}}, "required": ["finding"]});
        schemas["ReconcileRequest"]["then"] = json!({
            "required": ["fingerprint", "binding", "outcome"],
            "properties": {
                "fingerprint": {"type": "string"},
                "binding": {"$ref": "#/components/schemas/Binding"},
                "outcome": {"allOf": [
                    {"$ref": "#/components/schemas/Outcome"},
                    {"properties": {"status": {"enum": ["completed", "failed"]}}}
                ]}
            }
        });
        schemas["ReconcileRequest"]["else"] = json!({
            "properties": {"fingerprint": {"type": "null"}, "binding": {"type": "null"}, "outcome": {"type": "null"}}
        });
    }
    if schemas["ReleaseRequest"]["properties"]["reason"].is_object() {
        schemas["ReleaseRequest"]["properties"]["reason"] =
            json!({"type": ["string", "null"], "enum": ["not_dispatched", "not_committed", null]});
    }
}

/// Every `/v1` operation can also answer the errors that come before its
/// own rules (SPEC §7): a bad path segment or body (400), a missing or
/// unknown token (401), an oversized body (413), a schema violation (422),
/// a storage failure or a refused record (503). Added once here rather than
/// repeated on every route.
fn add_common_errors(doc: &mut serde_json::Value) {
    let common = [
        (
            "400",
            "bad_request: unparsable JSON, not an object, bad path segment",
        ),
        ("401", "unauthorized: missing or unknown token"),
        ("413", "payload_too_large: body over max_body_bytes"),
        (
            "422",
            "invalid_request: the body or a path segment violates the schema",
        ),
        ("503", "record_refused or unavailable"),
    ];
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        let Some(ops) = item.as_object_mut() else {
            continue;
        };
        for op in ops.values_mut() {
            // An empty body reads as `{}` (SPEC §7): revoke and warn need none.
            if (path.ends_with("/revoke") || path.contains("/warnings/"))
                && let Some(body) = op.get_mut("requestBody").and_then(|b| b.as_object_mut())
            {
                body.insert("required".into(), serde_json::Value::Bool(false));
            }
            let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else {
                continue;
            };
            for (status, description) in common {
                responses.entry(status).or_insert_with(|| {
                    serde_json::json!({
                        "description": description,
                        "content": {"application/problem+json": {
                            "schema": {"$ref": "#/components/schemas/Problem"}
                        }}
                    })
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Reply, TenantId, Timestamp, World};

    fn doc() -> Value {
        serde_json::from_slice(&document()).unwrap()
    }

    /// Every key of `value` is a property of schema `name` (following
    /// `$ref`s into nested objects and arrays), and every required property is present.
    fn conforms(doc: &Value, name: &str, value: &Value, path: &str) {
        let schema = &doc["components"]["schemas"][name];
        assert!(schema.is_object(), "no schema {name}");
        let props = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} has no properties"));
        let obj = value
            .as_object()
            .unwrap_or_else(|| panic!("{path} is not an object"));
        for (k, v) in obj {
            let p = props
                .get(k)
                .unwrap_or_else(|| panic!("{path}.{k} is not in schema {name}"));
            check_nested(doc, p, v, &format!("{path}.{k}"));
        }
        for r in schema["required"].as_array().into_iter().flatten() {
            assert!(
                obj.contains_key(r.as_str().unwrap()),
                "{path}: required {r} missing"
            );
        }
    }

    fn check_nested(doc: &Value, prop: &Value, v: &Value, path: &str) {
        if v.is_null() {
            return;
        }
        let reference = prop["$ref"].as_str().or_else(|| {
            prop["oneOf"]
                .as_array()
                .and_then(|alts| alts.iter().find_map(|a| a["$ref"].as_str()))
        });
        if let Some(r) = reference {
            let name = r.rsplit('/').next().unwrap();
            if doc["components"]["schemas"][name]["properties"].is_object() {
                conforms(doc, name, v, path);
            }
        } else if let (Some(items), Some(arr)) = (prop.get("items"), v.as_array()) {
            for (i, x) in arr.iter().enumerate() {
                check_nested(doc, items, x, &format!("{path}[{i}]"));
            }
        }
    }

    #[test]
    fn schemas_match_what_the_core_serializes() {
        let doc = doc();
        assert_eq!(doc["openapi"].as_str().unwrap().get(..3), Some("3.1"));
        let t = TenantId::default_tenant();
        let mut w = World::default();
        let now = Timestamp(1_700_000_000_000);
        let b = binding("p", 0);
        let Reply::Claim(d @ ClaimDecision::Execute(g)) =
            w.execute(&t, &claim("k", 1, b.clone()), now).reply
        else {
            panic!()
        };
        let dj = serde_json::to_value(&d).unwrap();
        let mut execute = dj.clone();
        execute.as_object_mut().unwrap().remove("decision");
        assert_eq!(dj["decision"], "execute");
        for k in ["fence", "lease_expires_at", "attempt"] {
            assert!(
                doc["components"]["schemas"]["ClaimDecision"]
                    .to_string()
                    .contains(k)
            );
        }
        // Foreign evidence is quarantined, then the holder settles.
        w.execute(&t, &settle("k", g.fence, 2, b.clone(), completed(1)), now);
        let Reply::Claim(d2) = w.execute(&t, &claim("k2", 1, b.clone()), now).reply else {
            panic!()
        };
        let Reply::Claim(ClaimDecision::Execute(g2)) = Reply::Claim(d2) else {
            panic!()
        };
        let rc = receipt(
            w.execute(&t, &settle("k2", g2.fence, 1, b.clone(), completed(1)), now)
                .reply,
        );
        conforms(
            &doc,
            "Receipt",
            &serde_json::to_value(&rc).unwrap(),
            "receipt",
        );
        let Reply::Claim(replay) = w.execute(&t, &claim("k2", 1, b.clone()), now).reply else {
            panic!()
        };
        let rj = serde_json::to_value(&replay).unwrap();
        assert_eq!(rj["decision"], "replay");
        conforms(&doc, "Outcome", &rj["outcome"], "replay.outcome");
        conforms(&doc, "Receipt", &rj["receipt"], "replay.receipt");
        for key in ["k", "k2"] {
            let r = w
                .get(&t, &settle_core::Key::new(key).unwrap(), now)
                .unwrap()
                .unwrap();
            let v = serde_json::to_value(r.view()).unwrap();
            conforms(&doc, "Record", &v, key);
        }
        let rec = w
            .get(&t, &settle_core::Key::new("k").unwrap(), now)
            .unwrap()
            .unwrap();
        assert!(!rec.quarantine.is_empty() || rec.status.rank() > 0);
        let Reply::Warning(wa) = w
            .execute(
                &t,
                &settle_core::Command::Warn(settle_core::Warn {
                    task: settle_core::TaskId::new("t").unwrap(),
                    class: settle_core::WarningClass::new("c").unwrap(),
                    detail: None,
                }),
                now,
            )
            .reply
        else {
            panic!()
        };
        conforms(
            &doc,
            "Warning",
            &serde_json::to_value(&wa).unwrap(),
            "warning",
        );
    }

    #[test]
    fn every_route_is_documented() {
        let doc = doc();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/v1/operations/{key}/claim",
            "/v1/operations/{key}/heartbeat",
            "/v1/operations/{key}/dispatch",
            "/v1/operations/{key}/settle",
            "/v1/operations/{key}/release",
            "/v1/operations/{key}/reconcile",
            "/v1/operations/{key}",
            "/v1/principals/{principal}/revoke",
            "/v1/tasks/{task}/warnings/{class}",
            "/v1/tasks/{task}/warnings",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
            "/v1/batch",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
        assert_eq!(paths.len(), 15);
    }
}

#[cfg(test)]
mod common_error_tests {
    #[test]
    fn every_v1_operation_lists_the_common_errors() {
        let doc: serde_json::Value = serde_json::from_slice(&super::document()).unwrap();
        assert!(doc["components"]["schemas"]["Problem"].is_object());
        let mut ops = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for (method, op) in item.as_object().unwrap() {
                ops += 1;
                for status in ["200", "400", "401", "413", "422", "503"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path} lacks {status}"
                    );
                }
            }
        }
        assert_eq!(ops, 11, "all eleven /v1 operations");
    }
}

#[cfg(test)]
mod issue8_tests {
    use serde_json::Value;

    fn doc() -> Value {
        serde_json::from_slice(&super::document()).unwrap()
    }

    #[test]
    fn release_reasons_outcome_rules_and_correlation_ids_are_documented() {
        let doc = doc();
        let s = &doc["components"]["schemas"];
        let reasons = &s["ReleaseRequest"]["properties"]["reason"]["enum"];
        assert!(
            reasons
                .as_array()
                .unwrap()
                .contains(&"not_committed".into()),
            "{reasons}"
        );
        // null is a result: the terminal branch only requires presence.
        let then = &s["Outcome"]["then"];
        assert!(then["properties"]["result"].is_null(), "{then}");
        assert_eq!(s["Outcome"]["else"]["not"]["required"][0], "result");
        // outcome.error is any text up to 4096 (no pattern, empty allowed).
        let error = &s["Outcome"]["properties"]["error"];
        assert!(
            error["pattern"].is_null() && error["minLength"].is_null(),
            "{error}"
        );
        assert_eq!(error["maxLength"], 4096);
        assert!(s["Problem"]["properties"]["correlation_id"].is_object());
        assert!(s["Attempt"]["properties"]["error"].is_object());
    }
}
