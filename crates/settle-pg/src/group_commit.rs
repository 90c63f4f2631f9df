//! The group-commit path, for claims and settlements.
//!
//! Concurrent claims and settlements are gathered by a few workers; each
//! worker runs what it gathered as ONE transaction ([`batch_transaction`])
//! and answers every command only after that transaction's COMMIT. Each
//! command is still atomic and durable; what is shared is the cost of the
//! round trips and of the WAL flush. An invalid command is answered at
//! [`Batcher::submit`], before it is queued. The transaction's phases:
//!
//! 1. **plan locks** ([`BatchPlan`]): the binding principals (shared, in
//!    key order), the records, one fence per claim;
//! 2. **load** ([`load_batch`], round trip 1): `BEGIN` and the principal
//!    advisory locks, then one statement that reads the records, the
//!    principal rows, the database clock and the fences — after the locks,
//!    so its snapshot holds every committed generation;
//! 3. **decide** ([`decide_batch`]): the core, applied to the commands in
//!    arrival order, each seeing the state the previous ones left. Commands
//!    that need more than the batch's locks (a principal other than their
//!    binding's, or a generation to raise) are taken out unapplied and run
//!    afterwards on the per-command path (`command::execute`). They were
//!    concurrent with the batch, so either order is linearizable;
//! 4. **write + commit** ([`write_and_commit_batch`], round trip 2): one
//!    statement writing every changed record — updates and deletes only if
//!    the row's `xmin` is still the one read (compare-and-set), inserts only
//!    if the key is still free and within 500 ms of the read — and the
//!    commit token, then `COMMIT`. If any row fails its check the statement fails,
//!    the COMMIT is a rollback, and the batch's commands run again one by
//!    one on the per-command path, which always makes progress;
//! 5. **resolve in doubt** ([`resolve_batch_commit`]): a COMMIT whose answer
//!    was lost is resolved by its token (`doubt.rs`).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use settle_core::{
    Command, Ctx, Fence, Key, Limits, OpState, Principal, PrincipalState, Principals, Record,
    RefusalCode, Reply, TenantId, Timestamp, apply, principals_needed,
};
use settle_ledger::StoreError;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::codec::principal_state;
use crate::command;
use crate::doubt::{self, Commit};
use crate::known::PrincipalRow;
use crate::lock::principal_key;
use crate::rows::{self, RecordRow};
use crate::session::{Server, Token};
use crate::sql::{BATCH_WRITE_TYPES, STALE, WARM_WRITE_TYPES};
use crate::state::{Conn, Inner, now_from, transient};

/// Scheduler turns a worker waits at most for a batch to fill up.
const GATHER_TURNS: usize = 8;

/// New records are written only this soon after the batch read the clock
/// (less than the shortest retention, 1 s; see `sql::batch_write`).
const INSERT_WINDOW_MS: i64 = 500;

/// The batch write found a row changed since it was read (or a new key
/// taken): nothing was written.
fn stale(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.message().contains(STALE))
}

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

/// The one-round-trip path: a batch whose every record, principal, clock
/// and fence this process knows (`known.rs`) is decided on that, and sent
/// as `BEGIN`, the settings, the principals' shared locks, one write that
/// checks everything it was decided on (records by `xmin`, a new key
/// free and inside the insert window of its fence's draw, principal rows
/// as known, the clock estimate not ahead, the settings in force) and
/// `COMMIT`, pipelined. `None`: not taken, or a check failed (nothing was
/// written): the two-round-trip path runs. Taken only when every command
/// changes its record: an answer without a write (a replay, a refusal, an
/// in-flight answer) must come from a read.
async fn warm_batch(
    inner: &Inner,
    items: &[Item],
    plan: &BatchPlan,
) -> Option<Result<Vec<Fate>, PgError>> {
    let known = &inner.known;
    if !known.is_on() {
        return None;
    }
    {
        // Keys known not to decode are refused by the read path only.
        let undecodable = inner.undecodable();
        if plan.ids.iter().any(|id| undecodable.contains(id)) {
            return None;
        }
    }
    let settled: Vec<&Id> = items
        .iter()
        .filter(|it| !matches!(it.cmd, Command::Claim(_)))
        .map(|it| (&it.tenant, record_key(&it.cmd)))
        .filter_map(|(t, k)| plan.ids.iter().find(|(a, b)| a == t && b == k))
        .collect();
    let principals: Vec<(String, String)> = plan
        .pr_t
        .iter()
        .cloned()
        .zip(plan.pr_n.iter().cloned())
        .collect();
    let server = inner.seen.get();
    let mut warm = known.warm(
        plan.ids.iter().map(|id| (id, settled.contains(&id))),
        &principals,
        plan.claims as usize,
        server.as_ref(),
    )?;
    let now = now_from(inner, warm.db_ms);
    // Never decided at a time before what it decides on.
    let behind = warm
        .records
        .values()
        .any(|(r, _)| r.as_ref().is_some_and(|r| r.updated_at > now))
        || warm.principals.values().any(|p| p.state.moved_at > now);
    let mut load = BatchLoad::known(&mut warm);
    let (fates, changed, all_changed) = decide_batch(inner, items, &mut load);
    let writes = match BatchWrites::of(&changed, &load) {
        Ok(w) if !behind && all_changed && !w.tenant.is_empty() => w,
        // An answer that writes nothing is given from a read.
        _ => return None,
    };
    let rows: Vec<&PrincipalRow> = principals.iter().map(|p| &load.principal_rows[p]).collect();
    let checks = WarmChecks {
        plan,
        generation: rows.iter().map(|r| r.generation.clone()).collect(),
        moved_at: rows.iter().map(|r| r.moved_at).collect(),
        moves: rows.iter().map(|r| r.moves.clone()).collect(),
        db_ms: warm.db_ms,
        fences_last: warm.fences_last.map(|f| f.0 as i64),
    };
    let conn = match Conn::get(&inner.pool, inner.client_timeout).await {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let seen = inner.seen.get();
    if seen != server {
        // A new connection met another server (a failover, a restart): what
        // was learnt before is not checked against it. Nothing was sent.
        return None;
    }
    let stamps = Stamps {
        token_at: warm.db_ms,
        insert_from: warm.fences_db_ms,
    };
    inner.known.sending();
    let committed =
        write_and_commit_batch(inner, conn, &writes, stamps, seen.as_ref(), Some(&checks)).await;
    let done = match committed {
        Ok(x) => {
            remember(inner, Some(&x), &changed, &mut load);
            // What the next block is sized on.
            known.granted(warm.fences_last, plan.claims as usize);
            Ok(fates)
        }
        Err(e) => Err(e),
    };
    warm_outcome(inner, plan, &principals, done)
}

/// What a one-round-trip attempt's outcome means: the batch's fates, an
/// error for the caller's retry policy, or `None` (nothing was written:
/// run the two-round-trip path).
fn warm_outcome(
    inner: &Inner,
    plan: &BatchPlan,
    principals: &[(String, String)],
    done: Result<Vec<Fate>, PgError>,
) -> Option<Result<Vec<Fate>, PgError>> {
    let known = &inner.known;
    match done {
        Ok(fates) => {
            known.count(true);
            Some(Ok(fates))
        }
        Err(PgError::Raced(_)) => {
            known.count(false);
            known.stale(&plan.ids, principals);
            None
        }
        // A database error only this statement could meet (it did not
        // commit: its COMMIT was answered): the two-round-trip path serves
        // from now on.
        Err(e) if matches!(&e, PgError::Db(db) if db.as_db_error().is_some()) && !transient(&e) => {
            tracing::warn!(error = %e,
                "the one-round-trip write failed; group commit reads first from now on");
            known.turn_off();
            None
        }
        Err(e) => {
            known.forget(&plan.ids);
            Some(Err(e))
        }
    }
}

/// The database times a batch's write is stamped with: its commit token's
/// (the clock as read, or as estimated), and the start of its insert
/// window (when its fences were drawn).
struct Stamps {
    token_at: i64,
    insert_from: i64,
}

impl Stamps {
    /// Both from the batch's own read.
    fn read(db_now: i64) -> Stamps {
        Stamps {
            token_at: db_now,
            insert_from: db_now,
        }
    }
}

/// What the one-round-trip write also sends: the batch's locks (taken in
/// the same round trip) and the principal rows it was decided on, with
/// its clock estimate (checked by `sql::warm_check`).
struct WarmChecks<'a> {
    plan: &'a BatchPlan,
    generation: Vec<Option<String>>,
    moved_at: Vec<Option<i64>>,
    moves: Vec<Option<Vec<u8>>>,
    db_ms: i64,
    fences_last: Option<i64>,
}

/// Phase 1: what a batch locks (the binding principals, shared, in key
/// order) and reads (the records and the principal rows, and one fence per claim).
struct BatchPlan {
    lock_keys: Vec<i64>,
    /// The records, sorted, once each.
    ids: Vec<Id>,
    /// The same, as the load's parameters.
    id_t: Vec<String>,
    id_k: Vec<String>,
    claims: i32,
    /// The principals' tenants and names.
    pr_t: Vec<String>,
    pr_n: Vec<String>,
}

impl BatchPlan {
    fn of(inner: &Inner, items: &[Item]) -> BatchPlan {
        let mut principals: Vec<(TenantId, Principal)> = Vec::new();
        let mut ids: Vec<Id> = Vec::new();
        let mut claims = 0i32;
        for it in items {
            let p = it
                .cmd
                .binding_principal()
                .expect("claims and settlements carry a binding");
            let pid = (it.tenant.clone(), p.clone());
            if !principals.contains(&pid) {
                principals.push(pid);
            }
            if matches!(it.cmd, Command::Claim(_)) {
                claims += 1;
            }
            ids.push((it.tenant.clone(), record_key(&it.cmd).clone()));
        }
        ids.sort();
        ids.dedup();
        let mut lock_keys: Vec<i64> = principals
            .iter()
            .map(|(t, p)| principal_key(&inner.schema, t.as_str(), p.as_str()))
            .collect();
        lock_keys.sort();
        lock_keys.dedup();
        let (id_t, id_k) = ids
            .iter()
            .map(|(t, k)| (t.as_str().to_string(), k.as_str().to_string()))
            .unzip();
        let (pr_t, pr_n) = principals
            .iter()
            .map(|(t, p)| (t.as_str().to_string(), p.as_str().to_string()))
            .unzip();
        BatchPlan {
            lock_keys,
            ids,
            id_t,
            id_k,
            claims,
            pr_t,
            pr_n,
        }
    }
}

/// What a batch read, under its locks.
struct BatchLoad {
    /// The database clock (ms), as read.
    db_now: i64,
    /// The fences taken for the claims, in increasing order.
    fences: std::vec::IntoIter<Fence>,
    /// Each record as read, then as the batch's commands leave it; a record
    /// that does not decode refuses its own commands only (record_refused).
    state: HashMap<Id, Result<Option<Record>, PgError>>,
    /// The `xmin` each stored record was read at.
    read_at: HashMap<Id, String>,
    /// The principal rows by (tenant, principal), with their states (a
    /// principal without a row is absent: generation 0). The one-round-trip
    /// path checks the rows as they are.
    principal_rows: HashMap<(String, String), PrincipalRow>,
}

/// What a load read beyond what its batch decides on: the fences drawn
/// past its claims, and the clock read again at the load's end (the
/// closest reading to its answer). Both are for the one-round-trip path.
struct Ahead {
    fences: Vec<Fence>,
    read_end: i64,
}

impl BatchLoad {
    /// What the one-round-trip path decides on: what the process knows,
    /// as if it had been read (taken out of `warm`).
    fn known(warm: &mut crate::known::Warm) -> BatchLoad {
        let mut load = BatchLoad {
            db_now: warm.db_ms,
            fences: std::mem::take(&mut warm.fences).into_iter(),
            state: HashMap::new(),
            read_at: HashMap::new(),
            principal_rows: std::mem::take(&mut warm.principals),
        };
        for (id, (r, x)) in std::mem::take(&mut warm.records) {
            if let Some(x) = x {
                load.read_at.insert(id.clone(), x);
            }
            load.state.insert(id, Ok(r));
        }
        load
    }

    /// Every principal the batch locked, as read: its row, or no row.
    fn principal_rows(&self, plan: &BatchPlan) -> Vec<((String, String), PrincipalRow)> {
        plan.pr_t
            .iter()
            .zip(&plan.pr_n)
            .map(|(t, n)| {
                let id = (t.clone(), n.clone());
                let row = self
                    .principal_rows
                    .get(&id)
                    .cloned()
                    .unwrap_or(PrincipalRow {
                        generation: None,
                        moved_at: None,
                        moves: None,
                        state: PrincipalState::default(),
                    });
                (id, row)
            })
            .collect()
    }
}

/// Phase 2, round trip 1: `BEGIN`, the transaction's settings, the
/// principal locks (in key order) and one statement reading everything
/// else, pipelined (the prepared statements cost no parsing). The read
/// starts after the locks are held, so its snapshot has every committed
/// generation.
async fn load_batch(inner: &Inner, conn: &Conn, plan: &BatchPlan) -> Result<BatchLoad, Abort> {
    let (sql, c) = (&inner.sql, conn.client());
    let settings_st = conn.prepare(&sql.settings).await?;
    let lock_st = conn.prepare(&sql.lock_principals).await?;
    let load_st = conn
        .prepare(if plan.ids.len() == 1 && plan.pr_t.len() == 1 {
            &sql.batch_load_one
        } else {
            &sql.batch_load
        })
        .await?;
    // Shared locks only, taken in array (= key) order.
    let shared = vec![false; plan.lock_keys.len()];
    // A block of fences beyond the batch's own, for the one-round-trip path
    // (sized on what the last one gave: `known::Draws`).
    let draw = plan.claims + inner.known.fences_wanted(plan.claims);
    let load_params: [&(dyn ToSql + Sync); 5] =
        [&plan.id_t, &plan.id_k, &draw, &plan.pr_t, &plan.pr_n];
    let sent = Instant::now();
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let lock_params: [&(dyn ToSql + Sync); 2] = [&plan.lock_keys, &shared];
    // Past the deadline nothing has committed: the connection is dropped.
    let (r_begin, r_settings, r_lock, r_load) = conn
        .within(async {
            futures::join!(
                c.batch_execute(sql.batch_begin),
                c.execute(&settings_st, &no_params),
                c.execute(&lock_st, &lock_params),
                c.query(&load_st, &load_params)
            )
        })
        .await?;
    let rows = match r_begin.and(r_settings).and(r_lock).and(r_load) {
        Ok(rows) => rows,
        Err(e) if e.as_db_error().is_some() => return Err(Abort::rollback(e.into())),
        Err(e) => return Err(Abort::from(PgError::from(e))),
    };
    let answered = Instant::now();
    let (load, ahead) = read_batch(inner, plan, &rows)?;
    inner.known.loaded(
        load.db_now,
        ahead.read_end,
        sent,
        answered,
        ahead.fences,
        load.principal_rows(plan),
    );
    Ok(load)
}

/// Checks the durability settings read inside the transaction and decodes
/// the load: clock, fences and principals from the first row, one record
/// per row.
/// Returns what was read for the one-round-trip path apart.
fn read_batch(
    inner: &Inner,
    plan: &BatchPlan,
    rows: &[tokio_postgres::Row],
) -> Result<(BatchLoad, Ahead), Abort> {
    let ids = &plan.ids;
    let first = rows
        .first()
        .ok_or_else(|| PgError::Corrupt("the load returned no row".into()))?;
    let db_now = rows::loaded_clock(first).map_err(Abort::rollback)?;
    let read_end: i64 = first.get(13);
    let mut fences: Vec<i64> = first.get(2);
    fences.sort_unstable();
    let mut fences: Vec<Fence> = fences.into_iter().map(|f| Fence(f as u64)).collect();
    // The lowest go to the batch's claims.
    let extra = fences.split_off((plan.claims as usize).min(fences.len()));
    let mut raw = HashMap::new();
    let pt: Vec<String> = first.get::<_, Option<Vec<String>>>(3).unwrap_or_default();
    let pn: Vec<String> = first.get::<_, Option<Vec<String>>>(4).unwrap_or_default();
    let pg: Vec<Option<String>> = first.get::<_, Option<_>>(5).unwrap_or_default();
    let pm: Vec<Option<i64>> = first.get::<_, Option<_>>(6).unwrap_or_default();
    let pv: Vec<Option<Vec<u8>>> = first.get::<_, Option<_>>(12).unwrap_or_default();
    let pv = pv.into_iter().chain(std::iter::repeat(None));
    for ((((t, p), g), m), v) in pt.into_iter().zip(pn).zip(pg).zip(pm).zip(pv) {
        let state = principal_state(g.clone(), m, v.clone())?;
        raw.insert(
            (t, p),
            PrincipalRow {
                generation: g,
                moved_at: m,
                moves: v,
                state,
            },
        );
    }
    let mut state = HashMap::new();
    let mut read_at = HashMap::new();
    for r in rows {
        let (Some(t), Some(k)) = (r.get::<_, Option<String>>(7), r.get::<_, Option<String>>(8))
        else {
            continue;
        };
        let id = (
            TenantId::new(t).map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?,
            Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?,
        );
        let rec = rows::loaded_record(inner, &id.0, &id.1, r.get(9), r.get(10));
        read_at.insert(id.clone(), r.get(11));
        state.insert(id, rec);
    }
    for id in ids {
        state.entry(id.clone()).or_insert(Ok(None));
    }
    Ok((
        BatchLoad {
            db_now,
            fences: fences.into_iter(),
            state,
            read_at,
            principal_rows: raw,
        },
        Ahead {
            fences: extra,
            read_end,
        },
    ))
}

/// What the core decided for one command of a batch.
// Short-lived, one per command; boxing the record would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Decided {
    /// Answered without applying (refused, run alone, or failed).
    Fate(Fate),
    Applied {
        reply: Reply,
        fence_used: bool,
        /// The record after it, when it changed.
        changed: Option<Option<Record>>,
    },
}

/// Phase 3: the core, applied to the commands in arrival order, each
/// seeing the state the previous ones left. Returns each command's fate
/// and the records that changed.
/// The third: whether every command was applied and changed its record.
fn decide_batch(inner: &Inner, items: &[Item], load: &mut BatchLoad) -> (Vec<Fate>, Vec<Id>, bool) {
    let now = now_from(inner, load.db_now);
    let mut fates = Vec::with_capacity(items.len());
    let mut changed: Vec<Id> = Vec::new();
    let mut all_changed = true;
    let mut next = load.fences.next();
    for it in items {
        match decide_one(inner, it, load, now, next) {
            Decided::Fate(f) => {
                all_changed = false;
                fates.push(f);
            }
            Decided::Applied {
                reply,
                fence_used,
                changed: after,
            } => {
                if fence_used {
                    next = load.fences.next();
                }
                match after {
                    Some(record) => {
                        let id = (it.tenant.clone(), record_key(&it.cmd).clone());
                        load.state.insert(id.clone(), Ok(record));
                        if !changed.contains(&id) {
                            changed.push(id);
                        }
                    }
                    None => all_changed = false,
                }
                fates.push(Fate::Reply(reply));
            }
        }
    }
    (fates, changed, all_changed)
}

/// One command of a batch, with `next` the fence a claim would get.
fn decide_one(
    inner: &Inner,
    it: &Item,
    load: &BatchLoad,
    now: Timestamp,
    next: Option<Fence>,
) -> Decided {
    let id = (it.tenant.clone(), record_key(&it.cmd).clone());
    let current = match load.state.get(&id).expect("loaded") {
        Ok(r) => r.clone(),
        Err(_) => return Decided::Fate(Fate::Reply(Reply::Refused(RefusalCode::RecordRefused))),
    };
    let own = it.cmd.binding_principal().expect("binding");
    if principals_needed(&it.cmd, current.as_ref()).any(|p| p != own) {
        // The owner is another principal, whose lock the batch lacks.
        return Decided::Fate(Fate::Alone);
    }
    let mut ps = Principals::new();
    let g = load
        .principal_rows
        .get(&(it.tenant.as_str().to_string(), own.as_str().to_string()))
        .map(|r| r.state)
        .unwrap_or_default();
    ps.insert(own.clone(), g);
    let mut st = OpState {
        record: current,
        principals: ps,
        warnings: Vec::new(),
    };
    let is_claim = matches!(it.cmd, Command::Claim(_));
    let next_fence = if is_claim {
        next.unwrap_or(Fence(0))
    } else {
        Fence(0)
    };
    if is_claim && let Some(behind) = rows::fence_behind(next_fence, st.record.as_ref()) {
        return Decided::Fate(Fate::Failed(StoreError::Corrupt(behind)));
    }
    let ctx = Ctx {
        now,
        next_fence,
        limits: inner.limits,
    };
    let applied = apply(&mut st, &it.cmd, &ctx);
    if st.principals.dirty().next().is_some() {
        // Raising a generation needs the exclusive lock: on its own.
        return Decided::Fate(Fate::Alone);
    }
    if applied.fence_used && !is_claim {
        return Decided::Fate(Fate::Failed(StoreError::Corrupt(
            "a settlement granted a lease".into(),
        )));
    }
    Decided::Applied {
        reply: applied.reply,
        fence_used: applied.fence_used,
        changed: applied.changed.then_some(st.record),
    }
}

/// Every changed record of a batch as the columns of the one write
/// statement (`sql::batch_write`): `op` is `u`pdate or `d`elete
/// (compare-and-set on the `xmin` in `v`) or `i`nsert.
#[derive(Default)]
struct BatchWrites {
    tenant: Vec<String>,
    key: Vec<String>,
    op: Vec<&'static str>,
    v: Vec<Option<String>>,
    format: Vec<Option<i16>>,
    value: Vec<Option<Vec<u8>>>,
    owner: Vec<Option<String>>,
    status: Vec<Option<i16>>,
    reconcile: Vec<Option<bool>>,
    lease_expires_at: Vec<Option<i64>>,
    lease_generation: Vec<Option<String>>,
    updated_at: Vec<Option<i64>>,
    collect_at: Vec<Option<i64>>,
    receipt_at: Vec<Option<i64>>,
    disputed: Vec<Option<bool>>,
}

impl BatchWrites {
    fn of(changed: &[Id], load: &BatchLoad) -> Result<BatchWrites, PgError> {
        let mut w = BatchWrites::default();
        for id in changed {
            let v = load.read_at.get(id).cloned();
            let after = match load.state.get(id).expect("changed") {
                Ok(r) => r.as_ref(),
                Err(_) => unreachable!("a record that failed to load is never changed"),
            };
            let op = match (&v, after) {
                (Some(_), Some(_)) => "u",
                (None, Some(_)) => "i",
                (Some(_), None) => "d",
                // Created and removed within the batch: nothing to write.
                (None, None) => continue,
            };
            w.tenant.push(id.0.as_str().to_string());
            w.key.push(id.1.as_str().to_string());
            w.op.push(op);
            w.v.push(v);
            match after {
                Some(r) => w.push_record(r)?,
                None => w.push_deletion(),
            }
        }
        Ok(w)
    }

    fn push_record(&mut self, r: &Record) -> Result<(), PgError> {
        let RecordRow {
            format,
            value,
            cols,
        } = RecordRow::of(r)?;
        self.format.push(Some(format));
        self.value.push(Some(value));
        self.owner.push(Some(cols.owner));
        self.status.push(Some(cols.status));
        self.reconcile.push(Some(cols.reconcile));
        self.lease_expires_at.push(cols.lease_expires_at);
        self.lease_generation.push(cols.lease_generation);
        self.updated_at.push(Some(cols.updated_at));
        self.collect_at.push(cols.collect_at);
        self.receipt_at.push(cols.receipt_at);
        self.disputed.push(Some(cols.disputed));
        Ok(())
    }

    fn push_deletion(&mut self) {
        self.format.push(None);
        self.value.push(None);
        self.owner.push(None);
        self.status.push(None);
        self.reconcile.push(None);
        self.lease_expires_at.push(None);
        self.lease_generation.push(None);
        self.updated_at.push(None);
        self.collect_at.push(None);
        self.receipt_at.push(None);
        self.disputed.push(None);
    }
}

/// Phase 4, round trip 2: every changed record and the batch's commit
/// token in one statement, then `COMMIT`, pipelined; then phase 5. On the
/// one-round-trip path (`warm`), `BEGIN`, the settings and the locks go
/// first in the same round trip, and the statement checks what the batch
/// was decided on. Returns the transaction's id as its rows' `xmin` when
/// the COMMIT was answered (`None`: resolved committed in doubt).
async fn write_and_commit_batch(
    inner: &Inner,
    conn: Conn,
    w: &BatchWrites,
    stamps: Stamps,
    seen: Option<&Server>,
    warm: Option<&WarmChecks<'_>>,
) -> Result<Option<String>, PgError> {
    let (sql, c) = (&inner.sql, conn.client());
    let write_st = match (warm, w.op.as_slice()) {
        (None, [op]) => conn.prepare_typed(sql.batch_write_one.of(op), &BATCH_WRITE_TYPES),
        (None, _) => conn.prepare_typed(&sql.batch_write, &BATCH_WRITE_TYPES),
        (Some(_), [op]) => conn.prepare_typed(sql.warm_write_one.of(op), &WARM_WRITE_TYPES),
        (Some(_), _) => conn.prepare_typed(&sql.warm_write, &WARM_WRITE_TYPES),
    }
    .await?;
    let expected = w.tenant.len() as i64;
    let insert_deadline = stamps.insert_from + INSERT_WINDOW_MS;
    // The batch's commit token, written by the same statement as the rows:
    // after a lost COMMIT answer its presence (never the transaction id)
    // says whether the batch committed.
    let token = Token::new(stamps.token_at);
    let token_bytes: &[u8] = &token.bytes;
    let mut write_params: Vec<&(dyn ToSql + Sync)> = vec![
        &w.tenant,
        &w.key,
        &w.op,
        &w.v,
        &w.format,
        &w.value,
        &w.owner,
        &w.status,
        &w.reconcile,
        &w.lease_expires_at,
        &w.lease_generation,
        &w.updated_at,
        &w.collect_at,
        &w.receipt_at,
        &w.disputed,
        &insert_deadline,
        &expected,
        &token.at,
        &token_bytes,
    ];
    let r = match warm {
        None => {
            conn.within(async {
                futures::join!(
                    c.query_one(&write_st, &write_params),
                    c.batch_execute(sql.commit)
                )
            })
            .await
        }
        Some(k) => {
            write_params.extend([
                &k.plan.pr_t as &(dyn ToSql + Sync),
                &k.plan.pr_n,
                &k.generation,
                &k.moved_at,
                &k.moves,
                &k.db_ms,
                &k.fences_last,
            ]);
            let settings_st = conn.prepare(&sql.settings).await?;
            let lock_st = conn.prepare(&sql.lock_principals).await?;
            let shared = vec![false; k.plan.lock_keys.len()];
            let no_params: [&(dyn ToSql + Sync); 0] = [];
            let lock_params: [&(dyn ToSql + Sync); 2] = [&k.plan.lock_keys, &shared];
            conn.within(async {
                let (b, st, l, wr, cm) = futures::join!(
                    c.batch_execute(sql.batch_begin),
                    c.execute(&settings_st, &no_params),
                    c.execute(&lock_st, &lock_params),
                    c.query_one(&write_st, &write_params),
                    c.batch_execute(sql.commit)
                );
                // The first failure is the cause (the statements after it
                // fail as "transaction aborted"; the COMMIT rolls back).
                let first = b.and(st).and(l).map(|_| ());
                (first.and(wr), cm)
            })
            .await
        }
    };
    resolve_batch_commit(inner, conn, r, &token, seen, expected).await
}

/// What the batch's commit round trip returns: the write's row (rows and
/// token in one statement), and COMMIT's answer.
type BatchCommitRound = (
    Result<tokio_postgres::Row, tokio_postgres::Error>,
    Result<(), tokio_postgres::Error>,
);

/// Phase 5: what the commit round trip says. A lost answer is resolved by
/// the token (`doubt.rs`); an answered COMMIT after a failed write was a
/// rollback (a row changed under the batch: `Raced`).
async fn resolve_batch_commit(
    inner: &Inner,
    conn: Conn,
    r: Result<BatchCommitRound, PgError>,
    token: &Token,
    seen: Option<&Server>,
    expected: i64,
) -> Result<Option<String>, PgError> {
    match doubt::finish(inner, conn, r, token, seen).await? {
        Commit::Answered(write_result) => match write_result {
            Ok(row) if row.get::<_, i64>(0) == expected => Ok(Some(row.get(1))),
            Ok(row) => Err(PgError::Corrupt(format!(
                "a batch write reported {} rows, expected {expected}",
                row.get::<_, i64>(0)
            ))),
            // The COMMIT was a rollback: nothing happened.
            Err(e) if stale(&e) => Err(PgError::Raced(e.to_string())),
            Err(e) => Err(e.into()),
        },
        Commit::Committed => Ok(None),
        Commit::NotCommitted(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! The write statements (`batch_write`, and `batch_write_one`'s one
    //! per operation) against a real schema: they must make exactly the
    //! same checks, since which one runs depends only on the batch's size
    //! and its one operation.
    use super::*;
    use crate::{PgOptions, PgStore};
    use settle_core::ClaimDecision;
    use settle_ledger::Store as _;

    fn url() -> String {
        std::env::var("SETTLE_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
    }

    /// What a one-round-trip write checks besides the batch write's
    /// (`sql::warm_check`): the principal rows as known (tenant, name,
    /// generation, moved_at, moves), the clock estimate (`None`: the
    /// database clock read just before) and the fence block's last fence.
    #[derive(Default)]
    struct Warm {
        principals: Vec<(
            &'static str,
            &'static str,
            Option<&'static str>,
            Option<i64>,
        )>,
        est: Option<i64>,
        fences_last: Option<i64>,
    }

    /// One row's write as the statements take it (arrays of one), with a
    /// fresh commit token; with `warm`, a one-round-trip statement.
    async fn write_with(
        c: &tokio_postgres::Client,
        sql: &str,
        key: &str,
        op: &str,
        v: Option<&str>,
        deadline: i64,
        warm: Option<&Warm>,
    ) -> Result<i64, tokio_postgres::Error> {
        let st = match warm {
            Some(_) => c.prepare_typed(sql, &WARM_WRITE_TYPES).await?,
            None => c.prepare_typed(sql, &BATCH_WRITE_TYPES).await?,
        };
        let token = Token::new(1);
        let token_bytes: &[u8] = &token.bytes;
        let (t, k, o) = (vec!["acme"], vec![key], vec![op]);
        let v: Vec<Option<&str>> = vec![v];
        let (f, val): (Vec<Option<i16>>, Vec<Option<Vec<u8>>>) = if op == "d" {
            (vec![None], vec![None])
        } else {
            (vec![Some(2)], vec![Some(vec![1, 2, 3])])
        };
        let owner: Vec<Option<&str>> = vec![Some("p")];
        let status: Vec<Option<i16>> = vec![Some(0)];
        let b: Vec<Option<bool>> = vec![Some(false)];
        let n: Vec<Option<i64>> = vec![Some(5)];
        let g: Vec<Option<&str>> = vec![Some("0")];
        let none: Vec<Option<i64>> = vec![None];
        let expected = 1i64;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &t,
            &k,
            &o,
            &v,
            &f,
            &val,
            &owner,
            &status,
            &b,
            &n,
            &g,
            &n,
            &none,
            &none,
            &b,
            &deadline,
            &expected,
            &token.at,
            &token_bytes,
        ];
        let ps: &[_] = warm.map_or(&[], |w| &w.principals[..]);
        let pt: Vec<&str> = ps.iter().map(|p| p.0).collect();
        let pn: Vec<&str> = ps.iter().map(|p| p.1).collect();
        let pg: Vec<Option<&str>> = ps.iter().map(|p| p.2).collect();
        let pm: Vec<Option<i64>> = ps.iter().map(|p| p.3).collect();
        let pv: Vec<Option<Vec<u8>>> = ps.iter().map(|_| None).collect();
        let est: i64 = match warm {
            Some(Warm { est: Some(e), .. }) => *e,
            _ => c
                .query_one(&format!("SELECT {}", crate::sql::NOW_MS), &[])
                .await?
                .get(0),
        };
        let last = warm.and_then(|w| w.fences_last);
        if warm.is_some() {
            params.extend([&pt as &(dyn ToSql + Sync), &pn, &pg, &pm, &pv, &est, &last]);
        }
        Ok(c.query_one(&st, &params).await?.get(0))
    }

    async fn write(
        c: &tokio_postgres::Client,
        sql: &str,
        key: &str,
        op: &str,
        v: Option<&str>,
        deadline: i64,
    ) -> Result<i64, tokio_postgres::Error> {
        write_with(c, sql, key, op, v, deadline, None).await
    }

    async fn xmin(c: &tokio_postgres::Client, schema: &str, key: &str) -> Option<String> {
        c.query_opt(
            &format!("SELECT xmin::text FROM \"{schema}\".settle_records WHERE key = $1"),
            &[&key],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
    }

    /// Drops the test's schema, also when the test fails.
    struct DropSchema(String);

    impl Drop for DropSchema {
        fn drop(&mut self) {
            let schema = self.0.clone();
            // Drop runs inside the test's runtime: clean up from a thread.
            let dropped = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let (c, task) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await?;
                    tokio::spawn(task);
                    c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .await
                })
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("could not drop test schema {}", self.0);
            }
        }
    }

    fn is_stale(r: Result<i64, tokio_postgres::Error>) -> bool {
        r.as_ref().is_err_and(stale)
    }

    /// A fresh store in its own schema, dropped at the end of the test.
    async fn scratch(tag: &str) -> (PgStore, DropSchema) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!("t_{tag}_{}_{nanos}", std::process::id());
        let drop = DropSchema(schema.clone());
        let store = PgStore::connect(
            &url(),
            PgOptions {
                schema,
                ..PgOptions::default()
            },
        )
        .await
        .expect("a PostgreSQL server (SETTLE_TEST_PG_URL)");
        (store, drop)
    }

    /// A batch with a command on this key panics (see `run`).
    pub(super) const PANIC_KEY: &str = "test-this-batch-panics";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_that_panics_fails_its_callers_and_group_commit_goes_on() {
        use settle_core::testkit::{binding, claim};
        let (store, _guard) = scratch("gcp").await;
        let tenant = TenantId::new("acme").unwrap();
        let r = store
            .execute(&tenant, claim(PANIC_KEY, 1, binding("alice", 0)))
            .await;
        assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
        // The worker survived: a later claim is granted (a dead worker
        // would leave it waiting forever, hence the deadline).
        for i in 0..3 {
            let cmd = claim(&format!("after-{i}"), 1, binding("alice", 0));
            let r = tokio::time::timeout(Duration::from_secs(20), store.execute(&tenant, cmd))
                .await
                .expect("group commit stopped after a panic");
            assert!(
                matches!(r, Ok(Reply::Claim(ClaimDecision::Execute(_)))),
                "{r:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_load_statements_read_the_same_things() {
        let (store, guard) = scratch("gcl").await;
        let schema = guard.0.clone();
        let sql = &store.inner.sql;
        let conn = store.inner.pool.get().await.unwrap();
        let c: &tokio_postgres::Client = &conn;
        c.batch_execute(&format!(
            "INSERT INTO \"{schema}\".settle_principals VALUES ('acme', 'alice', 3, 5, '\\x0102'); \
             INSERT INTO \"{schema}\".settle_records (tenant, key, format, value) \
               VALUES ('acme', 'k', 2, '\\x010203'), ('acme', 'other', 2, '\\x04')"
        ))
        .await
        .unwrap();
        let many = c.prepare(&sql.batch_load).await.unwrap();
        let one = c.prepare(&sql.batch_load_one).await.unwrap();
        // Everything but the clock and the fences' values (each read takes new ones).
        let read =
            async |st: &tokio_postgres::Statement, key: &str, principal: &str, fences: i32| {
                let (t, k, p) = (vec!["acme"], vec![key], vec![principal]);
                let params: [&(dyn ToSql + Sync); 5] = [&t, &k, &fences, &t, &p];
                let rows = c.query(st, &params).await.unwrap();
                rows.iter()
                    .map(|r| {
                        let fences: Vec<i64> = r.get(2);
                        format!(
                            "{:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                            r.get::<_, String>(1),
                            fences.len(),
                            r.get::<_, Option<Vec<String>>>(3),
                            r.get::<_, Option<Vec<String>>>(4),
                            r.get::<_, Option<Vec<Option<String>>>>(5),
                            r.get::<_, Option<Vec<Option<i64>>>>(6),
                            r.get::<_, Option<String>>(7),
                            r.get::<_, Option<String>>(8),
                            r.get::<_, Option<i16>>(9),
                            r.get::<_, Option<Vec<u8>>>(10),
                            r.get::<_, Option<String>>(11),
                            r.get::<_, Option<Vec<Option<Vec<u8>>>>>(12),
                        )
                    })
                    .collect::<Vec<_>>()
            };
        for (key, principal, fences) in [
            ("k", "alice", 1),
            ("k", "bob", 0),
            ("absent", "alice", 2),
            ("absent", "bob", 1),
        ] {
            let a = read(&many, key, principal, fences).await;
            let b = read(&one, key, principal, fences).await;
            assert_eq!(a.len(), 1, "{key} {principal}: one row");
            assert_eq!(a, b, "{key} {principal}");
            // The rows say what is there (so that equal means something).
            assert_eq!(a[0].contains("\"alice\""), principal == "alice", "{}", a[0]);
            assert_eq!(a[0].contains("[1, 2, 3]"), key == "k", "{}", a[0]);
            assert!(!a[0].contains("[4]"), "{}", a[0]);
        }
        drop(conn);
        store.close();
    }

    /// Each check the one-round-trip write makes beyond the batch write's
    /// (`sql::warm_check`), one at a time: a write decided on anything
    /// but what is there now writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_one_round_trip_write_checks_what_it_was_decided_on() {
        let (store, guard) = scratch("gcwarm").await;
        let schema = guard.0.clone();
        let sql = &store.inner.sql;
        let conn = store.inner.pool.get().await.unwrap();
        let c: &tokio_postgres::Client = &conn;
        let now: i64 = c.query_one(sql.now.as_str(), &[]).await.unwrap().get(0);
        let open = now + 60_000;
        let insert = sql.warm_write_one.of("i");
        let mut n = 0;
        let mut attempt = |w: Warm| {
            n += 1;
            let key = format!("k{n}");
            async move {
                let r = write_with(c, insert, &key, "i", None, open, Some(&w)).await;
                (r, key)
            }
        };
        let written = |r: Result<i64, tokio_postgres::Error>| matches!(r, Ok(1));
        // Nothing to check: written.
        assert!(written(attempt(Warm::default()).await.0));
        // The clock estimate ahead of the clock, or too far behind it.
        let ahead = Warm {
            est: Some(now + 60_000),
            ..Warm::default()
        };
        assert!(is_stale(attempt(ahead).await.0));
        let behind = Warm {
            est: Some(now - 60_000),
            ..Warm::default()
        };
        assert!(is_stale(attempt(behind).await.0));
        // A principal as known: no row, or its row as it is.
        let absent = Warm {
            principals: vec![("acme", "alice", None, None)],
            ..Warm::default()
        };
        assert!(written(attempt(absent).await.0));
        c.batch_execute(&format!(
            "INSERT INTO \"{schema}\".settle_principals (tenant, principal, generation, moved_at) \
             VALUES ('acme', 'alice', 2, 5)"
        ))
        .await
        .unwrap();
        let stale_absent = Warm {
            principals: vec![("acme", "alice", None, None)],
            ..Warm::default()
        };
        assert!(is_stale(attempt(stale_absent).await.0));
        let stale_generation = Warm {
            principals: vec![("acme", "alice", Some("1"), Some(5))],
            ..Warm::default()
        };
        assert!(is_stale(attempt(stale_generation).await.0));
        let stale_moved = Warm {
            principals: vec![("acme", "alice", Some("2"), Some(4))],
            ..Warm::default()
        };
        assert!(is_stale(attempt(stale_moved).await.0));
        let current = Warm {
            principals: vec![("acme", "alice", Some("2"), Some(5))],
            ..Warm::default()
        };
        assert!(written(attempt(current).await.0));
        // Fences: the block must end at the sequence's last value.
        let last: i64 = c
            .query_one(&format!("SELECT nextval('\"{schema}\".settle_fence')"), &[])
            .await
            .unwrap()
            .get(0);
        let drawn_since = Warm {
            fences_last: Some(last - 1),
            ..Warm::default()
        };
        assert!(is_stale(attempt(drawn_since).await.0));
        let block = Warm {
            fences_last: Some(last),
            ..Warm::default()
        };
        assert!(written(attempt(block).await.0));
        // Not durable: refused (the pipelined settings make it so on the
        // path itself; here the session's own setting stands).
        c.batch_execute("SET synchronous_commit = off")
            .await
            .unwrap();
        let (r, key) = attempt(Warm::default()).await;
        assert!(is_stale(r));
        assert_eq!(xmin(c, &schema, &key).await, None);
        c.batch_execute("RESET synchronous_commit").await.unwrap();
        drop(conn);
        store.close();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_write_statements_check_the_same_things() {
        let (store, guard) = scratch("gcw").await;
        let schema = guard.0.clone();
        let sql = &store.inner.sql;
        let conn = store.inner.pool.get().await.unwrap();
        let c: &tokio_postgres::Client = &conn;
        let now: i64 = c.query_one(sql.now.as_str(), &[]).await.unwrap().get(0);
        let open = now + 60_000;
        // The statement a batch of many (or of one) runs for `op`, on the
        // two-round-trip path or (`warm`) the one-round-trip path.
        fn statement<'a>(sql: &'a crate::sql::Sql, many: bool, warm: bool, op: &str) -> &'a str {
            match (many, warm) {
                (true, false) => &sql.batch_write,
                (false, false) => sql.batch_write_one.of(op),
                (true, true) => &sql.warm_write,
                (false, true) => sql.warm_write_one.of(op),
            }
        }
        let one = |op| statement(sql, false, false, op);
        // The one-round-trip statements with nothing more to check (no
        // principal, the clock as it is, no fence) check what the others do.
        let neutral = Warm::default();
        for (name, many, warm) in [
            ("many", true, None),
            ("one", false, None),
            ("warm-many", true, Some(&neutral)),
            ("warm-one", false, Some(&neutral)),
        ] {
            let text = |op| statement(sql, many, warm.is_some(), op);
            let key = format!("k-{name}");
            // A new record: written, with its commit token.
            assert_eq!(
                write_with(c, text("i"), &key, "i", None, open, warm)
                    .await
                    .unwrap(),
                1,
                "{name}"
            );
            let v1 = xmin(c, &schema, &key).await.expect("inserted");
            // The key is taken: nothing written.
            assert!(
                is_stale(write_with(c, text("i"), &key, "i", None, open, warm).await),
                "{name}"
            );
            // Past the insert window: nothing written.
            let late = format!("late-{name}");
            assert!(
                is_stale(write_with(c, text("i"), &late, "i", None, now - 1, warm).await),
                "{name}"
            );
            assert_eq!(xmin(c, &schema, &late).await, None, "{name}");
            // Compare-and-set: a stale xmin writes nothing, the current one writes.
            assert!(
                is_stale(write_with(c, text("u"), &key, "u", Some("1"), open, warm).await),
                "{name}"
            );
            assert_eq!(xmin(c, &schema, &key).await.as_ref(), Some(&v1), "{name}");
            assert_eq!(
                write_with(c, text("u"), &key, "u", Some(&v1), open, warm)
                    .await
                    .unwrap(),
                1,
                "{name}"
            );
            let v2 = xmin(c, &schema, &key).await.expect("updated");
            assert_ne!(v1, v2, "{name}");
            assert!(
                is_stale(write_with(c, text("d"), &key, "d", Some(&v1), open, warm).await),
                "{name}"
            );
            assert_eq!(
                write_with(c, text("d"), &key, "d", Some(&v2), open, warm)
                    .await
                    .unwrap(),
                1,
                "{name}"
            );
            assert_eq!(xmin(c, &schema, &key).await, None, "{name}");
        }
        // A one-record statement run with another operation writes nothing.
        let key = "k-wrong-op".to_string();
        assert_eq!(write(c, one("i"), &key, "i", None, open).await.unwrap(), 1);
        let v = xmin(c, &schema, &key).await.expect("inserted");
        for (stmt, op) in [("u", "i"), ("u", "d"), ("d", "u"), ("i", "u")] {
            assert!(
                is_stale(write(c, one(stmt), &key, op, Some(&v), open).await),
                "the {stmt} statement with op {op}"
            );
            assert_eq!(xmin(c, &schema, &key).await.as_ref(), Some(&v));
        }
        // Every write that succeeded left its token, and only those: 4 × 3 + 1.
        let tokens: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM \"{schema}\".settle_commits"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(tokens, 13);
        drop(conn);
        store.close();
    }
}
