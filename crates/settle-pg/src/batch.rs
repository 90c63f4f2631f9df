//! Group commit for claims and settlements.
//!
//! Concurrent claims and settlements are gathered by a few workers; each
//! worker runs what it gathered as ONE transaction and answers every
//! command only after that transaction's COMMIT. Each command is still
//! atomic and durable; what is shared is the cost of the round trips and of
//! the WAL flush. Two round trips per batch:
//!
//! 1. `BEGIN` and the binding principals' advisory locks (shared, in key
//!    order), then one statement that reads the records, the principal
//!    rows, the database clock and the fences — after the locks, so its
//!    snapshot holds every committed generation.
//! 2. One statement writing every changed record — updates and deletes only
//!    if the row's `xmin` is still the one read (compare-and-set), inserts
//!    only if the key is still free and within 500 ms of the read — then
//!    `COMMIT`. If any row fails its check the statement fails, the COMMIT
//!    is a rollback, and the batch's commands run again one by one on the
//!    locking path (`engine::execute`), which always makes progress.
//!
//! The core is applied to the commands in arrival order, each seeing the
//! state the previous ones left. Commands that need more than the batch's
//! locks (a principal other than their binding's, or a generation to raise)
//! are taken out unapplied and run afterwards on the locking path. They
//! were concurrent with the batch, so either order is linearizable.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settle_core::{
    Command, Ctx, Fence, Key, OpState, Principal, PrincipalState, Principals, Record, RefusalCode,
    Reply, TenantId, apply, principals_needed,
};
use settle_ledger::StoreError;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::codec::{self, FORMAT, RecordColumns, principal_state};
use crate::doubt::{self, Commit};
use crate::engine::{self, Conn, Inner, check_durability, now_from, transient};
use crate::lock::principal_key;
use crate::session::Token;
use crate::sql::STALE;

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
            max_batch: max_batch.max(1),
            workers: workers.max(1),
            last_batch_us,
        }
    }

    pub async fn submit(&self, tenant: TenantId, cmd: Command) -> Result<Reply, StoreError> {
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
        let batch_inner = inner.clone();
        let started = Instant::now();
        if let Err(e) = tokio::spawn(async move { run(&batch_inner, items).await }).await {
            tracing::error!(error = %e, "a group-commit batch panicked; its callers get an error");
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
    let mut retries = 0;
    let fates = loop {
        match attempt(inner, &items).await {
            Ok(f) => break f,
            // A row changed under the batch (contention on a key with another
            // batch or server): the locking path serialises such commands.
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
                    let r = engine::execute(&inner, &item.tenant, &item.cmd)
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

async fn attempt(inner: &Inner, items: &[Item]) -> Result<Vec<Fate>, PgError> {
    let sql = &inner.sql;
    let conn = Conn::get(&inner.pool, inner.client_timeout).await?;
    let c = conn.client();
    let seen = inner.seen.get();

    // What to lock (the binding principals, shared) and what to read.
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
        let id = (it.tenant.clone(), record_key(&it.cmd).clone());
        if matches!(it.cmd, Command::Claim(_)) {
            claims += 1;
        }
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    let mut lock_keys: Vec<i64> = principals
        .iter()
        .map(|(t, p)| principal_key(&inner.schema, t.as_str(), p.as_str()))
        .collect();
    lock_keys.sort();
    lock_keys.dedup();
    let split = |v: &[Id]| -> (Vec<String>, Vec<String>) {
        v.iter()
            .map(|(t, k)| (t.as_str().to_string(), k.as_str().to_string()))
            .unzip()
    };
    let (id_t, id_k) = split(&ids);
    let (pr_t, pr_n): (Vec<String>, Vec<String>) = principals
        .iter()
        .map(|(t, p)| (t.as_str().to_string(), p.as_str().to_string()))
        .unzip();

    let load_st = conn.prepare(&sql.batch_load).await?;
    let write_st = conn.prepare(&sql.batch_write).await?;
    let token_st = conn.prepare(&sql.insert_token).await?;

    // Round trip 1: BEGIN and the principal locks (one simple-query
    // message; the statements run in order, so the locks are taken in key
    // order), then one statement reading everything else. It starts after
    // the locks are held, so its snapshot has every committed generation.
    let mut begin = sql.begin.clone();
    for k in &lock_keys {
        begin.push_str(&format!("; SELECT pg_advisory_xact_lock_shared({k})"));
    }
    let load_params: [&(dyn ToSql + Sync); 5] = [&id_t, &id_k, &claims, &pr_t, &pr_n];
    // Past the deadline nothing has committed: the connection is dropped.
    let (r_begin, r_load) = conn
        .within(async { futures::join!(c.batch_execute(&begin), c.query(&load_st, &load_params)) })
        .await?;
    let rows = match r_begin.and(r_load) {
        Ok(rows) => rows,
        Err(e) => {
            if e.as_db_error().is_some() {
                conn.rollback(sql).await;
            }
            return Err(e.into());
        }
    };
    let first = rows
        .first()
        .ok_or_else(|| PgError::Corrupt("the load returned no row".into()))?;
    let db_now: i64 = first.get(0);
    let now = now_from(inner, db_now);
    let durability: String = first.get(1);
    if let Err(e) = check_durability(&durability) {
        conn.rollback(sql).await;
        return Err(e);
    }
    let mut fences: Vec<i64> = first.get(2);
    fences.sort_unstable();
    let mut fences = fences.into_iter().map(|f| Fence(f as u64));
    let mut gens: HashMap<(String, String), PrincipalState> = HashMap::new();
    let pt: Vec<String> = first.get::<_, Option<Vec<String>>>(3).unwrap_or_default();
    let pn: Vec<String> = first.get::<_, Option<Vec<String>>>(4).unwrap_or_default();
    let pg: Vec<Option<String>> = first.get::<_, Option<_>>(5).unwrap_or_default();
    let pm: Vec<Option<i64>> = first.get::<_, Option<_>>(6).unwrap_or_default();
    let pv: Vec<Option<Vec<u8>>> = first.get::<_, Option<_>>(12).unwrap_or_default();
    let pv = pv.into_iter().chain(std::iter::repeat(None));
    for ((((t, p), g), m), v) in pt.into_iter().zip(pn).zip(pg).zip(pm).zip(pv) {
        gens.insert((t, p), principal_state(g, m, v)?);
    }

    // Current state of each record, with the xmin it was read at; a record
    // that does not decode refuses its own commands only (record_refused).
    let mut state: HashMap<Id, Result<Option<Record>, PgError>> = HashMap::new();
    let mut read_at: HashMap<Id, String> = HashMap::new();
    for r in &rows {
        let (Some(t), Some(k)) = (r.get::<_, Option<String>>(7), r.get::<_, Option<String>>(8))
        else {
            continue;
        };
        let id = (
            TenantId::new(t).map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?,
            Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?,
        );
        let rec = codec::decode_record(r.get(9), r.get::<_, Option<&[u8]>>(10));
        if let Err(e) = &rec {
            inner.refuse_undecodable(&id.0, &id.1, e);
        }
        read_at.insert(id.clone(), r.get(11));
        state.insert(id, rec);
    }
    for id in &ids {
        state.entry(id.clone()).or_insert(Ok(None));
    }

    let mut fates = Vec::with_capacity(items.len());
    let mut changed: Vec<Id> = Vec::new();
    let mut next = fences.next();
    for it in items {
        let id = (it.tenant.clone(), record_key(&it.cmd).clone());
        let current = match state.get(&id).expect("loaded") {
            Ok(r) => r.clone(),
            Err(_) => {
                fates.push(Fate::Reply(Reply::Refused(RefusalCode::RecordRefused)));
                continue;
            }
        };
        let own = it.cmd.binding_principal().expect("binding");
        if principals_needed(&it.cmd, current.as_ref()).any(|p| p != own) {
            // The owner is another principal, whose lock the batch lacks.
            fates.push(Fate::Alone);
            continue;
        }
        let mut ps = Principals::new();
        let g = gens
            .get(&(it.tenant.as_str().to_string(), own.as_str().to_string()))
            .copied()
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
        if is_claim
            && let Some(last) = st.record.as_ref().and_then(|r| r.last_fence())
            && next_fence <= last
        {
            fates.push(Fate::Failed(StoreError::Corrupt(format!(
                "fence sequence at {} is not above the record's fence {}",
                next_fence.0, last.0
            ))));
            continue;
        }
        let ctx = Ctx {
            now,
            next_fence,
            limits: inner.limits,
        };
        let applied = apply(&mut st, &it.cmd, &ctx);
        if st.principals.dirty().next().is_some() {
            // Raising a generation needs the exclusive lock: on its own.
            fates.push(Fate::Alone);
            continue;
        }
        if applied.fence_used {
            if !is_claim {
                fates.push(Fate::Failed(StoreError::Corrupt(
                    "a settlement granted a lease".into(),
                )));
                continue;
            }
            next = fences.next();
        }
        if applied.changed {
            state.insert(id.clone(), Ok(st.record));
            if !changed.contains(&id) {
                changed.push(id);
            }
        }
        fates.push(Fate::Reply(applied.reply));
    }

    if changed.is_empty() {
        conn.rollback(sql).await;
        return Ok(fates);
    }

    // Round trip 2: every changed record in one statement, then COMMIT.
    let mut w_t = Vec::new();
    let mut w_k = Vec::new();
    let mut w_op: Vec<&str> = Vec::new();
    let mut w_v: Vec<Option<String>> = Vec::new();
    let mut w_fmt: Vec<Option<i16>> = Vec::new();
    let mut w_val: Vec<Option<Vec<u8>>> = Vec::new();
    let mut w_owner: Vec<Option<String>> = Vec::new();
    let mut w_status: Vec<Option<i16>> = Vec::new();
    let mut w_rec: Vec<Option<bool>> = Vec::new();
    let mut w_lease: Vec<Option<i64>> = Vec::new();
    let mut w_lgen: Vec<Option<String>> = Vec::new();
    let mut w_upd: Vec<Option<i64>> = Vec::new();
    let mut w_coll: Vec<Option<i64>> = Vec::new();
    let mut w_rcpt: Vec<Option<i64>> = Vec::new();
    let mut w_disp: Vec<Option<bool>> = Vec::new();
    for id in &changed {
        let v = read_at.get(id).cloned();
        let after = match state.get(id).expect("changed") {
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
        w_t.push(id.0.as_str().to_string());
        w_k.push(id.1.as_str().to_string());
        w_op.push(op);
        w_v.push(v);
        match after {
            Some(r) => {
                let cols = RecordColumns::of(r);
                w_fmt.push(Some(FORMAT));
                w_val.push(Some(codec::encode(r)?));
                w_owner.push(Some(cols.owner));
                w_status.push(Some(cols.status));
                w_rec.push(Some(cols.reconcile));
                w_lease.push(cols.lease_expires_at);
                w_lgen.push(cols.lease_generation);
                w_upd.push(Some(cols.updated_at));
                w_coll.push(cols.collect_at);
                w_rcpt.push(cols.receipt_at);
                w_disp.push(Some(cols.disputed));
            }
            None => {
                w_fmt.push(None);
                w_val.push(None);
                w_owner.push(None);
                w_status.push(None);
                w_rec.push(None);
                w_lease.push(None);
                w_lgen.push(None);
                w_upd.push(None);
                w_coll.push(None);
                w_rcpt.push(None);
                w_disp.push(None);
            }
        }
    }
    if w_t.is_empty() {
        conn.rollback(sql).await;
        return Ok(fates);
    }
    let expected = w_t.len() as i64;
    let insert_deadline = db_now + INSERT_WINDOW_MS;
    let write_params: [&(dyn ToSql + Sync); 17] = [
        &w_t,
        &w_k,
        &w_op,
        &w_v,
        &w_fmt,
        &w_val,
        &w_owner,
        &w_status,
        &w_rec,
        &w_lease,
        &w_lgen,
        &w_upd,
        &w_coll,
        &w_rcpt,
        &w_disp,
        &insert_deadline,
        &expected,
    ];
    // The batch's commit token: after a lost COMMIT answer its presence
    // (never the transaction id) says whether the batch committed.
    let token = Token::new(db_now);
    let token_bytes: &[u8] = &token.bytes;
    let token_params: [&(dyn ToSql + Sync); 2] = [&token.at, &token_bytes];
    let r = conn
        .within(async {
            let (write, mark, commit) = futures::join!(
                c.query_one(&write_st, &write_params),
                c.execute(&token_st, &token_params),
                c.batch_execute(sql.commit)
            );
            ((write, mark), commit)
        })
        .await;
    match doubt::finish(inner, conn, r, &token, seen.as_ref()).await? {
        Commit::Answered((write_result, mark_result)) => {
            match write_result {
                Ok(row) if row.get::<_, i64>(0) == expected => {}
                Ok(row) => {
                    return Err(PgError::Corrupt(format!(
                        "a batch write reported {} rows, expected {expected}",
                        row.get::<_, i64>(0)
                    )));
                }
                // The COMMIT was a rollback: nothing happened.
                Err(e) if stale(&e) => return Err(PgError::Raced(e.to_string())),
                Err(e) => return Err(e.into()),
            }
            match mark_result {
                Ok(1) => Ok(fates),
                Ok(n) => Err(PgError::Corrupt(format!(
                    "the commit token write touched {n} rows, expected 1"
                ))),
                Err(e) => Err(e.into()),
            }
        }
        Commit::Committed => Ok(fates),
        Commit::NotCommitted(e) => Err(e),
    }
}
