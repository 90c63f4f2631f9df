//! Test databases: one uniquely named schema per test, dropped afterwards
//! (also when the test panics), on the PostgreSQL of DEVELOPERS.md.
#![allow(clippy::print_stderr)] // test support reports what it waits for
#![allow(dead_code)]

pub mod cluster;
pub mod proxy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use settle_core::testkit::{binding, claim};
use settle_core::{ClaimDecision, Fence, Reply, TenantId};
use settle_ledger::conformance::Fixture;
use settle_ledger::{Clock, Store};
use settle_pg::{PgOptions, PgStore};
use tokio_postgres::NoTls;

/// The tenant of these tests.
pub fn acme() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// Claims `k` (fingerprint 1, alice) and expects `execute`; returns the fence.
pub async fn exec_fence(store: &PgStore, k: &str) -> Fence {
    match store
        .execute(&acme(), claim(k, 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("expected execute, got {other:?}"),
    }
}

/// The record of `k` (it must exist).
pub async fn record(store: &PgStore, k: &str) -> settle_core::Record {
    store
        .get(&acme(), &settle_core::testkit::key(k))
        .await
        .unwrap()
        .unwrap()
        .expect("record exists")
}

/// `SETTLE_TEST_PG_URL`, or the local test database.
pub fn url() -> String {
    std::env::var("SETTLE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A fresh schema name: process, counter and time make it unique across
/// parallel tests and test binaries.
pub fn unique_schema(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "t_{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Drops its schema (and ends its connections) when dropped.
pub struct SchemaGuard {
    pub url: String,
    pub schema: String,
}

impl SchemaGuard {
    pub fn new(url: &str, schema: &str) -> SchemaGuard {
        SchemaGuard {
            url: url.to_string(),
            schema: schema.to_string(),
        }
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        // Drop runs inside the test's runtime, which cannot be blocked on:
        // clean up from a thread with its own runtime.
        let r = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
                tokio::spawn(conn);
                // The store's connections carry the schema as application_name;
                // ending them releases any lock a panicking test left behind.
                client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name = $1 AND pid <> pg_backend_pid()",
                        &[&schema],
                    )
                    .await?;
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await?;
                Ok::<_, tokio_postgres::Error>(())
            })
        })
        .join();
        if let Ok(Err(e)) = r {
            eprintln!("could not drop test schema {}: {e}", self.schema);
        }
    }
}

/// Ends every connection of the store on `schema`; returns how many.
pub async fn terminate_store_backends(side: &tokio_postgres::Client, schema: &str) -> Vec<i32> {
    side.query(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        &[&schema],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, i32>(0))
    .collect()
}

/// The pids of the store's connections.
pub async fn store_backends(side: &tokio_postgres::Client, schema: &str) -> Vec<i32> {
    side.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
        &[&schema],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, i32>(0))
    .collect()
}

/// Options for a test store on `schema`.
pub fn options(schema: &str, clock: Clock) -> PgOptions {
    PgOptions {
        clock,
        pool_size: 8,
        schema: schema.to_string(),
        application_name: schema.to_string(),
        in_doubt_timeout: Duration::from_secs(10),
        ..PgOptions::default()
    }
}

/// A store on a fresh schema, with the guard that drops it.
pub async fn store(prefix: &str) -> (PgStore, Clock, SchemaGuard) {
    store_at(&url(), prefix).await
}

pub async fn store_at(url: &str, prefix: &str) -> (PgStore, Clock, SchemaGuard) {
    store_with(url, prefix, |_| {}).await
}

/// A store on a fresh schema through `url`, with adjusted options.
pub async fn store_with(
    url: &str,
    prefix: &str,
    adjust: impl FnOnce(&mut PgOptions),
) -> (PgStore, Clock, SchemaGuard) {
    let schema = unique_schema(prefix);
    // The guard exists before the schema does: a failed connect still cleans up.
    let guard = SchemaGuard::new(&self::url(), &schema);
    let clock = Clock::system();
    let mut opts = options(&schema, clock.clone());
    adjust(&mut opts);
    let store = PgStore::connect(url, opts)
        .await
        .expect("PostgreSQL is reachable (see DEVELOPERS.md)");
    (store, clock, guard)
}

/// The conformance fixture: a fresh store, its clock, and the schema guard.
pub async fn fixture(group_commit: bool) -> Fixture {
    let (store, clock, guard) = store_with(&url(), "conf", |o| o.group_commit = group_commit).await;
    let mut fx = Fixture::new(Arc::new(store), clock);
    fx.guard = Some(Box::new(guard));
    fx
}

/// A plain connection for inspecting or sabotaging from the side.
pub async fn side_client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// A store on `schema` of the database at `url` (a throwaway cluster: no
/// guard, the cluster goes away with the test).
pub async fn store_on(url: &str, schema: &str, adjust: impl FnOnce(&mut PgOptions)) -> PgStore {
    let mut opts = options(schema, Clock::system());
    adjust(&mut opts);
    PgStore::connect(url, opts)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}
