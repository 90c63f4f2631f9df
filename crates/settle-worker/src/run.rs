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
//! retry until the deadline. A call whose answer was lost is sent again
//! with identical arguments (§11.11): a claim with the same random
//! `claim_id`, which the ledger answers with the grant the first one got
//! (claim rule 5a); a repeated dispatch, release or reconcile is answered
//! as the first was. The steps after the effect (the settle, a release,
//! the `unknown` settle after a failure, a reconcile finding) are retried
//! past the caller's deadline up to the lease's length, so that the record
//! is not left to a lease that lapses.
//!
//! The one rule that decides every failure after the effect started: the
//! run never attests on its own inference (§11.11). `release(not_committed)`
//! is sent only on the caller's word (an [`EffectError::NotSent`] the effect
//! wrote itself, an [`EffectError::Refused`]) or after a hook's
//! `not_committed`. When `dispatch` was called and did not answer (or was
//! abandoned), the run releases `not_dispatched` and lets the ledger decide:
//! it refuses with `receipt_required` when the mark was recorded, and the
//! run then settles `unknown`.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use settle_core::{
    Binding, Command, Digest, ErrorText, Fence, InvalidInput, Key, LeaseMs, Outcome, Principal,
    Receipt, Reply, ResultJson, RetentionS, Scopes, Text,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::error::{BoxError, EffectError, RunError};
use crate::fingerprint::{canonicalize, fingerprint, fingerprint_fields, sha256};
use crate::op::{Granted, Op};
use crate::retry::{Deadline, call};
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

/// Called on every replay (the claim found the outcome stored before this
/// run; the effect is not called) with that outcome and its receipt: what
/// it returns is the run's [`RunResult::outcome`] instead (the receipt is
/// left as stored). Not called on a run that executes or reconciles. See
/// [`RunOptions::on_replay`].
pub type ReplayHook = Arc<dyn Fn(Outcome, &Receipt) -> Outcome + Send + Sync>;

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
    hook_timeout: Option<Duration>,
    on_replay: Option<ReplayHook>,
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
            .field("hook_timeout", &self.hook_timeout)
            .field("on_replay", &self.on_replay.is_some())
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
            hook_timeout: None,
            on_replay: None,
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
    /// answer); `None`: no limit. `dispatch` is retried until it, and for
    /// at most half the lease (the rest is left to hand the lease back).
    /// The calls after the effect (the settle, a release, the `unknown`
    /// settle after a failure, a reconcile finding) are retried at least
    /// for the lease's length, whatever the deadline: what happened is
    /// recorded rather than left to a lease that lapses.
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
    /// How long the reconcile hook may take (default: the lease). The
    /// lease is heartbeated while it runs; past this, or when it fails or
    /// panics, the lease is handed back with `reconcile(unavailable)` and
    /// the run ends with [`RunError::ReconcileFailed`] (SPEC §11.11).
    #[must_use]
    pub fn hook_timeout(mut self, timeout: Duration) -> Self {
        self.hook_timeout = Some(timeout);
        self
    }

    /// A replay hook (like AWS Powertools' `response_hook`): called on
    /// every replay with the stored outcome and its receipt; the run's
    /// outcome is what it returns. E.g. mark a replayed result:
    ///
    /// ```
    /// # use settle_worker::{Done, RunOptions};
    /// let options = RunOptions::new("svc-billing").on_replay(|stored, _receipt| {
    ///     let result = stored.result().map(|r| r.to_value());
    ///     Done::completed(serde_json::json!({"replayed": result}))
    ///         .outcome()
    ///         .unwrap_or(stored)
    /// });
    /// ```
    #[must_use]
    pub fn on_replay(
        mut self,
        hook: impl Fn(Outcome, &Receipt) -> Outcome + Send + Sync + 'static,
    ) -> Self {
        self.on_replay = Some(Arc::new(hook));
        self
    }

    /// The run's answer to a replay: the stored outcome, or the hook's.
    fn replayed(&self, mut r: RunResult) -> RunResult {
        if let (true, Some(hook)) = (r.replayed, &self.on_replay) {
            r.outcome = hook(r.outcome, &r.receipt);
        }
        r
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

/// What became of the effect's [`EffectContext::dispatch`] (SPEC §11.11:
/// once it was called, the boundary may be crossed).
#[derive(Debug)]
pub(crate) enum Mark {
    /// Never called: under `marks_dispatch`, nothing could have been sent.
    NotCalled,
    /// Called and not answered: abandoned mid-call (its future dropped).
    Sending,
    /// Recorded (or a no-op: no `marks_dispatch`, a reconcile lease).
    Done,
    /// Called and failed: refused, or no answer until its deadline.
    Failed(RunError),
}

/// Handed to the effect: the key and fence to pass to the remote (its
/// idempotency key and fencing token), `dispatch`, and `lease_lost`.
pub struct EffectContext<'a> {
    pub(crate) transport: &'a dyn Transport,
    pub(crate) key: Key,
    pub(crate) fence: Fence,
    pub(crate) attempt: u32,
    pub(crate) marks_dispatch: bool,
    pub(crate) mark: Mutex<Mark>,
    pub(crate) lease_lost: CancellationToken,
    pub(crate) deadline: Deadline,
    pub(crate) lease: Duration,
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
    /// Whether [`dispatch`](Self::dispatch) was called and answered.
    pub fn dispatched(&self) -> bool {
        matches!(*self.lock(), Mark::Done)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mark> {
        self.mark.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What became of `dispatch`, for the step after the effect.
    pub(crate) fn take_mark(&self) -> Mark {
        std::mem::replace(&mut *self.lock(), Mark::NotCalled)
    }

    /// Records the commit boundary right before the remote write (SPEC §4
    /// dispatch; required when the run uses `marks_dispatch`, a no-op
    /// otherwise). A lost answer is retried under the same fence until the
    /// run's deadline, for at most half the lease. On an error the remote
    /// write must not be made; `?` turns it into [`EffectError::NotSent`],
    /// and the run then hands the lease back with `release(not_dispatched)`
    /// and lets the ledger decide (SPEC §11.11): a mark that was recorded
    /// after all (its answers lost) makes the release refused
    /// `receipt_required`, and the run settles `unknown`
    /// ([`RunError::OutcomeUnknown`]). A refused dispatch (`lease_expired`,
    /// `stale_fence`: the lease is gone) ends the run with that refusal.
    pub async fn dispatch(&self) -> Result<(), RunError> {
        if !self.marks_dispatch {
            *self.lock() = Mark::Done;
            return Ok(());
        }
        {
            let mut mark = self.lock();
            if matches!(*mark, Mark::Done) {
                return Ok(());
            }
            // From here the boundary may be crossed: a dispatch dropped
            // mid-call may have reached the ledger.
            *mark = Mark::Sending;
        }
        let cmd = Command::Dispatch(settle_core::Dispatch {
            key: self.key.clone(),
            fence: self.fence,
        });
        let deadline = self.deadline.at_most(self.lease / 2);
        let answer = match call(self.transport, cmd, "dispatch", deadline).await {
            Ok(Reply::Dispatched(_)) => Ok(()),
            Ok(other) => Err(RunError::from_reply("dispatch", other)),
            Err(e) => Err(e),
        };
        *self.lock() = match &answer {
            Ok(()) => Mark::Done,
            Err(e) => Mark::Failed(e.copy_of_dispatch_error()),
        };
        answer
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
        // Drawn per claim by `claim_until_granted`.
        claim_id: None,
    };
    let lease = Duration::from_millis(o.lease_ms);
    let op = Op {
        t,
        key,
        fp,
        binding,
        lease,
        marks_dispatch: o.marks_dispatch,
        deadline: Deadline::after(o.deadline),
        hook_timeout: o.hook_timeout.unwrap_or(lease),
    };
    let mut grant = op.claim_until_granted(claim).await?;
    if let Granted::Replay(r) = grant {
        return Ok(o.replayed(*r));
    }
    if let Granted::Reconcile(g) = grant {
        let hook = match &o.reconcile {
            Some(Reconcile::Resend) => return op.resend(g, effect).await,
            Some(Reconcile::Hook(h)) => Some(&**h),
            None => None,
        };
        grant = op.reconcile(g, hook).await?;
        if let Granted::Replay(r) = grant {
            return Ok(*r);
        }
    }
    let Granted::Execute(g) = grant else {
        unreachable!("reconcile answers a receipt or an execute grant")
    };
    op.execute(g, effect).await
}
