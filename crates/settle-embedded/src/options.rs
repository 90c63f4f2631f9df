//! How the embedded store is opened: [`EmbeddedOptions`] and its defaults.

use std::sync::Arc;

use settle_core::Limits;
use settle_ledger::Clock;

use crate::wal::Faults;

/// How the embedded store is opened.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// The rules' limits (lease margin, warning cap, result size).
    pub limits: Limits,
    /// The store's clock (tests skew it to move time without sleeping).
    pub clock: Clock,
    /// Most commands gathered into one group commit (a batch message is
    /// never split). While a batch is this full the writer takes no more
    /// and waits for the frame ahead of it to be durable. 512, not 1,024:
    /// at 1,024 in flight a cap of 1,024 let every in-flight command fall
    /// into one frame, which the writer applied and encoded whole before
    /// the log thread could start on it (lock-step, the disk idle
    /// meanwhile); 512 gave 2-7 % more pairs/s and a 12 % lower p50.
    pub max_batch: usize,
    /// A log segment is sealed and checkpointed into the index at this size.
    pub segment_bytes: u64,
    /// Most commands waiting for the writer; past it a command is answered
    /// `StoreError::Overloaded` at once (nothing written).
    pub max_queue: usize,
    /// Most sealed segments waiting for the checkpointer besides the one it
    /// works on; past it the writer waits (and the queue fills). Bounds the
    /// memory, the log on disk and the reopen time.
    pub max_checkpoint_backlog: usize,
    /// The retry hint given with `Overloaded`.
    pub overload_retry_after_ms: u64,
    /// Fault injection (tests; the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: Option<Arc<Faults>>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            limits: Limits::default(),
            clock: Clock::system(),
            max_batch: 512,
            segment_bytes: 64 * 1024 * 1024,
            max_queue: 65_536,
            max_checkpoint_backlog: 2,
            overload_retry_after_ms: 100,
            #[cfg(feature = "faults")]
            faults: None,
        }
    }
}

impl EmbeddedOptions {
    /// The faults to inject: always none without the `faults` feature.
    pub(crate) fn faults(&self) -> Option<Arc<Faults>> {
        #[cfg(feature = "faults")]
        return self.faults.clone();
        #[cfg(not(feature = "faults"))]
        None
    }
}
