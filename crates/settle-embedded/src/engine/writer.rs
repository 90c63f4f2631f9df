//! The writer thread: applies each command as it comes, hands each
//! batch's frame to the log thread, and publishes and answers each batch
//! once it is durable.

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_channel::{Receiver, TryRecvError};
use settle_core::Reply;
use settle_ledger::StoreError;

use super::doorbell::{DOORBELL_TIMEOUT, Doorbell, Ringing};
use super::log_thread::{LogMsg, Synced};
use super::stage::{Changes, Gathering, Stage, Staged};
use super::{BatchTx, Msg, OnDrop, ReplyTx, commands_in};
use crate::index::Index;

/// Frames the writer hands the log thread before the oldest is durable:
/// the next one waits at the log thread, so it is written as soon as the
/// `fdatasync` before it returns, without waiting for the writer to be
/// scheduled; commands that come meanwhile are applied into the batch
/// after it, sent when the oldest is durable. The log thread still writes
/// a frame only after the one before it is durable. (Measured: one in
/// flight gives 8 % fewer pairs/s at 1,024 in flight; sending each batch
/// as soon as a command came, rather than gathering until the disk is
/// free, a third fewer at 64.)
pub const IN_FLIGHT: usize = 2;

/// A staged batch whose frame the log thread is writing: published and
/// answered by the writer once it is durable.
struct InFlight {
    replies: Vec<(Answer, Result<Reply, StoreError>)>,
    /// The answers of batches staged after it that changed nothing: given
    /// after its own, or failed with it.
    after: Vec<(Answer, Result<Reply, StoreError>)>,
    lsn: u64,
    disputed: u64,
    changes: Arc<Changes>,
    due: u64,
    next_fence: u64,
}

/// The writer thread: applies each command as it comes into the batch
/// being gathered, sends the batch's frame to the log thread when fewer
/// than [`IN_FLIGHT`] are there (so commands that come while the disk is
/// busy share the next sync), and publishes and answers each batch once
/// the log thread made it durable. The next frame goes to the disk before
/// the durable batch is published and answered.
///
/// Publishing and answering here, not on the log thread, keeps the
/// critical path on one thread: the log thread only writes and syncs (and
/// so sleeps in `fdatasync` and wakes at once), and a batch's records are
/// put in the map by the thread that built them, while they are in its
/// cache.
pub struct Writer<I: Index> {
    pub stage: Stage<I>,
    pub rx: Receiver<Msg>,
    /// Frames to the log thread (at most [`IN_FLIGHT`]).
    pub tx: Ringing<LogMsg>,
    /// What the log thread made of each frame, in order.
    pub synced: Receiver<Synced>,
    /// Rung by whoever sends on `rx` or `synced`.
    pub bell: Arc<Doorbell>,
}

/// Collects the answers of one batch message; sends them when the last arrives.
pub struct Gather {
    results: Vec<Option<Result<Reply, StoreError>>>,
    missing: usize,
    reply: Option<BatchTx>,
}

/// Whom the writer answers for one command (the parts of a batch message
/// share its [`Gather`]; inline, answers are given on the caller's thread).
pub enum Answer {
    One(ReplyTx),
    Part(usize, Arc<parking_lot::Mutex<Gather>>),
}

impl Answer {
    pub fn send(self, r: Result<Reply, StoreError>) {
        match self {
            Answer::One(tx) => {
                let _ = tx.send(r);
            }
            Answer::Part(i, g) => {
                let mut g = g.lock();
                g.results[i] = Some(r);
                g.missing -= 1;
                if g.missing == 0
                    && let Some(tx) = g.reply.take()
                {
                    let all = g
                        .results
                        .drain(..)
                        .map(|r| r.expect("every part answered"))
                        .collect();
                    let _ = tx.send(all);
                }
            }
        }
    }
}

impl<I: Index> Writer<I> {
    /// The writer thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self) {
        let shared = self.stage.shared.clone();
        let log_bell = self.tx.bell.clone();
        let _alive = OnDrop(move || {
            shared.writer_stopped();
            // The log thread finds its channel closed without waiting out
            // its timeout.
            log_bell.ring();
        });
        let max = self.stage.max_batch;
        let mut gathering = self.stage.begin(max);
        let mut inflight: VecDeque<InFlight> = VecDeque::with_capacity(IN_FLIGHT);
        loop {
            // Commands (while the batch has room), or a frame in flight
            // becoming durable, whichever comes first.
            let taking = gathering.len() < max;
            // A durable frame first: its commands wait for nothing else.
            let synced = || match self.synced.try_recv() {
                Ok(s) => Some(Event::Synced(Some(s))),
                Err(TryRecvError::Disconnected) => Some(Event::Synced(None)),
                Err(TryRecvError::Empty) => None,
            };
            let msg = || match self.rx.try_recv() {
                Ok(m) => Some(Event::Msg(Some(m))),
                Err(TryRecvError::Disconnected) => Some(Event::Msg(None)),
                Err(TryRecvError::Empty) => None,
            };
            let event = if inflight.is_empty() {
                self.bell.wait(DOORBELL_TIMEOUT, msg)
            } else if taking {
                self.bell.wait(DOORBELL_TIMEOUT, || synced().or_else(msg))
            } else {
                self.bell.wait(DOORBELL_TIMEOUT, synced)
            };
            let Some(event) = event else { continue };
            let mut closing = None;
            match event {
                Event::Msg(None) => {
                    self.flush(&mut gathering, &mut inflight);
                    self.drain(&mut inflight);
                    return self.close(None);
                }
                Event::Msg(Some(first)) => {
                    let mut next = Some(first);
                    let mut taken = 0;
                    while let Some(m) = next.take() {
                        taken += commands_in(&m);
                        if let Some(done) = self.take(&mut gathering, m) {
                            closing = Some(done);
                            break;
                        }
                        // A batch message is never split: it may take the
                        // group commit past `max_batch`.
                        if gathering.len() < max {
                            next = self.rx.try_recv().ok();
                        }
                    }
                    self.stage.shared.dequeued(taken);
                }
                Event::Synced(s) => {
                    // The batch gathered meanwhile goes to the disk before
                    // the durable one is published and answered, so the
                    // disk works while the writer does.
                    if !gathering.is_empty() {
                        self.send(&mut gathering, &mut inflight);
                    }
                    let done = inflight
                        .pop_front()
                        .expect("a completion comes only for a frame in flight");
                    self.complete(done, s);
                }
            }
            if inflight.len() < IN_FLIGHT && !gathering.is_empty() {
                self.send(&mut gathering, &mut inflight);
            }
            if let Some(done) = closing {
                self.flush(&mut gathering, &mut inflight);
                self.drain(&mut inflight);
                return self.close(Some(done));
            }
        }
    }

    /// Applies a message's commands to the batch being gathered; a
    /// `Close` gives back whom to tell when the store is closed.
    fn take(&mut self, g: &mut Gathering<Answer>, m: Msg) -> Option<std::sync::mpsc::Sender<()>> {
        match m {
            Msg::Exec(e) => {
                // Applied in place: moving the command out of its box is a copy.
                self.stage.apply(g, &e.tenant, &e.cmd, Answer::One(e.reply));
            }
            Msg::Batch {
                tenant,
                cmds,
                reply,
            } => {
                if cmds.is_empty() {
                    let _ = reply.send(Vec::new());
                    return None;
                }
                let parts = Arc::new(parking_lot::Mutex::new(Gather {
                    results: (0..cmds.len()).map(|_| None).collect(),
                    missing: cmds.len(),
                    reply: Some(reply),
                }));
                for (i, cmd) in cmds.iter().enumerate() {
                    self.stage
                        .apply(g, &tenant, cmd, Answer::Part(i, parts.clone()));
                }
            }
            Msg::Close(done) => return Some(done),
        }
        None
    }

    /// Ends the batch gathered so far and sends its frame to the log
    /// thread. A batch that changed nothing is not written: it is answered
    /// once every frame before it is durable (its answers may tell of
    /// those frames' changes: a replay of a receipt one wrote), and fails
    /// with them.
    fn send(&mut self, g: &mut Gathering<Answer>, inflight: &mut VecDeque<InFlight>) {
        // The next batch begins from what this one ends with (the disputed count).
        let ended = std::mem::take(g);
        let Staged { replies, frame } = self.stage.end(ended);
        *g = self.stage.begin(self.stage.max_batch);
        let Some(fr) = frame else {
            match inflight.back_mut() {
                Some(last) => last.after.extend(replies),
                // Nothing in flight: everything it read is durable.
                None => {
                    for (r, res) in replies {
                        r.send(res);
                    }
                }
            }
            return;
        };
        let next = InFlight {
            replies,
            after: Vec::new(),
            lsn: fr.lsn,
            disputed: fr.disputed,
            changes: fr.changes,
            due: fr.due,
            next_fence: fr.next_fence,
        };
        // If a frame before failed, the store is poisoned and the log
        // thread refuses this one too.
        match self.tx.send(LogMsg::Write(fr.buf)) {
            Ok(()) => inflight.push_back(next),
            Err(_) => {
                // The log thread is gone: nothing more can become durable.
                self.stage.shared.poison();
                self.stage.pending.retain(|(l, _)| *l != next.lsn);
                next.fail(StoreError::Closed);
            }
        }
    }

    /// Publishes and answers a frame the log thread is done with (the
    /// oldest in flight), then the batches that changed nothing staged
    /// after it; if it did not become durable, answers them all with the
    /// error.
    fn complete(&mut self, f: InFlight, synced: Option<Synced>) {
        // Its changes leave `pending` first: published, they are read from
        // the map (and move there without a copy).
        let (lsn, _) = self
            .stage
            .pending
            .pop_front()
            .expect("every frame in flight is pending");
        assert_eq!(lsn, f.lsn, "frames complete in the order they were staged");
        let Some(Synced { buf, result }) = synced else {
            self.stage.shared.poison();
            return f.fail(StoreError::Closed);
        };
        self.stage.spare.push(buf);
        if let Err(e) = result {
            return f.fail(e);
        }
        self.stage.shared.publish_batch(
            f.changes,
            f.lsn,
            f.disputed,
            f.due,
            f.next_fence,
            f.replies.len(),
        );
        for (r, res) in f.replies.into_iter().chain(f.after) {
            r.send(res);
        }
    }

    /// Sends what was gathered, if anything.
    fn flush(&mut self, g: &mut Gathering<Answer>, inflight: &mut VecDeque<InFlight>) {
        if !g.is_empty() {
            self.send(g, inflight);
        }
    }

    /// Waits for every frame in flight and answers it.
    fn drain(&mut self, inflight: &mut VecDeque<InFlight>) {
        while let Some(f) = inflight.pop_front() {
            let s = self.synced.recv().ok();
            self.complete(f, s);
        }
    }

    fn close(mut self, done: Option<std::sync::mpsc::Sender<()>>) {
        // Answer anything still queued, then checkpoint what is durable.
        let mut g = self.stage.begin(0);
        let mut taken = 0;
        while let Ok(m) = self.rx.try_recv() {
            taken += commands_in(&m);
            // A second close has nobody waiting for it.
            let _ = self.take(&mut g, m);
        }
        self.stage.shared.dequeued(taken);
        let mut inflight = VecDeque::new();
        self.flush(&mut g, &mut inflight);
        self.drain(&mut inflight);
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(LogMsg::Close(tx)).is_ok() {
            let _ = rx.recv();
        }
        // The log (and its segment-preparation thread) goes before the
        // caller hears that the store is closed.
        drop(self);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

/// What woke the writer.
enum Event {
    /// A message (`None`: every sender is gone).
    Msg(Option<Msg>),
    /// The log thread is done with the oldest frame in flight (`None`: it is gone).
    Synced(Option<Synced>),
}

impl InFlight {
    /// Answers every command with `e`.
    fn fail(self, e: StoreError) {
        for (r, _) in self.replies.into_iter().chain(self.after) {
            r.send(Err(e.clone()));
        }
    }
}
