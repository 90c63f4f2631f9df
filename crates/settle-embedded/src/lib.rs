//! # settle-embedded: the ledger on local disk
//!
//! WORK IN PROGRESS: the public API below is final; the durable engine
//! behind it is being written. Until then it keeps state in memory only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use settle_core::{
    Command, Key, Limits, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning,
};
use settle_ledger::{BoxFuture, Clock, MemStore, Store, StoreError, StoreStats, SweepReport};

/// How the embedded store is opened.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    pub limits: Limits,
    pub clock: Clock,
    /// Most commands in one group commit.
    pub max_batch: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            limits: Limits::default(),
            clock: Clock::system(),
            max_batch: 1024,
        }
    }
}

/// The embedded durable store.
pub struct EmbeddedStore {
    inner: MemStore,
    _dir: PathBuf,
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, recovering after a crash.
    pub fn open(
        dir: impl AsRef<Path>,
        opts: EmbeddedOptions,
    ) -> Result<Arc<EmbeddedStore>, StoreError> {
        std::fs::create_dir_all(dir.as_ref()).map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Arc::new(EmbeddedStore {
            inner: MemStore::new(opts.limits, opts.clock),
            _dir: dir.as_ref().to_path_buf(),
        }))
    }

    /// Stops accepting commands, lets in-flight commits finish, flushes.
    pub fn close(&self) {}
}

/// Reads a stopped store offline, calling `f` for every stored record.
pub fn scan(dir: impl AsRef<Path>, f: impl FnMut(&TenantId, &Record)) -> Result<(), StoreError> {
    let _ = (dir.as_ref(), f);
    Ok(())
}

impl Store for EmbeddedStore {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        self.inner.execute(tenant, cmd)
    }
    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        self.inner.get(tenant, key)
    }
    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        self.inner.warnings(tenant, task)
    }
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        self.inner.sweep()
    }
    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        self.inner.stats(stuck_after_ms)
    }
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        self.inner.now()
    }
}
