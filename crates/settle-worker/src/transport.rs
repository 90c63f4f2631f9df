//! How the worker reaches the ledger: one small trait, [`Transport`], with
//! one call, `execute(Command) -> Reply`. It is implemented by the HTTP
//! client (`settle_client::Client`) and, with the `local` feature, by the
//! in-process ledger (`LedgerTransport`); a simulated network implements it
//! too.
//!
//! The split that matters to a worker (SPEC §11 step 7):
//!
//! * `Ok(Reply)` is the ledger's answer, refusals included
//!   (`Reply::Refused`, `Reply::Invalid`): the call reached the ledger and the
//!   rules decided. A refusal is never retried with another key or
//!   fingerprint.
//! * `Err(TransportError)` is everything else: no answer (the request may or
//!   may not have been applied), a ledger that cannot serve right now, or
//!   one that will not serve this caller at all.

#[cfg(feature = "local")]
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use settle_client::{Client, ClientError};
#[cfg(feature = "local")]
use settle_core::TenantId;
use settle_core::{Command, Reply};
#[cfg(feature = "local")]
use settle_ledger::{Ledger, LedgerError, StoreError};

/// The future a [`Transport`] (and the other traits of this crate) returns:
/// boxed, so that the traits stay object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The ledger as a worker sees it. Object-safe (`Arc<dyn Transport>` works)
/// and small, so that a test or a simulator can put a network in between.
pub trait Transport: Send + Sync {
    /// Runs one command of SPEC §4 (claim, heartbeat, dispatch, settle,
    /// release, reconcile, ...) and answers the ledger's reply, or why
    /// there is none.
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>>;
}

impl<T: Transport + ?Sized> Transport for Arc<T> {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        (**self).execute(cmd)
    }
}

impl<T: Transport + ?Sized> Transport for &T {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        (**self).execute(cmd)
    }
}

/// Why a command got no answer from the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The request provably never reached the ledger (no connection could
    /// be made). Retrying is safe.
    #[error("not sent: {detail}")]
    NotSent {
        /// What happened.
        detail: String,
    },
    /// No answer (a timeout, a broken connection): the ledger may or may
    /// not have applied the request. Retry the same call, never another.
    #[error("no answer: {detail}")]
    NoAnswer {
        /// What happened.
        detail: String,
    },
    /// The ledger answered that it cannot serve now (a storage failure,
    /// overload, a commit in doubt, shutting down); nothing was
    /// acknowledged. Retry the same call, not before `retry_after`.
    #[error("ledger unavailable: {detail}")]
    Unavailable {
        /// The ledger's hint, if it gave one.
        retry_after: Option<Duration>,
        /// What the ledger said.
        detail: String,
    },
    /// The ledger is limiting this caller (429: a tenant's quota, SPEC
    /// §12); nothing was done. Retry the same call like a 503, not before
    /// `retry_after`; never a reason to act without the ledger.
    #[error("ledger rate limited: {detail}")]
    Limited {
        /// The ledger's hint, if it gave one.
        retry_after: Option<Duration>,
        /// What the ledger said.
        detail: String,
    },
    /// The ledger will not serve this call however often it is sent (no or
    /// a wrong token, a bad URL, an answer that is not this API's).
    #[error("ledger call failed: {detail}")]
    Fatal {
        /// What happened.
        detail: String,
    },
}

impl TransportError {
    /// Worth sending the same call again after a pause.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, TransportError::Fatal { .. })
    }

    /// The ledger's hint of when to retry.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            TransportError::Unavailable { retry_after, .. }
            | TransportError::Limited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl From<ClientError> for TransportError {
    fn from(e: ClientError) -> TransportError {
        let detail = e.to_string();
        match &e {
            ClientError::Connect { .. } => TransportError::NotSent { detail },
            ClientError::Timeout { .. } | ClientError::Transport { .. } => {
                TransportError::NoAnswer { detail }
            }
            _ if e.status() == Some(503) => TransportError::Unavailable {
                retry_after: e.retry_after(),
                detail,
            },
            _ if e.status() == Some(429) => TransportError::Limited {
                retry_after: e.retry_after(),
                detail,
            },
            _ => TransportError::Fatal { detail },
        }
    }
}

#[cfg(feature = "local")]
impl From<StoreError> for TransportError {
    /// Every store failure fails closed and is retryable, as the server's
    /// 503 is; an overload carries its hint.
    fn from(e: StoreError) -> TransportError {
        TransportError::Unavailable {
            retry_after: e.retry_after_ms().map(Duration::from_millis),
            detail: e.to_string(),
        }
    }
}

impl Transport for Client {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        Box::pin(async move {
            Client::execute(self, &cmd)
                .await
                .map_err(TransportError::from)
        })
    }
}

/// The in-process ledger, acting for one tenant (a server derives the
/// tenant from the bearer token; in process it is named here). With the
/// `local` feature.
#[cfg(feature = "local")]
#[derive(Clone)]
pub struct LedgerTransport {
    ledger: Ledger,
    tenant: TenantId,
}

#[cfg(feature = "local")]
impl LedgerTransport {
    /// The ledger, acting for the default tenant.
    pub fn new(ledger: Ledger) -> LedgerTransport {
        LedgerTransport::for_tenant(ledger, TenantId::default_tenant())
    }

    /// The ledger, acting for `tenant`.
    pub fn for_tenant(ledger: Ledger, tenant: TenantId) -> LedgerTransport {
        LedgerTransport { ledger, tenant }
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The tenant the calls act for.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
}

#[cfg(feature = "local")]
impl fmt::Debug for LedgerTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerTransport")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "local")]
impl Transport for LedgerTransport {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        Box::pin(async move {
            match self.ledger.execute(&self.tenant, cmd).await {
                Ok(reply) => Ok(reply),
                // The same answer as the HTTP client gives for a 422.
                Err(LedgerError::Invalid(e)) => Ok(Reply::Invalid(e)),
                Err(LedgerError::Refused(c)) => Ok(Reply::Refused(c)),
                Err(LedgerError::Store(e)) => Err(e.into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_split_into_not_sent_no_answer_and_fatal() {
        let connect = ClientError::Connect {
            authority: "h:1".into(),
            source: "refused".into(),
        };
        assert!(matches!(
            TransportError::from(connect),
            TransportError::NotSent { .. }
        ));
        let timeout = ClientError::Timeout {
            authority: "h:1".into(),
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            TransportError::from(timeout),
            TransportError::NoAnswer { .. }
        ));
        let fatal = TransportError::from(ClientError::Request("bad token".into()));
        assert!(!fatal.is_retryable());
    }

    #[cfg(feature = "local")]
    #[test]
    fn store_errors_are_unavailable_with_their_hint() {
        let overloaded = TransportError::from(StoreError::Overloaded {
            retry_after_ms: 250,
        });
        assert!(overloaded.is_retryable());
        assert_eq!(overloaded.retry_after(), Some(Duration::from_millis(250)));
    }
}
