//! One command, one transaction: lock, load, apply the core, write, commit.
//!
//! Round trips of a command (each a pipeline of statements):
//! - (only for commands without a binding principal) peek the record's owner;
//! - `BEGIN` and the transaction's settings; lock principals; [insert
//!   placeholder]; lock+read the row; read clock, durability settings,
//!   fence and principal rows;
//! - writes; commit token; `COMMIT` (a lost answer: `doubt.rs`).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use settle_core::{
    Command, Ctx, Fence, Key, Limits, OpState, Principal, PrincipalState, Principals, Record,
    RefusalCode, Reply, Target, TaskId, TenantId, Timestamp, Warning, apply, principals_needed,
    view_at,
};
use settle_ledger::{Clock, StoreStats, SweepReport};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::codec::{self, FORMAT, PrincipalColumns, RecordColumns, principal_state};
use crate::doubt::{self, Commit};
use crate::lock::principal_key;
use crate::session::{Seen, Server, Token};
use crate::sql::Sql;
use crate::{PgError, PgOptions};

/// Candidates examined per sweep pass and kind.
const SWEEP_BATCH: i64 = 1000;

/// How long commit tokens are kept: far longer than any transaction can
/// live after its client gave up (statement, lock and idle-in-transaction
/// timeouts, each at most `MAX_TIMEOUT`) and than any probe looks for one.
pub const TOKEN_RETENTION_MS: i64 = 10 * 60 * 1000;

/// Tokens deleted per sweep pass.
const TOKEN_SWEEP_BATCH: i64 = 20_000;

pub struct Inner {
    pub pool: Pool,
    /// Reserved for in-doubt probes, so they never queue behind commands.
    pub doubt_pool: Pool,
    pub schema: String,
    pub sql: Sql,
    pub clock: Clock,
    pub limits: Limits,
    pub in_doubt_timeout: Duration,
    /// Client-side deadline of each round trip.
    pub client_timeout: Duration,
    pub max_retries: u32,
    /// The server as last seen by a new connection.
    pub seen: Seen,
    /// Records of the current format that failed to decode (seen by any call or the
    /// sweep since this process started): skipped by the sweep, counted.
    pub undecodable: Mutex<HashSet<(TenantId, Key)>>,
    /// In-doubt commits so far: resolved committed, resolved not
    /// committed, left unresolved (answered `InDoubt`).
    pub in_doubt: [AtomicU64; 3],
}

impl Inner {
    pub fn new(pool: Pool, doubt_pool: Pool, seen: Seen, opts: PgOptions) -> Inner {
        Inner {
            pool,
            doubt_pool,
            sql: Sql::new(&opts.schema, &opts.settings()),
            schema: opts.schema,
            clock: opts.clock,
            limits: opts.limits,
            in_doubt_timeout: opts.in_doubt_timeout,
            client_timeout: opts.client_timeout,
            max_retries: opts.max_retries,
            seen,
            undecodable: Mutex::new(HashSet::new()),
            in_doubt: Default::default(),
        }
    }

    fn undecodable(&self) -> std::sync::MutexGuard<'_, HashSet<(TenantId, Key)>> {
        self.undecodable.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a record that does not decode: every call on its key is then
    /// refused (`record_refused`), never treated as absent.
    pub(crate) fn refuse_undecodable(&self, tenant: &TenantId, key: &Key, e: &PgError) {
        if self.undecodable().insert((tenant.clone(), key.clone())) {
            tracing::error!(tenant = tenant.as_str(), key = key.as_str(), error = %e,
                "a stored record does not decode; calls on its key are refused");
        }
    }
}

/// A pooled connection that is handed back only when it is known to be
/// idle outside a transaction; otherwise it is closed (the server then
/// rolls back whatever was open).
pub(crate) struct Conn {
    obj: Option<Object>,
    clean: bool,
    /// Client-side deadline of each round trip on this connection.
    timeout: Duration,
}

impl Conn {
    pub(crate) async fn get(pool: &Pool, timeout: Duration) -> Result<Conn, PgError> {
        let obj = pool.get().await.map_err(PgError::from_pool)?;
        Ok(Conn {
            obj: Some(obj),
            clean: false,
            timeout,
        })
    }
    fn obj(&self) -> &Object {
        self.obj.as_ref().expect("present until drop")
    }
    pub(crate) fn client(&self) -> &Client {
        self.obj()
    }
    /// Runs one round trip under the client-side deadline. Past it the
    /// caller gets `PgError::Timeout` and must drop the connection (a
    /// silent server or network is never waited on for longer).
    pub(crate) async fn within<T>(&self, fut: impl Future<Output = T>) -> Result<T, PgError> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| PgError::Timeout(self.timeout))
    }
    pub(crate) async fn prepare(&self, sql: &str) -> Result<tokio_postgres::Statement, PgError> {
        Ok(self.within(self.obj().prepare_cached(sql)).await??)
    }
    /// Marks the connection reusable (no transaction open).
    pub(crate) fn done(mut self) {
        self.clean = true;
    }
    /// Rolls back; the connection is reused only if that worked.
    pub(crate) async fn rollback(self, sql: &Sql) {
        if let Ok(Ok(())) = self.within(self.client().batch_execute(sql.rollback)).await {
            self.done();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.clean
            && let Some(obj) = self.obj.take()
        {
            // Detach from the pool and drop: closes the socket.
            drop(Object::take(obj));
        }
    }
}

/// Whether an error means "nothing was done, the same command may simply run again".
pub(crate) fn transient(e: &PgError) -> bool {
    match e {
        PgError::Db(e) => match e.as_db_error() {
            None => true, // connection closed or I/O: the transaction did not commit
            Some(db) => {
                let c = db.code();
                *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::LOCK_NOT_AVAILABLE
                    || *c == SqlState::ADMIN_SHUTDOWN
                    || *c == SqlState::CRASH_SHUTDOWN
                    || *c == SqlState::CANNOT_CONNECT_NOW
                    || c.code().starts_with("08")
            }
        },
        PgError::Raced(_) | PgError::Timeout(_) | PgError::NotCommitted(_) => true,
        _ => false,
    }
}

/// What one attempt decided.
enum Step {
    Done(Reply),
    /// Locks were missing (an owner we did not know, or a generation to
    /// raise under a shared lock): rolled back, run again with more locks.
    Relock,
    /// Failed before anything could commit; safe to run again.
    Retry(PgError),
}

/// The principal locks an attempt takes, in a global order (by key).
#[derive(Default)]
struct Plan {
    principals: Vec<(Principal, bool)>,
    /// The owner must be learned before locking (no binding principal).
    peek: bool,
}

impl Plan {
    fn new(cmd: &Command) -> Plan {
        let mut p = Plan::default();
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

pub async fn execute(inner: &Inner, tenant: &TenantId, cmd: &Command) -> Result<Reply, PgError> {
    let mut plan = Plan::new(cmd);
    let mut retries = 0;
    let mut relocks = 0;
    loop {
        match attempt(inner, tenant, cmd, &mut plan).await {
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

pub(crate) type Pending<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'a>>;

pub(crate) fn now_from(inner: &Inner, db_ms: i64) -> Timestamp {
    inner.clock.from_source(Timestamp(db_ms.max(0) as u64))
}

async fn attempt(
    inner: &Inner,
    tenant: &TenantId,
    cmd: &Command,
    plan: &mut Plan,
) -> Result<Step, PgError> {
    let sql = &inner.sql;
    let conn = Conn::get(&inner.pool, inner.client_timeout).await?;
    let c = conn.client();
    let t = tenant.as_str();
    let target = cmd.target();
    // The server this transaction runs on, as far as the store knows.
    let seen = inner.seen.get();
    let (row_key, is_record) = match target {
        Target::Record(k) => (Some(k.as_str()), true),
        Target::Task(task) => (Some(task.as_str()), false),
        Target::Principal(_) => (None, false),
    };

    if plan.peek {
        // Owners never change for a record's lifetime; the guess is checked
        // again under the row lock.
        let st = conn.prepare(&sql.peek_owner).await?;
        let key = row_key.expect("record target");
        match conn.within(c.query_opt(&st, &[&t, &key])).await? {
            Ok(row) => {
                if let Some(owner) = row.and_then(|r| r.get::<_, Option<String>>(0)) {
                    let p = Principal::new(owner)
                        .map_err(|e| PgError::Corrupt(format!("record owner: {e}")))?;
                    plan.add(p, false);
                }
                plan.peek = false;
            }
            Err(e) => return Ok(Step::Retry(e.into())),
        }
    }

    let (keys, modes) = plan.keys(&inner.schema, t);
    let names = plan.names();
    let wants_fence = matches!(cmd, Command::Claim(_));
    let lock_st = if keys.is_empty() {
        None
    } else {
        Some(conn.prepare(&sql.lock_principals).await?)
    };
    let (ins_sql, sel_sql) = match target {
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
    let ins_st = match ins_sql {
        Some(s) => Some(conn.prepare(s).await?),
        None => None,
    };
    let sel_st = match sel_sql {
        Some(s) => Some(conn.prepare(s).await?),
        None => None,
    };
    let ctx_st = conn.prepare(&sql.context).await?;

    // Round trip 1. The statements run in this order on the server; each
    // later one starts (and takes its snapshot) after the earlier ones'
    // locks are held, which is what makes the reads current.
    let key_param = row_key.unwrap_or("");
    let ctx_params: [&(dyn ToSql + Sync); 3] = [&t, &names, &wants_fence];
    let round1 = conn.within(async {
        futures::join!(
            c.batch_execute(&sql.begin),
            async {
                match &lock_st {
                    Some(st) => c.execute(st, &[&keys, &modes]).await.map(Some),
                    None => Ok(None),
                }
            },
            async {
                match &ins_st {
                    Some(st) => c.execute(st, &[&t, &key_param]).await.map(Some),
                    None => Ok(None),
                }
            },
            async {
                match &sel_st {
                    Some(st) => c.query_opt(st, &[&t, &key_param]).await.map(Some),
                    None => Ok(None),
                }
            },
            c.query(&ctx_st, &ctx_params),
        )
    });
    // Past the deadline nothing has committed: drop the connection, run again.
    let (r_begin, r_lock, r_ins, r_sel, r_ctx) = match round1.await {
        Ok(r) => r,
        Err(e) => return Ok(Step::Retry(e)),
    };
    let loaded = (|| -> Result<(Option<Option<Row>>, Vec<Row>), tokio_postgres::Error> {
        r_begin?;
        r_lock?;
        r_ins?;
        Ok((r_sel?, r_ctx?))
    })();
    let (sel_row, ctx_rows) = match loaded {
        Ok(v) => v,
        Err(e) => {
            if e.as_db_error().is_some() {
                conn.rollback(sql).await;
            }
            return Ok(Step::Retry(e.into()));
        }
    };

    let first = ctx_rows
        .first()
        .ok_or_else(|| PgError::Corrupt("context query returned no row".into()))?;
    let db_now: i64 = first.get(0);
    let durability: String = first.get(1);
    let fence: Option<i64> = first.get(2);
    let now = now_from(inner, db_now);
    if let Err(e) = check_durability(&durability) {
        conn.rollback(sql).await;
        return Err(e);
    }

    let mut state = OpState::default();
    let (format, value): (Option<i16>, Option<Vec<u8>>) = match sel_row.flatten() {
        Some(r) => (r.get(0), r.get(1)),
        None => (None, None),
    };
    if let Target::Record(key) = target {
        match codec::decode_record(format, value.as_deref()) {
            Ok(r) => state.record = r,
            Err(e) => {
                // Never treated as absent (the key could be claimed again),
                // never written over: refused.
                inner.refuse_undecodable(tenant, key, &e);
                conn.rollback(sql).await;
                return Ok(Step::Done(Reply::Refused(RefusalCode::RecordRefused)));
            }
        }
    } else if matches!(target, Target::Task(_)) {
        state.warnings = codec::decode_warnings(format, value.as_deref())?;
    }

    // Every principal the core will consult must be locked already.
    let mut missing = false;
    for p in principals_needed(cmd, state.record.as_ref()) {
        if !plan.holds(p) {
            plan.add(p.clone(), false);
            missing = true;
        }
    }
    if missing {
        conn.rollback(sql).await;
        return Ok(Step::Relock);
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

    let next_fence = match fence {
        Some(f) => Fence(f as u64),
        // Only claims grant leases; a fence no lease can have.
        None => Fence(0),
    };
    if wants_fence
        && let Some(last) = state.record.as_ref().and_then(|r| r.last_fence())
        && next_fence <= last
    {
        // The sequence is behind the records (e.g. restored from an older
        // backup): refuse rather than hand out a fence twice.
        conn.rollback(sql).await;
        return Err(PgError::Corrupt(format!(
            "fence sequence at {} is not above the record's fence {}",
            next_fence.0, last.0
        )));
    }
    let ctx = Ctx {
        now,
        next_fence,
        limits: inner.limits,
    };
    let applied = apply(&mut state, cmd, &ctx);
    if applied.fence_used && !wants_fence {
        conn.rollback(sql).await;
        return Err(PgError::Corrupt(format!(
            "{} granted a lease without a fence",
            cmd.name()
        )));
    }
    let mut upgrade = false;
    for (p, _) in state.principals.dirty() {
        if !plan.exclusive(p) {
            plan.add(p.clone(), true);
            upgrade = true;
        }
    }
    if upgrade {
        conn.rollback(sql).await;
        return Ok(Step::Relock);
    }
    if !applied.needs_commit(&state) {
        // Nothing changed (a refusal, an in-flight answer, a replay): a
        // placeholder, if any, goes away with the rollback.
        conn.rollback(sql).await;
        return Ok(Step::Done(applied.reply));
    }

    // Round trip 2: the writes and COMMIT.
    let record_write: Option<Option<(Vec<u8>, RecordColumns)>> = if is_record && applied.changed {
        match &state.record {
            Some(r) => Some(Some((codec::encode(r)?, RecordColumns::of(r)))),
            None => Some(None),
        }
    } else {
        None
    };
    let warnings_bytes = if matches!(target, Target::Task(_)) && applied.changed {
        Some(codec::encode(&state.warnings)?)
    } else {
        None
    };
    let raises: Vec<(String, PrincipalColumns)> = state
        .principals
        .dirty()
        .map(|(p, st)| Ok((p.as_str().to_string(), PrincipalColumns::of(st)?)))
        .collect::<Result<_, PgError>>()?;
    let upd_st = conn.prepare(&sql.update_record).await?;
    let del_st = conn.prepare(&sql.delete_record).await?;
    let raise_st = conn.prepare(&sql.raise_principal).await?;
    let warn_st = conn.prepare(&sql.update_warnings).await?;
    let token_st = conn.prepare(&sql.insert_token).await?;
    let fmt = FORMAT;
    let key_params: [&(dyn ToSql + Sync); 2] = [&t, &key_param];
    let rec_params: Vec<&(dyn ToSql + Sync)> = match &record_write {
        Some(Some((bytes, cols))) => vec![
            &t,
            &key_param,
            &fmt,
            bytes,
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
    let warn_params: Vec<&(dyn ToSql + Sync)> = match &warnings_bytes {
        Some(b) => vec![&t, &key_param, &fmt, b],
        None => Vec::new(),
    };
    let raise_params: Vec<[&(dyn ToSql + Sync); 5]> = raises
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
    match &record_write {
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
    if warnings_bytes.is_some() {
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
            futures::join!(futures::future::join_all(futs), c.batch_execute(sql.commit))
        })
        .await;

    match doubt::finish(inner, conn, r, &token, seen.as_ref()).await? {
        Commit::Answered(write_results) => {
            // The server answered COMMIT. If a write had failed, that COMMIT
            // was a rollback: the command did not happen.
            for (r, label) in write_results.into_iter().zip(&labels) {
                match r {
                    Ok(1) => {}
                    Ok(n) => {
                        // Cannot happen under the locks held; fail closed.
                        return Err(PgError::Corrupt(format!(
                            "{label} write touched {n} rows, expected 1"
                        )));
                    }
                    Err(e) => return Ok(Step::Retry(e.into())),
                }
            }
            Ok(Step::Done(applied.reply))
        }
        // Committed, so every write in it succeeded.
        Commit::Committed => Ok(Step::Done(applied.reply)),
        Commit::NotCommitted(e) => Ok(Step::Retry(e)),
    }
}

/// Refuses a transaction that would not be durable: `durability` is
/// `fsync/synchronous_commit` as read inside it (after `SET LOCAL`).
pub(crate) fn check_durability(durability: &str) -> Result<(), PgError> {
    match durability {
        "on/on" => Ok(()),
        other => Err(PgError::NotDurable(format!(
            "a transaction ran with fsync/synchronous_commit = {other}: its commit would \
             not survive a crash; settle refuses to serve until both are on"
        ))),
    }
}

/// Runs a read-only query with the transient-error retry policy. `f` owns
/// the connection and marks it reusable when it is done with it.
async fn read<T, F, Fut>(inner: &Inner, f: F) -> Result<T, PgError>
where
    F: Fn(Conn) -> Fut,
    Fut: Future<Output = Result<T, PgError>>,
{
    read_on(inner, &inner.pool, f).await
}

async fn read_on<T, F, Fut>(inner: &Inner, pool: &Pool, f: F) -> Result<T, PgError>
where
    F: Fn(Conn) -> Fut,
    Fut: Future<Output = Result<T, PgError>>,
{
    let mut retries = 0;
    loop {
        let r = match Conn::get(pool, inner.client_timeout).await {
            Ok(conn) => f(conn).await,
            Err(e) => Err(e),
        };
        match r {
            Err(e) if transient(&e) && retries < inner.max_retries => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(5 << retries.min(6))).await;
            }
            other => return other,
        }
    }
}

pub async fn get(
    inner: &Inner,
    tenant: &TenantId,
    key: &Key,
) -> Result<Result<Option<Record>, RefusalCode>, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.get).await?;
        // One statement, one snapshot: the record and its owner's
        // generation as of the same instant, and the clock read after it.
        let row = conn
            .within(
                conn.client()
                    .query_one(&st, &[&tenant.as_str(), &key.as_str()]),
            )
            .await??;
        conn.done();
        let now = now_from(inner, row.get(0));
        let record = match codec::decode_record(row.get(1), row.get::<_, Option<&[u8]>>(2)) {
            Ok(r) => r,
            Err(e) => {
                inner.refuse_undecodable(tenant, key, &e);
                return Ok(Err(RefusalCode::RecordRefused));
            }
        };
        let mut principals = Principals::new();
        if let Some(r) = &record {
            principals.insert(
                r.reservation.principal.clone(),
                principal_state(row.get(3), row.get(4), row.get(5))?,
            );
        }
        Ok(view_at(record.as_ref(), &principals, now))
    })
    .await
}

pub async fn warnings(
    inner: &Inner,
    tenant: &TenantId,
    task: &TaskId,
) -> Result<Vec<Warning>, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.warnings).await?;
        let row = conn
            .within(
                conn.client()
                    .query_opt(&st, &[&tenant.as_str(), &task.as_str()]),
            )
            .await??;
        conn.done();
        match row {
            Some(r) => codec::decode_warnings(r.get(0), r.get::<_, Option<&[u8]>>(1)),
            None => Ok(Vec::new()),
        }
    })
    .await
}

pub async fn now(inner: &Inner) -> Result<Timestamp, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.now).await?;
        let row = conn.within(conn.client().query_one(&st, &[])).await??;
        conn.done();
        Ok(now_from(inner, row.get(0)))
    })
    .await
}

/// Readiness: the database answers within the deadline, is writable (not a
/// standby), runs with `fsync=on`, and a transaction of this store really
/// runs with `synchronous_commit=on`. Asked on a reserved connection: a
/// pool busy with commands is overloaded, not unready.
pub async fn health(inner: &Inner) -> Result<(), PgError> {
    let server = read_on(inner, &inner.doubt_pool, |conn| async move {
        let c = conn.client();
        let (b, server, durability) = conn
            .within(async {
                futures::join!(
                    c.batch_execute(&inner.sql.begin),
                    Server::read(c, inner.sql.server),
                    c.query_one(&inner.sql.durability, &[]),
                )
            })
            .await?;
        b?;
        let server = server?;
        let durability: String = durability?.get(0);
        conn.rollback(&inner.sql).await;
        check_durability(&durability)?;
        Ok(server)
    })
    .await?;
    if let Some(refusal) = server.refusal() {
        return Err(PgError::NotDurable(refusal));
    }
    if server.in_recovery {
        return Err(PgError::NotWritable(
            "the server is a standby in recovery".into(),
        ));
    }
    Ok(())
}

fn ids(rows: Vec<Row>) -> Result<Vec<(TenantId, Key)>, PgError> {
    rows.into_iter()
        .map(|r| {
            let t = TenantId::new(r.get::<_, String>(0))
                .map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?;
            let k = Key::new(r.get::<_, String>(1))
                .map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?;
            Ok((t, k))
        })
        .collect()
}

/// Finds candidates with indexed queries, then runs `expire`/`collect`
/// through the core, each in its own transaction (the core decides; a
/// candidate that changed meanwhile is simply left alone). A record that
/// does not decode is skipped (and counted in `stats`), never a reason to
/// stop; commit tokens past their retention are deleted.
pub async fn sweep(inner: &Inner) -> Result<SweepReport, PgError> {
    let skew = inner.clock.skew_ms();
    let bad: HashSet<(TenantId, Key)> = inner.undecodable().clone();
    // Records in an unknown format are never candidates (the queries ask
    // for the current format); known undecodable ones are fetched over and skipped.
    let limit = SWEEP_BATCH + bad.len() as i64;
    let (due, revoked, collect) = read(inner, |conn| async move {
        let c = conn.client();
        let with_skew: [&(dyn ToSql + Sync); 2] = [&skew, &limit];
        let only_limit: [&(dyn ToSql + Sync); 1] = [&limit];
        let (due, revoked, collect) = conn
            .within(async {
                futures::join!(
                    c.query(&inner.sql.due_leases, &with_skew),
                    c.query(&inner.sql.revoked_leases, &only_limit),
                    c.query(&inner.sql.due_collections, &with_skew),
                )
            })
            .await?;
        let (due, revoked, collect) = (due?, revoked?, collect?);
        conn.done();
        Ok((ids(due)?, ids(revoked)?, ids(collect)?))
    })
    .await?;
    let mut report = SweepReport::default();
    let mut seen = HashSet::new();
    for (t, key) in due.into_iter().chain(revoked) {
        if bad.contains(&(t.clone(), key.clone())) || !seen.insert((t.clone(), key.clone())) {
            continue;
        }
        if let Reply::Expired { ended: true } =
            sweep_one(inner, &t, Command::Expire { key }).await?
        {
            report.expired += 1;
        }
    }
    for (t, key) in collect {
        if bad.contains(&(t.clone(), key.clone())) {
            continue;
        }
        if let Reply::Collected { removed: true } =
            sweep_one(inner, &t, Command::Collect { key }).await?
        {
            report.collected += 1;
        }
    }
    let expired_tokens = read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.expire_tokens).await?;
        let n = conn
            .within(
                conn.client()
                    .execute(&st, &[&TOKEN_RETENTION_MS, &TOKEN_SWEEP_BATCH]),
            )
            .await??;
        conn.done();
        Ok(n)
    })
    .await?;
    if expired_tokens > 0 {
        tracing::debug!(expired_tokens, "sweep deleted old commit tokens");
    }
    Ok(report)
}

/// One sweep command. A problem of this one record (it does not decode,
/// a stored field is corrupt) is logged and skipped; anything else (the
/// database is unreachable) stops the pass.
async fn sweep_one(inner: &Inner, t: &TenantId, cmd: Command) -> Result<Reply, PgError> {
    match execute(inner, t, &cmd).await {
        Err(e @ PgError::Corrupt(_)) => {
            tracing::error!(tenant = t.as_str(), command = cmd.name(), error = %e,
                "the sweep skipped a record it cannot process");
            Ok(Reply::Refused(RefusalCode::RecordRefused))
        }
        other => other,
    }
}

pub async fn stats(inner: &Inner, stuck_after_ms: u64) -> Result<StoreStats, PgError> {
    let skew = inner.clock.skew_ms();
    let stuck = i64::try_from(stuck_after_ms).unwrap_or(i64::MAX);
    let (tenants, keys): (Vec<String>, Vec<String>) = inner
        .undecodable()
        .iter()
        .map(|(t, k)| (t.as_str().to_string(), k.as_str().to_string()))
        .unzip();
    let (row, recheck) = read(inner, |conn| {
        let (tenants, keys) = (&tenants, &keys);
        async move {
            let c = conn.client();
            let stats_params: [&(dyn ToSql + Sync); 2] = [&skew, &stuck];
            let recheck_params: [&(dyn ToSql + Sync); 2] = [tenants, keys];
            let (row, recheck) = conn
                .within(async {
                    futures::join!(
                        c.query_one(&inner.sql.stats, &stats_params),
                        c.query(&inner.sql.recheck, &recheck_params),
                    )
                })
                .await?;
            let (row, recheck) = (row?, recheck?);
            conn.done();
            Ok((row, recheck))
        }
    })
    .await?;
    // Known undecodable records of the current format (others are counted by
    // SQL): dropped from the set once fixed or deleted by an operator.
    let mut still_bad = HashSet::new();
    for r in &recheck {
        if r.get::<_, Option<i16>>(2) == Some(FORMAT)
            && codec::decode_record(r.get(2), r.get::<_, Option<&[u8]>>(3)).is_err()
            && let (Ok(t), Ok(k)) = (
                TenantId::new(r.get::<_, String>(0)),
                Key::new(r.get::<_, String>(1)),
            )
        {
            still_bad.insert((t, k));
        }
    }
    let garbled = still_bad.len() as u64;
    inner.undecodable().retain(|id| still_bad.contains(id));
    let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    Ok(StoreStats {
        open: n(0),
        pending: n(1),
        unknown: n(2),
        conflict: n(3),
        reconcile_required: n(4),
        stuck: n(5),
        refused: n(6),
        disputed: n(7),
        undecodable: n(8) + garbled,
    })
}
