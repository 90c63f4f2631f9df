//! What the write paths, the reads and the sweep share: the store's state
//! ([`Inner`]), connections that are closed unless known clean ([`Conn`]),
//! and the retry policy of transient errors (`transient`; `read` for
//! read-only queries). The writes run on the per-command path
//! (`command.rs`) or the group-commit path (`group_commit/`); the reads
//! are `reads.rs`, the sweep `sweep.rs`.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use settle_core::{Key, Limits, TenantId, Timestamp};
use settle_ledger::Clock;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::known::Known;
use crate::session::Seen;
use crate::sql::Sql;
use crate::tls::Tls;
use crate::{PgError, PgOptions};

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
    /// How to open a connection outside the pools (an export's own).
    pub cfg: tokio_postgres::Config,
    /// With or without TLS, as the pools' connections.
    pub tls: Tls,
    /// What the one-round-trip path decides on (`known.rs`).
    pub known: Known,
}

impl Inner {
    pub fn new(
        pool: Pool,
        doubt_pool: Pool,
        seen: Seen,
        cfg: tokio_postgres::Config,
        tls: Tls,
        opts: PgOptions,
    ) -> Inner {
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
            cfg,
            tls,
            known: Known::new(opts.group_commit && opts.one_round_trip),
        }
    }

    pub(crate) fn undecodable(&self) -> std::sync::MutexGuard<'_, HashSet<(TenantId, Key)>> {
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
    /// `prepare` with the parameters' types given.
    pub(crate) async fn prepare_typed(
        &self,
        sql: &str,
        types: &[tokio_postgres::types::Type],
    ) -> Result<tokio_postgres::Statement, PgError> {
        Ok(self
            .within(self.obj().prepare_typed_cached(sql, types))
            .await??)
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
/// `fsync/synchronous_commit[/standby]` as read inside it (after `SET
/// LOCAL`). Whether a synchronous standby must confirm commits: then a
/// commit may be visible before it is confirmed (a cancelled wait, a
/// crash-restart of the primary), and an answer read from it waits for a
/// commit of its own ([`answers_a_commit`]).
pub(crate) fn check_durability(durability: &str) -> Result<bool, PgError> {
    match durability {
        "on/on" => Ok(false),
        "on/on/standby" => Ok(true),
        other => Err(PgError::NotDurable(format!(
            "a transaction ran with fsync/synchronous_commit = {other}: its commit would \
             not survive a crash; settle refuses to serve until both are on"
        ))),
    }
}

/// Runs a read-only query with the transient-error retry policy. `f` owns
/// the connection and marks it reusable when it is done with it.
pub(crate) async fn read<T, F, Fut>(inner: &Inner, f: F) -> Result<T, PgError>
where
    F: Fn(Conn) -> Fut,
    Fut: Future<Output = Result<T, PgError>>,
{
    read_on(inner, &inner.pool, f).await
}

pub(crate) async fn read_on<T, F, Fut>(inner: &Inner, pool: &Pool, f: F) -> Result<T, PgError>
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

/// Whether a reply tells its caller that an outcome committed (a replay,
/// a receipt). Given without a write of its own, such a reply was read
/// from a commit; when a synchronous standby is required it is answered
/// only after a commit of its own has been confirmed (that commit is later
/// in the WAL, so the one read is confirmed too): a failover must not lose
/// what a replay already told (issue 50; `tests/crash.rs`,
/// `a_replay_is_never_answered_from_a_commit_the_standby_has_not_confirmed`).
pub(crate) fn answers_a_commit(reply: &settle_core::Reply) -> bool {
    use settle_core::{ClaimDecision, Reply};
    matches!(
        reply,
        Reply::Claim(ClaimDecision::Replay { .. }) | Reply::Receipt(_)
    )
}
