//! The ledger the middleware talks to: the embedded `Ledger` in-process or
//! a remote server through `settle-client`, both behind `Command` → `Reply`.

use std::sync::Arc;

use settle_client::Client;
use settle_core::{Command, InvalidInput, RefusalCode, Reply, TenantId};
use settle_ledger::{BoxFuture, Ledger, LedgerError};

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
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
}

impl CallError {
    /// Whether the same call may succeed later (no answer, 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CallError::Unavailable(_) | CallError::Refused(RefusalCode::RecordRefused)
        )
    }
}

/// The calls the middleware makes: one command, its reply.
pub trait Backend: Send + Sync + 'static {
    /// Runs one command of the core (protocol refusals and invalid
    /// commands are errors here).
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, CallError>>;
}

fn reply(r: Reply) -> Result<Reply, CallError> {
    match r {
        Reply::Refused(c) => Err(CallError::Refused(c)),
        Reply::Invalid(e) => Err(CallError::Invalid(e)),
        r => Ok(r),
    }
}

/// The embedded ledger, for one tenant.
pub struct Embedded {
    /// The ledger.
    pub ledger: Ledger,
    /// The tenant every key belongs to.
    pub tenant: TenantId,
}

impl Backend for Embedded {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, CallError>> {
        Box::pin(async move {
            match self.ledger.execute(&self.tenant, cmd).await {
                Ok(r) => reply(r),
                Err(LedgerError::Invalid(e)) => Err(CallError::Invalid(e)),
                Err(LedgerError::Refused(c)) => Err(CallError::Refused(c)),
                Err(LedgerError::Store(e)) => Err(CallError::Unavailable(e.to_string())),
            }
        })
    }
}

/// A remote `settle serve`.
pub struct Remote(pub Client);

impl Backend for Remote {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, CallError>> {
        Box::pin(async move {
            match self.0.execute(&cmd).await {
                Ok(r) => reply(r),
                Err(e) => Err(CallError::Unavailable(e.to_string())),
            }
        })
    }
}

/// A shared backend.
pub type SharedBackend = Arc<dyn Backend>;
