//! The [`Reconciler`] (SPEC §11.10): it turns records left `unknown`
//! (reconcile required) into the truth, without a human, wherever a hook
//! can tell: for each key prefix it pages the records that require
//! reconciliation, claims each with its stored reservation, the
//! principal's current generation and `marks_dispatch`, asks the prefix's
//! hook on a `reconcile` grant and reports the finding. It never runs an
//! effect (it does not hold the requests) and never guesses: a record whose
//! hook cannot tell stays `unknown`.

use std::sync::Arc;
use std::time::Duration;

use settle_core::{
    Binding, ClaimDecision, Command, Digest, Fence, Key, LeaseMs, Principal, Reconcile,
    RefusalCode, Release, ReleaseReason, Reply, Reservation, RetentionS, Scopes, Text,
};
use tokio_util::sync::CancellationToken;

use crate::error::BoxError;
use crate::run::{Finding, ReconcileHook};
#[cfg(feature = "local")]
use crate::transport::LedgerTransport;
use crate::transport::{BoxFuture, Transport, TransportError};

/// One page of keys and the cursor of the next page (`None`: the last).
pub type KeyPage = (Vec<String>, Option<String>);

/// The reads a [`Reconciler`] needs besides commands: the keys that
/// require reconciliation, a record's reservation, a principal's
/// generation (SPEC §9, §7). The HTTP client provides them, and with the
/// `local` feature the in-process ledger (`LedgerTransport`).
pub trait Inspect: Transport {
    /// One page of keys that require reconciliation and start with
    /// `prefix`, after the cursor of the previous page; the next cursor.
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>>;
    /// The reservation of `key`, and whether it still requires
    /// reconciliation (`None`: the record is gone).
    fn reservation<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<(Reservation, bool)>, TransportError>>;
    /// The principal's current generation.
    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>>;
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Fatal {
        detail: format!("the ledger answered a {what} this client cannot read: {e}"),
    }
}

impl Inspect for settle_client::Client {
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>> {
        Box::pin(async move {
            let params = settle_client::ListParams {
                reconcile_required: Some(true),
                key_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
                after: after.map(str::to_string),
                ..Default::default()
            };
            let page = self.list(&params).await?;
            Ok((
                page.operations.into_iter().map(|o| o.key).collect(),
                page.next,
            ))
        })
    }

    fn reservation<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<(Reservation, bool)>, TransportError>> {
        Box::pin(async move {
            let r = match self.get(key.as_str()).await {
                Ok(r) => r,
                Err(e) if e.status() == Some(404) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let res = &r.reservation;
            let reservation = Reservation {
                fingerprint: Digest::parse("fingerprint", &res.fingerprint)
                    .map_err(|e| corrupt("reservation", e))?,
                principal: Principal::new(res.principal.as_str())
                    .map_err(|e| corrupt("reservation", e))?,
                scopes: Scopes::from_strs(res.scopes.iter())
                    .map_err(|e| corrupt("reservation", e))?,
                generation: res.generation,
            };
            Ok(Some((reservation, r.reconcile_required)))
        })
    }

    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move { Ok(self.principal(principal.as_str()).await?.generation) })
    }
}

#[cfg(feature = "local")]
impl Inspect for LedgerTransport {
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>> {
        use settle_ledger::inspect::{Cursor, ListFilter, ListQuery, list};
        Box::pin(async move {
            let q = ListQuery {
                filter: ListFilter {
                    reconcile_required: Some(true),
                    key_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
                    ..ListFilter::default()
                },
                order: Default::default(),
                after: after
                    .map(|a| Cursor::from_text(a).ok_or_else(|| corrupt("cursor", a)))
                    .transpose()?,
                limit: 100,
                stuck_after_ms: 3_600_000,
            };
            let page = list(&**self.ledger().store(), self.tenant(), &q).await?;
            Ok((
                page.records
                    .iter()
                    .map(|r| r.key.as_str().to_string())
                    .collect(),
                page.next.map(|c| c.to_text()),
            ))
        })
    }

    fn reservation<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<(Reservation, bool)>, TransportError>> {
        Box::pin(async move {
            match self.ledger().store().get(self.tenant(), key).await? {
                Ok(Some(r)) => Ok(Some((r.reservation.clone(), r.reconcile_required))),
                Ok(None) => Ok(None),
                Err(code) => Err(TransportError::Fatal {
                    detail: format!("record {key}: {code}"),
                }),
            }
        })
    }

    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            match self
                .ledger()
                .store()
                .generation(self.tenant(), principal)
                .await?
            {
                Ok(g) => Ok(g),
                Err(code) => Err(TransportError::Fatal {
                    detail: format!("principal {principal}: {code}"),
                }),
            }
        })
    }
}

/// What one sweep did (SPEC §11.10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
    /// The ledger or the hook failed (logged); the record stays as it was.
    pub errors: u64,
}

impl Sweep {
    fn add(&mut self, o: Sweep) {
        self.seen += o.seen;
        self.committed += o.committed;
        self.not_committed += o.not_committed;
        self.unavailable += o.unavailable;
        self.skipped += o.skipped;
        self.errors += o.errors;
    }
}

/// Sweeps the records that require reconciliation, by key prefix, with a
/// hook per prefix (the same hooks `run_once` takes):
///
/// ```no_run
/// # async fn demo(client: settle_client::Client) {
/// use settle_worker::{Finding, Reconciler};
/// let r = Reconciler::new(client).hook("charge-", |key, fence| async move {
///     // Ask the payment provider whether a charge with this key exists.
///     Ok::<_, settle_worker::BoxError>(Finding::Unavailable)
/// });
/// let counts = r.sweep().await;
/// # }
/// ```
pub struct Reconciler {
    ledger: Arc<dyn Inspect>,
    hooks: Vec<(String, Arc<dyn ReconcileHook>)>,
    lease_ms: LeaseMs,
}

impl Reconciler {
    /// A reconciler over `ledger` (a `settle_client::Client`, or with the
    /// `local` feature a `LedgerTransport`), with no hooks yet.
    pub fn new(ledger: impl Inspect + 'static) -> Reconciler {
        Reconciler {
            ledger: Arc::new(ledger),
            hooks: Vec::new(),
            lease_ms: LeaseMs::DEFAULT,
        }
    }

    /// The hook for the keys that start with `prefix` (`""`: every key). A
    /// key under several prefixes is handled once, by the longest one's hook.
    #[must_use]
    pub fn hook(mut self, prefix: impl Into<String>, hook: impl ReconcileHook + 'static) -> Self {
        self.hooks.push((prefix.into(), Arc::new(hook)));
        self
    }

    /// The lease the reconciler claims with while a hook runs (default 30 s).
    #[must_use]
    pub fn lease(mut self, lease: LeaseMs) -> Self {
        self.lease_ms = lease;
        self
    }

    /// One pass over every prefix.
    pub async fn sweep(&self) -> Sweep {
        let mut total = Sweep::default();
        for (prefix, hook) in &self.hooks {
            total.add(self.sweep_prefix(prefix, &**hook).await);
        }
        total
    }

    /// Sweeps every `every` until `stop` is cancelled (the counters and log
    /// lines of each resolution as in [`sweep`](Self::sweep)).
    pub async fn run(&self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let s = self.sweep().await;
            if s.seen > 0 {
                tracing::info!(?s, "reconciler sweep");
            }
        }
    }

    async fn sweep_prefix(&self, prefix: &str, hook: &dyn ReconcileHook) -> Sweep {
        let mut s = Sweep::default();
        let mut after: Option<String> = None;
        loop {
            let (keys, next) = match self
                .ledger
                .reconcile_required(prefix, after.as_deref())
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "reconciler: listing failed");
                    s.errors += 1;
                    return s;
                }
            };
            for k in keys {
                // A key under a longer prefix that has a hook of its own is
                // that hook's (each key is handled once, by its most
                // specific hook).
                if self
                    .hooks
                    .iter()
                    .any(|(p, _)| p.len() > prefix.len() && k.starts_with(p.as_str()))
                {
                    continue;
                }
                s.seen += 1;
                let Ok(key) = Key::new(k) else {
                    s.errors += 1;
                    continue;
                };
                let what = match self.one(&key, hook).await {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "reconciler: failed; the record stays as it was");
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

    /// Claims one record and reports the hook's finding.
    async fn one(&self, key: &Key, hook: &dyn ReconcileHook) -> Result<Outcome, BoxError> {
        let Some((res, required)) = self.ledger.reservation(key).await? else {
            return Ok(Outcome::Skipped);
        };
        if !required {
            return Ok(Outcome::Skipped);
        }
        let generation = self.ledger.generation(&res.principal).await?;
        let binding = Binding {
            principal: res.principal.clone(),
            scopes: res.scopes.clone(),
            generation: generation.max(res.generation),
        };
        let claim = settle_core::Claim {
            key: key.clone(),
            fingerprint: res.fingerprint,
            binding: binding.clone(),
            lease_ms: self.lease_ms,
            worker: Text::new("worker", "settle-reconciler").ok(),
            marks_dispatch: true,
            retention_s: RetentionS::DEFAULT,
            claim_id: None,
        };
        let grant = match self.ledger.execute(Command::Claim(claim)).await? {
            Reply::Claim(ClaimDecision::Reconcile(g)) => g,
            Reply::Claim(ClaimDecision::Execute(g)) => {
                // Resolved meanwhile (someone reported not_committed): the
                // reconciler never runs effects; hand the lease back.
                self.release(key, g.fence).await?;
                return Ok(Outcome::Skipped);
            }
            _ => return Ok(Outcome::Skipped),
        };
        let found = hook.reconcile(key.clone(), grant.fence).await;
        let (finding, failed) = match found {
            Ok(Finding::Committed(done)) => (
                settle_core::Finding::committed(res.fingerprint, binding, done.outcome()?)?,
                None,
            ),
            Ok(Finding::NotCommitted) => (settle_core::Finding::NotCommitted, None),
            Ok(Finding::Unavailable) => (settle_core::Finding::Unavailable, None),
            Err(e) => (settle_core::Finding::Unavailable, Some(e)),
        };
        let cmd = Command::Reconcile(Reconcile {
            key: key.clone(),
            fence: grant.fence,
            finding,
        });
        let outcome = match self.ledger.execute(cmd).await? {
            Reply::Receipt(r) => {
                tracing::info!(key = %key, fence = grant.fence.0, status = r.status.as_str(), "reconciler: committed");
                Outcome::Committed
            }
            Reply::Claim(ClaimDecision::Execute(g)) => {
                // not_committed: the same lease, now for execution; the
                // reconciler never executes, so it hands it back.
                self.release(key, g.fence).await?;
                tracing::info!(key = %key, fence = g.fence.0, "reconciler: not committed; the next claim executes");
                Outcome::NotCommitted
            }
            Reply::Released { .. } => match failed {
                Some(e) => return Err(e),
                None => {
                    tracing::info!(key = %key, fence = grant.fence.0, "reconciler: the hook cannot tell; still unknown");
                    Outcome::Unavailable
                }
            },
            Reply::Refused(code) => return Err(format!("reconcile refused: {code}").into()),
            other => return Err(format!("reconcile answered {}", other.label()).into()),
        };
        Ok(outcome)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), BoxError> {
        let cmd = Command::Release(Release {
            key: key.clone(),
            fence,
            reason: ReleaseReason::NotDispatched,
            forget: false,
        });
        match self.ledger.execute(cmd).await? {
            Reply::Released { .. } => Ok(()),
            Reply::Refused(RefusalCode::StaleFence | RefusalCode::LeaseExpired) => Ok(()),
            other => Err(format!("release answered {}", other.label()).into()),
        }
    }
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
