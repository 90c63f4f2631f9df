//! The second half of a group commit: write and `fdatasync` each staged
//! frame in order, then publish its changes and answer its commands (or,
//! on a failure, poison the store and answer with the error, never a
//! receipt); seal full segments and hand them to the checkpointer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use settle_core::Reply;
use settle_ledger::StoreError;

use super::shared::Shared;
use super::stage::{Staged, StagedFrame};
use super::{CkptMsg, SealSink};
use crate::codec::frame_lsn;
use crate::fs::Fs;
use crate::index::Index;
use crate::wal::{Faults, Wal};

/// Writes, syncs, publishes and answers staged batches, in order (the
/// second half of a group commit); seals full segments.
pub struct Log<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub wal: Wal<F>,
    pub sealed: SealSink,
    pub faults: Option<Arc<Faults>>,
    /// Syncs slower than [`SLOW_SYNC`], reported now and then.
    pub slow_syncs: SlowSyncs,
    /// The batch number of the last frame written: the next must be the
    /// one after it (the writer stages them in that order).
    pub last_lsn: u64,
}

/// Slow log syncs not reported yet, and when the last report was: at most
/// one report per [`SLOW_SYNC_REPORT`], saying how many there were.
#[derive(Debug, Default)]
pub struct SlowSyncs {
    unreported: u64,
    last_report: Option<Instant>,
}

impl SlowSyncs {
    /// Counts a slow sync at `now`; `Some(n)`: report `n` slow syncs now.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        if self
            .last_report
            .is_some_and(|t| now.saturating_duration_since(t) < SLOW_SYNC_REPORT)
        {
            return None;
        }
        self.last_report = Some(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

/// A log write + `fdatasync` this slow is reported (a warning, rate
/// limited): every command of its batch waited for it. Where they happen,
/// they come with the checkpoint's table writes and segment removals on a
/// busy disk.
pub const SLOW_SYNC: Duration = Duration::from_millis(50);
const SLOW_SYNC_REPORT: Duration = Duration::from_secs(10);

impl<F: Fs, I: Index> Log<F, I> {
    /// Writes, syncs, publishes and answers a staged batch (the inline
    /// group commit); batches must come in the order they were staged.
    /// Gives back the frame buffer for reuse.
    pub fn finish<R>(
        &mut self,
        staged: Staged<R>,
        mut answer: impl FnMut(R, Result<Reply, StoreError>),
    ) -> Option<Vec<u8>> {
        let Staged { replies, frame } = staged;
        let Some(StagedFrame {
            mut buf,
            lsn,
            disputed,
            changes,
            due,
            next_fence,
        }) = frame
        else {
            // Nothing to write; what the answers say is durable already
            // (the batch before was published before this one came).
            for (r, res) in replies {
                answer(r, res);
            }
            return None;
        };
        match self.write(&mut buf) {
            Ok(()) => {
                self.shared
                    .publish_batch(changes, lsn, disputed, due, next_fence, replies.len());
                for (r, res) in replies {
                    answer(r, res);
                }
            }
            Err(e) => {
                for (r, _) in replies {
                    answer(r, Err(e.clone()));
                }
            }
        }
        Some(buf)
    }

    /// Writes and syncs one staged frame (the durable half of a group
    /// commit). An error is final: the store is poisoned and nothing of the
    /// frame may be answered as durable.
    pub fn write(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        // A batch staged after a failure was applied on top of changes
        // that never became durable: it is not written.
        if self.shared.is_poisoned() {
            return Err(StoreError::Poisoned);
        }
        // Checked in production, at the hand-off from the writer: a frame
        // out of order would make recovery stop at the gap and drop every
        // acknowledged batch after it.
        let lsn = frame_lsn(buf).expect("the writer hands the log encoded frames");
        assert_eq!(
            lsn,
            self.last_lsn + 1,
            "frames reach the log in batch order"
        );
        let started = Instant::now();
        // A frame goes whole into one segment: start the next one if the
        // preallocated space is short (an oversized frame extends the file).
        if self.wal.bytes() > 0 && !self.wal.fits(buf.len()) {
            // The batch stops here: nothing of it was written.
            self.seal()?;
        }
        if let Err(e) = self.wal.append_sync(buf) {
            // Fail closed: never retry an fsync, never answer with a receipt.
            tracing::error!(error = %e, "log write failed; the store refuses writes until reopened");
            self.shared.poison();
            return Err(StoreError::Io(e.to_string()));
        }
        self.last_lsn = lsn;
        let took = started.elapsed();
        metrics::histogram!("settle_commit_duration_seconds").record(took.as_secs_f64());
        if took >= SLOW_SYNC {
            self.slow_sync(took, buf.len());
        }
        Ok(())
    }

    /// Counts a slow sync; warns now and then (with how many since).
    fn slow_sync(&mut self, took: Duration, bytes: usize) {
        metrics::counter!("settle_log_slow_syncs_total").increment(1);
        if let Some(n) = self.slow_syncs.note(Instant::now()) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                bytes,
                slow_syncs = n,
                "a log write and sync took over {} ms (the disk is busy or slow; \
                 every command of the batch waited)",
                SLOW_SYNC.as_millis()
            );
        }
    }

    /// A clean close: seals the last segment and lets the checkpointer
    /// finish it, then stops the checkpointer.
    pub fn close(&mut self) {
        let skip = Faults::halted(&self.faults);
        if !skip && !self.shared.is_poisoned() && self.wal.bytes() > 0 {
            let _ = self.seal();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if let SealSink::Channel(ckpt) = &self.sealed
            && ckpt.send(CkptMsg::Stop(tx)).is_ok()
        {
            let _ = rx.recv();
        }
    }

    /// Starts a new segment and hands the full one to the checkpointer. A
    /// failure poisons the store.
    pub fn seal(&mut self) -> Result<(), StoreError> {
        let seq = self.wal.rotate().map_err(|e| {
            tracing::error!(error = %e, "cannot start a new log segment; failing closed");
            self.shared.poison();
            StoreError::Io(format!("cannot start a new log segment: {e}"))
        })?;
        match &mut self.sealed {
            SealSink::Queue(q) => {
                q.push(seq);
                Ok(())
            }
            SealSink::Channel(tx) => {
                let sent = match tx.try_send(CkptMsg::Sealed(seq)) {
                    Ok(()) => Ok(()),
                    // The checkpointer is `max_checkpoint_backlog` behind:
                    // wait for it (commands queue up meanwhile, up to `max_queue`).
                    Err(crossbeam_channel::TrySendError::Full(m)) => {
                        tracing::warn!(segment = seq, "the checkpointer is behind; writes wait");
                        metrics::counter!("settle_checkpoint_backpressure_total").increment(1);
                        Faults::set_writer_waiting(&self.faults, true);
                        let r = tx.send(m).map_err(|_| ());
                        Faults::set_writer_waiting(&self.faults, false);
                        r
                    }
                    Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(()),
                };
                sent.map_err(|()| {
                    tracing::error!("the checkpointer stopped; failing closed");
                    self.shared.poison();
                    StoreError::Io("the checkpointer stopped".into())
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_syncs_are_reported_at_most_once_per_period_with_their_count() {
        let t0 = Instant::now();
        let mut s = SlowSyncs::default();
        assert_eq!(s.note(t0), Some(1), "the first is reported at once");
        assert_eq!(s.note(t0 + Duration::from_secs(1)), None);
        assert_eq!(
            s.note(t0 + SLOW_SYNC_REPORT - Duration::from_millis(1)),
            None
        );
        assert_eq!(
            s.note(t0 + SLOW_SYNC_REPORT),
            Some(3),
            "the next report counts the ones held back"
        );
        assert_eq!(s.note(t0 + SLOW_SYNC_REPORT * 3), Some(1));
    }
}
