//! settle on PostgreSQL against the raw protocol (`bench/pg-baseline.sql`),
//! in the same run, on the same driver (tokio-postgres + deadpool, prepared
//! statements, `synchronous_commit=on`, one pooled connection per command).
//!
//! - **baseline**: the raw protocol without settle's rules, two autocommit
//!   statements per pair: `INSERT … ON CONFLICT DO NOTHING RETURNING
//!   fence` (claim, fence from a sequence) and `UPDATE … WHERE fence =
//!   $fence AND status = 0` (settle);
//! - **settle**: the generic pair loop over a `PgStore` (claim + settle
//!   through the core, locked transactions).
//!
//! Each run uses scratch schemas, dropped afterwards.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use settle_core::TenantId;
use settle_ledger::bench::{BenchError, Limit, PairStats, PairWorker, run_pairs, run_workers};
use settle_pg::{PgOptions, PgStore};
use tokio_postgres::NoTls;

/// Why a PostgreSQL benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum PgBenchError {
    #[error("invalid PostgreSQL URL: {0}")]
    Url(tokio_postgres::Error),
    #[error("benchmark database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("benchmark database: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("benchmark database: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    #[error("settle on PostgreSQL: {0}")]
    Settle(#[from] BenchError),
    #[error("cannot open the settle store: {0}")]
    Store(#[from] settle_ledger::StoreError),
    /// The raw protocol's fence check refused the pair's own settle: the
    /// scratch tables were not fresh.
    #[error("the baseline's fence check refused a fresh pair ({0})")]
    FenceCheck(String),
}

/// A pool with the store's session settings.
fn pool(url: &str, size: usize) -> Result<Pool, PgBenchError> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(PgBenchError::Url)?;
    // The same session settings as the store (see PgStore::connect).
    cfg.options("-c synchronous_commit=on -c enable_seqscan=off")
        .application_name("settle-bench-baseline");
    let mgr = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(mgr)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .build()?)
}

async fn admin(url: &str, sql: &str) -> Result<(), PgBenchError> {
    let admin = pool(url, 1)?;
    admin.get().await?.batch_execute(sql).await?;
    Ok(())
}

const BASELINE_TABLES: &str = "
    CREATE SEQUENCE {s}.fence CACHE 1;
    CREATE TABLE {s}.ops (
        tenant text NOT NULL,
        key text NOT NULL,
        fence bigint NOT NULL,
        status smallint NOT NULL DEFAULT 0,
        result text,
        response_sha256 bytea,
        PRIMARY KEY (tenant, key)
    );";

/// One client of the raw protocol.
struct BaselineWorker {
    pool: Pool,
    claim: Arc<str>,
    settle: Arc<str>,
    w: usize,
}

impl PairWorker for BaselineWorker {
    type Error = PgBenchError;
    async fn call(&mut self, n: u64) -> Result<u64, PgBenchError> {
        let key = format!("bench-{}-{n}", self.w);
        let sha = vec![7u8; 32];
        let result = r#"{"charge":1}"#;
        // One pooled connection per statement, as settle takes one per command.
        let fence: i64 = {
            let c = self.pool.get().await?;
            let st = c.prepare_cached(&self.claim).await?;
            c.query_one(&st, &[&"bench", &key]).await?.get(0)
        };
        let c = self.pool.get().await?;
        let st = c.prepare_cached(&self.settle).await?;
        let rows = c
            .execute(&st, &[&"bench", &key, &fence, &result, &sha])
            .await?;
        if rows != 1 {
            return Err(PgBenchError::FenceCheck(key));
        }
        Ok(1)
    }
}

/// The raw protocol without settle's rules, autocommit, on fresh tables in
/// a scratch schema, for `duration` at `clients` clients.
pub async fn baseline(
    url: &str,
    clients: usize,
    duration: Duration,
) -> Result<PairStats, PgBenchError> {
    let schema = format!("bench_base_{}", std::process::id());
    admin(
        url,
        &format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; {}",
            BASELINE_TABLES.replace("{s}", &schema)
        ),
    )
    .await?;
    let pool = pool(url, clients)?;
    let claim: Arc<str> = format!(
        "INSERT INTO {schema}.ops (tenant, key, fence) VALUES ($1, $2, nextval('{schema}.fence')) \
         ON CONFLICT DO NOTHING RETURNING fence"
    )
    .into();
    let settle: Arc<str> = format!(
        "UPDATE {schema}.ops SET status = 4, result = $4, response_sha256 = $5 \
         WHERE tenant = $1 AND key = $2 AND fence = $3 AND status = 0"
    )
    .into();
    let workers = (0..clients.max(1))
        .map(|w| BaselineWorker {
            pool: pool.clone(),
            claim: claim.clone(),
            settle: settle.clone(),
            w,
        })
        .collect();
    let stats = run_workers(workers, Limit::For(duration), Arc::default()).await;
    pool.close();
    // The scratch schema goes even when the run failed.
    let dropped = admin(url, &format!("DROP SCHEMA {schema} CASCADE")).await;
    let stats = stats?;
    dropped?;
    Ok(stats)
}

/// settle's claim+settle pairs through a `PgStore` on a scratch schema.
pub async fn settle(
    url: &str,
    opts: &PgOptions,
    clients: usize,
    duration: Duration,
) -> Result<PairStats, PgBenchError> {
    let schema = format!("bench_settle_{}", std::process::id());
    admin(url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await?;
    let store = PgStore::connect(
        url,
        PgOptions {
            pool_size: clients.max(1),
            schema: schema.clone(),
            application_name: "settle-bench".into(),
            ..opts.clone()
        },
    )
    .await?;
    let store = Arc::new(store);
    let tenant = TenantId::new("bench").map_err(BenchError::from)?;
    let stats = run_pairs(
        store.clone(),
        tenant,
        "bench",
        clients,
        duration,
        Arc::new(AtomicU64::new(0)),
    )
    .await;
    store.close();
    let dropped = admin(url, &format!("DROP SCHEMA {schema} CASCADE")).await;
    let stats = stats?;
    dropped?;
    Ok(stats)
}

/// Merges slices: pairs and time add up; latency percentiles are the
/// pair-weighted means of the slices' percentiles (an approximation).
pub fn merge(v: &[PairStats]) -> Option<PairStats> {
    let first = *v.first()?;
    let pairs: u64 = v.iter().map(|s| s.pairs).sum();
    let secs: f64 = v.iter().map(|s| s.duration_s).sum();
    let w = |f: fn(&PairStats) -> f64| {
        v.iter().map(|s| f(s) * s.pairs as f64).sum::<f64>() / pairs.max(1) as f64
    };
    Some(PairStats {
        concurrency: first.concurrency,
        duration_s: secs,
        pairs,
        pairs_per_s: pairs as f64 / secs.max(1e-9),
        p50_ms: w(|s| s.p50_ms),
        p99_ms: w(|s| s.p99_ms),
        p999_ms: w(|s| s.p999_ms),
        max_ms: v.iter().map(|s| s.max_ms).fold(0.0, f64::max),
    })
}

/// Which sides a comparison runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sides {
    Both,
    Baseline,
    Settle,
}

/// What a comparison runs, besides the client counts.
#[derive(Clone, Debug)]
pub struct Plan {
    pub opts: PgOptions,
    pub duration: Duration,
    pub warmup: Duration,
    pub rounds: u32,
    pub sides: Sides,
}

/// Baseline and settle at one client count (either may be left out).
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    pub clients: usize,
    pub baseline: Option<PairStats>,
    pub settle: Option<PairStats>,
}

impl Comparison {
    /// settle pairs/s over baseline pairs/s, when both ran.
    pub fn ratio(&self) -> Option<f64> {
        let (b, s) = (self.baseline?, self.settle?);
        Some(s.pairs_per_s / b.pairs_per_s.max(1e-9))
    }
}

/// Runs both sides at `clients`: a warm-up of each, then `rounds`
/// alternating slices of `duration / rounds` (so both see the same
/// background load, and who goes first alternates too), merged.
pub async fn compare(url: &str, plan: &Plan, clients: usize) -> Result<Comparison, PgBenchError> {
    let base = plan.sides != Sides::Settle;
    let sett = plan.sides != Sides::Baseline;
    if !plan.warmup.is_zero() {
        if base {
            baseline(url, clients, plan.warmup).await?;
        }
        if sett {
            settle(url, &plan.opts, clients, plan.warmup).await?;
        }
    }
    let rounds = plan.rounds.max(1);
    let slice = plan.duration / rounds;
    let (mut bs, mut ss) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let base_first = r % 2 == 0;
        if base && base_first {
            bs.push(baseline(url, clients, slice).await?);
        }
        if sett {
            ss.push(settle(url, &plan.opts, clients, slice).await?);
        }
        if base && !base_first {
            bs.push(baseline(url, clients, slice).await?);
        }
    }
    Ok(Comparison {
        clients,
        baseline: merge(&bs),
        settle: merge(&ss),
    })
}
