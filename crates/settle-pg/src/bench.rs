//! The PostgreSQL benchmark: settle on PostgreSQL against the raw protocol
//! (`bench/pg-baseline.sql`), in the same run, on the same driver.
//! Used by `settle bench --store postgres://…` and `examples/pgbench.rs`.
//! It panics on database errors: it is a measuring tool, not a service.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use settle_core::TenantId;
use settle_ledger::bench::{PairStats, run_pairs, summarize};
use tokio_postgres::NoTls;

use crate::{PgOptions, PgStore};

/// A pool with the store's session settings.
pub fn pool(url: &str, size: usize) -> Pool {
    let mut cfg: tokio_postgres::Config = url.parse().expect("valid URL");
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
    Pool::builder(mgr)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build()
        .expect("benchmark database")
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

/// The raw protocol without settle's rules: claim = `INSERT … ON CONFLICT
/// DO NOTHING RETURNING fence`, settle = `UPDATE … WHERE fence = $fence AND
/// status = 0`, autocommit, one pooled connection per statement (as settle
/// takes one per command), on fresh tables in a scratch schema.
pub async fn baseline(url: &str, clients: usize, duration: Duration) -> PairStats {
    let schema = format!("bench_base_{}", std::process::id());
    let admin = pool(url, 1);
    {
        let c = admin.get().await.expect("benchmark database");
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; {}",
            BASELINE_TABLES.replace("{s}", &schema)
        ))
        .await
        .expect("benchmark database");
    }
    let pool = pool(url, clients);
    let claim = format!(
        "INSERT INTO {schema}.ops (tenant, key, fence) VALUES ($1, $2, nextval('{schema}.fence')) \
         ON CONFLICT DO NOTHING RETURNING fence"
    );
    let settle = format!(
        "UPDATE {schema}.ops SET status = 4, result = $4, response_sha256 = $5 \
         WHERE tenant = $1 AND key = $2 AND fence = $3 AND status = 0"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..clients {
        let pool = pool.clone();
        let stop = stop.clone();
        let (claim, settle) = (claim.clone(), settle.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut n = 0u64;
            let sha = vec![7u8; 32];
            let result = r#"{"charge":1}"#;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("bench-{w}-{n}");
                n += 1;
                let t0 = Instant::now();
                // One pooled connection per statement, as settle takes one per command.
                let c = pool.get().await.expect("benchmark database");
                let st = c.prepare_cached(&claim).await.expect("benchmark database");
                let row = c
                    .query_one(&st, &[&"bench", &key])
                    .await
                    .expect("benchmark database");
                let fence: i64 = row.get(0);
                drop(c);
                let c = pool.get().await.expect("benchmark database");
                let st = c.prepare_cached(&settle).await.expect("benchmark database");
                let n_rows = c
                    .execute(&st, &[&"bench", &key, &fence, &result, &sha])
                    .await
                    .expect("benchmark database");
                assert_eq!(n_rows, 1, "the fence check let the settle through");
                drop(c);
                lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            lat
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("benchmark database"));
    }
    let stats = summarize(clients, start.elapsed(), all);
    pool.close();
    let c = admin.get().await.expect("benchmark database");
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("benchmark database");
    stats
}

/// settle's claim+settle pairs through a `PgStore` on a scratch schema.
pub async fn settle(url: &str, opts: &PgOptions, clients: usize, duration: Duration) -> PairStats {
    let schema = format!("bench_settle_{}", std::process::id());
    {
        let admin = pool(url, 1);
        let c = admin.get().await.expect("benchmark database");
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .expect("benchmark database");
    }
    let store = PgStore::connect(
        url,
        PgOptions {
            pool_size: clients,
            schema: schema.clone(),
            application_name: "settle-bench".into(),
            ..opts.clone()
        },
    )
    .await
    .expect("connect");
    let store = Arc::new(store);
    let stats = run_pairs(
        store.clone(),
        TenantId::new("bench").expect("benchmark database"),
        "bench",
        clients,
        duration,
        Arc::new(AtomicU64::new(0)),
    )
    .await
    .expect("settle pairs");
    store.close();
    let admin = pool(url, 1);
    let c = admin.get().await.expect("benchmark database");
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("benchmark database");
    stats
}

/// Merges slices: pairs and time add up; latency percentiles are the
/// pair-weighted means of the slices' percentiles (an approximation,
/// stated in the output).
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

/// Baseline and settle at one client count.
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    pub clients: usize,
    pub baseline: PairStats,
    pub settle: PairStats,
    /// settle pairs/s over baseline pairs/s.
    pub ratio: f64,
}

/// Runs both at each client count: a warm-up of each, then `rounds`
/// alternating slices of `duration / rounds` (so both see the same
/// background load), merged.
pub async fn compare(
    url: &str,
    opts: &PgOptions,
    clients: &[usize],
    duration: Duration,
    warmup: Duration,
    rounds: u32,
) -> Vec<Comparison> {
    let mut out = Vec::new();
    for &c in clients {
        if !warmup.is_zero() {
            baseline(url, c, warmup).await;
            settle(url, opts, c, warmup).await;
        }
        let slice = duration / rounds.max(1);
        let (mut bs, mut ss) = (Vec::new(), Vec::new());
        for r in 0..rounds.max(1) {
            if r % 2 == 0 {
                bs.push(baseline(url, c, slice).await);
                ss.push(settle(url, opts, c, slice).await);
            } else {
                ss.push(settle(url, opts, c, slice).await);
                bs.push(baseline(url, c, slice).await);
            }
        }
        let (b, s) = (merge(&bs).expect("a round"), merge(&ss).expect("a round"));
        out.push(Comparison {
            clients: c,
            baseline: b,
            settle: s,
            ratio: s.pairs_per_s / b.pairs_per_s.max(1e-9),
        });
    }
    out
}
