//! What both write paths share, and the reads: the store's state
//! ([`Inner`]), connections that are closed unless known clean ([`Conn`]),
//! the retry policy, and `get`, `warnings`, `now`, `health`, the sweep and
//! `stats`. The writes run on the per-command path (`command.rs`) or the
//! group-commit path (`group_commit.rs`).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use settle_core::{
    Command, Key, Limits, Principals, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp,
    Warning, view_at,
};
use settle_ledger::inspect::Scan;
use settle_ledger::{Clock, StoreStats, SweepReport};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::codec::{self, FORMAT, principal_state};
use crate::session::{Seen, Server};
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

pub(crate) type Pending<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'a>>;

pub(crate) fn now_from(inner: &Inner, db_ms: i64) -> Timestamp {
    inner.clock.from_source(Timestamp(db_ms.max(0) as u64))
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
        let Ok(record) = crate::rows::loaded_record(inner, tenant, key, row.get(1), row.get(2))
        else {
            return Ok(Err(RefusalCode::RecordRefused));
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

/// The inspection scan ([`settle_ledger::Store::scan`]): one statement,
/// one snapshot, over the primary key's index.
pub async fn scan(
    inner: &Inner,
    tenant: &TenantId,
    after: Option<&Key>,
    max: usize,
) -> Result<Scan, PgError> {
    let max = max.clamp(1, 10_000);
    let limit = max as i64;
    // Keys are never empty, so '' is before every key.
    let after = after.map_or("", Key::as_str);
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.scan).await?;
        let rows = conn
            .within(
                conn.client()
                    .query(&st, &[&tenant.as_str(), &after, &limit]),
            )
            .await??;
        conn.done();
        let now = now_from(inner, rows.first().map_or(0, |r| r.get(0)));
        let mut records = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let Some(k) = row.get::<_, Option<String>>(1) else {
                continue;
            };
            let key = Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?;
            last = Some(key.clone());
            let record = match codec::decode_record(row.get(2), row.get::<_, Option<&[u8]>>(3)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                // Not listed; counted by the gauges and refused on access.
                Err(e) => {
                    inner.refuse_undecodable(tenant, &key, &e);
                    continue;
                }
            };
            let mut principals = Principals::new();
            principals.insert(
                record.reservation.principal.clone(),
                principal_state(row.get(4), row.get(5), row.get(6))?,
            );
            match view_at(Some(&record), &principals, now) {
                Ok(Some(view)) => records.push(view),
                Ok(None) => {}
                // Refused under §6.9: listed as stored.
                Err(_) => records.push(record),
            }
        }
        let next = if rows.len() >= max { last } else { None };
        Ok(Scan { records, next, now })
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

/// A principal's current generation (0 without a row).
pub async fn generation(
    inner: &Inner,
    tenant: &TenantId,
    principal: &settle_core::Principal,
) -> Result<u64, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.generation).await?;
        let row = conn
            .within(
                conn.client()
                    .query_opt(&st, &[&tenant.as_str(), &principal.as_str()]),
            )
            .await??;
        conn.done();
        Ok(match row {
            Some(r) => principal_state(r.get(0), r.get(1), r.get(2))?.generation,
            None => 0,
        })
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
    match crate::command::execute(inner, t, &cmd).await {
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
