//! Error answers: the `settle-api` problem body (RFC 9457 with the `code`
//! of SPEC §7) plus what only the HTTP response carries (`Retry-After`).

use std::hash::{BuildHasher, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use settle_api::Code;
use settle_core::{InvalidInput, RefusalCode};
use settle_ledger::StoreError;

pub use settle_api::PROBLEM_JSON;

/// An error answer: the problem body the client reads, and the seconds of
/// `Retry-After` for an overloaded store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The `application/problem+json` body (boxed: errors travel in
    /// `Result`s on every request path and should stay small).
    pub body: Box<settle_api::Problem>,
    /// Whole seconds for the `Retry-After` header (an overloaded store).
    pub retry_after_s: Option<u64>,
}

impl Deref for Problem {
    type Target = settle_api::Problem;
    fn deref(&self) -> &settle_api::Problem {
        &self.body
    }
}
impl DerefMut for Problem {
    fn deref_mut(&mut self) -> &mut settle_api::Problem {
        &mut self.body
    }
}

impl From<settle_api::Problem> for Problem {
    fn from(body: settle_api::Problem) -> Problem {
        Problem {
            body: Box::new(body),
            retry_after_s: None,
        }
    }
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
    /// A problem with `code`'s status and title.
    pub fn new(code: Code, detail: impl Into<String>) -> Problem {
        settle_api::Problem::new(code, detail).into()
    }
    /// 400 `bad_request`.
    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(Code::BadRequest, detail)
    }
    /// 401 `unauthorized`.
    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(Code::Unauthorized, detail)
    }
    /// 404 `not_found`.
    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(Code::NotFound, detail)
    }
    /// 408 `request_timeout`.
    pub fn request_timeout() -> Problem {
        Problem::new(
            Code::RequestTimeout,
            "the request body did not arrive within request_timeout_ms",
        )
    }
    /// 413 `payload_too_large`.
    pub fn payload_too_large(limit: usize) -> Problem {
        Problem::new(
            Code::PayloadTooLarge,
            format!("the request body is larger than max_body_bytes ({limit} bytes)"),
        )
    }
    /// 422 `invalid_request` naming `field` (empty: the body as a whole).
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Problem {
        settle_api::Problem::invalid(field, reason).into()
    }
    /// 429 `rate_limited`, with `Retry-After` rounded up to whole seconds.
    pub fn rate_limited(wait: std::time::Duration) -> Problem {
        let s = wait.as_millis().div_ceil(1000).max(1) as u64;
        let mut p = Problem::new(
            Code::RateLimited,
            format!(
                "this tenant's request rate is over its quota (rate_per_s, burst); retry after {s} s"
            ),
        );
        p.retry_after_s = Some(s);
        p
    }
    /// 429 `quota_exceeded`: the claim would create a record past `max`.
    pub fn quota_exceeded(max: u64) -> Problem {
        Problem::new(
            Code::QuotaExceeded,
            format!(
                "this tenant holds its max_records ({max}) records: a claim on a new key is \
                 refused until records are collected; existing keys keep working"
            ),
        )
    }
    /// 503 `unavailable`.
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        Problem::new(Code::Unavailable, detail)
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
        settle_api::Problem::refusal(code).into()
    }

    /// The HTTP status of the answer.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.body.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The problem object's JSON (the body of its response, and of a batch slot).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.body).expect("a problem always serializes")
    }

    /// The problem+json response, with `Retry-After` and `WWW-Authenticate` where due.
    pub fn into_response(self) -> Response {
        let status = self.status_code();
        let mut body = self.to_json();
        body.push(b'\n');
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if status == StatusCode::UNAUTHORIZED {
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
