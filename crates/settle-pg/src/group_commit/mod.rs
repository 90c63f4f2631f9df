//! The group-commit path, for claims and settlements.
//!
//! Concurrent claims and settlements are gathered by a few workers; each
//! worker runs what it gathered as ONE transaction ([`batch_transaction`])
//! and answers every command only after that transaction's COMMIT. Each
//! command is still atomic and durable; what is shared is the cost of the
//! round trips and of the WAL flush. An invalid command is answered at
//! [`Batcher::submit`], before it is queued. The transaction's phases:
//!
//! 1. **plan locks** ([`plan`]: [`BatchPlan`]): the binding principals
//!    (shared, in key order), the records, one fence per claim;
//! 2. **load** ([`load`]: [`load_batch`], round trip 1): `BEGIN` and the
//!    principal advisory locks, then one statement that reads the records,
//!    the principal rows, the database clock and the fences — after the
//!    locks, so its snapshot holds every committed generation;
//! 3. **decide** ([`decide`]: [`decide_batch`]): the core, applied to the
//!    commands in arrival order, each seeing the state the previous ones
//!    left. Commands that need more than the batch's locks (a principal
//!    other than their binding's, or a generation to raise) are taken out
//!    unapplied and run afterwards on the per-command path
//!    (`command::execute`). They were concurrent with the batch, so either
//!    order is linearizable;
//! 4. **write + commit** ([`write`]: [`write_and_commit_batch`], round
//!    trip 2): one statement writing every changed record — updates and
//!    deletes only if the row's `xmin` is still the one read
//!    (compare-and-set), inserts only if the key is still free and within
//!    500 ms of the read — and the commit token, then `COMMIT`. If any row
//!    fails its check the statement fails, the COMMIT is a rollback, and
//!    the batch's commands run again one by one on the per-command path,
//!    which always makes progress;
//! 5. **resolve in doubt** (also in [`write`]: `resolve_batch_commit`): a
//!    COMMIT whose answer was lost is resolved by its token (`doubt.rs`).
//!
//! The one-round-trip path ([`warm`]: [`warm_batch`]) runs phases 1, 3 and
//! 4 with the load replaced by what this process knows (`known.rs`), its
//! write checking all of it; [`batch_transaction`] runs the phases in
//! order when it cannot.

mod decide;
mod load;
mod plan;
#[cfg(test)]
mod tests;
mod warm;
mod write;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use settle_core::{Command, Key, Limits, Reply, TenantId};
use settle_ledger::StoreError;
use tokio::sync::{Mutex, mpsc, oneshot};

use self::decide::decide_batch;
use self::load::{BatchLoad, load_batch};
use self::plan::BatchPlan;
use self::warm::warm_batch;
use self::write::{BatchWrites, Stamps, write_and_commit_batch};
use crate::PgError;
use crate::command;
use crate::state::{Conn, Inner, transient};

/// Scheduler turns a worker waits at most for a batch to fill up.
const GATHER_TURNS: usize = 8;

pub struct Item {
    pub tenant: TenantId,
    pub cmd: Command,
    pub reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// Whether a command goes through group commit: the hot calls whose locks
/// are known up front (the binding principal and the record).
pub fn batchable(cmd: &Command) -> bool {
    matches!(cmd, Command::Claim(_) | Command::Settle(_))
}

/// The queue in front of the workers: bounded, so a stalled database
/// answers `Overloaded` instead of growing memory. Dropping it stops the
/// workers once the queue is drained.
pub struct Batcher {
    tx: mpsc::Sender<Item>,
    limits: Limits,
    max_batch: usize,
    workers: usize,
    /// How long the latest batch took (µs), for the retry hint.
    last_batch_us: Arc<AtomicU64>,
}

impl Batcher {
    pub fn start(inner: Arc<Inner>, workers: usize, max_batch: usize, queue: usize) -> Batcher {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let last_batch_us = Arc::new(AtomicU64::new(0));
        for _ in 0..workers.max(1) {
            tokio::spawn(worker(
                inner.clone(),
                rx.clone(),
                max_batch.max(1),
                last_batch_us.clone(),
            ));
        }
        Batcher {
            tx,
            limits: inner.limits,
            max_batch: max_batch.max(1),
            workers: workers.max(1),
            last_batch_us,
        }
    }

    pub async fn submit(&self, tenant: TenantId, cmd: Command) -> Result<Reply, StoreError> {
        // An invalid command is answered at once: it costs no round trip,
        // and no fence is taken for it (the batch takes one per claim).
        if let Err(e) = cmd.validate(&self.limits) {
            return Ok(Reply::Invalid(e));
        }
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Item { tenant, cmd, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(StoreError::Overloaded {
                    retry_after_ms: self.retry_after_ms(),
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(StoreError::Closed),
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// About how long the queue takes to drain: its batches at the latest
    /// batch's duration (at least 10 ms, at most 5 s).
    fn retry_after_ms(&self) -> u64 {
        let queued = (self.tx.max_capacity() - self.tx.capacity()) as u64;
        let batches = queued.div_ceil((self.max_batch * self.workers) as u64);
        let per_batch_ms = self.last_batch_us.load(Ordering::Relaxed).div_ceil(1000);
        (batches * per_batch_ms).clamp(10, 5000)
    }
}

async fn worker(
    inner: Arc<Inner>,
    rx: Arc<Mutex<mpsc::Receiver<Item>>>,
    max: usize,
    last_batch_us: Arc<AtomicU64>,
) {
    loop {
        let mut items = Vec::new();
        {
            // One worker gathers at a time: while others run their batches,
            // the queue fills up, and the next batch takes all of it.
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(i) => items.push(i),
                None => return,
            }
            // Commands answered together come back together: let the tasks
            // that are ready run and queue theirs before taking the batch,
            // for as long as the queue keeps growing (a few scheduler turns
            // at most; under light load the first turn adds nothing and we
            // go at once).
            let mut queued = rx.len();
            for _ in 0..GATHER_TURNS {
                tokio::task::yield_now().await;
                let now = rx.len();
                if now == queued {
                    break;
                }
                queued = now;
            }
            while items.len() < max {
                match rx.try_recv() {
                    Ok(i) => items.push(i),
                    Err(_) => break,
                }
            }
        }
        // A panic (a broken invariant in the rules, an undecodable row that
        // slipped through) must fail only this batch's callers, whose reply
        // channels drop, and not stop the worker every later claim needs.
        // Caught here rather than by running the batch as a task of its own:
        // a batch's future is ~11 KB, and a task copied it about six times
        // (into the task, its stages, its output) — half of the process's
        // instructions per batch at one client, under callgrind.
        let started = Instant::now();
        if let Err(panic) = AssertUnwindSafe(run(&inner, items)).catch_unwind().await {
            let what = settle_ledger::panic_message(panic.as_ref());
            tracing::error!(panic = %what, "a group-commit batch panicked; its callers get an error");
        }
        last_batch_us.store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

/// What the batch decided for one command.
enum Fate {
    Reply(Reply),
    /// Run on its own after the batch.
    Alone,
    Failed(StoreError),
}

async fn run(inner: &Arc<Inner>, items: Vec<Item>) {
    // A batch that breaks: `tests::a_batch_that_panics_*` checks what its
    // callers get and that group commit goes on.
    #[cfg(test)]
    if items
        .iter()
        .any(|i| record_key(&i.cmd).as_str() == tests::PANIC_KEY)
    {
        panic!("a test's batch breaks");
    }
    let mut retries = 0;
    let fates = loop {
        match batch_transaction(inner, &items).await {
            Ok(f) => break f,
            // A row changed under the batch (contention on a key with another
            // batch or server): the per-command path serialises such commands.
            Err(PgError::Raced(_)) => break items.iter().map(|_| Fate::Alone).collect(),
            Err(e) if transient(&e) && retries < inner.max_retries => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(5 << retries.min(6))).await;
            }
            Err(e) => {
                let e = StoreError::from(e);
                break items.iter().map(|_| Fate::Failed(e.clone())).collect();
            }
        }
    };
    for (item, fate) in items.into_iter().zip(fates) {
        match fate {
            Fate::Reply(r) => {
                let _ = item.reply.send(Ok(r));
            }
            Fate::Failed(e) => {
                let _ = item.reply.send(Err(e));
            }
            Fate::Alone => {
                let inner = inner.clone();
                tokio::spawn(async move {
                    let r = command::execute(&inner, &item.tenant, &item.cmd)
                        .await
                        .map_err(StoreError::from);
                    let _ = item.reply.send(r);
                });
            }
        }
    }
}

type Id = (TenantId, Key);

fn record_key(cmd: &Command) -> &Key {
    match cmd {
        Command::Claim(c) => &c.key,
        Command::Settle(s) => &s.key,
        _ => unreachable!("only claims and settlements are batched"),
    }
}

/// Why a batch's transaction ends before its COMMIT: the error, after a
/// rollback (the connection is reused if that works) or with the
/// connection closed (a round trip failed, timed out or cannot be trusted).
struct Abort {
    rollback: bool,
    error: PgError,
}

impl From<PgError> for Abort {
    fn from(error: PgError) -> Abort {
        Abort {
            rollback: false,
            error,
        }
    }
}

impl Abort {
    fn rollback(error: PgError) -> Abort {
        Abort {
            rollback: true,
            error,
        }
    }
    async fn finish(self, conn: Conn, inner: &Inner) -> PgError {
        if self.rollback {
            conn.rollback(&inner.sql).await;
        } else {
            drop(conn);
        }
        self.error
    }
}

/// One transaction of the group-commit path, phase by phase: plan locks,
/// load (round trip 1), decide (the core, command by command), write +
/// commit (round trip 2), resolve in doubt. Returns each command's fate.
async fn batch_transaction(inner: &Inner, items: &[Item]) -> Result<Vec<Fate>, PgError> {
    let plan = BatchPlan::of(inner, items);
    if let Some(done) = warm_batch(inner, items, &plan).await {
        return done;
    }
    let conn = Conn::get(&inner.pool, inner.client_timeout).await?;
    let seen = inner.seen.get();
    let mut load = match load_batch(inner, &conn, &plan).await {
        Ok(l) => l,
        Err(abort) => return Err(abort.finish(conn, inner).await),
    };
    let (fates, changed, _) = decide_batch(inner, items, &mut load);
    let writes = match BatchWrites::of(&changed, &load) {
        Ok(w) => w,
        Err(e) => return Err(Abort::from(e).finish(conn, inner).await),
    };
    if writes.tenant.is_empty() {
        // Nothing changed (refusals, in-flight answers, replays).
        conn.rollback(&inner.sql).await;
        return Ok(fates);
    }
    let committed = write_and_commit_batch(
        inner,
        conn,
        &writes,
        Stamps::read(load.db_now),
        seen.as_ref(),
        None,
    )
    .await;
    remember(inner, committed.as_ref().ok(), &changed, &mut load);
    committed?;
    Ok(fates)
}

/// Tells [`Known`](crate::known::Known) what a batch's commit left: its
/// records as written at `xmin` (an answered COMMIT), or nothing known of
/// them (an error, or a commit resolved in doubt: its `xmin` is not known).
/// The records move out of `load` (it is done with).
fn remember(inner: &Inner, xmin: Option<&Option<String>>, changed: &[Id], load: &mut BatchLoad) {
    match xmin {
        Some(Some(x)) => inner.known.committed(
            x,
            changed.iter().map(|id| {
                let after = match load.state.remove(id) {
                    Some(Ok(r)) => r,
                    _ => None,
                };
                (id.clone(), after)
            }),
        ),
        _ => inner.known.forget(changed),
    }
}
