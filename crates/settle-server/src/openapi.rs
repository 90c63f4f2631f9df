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
    /// A schema violation.
    #[response(
        status = 422,
        description = "invalid_request: the body or a path segment violates the schema \
                       (`field` names it)",
        content_type = "application/problem+json"
    )]
    Invalid(api::Problem),
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
    }
}

/// The document: every route of `http.rs`, the schemas they name (and the
/// §10 batch envelopes), bearer authentication.
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
        crate::inspect::list,
        crate::inspect::stats,
        crate::http::healthz,
        crate::http::readyz,
        crate::http::metrics,
        crate::http::openapi_json,
        crate::batch::batch,
    ),
    components(schemas(api::Code, api::Refusal, api::Token)),
    modifiers(&BearerAuth, &CrossFieldRules),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as JSON bytes (built once at start).
pub fn document() -> Vec<u8> {
    ApiDoc::openapi()
        .to_json()
        .expect("the OpenAPI document serializes")
        .into_bytes()
}
