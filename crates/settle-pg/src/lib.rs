//! # settle-pg: the PostgreSQL store
//!
//! Several `settle` servers share one PostgreSQL database. Every decision
//! is made by [`settle_core::apply`]; this crate only loads, locks and
//! persists. A command is first validated against the store's limits (an
//! invalid one is answered without touching the database). The per-command
//! path (`command.rs`) then runs one transaction per command:
//!
//! 1. Lock the principals the command needs (transaction-scoped advisory
//!    locks, shared to read a generation, exclusive to move it), then the
//!    target row (`INSERT … ON CONFLICT DO NOTHING` of a placeholder for a
//!    key that may not exist yet, then `SELECT … FOR UPDATE`).
//! 2. In the same round trip, read the principal rows, the database clock
//!    (`clock_timestamp()`), the durability settings in force and, for a
//!    claim, the next fence from a sequence — all after the locks. Every
//!    transaction sets `synchronous_commit=on` and its timeouts itself
//!    (`SET LOCAL`) and is refused unless `fsync` and `synchronous_commit`
//!    read back `on`.
//! 3. Call the core, then send the writes, a unique commit token and
//!    `COMMIT` in one round trip.
//! 4. Answer only after `COMMIT` returned. A COMMIT whose answer is lost
//!    (connection dropped, silent past `client_timeout`) is resolved on a
//!    reserved connection by its token — never by transaction id, which
//!    PostgreSQL reuses after a crash: the reply is returned only if the
//!    token shows the transaction committed, and after a later commit of
//!    the probe's own made that durable; otherwise `StoreError::InDoubt`.
//!
//! With group commit (the default, [`PgOptions::group_commit`]), concurrent
//! claims and settlements share one transaction: the same principal locks,
//! records read from one snapshot and written compare-and-set on `xmin`,
//! one COMMIT, and every command answered after it (the group-commit path,
//! `group_commit/`, one file per phase).
//!
//! Export and import (SPEC §12): [`Store::export`] streams one consistent
//! snapshot (a `REPEATABLE READ` transaction on a connection of its own,
//! read through cursors in the portable format's bytewise order) while
//! writes go on; [`import()`] loads a verified export file into an empty
//! schema in one transaction and moves the fence sequence past every
//! fence the file saw.
//!
//! TLS (SPEC §12): the URL's `sslmode` (`disable`, `prefer`, `require`,
//! `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file of CA
//! certificates, or `system`) are read by settle with libpq's meaning and
//! used through rustls (ring); a URL without `sslmode` connects without
//! TLS, as it always did, and runs no TLS code. `sslmode=allow` and
//! `sslrootcert` without `sslmode` are refused ([`TlsError`]). The exact
//! semantics, and where they differ from libpq: `src/tls.rs`.
//!
//! See `docs/postgres.md` for the locking argument, the in-doubt commit
//! handling, the schema and the benchmark.
//!
//! ```no_run
//! # async fn demo() -> Result<(), settle_ledger::StoreError> {
//! use std::sync::Arc;
//! let store = settle_pg::PgStore::connect_url("postgres://postgres@127.0.0.1/settle").await?;
//! let ledger = settle_ledger::Ledger::new(Arc::new(store));
//! # let _ = ledger; Ok(()) }
//! ```

#[cfg(not(feature = "fuzzing"))]
mod codec;
// The fuzz targets (fuzz/, docs/testing.md) decode stored rows from
// arbitrary bytes; the row codec stays private otherwise.
mod bugs;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod codec;
mod command;
mod doubt;
mod export;
mod group_commit;
mod import;
mod known;
mod lock;
mod reads;
mod rows;
mod schema;
mod session;
mod sql;
mod state;
mod sweep;
mod tls;

#[cfg(test)]
mod format_tests;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use settle_core::{
    Command, Key, Limits, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning,
};
use settle_ledger::inspect::Scan;
use settle_ledger::{BoxFuture, Clock, Snapshot, Store, StoreError, StoreStats, SweepReport};

pub use codec::{FORMAT, FORMAT_POSTCARD_V1, FORMAT_POSTCARD_V2, FORMAT_POSTCARD_V3};
pub use import::import;
pub use schema::SCHEMA_VERSION;
pub use tls::TlsError;

/// How to run the PostgreSQL store.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The rules' limits (lease margin, warning cap, result size).
    pub limits: Limits,
    /// `now` = the database clock + `clock.skew_ms()` (tests move it).
    pub clock: Clock,
    /// Connections in the pool (each command holds one for its transaction).
    pub pool_size: usize,
    /// The schema holding settle's tables; created at connect. Lowercase
    /// ASCII letters, digits and `_`, starting with a letter or `_`.
    pub schema: String,
    /// Shown in `pg_stat_activity`.
    pub application_name: String,
    /// How long connecting (and preparing a new connection) may take.
    pub connect_timeout: Duration,
    /// How long to keep asking whether an in-doubt commit committed (at
    /// most 2 minutes). Keep it above `idle_in_transaction_timeout`: a
    /// COMMIT that never reached the server is known to have failed only
    /// once the server ended that session.
    pub in_doubt_timeout: Duration,
    /// Server-side `statement_timeout` of every statement. PostgreSQL lifts
    /// it before the commit itself, so it never cuts short a COMMIT waiting
    /// for a synchronous standby (which would keep the commit "locally").
    pub statement_timeout: Duration,
    /// Server-side `lock_timeout`: a command waiting longer for a row or
    /// principal lock fails (and is retried, up to `max_retries`).
    pub lock_timeout: Duration,
    /// Server-side `idle_in_transaction_session_timeout`: a session whose
    /// client went silent in the middle of a transaction is ended, and its
    /// locks released, after this long.
    pub idle_in_transaction_timeout: Duration,
    /// Client-side deadline of each round trip (COMMIT included): past it
    /// the connection is dropped, and a COMMIT in flight is resolved as in
    /// doubt. Covers what the server-side timeouts cannot: a silent network.
    pub client_timeout: Duration,
    /// Connections reserved for resolving in-doubt commits (and for
    /// `health`), so that those checks never queue behind commands in the pool.
    pub in_doubt_connections: usize,
    /// Retries of a command that failed before its commit was sent
    /// (lost connection, deadlock, serialization failure).
    pub max_retries: u32,
    /// Group commit: concurrent claims and settlements share one
    /// transaction (and one WAL flush). Each command stays atomic and is
    /// answered only after the shared COMMIT. Off: one transaction each.
    pub group_commit: bool,
    /// Transactions of grouped commands in flight at once. One keeps the
    /// batches largest (best at 8–32 clients on a 2-core machine); two
    /// overlap a batch's reads with another's commit (better from ~64).
    pub group_commit_workers: usize,
    /// At most this many commands per grouped transaction.
    pub max_batch: usize,
    /// Commands waiting for group commit at most; past it calls answer
    /// `StoreError::Overloaded` (503 with Retry-After) instead of queueing.
    pub group_commit_queue: usize,
    /// Group commit in one round trip when it can: a batch whose records,
    /// principals, clock and fences this process already knows (a claim of
    /// a key it has not seen, a settlement of a record it last wrote) is
    /// decided without reading, and its write checks all of that under the
    /// batch's locks; any failed check falls back to the two-round-trip
    /// path (docs/postgres.md, "The one-round-trip path").
    pub one_round_trip: bool,
}

/// The most any timeout may be: commit tokens are kept far longer
/// (`sweep::TOKEN_RETENTION_MS`) than a transaction can outlive its client.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);

impl PgOptions {
    pub(crate) fn settings(&self) -> sql::Settings {
        let ms = |d: Duration| d.as_millis() as u64;
        sql::Settings {
            statement_timeout_ms: ms(self.statement_timeout),
            lock_timeout_ms: ms(self.lock_timeout),
            idle_in_transaction_timeout_ms: ms(self.idle_in_transaction_timeout),
            // A probe that meets the interrupted transaction still running
            // gives up soon and asks again.
            probe_lock_timeout_ms: ms(self.lock_timeout.min(Duration::from_millis(500))),
        }
    }

    fn validate(&self) -> Result<(), PgError> {
        if self.pool_size == 0 {
            return Err(PgError::Option("pool_size must be at least 1".into()));
        }
        if self.in_doubt_connections == 0 {
            return Err(PgError::Option(
                "in_doubt_connections must be at least 1".into(),
            ));
        }
        if self.group_commit_queue == 0 {
            return Err(PgError::Option(
                "group_commit_queue must be at least 1".into(),
            ));
        }
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("in_doubt_timeout", self.in_doubt_timeout),
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            (
                "idle_in_transaction_timeout",
                self.idle_in_transaction_timeout,
            ),
            ("client_timeout", self.client_timeout),
        ] {
            // 0 would mean "no timeout" to PostgreSQL: never.
            if d < Duration::from_millis(1) || d > MAX_TIMEOUT {
                return Err(PgError::Option(format!(
                    "{name} must be between 1 ms and {} s, not {d:?}",
                    MAX_TIMEOUT.as_secs()
                )));
            }
        }
        Ok(())
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            limits: Limits::default(),
            clock: Clock::system(),
            pool_size: 16,
            schema: "settle".to_string(),
            application_name: "settle".to_string(),
            connect_timeout: Duration::from_secs(5),
            in_doubt_timeout: Duration::from_secs(15),
            statement_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            client_timeout: Duration::from_secs(15),
            in_doubt_connections: 1,
            max_retries: 5,
            group_commit: true,
            group_commit_workers: 1,
            max_batch: 64,
            group_commit_queue: 4096,
            one_round_trip: true,
        }
    }
}

/// What went wrong talking to PostgreSQL. Callers of [`Store`] see it as a
/// [`StoreError`]: never a receipt.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The connection URL does not parse; nothing was connected.
    #[error("invalid PostgreSQL URL: {0}")]
    Url(String),
    /// The URL's TLS parameters (`sslmode`, `sslrootcert`) cannot be
    /// used; nothing was connected.
    #[error("PostgreSQL TLS: {0}")]
    Tls(#[from] TlsError),
    /// [`PgOptions::schema`] is not a valid schema name.
    #[error("invalid schema name {0:?}: use lowercase ASCII letters, digits and '_' (at most 63)")]
    Schema(String),
    /// An option is out of range (the message names it).
    #[error("invalid option: {0}")]
    Option(String),
    /// The connection pool could not be built or failed otherwise.
    #[error("connection pool: {0}")]
    Pool(String),
    /// Every pooled connection stayed busy for the whole wait (`client_timeout`).
    #[error("every pooled connection stayed busy for the whole wait")]
    Busy,
    /// A round trip got no answer within this client-side deadline
    /// (`client_timeout`); the connection is not used again.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server does not store commits durably; nothing was written.
    #[error("not durable: {0}")]
    NotDurable(String),
    /// The server is a standby in recovery: it accepts no writes.
    #[error("the database accepts no writes: {0}")]
    NotWritable(String),
    /// The database (or the connection to it) reported an error.
    #[error("database: {}", db_message(.0))]
    Db(#[from] tokio_postgres::Error),
    /// A stored row does not decode; the command fails closed.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The schema was migrated by a newer build; this one refuses it rather
    /// than misread it.
    #[error("the schema is at version {found}; this build supports up to {supported}")]
    SchemaTooNew {
        /// The schema version in the database.
        found: i32,
        /// The newest schema version this build knows ([`SCHEMA_VERSION`]).
        supported: i32,
    },
    /// The connection died while COMMIT was in flight and its outcome could
    /// not be learned in time. The command may or may not have taken effect;
    /// retrying it is safe (the rules make every call idempotent or refuse it).
    #[error("commit outcome unknown: {reason}")]
    InDoubt {
        /// Why the outcome could not be learned.
        reason: String,
    },
    /// COMMIT's answer was lost, and its token shows it did not commit.
    #[error("the commit did not happen: {0}")]
    NotCommitted(String),
    /// A concurrent transaction created a row this one needed; run again.
    #[error("raced with a concurrent insert of {0}")]
    Raced(String),
    /// A command failed on every try: the count, and the last error (retries
    /// after transient errors, or re-locks because the record's principal moved).
    #[error("gave up after {0} attempts: {1}")]
    Exhausted(u32, String),
}

/// The server's message and SQLSTATE (tokio-postgres shows only "db error");
/// never its DETAIL, which can carry row values. Other errors with their
/// causes (tokio-postgres shows only "error performing TLS handshake", not
/// which certificate check failed, nor why connecting failed).
fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => with_causes(e),
    }
}

/// `e`, then each of its causes after a colon.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> StoreError {
        match e {
            PgError::Corrupt(m) => StoreError::Corrupt(m),
            PgError::InDoubt { reason } => StoreError::InDoubt(reason),
            PgError::Busy => StoreError::Overloaded {
                retry_after_ms: 1000,
            },
            other => StoreError::Database(other.to_string()),
        }
    }
}

/// COMMITs whose answer was lost, by how their token resolved them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InDoubtCounts {
    /// Found committed (the reply was returned).
    pub committed: u64,
    /// Found not committed (the command ran again).
    pub not_committed: u64,
    /// Not known within `in_doubt_timeout`: the caller got `InDoubt`.
    pub unresolved: u64,
}

/// The PostgreSQL [`Store`]. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<state::Inner>,
    batcher: Option<Arc<group_commit::Batcher>>,
}

fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

impl PgStore {
    /// Connects with the default options (schema `settle`, pool of 16).
    pub async fn connect_url(url: &str) -> Result<PgStore, StoreError> {
        PgStore::connect(url, PgOptions::default()).await
    }

    /// Connects, applies pending schema migrations, and checks that the
    /// database can be written. `url` is a PostgreSQL URL (or key/value
    /// string), `sslmode` and `sslrootcert` included (module docs, TLS).
    pub async fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        Ok(PgStore::open(url, opts).await?)
    }

    async fn open(url: &str, opts: PgOptions) -> Result<PgStore, PgError> {
        let (cfg, tls, seen) = prepare(url, &opts).await?;
        let pool = build_pool(&cfg, &tls, &opts, opts.pool_size, &seen)?;
        let doubt_pool = build_pool(&cfg, &tls, &opts, opts.in_doubt_connections, &seen)?;
        let group = opts.group_commit.then_some((
            opts.group_commit_workers,
            opts.max_batch,
            opts.group_commit_queue,
        ));
        let inner = Arc::new(state::Inner::new(pool, doubt_pool, seen, cfg, tls, opts));
        let batcher =
            group.map(|(w, m, q)| Arc::new(group_commit::Batcher::start(inner.clone(), w, m, q)));
        Ok(PgStore { inner, batcher })
    }

    /// Group-commit batches committed in one round trip, and batches whose
    /// one-round-trip write failed a check (something changed since this
    /// process last saw it) and that ran on the two-round-trip path.
    pub fn one_round_trip_batches(&self) -> (u64, u64) {
        self.inner.known.counts()
    }

    /// Group-commit batches sent on the one-round-trip path, whatever
    /// became of them: committed, fell back, failed, or in doubt (a lost
    /// COMMIT answer resolved either way).
    pub fn one_round_trip_sent(&self) -> u64 {
        self.inner.known.sent()
    }

    /// The connection pool (for operators and tests).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The schema this store uses.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// How the in-doubt commits of this store ended so far.
    pub fn in_doubt(&self) -> InDoubtCounts {
        let n = |i: usize| self.inner.in_doubt[i].load(std::sync::atomic::Ordering::Relaxed);
        InDoubtCounts {
            committed: n(0),
            not_committed: n(1),
            unresolved: n(2),
        }
    }

    /// Closes the pools: in-flight commands finish, later ones fail.
    pub fn close(&self) {
        self.inner.pool.close();
        self.inner.doubt_pool.close();
    }
}

/// What opening a store and an import share: checks the options, builds
/// the connection configuration (TLS included: `tls.rs`), refuses a server
/// that does not flush its commits, and brings the schema to
/// [`SCHEMA_VERSION`].
async fn prepare(
    url: &str,
    opts: &PgOptions,
) -> Result<(tokio_postgres::Config, tls::Tls, session::Seen), PgError> {
    Checked::connect(url, opts).await?.migrate(opts).await
}

/// A session to a server that was checked (options, TLS, durability) and
/// whose schema was not touched yet: an import looks at the target first.
pub(crate) struct Checked {
    cfg: tokio_postgres::Config,
    tls: tls::Tls,
    seen: session::Seen,
    pub(crate) client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Checked {
    /// Everything [`prepare`] does but the migration.
    pub(crate) async fn connect(url: &str, opts: &PgOptions) -> Result<Checked, PgError> {
        if !valid_schema(&opts.schema) {
            return Err(PgError::Schema(opts.schema.clone()));
        }
        opts.validate()?;
        let (mut cfg, tls) = tls::config(url)?;
        // Durability and the timeouts are set per transaction (SET LOCAL),
        // where no pooler can drop them, and verified inside it; the
        // startup option is only a default for anything else.
        // Every statement of the store is a key lookup. Prepared statements
        // keep their plan; one planned while a table was nearly empty would
        // otherwise stay a sequential scan as the table grows (until the
        // next ANALYZE), so sequential scans are priced out. Generic plans
        // always: the group-commit statements take arrays, for which the
        // planner's default kept re-planning every execution (0.25-0.45 ms of
        // a 1 ms command at one client, measured from the server's log).
        let options = format!(
            "{} -c synchronous_commit=on -c enable_seqscan=off -c plan_cache_mode=force_generic_plan",
            cfg.get_options().unwrap_or_default()
        );
        cfg.options(options.trim())
            .application_name(&opts.application_name)
            .connect_timeout(opts.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));

        let seen = session::Seen::default();
        // Every round trip bounded: a database that hangs (a COMMIT
        // waiting for an absent synchronous standby) fails `connect`.
        let d = opts.client_timeout;
        let (client, task) = session::connect(&cfg, &tls).await?;
        let server = tokio::time::timeout(d, session::Server::read(&client, sql::SERVER))
            .await
            .map_err(|_| PgError::Timeout(d))??;
        if let Some(refusal) = server.refusal() {
            return Err(PgError::NotDurable(refusal));
        }
        seen.set(server);
        Ok(Checked {
            cfg,
            tls,
            seen,
            client,
            task,
        })
    }

    /// Brings the schema to [`SCHEMA_VERSION`] and ends the session.
    pub(crate) async fn migrate(
        mut self,
        opts: &PgOptions,
    ) -> Result<(tokio_postgres::Config, tls::Tls, session::Seen), PgError> {
        schema::migrate(&mut self.client, &opts.schema, opts.client_timeout).await?;
        drop(self.client);
        let _ = self.task.await;
        Ok((self.cfg, self.tls, self.seen))
    }
}

/// A pool whose every new connection is watched (`session::Connector`) and
/// checked: a server running with `fsync=off` is refused.
fn build_pool(
    cfg: &tokio_postgres::Config,
    tls: &tls::Tls,
    opts: &PgOptions,
    size: usize,
    seen: &session::Seen,
) -> Result<Pool, PgError> {
    let mgr = Manager::from_connect(
        cfg.clone(),
        session::Connector(tls.clone()),
        ManagerConfig {
            // Dead connections (terminated backend, restart) report
            // `is_closed` and are dropped when handed back or taken out.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let seen = seen.clone();
    let timeout = opts.client_timeout;
    Pool::builder(mgr)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(opts.connect_timeout))
        .wait_timeout(Some(opts.client_timeout))
        .post_create(Hook::async_fn(move |client, _| {
            let seen = seen.clone();
            Box::pin(async move {
                let server =
                    tokio::time::timeout(timeout, session::Server::read(client, sql::SERVER))
                        .await
                        .map_err(|_| HookError::message("the new connection did not answer"))?
                        .map_err(HookError::Backend)?;
                if let Some(refusal) = server.refusal() {
                    tracing::error!(%refusal, "refusing a connection");
                    return Err(HookError::message(refusal));
                }
                seen.set(server);
                Ok(())
            })
        }))
        .build()
        .map_err(|e| PgError::Pool(e.to_string()))
}

impl PgError {
    pub(crate) fn from_pool(e: PoolError) -> PgError {
        match e {
            PoolError::Timeout(TimeoutType::Wait) => PgError::Busy,
            // A connection that cannot be made is a database error (and
            // transient: the command is retried a few times).
            PoolError::Backend(e) => PgError::Db(e),
            PoolError::PostCreateHook(HookError::Backend(e)) => PgError::Db(e),
            PoolError::PostCreateHook(HookError::Message(m)) => PgError::NotDurable(m.into()),
            other => PgError::Pool(other.to_string()),
        }
    }
}

impl Store for PgStore {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        let inner = self.inner.clone();
        let tenant = tenant.clone();
        if let Some(b) = &self.batcher
            && group_commit::batchable(&cmd)
        {
            let b = b.clone();
            return Box::pin(async move { b.submit(tenant, cmd).await });
        }
        Box::pin(async move {
            // Run to completion even if the caller goes away: a transaction
            // is never abandoned halfway on a pooled connection.
            tokio::spawn(async move { command::execute(&inner, &tenant, &cmd).await })
                .await
                .map_err(|e| StoreError::Database(format!("command task failed: {e}")))?
                .map_err(StoreError::from)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async move { Ok(reads::get(&self.inner, tenant, key).await?) })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async move { Ok(reads::warnings(&self.inner, tenant, task).await?) })
    }

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        Box::pin(async move { Ok(Ok(reads::generation(&self.inner, tenant, principal).await?)) })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move { Ok(sweep::sweep(&self.inner).await?) })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move { Ok(reads::stats(&self.inner, stuck_after_ms).await?) })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(reads::now(&self.inner).await?) })
    }

    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        Box::pin(async move { Ok(reads::scan(&self.inner, tenant, after, max).await?) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { Ok(reads::health(&self.inner).await?) })
    }

    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move { Ok(export::export(&self.inner).await?) })
    }

    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(export::fence_floor(&self.inner).await?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(valid_schema("settle"));
        assert!(valid_schema("t_1"));
        assert!(!valid_schema("1t"));
        assert!(!valid_schema("Settle"));
        assert!(!valid_schema("a\"b"));
        assert!(!valid_schema(""));
        assert!(!valid_schema(&"a".repeat(64)));
    }
}
