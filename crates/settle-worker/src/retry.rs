//! Deadlines, jittered waits and the retry of one call.

use std::future::Future;
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
    /// This deadline, but no later than `d` from now.
    pub(crate) fn at_most(self, d: Duration) -> Deadline {
        let ceiling = Instant::now() + d;
        Deadline(Some(self.0.map_or(ceiling, |at| at.min(ceiling))))
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
    retrying(name, deadline, || t.execute(cmd.clone())).await
}

/// Runs `attempt` until it answers, retrying (with [`backoff`]) while it
/// gets no answer or the ledger is unavailable, until `deadline`; each
/// attempt is cut off at the deadline. SPEC §11.11: a lost call is retried
/// with identical arguments, so `attempt` must send the same call each time.
pub(crate) async fn retrying<T, F, Fut>(
    name: &'static str,
    deadline: Deadline,
    mut attempt: F,
) -> Result<T, RunError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TransportError>>,
{
    let mut n = 0;
    loop {
        let sent = match deadline.0 {
            Some(at) => match tokio::time::timeout_at(at, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(TransportError::NoAnswer {
                    detail: format!("no answer to {name} before the deadline"),
                }),
            },
            None => attempt().await,
        };
        match sent {
            Ok(answer) => return Ok(answer),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_waits_are_jittered_above_the_hint_never_below() {
        let waits: Vec<Duration> = (0..200).map(|_| in_flight_wait(400)).collect();
        for w in &waits {
            assert!(
                *w >= Duration::from_millis(400) && *w <= Duration::from_millis(500),
                "{w:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = waits.iter().collect();
        assert!(distinct.len() > 100, "the waits spread out");
    }

    #[test]
    fn backoff_doubles_to_a_second_and_honours_the_hint_up_to_five_seconds() {
        let no_answer = TransportError::NoAnswer {
            detail: String::new(),
        };
        for n in 0..20 {
            let base = (0.05 * f64::from(1u32 << n.min(10))).min(1.0);
            let w = backoff(n, &no_answer).as_secs_f64();
            assert!(w >= base / 2.0 && w <= base, "attempt {n}: {w}");
        }
        let hinted = |ms| TransportError::Unavailable {
            retry_after: Some(Duration::from_millis(ms)),
            detail: String::new(),
        };
        assert!(backoff(0, &hinted(2000)) >= Duration::from_secs(2));
        assert!(backoff(0, &hinted(60_000)) <= Duration::from_secs(5));
    }

    #[test]
    fn a_deadline_allows_only_waits_that_end_before_it() {
        let d = Deadline::after(Some(Duration::from_secs(10)));
        assert!(d.allows(Duration::from_secs(1)));
        assert!(!d.allows(Duration::from_secs(11)));
        assert!(Deadline::after(None).allows(Duration::from_secs(1_000_000)));
        let floor = Deadline::after(Some(Duration::ZERO)).at_least(Duration::from_secs(5));
        assert!(floor.allows(Duration::from_secs(4)));
    }
}
