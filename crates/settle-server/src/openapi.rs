//! `/openapi.json`: the OpenAPI 3.1 document, generated with utoipa from
//! the `settle-api` types (their `ToSchema` derives) and the routes'
//! `#[utoipa::path]` annotations in `http.rs`. Nothing here mirrors a
//! type: a changed wire type changes the document, and the tests in
//! `tests/openapi.rs` check the served document against real answers.

use settle_api as api;
use settle_api::CrossFieldRules;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi};

/// The errors every `/v1` operation can answer before its own rules run
/// (SPEC §7): listed once here and named in every route's `responses`.
#[derive(IntoResponses)]
pub enum V1Errors {
    /// Unparsable JSON, a body that is not an object, a bad path segment.
    #[response(
        status = 400,
        description = "bad_request: unparsable JSON, not an object, bad path segment",
        content_type = "application/problem+json"
    )]
    BadRequest(api::Problem),
    /// A missing or unknown token.
    #[response(
        status = 401,
        description = "unauthorized: missing or unknown token",
        content_type = "application/problem+json"
    )]
    Unauthorized(api::Problem),
    /// The path exists; the method is not one of its own.
    #[response(
        status = 405,
        description = "method_not_allowed: the path takes other methods (`Allow` lists them)",
        content_type = "application/problem+json"
    )]
    MethodNotAllowed(api::Problem),
    /// The body did not arrive in time.
    #[response(
        status = 408,
        description = "request_timeout: the body did not arrive within request_timeout_ms",
        content_type = "application/problem+json"
    )]
    RequestTimeout(api::Problem),
    /// The body is too large.
    #[response(
        status = 413,
        description = "payload_too_large: body over max_body_bytes",
        content_type = "application/problem+json"
    )]
    PayloadTooLarge(api::Problem),
    /// The request target is too long.
    #[response(
        status = 414,
        description = "uri_too_long: the request target is over 8192 bytes",
        content_type = "application/problem+json"
    )]
    UriTooLong(api::Problem),
    /// A schema violation.
    #[response(
        status = 422,
        description = "invalid_request: the body or a path segment violates the schema \
                       (`field` names it)",
        content_type = "application/problem+json"
    )]
    Invalid(api::Problem),
    /// A tenant's quota (SPEC §12).
    #[response(
        status = 429,
        description = "rate_limited: the tenant's rate_per_s/burst is spent (with `Retry-After`); \
                       quota_exceeded: a claim would create a record past the tenant's max_records",
        headers(("Retry-After" = u64, description = "whole seconds until a request is admitted (rate_limited)")),
        content_type = "application/problem+json"
    )]
    TooManyRequests(api::Problem),
    /// A storage failure or a refused record.
    #[response(
        status = 503,
        description = "record_refused or unavailable (with `correlation_id`; an overload \
                       carries `Retry-After`)",
        content_type = "application/problem+json"
    )]
    Unavailable(api::Problem),
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An admin token: its SHA-256 is one of the server's \
                         `[admin] token_sha256` (a tenant's token is refused, 401). Not \
                         needed while authentication is off (loopback, no tenants, no `[admin]`).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document: every route of `http.rs` and `admin.rs`, the schemas
/// they name (and the §10 batch envelopes), bearer authentication (a
/// tenant's token, or an admin token for `/v1/admin/…`).
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
        crate::http::principal,
        crate::http::revoke,
        crate::http::warn,
        crate::http::warnings,
        crate::inspect::list,
        crate::inspect::stats,
        crate::http::healthz,
        crate::http::readyz,
        crate::http::metrics,
        crate::http::openapi_json,
        crate::batch::batch,
        crate::admin::export,
    ),
    components(schemas(api::Code, api::Refusal, api::Token)),
    modifiers(&BearerAuth, &CrossFieldRules),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as JSON bytes (built once at start), stating what this
/// server enforces: its `lease_margin_ms` as the lower bound of `lease_ms`.
pub fn document(lease_margin_ms: u64) -> Vec<u8> {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
    enforce(&mut doc, lease_margin_ms);
    let mut out = serde_json::to_vec(&doc).expect("the OpenAPI document serializes");
    out.push(b'\n');
    out
}

/// The `status` filter of `GET /v1/operations`: one status or several,
/// separated by commas (SPEC §9).
const STATUS_LIST: &str = "^(pending|running|unknown|conflict|failed|completed)(,(pending|running|unknown|conflict|failed|completed))*$";

/// Where the derived document says less than the server enforces (or
/// more than it accepts), the document is made to say exactly that: a
/// schema-valid request is never refused for a rule the document hides
/// (schemathesis' `--checks all`, docs/testing.md).
fn enforce(doc: &mut serde_json::Value, lease_margin_ms: u64) {
    use serde_json::json;
    let schemas = &mut doc["components"]["schemas"];
    // A lease must outlast the margin a settlement needs (SPEC §2).
    for s in ["ClaimRequest", "HeartbeatRequest"] {
        let lease = &mut schemas[s]["properties"]["lease_ms"];
        if lease.is_object() {
            lease["minimum"] = json!(lease_margin_ms + 1);
        }
    }
    // A call that is not one answers in its own slot (SPEC §10): the
    // envelope takes any value as a call.
    // The envelope has one member (serde refuses others: 422).
    schemas["BatchRequest"]["additionalProperties"] = json!(false);
    schemas["BatchRequest"]["properties"]["calls"]["items"] = json!({
        "anyOf": [{"$ref": "#/components/schemas/BatchCall"}, {}],
        "description": "A `BatchCall`; anything else answers 400 or 422 in its own slot.",
    });
    let paths = &mut doc["paths"];
    // An empty body is `{}`; JSON `null` is not an object (400).
    for (path, schema) in [
        ("/v1/principals/{principal}/revoke", "EmptyRequest"),
        ("/v1/tasks/{task}/warnings/{class}", "WarnRequest"),
    ] {
        let body = &mut paths[path]["post"]["requestBody"];
        body["required"] = json!(false);
        body["content"]["application/json"]["schema"] =
            json!({"$ref": format!("#/components/schemas/{schema}")});
    }
    if let Some(params) = paths["/v1/operations"]["get"]["parameters"].as_array_mut() {
        for p in params.iter_mut().filter(|p| p["name"] == "status") {
            p["schema"]["pattern"] = json!(STATUS_LIST);
        }
    }
}
