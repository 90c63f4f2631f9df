//! The steps of one run (SPEC §11), after the arguments are checked:
//! claim, reconcile, execute, and what is recorded when something fails.
//! `run.rs` holds the public types and the order of the steps.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt as _;
use settle_core::{
    Binding, ClaimDecision, Command, Digest, ErrorText, Fence, Grant, Heartbeat, Key, Outcome,
    Receipt, Reconcile as ReconcileCmd, RefusalCode, Release, ReleaseReason, Reply, Settle,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::claim_id::new_claim_id;
use crate::error::{BoxError, EffectError, RunError, Unrecorded};
use crate::names;
use crate::retry::{Deadline, call, in_flight_wait};
use crate::run::{Done, EffectContext, Finding, Mark, ReconcileHook, RunResult};
use crate::transport::{BoxFuture, Transport};

/// What the claim phase ended with.
pub(crate) enum Granted {
    /// Settled before (a replay), or just recorded by reconcile.
    Replay(Box<RunResult>),
    Execute(Grant),
    Reconcile(Grant),
}

/// One operation: what every step of the run needs.
pub(crate) struct Op<'a> {
    pub(crate) t: &'a dyn Transport,
    pub(crate) key: Key,
    pub(crate) fp: Digest,
    pub(crate) binding: Binding,
    pub(crate) lease: Duration,
    pub(crate) marks_dispatch: bool,
    pub(crate) deadline: Deadline,
    pub(crate) hook_timeout: Duration,
}

/// A panic's message, for the error that stands for it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Asks a reconcile hook, isolated and bounded (SPEC §11.10, §11.11): a
/// hook that panics (when called or while it runs) or that has not
/// answered within `timeout` is an error, like one that failed. The
/// caller heartbeats the lease meanwhile.
pub(crate) async fn ask_hook<'h, T>(
    hook: impl FnOnce() -> BoxFuture<'h, Result<T, BoxError>>,
    timeout: Duration,
) -> Result<T, BoxError> {
    let asked = match std::panic::catch_unwind(AssertUnwindSafe(hook)) {
        Ok(f) => f,
        Err(p) => {
            return Err(format!("the reconcile hook panicked: {}", panic_message(&*p)).into());
        }
    };
    match tokio::time::timeout(timeout, AssertUnwindSafe(asked).catch_unwind()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(p)) => Err(format!("the reconcile hook panicked: {}", panic_message(&*p)).into()),
        Err(_) => Err(format!(
            "the reconcile hook did not answer within its hook_timeout ({} ms)",
            timeout.as_millis()
        )
        .into()),
    }
}

/// The mark's effect on what may have been sent, under `marks_dispatch`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// `dispatch` was never called: nothing could have been sent.
    Nothing,
    /// `dispatch` was called and did not answer (or was abandoned): only
    /// the ledger knows whether the mark was recorded.
    Unknown,
    /// Dispatched (or no `marks_dispatch`): the remote write may have started.
    Maybe,
}

impl Op<'_> {
    /// Steps 2, 5, 6: claim, waiting out `in_flight`, until granted or
    /// replayed. Each claim draws its own `claim_id`; a claim whose answer
    /// was lost is sent again with the same one (rule 5a answers the grant
    /// it got), so the run never meets its own orphan lease as `in_flight`.
    pub(crate) async fn claim_until_granted(
        &self,
        mut claim: settle_core::Claim,
    ) -> Result<Granted, RunError> {
        loop {
            claim.claim_id = Some(new_claim_id());
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
                    return Ok(Granted::Replay(Box::new(RunResult {
                        outcome,
                        receipt,
                        replayed: true,
                        fence: None,
                        reconciled: false,
                    })));
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

    /// The calls after the effect (the settle, a release, the `unknown`
    /// settle, a reconcile finding) are retried past the caller's deadline
    /// up to the lease's length (SPEC §11.11: the record is not left to a
    /// lapsing lease; rule 0 answers a retried committed settle with its
    /// receipt even later), and to the caller's deadline when that is later.
    fn settle_deadline(&self) -> Deadline {
        self.deadline.at_least(self.lease)
    }

    /// Step 4: ask the hook (heartbeated, bounded by `hook_timeout`, a
    /// panic isolated) and report its finding.
    pub(crate) async fn reconcile(
        &self,
        g: Grant,
        hook: Option<&dyn ReconcileHook>,
    ) -> Result<Granted, RunError> {
        let lost = CancellationToken::new();
        let found = match hook {
            None => Ok(Finding::Unavailable),
            Some(h) => {
                let asked = ask_hook(|| h.reconcile(self.key.clone(), g.fence), self.hook_timeout);
                self.with_heartbeats(g.fence, &lost, asked).await
            }
        };
        if let Err(e) = &found {
            tracing::warn!(key = %self.key, fence = g.fence.0, error = %e, "the reconcile hook failed; handing the lease back");
        }
        self.report(g, found).await
    }

    /// SPEC §11.9: the effect again, with the same key, under the reconcile
    /// lease (the remote de-duplicates by the key); its success is the
    /// finding `committed`, any failure `unavailable`.
    pub(crate) async fn resend<E>(&self, g: Grant, effect: E) -> Result<RunResult, RunError>
    where
        E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
    {
        // A reconcile lease cannot dispatch: `dispatch` is a no-op.
        let ctx = self.context(&g, false);
        let ran = AssertUnwindSafe(effect(&ctx)).catch_unwind();
        let ran = self.with_heartbeats(g.fence, &ctx.lease_lost, ran).await;
        let found: Result<Finding, BoxError> = match ran {
            Ok(Ok(done)) => Ok(Finding::Committed(done)),
            Ok(Err(e)) => Err(Box::new(e)),
            Err(_) => Err("the resent effect panicked".into()),
        };
        tracing::info!(key = %self.key, fence = g.fence.0, committed = found.is_ok(), "resent under the reconcile lease");
        match self.report(g, found).await? {
            Granted::Replay(r) => Ok(*r),
            _ => unreachable!("a committed finding answers a receipt, unavailable an error"),
        }
    }

    /// Reports a finding (a hook's, or a resend's) under the reconcile
    /// lease; a lost answer is retried (the ledger answers a repeat as the
    /// first, SPEC §4 reconcile). A committed result the ledger cannot take
    /// is reported `unavailable` instead.
    async fn report(
        &self,
        g: Grant,
        found: Result<Finding, BoxError>,
    ) -> Result<Granted, RunError> {
        let (finding, mut failure) = match found {
            Ok(f) => (f, None),
            Err(e) => (Finding::Unavailable, Some(e)),
        };
        let (finding, outcome) = match finding {
            Finding::Committed(done) => match done.outcome().and_then(|o| {
                settle_core::Finding::committed(self.fp, self.binding.clone(), o.clone())
                    .map(|f| (f, o))
                    .map_err(|input| RunError::Invalid {
                        call: "reconcile",
                        input,
                    })
            }) {
                Ok((f, o)) => (f, Some(o)),
                Err(e) => {
                    failure = Some(Box::new(e));
                    (settle_core::Finding::Unavailable, None)
                }
            },
            Finding::NotCommitted => (settle_core::Finding::NotCommitted, None),
            Finding::Unavailable => (settle_core::Finding::Unavailable, None),
        };
        let cmd = Command::Reconcile(ReconcileCmd {
            key: self.key.clone(),
            fence: g.fence,
            finding,
        });
        let reply = call(self.t, cmd, "reconcile", self.settle_deadline()).await?;
        match (outcome, reply) {
            (Some(outcome), Reply::Receipt(receipt)) => Ok(Granted::Replay(Box::new(RunResult {
                outcome,
                receipt,
                replayed: false,
                fence: Some(g.fence),
                reconciled: true,
            }))),
            (None, Reply::Claim(ClaimDecision::Execute(g))) => Ok(Granted::Execute(g)),
            (None, Reply::Released { .. }) => Err(match failure {
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

    fn context(&self, g: &Grant, marks_dispatch: bool) -> EffectContext<'_> {
        EffectContext {
            transport: self.t,
            key: self.key.clone(),
            fence: g.fence,
            attempt: g.attempt,
            marks_dispatch,
            mark: std::sync::Mutex::new(Mark::NotCalled),
            lease_lost: CancellationToken::new(),
            deadline: self.deadline,
            lease: self.lease,
        }
    }

    /// What may have been sent, from the dispatch mark.
    fn sent(&self, mark: &Mark) -> Sent {
        match mark {
            _ if !self.marks_dispatch => Sent::Maybe,
            Mark::NotCalled => Sent::Nothing,
            Mark::Sending | Mark::Failed(_) => Sent::Unknown,
            Mark::Done => Sent::Maybe,
        }
    }

    /// Step 3: the effect under heartbeats, then settle or release.
    pub(crate) async fn execute<E>(&self, g: Grant, effect: E) -> Result<RunResult, RunError>
    where
        E: AsyncFnOnce(&EffectContext<'_>) -> Result<Done, EffectError>,
    {
        let ctx = self.context(&g, self.marks_dispatch);
        let ran = AssertUnwindSafe(effect(&ctx)).catch_unwind();
        let ran = self.with_heartbeats(g.fence, &ctx.lease_lost, ran).await;
        let mark = ctx.take_mark();
        let done = match ran {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Err(self.after_effect_error(g.fence, mark, e).await),
            Err(panic) => {
                let why = format!("the effect panicked: {}", panic_message(&*panic));
                match self.sent(&mark) {
                    Sent::Nothing | Sent::Unknown => {
                        let _ = self.release_or_unknown(g.fence, &why).await;
                    }
                    Sent::Maybe => {
                        let _ = self.settle_unknown(g.fence, &why).await;
                    }
                }
                std::panic::resume_unwind(panic);
            }
        };
        let outcome = match done.outcome() {
            Ok(o) => o,
            Err(e) => return Err(self.unrecordable(g.fence, &mark, e).await),
        };
        self.settle(g, outcome).await
    }

    /// Settles the effect's outcome under heartbeats (SPEC §11.11 settle
    /// rows): a lost answer is retried (rule 0 answers the receipt); a
    /// result the ledger refuses as invalid (422) is settled `unknown` at
    /// once; no answer until the deadline leaves the lease to lapse.
    async fn settle(&self, g: Grant, outcome: Outcome) -> Result<RunResult, RunError> {
        let settle = Command::Settle(Settle {
            key: self.key.clone(),
            fence: g.fence,
            fingerprint: self.fp,
            binding: self.binding.clone(),
            outcome: outcome.clone(),
        });
        let lost = CancellationToken::new();
        let settled = call(self.t, settle, "settle", self.settle_deadline());
        match self.with_heartbeats(g.fence, &lost, settled).await {
            Ok(Reply::Receipt(receipt)) => Ok(RunResult {
                outcome,
                receipt,
                replayed: false,
                fence: Some(g.fence),
                reconciled: false,
            }),
            Ok(Reply::Invalid(input)) => {
                // The ledger refused the outcome (e.g. a result over its
                // size limit); the effect ran, so what happened is unknown.
                let receipt = self.settle_unknown(g.fence, &input.to_string()).await;
                Err(RunError::OutcomeUnknown {
                    key: self.key.clone(),
                    receipt: receipt.ok().map(Box::new),
                    source: Box::new(RunError::Invalid {
                        call: "settle",
                        input,
                    }),
                })
            }
            Ok(other) => Err(RunError::from_reply("settle", other)),
            Err(source) => Err(RunError::OutcomeUnknown {
                key: self.key.clone(),
                receipt: None,
                source: Box::new(Unrecorded { outcome, source }),
            }),
        }
    }

    /// The effect's result cannot be recorded (the fingerprint rules refuse
    /// it): before the dispatch mark nothing was sent (release); after it
    /// the effect may have happened (`unknown`).
    async fn unrecordable(&self, fence: Fence, mark: &Mark, e: RunError) -> RunError {
        let receipt = match self.sent(mark) {
            Sent::Nothing | Sent::Unknown => {
                match self.release_or_unknown(fence, &e.to_string()).await {
                    Ok(()) => return e,
                    Err(receipt) => receipt,
                }
            }
            Sent::Maybe => self.settle_unknown(fence, &e.to_string()).await.ok(),
        };
        RunError::OutcomeUnknown {
            key: self.key.clone(),
            receipt: receipt.map(Box::new),
            source: Box::new(e),
        }
    }

    /// The effect said what happened (SPEC §11.8, §11.11): release on the
    /// caller's word (nothing sent, refused by the remote), settle
    /// `unknown` after a possible send, and after a `dispatch` that did not
    /// answer let the ledger decide.
    async fn after_effect_error(&self, fence: Fence, mark: Mark, e: EffectError) -> RunError {
        let sent = self.sent(&mark);
        if let Mark::Failed(RunError::Refused { call, code }) = mark
            && matches!(
                code,
                RefusalCode::LeaseExpired | RefusalCode::StaleFence | RefusalCode::WrongPurpose
            )
        {
            // The lease is gone (revoked, expired, taken over): nothing of
            // it is this run's to hand back.
            return RunError::Refused { call, code };
        }
        match (e, sent) {
            (EffectError::Refused(source), _) => {
                match self.hand_back(fence, ReleaseReason::NotCommitted).await {
                    Ok(()) => RunError::EffectRefused { source },
                    Err(receipt) => self.unknown(receipt, source),
                }
            }
            (EffectError::NotSent(source) | EffectError::Unknown(source), Sent::Nothing) => {
                match self.hand_back(fence, ReleaseReason::NotDispatched).await {
                    Ok(()) => RunError::NotSent { source },
                    Err(receipt) => self.unknown(receipt, source),
                }
            }
            (EffectError::NotSent(source), Sent::Unknown) if !source.is::<RunError>() => {
                // The caller's own word that nothing was applied (not `?`
                // on dispatch's error): not_dispatched if the mark never
                // arrived, else its attestation, not_committed.
                match self.release(fence, ReleaseReason::NotDispatched).await {
                    Ok(Reply::Refused(RefusalCode::ReceiptRequired)) => {
                        match self.hand_back(fence, ReleaseReason::NotCommitted).await {
                            Ok(()) => RunError::NotSent { source },
                            Err(receipt) => self.unknown(receipt, source),
                        }
                    }
                    Ok(Reply::Released { .. }) => RunError::NotSent { source },
                    other => {
                        tracing::warn!(answer = ?other, "release not accepted; the lease lapses");
                        RunError::NotSent { source }
                    }
                }
            }
            (EffectError::NotSent(source) | EffectError::Unknown(source), Sent::Unknown) => {
                // The SDK's own inference from a failed dispatch: never an
                // attestation. The ledger knows whether the mark arrived.
                match self.release_or_unknown(fence, &source.to_string()).await {
                    Ok(()) => RunError::NotSent { source },
                    Err(receipt) => self.unknown(receipt, source),
                }
            }
            (EffectError::NotSent(source), Sent::Maybe) => {
                match self.hand_back(fence, ReleaseReason::NotCommitted).await {
                    Ok(()) => RunError::NotSent { source },
                    Err(receipt) => self.unknown(receipt, source),
                }
            }
            (EffectError::Unknown(source), Sent::Maybe) => {
                let receipt = self.settle_unknown(fence, &source.to_string()).await.ok();
                self.unknown(receipt, source)
            }
        }
    }

    fn unknown(&self, receipt: Option<Receipt>, source: BoxError) -> RunError {
        RunError::OutcomeUnknown {
            key: self.key.clone(),
            receipt: receipt.map(Box::new),
            source,
        }
    }

    async fn release(&self, fence: Fence, reason: ReleaseReason) -> Result<Reply, RunError> {
        let cmd = Command::Release(Release {
            key: self.key.clone(),
            fence,
            reason,
            forget: false,
        });
        call(self.t, cmd, "release", self.settle_deadline()).await
    }

    /// Hands the lease back on the caller's word. `Err` (with the receipt,
    /// if any) when the ledger would not take the release and the record
    /// was settled `unknown` instead (`receipt_required`; a 422 from a
    /// server without `not_committed`). A release that gets no answer is
    /// logged: the run reports the caller's word, and the lease lapses.
    async fn hand_back(&self, fence: Fence, reason: ReleaseReason) -> Result<(), Option<Receipt>> {
        match self.release(fence, reason).await {
            Ok(Reply::Released { .. }) => Ok(()),
            Ok(Reply::Refused(RefusalCode::ReceiptRequired) | Reply::Invalid(_)) => {
                let why = "the release was refused; recorded as unknown";
                Err(self.settle_unknown(fence, why).await.ok())
            }
            Ok(other) => {
                tracing::warn!(
                    reply = other.label(),
                    reason = reason.as_str(),
                    "release not accepted"
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, reason = reason.as_str(), "release failed; the lease lapses");
                Ok(())
            }
        }
    }

    /// After a failure while the dispatch mark may or may not have been
    /// recorded: `release(not_dispatched)`, and the ledger decides
    /// (`receipt_required` when the mark arrived: settle `unknown`). `Err`
    /// when the record is, or will become, `unknown` (with its receipt when
    /// one was answered): also when the release got no answer or was
    /// refused otherwise, since the lease then lapses as the ledger holds it.
    async fn release_or_unknown(&self, fence: Fence, why: &str) -> Result<(), Option<Receipt>> {
        match self.release(fence, ReleaseReason::NotDispatched).await {
            Ok(Reply::Released { .. }) => Ok(()),
            Ok(Reply::Refused(RefusalCode::ReceiptRequired) | Reply::Invalid(_)) => {
                Err(self.settle_unknown(fence, why).await.ok())
            }
            Ok(other) => {
                tracing::warn!(reply = other.label(), "release not accepted");
                Err(None)
            }
            Err(e) => {
                tracing::warn!(error = %e, "release failed; the lease lapses");
                Err(None)
            }
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
pub(crate) async fn heartbeats(
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
