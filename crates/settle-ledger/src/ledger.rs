//! The library API: typed calls over any [`Store`].

use std::sync::Arc;

use settle_core::{
    Claim, ClaimDecision, Command, DEFAULT_MAX_RESULT_BYTES, Dispatch, Fence, Finding, Grant,
    Heartbeat, InvalidInput, Key, LeaseInfo, Principal, Receipt, Reconcile, Record, RefusalCode,
    Release, Reply, Revoke, Settle, TaskId, TenantId, Warn, Warning,
};

use crate::store::{Store, StoreError};

/// Why a ledger call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// The request is invalid; nothing was read or written.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidInput),
    /// The ledger's state refused the call (a protocol answer).
    #[error("refused: {0}")]
    Refused(RefusalCode),
    /// The engine failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LedgerError {
    /// The protocol refusal, if this is one.
    pub fn refusal(&self) -> Option<RefusalCode> {
        match self {
            LedgerError::Refused(c) => Some(*c),
            _ => None,
        }
    }
}

/// The answer to `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// `not_committed`: execute under the same fence.
    Execute(Grant),
    /// `committed`: settled.
    Receipt(Receipt),
    /// `unavailable`: released, the record still needs reconciliation.
    Released(Fence),
}

/// Settings the ledger checks before a command reaches the store.
#[derive(Debug, Clone, Copy)]
pub struct LedgerConfig {
    /// The largest settled result accepted, in bytes of compact JSON (SPEC
    /// `max_result_bytes`, default 64 KiB).
    pub max_result_bytes: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

/// The settle ledger over a store.
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn Store>,
    config: LedgerConfig,
}

fn unexpected(reply: Reply) -> LedgerError {
    // The core answers each command with its own reply kinds; anything else is a bug.
    panic!("the rules answered with an unexpected reply: {reply:?}")
}

impl Ledger {
    /// A ledger over `store` with the default [`LedgerConfig`].
    pub fn new(store: Arc<dyn Store>) -> Ledger {
        Ledger::with_config(store, LedgerConfig::default())
    }
    /// A ledger over `store` with `config`.
    pub fn with_config(store: Arc<dyn Store>, config: LedgerConfig) -> Ledger {
        Ledger { store, config }
    }
    /// The store the ledger runs on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    /// The settings it checks.
    pub fn config(&self) -> LedgerConfig {
        self.config
    }

    /// Validates configured limits, then runs the command. Protocol refusals
    /// come back as `Ok(Reply::Refused(..))`; a command the store's own
    /// limits refuse (e.g. a lease not longer than its `lease_margin_ms`)
    /// as `Err(LedgerError::Invalid(..))`, with nothing written.
    pub async fn execute(&self, tenant: &TenantId, cmd: Command) -> Result<Reply, LedgerError> {
        cmd.check_limits(self.config.max_result_bytes)?;
        match self.store.execute(tenant, cmd).await? {
            Reply::Invalid(e) => Err(LedgerError::Invalid(e)),
            r => Ok(r),
        }
    }

    async fn run(&self, tenant: &TenantId, cmd: Command) -> Result<Reply, LedgerError> {
        match self.execute(tenant, cmd).await? {
            Reply::Refused(c) => Err(LedgerError::Refused(c)),
            r => Ok(r),
        }
    }

    /// SPEC §4 claim. Refusals (`fingerprint_mismatch`, `stale_binding`, ...)
    /// come back as [`LedgerError::Refused`].
    pub async fn claim(&self, tenant: &TenantId, c: Claim) -> Result<ClaimDecision, LedgerError> {
        match self.run(tenant, Command::Claim(c)).await? {
            Reply::Claim(d) => Ok(d),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 heartbeat: extends the lease held by the command's fence.
    pub async fn heartbeat(
        &self,
        tenant: &TenantId,
        c: Heartbeat,
    ) -> Result<LeaseInfo, LedgerError> {
        match self.run(tenant, Command::Heartbeat(c)).await? {
            Reply::Heartbeat(l) => Ok(l),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 dispatch: records durably that the holder of the `execute`
    /// lease of `fence` is about to write remotely.
    pub async fn dispatch(
        &self,
        tenant: &TenantId,
        key: Key,
        fence: Fence,
    ) -> Result<LeaseInfo, LedgerError> {
        match self
            .run(tenant, Command::Dispatch(Dispatch { key, fence }))
            .await?
        {
            Reply::Dispatched(l) => Ok(l),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 settle: the durable receipt, or the refusal (refused evidence is
    /// quarantined on the record).
    pub async fn settle(&self, tenant: &TenantId, s: Settle) -> Result<Receipt, LedgerError> {
        match self.run(tenant, Command::Settle(s)).await? {
            Reply::Receipt(rc) => Ok(rc),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 release: ends the `execute` lease without a receipt; returns its fence.
    pub async fn release(&self, tenant: &TenantId, c: Release) -> Result<Fence, LedgerError> {
        match self.run(tenant, Command::Release(c)).await? {
            Reply::Released { fence } => Ok(fence),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 reconcile, for the holder of a `reconcile` lease.
    pub async fn reconcile(
        &self,
        tenant: &TenantId,
        key: Key,
        fence: Fence,
        finding: Finding,
    ) -> Result<Reconciled, LedgerError> {
        match self
            .run(
                tenant,
                Command::Reconcile(Reconcile {
                    key,
                    fence,
                    finding,
                }),
            )
            .await?
        {
            Reply::Claim(ClaimDecision::Execute(g)) => Ok(Reconciled::Execute(g)),
            Reply::Receipt(rc) => Ok(Reconciled::Receipt(rc)),
            Reply::Released { fence } => Ok(Reconciled::Released(fence)),
            r => Err(unexpected(r)),
        }
    }

    /// Raises the principal's generation; returns the new one.
    pub async fn revoke(
        &self,
        tenant: &TenantId,
        principal: Principal,
    ) -> Result<u64, LedgerError> {
        match self
            .run(tenant, Command::Revoke(Revoke { principal }))
            .await?
        {
            Reply::Revoked { generation, .. } => Ok(generation),
            r => Err(unexpected(r)),
        }
    }

    /// SPEC §4 warn: the warning after this call.
    pub async fn warn(&self, tenant: &TenantId, w: Warn) -> Result<Warning, LedgerError> {
        match self.run(tenant, Command::Warn(w)).await? {
            Reply::Warning(w) => Ok(w),
            r => Err(unexpected(r)),
        }
    }

    /// The warnings of `task` (SPEC §4 warnings).
    pub async fn warnings(
        &self,
        tenant: &TenantId,
        task: &TaskId,
    ) -> Result<Vec<Warning>, LedgerError> {
        Ok(self.store.warnings(tenant, task).await?)
    }

    /// The record (`not_found` when absent or collected).
    pub async fn get(&self, tenant: &TenantId, key: &Key) -> Result<Record, LedgerError> {
        match self.store.get(tenant, key).await? {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(LedgerError::Refused(RefusalCode::NotFound)),
            Err(code) => Err(LedgerError::Refused(code)),
        }
    }
}
