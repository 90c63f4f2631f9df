//! settle on PostgreSQL against the raw protocol, in the same run.
//!
//! ```text
//! cargo run --release -p settle-pg --example pgbench -- \
//!     --url postgres://postgres@127.0.0.1:5432/test --clients 8,16,32,64 --duration 10 --json
//! ```
//!
//! For each client count, on fresh tables each time:
//! - **baseline**: the raw protocol without settle's rules, two autocommit
//!   statements per pair (the same as `bench/pg-baseline.sql`):
//!   `INSERT … ON CONFLICT DO NOTHING RETURNING fence` (claim, fence from a
//!   sequence) and `UPDATE … WHERE fence = $fence AND status = 0` (settle);
//! - **settle**: `settle_ledger::bench::run_pairs` over a `PgStore`
//!   (claim + settle through the core, locked transactions).
//!
//! Both use the same driver (tokio-postgres + deadpool, prepared
//! statements, `synchronous_commit=on`), one connection per client.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use settle_core::TenantId;
use settle_ledger::bench::{PairStats, run_pairs, summarize};
use settle_pg::{PgOptions, PgStore};
use tokio_postgres::NoTls;

struct Args {
    url: String,
    clients: Vec<usize>,
    duration: Duration,
    warmup: Duration,
    json: bool,
    only: Option<String>,
    group_commit: bool,
    workers: usize,
    max_batch: usize,
    rounds: u32,
}

fn usage() -> ! {
    eprintln!(
        "usage: pgbench [--url URL] [--clients 8,16,32,64] [--duration SECS] [--warmup SECS] \
         [--only baseline|settle] [--group-commit on|off] [--workers N] [--max-batch N] [--rounds N] [--json]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        url: "postgres://postgres@127.0.0.1:5432/test".into(),
        clients: vec![8, 16, 32, 64],
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(1),
        json: false,
        only: None,
        group_commit: PgOptions::default().group_commit,
        workers: PgOptions::default().group_commit_workers,
        max_batch: PgOptions::default().max_batch,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--url" => a.url = val(),
            "--clients" => {
                a.clients = val()
                    .split(',')
                    .map(|c| c.trim().parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--duration" => {
                a.duration = Duration::from_secs_f64(val().parse().unwrap_or_else(|_| usage()))
            }
            "--warmup" => {
                a.warmup = Duration::from_secs_f64(val().parse().unwrap_or_else(|_| usage()))
            }
            "--only" => a.only = Some(val()),
            "--json" => a.json = true,
            "--group-commit" => a.group_commit = val() != "off",
            "--workers" => a.workers = val().parse().unwrap_or_else(|_| usage()),
            "--max-batch" => a.max_batch = val().parse().unwrap_or_else(|_| usage()),
            "--rounds" => a.rounds = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    a
}

fn pool(url: &str, size: usize) -> Pool {
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
        .unwrap()
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

async fn baseline(url: &str, clients: usize, duration: Duration) -> PairStats {
    let schema = format!("bench_base_{}", std::process::id());
    let admin = pool(url, 1);
    {
        let c = admin.get().await.unwrap();
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; {}",
            BASELINE_TABLES.replace("{s}", &schema)
        ))
        .await
        .unwrap();
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
                let c = pool.get().await.unwrap();
                let st = c.prepare_cached(&claim).await.unwrap();
                let row = c.query_one(&st, &[&"bench", &key]).await.unwrap();
                let fence: i64 = row.get(0);
                drop(c);
                let c = pool.get().await.unwrap();
                let st = c.prepare_cached(&settle).await.unwrap();
                let n_rows = c
                    .execute(&st, &[&"bench", &key, &fence, &result, &sha])
                    .await
                    .unwrap();
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
        all.extend(t.await.unwrap());
    }
    let stats = summarize(clients, start.elapsed(), all);
    pool.close();
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    stats
}

async fn settle(a: &Args, clients: usize, duration: Duration) -> PairStats {
    let url = a.url.as_str();
    let schema = format!("bench_settle_{}", std::process::id());
    {
        let admin = pool(url, 1);
        let c = admin.get().await.unwrap();
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .unwrap();
    }
    let store = PgStore::connect(
        url,
        PgOptions {
            pool_size: clients,
            schema: schema.clone(),
            application_name: "settle-bench".into(),
            group_commit: a.group_commit,
            group_commit_workers: a.workers,
            max_batch: a.max_batch,
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect");
    let store = Arc::new(store);
    let stats = run_pairs(
        store.clone(),
        TenantId::new("bench").unwrap(),
        "bench",
        clients,
        duration,
        Arc::new(AtomicU64::new(0)),
    )
    .await
    .expect("settle pairs");
    store.close();
    let admin = pool(url, 1);
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    stats
}

/// Merges slices: pairs and time add up; latency percentiles are the
/// pair-weighted means of the slices' percentiles (an approximation,
/// stated in the output).
fn merge(v: &[PairStats]) -> Option<PairStats> {
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

fn obj(s: &PairStats) -> String {
    format!(
        "{{\"pairs\": {}, \"pairs_per_s\": {:.1}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"p999_ms\": {:.3}, \"max_ms\": {:.3}}}",
        s.pairs, s.pairs_per_s, s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms
    )
}

#[tokio::main]
async fn main() {
    let a = args();
    let run_base = a.only.as_deref() != Some("settle");
    let run_settle = a.only.as_deref() != Some("baseline");
    let mut rows = Vec::new();
    for &c in &a.clients {
        // Warm both paths (connections, prepared statements, caches) first.
        if !a.warmup.is_zero() {
            if run_base {
                baseline(&a.url, c, a.warmup).await;
            }
            if run_settle {
                settle(&a, c, a.warmup).await;
            }
        }
        // The machine is shared: alternate the two in `rounds` slices of
        // `duration / rounds` each, so both see the same background load,
        // and merge the slices.
        let slice = a.duration / a.rounds.max(1);
        let mut bs = Vec::new();
        let mut ss = Vec::new();
        for r in 0..a.rounds.max(1) {
            // Alternate who goes first, too.
            let base_first = r % 2 == 0;
            if base_first && run_base {
                bs.push(baseline(&a.url, c, slice).await);
            }
            if run_settle {
                ss.push(settle(&a, c, slice).await);
            }
            if !base_first && run_base {
                bs.push(baseline(&a.url, c, slice).await);
            }
        }
        let b = merge(&bs);
        let s = merge(&ss);
        if !a.json {
            if let Some(b) = &b {
                eprintln!(
                    "clients {c:>3}  baseline {:>8.0} pairs/s  p50 {:>7.2} ms  p99 {:>7.2} ms",
                    b.pairs_per_s, b.p50_ms, b.p99_ms
                );
            }
            if let Some(s) = &s {
                eprintln!(
                    "clients {c:>3}  settle   {:>8.0} pairs/s  p50 {:>7.2} ms  p99 {:>7.2} ms",
                    s.pairs_per_s, s.p50_ms, s.p99_ms
                );
            }
            if let (Some(b), Some(s)) = (&b, &s) {
                eprintln!(
                    "clients {c:>3}  ratio    {:>8.1} %",
                    100.0 * s.pairs_per_s / b.pairs_per_s
                );
            }
        }
        rows.push((c, b, s));
    }
    if a.json {
        let items: Vec<String> = rows
            .iter()
            .map(|(c, b, s)| {
                let ratio = match (b, s) {
                    (Some(b), Some(s)) if b.pairs_per_s > 0.0 => {
                        format!("{:.3}", s.pairs_per_s / b.pairs_per_s)
                    }
                    _ => "null".into(),
                };
                format!(
                    "{{\"clients\": {c}, \"baseline\": {}, \"settle\": {}, \"ratio\": {ratio}}}",
                    b.as_ref().map(obj).unwrap_or_else(|| "null".into()),
                    s.as_ref().map(obj).unwrap_or_else(|| "null".into()),
                )
            })
            .collect();
        println!(
            "{{\"benchmark\": \"claim+settle pairs on PostgreSQL\", \"duration_s\": {}, \"rounds\": {}, \"group_commit\": {}, \"workers\": {}, \"max_batch\": {}, \"note\": \"p50/p99 are pair-weighted means of the rounds' percentiles\", \"runs\": [\n  {}\n]}}",
            a.duration.as_secs_f64(),
            a.rounds,
            a.group_commit,
            a.workers,
            a.max_batch,
            items.join(",\n  ")
        );
    }
}
