//! SPEC §8's table as pure functions: what the middleware answers for a
//! request before the ledger is asked, for each claim decision, and what
//! it does with the handler's response. The layer (`crate::layer`) only
//! performs the calls these decide.

use std::time::Duration;

use settle_core::{ClaimDecision, Grant, RefusalCode, Reply};

use crate::backend::CallError;
use crate::layout::{self, NOT_COMMITTED_STATUSES, StoredResponse};

/// How one route is wrapped. Build it from the default, so that options
/// added later keep their defaults:
///
/// ```
/// use std::time::Duration;
/// use settle_middleware::{ReleaseOn, RoutePolicy};
/// let p = RoutePolicy {
///     timeout: Some(Duration::from_secs(20)),
///     wait: Some(Duration::from_secs(2)),
///     release_on: Some(ReleaseOn::default().with(422)),
///     ..RoutePolicy::default()
/// };
/// # let _ = p;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutePolicy {
    /// A request without a key gets 400 `idempotency_key_missing` (else
    /// it runs unwrapped).
    pub required: bool,
    /// When the ledger is unreachable, run the handler without
    /// idempotency (logged) instead of answering 503.
    pub fail_open: bool,
    /// After this long the handler counts as failed: the record becomes
    /// `unknown` (default: none).
    pub timeout: Option<Duration>,
    /// A duplicate that arrives while the first request runs waits up to
    /// this long for its outcome and answers as a replay when it arrives
    /// (default: none, 409 `request_in_progress` at once; SPEC §8 `wait`).
    pub wait: Option<Duration>,
    /// Response statuses that say nothing happened (SPEC §8 `release_on`;
    /// `None`: the layer's, by default 408, 409, 425, 429): not stored, the
    /// lease released `not_committed`, the retry runs the handler. A status
    /// added beyond those four (a framework's own 422 for a request it
    /// refused before the handler) is released with `forget`: no record is
    /// kept, and the corrected request with the same key runs.
    pub release_on: Option<ReleaseOn>,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        RoutePolicy {
            required: true,
            fail_open: false,
            timeout: None,
            wait: None,
            release_on: None,
        }
    }
}

/// A set of response statuses (100–599) for [`RoutePolicy::release_on`];
/// [`ReleaseOn::default`] is SPEC §8's 408, 409, 425, 429.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReleaseOn([u64; 8]);

impl ReleaseOn {
    /// No status.
    pub const fn none() -> ReleaseOn {
        ReleaseOn([0; 8])
    }

    /// These statuses.
    ///
    /// # Panics
    ///
    /// A status outside 100–599: a configuration error that names the option.
    pub fn new(statuses: impl IntoIterator<Item = u16>) -> ReleaseOn {
        statuses
            .into_iter()
            .fold(ReleaseOn::none(), ReleaseOn::with)
    }

    /// This set and `status`.
    ///
    /// # Panics
    ///
    /// A status outside 100–599: a configuration error that names the option.
    #[must_use]
    pub fn with(mut self, status: u16) -> ReleaseOn {
        assert!(
            (100..=599).contains(&status),
            "release_on: {status} is not an HTTP status (100-599)"
        );
        let i = usize::from(status - 100);
        self.0[i / 64] |= 1 << (i % 64);
        self
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        (100..=599).contains(&status) && {
            let i = usize::from(status - 100);
            self.0[i / 64] & (1 << (i % 64)) != 0
        }
    }

    /// Whether `status` is in the set and not one of SPEC §8's default
    /// four: the application added it, so it is released with `forget`.
    pub fn is_added(&self, status: u16) -> bool {
        self.contains(status) && !NOT_COMMITTED_STATUSES.contains(&status)
    }

    /// The statuses, ascending.
    pub fn statuses(&self) -> Vec<u16> {
        (100..=599).filter(|s| self.contains(*s)).collect()
    }
}

impl Default for ReleaseOn {
    fn default() -> Self {
        ReleaseOn::new(NOT_COMMITTED_STATUSES)
    }
}

impl std::fmt::Debug for ReleaseOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.statuses()).finish()
    }
}

/// A problem+json answer of the middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// The problem's `code`.
    pub code: &'static str,
    /// The problem's `detail`.
    pub detail: &'static str,
    /// The `Retry-After` header, in whole seconds.
    pub retry_after: Option<String>,
}

impl Problem {
    const fn new(status: u16, code: &'static str, detail: &'static str) -> Problem {
        Problem {
            status,
            code,
            detail,
            retry_after: None,
        }
    }
}

/// 400 `idempotency_key_missing`.
pub const KEY_MISSING: Problem = Problem::new(
    400,
    "idempotency_key_missing",
    "this route requires an Idempotency-Key header",
);
/// 422 `idempotency_key_reused`.
pub const KEY_REUSED: Problem = Problem::new(
    422,
    "idempotency_key_reused",
    "this Idempotency-Key was used for another request",
);
/// 409 `outcome_unknown`: an earlier request with the key failed.
pub const OUTCOME_UNKNOWN: Problem = Problem::new(
    409,
    "outcome_unknown",
    "an earlier request with this Idempotency-Key failed with an unknown outcome",
);
/// 500 `outcome_unknown`: this request's handler failed.
pub const HANDLER_FAILED: Problem = Problem::new(
    500,
    "outcome_unknown",
    "the request failed; its outcome is unknown and must be reconciled",
);
/// 409 `response_not_stored`.
pub const RESPONSE_NOT_STORED: Problem = Problem::new(
    409,
    "response_not_stored",
    "this request completed but its response was too large to store; it will not run again",
);
/// 413 `payload_too_large`.
pub const PAYLOAD_TOO_LARGE: Problem = Problem::new(
    413,
    "payload_too_large",
    "the request body is over the idempotency limit",
);

/// 401 `idempotency_principal_missing`: the extractor found no identity.
pub const PRINCIPAL_MISSING: Problem = Problem::new(
    401,
    "idempotency_principal_missing",
    "no principal was found for this request (see the principal option)",
);
/// 403 `idempotency_forbidden`: the ledger refused the caller's binding.
pub const FORBIDDEN: Problem = Problem::new(
    403,
    "idempotency_forbidden",
    "the ledger refused this caller's binding (its principal was revoked or moved on)",
);

/// 503 `idempotency_unavailable`, `Retry-After: 1`: the handler said
/// nothing was done ([`HandlerError::NotSent`](crate::HandlerError)); the
/// lease was released `not_committed` and the retry runs the handler.
pub fn not_sent() -> Problem {
    Problem {
        retry_after: Some("1".into()),
        ..Problem::new(
            503,
            "idempotency_unavailable",
            "the request was not run to completion and nothing was done; retry it",
        )
    }
}

/// 503 `idempotency_unavailable` with `Retry-After`.
pub fn unavailable(retry_after_s: u64) -> Problem {
    Problem {
        retry_after: Some(retry_after_s.max(1).to_string()),
        ..Problem::new(
            503,
            "idempotency_unavailable",
            "the idempotency ledger is unreachable; the request was not run",
        )
    }
}

/// 409 `request_in_progress` with `Retry-After` from `retry_after_ms`.
pub fn in_progress(retry_after_ms: u64) -> Problem {
    Problem {
        retry_after: Some(layout::retry_after_header(retry_after_ms)),
        ..Problem::new(
            409,
            "request_in_progress",
            "a request with this Idempotency-Key is still being processed",
        )
    }
}

/// What happens to a request before the ledger is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// Not an idempotent route (or a key is optional and none came): the
    /// handler runs as if there were no middleware.
    Unwrapped,
    /// Answered here; the handler does not run.
    Refuse(Problem),
    /// Claim this key.
    Wrapped {
        /// The unquoted `Idempotency-Key`.
        key: String,
    },
}

/// Rows "route requires a key and none is sent" and "malformed key, or the
/// header sent twice". `key_lines` are the `Idempotency-Key` field lines.
pub fn arrival(policy: Option<&RoutePolicy>, key_lines: &[&[u8]]) -> Arrival {
    let Some(policy) = policy else {
        return Arrival::Unwrapped;
    };
    match layout::parse_idempotency_key(key_lines) {
        Err(e) => Arrival::Refuse(Problem::new(400, "idempotency_key_invalid", e.0)),
        Ok(None) if policy.required => Arrival::Refuse(KEY_MISSING),
        Ok(None) => Arrival::Unwrapped,
        Ok(Some(key)) => Arrival::Wrapped { key },
    }
}

/// What the claim's answer leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterClaim {
    /// Run the handler under this lease (after `dispatch`).
    Execute(Grant),
    /// An earlier attempt may have dispatched: ask the reconcile hook, or
    /// hand the lease back and answer 409 `outcome_unknown`.
    Reconcile(Grant),
    /// Replay this stored response (`Idempotent-Replayed: true`); the
    /// record's receipt.
    Replay(StoredResponse, Box<settle_core::Receipt>),
    /// Another request with the key is running: 409 `request_in_progress`
    /// (this problem), or, with the route's `wait`, claim again after
    /// `retry_after_ms`.
    InFlight {
        /// The ledger's hint.
        retry_after_ms: u64,
        /// The answer when the wait is over.
        problem: Problem,
    },
    /// Answer this problem; the handler does not run, fail-open or not.
    Refuse(Problem),
    /// The ledger cannot be asked (no answer, or its 503 `unavailable`):
    /// 503, or the route's fail-open.
    Unavailable(String),
}

/// What a failed ledger call leads to (SPEC §8, amended): only a
/// transport error or a 503 `unavailable` may fail open; a refusal never
/// runs the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerFailure {
    /// Unreachable or unavailable: 503, or the route's fail-open.
    Unreachable(String),
    /// Answered, and not with a go-ahead: this problem, never the handler.
    Refused(Problem),
}

/// The SPEC §8 answer to a failed ledger call; `retry_after_s` is the
/// middleware's own `Retry-After` for a 503 the ledger gave no hint for.
pub fn ledger_failure(e: &CallError, retry_after_s: u64) -> LedgerFailure {
    use settle_worker::TransportError as T;
    let hinted = |d: Option<Duration>| {
        unavailable(d.map_or(retry_after_s, |d| d.as_millis().div_ceil(1000) as u64))
    };
    match e {
        CallError::Unavailable(
            t @ (T::NotSent { .. } | T::NoAnswer { .. } | T::Unavailable { .. }),
        ) => LedgerFailure::Unreachable(t.to_string()),
        CallError::Unavailable(T::Limited { retry_after, .. }) => {
            LedgerFailure::Refused(hinted(*retry_after))
        }
        CallError::Refused(RefusalCode::StaleBinding) => LedgerFailure::Refused(FORBIDDEN),
        CallError::Refused(RefusalCode::FingerprintMismatch | RefusalCode::BindingMismatch) => {
            LedgerFailure::Refused(KEY_REUSED)
        }
        // A record the store refuses, a bad token, an invalid call, any
        // other refusal: the ledger answered no; never run the handler.
        other => {
            tracing::error!(error = %other, "idempotency: the ledger refused the call; the request is not run");
            LedgerFailure::Refused(unavailable(retry_after_s))
        }
    }
}

/// Rows "first request", "after completion", "different request", "still
/// running" and "settle unreachable" (the claim's side).
pub fn after_claim(answer: Result<Reply, CallError>, retry_after_s: u64) -> AfterClaim {
    match answer {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => AfterClaim::Execute(g),
        Ok(Reply::Claim(ClaimDecision::Reconcile(g))) => AfterClaim::Reconcile(g),
        Ok(Reply::Claim(ClaimDecision::InFlight {
            retry_after_ms,
            lease_expires_at,
        })) => {
            // The running lease's time left, by this host's clock; at least
            // the ledger's own hint (a clock behind the store's).
            let left = lease_expires_at.ms_since(settle_core::Timestamp::from_system_time(
                std::time::SystemTime::now(),
            ));
            AfterClaim::InFlight {
                retry_after_ms,
                problem: in_progress(left.max(retry_after_ms)),
            }
        }
        Ok(Reply::Claim(ClaimDecision::Replay { outcome, receipt })) => {
            match outcome
                .result()
                .and_then(|r| layout::decode_response(&r.to_value()))
            {
                Some(stored) if stored.body.is_some() => {
                    AfterClaim::Replay(stored, Box::new(receipt))
                }
                // Too large to store, or written by something else: never
                // run the handler a second time.
                _ => AfterClaim::Refuse(RESPONSE_NOT_STORED),
            }
        }
        Err(e) => match ledger_failure(&e, retry_after_s) {
            LedgerFailure::Unreachable(why) => AfterClaim::Unavailable(why),
            LedgerFailure::Refused(p) => AfterClaim::Refuse(p),
        },
        Ok(other) => {
            tracing::error!(
                answer = other.label(),
                "idempotency: the ledger answered a claim unexpectedly; the request is not run"
            );
            AfterClaim::Refuse(unavailable(retry_after_s))
        }
    }
}

/// What is done with a response the handler returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// 2xx, 3xx, 4xx: settled `completed` and replayed.
    Completed,
    /// 5xx the handler returned: settled `failed` and replayed.
    Failed,
    /// 408, 409, 425, 429 (the default `release_on`), or marked retryable:
    /// nothing happened; released with `not_committed`, the retry runs the
    /// handler.
    NotCommitted,
    /// A status the application added to `release_on` (a framework's 422):
    /// released `not_committed` with `forget`, so no record is kept and
    /// the corrected request with the same key runs.
    Forget,
}

/// Rows "first request" and "a 5xx the handler returns" (the settle side),
/// and SPEC §8 `release_on`.
pub fn disposition(status: u16, marked_retryable: bool, release_on: &ReleaseOn) -> Disposition {
    if release_on.is_added(status) {
        Disposition::Forget
    } else if marked_retryable || release_on.contains(status) {
        Disposition::NotCommitted
    } else if status >= 500 {
        Disposition::Failed
    } else {
        Disposition::Completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::{Digest, Fence, Key, Outcome, Receipt, ResultJson, Status, Timestamp};

    fn wrapped() -> RoutePolicy {
        RoutePolicy::default()
    }

    #[test]
    fn row_key_missing_on_a_required_route() {
        assert_eq!(arrival(Some(&wrapped()), &[]), Arrival::Refuse(KEY_MISSING));
        let optional = RoutePolicy {
            required: false,
            ..wrapped()
        };
        assert_eq!(arrival(Some(&optional), &[]), Arrival::Unwrapped);
        assert_eq!(arrival(None, &[b"k"]), Arrival::Unwrapped);
    }

    #[test]
    fn row_key_malformed_or_sent_twice() {
        for lines in [&[b"a b".as_slice()][..], &[b"k", b"k"], &[b"\"k"]] {
            let Arrival::Refuse(p) = arrival(Some(&wrapped()), lines) else {
                panic!("{lines:?} accepted")
            };
            assert_eq!((p.status, p.code), (400, "idempotency_key_invalid"));
        }
        assert_eq!(
            arrival(Some(&wrapped()), &[b"\"k-1\""]),
            Arrival::Wrapped { key: "k-1".into() }
        );
    }

    fn grant() -> Grant {
        Grant {
            fence: Fence(7),
            lease_expires_at: Timestamp(0),
            attempt: 1,
        }
    }

    #[test]
    fn row_first_request_executes() {
        let r = after_claim(Ok(Reply::Claim(ClaimDecision::Execute(grant()))), 1);
        assert_eq!(r, AfterClaim::Execute(grant()));
    }

    #[test]
    fn row_still_running_is_409_with_whole_seconds() {
        let r = after_claim(
            Ok(Reply::Claim(ClaimDecision::InFlight {
                retry_after_ms: 1001,
                lease_expires_at: Timestamp(0),
            })),
            1,
        );
        let AfterClaim::InFlight { problem: p, .. } = r else {
            panic!()
        };
        assert_eq!((p.status, p.code), (409, "request_in_progress"));
        assert_eq!(p.retry_after.as_deref(), Some("2"));
    }

    #[test]
    fn row_different_request_is_422() {
        for c in [
            RefusalCode::FingerprintMismatch,
            RefusalCode::BindingMismatch,
        ] {
            assert_eq!(
                after_claim(Err(CallError::Refused(c)), 1),
                AfterClaim::Refuse(KEY_REUSED)
            );
        }
    }

    #[test]
    fn row_ledger_unreachable_fails_closed_and_only_unreachable_may_fail_open() {
        use settle_worker::TransportError as T;
        let d = || "x".to_string();
        // No answer, or the ledger's own 503 `unavailable`: may fail open.
        for e in [
            T::NotSent { detail: d() },
            T::NoAnswer { detail: d() },
            T::Unavailable {
                retry_after: None,
                detail: d(),
            },
        ] {
            assert!(matches!(
                after_claim(Err(CallError::Unavailable(e)), 1),
                AfterClaim::Unavailable(_)
            ));
        }
        let p = unavailable(0);
        assert_eq!((p.status, p.retry_after.as_deref()), (503, Some("1")));
    }

    /// SPEC §8 (amended): a ledger refusal of the claim never runs the
    /// handler, fail-open or not.
    #[test]
    fn refusals_never_fail_open() {
        use settle_worker::TransportError as T;
        let refused = |e: CallError| match after_claim(Err(e), 7) {
            AfterClaim::Refuse(p) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(CallError::Refused(RefusalCode::StaleBinding)),
            FORBIDDEN
        );
        let p = refused(CallError::Refused(RefusalCode::RecordRefused));
        assert_eq!(
            (p.status, p.code, p.retry_after.as_deref()),
            (503, "idempotency_unavailable", Some("7"))
        );
        // 429 from settle: 503 with settle's own Retry-After, rounded up.
        let p = refused(CallError::Unavailable(T::Limited {
            retry_after: Some(Duration::from_millis(2500)),
            detail: "x".into(),
        }));
        assert_eq!(
            (p.status, p.code, p.retry_after.as_deref()),
            (503, "idempotency_unavailable", Some("3"))
        );
        let p = refused(CallError::Unavailable(T::Limited {
            retry_after: None,
            detail: "x".into(),
        }));
        assert_eq!(p.retry_after.as_deref(), Some("7"));
        // A bad token, an invalid call, an unexpected answer.
        for e in [
            CallError::Unavailable(T::Fatal {
                detail: "401 unauthorized".into(),
            }),
            CallError::Invalid(settle_core::InvalidInput {
                field: "lease_ms".into(),
                reason: "x".into(),
            }),
            CallError::Refused(RefusalCode::StaleFence),
        ] {
            assert_eq!(refused(e).code, "idempotency_unavailable");
        }
        let odd = after_claim(Ok(Reply::Released { fence: Fence(1) }), 1);
        assert!(matches!(odd, AfterClaim::Refuse(p) if p.status == 503));
    }

    fn replay_of(result: serde_json::Value) -> AfterClaim {
        let digest = Digest::parse("d", &"ab".repeat(32)).unwrap();
        let outcome = Outcome::completed(ResultJson::from_value(&result, 65536).unwrap(), digest);
        let receipt = Receipt {
            key: Key::new("k").unwrap(),
            fingerprint: digest,
            response_sha256: Some(digest),
            status: Status::Completed,
            fence: Fence(1),
            committed_at: Timestamp(0),
            durable: true,
        };
        after_claim(
            Ok(Reply::Claim(ClaimDecision::Replay { outcome, receipt })),
            1,
        )
    }

    #[test]
    fn row_after_completion_replays_the_stored_response() {
        let (stored, _) = layout::encode_response(
            201,
            &[("Location".into(), b"/p/1".to_vec())],
            b"{}",
            &["location".into()],
            100,
        );
        let AfterClaim::Replay(r, _) = replay_of(stored) else {
            panic!()
        };
        assert_eq!(r.status, 201);
        assert_eq!(r.body.as_deref(), Some(&b"{}"[..]));
        assert_eq!(r.headers, vec![("location".into(), b"/p/1".to_vec())]);
    }

    #[test]
    fn row_after_completion_without_a_stored_body_is_response_not_stored() {
        let (too_large, _) = layout::encode_response(200, &[], b"0123456789", &[], 4);
        assert_eq!(
            replay_of(too_large),
            AfterClaim::Refuse(RESPONSE_NOT_STORED)
        );
        assert_eq!(
            replay_of(serde_json::json!({"charge": 1})),
            AfterClaim::Refuse(RESPONSE_NOT_STORED)
        );
    }

    #[test]
    fn row_stored_and_not_stored_statuses() {
        let d = ReleaseOn::default();
        assert_eq!(disposition(201, false, &d), Disposition::Completed);
        assert_eq!(disposition(400, false, &d), Disposition::Completed);
        assert_eq!(disposition(422, false, &d), Disposition::Completed);
        assert_eq!(disposition(500, false, &d), Disposition::Failed);
        assert_eq!(disposition(503, false, &d), Disposition::Failed);
        for s in [408, 409, 425, 429] {
            assert_eq!(disposition(s, false, &d), Disposition::NotCommitted);
        }
        assert_eq!(disposition(201, true, &d), Disposition::NotCommitted);
    }

    /// SPEC §8 `release_on`: the statuses the application adds are
    /// released with `forget`; the default four are not forgotten.
    #[test]
    fn added_release_on_statuses_are_forgotten() {
        let with_422 = ReleaseOn::default().with(422);
        assert_eq!(disposition(422, false, &with_422), Disposition::Forget);
        assert_eq!(
            disposition(409, false, &with_422),
            Disposition::NotCommitted
        );
        assert_eq!(with_422.statuses(), vec![408, 409, 422, 425, 429]);
        let only_429 = ReleaseOn::new([429]);
        assert_eq!(disposition(409, false, &only_429), Disposition::Completed);
        assert_eq!(format!("{:?}", only_429), "{429}");
    }
}
