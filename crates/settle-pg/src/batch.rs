//! Group commit for claims and settlements.
//!
//! Concurrent claims and settlements are gathered by a few workers; each
//! worker runs what it gathered as ONE transaction with the same steps as a
//! single command (principal locks, row locks in key order, clock and
//! fences read after the locks, the core applied to each command in arrival
//! order, the writes, COMMIT) and answers every command only after that
//! COMMIT. Each command is still atomic and durable; what is shared is the
//! cost of the round trips and of the WAL flush.
//!
//! Commands that need more than the batch's locks (a principal other than
//! their binding's, or a generation to raise) are taken out of the batch
//! unapplied and run afterwards on their own (`engine::execute`). They
//! were concurrent with the batch, so either order is linearizable.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use settle_core::{
    Command, Ctx, Fence, Key, OpState, Principal, PrincipalState, Principals, Record, Reply,
    TenantId, apply, principals_needed,
};
use settle_ledger::StoreError;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::codec::{self, FORMAT_POSTCARD_V1, RecordColumns};
use crate::engine::{
    self, Conn, Inner, Pending, now_from, principal_state, resolve_in_doubt, transient,
};
use crate::lock::principal_key;

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

/// The queue in front of the workers. Dropping it stops them once the
/// queue is drained.
pub struct Batcher {
    tx: mpsc::UnboundedSender<Item>,
}

impl Batcher {
    pub fn start(inner: Arc<Inner>, workers: usize, max_batch: usize) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers.max(1) {
            tokio::spawn(worker(inner.clone(), rx.clone(), max_batch.max(1)));
        }
        Batcher { tx }
    }

    pub async fn submit(&self, tenant: TenantId, cmd: Command) -> Result<Reply, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Item { tenant, cmd, reply })
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

async fn worker(inner: Arc<Inner>, rx: Arc<Mutex<mpsc::UnboundedReceiver<Item>>>, max: usize) {
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
            // that are ready run and queue theirs before taking the batch.
            tokio::task::yield_now().await;
            while items.len() < max {
                match rx.try_recv() {
                    Ok(i) => items.push(i),
                    Err(_) => break,
                }
            }
        }
        run(&inner, items).await;
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
    let conn = Conn::get(&inner.pool).await?;
    let c = conn.client();

    // The locks: binding principals (shared), then the records in key order.
    let mut principals: Vec<(TenantId, Principal)> = Vec::new();
    let mut ids: Vec<Id> = Vec::new();
    let mut new_ids: Vec<Id> = Vec::new();
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
            new_ids.push(id.clone());
        }
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    new_ids.sort();
    new_ids.dedup();
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
    let (new_t, new_k) = split(&new_ids);
    let (pr_t, pr_n): (Vec<String>, Vec<String>) = principals
        .iter()
        .map(|(t, p)| (t.as_str().to_string(), p.as_str().to_string()))
        .unzip();

    let load_st = conn.prepare(&sql.batch_load).await?;
    let upd_st = conn.prepare(&sql.batch_update_records).await?;
    let del_st = conn.prepare(&sql.batch_delete_records).await?;

    // Round trip 1: BEGIN and the principal locks (one simple-query
    // message; the statements run in order, so the locks are taken in key
    // order), then one statement for everything else.
    let mut begin = String::from(sql.begin);
    for k in &lock_keys {
        begin.push_str(&format!("; SELECT pg_advisory_xact_lock_shared({k})"));
    }
    let load_params: [&(dyn ToSql + Sync); 7] =
        [&new_t, &new_k, &id_t, &id_k, &claims, &pr_t, &pr_n];
    let (r_begin, r_load) =
        futures::join!(c.batch_execute(&begin), c.query_one(&load_st, &load_params));
    let row = match r_begin.and(r_load) {
        Ok(row) => row,
        Err(e) => {
            if e.as_db_error().is_some() {
                conn.rollback(sql).await;
            }
            return Err(e.into());
        }
    };

    let now = now_from(inner, row.get(6));
    let xid: i64 = row.get(7);
    let mut fences: Vec<i64> = row.get(8);
    fences.sort_unstable();
    let mut fences = fences.into_iter().map(|f| Fence(f as u64));
    let mut gens: HashMap<(String, String), PrincipalState> = HashMap::new();
    let pt: Vec<String> = row.get::<_, Option<Vec<String>>>(9).unwrap_or_default();
    let pn: Vec<String> = row.get::<_, Option<Vec<String>>>(10).unwrap_or_default();
    let pg: Vec<Option<String>> = row.get::<_, Option<_>>(11).unwrap_or_default();
    let pm: Vec<Option<i64>> = row.get::<_, Option<_>>(12).unwrap_or_default();
    for (((t, p), g), m) in pt.into_iter().zip(pn).zip(pg).zip(pm) {
        gens.insert((t, p), principal_state(g, m)?);
    }

    // Current state of each record; a record that does not decode fails
    // its own commands only.
    let parse_id = |t: String, k: String| -> Result<Id, PgError> {
        Ok((
            TenantId::new(t).map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?,
            Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?,
        ))
    };
    let mut state: HashMap<Id, Result<Option<Record>, StoreError>> = HashMap::new();
    let lt: Vec<String> = row.get::<_, Option<Vec<String>>>(0).unwrap_or_default();
    let lk: Vec<String> = row.get::<_, Option<Vec<String>>>(1).unwrap_or_default();
    let lf: Vec<Option<i16>> = row.get::<_, Option<_>>(2).unwrap_or_default();
    let lv: Vec<Option<Vec<u8>>> = row.get::<_, Option<_>>(3).unwrap_or_default();
    for (((t, k), f), v) in lt.into_iter().zip(lk).zip(lf).zip(lv) {
        let rec = codec::decode_record(f, v.as_deref()).map_err(StoreError::from);
        state.insert(parse_id(t, k)?, rec);
    }
    let it: Vec<String> = row.get::<_, Option<Vec<String>>>(4).unwrap_or_default();
    let ik: Vec<String> = row.get::<_, Option<Vec<String>>>(5).unwrap_or_default();
    for (t, k) in it.into_iter().zip(ik) {
        state.insert(parse_id(t, k)?, Ok(None));
    }
    for id in &new_ids {
        if !state.contains_key(id) {
            // Created by a transaction that committed after this statement
            // began: neither inserted nor visible. Run the batch again.
            conn.rollback(sql).await;
            return Err(PgError::Raced(format!("{}/{}", id.0, id.1)));
        }
    }
    for id in &ids {
        // A settlement on a key without a record.
        state.entry(id.clone()).or_insert(Ok(None));
    }

    let mut fates = Vec::with_capacity(items.len());
    let mut changed: Vec<Id> = Vec::new();
    let mut next = fences.next();
    for it in items {
        let id = (it.tenant.clone(), record_key(&it.cmd).clone());
        let current = match state.get(&id).expect("loaded") {
            Ok(r) => r.clone(),
            Err(e) => {
                fates.push(Fate::Failed(e.clone()));
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

    // Round trip 2: every changed record in one UPDATE (or DELETE), then COMMIT.
    let mut u_t = Vec::new();
    let mut u_k = Vec::new();
    let mut u_fmt = Vec::new();
    let mut u_val = Vec::new();
    let mut u_owner = Vec::new();
    let mut u_status = Vec::new();
    let mut u_rec = Vec::new();
    let mut u_lease = Vec::new();
    let mut u_lgen = Vec::new();
    let mut u_upd = Vec::new();
    let mut u_coll = Vec::new();
    let mut u_rcpt = Vec::new();
    let mut d_t = Vec::new();
    let mut d_k = Vec::new();
    for id in &changed {
        match state.get(id).expect("changed") {
            Ok(Some(r)) => {
                let cols = RecordColumns::of(r);
                u_t.push(id.0.as_str().to_string());
                u_k.push(id.1.as_str().to_string());
                u_fmt.push(FORMAT_POSTCARD_V1);
                u_val.push(codec::encode(r)?);
                u_owner.push(cols.owner);
                u_status.push(cols.status);
                u_rec.push(cols.reconcile);
                u_lease.push(cols.lease_expires_at);
                u_lgen.push(cols.lease_generation);
                u_upd.push(cols.updated_at);
                u_coll.push(cols.collect_at);
                u_rcpt.push(cols.receipt_at);
            }
            Ok(None) => {
                d_t.push(id.0.as_str().to_string());
                d_k.push(id.1.as_str().to_string());
            }
            Err(_) => unreachable!("a record that failed to load is never changed"),
        }
    }
    let upd_params: [&(dyn ToSql + Sync); 12] = [
        &u_t, &u_k, &u_fmt, &u_val, &u_owner, &u_status, &u_rec, &u_lease, &u_lgen, &u_upd,
        &u_coll, &u_rcpt,
    ];
    let del_params: [&(dyn ToSql + Sync); 2] = [&d_t, &d_k];
    let mut futs: Vec<Pending<'_, u64>> = Vec::new();
    let mut expect = Vec::new();
    if !u_t.is_empty() {
        futs.push(Box::pin(c.execute(&upd_st, &upd_params)));
        expect.push(u_t.len() as u64);
    }
    if !d_t.is_empty() {
        futs.push(Box::pin(c.execute(&del_st, &del_params)));
        expect.push(d_t.len() as u64);
    }
    let (write_results, commit_result) =
        futures::join!(futures::future::join_all(futs), c.batch_execute(sql.commit));
    match commit_result {
        Ok(()) => {
            for (r, want) in write_results.into_iter().zip(expect) {
                match r {
                    Ok(n) if n == want => {}
                    Ok(n) => {
                        conn.done();
                        return Err(PgError::Corrupt(format!(
                            "a batch write touched {n} rows, expected {want}"
                        )));
                    }
                    // The COMMIT was a rollback: nothing happened.
                    Err(e) => {
                        conn.done();
                        return Err(e.into());
                    }
                }
            }
            conn.done();
            Ok(fates)
        }
        Err(e) => {
            if let Some(db) = e.as_db_error()
                && db.code().code().starts_with("40")
            {
                return Err(e.into());
            }
            drop(conn);
            match resolve_in_doubt(inner, xid).await {
                Ok(true) => Ok(fates),
                Ok(false) => Err(e.into()),
                Err(reason) => Err(PgError::InDoubt { xid, reason }),
            }
        }
    }
}
