//! The store under test ([`SimStore`]): the real [`Ledger`] over the
//! in-memory store, or over the embedded engine's real log, checkpoint and
//! recovery code running inline ([`InlineStore`]) on a simulated disk with
//! the in-memory index. Both stores answer without ever waiting, so their futures are
//! polled once, on the simulator's thread: no runtime, no threads.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use settle_core::{Command, Key, Limits, Record, RefusalCode, Reply, TenantId, Timestamp};
use settle_embedded::{EmbeddedOptions, InlineStore};
use settle_ledger::{Clock, Ledger, LedgerError, MemStore, Store, StoreError, StoreStats};

use crate::disk::{Crash, MemIndex, SimDisk};

/// Where the embedded store lives on the simulated disk (nested and new,
/// so its parents must be made durable too).
const ROOT: &str = "/srv/settle";

/// Small log segments: rotations and checkpoints every few dozen commits.
const SEGMENT_BYTES: u64 = 16 * 1024;

/// Polls a future that must be ready at once (every call of both stores is).
pub fn ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a simulated store call waited: the simulation is not inline"),
    }
}

/// Which engine a seed runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// `MemStore` (the pure core behind a lock): no crashes, no disk.
    Memory,
    /// The embedded engine's log and recovery on [`SimDisk`] + [`MemIndex`].
    Embedded,
}

impl EngineKind {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Memory => "memory",
            EngineKind::Embedded => "embedded",
        }
    }
}

type Inline = InlineStore<SimDisk, MemIndex>;

struct Disk {
    disk: SimDisk,
    index: MemIndex,
    store: Option<Arc<Inline>>,
}

/// The store under test: the ledger over it, its clock and (embedded) its
/// disk, which the world crashes, cuts the power of and reopens.
pub struct SimStore {
    kind: EngineKind,
    /// What the store's clock source reads (virtual milliseconds).
    clock_ms: Arc<AtomicU64>,
    limits: Limits,
    ledger: Option<Ledger>,
    disk: Option<Disk>,
}

/// Why a call could not reach the ledger.
#[derive(Debug, Clone)]
pub enum Down {
    /// The process is down (crashed, not yet restarted).
    Crashed,
}

impl SimStore {
    /// A fresh, empty store of `kind` whose clock reads `clock_ms`.
    pub fn new(kind: EngineKind, clock_ms: Arc<AtomicU64>, limits: Limits) -> SimStore {
        let mut e = SimStore {
            kind,
            clock_ms,
            limits,
            ledger: None,
            disk: None,
        };
        match kind {
            EngineKind::Memory => {
                let store = MemStore::new(limits, e.clock());
                e.ledger = Some(Ledger::new(Arc::new(store)));
            }
            EngineKind::Embedded => {
                let disk = SimDisk::new();
                // The index lives in the store's directory (which the
                // store creates durably), as fjall's does.
                let index = MemIndex::new(&disk, ROOT);
                e.disk = Some(Disk {
                    disk,
                    index,
                    store: None,
                });
                e.open().expect("a fresh simulated store opens");
            }
        }
        e
    }

    fn clock(&self) -> Clock {
        let ms = self.clock_ms.clone();
        Clock::with_source(move || Timestamp(ms.load(Ordering::SeqCst)))
    }

    /// The engine of this run.
    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    /// (Re)opens the embedded store on its disk: recovery runs here.
    pub fn open(&mut self) -> Result<(), StoreError> {
        let clock = self.clock();
        let limits = self.limits;
        let d = self.disk.as_mut().expect("embedded");
        d.store = None;
        let opts = EmbeddedOptions {
            limits,
            clock,
            segment_bytes: SEGMENT_BYTES,
            ..EmbeddedOptions::default()
        };
        let store = Arc::new(InlineStore::open(&d.disk, ROOT, d.index.clone(), opts)?);
        d.store = Some(store.clone());
        self.ledger = Some(Ledger::new(store));
        Ok(())
    }

    /// Whether the store process is up.
    pub fn is_up(&self) -> bool {
        self.ledger.is_some()
    }

    /// Runs one command through [`Ledger::execute`].
    pub fn execute(
        &self,
        tenant: &TenantId,
        cmd: Command,
    ) -> Result<Result<Reply, LedgerError>, Down> {
        let ledger = self.ledger.as_ref().ok_or(Down::Crashed)?;
        Ok(ready(ledger.execute(tenant, cmd)))
    }

    /// The record as `get` shows it (`Ok(None)` when absent).
    pub fn get(
        &self,
        tenant: &TenantId,
        key: &Key,
    ) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
        let ledger = self.ledger.as_ref().ok_or(StoreError::Closed)?;
        match ready(ledger.get(tenant, key)) {
            Ok(r) => Ok(Ok(Some(r))),
            Err(LedgerError::Refused(RefusalCode::NotFound)) => Ok(Ok(None)),
            Err(LedgerError::Refused(c)) => Ok(Err(c)),
            Err(LedgerError::Store(e)) => Err(e),
            Err(LedgerError::Invalid(e)) => Err(StoreError::Corrupt(e.to_string())),
        }
    }

    /// A principal's generation as the store has it (`GET
    /// /v1/principals/{p}`); `None` while the store is down or refuses it.
    pub fn generation(&self, tenant: &TenantId, p: &settle_core::Principal) -> Option<u64> {
        let ledger = self.ledger.as_ref()?;
        ready(ledger.store().generation(tenant, p)).ok()?.ok()
    }

    /// The background sweep.
    pub fn sweep(&self) -> Option<Result<settle_ledger::SweepReport, StoreError>> {
        self.ledger.as_ref().map(|l| ready(l.store().sweep()))
    }

    /// Gauges over open records.
    pub fn stats(&self, stuck_after_ms: u64) -> Option<Result<StoreStats, StoreError>> {
        self.ledger
            .as_ref()
            .map(|l| ready(l.store().stats(stuck_after_ms)))
    }

    /// The store's clock as the store reads it.
    pub fn now(&self) -> Option<Timestamp> {
        self.ledger
            .as_ref()
            .and_then(|l| ready(l.store().now()).ok())
    }

    /// Readiness (a poisoned store is not ready).
    pub fn health(&self) -> Option<Result<(), StoreError>> {
        self.ledger.as_ref().map(|l| ready(l.store().health()))
    }

    /// The power goes during the sync after `n` more complete (embedded).
    pub fn cut_power_after(&self, n: u64) {
        if let Some(d) = &self.disk {
            d.disk.cut_power_after(d.disk.syncs() + n);
        }
    }

    /// The next file sync fails (embedded).
    pub fn fail_next_sync(&self) {
        if let Some(d) = &self.disk {
            d.disk.fail_next_sync();
        }
    }

    /// The next index persist fails (embedded).
    pub fn fail_next_persist(&self) {
        if let Some(d) = &self.disk {
            d.index.fail_next_persist();
        }
    }

    /// Faults stop: every fault armed and not yet fired is disarmed.
    pub fn disarm(&self) {
        if let Some(d) = &self.disk {
            d.disk.disarm();
            d.index.disarm();
        }
    }

    /// Whether the simulated disk lost its power (a cut during a sync).
    pub fn power_lost(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| !d.disk.is_powered())
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.disk
            .as_ref()
            .and_then(|d| d.store.as_ref())
            .is_some_and(|s| s.is_poisoned())
    }

    /// Power loss and reboot: the process dies, the disk keeps what its
    /// syncs made durable plus, per `mode`, none, all or a torn part of
    /// the rest. The store stays down until [`SimStore::open`].
    pub fn crash(&mut self, mode: Crash) {
        self.ledger = None;
        if let Some(d) = self.disk.as_mut() {
            d.store = None;
            let disk = d.disk.crash(mode);
            d.index = d.index.crash(&disk, mode);
            d.disk = disk;
        }
    }

    /// The log's files, for the history (embedded).
    pub fn wal_files(&self) -> String {
        use settle_embedded::fs::Fs;
        let Some(d) = &self.disk else {
            return String::new();
        };
        let mut names = d
            .disk
            .list(&Path::new(ROOT).join("wal"))
            .unwrap_or_default();
        names.sort();
        names.join(" ")
    }

    /// The process stops without a power loss (the page cache survives):
    /// what a supervisor does to a store that failed closed.
    pub fn stop(&mut self) {
        self.ledger = None;
        if let Some(d) = self.disk.as_mut() {
            d.store = None;
        }
    }
}
