//! The two cross-field rules of SPEC §4 that JSON Schema can state and a
//! serde derive cannot: which `outcome` fields go with which `status`, and
//! which `reconcile` fields go with which `finding`. They are added to the
//! derived schemas of [`Outcome`](crate::Outcome) and
//! [`ReconcileRequest`](crate::ReconcileRequest), so generated clients and
//! fuzzers send what the server accepts.

use serde_json::{Value, json};
use utoipa::Modify;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{OpenApi, RefOr};

/// A utoipa modifier adding the cross-field rules (`if`/`then`/`else`) to
/// the `Outcome` and `ReconcileRequest` schemas of a document.
pub struct CrossFieldRules;

/// `completed` and `failed` need a result (JSON `null` is one) and the
/// response digest; `unknown` carries no result.
fn outcome_rules() -> [(&'static str, Value); 3] {
    [
        (
            "if",
            json!({"properties": {"status": {"enum": ["completed", "failed"]}}, "required": ["status"]}),
        ),
        (
            "then",
            json!({"required": ["result", "response_sha256"],
                   "properties": {"response_sha256": {"type": "string"}}}),
        ),
        ("else", json!({"not": {"required": ["result"]}})),
    ]
}

/// A committed finding carries the evidence, with a terminal outcome; the
/// other findings carry none.
fn reconcile_rules() -> [(&'static str, Value); 3] {
    [
        (
            "if",
            json!({"properties": {"finding": {"const": "committed"}}, "required": ["finding"]}),
        ),
        (
            "then",
            json!({
                "required": ["fingerprint", "binding", "outcome"],
                "properties": {
                    "fingerprint": {"type": "string"},
                    "binding": {"$ref": "#/components/schemas/Binding"},
                    "outcome": {"allOf": [
                        {"$ref": "#/components/schemas/Outcome"},
                        {"properties": {"status": {"enum": ["completed", "failed"]}}}
                    ]}
                }
            }),
        ),
        (
            "else",
            json!({"properties": {"fingerprint": {"type": "null"}, "binding": {"type": "null"},
                                  "outcome": {"type": "null"}}}),
        ),
    ]
}

impl Modify for CrossFieldRules {
    fn modify(&self, openapi: &mut OpenApi) {
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        for (name, rules) in [
            ("Outcome", outcome_rules()),
            ("ReconcileRequest", reconcile_rules()),
        ] {
            if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(name) {
                let ext = o.extensions.get_or_insert_with(Default::default);
                for (k, v) in rules {
                    ext.insert(k.to_string(), v);
                }
            }
        }
    }
}
