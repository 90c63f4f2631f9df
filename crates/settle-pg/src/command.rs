//! The per-command path: one locking transaction per command (every
//! command when group commit is off; otherwise every command but claims
//! and settlements, and those a batch hands back).
//!
//! One run of [`command_transaction`] goes through named phases:
//!
//! 1. **plan locks** ([`LockPlan`]; [`peek_owner`] first, for commands
//!    without a binding principal): which principals to lock, how;
//! 2. **load** ([`load_command`], round trip 1): `BEGIN` and the
//!    transaction's settings, the principal locks, [a placeholder row],
//!    the row locked and read, then clock, durability settings, fence and
//!    principal rows;
//! 3. **decide** ([`decide_command`]): `settle_core::apply`, after checking
//!    that every lock the core needs is held;
//! 4. **write + commit** ([`write_and_commit_command`], round trip 2): the
//!    writes, the commit token and `COMMIT`, pipelined;
//! 5. **resolve in doubt** ([`resolve_command_commit`]): a COMMIT whose
//!    answer was lost is resolved by its token (`doubt.rs`).
//!
//! A phase that ends the transaction early says how ([`Stop`]): roll back,
//! or close the connection, then answer, retry or relock.

use std::time::Duration;

use settle_core::{
    Applied, Command, Ctx, Fence, OpState, Principal, PrincipalState, Principals, RefusalCode,
    Reply, Target, TenantId, apply, principals_needed,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::codec::{self, FORMAT, PrincipalColumns, principal_state};
use crate::doubt::{self, Commit};
use crate::lock::principal_key;
use crate::rows::{self, RecordRow};
use crate::session::{Server, Token};
use crate::state::{Conn, Inner, Pending, answers_a_commit, now_from, transient};

/// What one run of the transaction decided.
enum Step {
    Done(Reply),
    /// Locks were missing (an owner we did not know, or a generation to
    /// raise under a shared lock): rolled back, run again with more locks.
    Relock,
    /// Failed before anything could commit; safe to run again.
    Retry(PgError),
}

/// Why a transaction ends before its COMMIT, and what then (boxed: a
/// reply is large, and this travels through every phase's `Err`).
struct Stop {
    /// Roll back (the connection is reused if that works); otherwise drop
    /// the connection, which closes it (the server rolls back): after a
    /// round trip that failed, timed out or cannot be trusted.
    rollback: bool,
    then: Box<Result<Step, PgError>>,
}

impl From<PgError> for Stop {
    fn from(e: PgError) -> Stop {
        Stop::close(Err(e))
    }
}

impl Stop {
    fn rollback(then: Result<Step, PgError>) -> Stop {
        Stop {
            rollback: true,
            then: Box::new(then),
        }
    }
    fn close(then: Result<Step, PgError>) -> Stop {
        Stop {
            rollback: false,
            then: Box::new(then),
        }
    }
    async fn finish(self, conn: Conn, inner: &Inner) -> Result<Step, PgError> {
        if self.rollback {
            conn.rollback(&inner.sql).await;
        } else {
            drop(conn);
        }
        *self.then
    }
}

/// The principal locks a transaction takes, in a global order (by key).
#[derive(Default)]
struct LockPlan {
    principals: Vec<(Principal, bool)>,
    /// The owner must be learned before locking (no binding principal).
    peek: bool,
}

impl LockPlan {
    fn new(cmd: &Command) -> LockPlan {
        let mut p = LockPlan::default();
        if let Some(b) = cmd.binding_principal() {
            // Revoke always moves the generation; everything else reads it
            // and upgrades if the core raises it.
            p.add(b.clone(), matches!(cmd, Command::Revoke(_)));
        } else {
            p.peek = matches!(cmd.target(), Target::Record(_));
        }
        p
    }
    fn add(&mut self, principal: Principal, exclusive: bool) {
        if let Some(e) = self.principals.iter_mut().find(|e| e.0 == principal) {
            e.1 |= exclusive;
        } else {
            self.principals.push((principal, exclusive));
        }
    }
    fn holds(&self, p: &Principal) -> bool {
        self.principals.iter().any(|e| &e.0 == p)
    }
    fn exclusive(&self, p: &Principal) -> bool {
        self.principals.iter().any(|e| &e.0 == p && e.1)
    }
    /// (keys, exclusive flags) sorted by key: every transaction takes its
    /// principal locks in this order and before any row lock, so lock
    /// waits never form a cycle.
    fn keys(&self, schema: &str, tenant: &str) -> (Vec<i64>, Vec<bool>) {
        let mut v: Vec<(i64, bool)> = self
            .principals
            .iter()
            .map(|(p, x)| (principal_key(schema, tenant, p.as_str()), *x))
            .collect();
        v.sort();
        // A collision of two principals' keys: one exclusive lock covers both.
        v.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 |= b.1;
                true
            } else {
                false
            }
        });
        v.into_iter().unzip()
    }
    fn names(&self) -> Vec<String> {
        self.principals
            .iter()
            .map(|(p, _)| p.as_str().to_string())
            .collect()
    }
}

/// Runs `cmd` on the per-command path: validated first (an invalid command
/// costs no round trip and no fence), then one transaction, run again after
/// a transient failure (bounded) or with more locks.
pub async fn execute(inner: &Inner, tenant: &TenantId, cmd: &Command) -> Result<Reply, PgError> {
    if let Err(e) = cmd.validate(&inner.limits) {
        return Ok(Reply::Invalid(e));
    }
    let r = execute_valid(inner, tenant, cmd).await;
    // The record may have changed: the one-round-trip path must not
    // send a write bound to fail its check.
    if let settle_core::Target::Record(key) = cmd.target() {
        inner.known.forget([&(tenant.clone(), key.clone())]);
    }
    r
}

async fn execute_valid(inner: &Inner, tenant: &TenantId, cmd: &Command) -> Result<Reply, PgError> {
    let mut plan = LockPlan::new(cmd);
    let mut retries = 0;
    let mut relocks = 0;
    loop {
        match command_transaction(inner, tenant, cmd, &mut plan).await {
            Ok(Step::Done(reply)) => return Ok(reply),
            Ok(Step::Relock) => {
                // At most: learn the owner, then upgrade one or two locks.
                relocks += 1;
                if relocks > 4 {
                    return Err(PgError::Exhausted(relocks, "locks kept changing".into()));
                }
            }
            Ok(Step::Retry(e)) | Err(e @ PgError::Db(_)) if transient(&e) => {
                retries += 1;
                if retries > inner.max_retries {
                    return Err(PgError::Exhausted(retries, e.to_string()));
                }
                // Back off a little so a deadlock victim or a restarting
                // server is not hammered.
                tokio::time::sleep(Duration::from_millis(5 << retries.min(6))).await;
            }
            Ok(Step::Retry(e)) | Err(e) => return Err(e),
        }
    }
}

/// The row a command works on: a record's or a task's key ("" for a principal).
fn row_key(cmd: &Command) -> &str {
    match cmd.target() {
        Target::Record(k) => k.as_str(),
        Target::Task(task) => task.as_str(),
        Target::Principal(_) => "",
    }
}

/// One transaction of the per-command path, phase by phase.
async fn command_transaction(
    inner: &Inner,
    tenant: &TenantId,
    cmd: &Command,
    plan: &mut LockPlan,
) -> Result<Step, PgError> {
    let conn = Conn::get(&inner.pool, inner.client_timeout).await?;
    // The server this transaction runs on, as far as the store knows.
    let seen = inner.seen.get();
    if plan.peek
        && let Err(stop) = peek_owner(inner, &conn, tenant, cmd, plan).await
    {
        return stop.finish(conn, inner).await;
    }
    let loaded = match load_command(inner, &conn, tenant, cmd, plan).await {
        Ok(l) => l,
        Err(stop) => return stop.finish(conn, inner).await,
    };
    let db_now = loaded.db_now;
    let (applied, state) = match decide_command(inner, cmd, plan, loaded) {
        Ok(d) => d,
        Err(stop) => return stop.finish(conn, inner).await,
    };
    let writes = match CommandWrites::of(cmd, &applied, &state) {
        Ok(w) => w,
        Err(e) => return Stop::from(e).finish(conn, inner).await,
    };
    let key = row_key(cmd);
    match write_and_commit_command(inner, conn, tenant, key, &writes, db_now, seen.as_ref()).await?
    {
        Ok(()) => Ok(Step::Done(applied.reply)),
        Err(e) => Ok(Step::Retry(e)),
    }
}

/// Phase 1, for commands without a binding principal: learns the record's
/// owner so its lock can be planned. Owners never change for a record's
/// lifetime; the guess is checked again under the row lock.
async fn peek_owner(
    inner: &Inner,
    conn: &Conn,
    tenant: &TenantId,
    cmd: &Command,
    plan: &mut LockPlan,
) -> Result<(), Stop> {
    let st = conn.prepare(&inner.sql.peek_owner).await?;
    let (t, key) = (tenant.as_str(), row_key(cmd));
    match conn
        .within(conn.client().query_opt(&st, &[&t, &key]))
        .await?
    {
        Ok(row) => {
            if let Some(owner) = row.and_then(|r| r.get::<_, Option<String>>(0)) {
                let p = Principal::new(owner)
                    .map_err(|e| PgError::Corrupt(format!("record owner: {e}")))?;
                plan.add(p, false);
            }
            plan.peek = false;
            Ok(())
        }
        Err(e) => Err(Stop::close(Ok(Step::Retry(e.into())))),
    }
}

/// What the load phase read, under the locks.
struct Loaded {
    /// The database clock (ms), as read.
    db_now: i64,
    /// A synchronous standby must confirm commits.
    standby: bool,
    /// The fence taken from the sequence (claims only).
    fence: Option<i64>,
    /// The target's record or warnings (principals are added by decide).
    state: OpState,
    /// The context rows: clock, durability, fence, then one per principal.
    ctx_rows: Vec<Row>,
}

/// The statements of round trip 1, prepared.
struct LoadStatements {
    lock: Option<tokio_postgres::Statement>,
    placeholder: Option<tokio_postgres::Statement>,
    select: Option<tokio_postgres::Statement>,
    context: tokio_postgres::Statement,
}

async fn prepare_load(
    inner: &Inner,
    conn: &Conn,
    cmd: &Command,
    locks: bool,
) -> Result<LoadStatements, PgError> {
    let sql = &inner.sql;
    let (ins_sql, sel_sql) = match cmd.target() {
        Target::Record(_) => (
            matches!(cmd, Command::Claim(_)).then_some(&sql.insert_record_placeholder),
            Some(&sql.lock_record),
        ),
        Target::Task(_) => (
            Some(&sql.insert_warnings_placeholder),
            Some(&sql.lock_warnings),
        ),
        Target::Principal(_) => (None, None),
    };
    Ok(LoadStatements {
        lock: prepare_opt(conn, locks.then_some(&sql.lock_principals)).await?,
        placeholder: prepare_opt(conn, ins_sql).await?,
        select: prepare_opt(conn, sel_sql).await?,
        context: conn.prepare(&sql.context).await?,
    })
}

async fn prepare_opt(
    conn: &Conn,
    sql: Option<&String>,
) -> Result<Option<tokio_postgres::Statement>, PgError> {
    match sql {
        Some(s) => conn.prepare(s).await.map(Some),
        None => Ok(None),
    }
}

/// Phase 2, round trip 1: locks, then the reads. The statements run in
/// this order on the server; each later one starts (and takes its
/// snapshot) after the earlier ones' locks are held, which is what makes
/// the reads current.
async fn load_command(
    inner: &Inner,
    conn: &Conn,
    tenant: &TenantId,
    cmd: &Command,
    plan: &LockPlan,
) -> Result<Loaded, Stop> {
    let (c, t) = (conn.client(), tenant.as_str());
    let (keys, modes) = plan.keys(&inner.schema, t);
    let names = plan.names();
    let wants_fence = matches!(cmd, Command::Claim(_));
    let st = prepare_load(inner, conn, cmd, !keys.is_empty()).await?;
    let key = row_key(cmd);
    let ctx_params: [&(dyn ToSql + Sync); 3] = [&t, &names, &wants_fence];
    let round1 = conn.within(async {
        futures::join!(
            c.batch_execute(&inner.sql.begin),
            async {
                match &st.lock {
                    Some(st) => c.execute(st, &[&keys, &modes]).await.map(Some),
                    None => Ok(None),
                }
            },
            async {
                match &st.placeholder {
                    Some(st) => c.execute(st, &[&t, &key]).await.map(Some),
                    None => Ok(None),
                }
            },
            async {
                match &st.select {
                    Some(st) => c.query_opt(st, &[&t, &key]).await.map(Some),
                    None => Ok(None),
                }
            },
            c.query(&st.context, &ctx_params),
        )
    });
    // Past the deadline nothing has committed: drop the connection, run again.
    let (r_begin, r_lock, r_ins, r_sel, r_ctx) =
        round1.await.map_err(|e| Stop::close(Ok(Step::Retry(e))))?;
    let loaded = (|| -> Result<(Option<Option<Row>>, Vec<Row>), tokio_postgres::Error> {
        r_begin?;
        r_lock?;
        r_ins?;
        Ok((r_sel?, r_ctx?))
    })();
    let (sel_row, ctx_rows) = match loaded {
        Ok(v) => v,
        Err(e) => {
            // A server error leaves a failed transaction to roll back; a
            // broken connection is dropped.
            let db = e.as_db_error().is_some();
            let retry = Ok(Step::Retry(e.into()));
            return Err(if db {
                Stop::rollback(retry)
            } else {
                Stop::close(retry)
            });
        }
    };
    read_loaded(inner, tenant, cmd, sel_row.flatten(), ctx_rows)
}

/// Checks the durability settings read inside the transaction and decodes
/// the target row. A record that does not decode is never treated as
/// absent (the key could be claimed again), never written over: refused.
fn read_loaded(
    inner: &Inner,
    tenant: &TenantId,
    cmd: &Command,
    row: Option<Row>,
    ctx_rows: Vec<Row>,
) -> Result<Loaded, Stop> {
    let first = ctx_rows
        .first()
        .ok_or_else(|| PgError::Corrupt("context query returned no row".into()))?;
    let (db_now, standby) = rows::loaded_clock(first).map_err(|e| Stop::rollback(Err(e)))?;
    let fence: Option<i64> = first.get(2);
    let mut state = OpState::default();
    let (format, value): (Option<i16>, Option<Vec<u8>>) = match row {
        Some(r) => (r.get(0), r.get(1)),
        None => (None, None),
    };
    match cmd.target() {
        Target::Record(key) => {
            match rows::loaded_record(inner, tenant, key, format, value.as_deref()) {
                Ok(r) => state.record = r,
                Err(_) => {
                    let refused = Reply::Refused(RefusalCode::RecordRefused);
                    return Err(Stop::rollback(Ok(Step::Done(refused))));
                }
            }
        }
        Target::Task(_) => state.warnings = codec::decode_warnings(format, value.as_deref())?,
        Target::Principal(_) => {}
    }
    Ok(Loaded {
        db_now,
        standby,
        fence,
        state,
        ctx_rows,
    })
}

/// Phase 3: the core decides. First checks that every principal the core
/// will consult is locked (else: relock), and that the fence is above the
/// record's; afterwards that a generation it raises is locked exclusively
/// (else: relock). Nothing to write ends the transaction here.
fn decide_command(
    inner: &Inner,
    cmd: &Command,
    plan: &mut LockPlan,
    loaded: Loaded,
) -> Result<(Applied, OpState), Stop> {
    let Loaded {
        db_now,
        standby,
        fence,
        mut state,
        ctx_rows,
    } = loaded;
    let mut missing = false;
    for p in principals_needed(cmd, state.record.as_ref()) {
        if !plan.holds(p) {
            plan.add(p.clone(), false);
            missing = true;
        }
    }
    if missing {
        return Err(Stop::rollback(Ok(Step::Relock)));
    }
    let mut principals = Principals::new();
    for p in principals_needed(cmd, state.record.as_ref()) {
        let row = ctx_rows
            .iter()
            .find(|r| r.get::<_, Option<&str>>(3) == Some(p.as_str()));
        let st = match row {
            Some(r) => principal_state(r.get(4), r.get(5), r.get(6))?,
            None => PrincipalState::default(),
        };
        principals.insert(p.clone(), st);
    }
    state.principals = principals;

    let wants_fence = matches!(cmd, Command::Claim(_));
    // Only claims take a fence; others get one no lease can have.
    let next_fence = fence.map_or(Fence(0), |f| Fence(f as u64));
    if wants_fence && let Some(behind) = rows::fence_behind(next_fence, state.record.as_ref()) {
        return Err(Stop::rollback(Err(PgError::Corrupt(behind))));
    }
    let ctx = Ctx {
        now: now_from(inner, db_now),
        next_fence,
        limits: inner.limits,
    };
    let applied = apply(&mut state, cmd, &ctx);
    if applied.fence_used && !wants_fence {
        return Err(Stop::rollback(Err(PgError::Corrupt(format!(
            "{} granted a lease without a fence",
            cmd.name()
        )))));
    }
    let mut upgrade = false;
    for (p, _) in state.principals.dirty() {
        if !plan.exclusive(p) {
            plan.add(p.clone(), true);
            upgrade = true;
        }
    }
    if upgrade {
        return Err(Stop::rollback(Ok(Step::Relock)));
    }
    let confirm = standby && answers_a_commit(&applied.reply);
    if !applied.needs_commit(&state) && !confirm {
        // Nothing changed (a refusal, an in-flight answer, a replay): a
        // placeholder, if any, goes away with the rollback. A replay or
        // receipt under a synchronous standby goes on to commit its token
        // alone: answered once the standby has confirmed it.
        return Err(Stop::rollback(Ok(Step::Done(applied.reply))));
    }
    Ok((applied, state))
}

/// What a decided command writes, encoded.
struct CommandWrites {
    /// The record: `Some(Some(_))` written, `Some(None)` deleted (collected).
    record: Option<Option<RecordRow>>,
    /// The task's warnings.
    warnings: Option<Vec<u8>>,
    /// Principals whose generation moved.
    raises: Vec<(String, PrincipalColumns)>,
}

impl CommandWrites {
    fn of(cmd: &Command, applied: &Applied, state: &OpState) -> Result<CommandWrites, PgError> {
        let target = cmd.target();
        let record = match (&target, applied.changed, &state.record) {
            (Target::Record(_), true, Some(r)) => Some(Some(RecordRow::of(r)?)),
            (Target::Record(_), true, None) => Some(None),
            _ => None,
        };
        let warnings = match target {
            Target::Task(_) if applied.changed => Some(codec::encode(&state.warnings)?),
            _ => None,
        };
        let raises = state
            .principals
            .dirty()
            .map(|(p, st)| Ok((p.as_str().to_string(), PrincipalColumns::of(st)?)))
            .collect::<Result<_, PgError>>()?;
        Ok(CommandWrites {
            record,
            warnings,
            raises,
        })
    }
}

/// Phase 4, round trip 2: the writes, the commit token and `COMMIT`,
/// pipelined. `Ok(Err(_))`: it did not commit, and may run again.
async fn write_and_commit_command(
    inner: &Inner,
    conn: Conn,
    tenant: &TenantId,
    key: &str,
    w: &CommandWrites,
    db_now: i64,
    seen: Option<&Server>,
) -> Result<Result<(), PgError>, PgError> {
    let (sql, c, t) = (&inner.sql, conn.client(), tenant.as_str());
    let upd_st = conn.prepare(&sql.update_record).await?;
    let del_st = conn.prepare(&sql.delete_record).await?;
    let raise_st = conn.prepare(&sql.raise_principal).await?;
    let warn_st = conn.prepare(&sql.update_warnings).await?;
    let token_st = conn.prepare(&sql.insert_token).await?;
    let fmt = FORMAT;
    let key_params: [&(dyn ToSql + Sync); 2] = [&t, &key];
    let rec_params: Vec<&(dyn ToSql + Sync)> = match &w.record {
        Some(Some(RecordRow {
            format,
            value,
            cols,
        })) => vec![
            &t,
            &key,
            format,
            value,
            &cols.owner,
            &cols.status,
            &cols.reconcile,
            &cols.lease_expires_at,
            &cols.lease_generation,
            &cols.updated_at,
            &cols.collect_at,
            &cols.receipt_at,
            &cols.disputed,
        ],
        _ => Vec::new(),
    };
    let warn_params: Vec<&(dyn ToSql + Sync)> = match &w.warnings {
        Some(b) => vec![&t, &key, &fmt, b],
        None => Vec::new(),
    };
    let raise_params: Vec<[&(dyn ToSql + Sync); 5]> = w
        .raises
        .iter()
        .map(|(p, c)| {
            [
                &t as _,
                p as _,
                &c.generation as _,
                &c.moved_at as _,
                &c.moves as _,
            ]
        })
        .collect();
    // The commit token, written with the writes: after a lost COMMIT answer
    // its presence (never the transaction id) says whether this committed.
    let token = Token::new(db_now);
    let token_bytes: &[u8] = &token.bytes;
    let token_params: [&(dyn ToSql + Sync); 2] = [&token.at, &token_bytes];

    let mut labels: Vec<&'static str> = Vec::new();
    let mut futs: Vec<Pending<'_, u64>> = Vec::new();
    match &w.record {
        Some(Some(_)) => {
            labels.push("record");
            futs.push(Box::pin(c.execute(&upd_st, &rec_params)));
        }
        Some(None) => {
            labels.push("record deletion");
            futs.push(Box::pin(c.execute(&del_st, &key_params)));
        }
        None => {}
    }
    if w.warnings.is_some() {
        labels.push("warnings");
        futs.push(Box::pin(c.execute(&warn_st, &warn_params)));
    }
    for p in &raise_params {
        labels.push("principal generation");
        futs.push(Box::pin(c.execute(&raise_st, p)));
    }
    labels.push("commit token");
    futs.push(Box::pin(c.execute(&token_st, &token_params)));
    let r = conn
        .within(async {
            futures::join!(
                futures::future::join_all(futs),
                crate::bugs::commit(c.batch_execute(sql.commit))
            )
        })
        .await;
    resolve_command_commit(inner, conn, r, &token, seen, &labels).await
}

/// Phase 5: what the commit round trip says. A lost answer is resolved by
/// the token (`doubt.rs`); an answered COMMIT after a failed write was a
/// rollback. `Ok(Err(_))`: not committed, may run again.
async fn resolve_command_commit(
    inner: &Inner,
    conn: Conn,
    r: Result<CommitRound, PgError>,
    token: &Token,
    seen: Option<&Server>,
    labels: &[&'static str],
) -> Result<Result<(), PgError>, PgError> {
    match doubt::finish(inner, conn, r, token, seen).await? {
        Commit::Answered(write_results) => {
            for (r, label) in write_results.into_iter().zip(labels) {
                match r {
                    Ok(1) => {}
                    Ok(n) => {
                        // Cannot happen under the locks held; fail closed.
                        return Err(PgError::Corrupt(format!(
                            "{label} write touched {n} rows, expected 1"
                        )));
                    }
                    Err(e) => return Ok(Err(e.into())),
                }
            }
            Ok(Ok(()))
        }
        // Committed, so every write in it succeeded.
        Commit::Committed => Ok(Ok(())),
        Commit::NotCommitted(e) => Ok(Err(e)),
    }
}

/// What the commit round trip returns: each write's row count, and COMMIT's answer.
type CommitRound = (
    Vec<Result<u64, tokio_postgres::Error>>,
    Result<(), tokio_postgres::Error>,
);
