//! The ledger the middleware talks to: any `settle_worker::Transport` —
//! a remote server (`settle_client::Client`) or, with the `local` feature,
//! the in-process ledger (`LedgerTransport`) — with the answers split the
//! way SPEC §8 needs them.

use std::time::Duration;

use settle_core::{Command, InvalidInput, RefusalCode, Reply};
use settle_worker::TransportError;
pub use settle_worker::{BoxFuture, Transport};

/// Why a call to the ledger did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// A protocol refusal (SPEC §4).
    #[error("refused: {0}")]
    Refused(RefusalCode),
    /// The ledger found the call invalid; nothing changed.
    #[error("invalid: {0}")]
    Invalid(InvalidInput),
    /// No answer, or a ledger that cannot serve (storage failure, 503,
    /// 401): fail closed.
    #[error(transparent)]
    Unavailable(TransportError),
}

impl CallError {
    /// Whether the same call may succeed later (no answer, 503, a record
    /// the store refuses for now).
    pub fn is_retryable(&self) -> bool {
        match self {
            CallError::Unavailable(e) => e.is_retryable(),
            CallError::Refused(c) => *c == RefusalCode::RecordRefused,
            CallError::Invalid(_) => false,
        }
    }

    /// The ledger's hint of when to retry.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Unavailable(e) => e.retry_after(),
            _ => None,
        }
    }
}

/// Runs one command; refusals and invalid commands are errors here.
pub(crate) async fn call(t: &dyn Transport, cmd: Command) -> Result<Reply, CallError> {
    match t.execute(cmd).await {
        Ok(Reply::Refused(c)) => Err(CallError::Refused(c)),
        Ok(Reply::Invalid(e)) => Err(CallError::Invalid(e)),
        Ok(r) => Ok(r),
        Err(e) => Err(CallError::Unavailable(e)),
    }
}
