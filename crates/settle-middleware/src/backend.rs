//! The ledger the middleware talks to: any `settle_worker::Transport` —
//! a remote server (`settle_client::Client`) or, with the `local` feature,
//! the in-process ledger (`LedgerTransport`) — with the answers split the
//! way SPEC §8 needs them, a call retried until it answers, and the
//! heartbeats of a lease.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use settle_core::{Command, Fence, Heartbeat, InvalidInput, Key, LeaseMs, RefusalCode, Reply};
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

/// Sends `cmd` until it answers or `deadline` passes: no answer, 503 and
/// 429 are retried (SPEC §11.11: the same call, so a settle under the
/// same fence, a claim with the same `claim_id`; the ledger answers a
/// repeat as the first), with growing, jittered pauses that honour the
/// ledger's `Retry-After`. Each attempt is cut off at the deadline. The
/// last failure is answered when the next pause would end past it.
pub(crate) async fn retry(
    backend: &Arc<dyn Transport>,
    cmd: Command,
    deadline: Duration,
) -> Result<Reply, CallError> {
    /// The shortest time an attempt is given, even past the deadline (the
    /// first attempt is always made).
    const MIN_ATTEMPT: Duration = Duration::from_millis(100);
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let left = deadline.saturating_sub(start.elapsed()).max(MIN_ATTEMPT);
        let answer = match tokio::time::timeout(left, call(&**backend, cmd.clone())).await {
            Ok(a) => a,
            Err(_) => Err(CallError::Unavailable(TransportError::NoAnswer {
                detail: format!("no answer within {} ms", deadline.as_millis()),
            })),
        };
        match answer {
            Err(e) if e.is_retryable() => {
                let wait = jitter(pause).max(e.retry_after().unwrap_or_default());
                if start.elapsed() + wait >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

/// Half to all of `d` (so that many retries do not arrive together).
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    d / 2 + d.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// Heartbeats the lease every third of `lease_ms` until it is lost; never
/// returns (the caller stops polling it when the handler is done).
pub(crate) async fn heartbeat(
    backend: Arc<dyn Transport>,
    key: Key,
    fence: Fence,
    lease_ms: LeaseMs,
) -> Infallible {
    let every = Duration::from_millis(lease_ms.get() / 3);
    loop {
        tokio::time::sleep(every).await;
        let cmd = Command::Heartbeat(Heartbeat {
            key: key.clone(),
            fence,
            lease_ms: None,
        });
        match call(&*backend, cmd).await {
            Ok(_) => {}
            Err(e) if e.is_retryable() => {
                tracing::debug!(key = key.as_str(), error = %e, "idempotency: heartbeat got no answer");
            }
            Err(e) => {
                // The lease is lost (expired, revoked): its settle will be
                // refused; the handler keeps running, nothing more to beat.
                tracing::warn!(key = key.as_str(), error = %e, "idempotency: lease lost while the handler runs");
                return std::future::pending().await;
            }
        }
    }
}
