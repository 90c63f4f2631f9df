//! The writer's state for one group commit at a time, on the caller's
//! thread: what [`crate::InlineStore`] drives (deterministic, for the
//! power-loss tests and the simulator), and what the threaded store splits
//! into the writer thread ([`super::Writer`]) and the log thread
//! ([`super::LogThread`]).

use std::collections::HashMap;
use std::sync::Arc;

use settle_core::{Command, Principals, Reply, TenantId};
use settle_ledger::StoreError;

use super::SealSink;
use super::log::{Log, SlowSyncs};
use super::shared::Shared;
use super::stage::Stage;
use crate::fs::Fs;
use crate::index::Index;
use crate::recovery::Recovered;
use crate::wal::{Faults, Wal};

/// The writer's state: everything one group commit needs. `stage` (apply
/// and encode) and `log` (write, sync, publish, answer) run one after the
/// other on one thread ([`Core::commit`], inline), or on two threads as a
/// pipeline ([`super::Writer`] and [`super::LogThread`]): batch N+1 is applied while batch N
/// is being synced.
pub struct Core<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub stage: Stage<I>,
    pub log: Log<F, I>,
}

impl<F: Fs, I: Index> Core<F, I> {
    pub fn new(
        shared: Arc<Shared<I>>,
        wal: Wal<F>,
        rec: &Recovered,
        max_batch: usize,
        sealed: SealSink,
        faults: Option<Arc<Faults>>,
    ) -> Self {
        shared.recovered_disputed(rec.disputed);
        // Recovery put every replayed batch into the map.
        shared.recovered_to(rec.lsn, rec.next_fence);
        Core {
            stage: Stage {
                shared: shared.clone(),
                lsn: rec.lsn,
                next_fence: rec.next_fence,
                disputed: rec.disputed,
                max_batch: max_batch.max(1),
                principals: HashMap::default(),
                overlay: HashMap::default(),
                pending: Default::default(),
                spare: Vec::new(),
                key_buf: Vec::new(),
                principal_buf: Principals::new(),
                faults: faults.clone(),
            },
            log: Log {
                shared: shared.clone(),
                wal,
                sealed,
                faults,
                slow_syncs: SlowSyncs::default(),
                last_lsn: rec.lsn,
            },
            shared,
        }
    }

    /// Applies, logs, syncs, publishes, answers: one group commit. Every
    /// command of `batch` is answered through `answer`, after its batch is
    /// durable (or with an error, never a receipt).
    pub fn commit<R>(
        &mut self,
        batch: &mut Vec<(TenantId, Command, R)>,
        answer: impl FnMut(R, Result<Reply, StoreError>),
    ) {
        let staged = self.stage.stage(batch);
        if let Some(buf) = self.log.finish(staged, answer) {
            self.stage.spare.push(buf);
        }
        // Published (or poisoned): nothing is pending any more.
        self.stage.pending.clear();
        if !self.log.wal.fits(4096) {
            // A failure poisons the store; the batch is durable already.
            let _ = self.log.seal();
        }
    }

    /// Starts a new segment and hands the full one to the checkpointer.
    pub fn seal(&mut self) -> Result<(), StoreError> {
        self.log.seal()
    }
}
