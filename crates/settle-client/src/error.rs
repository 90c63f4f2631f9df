//! What can go wrong with a call: no answer (transport), or an answer that
//! says no (an HTTP problem, SPEC §7).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use hyper::body::Bytes;
use settle_api::{Code, Problem};
use settle_core::{InvalidInput, RefusalCode};

/// A boxed transport error (hyper, an I/O error).
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a call did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server URL cannot be used.
    #[error("invalid server URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The request could not be built (a token that is not a header
    /// value, a body that does not serialize); nothing was sent.
    #[error("invalid request: {0}")]
    Request(String),
    /// The TLS settings cannot be used (from
    /// [`ClientBuilder::build`](crate::ClientBuilder::build)): a root
    /// certificate that is not PEM or that rustls refuses, or no trusted
    /// root at all; nothing was sent.
    #[error("invalid TLS settings: {0}")]
    Tls(String),
    /// No connection could be made (refused, unknown host, connect
    /// timeout); nothing was sent.
    #[error("cannot connect to {authority}: {}", root_cause(.source.as_ref()))]
    Connect {
        /// `host:port` of the server.
        authority: String,
        /// The cause.
        source: BoxError,
    },
    /// No complete answer within the request timeout. The server may
    /// have acted on the request: retry the same call (the protocol makes
    /// that safe), never a different one.
    #[error("no answer from {authority} within {after:?}")]
    Timeout {
        /// `host:port` of the server.
        authority: String,
        /// The request timeout.
        after: Duration,
    },
    /// The connection broke before a complete answer. As with a timeout,
    /// the server may have acted on the request.
    #[error("connection to {authority} failed: {}", root_cause(.source.as_ref()))]
    Transport {
        /// `host:port` of the server.
        authority: String,
        /// The cause.
        source: BoxError,
    },
    /// The server answered with an error status (a problem+json body).
    #[error(transparent)]
    Http(Box<HttpError>),
    /// A success status with a body that is not the expected answer (a
    /// server of another version, or something else at that address).
    #[error("unexpected answer (HTTP {status}): {reason}")]
    UnexpectedBody {
        /// The HTTP status.
        status: u16,
        /// Why the body does not fit.
        reason: String,
    },
}

/// Whether a rustls error is anywhere in `e`'s chain, looking inside
/// `io::Error`s too (their `source()` skips the error they wrap).
fn has_rustls_error(e: &(dyn StdError + 'static)) -> bool {
    e.is::<tokio_rustls::rustls::Error>()
        || e.downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| has_rustls_error(inner))
        || e.source().is_some_and(has_rustls_error)
}

/// The innermost message of an error chain (hyper wraps the I/O error
/// that says what happened in layers that do not).
fn root_cause(e: &(dyn StdError + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

impl ClientError {
    /// The connection failed in its TLS handshake (a certificate the
    /// trusted roots do not vouch for, a name it does not hold, an alert
    /// from the server): nothing was sent. What to fix is the trust or the
    /// URL, not the network.
    pub fn is_tls_failure(&self) -> bool {
        let (ClientError::Connect { source, .. } | ClientError::Transport { source, .. }) = self
        else {
            return false;
        };
        has_rustls_error(source.as_ref())
    }

    /// No answer arrived: connect, timeout or transport. Only a connect
    /// error proves that the server never saw the request.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Timeout { .. }
                | ClientError::Transport { .. }
        )
    }

    /// Worth retrying the same call after a pause (SPEC §11 step 7): no
    /// answer, or 503 (storage failure, overload, in-doubt commit).
    pub fn is_retryable(&self) -> bool {
        self.is_transport() || self.status() == Some(503)
    }

    /// The HTTP error, when the server answered with one.
    pub fn http(&self) -> Option<&HttpError> {
        match self {
            ClientError::Http(h) => Some(h),
            _ => None,
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        self.http().map(|h| h.status)
    }

    /// The problem's `code` of an error answer.
    pub fn code(&self) -> Option<Code> {
        self.http().and_then(HttpError::code)
    }

    /// The server's `Retry-After` hint (an overloaded store).
    pub fn retry_after(&self) -> Option<Duration> {
        self.http().and_then(|h| h.retry_after)
    }

    /// The protocol refusal this answer carries, as the core names it
    /// (the same value `Ledger` calls return in `LedgerError::Refused`),
    /// so a worker treats both transports alike.
    pub fn refusal(&self) -> Option<RefusalCode> {
        self.http().and_then(HttpError::refusal)
    }

    /// A 422: what the server found invalid, as the core names it.
    pub fn invalid_input(&self) -> Option<InvalidInput> {
        let p = self.http()?.problem.as_ref()?;
        (p.code == Code::InvalidRequest)
            .then(|| InvalidInput::new(p.field.clone().unwrap_or_default(), p.detail.clone()))
    }
}

/// An error answer: the status, the problem the server sent (`None` when
/// the body is not a problem of this API, e.g. a proxy's 502 page), the
/// `Retry-After` hint and the body as received.
#[derive(Debug, Clone)]
pub struct HttpError {
    /// The HTTP status.
    pub status: u16,
    /// The problem+json body, parsed.
    pub problem: Option<Problem>,
    /// `Retry-After`, in whole seconds on the wire.
    pub retry_after: Option<Duration>,
    /// The body exactly as received.
    pub body: Bytes,
}

impl HttpError {
    /// The problem's `code`.
    pub fn code(&self) -> Option<Code> {
        self.problem.as_ref().map(|p| p.code)
    }

    /// The problem's `detail` (empty without a problem body).
    pub fn detail(&self) -> &str {
        self.problem.as_ref().map_or("", |p| p.detail.as_str())
    }

    /// The id under which the server logged the cause of a 503.
    pub fn correlation_id(&self) -> Option<&str> {
        self.problem.as_ref()?.correlation_id.as_deref()
    }

    /// The protocol refusal this answer carries, as the core names it.
    pub fn refusal(&self) -> Option<RefusalCode> {
        Some(match self.code()? {
            Code::FingerprintMismatch => RefusalCode::FingerprintMismatch,
            Code::BindingMismatch => RefusalCode::BindingMismatch,
            Code::StaleBinding => RefusalCode::StaleBinding,
            Code::StaleFence => RefusalCode::StaleFence,
            Code::LeaseExpired => RefusalCode::LeaseExpired,
            Code::WrongPurpose => RefusalCode::WrongPurpose,
            Code::ResultMismatch => RefusalCode::ResultMismatch,
            Code::ReceiptRequired => RefusalCode::ReceiptRequired,
            Code::TooManyClasses => RefusalCode::TooManyClasses,
            Code::NotFound => RefusalCode::NotFound,
            Code::RecordRefused => RefusalCode::RecordRefused,
            Code::BadRequest
            | Code::Unauthorized
            | Code::MethodNotAllowed
            | Code::RequestTimeout
            | Code::PayloadTooLarge
            | Code::UriTooLong
            | Code::InvalidRequest
            | Code::RateLimited
            | Code::QuotaExceeded
            | Code::Unavailable => return None,
        })
    }
}

/// One line: the kind of failure, the status and code once, the detail:
/// `refused (409 stale_fence): the fence does not hold the current lease`.
impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.status {
            409 => "refused",
            s if s >= 500 => "unavailable",
            _ => "rejected",
        };
        let Some(p) = &self.problem else {
            return write!(
                f,
                "{kind} (HTTP {}): the answer is not a problem of the settle API",
                self.status
            );
        };
        let code = p.code.as_str();
        // A detail that starts with its own code says it once.
        let detail = p
            .detail
            .strip_prefix(code)
            .and_then(|d| d.strip_prefix(": "))
            .unwrap_or(&p.detail);
        write!(f, "{kind} ({} {code}): {detail}", self.status)?;
        if let Some(id) = &p.correlation_id
            && !detail.contains(id.as_str())
        {
            write!(f, " (correlation_id {id})")?;
        }
        // Said once: the server's detail may already say it.
        if let Some(after) = self.retry_after
            && !detail.contains("retry after")
        {
            write!(f, "; retry after {} s", after.as_secs())?;
        }
        Ok(())
    }
}

impl StdError for HttpError {}

impl From<HttpError> for ClientError {
    fn from(e: HttpError) -> ClientError {
        ClientError::Http(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(status: u16, problem: Option<Problem>) -> HttpError {
        HttpError {
            status,
            problem,
            retry_after: None,
            body: Bytes::new(),
        }
    }

    #[test]
    fn an_error_line_names_the_code_once() {
        let p = Problem::new(
            Code::StaleFence,
            "stale_fence: the fence does not hold the current lease",
        );
        assert_eq!(
            error(409, Some(p)).to_string(),
            "refused (409 stale_fence): the fence does not hold the current lease"
        );
        let mut p = Problem::new(Code::Unavailable, "storage failure");
        p.correlation_id = Some("ab-1".into());
        let mut e = error(503, Some(p));
        e.retry_after = Some(Duration::from_secs(2));
        assert_eq!(
            e.to_string(),
            "unavailable (503 unavailable): storage failure (correlation_id ab-1); retry after 2 s"
        );
        // The rate limiter's detail says when already: once, not twice.
        let p = Problem::new(
            Code::RateLimited,
            "this tenant's request rate is over its quota (rate_per_s, burst); retry after 1 s",
        );
        let mut e = error(429, Some(p));
        e.retry_after = Some(Duration::from_secs(1));
        assert_eq!(e.to_string().matches("retry after").count(), 1, "{e}");
        assert_eq!(
            error(502, None).to_string(),
            "unavailable (HTTP 502): the answer is not a problem of the settle API"
        );
    }

    #[test]
    fn refusals_map_to_the_cores_codes_and_retries_to_503_and_transport() {
        for code in RefusalCode::ALL {
            if code == RefusalCode::GenerationExhausted {
                continue; // a 422 invalid_request on the wire
            }
            let p = Problem::refusal(code);
            let e = ClientError::from(error(p.status, Some(p)));
            assert_eq!(e.refusal(), Some(code));
            assert_eq!(e.is_retryable(), code == RefusalCode::RecordRefused);
        }
        let e = ClientError::from(error(
            422,
            Some(Problem::invalid("fence", "is out of range")),
        ));
        assert_eq!(e.refusal(), None);
        let i = e.invalid_input().unwrap();
        assert_eq!(
            (i.field.as_str(), i.reason.as_str()),
            ("fence", "fence: is out of range")
        );
        let e = ClientError::Timeout {
            authority: "h:1".into(),
            after: Duration::from_secs(1),
        };
        assert!(e.is_retryable() && e.is_transport());
    }
}
