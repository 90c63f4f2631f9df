//! What can go wrong in a run: typed refusals (never retried, SPEC §11
//! step 7), what the effect reported, and the deadline.

use settle_core::{Fence, InvalidInput, Key, Receipt, RefusalCode, Reply};

use crate::fingerprint::FingerprintError;
use crate::names;
use crate::transport::TransportError;

/// A boxed error, as effects and reconcile hooks report them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the effect reports when it did not produce a result. The choice
/// decides what the ledger records (SPEC §11 step 3).
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// Nothing reached the remote: the lease is handed back
    /// (`release(not_dispatched)` under `marks_dispatch` before dispatch,
    /// else `release(not_committed)`) and the next claim executes.
    #[error("the effect sent nothing: {0}")]
    NotSent(BoxError),
    /// The remote definitively refused the effect (a validation error, 409,
    /// 425, 429: nothing was applied): `release(not_committed)`, and the
    /// next claim executes.
    #[error("the remote refused the effect: {0}")]
    Refused(BoxError),
    /// The effect failed after it may have reached the remote, or cannot
    /// tell: settled `unknown` (reconcile required).
    #[error("the effect may have reached the remote: {0}")]
    Unknown(BoxError),
}

impl EffectError {
    /// [`EffectError::NotSent`] from anything that converts to a [`BoxError`].
    pub fn not_sent(e: impl Into<BoxError>) -> EffectError {
        EffectError::NotSent(e.into())
    }
    /// [`EffectError::Refused`] from anything that converts to a [`BoxError`].
    pub fn refused(e: impl Into<BoxError>) -> EffectError {
        EffectError::Refused(e.into())
    }
    /// [`EffectError::Unknown`] from anything that converts to a [`BoxError`].
    pub fn unknown(e: impl Into<BoxError>) -> EffectError {
        EffectError::Unknown(e.into())
    }
}

/// A failed `dispatch` means the remote write must not be made: nothing
/// was sent.
impl From<RunError> for EffectError {
    fn from(e: RunError) -> EffectError {
        EffectError::NotSent(Box::new(e))
    }
}

/// Why a run did not produce the operation's outcome.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The ledger refused `call` (SPEC §4): `fingerprint_mismatch` or
    /// `binding_mismatch` (this key was used for another request or
    /// caller), `stale_binding`, `stale_fence` or `lease_expired` (this
    /// worker's lease ended: another may have taken over; a settle refused
    /// this way quarantined its evidence), ... Never retried, and never to be
    /// retried with another key or fingerprint.
    #[error("{call} refused: {code}")]
    Refused {
        /// The call: claim, heartbeat, dispatch, settle, release, reconcile.
        call: &'static str,
        /// The refusal.
        code: RefusalCode,
    },
    /// The ledger found the call invalid (422); nothing was written.
    #[error("{call} invalid: {input}")]
    Invalid {
        /// The call.
        call: &'static str,
        /// What is wrong.
        input: InvalidInput,
    },
    /// The request cannot be fingerprinted.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// The ledger granted a `reconcile` lease (an earlier attempt may have
    /// reached the remote) and there is no reconcile hook, or the hook could
    /// not tell: the lease was handed back (`reconcile(unavailable)`).
    #[error("operation {key} needs reconciliation (fence {fence})")]
    ReconcileRequired {
        /// The key.
        key: Key,
        /// The reconcile lease that was handed back.
        fence: Fence,
    },
    /// The reconcile hook failed; the lease was handed back
    /// (`reconcile(unavailable)`).
    #[error("the reconcile hook failed for {key} (fence {fence}): {source}")]
    ReconcileFailed {
        /// The key.
        key: Key,
        /// The reconcile lease that was handed back.
        fence: Fence,
        /// The hook's error.
        source: BoxError,
    },
    /// The effect reported that nothing reached the remote; the lease was
    /// handed back, and a later run executes.
    #[error("the effect sent nothing: {source}")]
    NotSent {
        /// The effect's error.
        source: BoxError,
    },
    /// The remote definitively refused the effect; the lease was handed
    /// back (`not_committed`), and a later run executes.
    #[error("the remote refused the effect: {source}")]
    EffectRefused {
        /// The effect's error.
        source: BoxError,
    },
    /// The effect failed after it may have reached the remote: the
    /// operation was settled `unknown` and must be reconciled. `receipt` is
    /// the `unknown` receipt when the settle was answered.
    #[error("the outcome of operation {key} is unknown; it must be reconciled: {source}")]
    OutcomeUnknown {
        /// The key.
        key: Key,
        /// The `unknown` receipt, if the settle was answered.
        receipt: Option<Box<Receipt>>,
        /// The effect's error.
        source: BoxError,
    },
    /// The deadline passed while waiting (`in_flight`) or retrying (no
    /// answer, unavailable). `last` is the last transport error, if any.
    #[error("deadline exceeded: {what}{}", .last.as_ref().map(|e| format!(" (last: {e})")).unwrap_or_default())]
    DeadlineExceeded {
        /// What the run was doing.
        what: &'static str,
        /// The last transport error.
        last: Option<TransportError>,
    },
    /// The ledger cannot be used at all (a wrong token, a bad URL).
    #[error("{call}: {source}")]
    Transport {
        /// The call.
        call: &'static str,
        /// Why.
        source: TransportError,
    },
    /// The ledger answered with a reply that does not belong to the call
    /// (a transport that mixes up answers).
    #[error("{call} answered {reply}")]
    Unexpected {
        /// The call.
        call: &'static str,
        /// The label of the reply.
        reply: &'static str,
    },
}

impl RunError {
    /// The refusal, when the ledger refused a call.
    pub fn refusal(&self) -> Option<RefusalCode> {
        match self {
            RunError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The error for a reply that is not the call's success; counts
    /// refusals.
    pub(crate) fn from_reply(call: &'static str, reply: Reply) -> RunError {
        match reply {
            Reply::Refused(code) => {
                metrics::counter!(names::REFUSALS, "call" => call, "code" => code.code())
                    .increment(1);
                tracing::warn!(call, code = code.code(), "refused");
                RunError::Refused { call, code }
            }
            Reply::Invalid(input) => RunError::Invalid { call, input },
            other => RunError::Unexpected {
                call,
                reply: other.label(),
            },
        }
    }
}
