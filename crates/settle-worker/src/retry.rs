//! Deadlines, jittered waits and the retry of one call.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use settle_core::{Command, Reply};
use tokio::time::Instant;

use crate::error::RunError;
use crate::names;
use crate::transport::{Transport, TransportError};

/// The caller's deadline (`None`: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    pub(crate) fn after(d: Option<Duration>) -> Deadline {
        Deadline(d.map(|d| Instant::now() + d))
    }
    /// Whether waiting `wait` still ends before the deadline.
    pub(crate) fn allows(self, wait: Duration) -> bool {
        self.0.is_none_or(|at| Instant::now() + wait < at)
    }
    /// This deadline, but no earlier than `d` from now.
    pub(crate) fn at_least(self, d: Duration) -> Deadline {
        let floor = Instant::now() + d;
        Deadline(self.0.map(|at| at.max(floor)))
    }
}

/// A uniform draw from [0, 1): jitter only, no crate needed for it.
fn unit() -> f64 {
    static N: AtomicU64 = AtomicU64::new(0);
    // RandomState's keys are random per thread; hashing a counter spreads them.
    let h =
        std::collections::hash_map::RandomState::new().hash_one(N.fetch_add(1, Ordering::Relaxed));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Full jitter, 50 ms doubling to 1 s; the ledger's retry hint is a floor
/// (capped at 5 s), as in the Python SDK.
pub(crate) fn backoff(n: u32, e: &TransportError) -> Duration {
    let base = (0.05 * f64::from(1u32 << n.min(10))).min(1.0);
    let mut wait = Duration::from_secs_f64(base * (0.5 + 0.5 * unit()));
    if let Some(hint) = e.retry_after() {
        wait = wait.max(hint.min(Duration::from_secs(5)));
    }
    wait
}

/// `in_flight`: the server's hint with jitter above it, never below, so
/// that the waiters spread out.
pub(crate) fn in_flight_wait(retry_after_ms: u64) -> Duration {
    Duration::from_millis(retry_after_ms).mul_f64(1.0 + 0.25 * unit())
}

/// Sends `cmd`, retrying the same command while there is no answer or the
/// ledger is unavailable, until `deadline`. Answers the ledger's reply
/// (refusals included).
pub(crate) async fn call(
    t: &dyn Transport,
    cmd: Command,
    name: &'static str,
    deadline: Deadline,
) -> Result<Reply, RunError> {
    let mut n = 0;
    loop {
        let sent = match deadline.0 {
            Some(at) => match tokio::time::timeout_at(at, t.execute(cmd.clone())).await {
                Ok(r) => r,
                Err(_) => Err(TransportError::NoAnswer {
                    detail: format!("no answer to {name} before the deadline"),
                }),
            },
            None => t.execute(cmd.clone()).await,
        };
        match sent {
            Ok(reply) => return Ok(reply),
            Err(e) if e.is_retryable() => {
                let wait = backoff(n, &e);
                if !deadline.allows(wait) {
                    return Err(RunError::DeadlineExceeded {
                        what: name,
                        last: Some(e),
                    });
                }
                tracing::debug!(call = name, error = %e, ?wait, "retrying");
                metrics::counter!(names::RETRIES, "call" => name).increment(1);
                tokio::time::sleep(wait).await;
                n += 1;
            }
            Err(source) => return Err(RunError::Transport { call: name, source }),
        }
    }
}
