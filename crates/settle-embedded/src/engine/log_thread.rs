//! The log thread (OS thread `settle-log`): writes and `fdatasync`s the
//! writer's frames, in order, one at a time, and seals full segments. It
//! owns the log ([`Log`]): nothing else writes to it while the store runs
//! threaded.

use std::sync::Arc;

use crossbeam_channel::{Receiver, TryRecvError};
use settle_ledger::StoreError;

use super::OnDrop;
use super::doorbell::{DOORBELL_TIMEOUT, Doorbell, Ringing};
use super::log::Log;
use crate::fs::Fs;
use crate::index::Index;

/// What the writer hands the log thread.
pub enum LogMsg {
    /// Write and sync this frame; answer with [`Synced`].
    Write(Vec<u8>),
    /// Seal the last segment, stop the checkpointer, drop the log.
    Close(std::sync::mpsc::Sender<()>),
}

/// The log thread's answer to a [`LogMsg::Write`]: the frame buffer back,
/// and whether the frame is durable.
pub struct Synced {
    pub buf: Vec<u8>,
    pub result: Result<(), StoreError>,
}

/// The log thread: writes and syncs the writer's frames, in order, and
/// seals full segments.
pub struct LogThread<F: Fs, I: Index> {
    pub log: Log<F, I>,
    pub rx: Receiver<LogMsg>,
    pub synced: Ringing<Synced>,
    /// Rung by the writer after each message on `rx`.
    pub bell: Arc<Doorbell>,
}

impl<F: Fs, I: Index> LogThread<F, I> {
    /// The log thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self) {
        let shared = self.log.shared.clone();
        let writer_bell = self.synced.bell.clone();
        let _alive = OnDrop(move || {
            shared.writer_stopped();
            writer_bell.ring();
        });
        loop {
            let next = self
                .bell
                .wait(DOORBELL_TIMEOUT, || match self.rx.try_recv() {
                    Ok(m) => Some(Some(m)),
                    Err(TryRecvError::Disconnected) => Some(None),
                    Err(TryRecvError::Empty) => None,
                });
            let m = match next {
                Some(Some(m)) => m,
                // The writer is gone.
                Some(None) => return,
                None => continue,
            };
            match m {
                LogMsg::Write(mut buf) => {
                    let result = self.log.write(&mut buf);
                    if result.is_ok() && !self.log.wal.fits(4096) {
                        // A failure poisons the store; this frame is durable
                        // already. The checkpointer evicts the segment's
                        // records once the writer published its last batch.
                        let _ = self.log.seal();
                    }
                    if self.synced.send(Synced { buf, result }).is_err() {
                        return;
                    }
                }
                LogMsg::Close(done) => {
                    self.log.close();
                    drop(self);
                    let _ = done.send(());
                    return;
                }
            }
        }
    }
}
