//! RFC 9457 problem details with the extra `code` field of SPEC §7.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use settle_core::{InvalidInput, RefusalCode};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: HTTP status, the spec's `code`, a human detail and,
/// for 422, the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    pub field: Option<String>,
}

#[derive(Serialize)]
struct Wire<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'static str,
    status: u16,
    detail: &'a str,
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            detail: detail.into(),
            field: None,
        }
    }
    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }
    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }
    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not_found", detail)
    }
    pub fn payload_too_large(limit: usize) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than max_body_bytes ({limit} bytes)"),
        )
    }
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Problem {
        let field = field.into();
        Problem {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_request",
            detail: {
                // Validation errors already start with a field name; don't repeat it.
                let reason = reason.to_string();
                if field.is_empty() || reason.split(':').next().is_some_and(|f| field.ends_with(f))
                {
                    reason
                } else {
                    format!("{field}: {reason}")
                }
            },
            field: (!field.is_empty()).then_some(field),
        }
    }
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }
    /// A protocol refusal of the rules (409, or 404/422/503 for the few that are not conflicts).
    pub fn refusal(code: RefusalCode) -> Problem {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        // `generation_exhausted` is an out-of-range request (SPEC §2: "→ 422"),
        // so it carries the schema error's code.
        let wire_code = match code {
            RefusalCode::GenerationExhausted => "invalid_request",
            c => c.code(),
        };
        let mut p = Problem::new(status, wire_code, code.to_string());
        if code == RefusalCode::GenerationExhausted {
            p.field = Some("principal".into());
        }
        p
    }

    fn title(&self) -> &'static str {
        match self.code {
            "bad_request" => "Bad request",
            "unauthorized" => "Unauthorized",
            "not_found" => "Not found",
            "payload_too_large" => "Payload too large",
            "invalid_request" => "Invalid request",
            "unavailable" => "Service unavailable",
            "record_refused" => "Record refused",
            "fingerprint_mismatch" => "Fingerprint mismatch",
            "binding_mismatch" => "Binding mismatch",
            "stale_binding" => "Stale binding",
            "stale_fence" => "Stale fence",
            "lease_expired" => "Lease expired",
            "wrong_purpose" => "Wrong lease purpose",
            "result_mismatch" => "Result mismatch",
            "receipt_required" => "Receipt required",
            "too_many_classes" => "Too many warning classes",
            "request_timeout" => "Request timeout",
            _ => "Error",
        }
    }

    pub fn into_response(self) -> Response {
        let body = serde_json::to_vec(&Wire {
            kind: format!("urn:settle:problem:{}", self.code),
            title: self.title(),
            status: self.status.as_u16(),
            detail: &self.detail,
            code: self.code,
            field: self.field.as_deref(),
        })
        .expect("a problem always serializes");
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl From<InvalidInput> for Problem {
    fn from(e: InvalidInput) -> Problem {
        Problem::invalid(e.field, e.reason)
    }
}
