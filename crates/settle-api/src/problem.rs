//! RFC 9457 problem details with the `code` field of SPEC §7.

use serde::{Deserialize, Serialize};
use settle_core::{InvalidInput, RefusalCode};
use utoipa::ToSchema;

/// The closed list of error codes of SPEC §7. A client may match on it;
/// a new code is an API change.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// 400: unparsable JSON, a body that is not an object, a bad path segment.
    BadRequest,
    /// 401: missing or unknown token.
    Unauthorized,
    /// 404: unknown key, or no route for this method and path.
    NotFound,
    /// 405: the path exists, the method is not one of its own (`Allow` lists them).
    MethodNotAllowed,
    /// 408: the request body did not arrive within `request_timeout_ms`.
    RequestTimeout,
    /// 413: the body is larger than `max_body_bytes`.
    PayloadTooLarge,
    /// 414: the request target is longer than the server takes.
    UriTooLong,
    /// 422: well-formed JSON that violates the schema (`field` names it).
    InvalidRequest,
    /// 409: the fingerprint differs from the reservation.
    FingerprintMismatch,
    /// 409: the principal or scopes differ from the reservation.
    BindingMismatch,
    /// 409: the binding generation is not current.
    StaleBinding,
    /// 409: the fence does not hold the current lease.
    StaleFence,
    /// 409: the lease expired, was revoked or is within the lease margin.
    LeaseExpired,
    /// 409: the lease was granted for the other purpose.
    WrongPurpose,
    /// 409: terminal evidence disagrees with the canonical outcome (the record is now disputed).
    ResultMismatch,
    /// 409: the lease may have dispatched and must be settled.
    ReceiptRequired,
    /// 409: the task already has 64 warning classes.
    TooManyClasses,
    /// 429: the tenant's request rate is over its quota (`Retry-After` says when to retry, SPEC §12).
    RateLimited,
    /// 429: the claim would create a record past the tenant's `max_records` (SPEC §12).
    QuotaExceeded,
    /// 503: the record cannot be trusted or decoded (SPEC §6.9).
    RecordRefused,
    /// 503: storage failure, overload (with `Retry-After`) or internal error.
    Unavailable,
}

impl Code {
    /// Every code, in the order above.
    pub const ALL: [Code; 21] = [
        Code::BadRequest,
        Code::Unauthorized,
        Code::NotFound,
        Code::MethodNotAllowed,
        Code::RequestTimeout,
        Code::PayloadTooLarge,
        Code::UriTooLong,
        Code::InvalidRequest,
        Code::FingerprintMismatch,
        Code::BindingMismatch,
        Code::StaleBinding,
        Code::StaleFence,
        Code::LeaseExpired,
        Code::WrongPurpose,
        Code::ResultMismatch,
        Code::ReceiptRequired,
        Code::TooManyClasses,
        Code::RateLimited,
        Code::QuotaExceeded,
        Code::RecordRefused,
        Code::Unavailable,
    ];

    /// The code as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad_request",
            Code::Unauthorized => "unauthorized",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::RequestTimeout => "request_timeout",
            Code::PayloadTooLarge => "payload_too_large",
            Code::UriTooLong => "uri_too_long",
            Code::InvalidRequest => "invalid_request",
            Code::FingerprintMismatch => "fingerprint_mismatch",
            Code::BindingMismatch => "binding_mismatch",
            Code::StaleBinding => "stale_binding",
            Code::StaleFence => "stale_fence",
            Code::LeaseExpired => "lease_expired",
            Code::WrongPurpose => "wrong_purpose",
            Code::ResultMismatch => "result_mismatch",
            Code::ReceiptRequired => "receipt_required",
            Code::TooManyClasses => "too_many_classes",
            Code::RateLimited => "rate_limited",
            Code::QuotaExceeded => "quota_exceeded",
            Code::RecordRefused => "record_refused",
            Code::Unavailable => "unavailable",
        }
    }

    /// The HTTP status that carries this code (SPEC §7).
    pub fn http_status(self) -> u16 {
        match self {
            Code::BadRequest => 400,
            Code::Unauthorized => 401,
            Code::NotFound => 404,
            Code::MethodNotAllowed => 405,
            Code::RequestTimeout => 408,
            Code::PayloadTooLarge => 413,
            Code::UriTooLong => 414,
            Code::InvalidRequest => 422,
            Code::RateLimited | Code::QuotaExceeded => 429,
            Code::RecordRefused | Code::Unavailable => 503,
            Code::FingerprintMismatch
            | Code::BindingMismatch
            | Code::StaleBinding
            | Code::StaleFence
            | Code::LeaseExpired
            | Code::WrongPurpose
            | Code::ResultMismatch
            | Code::ReceiptRequired
            | Code::TooManyClasses => 409,
        }
    }

    /// The problem's `title`.
    pub fn title(self) -> &'static str {
        match self {
            Code::BadRequest => "Bad request",
            Code::Unauthorized => "Unauthorized",
            Code::NotFound => "Not found",
            Code::MethodNotAllowed => "Method not allowed",
            Code::RequestTimeout => "Request timeout",
            Code::PayloadTooLarge => "Payload too large",
            Code::UriTooLong => "URI too long",
            Code::InvalidRequest => "Invalid request",
            Code::FingerprintMismatch => "Fingerprint mismatch",
            Code::BindingMismatch => "Binding mismatch",
            Code::StaleBinding => "Stale binding",
            Code::StaleFence => "Stale fence",
            Code::LeaseExpired => "Lease expired",
            Code::WrongPurpose => "Wrong lease purpose",
            Code::ResultMismatch => "Result mismatch",
            Code::ReceiptRequired => "Receipt required",
            Code::TooManyClasses => "Too many warning classes",
            Code::RateLimited => "Rate limited",
            Code::QuotaExceeded => "Quota exceeded",
            Code::RecordRefused => "Record refused",
            Code::Unavailable => "Service unavailable",
        }
    }

    /// The problem's `type` URI.
    pub fn type_uri(self) -> String {
        format!("urn:settle:problem:{}", self.as_str())
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer (RFC 9457 `application/problem+json`) with the `code`
/// of SPEC §7; `field` names the offending field of a 422, and
/// `correlation_id` the server log line that holds the cause of a 503.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// `urn:settle:problem:<code>`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short summary of the code, the same for every problem of that code.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, for a human.
    pub detail: String,
    /// The error code of SPEC §7; clients match on it.
    pub code: Code,
    /// The offending field (422), e.g. `binding.generation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Names the server log line that holds the cause (503 `unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
}

impl Problem {
    /// A problem with `code`'s status, title and type.
    pub fn new(code: Code, detail: impl Into<String>) -> Problem {
        Problem {
            type_uri: code.type_uri(),
            title: code.title().to_string(),
            status: code.http_status(),
            detail: detail.into(),
            code,
            field: None,
            correlation_id: None,
        }
    }

    /// A 422 naming `field` (empty: the body as a whole). A reason that
    /// already starts with the field's name is not prefixed again.
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Problem {
        let field = field.into();
        let reason = reason.to_string();
        let detail =
            if field.is_empty() || reason.split(':').next().is_some_and(|f| field.ends_with(f)) {
                reason
            } else {
                format!("{field}: {reason}")
            };
        let mut p = Problem::new(Code::InvalidRequest, detail);
        p.field = (!field.is_empty()).then_some(field);
        p
    }

    /// A protocol refusal of the rules: 409, or 404/422/503 for the few
    /// that are not conflicts. `generation_exhausted` is an out-of-range
    /// request (SPEC §2: "→ 422") and carries the schema error's code,
    /// naming the principal.
    pub fn refusal(code: RefusalCode) -> Problem {
        let wire = match code {
            RefusalCode::FingerprintMismatch => Code::FingerprintMismatch,
            RefusalCode::BindingMismatch => Code::BindingMismatch,
            RefusalCode::StaleBinding => Code::StaleBinding,
            RefusalCode::StaleFence => Code::StaleFence,
            RefusalCode::LeaseExpired => Code::LeaseExpired,
            RefusalCode::WrongPurpose => Code::WrongPurpose,
            RefusalCode::ResultMismatch => Code::ResultMismatch,
            RefusalCode::ReceiptRequired => Code::ReceiptRequired,
            RefusalCode::TooManyClasses => Code::TooManyClasses,
            RefusalCode::NotFound => Code::NotFound,
            RefusalCode::RecordRefused => Code::RecordRefused,
            RefusalCode::GenerationExhausted => Code::InvalidRequest,
        };
        let mut p = Problem::new(wire, code.to_string());
        if code == RefusalCode::GenerationExhausted {
            p.field = Some("principal".into());
        }
        p
    }
}

impl From<InvalidInput> for Problem {
    fn from(e: InvalidInput) -> Problem {
        Problem::invalid(e.field, e.reason)
    }
}

impl From<RefusalCode> for Problem {
    fn from(c: RefusalCode) -> Problem {
        Problem::refusal(c)
    }
}

/// A refusal code as kept on a record (quarantine `reason`, observation
/// `code`): the codes of [`RefusalCode`], as the wire spells them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The fingerprint differs from the reservation's.
    FingerprintMismatch,
    /// The principal or scopes differ from the reservation's.
    BindingMismatch,
    /// The binding generation is older than the principal's or the reservation's.
    StaleBinding,
    /// The fence does not hold the current lease.
    StaleFence,
    /// The lease expired, was revoked, or had less than the lease margin left.
    LeaseExpired,
    /// The lease was granted for the other purpose (execute vs reconcile).
    WrongPurpose,
    /// Terminal evidence disagreed with the canonical outcome (the record is disputed).
    ResultMismatch,
    /// The lease may have dispatched: it may only end with a receipt.
    ReceiptRequired,
    /// The task already has 64 warning classes.
    TooManyClasses,
    /// No record for this key.
    NotFound,
    /// The record cannot be trusted (a receipt dated in the future, SPEC §6.9).
    RecordRefused,
    /// The principal's generation cannot be raised further.
    GenerationExhausted,
}

impl From<RefusalCode> for Refusal {
    fn from(c: RefusalCode) -> Refusal {
        match c {
            RefusalCode::FingerprintMismatch => Refusal::FingerprintMismatch,
            RefusalCode::BindingMismatch => Refusal::BindingMismatch,
            RefusalCode::StaleBinding => Refusal::StaleBinding,
            RefusalCode::StaleFence => Refusal::StaleFence,
            RefusalCode::LeaseExpired => Refusal::LeaseExpired,
            RefusalCode::WrongPurpose => Refusal::WrongPurpose,
            RefusalCode::ResultMismatch => Refusal::ResultMismatch,
            RefusalCode::ReceiptRequired => Refusal::ReceiptRequired,
            RefusalCode::TooManyClasses => Refusal::TooManyClasses,
            RefusalCode::NotFound => Refusal::NotFound,
            RefusalCode::RecordRefused => Refusal::RecordRefused,
            RefusalCode::GenerationExhausted => Refusal::GenerationExhausted,
        }
    }
}

impl From<Refusal> for RefusalCode {
    fn from(c: Refusal) -> RefusalCode {
        match c {
            Refusal::FingerprintMismatch => RefusalCode::FingerprintMismatch,
            Refusal::BindingMismatch => RefusalCode::BindingMismatch,
            Refusal::StaleBinding => RefusalCode::StaleBinding,
            Refusal::StaleFence => RefusalCode::StaleFence,
            Refusal::LeaseExpired => RefusalCode::LeaseExpired,
            Refusal::WrongPurpose => RefusalCode::WrongPurpose,
            Refusal::ResultMismatch => RefusalCode::ResultMismatch,
            Refusal::ReceiptRequired => RefusalCode::ReceiptRequired,
            Refusal::TooManyClasses => RefusalCode::TooManyClasses,
            Refusal::NotFound => RefusalCode::NotFound,
            Refusal::RecordRefused => RefusalCode::RecordRefused,
            Refusal::GenerationExhausted => RefusalCode::GenerationExhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_spell_like_serde_and_map_to_their_status() {
        for c in Code::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
            assert!(matches!(c.http_status(), 400..=599));
        }
        for c in RefusalCode::ALL {
            // The record keeps the core's spelling of every refusal.
            assert_eq!(serde_json::to_value(Refusal::from(c)).unwrap(), c.code());
            assert_eq!(RefusalCode::from(Refusal::from(c)), c);
        }
    }

    #[test]
    fn refusals_become_problems_with_the_specs_status() {
        let p = Problem::refusal(RefusalCode::StaleFence);
        assert_eq!((p.status, p.code), (409, Code::StaleFence));
        assert_eq!(Problem::refusal(RefusalCode::NotFound).status, 404);
        assert_eq!(Problem::refusal(RefusalCode::RecordRefused).status, 503);
        let p = Problem::refusal(RefusalCode::GenerationExhausted);
        assert_eq!(
            (p.status, p.code, p.field.as_deref()),
            (422, Code::InvalidRequest, Some("principal"))
        );
    }

    #[test]
    fn invalid_does_not_repeat_the_field() {
        let p = Problem::invalid("lease_ms", "lease_ms: too short");
        assert_eq!(p.detail, "lease_ms: too short");
        let p = Problem::invalid("fence", "is required");
        assert_eq!(p.detail, "fence: is required");
        assert_eq!(p.field.as_deref(), Some("fence"));
        assert_eq!(Problem::invalid("", "missing field").field, None);
    }
}
