//! A worker pool's calls in batches (SPEC §10): [`Batching`] is a
//! [`Transport`] that many concurrent `run_once` calls share. It sends the
//! calls waiting at the moment a request slot is free as one
//! `POST /v1/batch`, so a pool of workers claims many keys and settles
//! many outcomes per round trip, and the server group-commits each batch
//! once.
//!
//! No call waits for company: with a slot free, a call goes at once (a
//! batch of one); calls only gather while `max_in_flight` batches are
//! already on the wire. So an idle pool keeps single-call latency and a
//! busy one gets batches as large as the load makes them (up to
//! `max_calls`), like a group commit.
//!
//! Each call keeps the single call's answer: the batch answers every call
//! with what its single request would have answered. A batch that gets no
//! answer gives every call in it that same transport error, which the
//! worker handles as for a single call (retry the same call). Revoke and
//! warn, which a batch cannot carry, are sent alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use settle_client::Client;
use settle_core::{Command, Reply};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::transport::{BoxFuture, Transport, TransportError};

/// The answers to a batch: one per command, in order.
pub type BatchAnswers = Vec<Result<Reply, TransportError>>;

/// A ledger that takes many commands in one request.
pub trait BatchTransport: Transport {
    /// Runs `cmds` in order in one request; one answer per command. The
    /// outer `Err` is the request's own failure (it applies to every
    /// command). Only batchable commands (see [`is_batchable`]) are given.
    fn execute_batch(
        &self,
        cmds: Vec<Command>,
    ) -> BoxFuture<'_, Result<BatchAnswers, TransportError>>;
}

impl BatchTransport for Client {
    fn execute_batch(
        &self,
        cmds: Vec<Command>,
    ) -> BoxFuture<'_, Result<BatchAnswers, TransportError>> {
        Box::pin(async move {
            let answers = Client::execute_batch(self, &cmds).await?;
            Ok(answers
                .into_iter()
                .map(|a| a.map_err(TransportError::from))
                .collect())
        })
    }
}

impl<T: BatchTransport + ?Sized> BatchTransport for Arc<T> {
    fn execute_batch(
        &self,
        cmds: Vec<Command>,
    ) -> BoxFuture<'_, Result<BatchAnswers, TransportError>> {
        (**self).execute_batch(cmds)
    }
}

/// Whether a §10 batch can carry `cmd` (every operation on a key).
pub fn is_batchable(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Claim(_)
            | Command::Heartbeat(_)
            | Command::Dispatch(_)
            | Command::Settle(_)
            | Command::Release(_)
            | Command::Reconcile(_)
    )
}

/// How [`Batching`] gathers calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// The most calls in one batch (at most the server's
    /// `max_batch_calls`, default 1000). Default 100.
    pub max_calls: usize,
    /// Batches on the wire at once. Default 4.
    pub max_in_flight: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_calls: 100,
            max_in_flight: 4,
        }
    }
}

struct Pending {
    cmd: Command,
    answer: oneshot::Sender<Result<Reply, TransportError>>,
}

/// Counters of a [`Batching`] transport.
#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    calls: AtomicU64,
    queued: AtomicU64,
}

/// A [`Transport`] for a pool of workers that sends their calls in
/// batches (see the module docs). Cloning shares the queue. Needs a Tokio
/// runtime: the sender runs as a task, which ends when the last clone is
/// dropped.
pub struct Batching<T> {
    inner: Arc<T>,
    queue: mpsc::UnboundedSender<Pending>,
    counters: Arc<Counters>,
}

impl<T> Clone for Batching<T> {
    fn clone(&self) -> Self {
        Batching {
            inner: self.inner.clone(),
            queue: self.queue.clone(),
            counters: self.counters.clone(),
        }
    }
}

impl<T: BatchTransport + 'static> Batching<T> {
    /// Batches the calls made through it over `inner`.
    ///
    /// # Panics
    /// Outside a Tokio runtime, or with `max_calls` or `max_in_flight` 0.
    pub fn new(inner: T, opts: BatchOptions) -> Batching<T> {
        assert!(
            opts.max_calls > 0 && opts.max_in_flight > 0,
            "a batch holds at least one call and one batch must be allowed on the wire"
        );
        let inner = Arc::new(inner);
        let counters = Arc::new(Counters::default());
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_batches(inner.clone(), rx, opts, counters.clone()));
        Batching {
            inner,
            queue,
            counters,
        }
    }

    /// The transport the batches go over.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Batch requests sent so far.
    pub fn batches_sent(&self) -> u64 {
        self.counters.batches.load(Ordering::SeqCst)
    }

    /// Calls sent in batches so far.
    pub fn calls_sent(&self) -> u64 {
        self.counters.calls.load(Ordering::SeqCst)
    }

    /// Calls waiting for a batch right now.
    pub fn queued(&self) -> u64 {
        self.counters.queued.load(Ordering::SeqCst)
    }
}

/// Takes the calls waiting whenever a slot is free, one batch at a time.
async fn send_batches<T: BatchTransport + 'static>(
    inner: Arc<T>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    opts: BatchOptions,
    counters: Arc<Counters>,
) {
    let slots = Arc::new(Semaphore::new(opts.max_in_flight));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < opts.max_calls {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        counters
            .queued
            .fetch_sub(batch.len() as u64, Ordering::SeqCst);
        counters.batches.fetch_add(1, Ordering::SeqCst);
        counters
            .calls
            .fetch_add(batch.len() as u64, Ordering::SeqCst);
        let inner = inner.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let (cmds, answers): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.cmd, p.answer)).unzip();
            let n = cmds.len();
            match inner.execute_batch(cmds).await {
                Ok(results) if results.len() == n => {
                    for (tx, r) in answers.into_iter().zip(results) {
                        // A caller that stopped waiting does not matter here.
                        let _ = tx.send(r);
                    }
                }
                Ok(results) => {
                    let e = TransportError::Fatal {
                        detail: format!("{} answers to a batch of {n} calls", results.len()),
                    };
                    for tx in answers {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for tx in answers {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

impl<T: BatchTransport + 'static> Transport for Batching<T> {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        Box::pin(async move {
            if !is_batchable(&cmd) {
                return self.inner.execute(cmd).await;
            }
            let (answer, rx) = oneshot::channel();
            self.counters.queued.fetch_add(1, Ordering::SeqCst);
            if self.queue.send(Pending { cmd, answer }).is_err() {
                self.counters.queued.fetch_sub(1, Ordering::SeqCst);
                return Err(TransportError::NotSent {
                    detail: "the batch sender has stopped".into(),
                });
            }
            rx.await.unwrap_or_else(|_| {
                // The sender task ended (its runtime shut down) with the
                // call possibly on the wire.
                Err(TransportError::NoAnswer {
                    detail: "the batch sender stopped before the answer".into(),
                })
            })
        })
    }
}
