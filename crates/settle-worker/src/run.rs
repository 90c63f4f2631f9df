//! `run_once`: the worker client contract of SPEC §11.
//!
//! A run claims the key (the same key on every retry), and then:
//!
//! * `replay` (§11.6): returns the stored outcome, `replayed = true`,
//!   without calling the effect;
//! * `in_flight` (§11.5): waits `retry_after_ms` with jitter and claims
//!   again, until the caller's deadline;
//! * `reconcile` (§11.4): asks the caller's [`ReconcileHook`] whether the
//!   remote effect happened and reports the finding; `not_committed`
//!   continues as `execute` under the same fence; without a hook the lease
//!   is handed back (`reconcile(unavailable)`) and the run fails with
//!   [`RunError::ReconcileRequired`]; with [`Reconcile::Resend`] (§11.9)
//!   the effect runs again under the reconcile lease, for a remote that
//!   de-duplicates by the key itself;
//! * `execute` (§11.3): heartbeats at a third of `lease_ms` while the effect
//!   runs, tells the effect through [`EffectContext::lease_lost`] when the
//!   lease ended, then settles the outcome, retrying a settle that got no
//!   answer under the same fence until it answers.
//!
//! Refusals are typed ([`RunError::Refused`]) and never retried (§11.7);
//! transport failures and an unavailable ledger back off with jitter and
//! retry until the deadline.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use serde_json::Value;
use settle_core::{
    Binding, ClaimDecision, Command, Digest, ErrorText, Fence, Grant, Heartbeat, InvalidInput, Key,
    LeaseMs, Outcome, Principal, Receipt, Reconcile as ReconcileCmd, Release, ReleaseReason, Reply,
    ResultJson, RetentionS, Scopes, Settle, Text,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::error::{BoxError, EffectError, RunError};
use crate::fingerprint::{canonicalize, fingerprint, fingerprint_fields, sha256};
use crate::names;
use crate::retry::{Deadline, call, in_flight_wait};
use crate::transport::{BoxFuture, Transport};

/// The caller's deadline when none is set: 30 s, as in the other SDKs.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// What an effect (or a reconcile hook that found the effect applied)
/// returns: the result to record and, when there is one, the upstream's raw
/// response. `response_sha256` is the SHA-256 of the raw response, or of
/// the canonical JSON of the result when there is none. A `failed` outcome
/// records a definitive failure of the upstream (SPEC §3).
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    result: Value,
    response: Option<Vec<u8>>,
    failed: bool,
    error: Option<String>,
}

impl Done {
    /// The effect completed with `result`.
    pub fn completed(result: Value) -> Done {
        Done {
            result,
            response: None,
            failed: false,
            error: None,
        }
    }

    /// The upstream definitively failed the operation; `result` describes it.
    pub fn failed(result: Value) -> Done {
        Done {
            failed: true,
            ..Done::completed(result)
        }
    }

    /// The upstream's raw response, whose SHA-256 becomes `response_sha256`.
    #[must_use]
    pub fn with_response(mut self, raw: impl Into<Vec<u8>>) -> Done {
        self.response = Some(raw.into());
        self
    }

    /// An error text to keep with a `failed` outcome.
    #[must_use]
    pub fn with_error(mut self, error: impl Into<String>) -> Done {
        self.error = Some(error.into());
        self
    }

    /// The result.
    pub fn result(&self) -> &Value {
        &self.result
    }

    /// The outcome this records (validated: a result the fingerprint rules
    /// cannot canonicalise is refused before anything is sent).
    pub fn outcome(&self) -> Result<Outcome, RunError> {
        let canonical = canonicalize(&self.result)?;
        let digest = match &self.response {
            Some(raw) => sha256(raw),
            None => sha256(canonical.as_bytes()),
        };
        let result = ResultJson::from_value(&self.result, usize::MAX).map_err(|input| {
            RunError::Invalid {
                call: "settle",
                input,
            }
        })?;
        Ok(if self.failed {
            let error = self
                .error
                .as_ref()
                .map(|e| ErrorText::new("outcome.error", e.as_str()))
                .transpose()
                .map_err(|input| RunError::Invalid {
                    call: "settle",
                    input,
                })?;
            Outcome::failed(result, digest, error)
        } else {
            Outcome::completed(result, digest)
        })
    }
}

/// What a reconcile hook reports about the remote effect (SPEC §4 reconcile).
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// The effect was applied: record this outcome (`committed`).
    Committed(Done),
    /// It was not: execute now, under the same fence (`not_committed`).
    NotCommitted,
    /// The remote cannot tell yet (`unavailable`): the record keeps needing
    /// reconciliation.
    Unavailable,
}

/// The caller's reconcile hook (SPEC §11 step 4): asks the remote, with the
/// key and fence an earlier attempt passed to it, whether that attempt's
/// effect happened. Any `Fn(Key, Fence) -> impl Future<Output =
/// Result<Finding, BoxError>>` is one. The same hook serves `run_once` and
/// the [`Reconciler`](crate::Reconciler) that sweeps records left `unknown`.
pub trait ReconcileHook: Send + Sync {
    /// Finds out whether the effect for `key` happened.
    fn reconcile(&self, key: Key, fence: Fence) -> BoxFuture<'_, Result<Finding, BoxError>>;
}

/// What a run does with a `reconcile` grant (an earlier attempt may have
/// reached the remote).
#[derive(Clone)]
pub enum Reconcile {
    /// Ask this hook whether the effect happened (SPEC §11 step 4).
    Hook(Arc<dyn ReconcileHook>),
    /// Run the effect again, with the same key, under the reconcile lease
    /// (SPEC §11.9): only for a remote that de-duplicates by the key itself
    /// (it honours an `Idempotency-Key`, or it is behind settle), so that
    /// a second send of an applied effect is answered, not applied again.
    /// Success is reported `committed` with its outcome; any failure
    /// `unavailable`. The effect's `dispatch` is a local no-op (a reconcile
    /// lease cannot dispatch).
    Resend,
}

impl Reconcile {
    /// [`Reconcile::Hook`] from any hook (a closure included).
    pub fn hook(h: impl ReconcileHook + 'static) -> Reconcile {
        Reconcile::Hook(Arc::new(h))
    }
}

impl<H: ReconcileHook + 'static> From<H> for Reconcile {
    fn from(h: H) -> Reconcile {
        Reconcile::hook(h)
    }
}

impl<F, Fut> ReconcileHook for F
where
    F: Fn(Key, Fence) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Finding, BoxError>> + Send + 'static,
{
    fn reconcile(&self, key: Key, fence: Fence) -> BoxFuture<'_, Result<Finding, BoxError>> {
        Box::pin(self(key, fence))
    }
}

impl ReconcileHook for Arc<dyn ReconcileHook> {
    fn reconcile(&self, key: Key, fence: Fence) -> BoxFuture<'_, Result<Finding, BoxError>> {
        (**self).reconcile(key, fence)
    }
}

/// How to run one operation. `RunOptions::new("svc-billing")` has the
/// spec's defaults: no scopes, generation 0, the whole request
/// fingerprinted, a 30 s lease, no dispatch marking, a 30 s deadline.
#[derive(Clone)]
pub struct RunOptions {
    principal: String,
    scopes: Vec<String>,
    generation: u64,
    fields: Option<Vec<String>>,
    fingerprint: Option<Digest>,
    lease_ms: u64,
    marks_dispatch: bool,
    worker: Option<String>,
    retention_s: Option<u64>,
    deadline: Option<Duration>,
    reconcile: Option<Reconcile>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("principal", &self.principal)
            .field("scopes", &self.scopes)
            .field("generation", &self.generation)
            .field("fields", &self.fields)
            .field("lease_ms", &self.lease_ms)
            .field("marks_dispatch", &self.marks_dispatch)
            .field("deadline", &self.deadline)
            .field(
                "reconcile",
                &match &self.reconcile {
                    None => "none",
                    Some(Reconcile::Hook(_)) => "hook",
                    Some(Reconcile::Resend) => "resend",
                },
            )
            .finish_non_exhaustive()
    }
}

impl RunOptions {
    /// The defaults, acting for `principal`.
    pub fn new(principal: impl Into<String>) -> RunOptions {
        RunOptions {
            principal: principal.into(),
            scopes: Vec::new(),
            generation: 0,
            fields: None,
            fingerprint: None,
            lease_ms: LeaseMs::DEFAULT.get(),
            marks_dispatch: false,
            worker: None,
            retention_s: None,
            deadline: Some(DEFAULT_DEADLINE),
            reconcile: None,
        }
    }
    /// The binding's scopes.
    #[must_use]
    pub fn scopes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, scopes: I) -> Self {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }
    /// The binding's generation (raise it after re-authenticating).
    #[must_use]
    pub fn generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }
    /// Fingerprint only these fields of the request (JSON pointers).
    #[must_use]
    pub fn fields<I: IntoIterator<Item = S>, S: Into<String>>(mut self, fields: I) -> Self {
        self.fields = Some(fields.into_iter().map(Into::into).collect());
        self
    }
    /// Use this fingerprint instead of computing one from the request.
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: Digest) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }
    /// The lease to ask for (heartbeats renew it every third of it).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self
    }
    /// Claim with `marks_dispatch`: the effect calls
    /// [`EffectContext::dispatch`] right before the remote write, and a
    /// failure before it hands the lease back (`release(not_dispatched)`).
    #[must_use]
    pub fn marks_dispatch(mut self, on: bool) -> Self {
        self.marks_dispatch = on;
        self
    }
    /// A name for this worker, kept on the attempt.
    #[must_use]
    pub fn worker(mut self, name: impl Into<String>) -> Self {
        self.worker = Some(name.into());
        self
    }
    /// How long the settled record is kept (set by the claim that creates it).
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention_s = Some(retention.as_secs());
        self
    }
    /// How long the run may wait (in_flight) and retry (unavailable, no
    /// answer); `None`: no limit. A settle that got no answer is retried at
    /// least for the lease plus a second, whatever the deadline.
    #[must_use]
    pub fn deadline(mut self, deadline: Option<Duration>) -> Self {
        self.deadline = deadline;
        self
    }
    /// What to do with a `reconcile` grant: a hook (SPEC §11 step 4; a
    /// closure converts), or [`Reconcile::Resend`] (§11.9).
    #[must_use]
    pub fn reconcile(mut self, r: impl Into<Reconcile>) -> Self {
        self.reconcile = Some(r.into());
        self
    }

    fn binding(&self) -> Result<Binding, InvalidInput> {
        Ok(Binding {
            principal: Principal::new(self.principal.as_str())?,
            scopes: Scopes::from_strs(self.scopes.iter())?,
            generation: self.generation,
        })
    }
}

/// The one true outcome of the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    /// The outcome recorded.
    pub outcome: Outcome,
    /// Its receipt.
    pub receipt: Receipt,
    /// It was stored before this run, and the effect was not called.
    pub replayed: bool,
    /// The fence this run held (`None` for a replay).
    pub fence: Option<Fence>,
    /// The reconcile hook found the effect applied, and it was recorded.
    pub reconciled: bool,
}

/// Handed to the effect: the key and fence to pass to the remote (its
/// idempotency key and fencing token), `dispatch`, and `lease_lost`.
pub struct EffectContext<'a> {
    transport: &'a dyn Transport,
    key: Key,
    fence: Fence,
    attempt: u32,
    marks_dispatch: bool,
    dispatched: AtomicBool,
    lease_lost: CancellationToken,
    deadline: Deadline,
}

impl EffectContext<'_> {
    /// The idempotency key.
    pub fn key(&self) -> &Key {
        &self.key
    }
    /// The fence of this run's lease: pass it to the remote, which should
    /// refuse a write under an older fence.
    pub fn fence(&self) -> Fence {
        self.fence
    }
    /// Which attempt of the operation this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// Cancelled when the lease ended (a heartbeat was refused, or none got
    /// through before the lease ran out): stop, a settle will be refused.
    pub fn lease_lost(&self) -> &CancellationToken {
        &self.lease_lost
    }
    /// Whether [`dispatch`](Self::dispatch) was called.
    pub fn dispatched(&self) -> bool {
        self.dispatched.load(Ordering::Acquire)
    }

    /// Records the commit boundary right before the remote write (SPEC §4
    /// dispatch; required when the run uses `marks_dispatch`, a no-op
    /// otherwise). On an error the remote write must not be made; `?` turns
    /// it into [`EffectError::NotSent`].
    pub async fn dispatch(&self) -> Result<(), RunError> {
        if self.marks_dispatch && !self.dispatched() {
            let cmd = Command::Dispatch(settle_core::Dispatch {
                key: self.key.clone(),
                fence: self.fence,
            });
            match call(self.transport, cmd, "dispatch", self.deadline).await? {
                Reply::Dispatched(_) => {}
                other => return Err(RunError::from_reply("dispatch", other)),
            }
        }
        self.dispatched.store(true, Ordering::Release);
        Ok(())
    }
}

/// Runs `effect` at most once for `key` (SPEC §11); see the module docs.
///
/// The effect gets an [`EffectContext`] and returns [`Done`], or an
/// [`EffectError`] that says whether anything reached the remote. A panic
/// of the effect is recorded like [`EffectError::Unknown`] (or hands the
/// lease back when nothing was dispatched under `marks_dispatch`) and then
/// resumes. The heartbeats run in this task, beside the effect: an effect
/// that blocks the thread must move that work to `spawn_blocking`.
pub async fn run_once<E>(
    transport: &dyn Transport,
    key: &str,
    request: &Value,
    effect: E,
    options: &RunOptions,
) -> Result<RunResult, RunError>
where
    E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
{
    let span = tracing::info_span!("run_once", key, fence = tracing::field::Empty);
    run(transport, key, request, effect, options)
        .instrument(span)
        .await
}

async fn run<E>(
    t: &dyn Transport,
    key: &str,
    request: &Value,
    effect: E,
    o: &RunOptions,
) -> Result<RunResult, RunError>
where
    E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
{
    let invalid = |input| RunError::Invalid {
        call: "claim",
        input,
    };
    let key = Key::new(key).map_err(invalid)?;
    let fp = match (&o.fingerprint, &o.fields) {
        (Some(d), _) => *d,
        (None, Some(f)) => fingerprint_fields(request, f)?,
        (None, None) => fingerprint(request)?,
    };
    let binding = o.binding().map_err(invalid)?;
    let claim = settle_core::Claim {
        key: key.clone(),
        fingerprint: fp,
        binding: binding.clone(),
        lease_ms: LeaseMs::new(o.lease_ms).map_err(invalid)?,
        worker: o
            .worker
            .as_deref()
            .map(|w| Text::new("worker", w))
            .transpose()
            .map_err(invalid)?,
        marks_dispatch: o.marks_dispatch,
        retention_s: match o.retention_s {
            Some(s) => RetentionS::new(s).map_err(invalid)?,
            None => RetentionS::DEFAULT,
        },
        claim_id: None,
    };
    let op = Op {
        t,
        key,
        fp,
        binding,
        lease: Duration::from_millis(o.lease_ms),
        marks_dispatch: o.marks_dispatch,
        deadline: Deadline::after(o.deadline),
    };
    let mut grant = op.claim_until_granted(claim).await?;
    if let Granted::Replay(r) = grant {
        return Ok(r);
    }
    if let Granted::Reconcile(g) = grant {
        let hook = match &o.reconcile {
            Some(Reconcile::Resend) => return op.resend(g, effect).await,
            Some(Reconcile::Hook(h)) => Some(&**h),
            None => None,
        };
        grant = op.reconcile(g, hook).await?;
        if let Granted::Replay(r) = grant {
            return Ok(r);
        }
    }
    let Granted::Execute(g) = grant else {
        unreachable!("reconcile answers a receipt or an execute grant")
    };
    op.execute(g, effect).await
}

/// What the claim phase ended with.
enum Granted {
    /// Settled before (a replay), or just recorded by reconcile.
    Replay(RunResult),
    Execute(Grant),
    Reconcile(Grant),
}

/// One operation: what every step of the run needs.
struct Op<'a> {
    t: &'a dyn Transport,
    key: Key,
    fp: Digest,
    binding: Binding,
    lease: Duration,
    marks_dispatch: bool,
    deadline: Deadline,
}

impl Op<'_> {
    /// Steps 2, 5, 6: claim, waiting out `in_flight`, until granted or replayed.
    async fn claim_until_granted(&self, claim: settle_core::Claim) -> Result<Granted, RunError> {
        loop {
            let reply = call(
                self.t,
                Command::Claim(claim.clone()),
                "claim",
                self.deadline,
            )
            .await?;
            let decision = match reply {
                Reply::Claim(d) => d,
                other => return Err(RunError::from_reply("claim", other)),
            };
            tracing::debug!(decision = decision.name(), "claimed");
            match decision {
                ClaimDecision::Replay { outcome, receipt } => {
                    metrics::counter!(names::REPLAYS).increment(1);
                    return Ok(Granted::Replay(RunResult {
                        outcome,
                        receipt,
                        replayed: true,
                        fence: None,
                        reconciled: false,
                    }));
                }
                ClaimDecision::InFlight { retry_after_ms, .. } => {
                    let wait = in_flight_wait(retry_after_ms);
                    if !self.deadline.allows(wait) {
                        return Err(RunError::DeadlineExceeded {
                            what: "the operation is still in flight",
                            last: None,
                        });
                    }
                    metrics::counter!(names::IN_FLIGHT_WAITS).increment(1);
                    tokio::time::sleep(wait).await;
                }
                ClaimDecision::Execute(g) => {
                    tracing::Span::current().record("fence", g.fence.0);
                    return Ok(Granted::Execute(g));
                }
                ClaimDecision::Reconcile(g) => {
                    tracing::Span::current().record("fence", g.fence.0);
                    return Ok(Granted::Reconcile(g));
                }
            }
        }
    }

    /// A settle, release or reconcile after the effect is retried at least
    /// for as long as the lease could still be held (rule 0 answers a
    /// retried committed settle with its receipt even after that), and to
    /// the caller's deadline when that is later.
    fn settle_deadline(&self) -> Deadline {
        self.deadline.at_least(self.lease + Duration::from_secs(1))
    }

    /// Step 4: ask the hook and report its finding.
    async fn reconcile(
        &self,
        g: Grant,
        hook: Option<&dyn ReconcileHook>,
    ) -> Result<Granted, RunError> {
        let lost = CancellationToken::new();
        let found = match hook {
            None => Ok(Finding::Unavailable),
            Some(h) => {
                let asked = h.reconcile(self.key.clone(), g.fence);
                self.with_heartbeats(g.fence, &lost, asked).await
            }
        };
        self.report(g, found).await
    }

    /// SPEC §11.9: the effect again, with the same key, under the reconcile
    /// lease (the remote de-duplicates by the key); its success is the
    /// finding `committed`, any failure `unavailable`.
    async fn resend<E>(&self, g: Grant, effect: E) -> Result<RunResult, RunError>
    where
        E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
    {
        let ctx = EffectContext {
            transport: self.t,
            key: self.key.clone(),
            fence: g.fence,
            attempt: g.attempt,
            // A reconcile lease cannot dispatch: `dispatch` is a no-op.
            marks_dispatch: false,
            dispatched: AtomicBool::new(false),
            lease_lost: CancellationToken::new(),
            deadline: self.deadline,
        };
        let ran = AssertUnwindSafe(effect(&ctx)).catch_unwind();
        let ran = self.with_heartbeats(g.fence, &ctx.lease_lost, ran).await;
        let found: Result<Finding, BoxError> = match ran {
            Ok(Ok(done)) => Ok(Finding::Committed(done)),
            Ok(Err(e)) => Err(Box::new(e)),
            Err(_) => Err("the resent effect panicked".into()),
        };
        tracing::info!(key = %self.key, fence = g.fence.0, committed = found.is_ok(), "resent under the reconcile lease");
        match self.report(g, found).await? {
            Granted::Replay(r) => Ok(r),
            _ => unreachable!("a committed finding answers a receipt, unavailable an error"),
        }
    }

    /// Reports a finding (a hook's, or a resend's) under the reconcile lease.
    async fn report(
        &self,
        g: Grant,
        found: Result<Finding, BoxError>,
    ) -> Result<Granted, RunError> {
        let (finding, failure) = match found {
            Ok(f) => (f, None),
            Err(e) => (Finding::Unavailable, Some(e)),
        };
        let core_finding = match &finding {
            Finding::Committed(done) => {
                settle_core::Finding::committed(self.fp, self.binding.clone(), done.outcome()?)
                    .map_err(|input| RunError::Invalid {
                        call: "reconcile",
                        input,
                    })?
            }
            Finding::NotCommitted => settle_core::Finding::NotCommitted,
            Finding::Unavailable => settle_core::Finding::Unavailable,
        };
        let cmd = Command::Reconcile(ReconcileCmd {
            key: self.key.clone(),
            fence: g.fence,
            finding: core_finding,
        });
        let reply = call(self.t, cmd, "reconcile", self.settle_deadline()).await?;
        match (finding, reply) {
            (Finding::Committed(done), Reply::Receipt(receipt)) => Ok(Granted::Replay(RunResult {
                outcome: done.outcome()?,
                receipt,
                replayed: false,
                fence: Some(g.fence),
                reconciled: true,
            })),
            (Finding::NotCommitted, Reply::Claim(ClaimDecision::Execute(g))) => {
                Ok(Granted::Execute(g))
            }
            (Finding::Unavailable, Reply::Released { .. }) => Err(match failure {
                Some(source) => RunError::ReconcileFailed {
                    key: self.key.clone(),
                    fence: g.fence,
                    source,
                },
                None => RunError::ReconcileRequired {
                    key: self.key.clone(),
                    fence: g.fence,
                },
            }),
            (_, other) => Err(RunError::from_reply("reconcile", other)),
        }
    }

    /// Runs `fut` while heartbeats keep the lease; `lost` is cancelled when
    /// the lease ends. The beats stop when `fut` finishes.
    async fn with_heartbeats<F: Future>(
        &self,
        fence: Fence,
        lost: &CancellationToken,
        fut: F,
    ) -> F::Output {
        let beats = async {
            heartbeats(self.t, &self.key, fence, self.lease, lost).await;
            // The lease is gone; the effect decides what to do about it.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            out = fut => out,
            () = beats => unreachable!("the heartbeat loop never finishes"),
        }
    }

    /// Step 3: the effect under heartbeats, then settle or release.
    async fn execute<E>(&self, g: Grant, effect: E) -> Result<RunResult, RunError>
    where
        E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
    {
        let ctx = EffectContext {
            transport: self.t,
            key: self.key.clone(),
            fence: g.fence,
            attempt: g.attempt,
            marks_dispatch: self.marks_dispatch,
            dispatched: AtomicBool::new(false),
            lease_lost: CancellationToken::new(),
            deadline: self.deadline,
        };
        let ran = AssertUnwindSafe(effect(&ctx)).catch_unwind();
        let ran = self.with_heartbeats(g.fence, &ctx.lease_lost, ran).await;
        let nothing_sent = self.marks_dispatch && !ctx.dispatched();
        let done = match ran {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Err(self.after_effect_error(&ctx, e).await),
            Err(panic) => {
                if nothing_sent {
                    self.release(g.fence, ReleaseReason::NotDispatched).await;
                } else {
                    let _ = self.settle_unknown(g.fence, "the effect panicked").await;
                }
                std::panic::resume_unwind(panic);
            }
        };
        let outcome = match done.outcome() {
            Ok(o) => o,
            Err(e) if nothing_sent => {
                // SPEC §11.8: under marks_dispatch, a failure before the
                // dispatch mark is "not sent", whatever it was.
                self.release(g.fence, ReleaseReason::NotDispatched).await;
                return Err(e);
            }
            Err(e) => {
                // The effect ran but its result cannot be recorded.
                let receipt = self
                    .settle_unknown(g.fence, &e.to_string())
                    .await
                    .ok()
                    .map(Box::new);
                return Err(RunError::OutcomeUnknown {
                    key: self.key.clone(),
                    receipt,
                    source: Box::new(e),
                });
            }
        };
        let settle = Command::Settle(Settle {
            key: self.key.clone(),
            fence: g.fence,
            fingerprint: self.fp,
            binding: self.binding.clone(),
            outcome: outcome.clone(),
        });
        let lost = CancellationToken::new();
        let settled = call(self.t, settle, "settle", self.settle_deadline());
        match self.with_heartbeats(g.fence, &lost, settled).await? {
            Reply::Receipt(receipt) => Ok(RunResult {
                outcome,
                receipt,
                replayed: false,
                fence: Some(g.fence),
                reconciled: false,
            }),
            Reply::Invalid(input) => {
                // The ledger refused the outcome (e.g. a result over its
                // size limit); what happened is recorded as unknown.
                let _ = self.settle_unknown(g.fence, &input.to_string()).await;
                Err(RunError::Invalid {
                    call: "settle",
                    input,
                })
            }
            other => Err(RunError::from_reply("settle", other)),
        }
    }

    /// The effect said what happened: release (nothing sent, or refused by
    /// the remote) or settle `unknown`.
    async fn after_effect_error(&self, ctx: &EffectContext<'_>, e: EffectError) -> RunError {
        let nothing_sent = self.marks_dispatch && !ctx.dispatched();
        match e {
            EffectError::NotSent(source) => {
                let reason = if nothing_sent {
                    ReleaseReason::NotDispatched
                } else {
                    ReleaseReason::NotCommitted
                };
                self.release(ctx.fence, reason).await;
                RunError::NotSent { source }
            }
            EffectError::Refused(source) => {
                self.release(ctx.fence, ReleaseReason::NotCommitted).await;
                RunError::EffectRefused { source }
            }
            EffectError::Unknown(source) if nothing_sent => {
                // Nothing could have been sent: hand the lease back.
                self.release(ctx.fence, ReleaseReason::NotDispatched).await;
                RunError::NotSent { source }
            }
            EffectError::Unknown(source) => {
                let receipt = self
                    .settle_unknown(ctx.fence, &source.to_string())
                    .await
                    .ok()
                    .map(Box::new);
                RunError::OutcomeUnknown {
                    key: self.key.clone(),
                    receipt,
                    source,
                }
            }
        }
    }

    /// Hands the lease back. When the ledger cannot be told that nothing
    /// happened (`receipt_required`: a dispatch was recorded; an older
    /// server without `not_committed`), the safe record is `unknown`.
    /// Failures are logged: the run reports the effect's own error, and a
    /// lease that was not handed back ends by expiry.
    async fn release(&self, fence: Fence, reason: ReleaseReason) {
        let cmd = Command::Release(Release {
            key: self.key.clone(),
            fence,
            reason,
            forget: false,
        });
        match call(self.t, cmd, "release", self.settle_deadline()).await {
            Ok(Reply::Released { .. }) => {}
            Ok(Reply::Refused(settle_core::RefusalCode::ReceiptRequired) | Reply::Invalid(_)) => {
                let _ = self
                    .settle_unknown(fence, "the release was refused; recorded as unknown")
                    .await;
            }
            Ok(other) => {
                tracing::warn!(
                    reply = other.label(),
                    reason = reason.as_str(),
                    "release not accepted"
                );
            }
            Err(e) => tracing::warn!(error = %e, reason = reason.as_str(), "release failed"),
        }
    }

    /// Settles `unknown` (reconcile required) and answers its receipt.
    async fn settle_unknown(&self, fence: Fence, why: &str) -> Result<Receipt, RunError> {
        let error = ErrorText::new("outcome.error", truncate(why, 1000)).ok();
        let cmd = Command::Settle(Settle {
            key: self.key.clone(),
            fence,
            fingerprint: self.fp,
            binding: self.binding.clone(),
            outcome: Outcome::unknown(error),
        });
        match call(self.t, cmd, "settle", self.settle_deadline()).await {
            Ok(Reply::Receipt(r)) => Ok(r),
            Ok(other) => {
                let e = RunError::from_reply("settle", other);
                tracing::warn!(error = %e, "settle unknown not accepted");
                Err(e)
            }
            Err(e) => {
                tracing::warn!(error = %e, "settle unknown failed");
                Err(e)
            }
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Renews the lease every third of it until it is lost: a heartbeat is
/// refused, or none got through before the lease ran out (counted from
/// before the last successful beat was sent, so this side gives up no later
/// than the ledger does). Then cancels `lost` and returns.
async fn heartbeats(
    t: &dyn Transport,
    key: &Key,
    fence: Fence,
    lease: Duration,
    lost: &CancellationToken,
) {
    let every = lease / 3;
    let mut valid_until = Instant::now() + lease;
    loop {
        tokio::time::sleep(every).await;
        let sent = Instant::now();
        let cmd = Command::Heartbeat(Heartbeat {
            key: key.clone(),
            fence,
            lease_ms: None,
        });
        let why = match tokio::time::timeout_at(valid_until, t.execute(cmd)).await {
            Ok(Ok(Reply::Heartbeat(_))) => {
                valid_until = sent + lease;
                continue;
            }
            Ok(Err(e)) if e.is_retryable() => {
                if Instant::now() < valid_until {
                    continue; // the next beat may get through
                }
                "no heartbeat got through before the lease ran out".to_owned()
            }
            Ok(Err(e)) => e.to_string(),
            Ok(Ok(reply)) => format!("heartbeat answered {}", reply.label()),
            Err(_) => "no heartbeat got through before the lease ran out".to_owned(),
        };
        tracing::warn!(%fence, why, "lease lost");
        metrics::counter!(names::LEASES_LOST).increment(1);
        lost.cancel();
        return;
    }
}
