//! RFC 9457 problem details with the extra `code` field of SPEC §7.

use axum::body::Body;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use settle_core::{InvalidInput, RefusalCode};
use settle_ledger::StoreError;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: HTTP status, the spec's `code`, a human detail and,
/// for 422, the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    pub field: Option<String>,
    /// Names the server log line that holds the cause of a 503 (SPEC §7).
    pub correlation_id: Option<String>,
    /// Whole seconds for the `Retry-After` header (an overloaded store).
    pub retry_after_s: Option<u64>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
}

/// A new correlation id: unique within this process (a counter) and, with
/// a random per-process prefix, across restarts. It carries nothing about
/// the request, the tenant or the cause.
pub fn correlation_id() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        h.finish() as u32
    });
    format!("{prefix:08x}-{:06x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            detail: detail.into(),
            field: None,
            correlation_id: None,
            retry_after_s: None,
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
            correlation_id: None,
            retry_after_s: None,
        }
    }
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }
    /// A storage failure as a client may see it (SPEC §7): 503
    /// `unavailable` with a generic `detail` and a `correlation_id`; the
    /// cause (which may hold another tenant's data, e.g. a PostgreSQL
    /// DETAIL with row values) stays in the server log under that id,
    /// which the caller must write. An overload carries `Retry-After`.
    pub fn store_failure(e: &StoreError, correlation_id: String) -> Problem {
        let (detail, retry_after_s) = match e {
            StoreError::Overloaded { retry_after_ms } => {
                let s = retry_after_ms.div_ceil(1000).max(1);
                (
                    format!("the store is overloaded; nothing was written; retry after {s} s"),
                    Some(s),
                )
            }
            StoreError::InDoubt(_) => (
                "the store could not establish whether the write committed; retry the same \
                 call: the retry learns the outcome from the record"
                    .to_string(),
                None,
            ),
            _ => (
                format!(
                    "storage failure; nothing was acknowledged (the server log has the cause \
                     under correlation_id {correlation_id})"
                ),
                None,
            ),
        };
        let mut p = Problem::unavailable(detail);
        p.correlation_id = Some(correlation_id);
        p.retry_after_s = retry_after_s;
        p
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

    /// The problem object's JSON (the body of its response, and of a batch slot).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&Wire {
            kind: format!("urn:settle:problem:{}", self.code),
            title: self.title(),
            status: self.status.as_u16(),
            detail: &self.detail,
            code: self.code,
            field: self.field.as_deref(),
            correlation_id: self.correlation_id.as_deref(),
        })
        .expect("a problem always serializes")
    }

    pub fn into_response(self) -> Response {
        let mut resp = Response::new(Body::from(self.to_json()));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
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
