//! # settle-pg: the PostgreSQL store
//!
//! Several `settle` servers share one PostgreSQL database. Every decision
//! is made by [`settle_core::apply`]; this crate only loads, locks and
//! persists. The locking path runs one transaction per command:
//!
//! 1. Lock the principals the command needs (transaction-scoped advisory
//!    locks, shared to read a generation, exclusive to move it), then the
//!    target row (`INSERT … ON CONFLICT DO NOTHING` of a placeholder for a
//!    key that may not exist yet, then `SELECT … FOR UPDATE`).
//! 2. In the same round trip, read the principal rows, the database clock
//!    (`clock_timestamp()`), the transaction id (for in-doubt commits) and,
//!    for a claim, the next fence from a sequence — all after the locks.
//! 3. Call the core, then send the writes and `COMMIT` in one round trip,
//!    with `synchronous_commit=on` forced on every connection.
//! 4. Answer only after `COMMIT` returned. A connection lost during the
//!    commit is resolved with `pg_xact_status` on a fresh connection: the
//!    reply is returned only if the transaction is known to have committed.
//!
//! With group commit (the default, [`PgOptions::group_commit`]), concurrent
//! claims and settlements share one transaction: the same principal locks,
//! records read from one snapshot and written compare-and-set on `xmin`,
//! one COMMIT, and every command answered after it (see `batch.rs`).
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

mod batch;
pub mod bench;
mod codec;
mod engine;
mod lock;
mod schema;
mod sql;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use settle_core::{
    Command, Key, Limits, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning,
};
use settle_ledger::{BoxFuture, Clock, Store, StoreError, StoreStats, SweepReport};
use tokio_postgres::NoTls;

pub use codec::FORMAT_POSTCARD_V1;
pub use schema::SCHEMA_VERSION;

/// How to run the PostgreSQL store.
#[derive(Clone, Debug)]
pub struct PgOptions {
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
    pub connect_timeout: Duration,
    /// How long to keep asking whether an in-doubt commit committed.
    pub in_doubt_timeout: Duration,
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
            in_doubt_timeout: Duration::from_secs(10),
            max_retries: 5,
            group_commit: true,
            group_commit_workers: 1,
            max_batch: 64,
        }
    }
}

/// What went wrong talking to PostgreSQL. Callers of [`Store`] see it as a
/// [`StoreError`]: never a receipt.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("invalid PostgreSQL URL: {0}")]
    Url(String),
    #[error("invalid schema name {0:?}: use lowercase ASCII letters, digits and '_' (at most 63)")]
    Schema(String),
    #[error("invalid option: {0}")]
    Option(String),
    #[error("connection pool: {0}")]
    Pool(String),
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("the schema is at version {found}; this build supports up to {supported}")]
    SchemaTooNew { found: i32, supported: i32 },
    /// The connection died while COMMIT was in flight and its outcome could
    /// not be learned in time. The command may or may not have taken effect;
    /// retrying it is safe (the rules make every call idempotent or refuse it).
    #[error("commit outcome unknown (transaction {xid}): {reason}")]
    InDoubt { xid: i64, reason: String },
    /// A concurrent transaction created a row this one needed; run again.
    #[error("raced with a concurrent insert of {0}")]
    Raced(String),
    #[error("gave up after {0} attempts: {1}")]
    Exhausted(u32, String),
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> StoreError {
        match e {
            PgError::Corrupt(m) => StoreError::Corrupt(m),
            other => StoreError::Database(other.to_string()),
        }
    }
}

/// The PostgreSQL [`Store`]. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<engine::Inner>,
    batcher: Option<Arc<batch::Batcher>>,
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
    /// database can be written.
    pub async fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        Ok(PgStore::open(url, opts).await?)
    }

    async fn open(url: &str, opts: PgOptions) -> Result<PgStore, PgError> {
        if !valid_schema(&opts.schema) {
            return Err(PgError::Schema(opts.schema));
        }
        if opts.pool_size == 0 {
            return Err(PgError::Option("pool_size must be at least 1".into()));
        }
        let mut cfg =
            tokio_postgres::Config::from_str(url).map_err(|e| PgError::Url(e.to_string()))?;
        // Durability is this store's contract, whatever the server's default:
        // COMMIT returns only after the WAL is flushed (and, with a
        // synchronous standby configured, acknowledged by it).
        // Every statement of the store is a key lookup. Prepared statements
        // keep their plan; one planned while a table was nearly empty would
        // otherwise stay a sequential scan as the table grows (until the
        // next ANALYZE), so sequential scans are priced out.
        let options = format!(
            "{} -c synchronous_commit=on -c enable_seqscan=off",
            cfg.get_options().unwrap_or_default()
        );
        cfg.options(options.trim())
            .application_name(&opts.application_name)
            .connect_timeout(opts.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));

        let mut client = {
            let (client, conn) = cfg.connect(NoTls).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        };
        schema::migrate(&mut client, &opts.schema).await?;
        drop(client);

        let mgr = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                // Dead connections (terminated backend, restart) report
                // `is_closed` and are dropped when handed back or taken out.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(opts.pool_size)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(opts.connect_timeout))
            .wait_timeout(Some(opts.connect_timeout * 6))
            .build()
            .map_err(|e| PgError::Pool(e.to_string()))?;
        let group = opts
            .group_commit
            .then_some((opts.group_commit_workers, opts.max_batch));
        let inner = Arc::new(engine::Inner::new(pool, opts));
        let batcher = group.map(|(w, m)| Arc::new(batch::Batcher::start(inner.clone(), w, m)));
        Ok(PgStore { inner, batcher })
    }

    /// The connection pool (for operators and tests).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The schema this store uses.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Closes the pool: in-flight commands finish, later ones fail.
    pub fn close(&self) {
        self.inner.pool.close();
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
            && batch::batchable(&cmd)
        {
            let b = b.clone();
            return Box::pin(async move { b.submit(tenant, cmd).await });
        }
        Box::pin(async move {
            // Run to completion even if the caller goes away: a transaction
            // is never abandoned halfway on a pooled connection.
            tokio::spawn(async move { engine::execute(&inner, &tenant, &cmd).await })
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
        Box::pin(async move { Ok(engine::get(&self.inner, tenant, key).await?) })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async move { Ok(engine::warnings(&self.inner, tenant, task).await?) })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move { Ok(engine::sweep(&self.inner).await?) })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move { Ok(engine::stats(&self.inner, stuck_after_ms).await?) })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(engine::now(&self.inner).await?) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            engine::now(&self.inner)
                .await
                .map(|_| ())
                .map_err(Into::into)
        })
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
