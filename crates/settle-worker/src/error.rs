//! What can go wrong in a run: typed refusals (never retried, SPEC §11
//! step 7), what the effect reported, and the deadline.

use settle_core::{Fence, InvalidInput, Key, Outcome, Receipt, RefusalCode, Reply};

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

/// `?` on [`EffectContext::dispatch`](crate::EffectContext::dispatch)'s
/// error: the remote write must not be made. It is carried as `NotSent`,
/// but `run_once` does not take it as the caller's word that nothing was
/// applied (SPEC §11.11: an SDK never attests on its own inference): it
/// hands the lease back with `release(not_dispatched)` and lets the ledger
/// decide, which refuses with `receipt_required` when the dispatch mark
/// was recorded after all (its answer was lost), and the run then settles
/// `unknown` ([`RunError::OutcomeUnknown`]).
impl From<RunError> for EffectError {
    fn from(e: RunError) -> EffectError {
        EffectError::NotSent(Box::new(e))
    }
}

/// Why a run did not produce the operation's outcome.
///
/// The result kinds of SPEC §11.11 and `sdk/fault-vectors.json`, which the
/// three SDKs share, are these variants:
///
/// | result kind | `RunError` |
/// |---|---|
/// | `ok` | none: `Ok(RunResult)` |
/// | `not_sent` | [`NotSent`](Self::NotSent) (its `source` is the effect's error, or the [`DeadlineExceeded`](Self::DeadlineExceeded) of a `dispatch` that never reached settle: "caused by `deadline`") |
/// | `effect_refused` | [`EffectRefused`](Self::EffectRefused) |
/// | `refused:<code>` | [`Refused`](Self::Refused) with that [`RefusalCode`] |
/// | `outcome_unknown` | [`OutcomeUnknown`](Self::OutcomeUnknown), or [`ReconcileFailed`](Self::ReconcileFailed) for a reconcile hook that failed, panicked or ran past `hook_timeout` |
/// | `deadline` | [`DeadlineExceeded`](Self::DeadlineExceeded): the effect never ran |
/// | `reconcile_required` | [`ReconcileRequired`](Self::ReconcileRequired) |
///
/// The other variants are no fault of the network: a request or option the
/// ledger or this crate refuses before anything runs (`Invalid`,
/// `Fingerprint`), a ledger that will not serve this caller at all
/// (`Transport`: a wrong token, a bad URL) and a transport that mixes up
/// answers (`Unexpected`).
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
    /// The effect may have reached the remote and what happened is not
    /// recorded: the effect failed after it may have sent (settled
    /// `unknown`), a `dispatch` mark was recorded whose answer never came
    /// (the release refused `receipt_required`, then settled `unknown`),
    /// the ledger refused the result (a 422, e.g. over its size limit:
    /// settled `unknown` at once) or the settle got no answer until its
    /// deadline (the lease lapses to `unknown`; `source` is an
    /// [`Unrecorded`] that still holds the outcome). The operation must be
    /// reconciled. `receipt` is the `unknown` receipt when one was answered.
    #[error("the outcome of operation {key} is unknown; it must be reconciled: {source}")]
    OutcomeUnknown {
        /// The key.
        key: Key,
        /// The `unknown` receipt, if the settle was answered.
        receipt: Option<Box<Receipt>>,
        /// Why: the effect's error, the ledger's refusal, an [`Unrecorded`].
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

/// The outcome an effect produced that could not be recorded: the settle
/// got no answer (or only 503/429) until its deadline. It is the `source`
/// of [`RunError::OutcomeUnknown`], so that the caller still holds the
/// outcome (e.g. to report it to a reconcile hook later); the record
/// becomes `unknown` when the lease lapses, or holds this outcome when a
/// settle whose answer was lost did arrive.
#[derive(Debug, thiserror::Error)]
#[error("the {} outcome could not be recorded: {source}", .outcome.status().status().as_str())]
pub struct Unrecorded {
    /// What the effect produced.
    pub outcome: Outcome,
    /// The settle's last failure.
    pub source: RunError,
}

impl RunError {
    /// The refusal, when the ledger refused a call.
    pub fn refusal(&self) -> Option<RefusalCode> {
        match self {
            RunError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A copy of an error `dispatch` answers (a refusal, an invalid call,
    /// the deadline, a transport error): the effect gets one, the run keeps
    /// the other to decide what to do after the effect.
    pub(crate) fn copy_of_dispatch_error(&self) -> RunError {
        match self {
            RunError::Refused { call, code } => RunError::Refused { call, code: *code },
            RunError::Invalid { call, input } => RunError::Invalid {
                call,
                input: input.clone(),
            },
            RunError::DeadlineExceeded { what, last } => RunError::DeadlineExceeded {
                what,
                last: last.clone(),
            },
            RunError::Transport { call, source } => RunError::Transport {
                call,
                source: source.clone(),
            },
            RunError::Unexpected { call, reply } => RunError::Unexpected { call, reply },
            other => RunError::Unexpected {
                call: "dispatch",
                reply: match other {
                    RunError::Fingerprint(_) => "fingerprint",
                    _ => "error",
                },
            },
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
