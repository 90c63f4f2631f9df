//! The [`Reconciler`] (SPEC §11.10): it turns records left `unknown`
//! (reconcile required) into the truth, without a human, wherever a hook
//! can tell: for each key prefix it pages the records that require
//! reconciliation, claims each with its stored reservation, the
//! principal's current generation and `marks_dispatch`, asks the prefix's
//! hook on a `reconcile` grant and reports the finding. It never runs an
//! effect (it does not hold the requests) and never guesses: a record whose
//! hook cannot tell stays `unknown`.
//!
//! Robustness (SPEC §11.10, §11.11): the reconcile lease is heartbeated
//! while a hook runs; a hook that fails, panics or runs past
//! `hook_timeout` counts under `errors`, its record is reported
//! `unavailable`, and the sweep goes on; a call whose answer was lost is
//! retried with the same arguments (a claim with the same `claim_id`) and
//! counted as what it did.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use settle_core::{
    Binding, ClaimDecision, Command, Fence, Grant, Key, LeaseMs, Reconcile, RefusalCode, Release,
    ReleaseReason, Reply, Reservation, RetentionS, Text,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::claim_id::new_claim_id;
use crate::error::{BoxError, RunError};
use crate::inspect::{Inspect, ReconcileRecord};
use crate::middleware::{
    DEFAULT_MAX_STORED_BODY, DEFAULT_STORED_HEADERS, MiddlewareHook, MiddlewareRecord, Resolution,
    encode_response, parse_worker_label, response_outcome,
};
use crate::op::{ask_hook, heartbeats};
use crate::retry::{Deadline, call, retrying};
use crate::run::{Finding, ReconcileHook};

/// The `worker` of the reconciler's claims, for operators (a middleware
/// record's reconcile claim copies that record's own field instead, SPEC §8).
pub const WORKER_LABEL: &str = "settle-reconciler";

/// How long each ledger call of one record is retried by default.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// What one sweep did (SPEC §11.10), or several added up ([`Sweep::add`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sweep {
    /// Records that required reconciliation when listed.
    pub seen: u64,
    /// Resolved by the hook as applied (settled with its outcome).
    pub committed: u64,
    /// Resolved by the hook as never applied (the next claim executes).
    pub not_committed: u64,
    /// The hook could not tell: the record stays `unknown`.
    pub unavailable: u64,
    /// Not the reconciler's to resolve any more (resolved meanwhile, held
    /// by a live lease, gone).
    pub skipped: u64,
    /// The ledger or the hook failed (a hook that failed, panicked or ran
    /// past `hook_timeout`: its record was reported `unavailable`); logged.
    pub errors: u64,
}

impl Sweep {
    /// Adds another sweep's counts to these (a total over sweeps).
    pub fn add(&mut self, o: Sweep) {
        self.seen += o.seen;
        self.committed += o.committed;
        self.not_committed += o.not_committed;
        self.unavailable += o.unavailable;
        self.skipped += o.skipped;
        self.errors += o.errors;
    }
}

/// Why [`Reconciler::start`] did not start a background loop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcilerError {
    /// A loop started by this reconciler still runs: `stop` it first (two
    /// loops would sweep the same records at once).
    #[error("this Reconciler is already running: stop() it first")]
    AlreadyRunning,
    /// `start` was called outside a Tokio runtime.
    #[error("Reconciler::start needs a Tokio runtime (call it from async code)")]
    NoRuntime,
}

/// A prefix's hook: the `run_once` kind, or one for middleware records.
#[derive(Clone)]
enum Hook {
    Plain(Arc<dyn ReconcileHook>),
    Middleware(Arc<dyn MiddlewareHook>),
}

/// What a hook found, as the ledger is told.
enum Found {
    Committed(settle_core::Outcome),
    NotCommitted,
    Unavailable,
}

/// What became of one record.
enum Outcome {
    Committed,
    NotCommitted,
    Unavailable,
    Skipped,
    Error,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::NotCommitted => "not_committed",
            Outcome::Unavailable => "unavailable",
            Outcome::Skipped => "skipped",
            Outcome::Error => "error",
        }
    }
}

/// Sweeps the records that require reconciliation, by key prefix, with a
/// hook per prefix (the same hooks `run_once` takes):
///
/// ```no_run
/// # async fn demo(client: settle_client::Client) {
/// use std::time::Duration;
/// use settle_worker::{Finding, Reconciler};
/// let r = Reconciler::new(client).hook("charge-", |key, fence| async move {
///     // Ask the payment provider whether a charge with this key exists.
///     Ok::<_, settle_worker::BoxError>(Finding::Unavailable)
/// });
/// let counts = r.sweep().await;
/// // Or in the background, until stopped:
/// r.start(Duration::from_secs(60)).expect("not running yet");
/// let ended = r.stop(Duration::from_secs(5)).await;
/// # }
/// ```
pub struct Reconciler {
    inner: Arc<Inner>,
    running: Mutex<Option<Running>>,
}

/// A background loop started by [`Reconciler::start`].
struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The configuration and the sweep itself, shared with a background loop.
#[derive(Clone)]
struct Inner {
    ledger: Arc<dyn Inspect>,
    hooks: Vec<(String, Hook)>,
    lease_ms: LeaseMs,
    hook_timeout: Option<Duration>,
    deadline: Duration,
    stored_headers: Vec<String>,
    max_stored_body: usize,
}

impl Reconciler {
    /// A reconciler over `ledger` (a `settle_client::Client`, or with the
    /// `local` feature a `LedgerTransport`), with no hooks yet.
    pub fn new(ledger: impl Inspect + 'static) -> Reconciler {
        Reconciler {
            inner: Arc::new(Inner {
                ledger: Arc::new(ledger),
                hooks: Vec::new(),
                lease_ms: LeaseMs::DEFAULT,
                hook_timeout: None,
                deadline: DEFAULT_DEADLINE,
                stored_headers: DEFAULT_STORED_HEADERS.map(str::to_string).to_vec(),
                max_stored_body: DEFAULT_MAX_STORED_BODY,
            }),
            running: Mutex::new(None),
        }
    }

    /// The settings of the next sweeps (a loop already started keeps the
    /// ones it was started with).
    fn with(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::make_mut(&mut self.inner));
        self
    }

    /// The hook for the keys that start with `prefix` (`""`: every key, the
    /// listing asked without `key_prefix`). A key under several prefixes
    /// is handled once, by the longest one's hook.
    #[must_use]
    pub fn hook(self, prefix: impl Into<String>, hook: impl ReconcileHook + 'static) -> Self {
        let prefix = prefix.into();
        self.with(|i| i.hooks.push((prefix, Hook::Plain(Arc::new(hook)))))
    }

    /// The hook for records of the Idempotency-Key middleware under
    /// `prefix` (their keys start with `mw-`; SPEC §11.10): besides the
    /// ledger key and fence it gets the client's `Idempotency-Key` value
    /// and principal, read from the claim's `worker` field (SPEC §8), so
    /// that a request its client never retries can be resolved. It answers
    /// like the middleware's own hook: [`Resolution::Committed`] with the
    /// response, which is stored the middleware's way (the client's retry
    /// through the middleware replays it; a body over the stored limit is
    /// kept as its digest and the replay answers 409
    /// `response_not_stored`), `NotCommitted` or `Unavailable`. A record
    /// without such a `worker` field counts under `errors` and stays
    /// `unknown`. See [`middleware_store`](Self::middleware_store).
    #[must_use]
    pub fn middleware_hook(
        self,
        prefix: impl Into<String>,
        hook: impl MiddlewareHook + 'static,
    ) -> Self {
        let prefix = prefix.into();
        self.with(|i| i.hooks.push((prefix, Hook::Middleware(Arc::new(hook)))))
    }

    /// How a middleware hook's response is stored: the middleware's
    /// `max_stored_body` and `stored_headers` options (default 32 KiB,
    /// `content-type` and `location`), so that it is stored exactly as
    /// the middleware in front of those records would have stored it.
    #[must_use]
    pub fn middleware_store<I: IntoIterator<Item = S>, S: Into<String>>(
        self,
        max_stored_body: usize,
        stored_headers: I,
    ) -> Self {
        let mut names: Vec<String> = DEFAULT_STORED_HEADERS.map(str::to_string).to_vec();
        for n in stored_headers {
            let n = n.into().to_ascii_lowercase();
            if !names.contains(&n) {
                names.push(n);
            }
        }
        self.with(|i| {
            i.max_stored_body = max_stored_body;
            i.stored_headers = names;
        })
    }

    /// The lease the reconciler claims with while a hook runs (default
    /// 30 s); it is heartbeated every third of it.
    #[must_use]
    pub fn lease(self, lease: LeaseMs) -> Self {
        self.with(|i| i.lease_ms = lease)
    }

    /// How long a hook may take (default: the lease); past it the hook
    /// counts under `errors` and its record is reported `unavailable`.
    #[must_use]
    pub fn hook_timeout(self, timeout: Duration) -> Self {
        self.with(|i| i.hook_timeout = Some(timeout))
    }

    /// How long each ledger call for one record is retried when it gets no
    /// answer, 503 or 429 (default 10 s); past it the record counts under
    /// `errors`.
    #[must_use]
    pub fn deadline(self, deadline: Duration) -> Self {
        self.with(|i| i.deadline = deadline)
    }

    /// One pass over every prefix.
    pub async fn sweep(&self) -> Sweep {
        self.inner.sweep(&CancellationToken::new()).await
    }

    /// Sweeps every `every` until `stop` is cancelled (the counters and log
    /// lines of each resolution as in [`sweep`](Self::sweep)); a hook
    /// running when `stop` is cancelled is abandoned and its record
    /// reported `unavailable`.
    pub async fn run(&self, every: Duration, stop: CancellationToken) {
        self.inner.run(every, stop).await;
    }

    /// Sweeps now and then every `interval` in a task of the current Tokio
    /// runtime, until [`stop`](Self::stop) (or until the reconciler is
    /// dropped). Refused with [`ReconcilerError::AlreadyRunning`] while a
    /// loop this reconciler started runs.
    pub fn start(&self, interval: Duration) -> Result<(), ReconcilerError> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().is_some_and(|r| !r.task.is_finished()) {
            return Err(ReconcilerError::AlreadyRunning);
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| ReconcilerError::NoRuntime)?;
        let stop = CancellationToken::new();
        let inner = self.inner.clone();
        let until = stop.clone();
        let task = rt.spawn(async move { inner.run(interval, until).await });
        *running = Some(Running { stop, task });
        Ok(())
    }

    /// Whether a loop started by [`start`](Self::start) still runs.
    pub fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| !r.task.is_finished())
    }

    /// Stops the background loop and waits for it at most `timeout`: a
    /// hook running is abandoned and its record reported `unavailable`
    /// (the report is a ledger call, so a loop may need a moment to end).
    /// `true` when the loop ended within the timeout; otherwise it is
    /// aborted at its next await (no further sweep starts) and `false` is
    /// answered. Returns within `timeout` either way. A reconciler that is
    /// not running answers `true` at once.
    pub async fn stop(&self, timeout: Duration) -> bool {
        let taken = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(Running { stop, mut task }) = taken else {
            return true;
        };
        stop.cancel();
        if tokio::time::timeout(timeout, &mut task).await.is_ok() {
            return true;
        }
        tracing::warn!(
            ?timeout,
            "reconciler: the background loop did not end in time; aborted"
        );
        task.abort();
        false
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = running.take() {
            r.stop.cancel();
            r.task.abort();
        }
    }
}

impl Inner {
    async fn run(&self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let s = self.sweep(&stop).await;
            if s.seen > 0 || s.errors > 0 {
                tracing::info!(?s, "reconciler sweep");
            }
        }
    }

    async fn sweep(&self, stop: &CancellationToken) -> Sweep {
        let mut total = Sweep::default();
        for (prefix, hook) in &self.hooks {
            if stop.is_cancelled() {
                break;
            }
            total.add(self.sweep_prefix(prefix, hook, stop).await);
        }
        total
    }

    /// Whether `key` belongs to a longer prefix than `prefix` that has a
    /// hook of its own (each key is handled once, by its most specific hook).
    fn owned_elsewhere(&self, prefix: &str, key: &str) -> bool {
        self.hooks
            .iter()
            .any(|(p, _)| p.len() > prefix.len() && key.starts_with(p.as_str()))
    }

    async fn sweep_prefix(&self, prefix: &str, hook: &Hook, stop: &CancellationToken) -> Sweep {
        let mut s = Sweep::default();
        let mut after: Option<String> = None;
        loop {
            let deadline = Deadline::after(Some(self.deadline));
            let listed = retrying("list", deadline, || {
                self.ledger.reconcile_required(prefix, after.as_deref())
            })
            .await;
            let (keys, next) = match listed {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "reconciler: listing failed");
                    s.errors += 1;
                    return s;
                }
            };
            for k in keys {
                if stop.is_cancelled() {
                    return s;
                }
                if self.owned_elsewhere(prefix, &k) {
                    continue;
                }
                s.seen += 1;
                let what = match Key::new(k.as_str()) {
                    Ok(key) => match self.one(&key, hook, stop).await {
                        Ok(w) => w,
                        Err(e) => {
                            tracing::warn!(key = %key, error = %e, "reconciler: failed; the record stays as it was");
                            Outcome::Error
                        }
                    },
                    Err(e) => {
                        tracing::warn!(key = k, error = %e, "reconciler: the listing gave a key outside the key syntax");
                        Outcome::Error
                    }
                };
                metrics::counter!(crate::names::RECONCILER, "result" => what.label()).increment(1);
                match what {
                    Outcome::Committed => s.committed += 1,
                    Outcome::NotCommitted => s.not_committed += 1,
                    Outcome::Unavailable => s.unavailable += 1,
                    Outcome::Skipped => s.skipped += 1,
                    Outcome::Error => s.errors += 1,
                }
            }
            match next {
                Some(n) => after = Some(n),
                None => return s,
            }
        }
    }

    /// The reconcile claim's `worker` and what a middleware hook is told:
    /// a middleware record's own `worker` field, copied (SPEC §8: it
    /// survives the 32-attempt bound), else [`WORKER_LABEL`].
    fn worker_of(rec: &ReconcileRecord) -> (String, Option<(String, String)>) {
        rec.workers
            .iter()
            .find_map(|w| parse_worker_label(w).map(|told| (w.clone(), Some(told))))
            .unwrap_or_else(|| (WORKER_LABEL.to_string(), None))
    }

    /// Claims one record and reports the hook's finding.
    async fn one(
        &self,
        key: &Key,
        hook: &Hook,
        stop: &CancellationToken,
    ) -> Result<Outcome, BoxError> {
        let deadline = Deadline::after(Some(self.deadline));
        let Some(rec) = retrying("get", deadline, || self.ledger.record(key)).await? else {
            return Ok(Outcome::Skipped);
        };
        if !rec.reconcile_required {
            return Ok(Outcome::Skipped);
        }
        let (worker, told) = Self::worker_of(&rec);
        if matches!(hook, Hook::Middleware(_)) && told.is_none() {
            return Err(
                "no `idempotency-key=… principal=…` worker field (SPEC §8): the middleware hook cannot be asked"
                    .into(),
            );
        }
        let res = rec.reservation;
        let generation = retrying("principal", deadline, || {
            self.ledger.generation(&res.principal)
        })
        .await?;
        let binding = Binding {
            principal: res.principal.clone(),
            scopes: res.scopes.clone(),
            generation: generation.max(res.generation),
        };
        let Some(grant) = self.claim(key, &res, &binding, worker, deadline).await? else {
            return Ok(Outcome::Skipped);
        };
        let found = self.ask(key, &grant, hook, told, stop).await;
        self.report(key, &res, binding, grant.fence, found, deadline)
            .await
    }

    /// The reconcile claim, with a fresh `claim_id` (a lost answer is
    /// retried with it and answered with the same grant). `None`: not the
    /// reconciler's to resolve (an execute lease, which it hands back, or
    /// any answer but a `reconcile` grant).
    async fn claim(
        &self,
        key: &Key,
        res: &Reservation,
        binding: &Binding,
        worker: String,
        deadline: Deadline,
    ) -> Result<Option<Grant>, BoxError> {
        let claim = settle_core::Claim {
            key: key.clone(),
            fingerprint: res.fingerprint,
            binding: binding.clone(),
            lease_ms: self.lease_ms,
            worker: Text::new("worker", worker).ok(),
            marks_dispatch: true,
            retention_s: RetentionS::DEFAULT,
            claim_id: Some(new_claim_id()),
        };
        match call(&*self.ledger, Command::Claim(claim), "claim", deadline).await? {
            Reply::Claim(ClaimDecision::Reconcile(g)) => Ok(Some(g)),
            Reply::Claim(ClaimDecision::Execute(g)) => {
                // Resolved meanwhile (someone reported not_committed): the
                // reconciler never runs effects; hand the lease back.
                self.release(key, g.fence, deadline).await?;
                Ok(None)
            }
            Reply::Claim(_) => Ok(None),
            other => Err(Box::new(RunError::from_reply("claim", other))),
        }
    }

    /// Asks the hook under heartbeats, bounded by `hook_timeout`, a panic
    /// isolated, abandoned when the reconciler is stopped.
    async fn ask(
        &self,
        key: &Key,
        grant: &Grant,
        hook: &Hook,
        told: Option<(String, String)>,
        stop: &CancellationToken,
    ) -> Result<Found, BoxError> {
        let lease = Duration::from_millis(self.lease_ms.get());
        let timeout = self.hook_timeout.unwrap_or(lease);
        let asked = async {
            match hook {
                Hook::Plain(h) => {
                    match ask_hook(|| h.reconcile(key.clone(), grant.fence), timeout).await? {
                        Finding::Committed(done) => Ok(Found::Committed(done.outcome()?)),
                        Finding::NotCommitted => Ok(Found::NotCommitted),
                        Finding::Unavailable => Ok(Found::Unavailable),
                    }
                }
                Hook::Middleware(h) => {
                    let (idempotency_key, principal) = told.unwrap_or_default();
                    let record = MiddlewareRecord {
                        ledger_key: key.clone(),
                        fence: grant.fence,
                        idempotency_key,
                        principal,
                    };
                    match ask_hook(|| h.reconcile(record), timeout).await? {
                        Resolution::Committed(r) => {
                            let (result, digest) = encode_response(
                                r.status,
                                &r.headers,
                                &r.body,
                                &self.stored_headers,
                                self.max_stored_body,
                            );
                            Ok(Found::Committed(response_outcome(
                                r.status, &result, &digest,
                            )?))
                        }
                        Resolution::NotCommitted => Ok(Found::NotCommitted),
                        Resolution::Unavailable => Ok(Found::Unavailable),
                    }
                }
            }
        };
        let lost = CancellationToken::new();
        let beats = async {
            heartbeats(&*self.ledger, key, grant.fence, lease, &lost).await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            found = asked => found,
            () = stop.cancelled() => Err("the reconciler was stopped while the hook ran".into()),
            () = beats => unreachable!("the heartbeat loop never finishes"),
        }
    }

    /// Reports the finding (a failed hook: `unavailable`, and the failure
    /// is the record's error); a lost answer is retried, and the repeat is
    /// answered as the first was (SPEC §4).
    async fn report(
        &self,
        key: &Key,
        res: &Reservation,
        binding: Binding,
        fence: Fence,
        found: Result<Found, BoxError>,
        deadline: Deadline,
    ) -> Result<Outcome, BoxError> {
        let (finding, failed) = match found {
            Ok(Found::Committed(o)) => (
                settle_core::Finding::committed(res.fingerprint, binding, o)?,
                None,
            ),
            Ok(Found::NotCommitted) => (settle_core::Finding::NotCommitted, None),
            Ok(Found::Unavailable) => (settle_core::Finding::Unavailable, None),
            Err(e) => (settle_core::Finding::Unavailable, Some(e)),
        };
        let cmd = Command::Reconcile(Reconcile {
            key: key.clone(),
            fence,
            finding,
        });
        // The report is retried for at least the lease: a finding the
        // hook took long to make is not dropped for a deadline counted
        // from before it.
        let lease = Duration::from_millis(self.lease_ms.get());
        let deadline = deadline.at_least(lease);
        match call(&*self.ledger, cmd, "reconcile", deadline).await? {
            Reply::Receipt(r) => {
                tracing::info!(key = %key, fence = fence.0, status = r.status.as_str(), "reconciler: committed");
                Ok(Outcome::Committed)
            }
            Reply::Claim(ClaimDecision::Execute(g)) => {
                // not_committed: the same lease, now for execution; the
                // reconciler never executes, so it hands it back.
                self.release(key, g.fence, deadline).await?;
                tracing::info!(key = %key, fence = g.fence.0, "reconciler: not committed; the next claim executes");
                Ok(Outcome::NotCommitted)
            }
            Reply::Released { .. } => match failed {
                Some(e) => Err(e),
                None => {
                    tracing::info!(key = %key, fence = fence.0, "reconciler: the hook cannot tell; still unknown");
                    Ok(Outcome::Unavailable)
                }
            },
            other => Err(Box::new(RunError::from_reply("reconcile", other))),
        }
    }

    /// `release(not_dispatched)` of an execute lease the reconciler never
    /// uses; a lost answer is retried (the repeat answers 200).
    async fn release(&self, key: &Key, fence: Fence, deadline: Deadline) -> Result<(), BoxError> {
        let cmd = Command::Release(Release {
            key: key.clone(),
            fence,
            reason: ReleaseReason::NotDispatched,
            forget: false,
        });
        match call(&*self.ledger, cmd, "release", deadline).await? {
            Reply::Released { .. }
            | Reply::Refused(RefusalCode::StaleFence | RefusalCode::LeaseExpired) => Ok(()),
            other => Err(format!("release answered {}", other.label()).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{BoxFuture, Transport, TransportError};
    use settle_core::Principal;

    /// A ledger that answers nothing: the lifecycle needs no records.
    struct Empty;

    impl Transport for Empty {
        fn execute(&self, _: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
            Box::pin(async {
                Err(TransportError::Fatal {
                    detail: "empty".into(),
                })
            })
        }
    }

    impl Inspect for Empty {
        fn reconcile_required<'a>(
            &'a self,
            _: &'a str,
            _: Option<&'a str>,
        ) -> BoxFuture<'a, Result<crate::KeyPage, TransportError>> {
            Box::pin(async { Ok((Vec::new(), None)) })
        }
        fn record<'a>(
            &'a self,
            _: &'a Key,
        ) -> BoxFuture<'a, Result<Option<ReconcileRecord>, TransportError>> {
            Box::pin(async { Ok(None) })
        }
        fn generation<'a>(
            &'a self,
            _: &'a Principal,
        ) -> BoxFuture<'a, Result<u64, TransportError>> {
            Box::pin(async { Ok(0) })
        }
    }

    #[tokio::test]
    async fn a_second_start_is_refused_and_stop_lets_it_start_again() {
        let r = Reconciler::new(Empty).hook("", |_: Key, _: Fence| async {
            Ok::<_, BoxError>(Finding::Unavailable)
        });
        r.start(Duration::from_millis(10)).unwrap();
        assert_eq!(
            r.start(Duration::from_millis(10)),
            Err(ReconcilerError::AlreadyRunning)
        );
        assert!(r.is_running());
        assert!(r.stop(Duration::from_secs(5)).await);
        assert!(!r.is_running());
        r.start(Duration::from_millis(10)).unwrap();
        assert!(r.stop(Duration::from_secs(5)).await);
        assert!(
            r.stop(Duration::from_secs(5)).await,
            "not running: true at once"
        );
    }

    #[test]
    fn start_outside_a_runtime_is_a_typed_error() {
        let r = Reconciler::new(Empty);
        assert_eq!(
            r.start(Duration::from_secs(1)),
            Err(ReconcilerError::NoRuntime)
        );
    }
}
