//! `settle bench`: claim+settle pairs per second over HTTP, in process on
//! the embedded store, or on PostgreSQL against the raw SQL protocol. Every
//! mode runs the generic pair loop of `settle_ledger::bench`.

mod fill;
mod http;
mod pg;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args};
use serde_json::{Value, json};
use settle_ledger::bench::{Limit, PairStats};

use crate::exit::{self, Failure};

#[derive(Args)]
#[command(group(ArgGroup::new("target").required(true).args(["url", "data", "store"])))]
pub struct BenchArgs {
    /// Benchmark a running server over HTTP.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Benchmark the embedded store in DIR in this process (no HTTP).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Benchmark settle on PostgreSQL (postgres://…) against the raw SQL
    /// protocol (bench/pg-baseline.sql), in the same run.
    #[arg(long, value_name = "POSTGRES_URL")]
    store: Option<String>,
    /// Bearer token for --url (not needed when the server runs without
    /// tenants on loopback).
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of a CA to trust for an https:// --url (besides the system's roots).
    #[arg(long, env = "SETTLE_CA_CERT", value_name = "FILE", requires = "url")]
    ca_cert: Option<std::path::PathBuf>,
    /// HTTP connections, in-process workers (--data) or PostgreSQL clients
    /// (--store). A comma-separated list (1,64,1024) runs each in turn.
    #[arg(
        long,
        visible_alias = "concurrency",
        value_name = "N[,N...]",
        default_value = "64",
        value_delimiter = ','
    )]
    connections: Vec<usize>,
    /// With --url: send the pairs through `POST /v1/batch`, N claims in
    /// one request and then their N settlements in another.
    #[arg(long, value_name = "N", requires = "url")]
    batch: Option<usize>,
    /// Seconds to run (each concurrency).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    duration: f64,
    /// With --data: after each run, the PostgreSQL raw-protocol baseline
    /// (postgres://…) at the same concurrency, capped at 64 clients.
    #[arg(long, value_name = "POSTGRES_URL", requires = "data")]
    postgres_baseline: Option<String>,
    /// With --data: fill the store with this many settled records, reporting
    /// the resident memory at 1M, 10M, … and at the end, then close it and
    /// time the reopen.
    #[arg(long, value_name = "N", requires = "data")]
    records: Option<u64>,
    /// With --data: while the pairs run, one client pages through every
    /// record of the tenant (GET /v1/operations' listing, 1000 per page,
    /// starting over at the end), to measure what listing costs the pairs.
    #[arg(long, requires = "data")]
    page_through: bool,
    /// Deprecated and ignored (a warning); removed in the next release.
    #[arg(long, value_name = "on|off", value_parser = on_off, requires = "data")]
    thread_priorities: Option<bool>,
    /// With --data: the embedded store's log segment size in bytes
    /// (`EmbeddedOptions::segment_bytes`; as `settle serve --segment-bytes`,
    /// within [65536, 1073741824]).
    #[arg(long, value_name = "BYTES", default_value_t = settle_embedded::EmbeddedOptions::default().segment_bytes, value_parser = clap::value_parser!(u64).range(65_536..=1 << 30), requires = "data")]
    segment_bytes: u64,
    #[command(flatten)]
    pg: PgBenchArgs,
    /// One JSON object per run, one per line.
    #[arg(long)]
    json: bool,
}

/// The knobs of `--store`.
#[derive(Args)]
struct PgBenchArgs {
    /// With --store: alternating rounds of baseline and settle per client count.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: u32,
    /// With --store: seconds of warm-up of each side before the rounds.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    warmup: f64,
    /// With --store: run only one side.
    #[arg(long, value_enum, default_value = "both")]
    only: pg::Sides,
    /// With --store: settle's group commit (concurrent commands share one
    /// transaction); off runs one transaction per command.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    group_commit: bool,
    /// With --store: grouped transactions in flight at once.
    #[arg(long, value_name = "N")]
    group_commit_workers: Option<usize>,
    /// With --store: at most this many commands per grouped transaction.
    #[arg(long, value_name = "N")]
    max_batch: Option<usize>,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err("expected on or off".into()),
    }
}

impl BenchArgs {
    /// The embedded store's options for `--data` (every mode of it).
    fn embedded_options(&self) -> settle_embedded::EmbeddedOptions {
        settle_embedded::EmbeddedOptions {
            segment_bytes: self.segment_bytes,
            ..Default::default()
        }
    }
}

pub async fn run(a: BenchArgs) -> Result<(), Failure> {
    crate::serve::init_tracing("warn");
    if a.thread_priorities.is_some() {
        tracing::warn!(
            "--thread-priorities is deprecated and ignored; it will be removed in the next release"
        );
    }
    let duration = Duration::from_secs_f64(a.duration.max(0.1));
    if let Some(url) = &a.store {
        return postgres(url, &a, duration).await;
    }
    if let (Some(dir), Some(n)) = (&a.data, a.records) {
        let concurrency = a.connections.first().copied().unwrap_or(1024);
        return fill::run(dir, a.embedded_options(), n, concurrency, a.json).await;
    }
    let mut errors_total = 0;
    for &c in &a.connections {
        let (mode, stats, errors, cpu) =
            with_progress(duration, |p| once(&a, c.max(1), duration, p)).await?;
        errors_total += errors;
        report(mode, &stats, errors, a.batch, cpu, a.json);
        if let Some(pg) = &a.postgres_baseline {
            let b = pg::baseline(pg, c.clamp(1, 64), duration)
                .await
                .map_err(Failure::local)?;
            report("postgres_baseline", &b, 0, None, None, a.json);
        }
    }
    if errors_total > 0 {
        Err(Failure::silent(exit::UNAVAILABLE))
    } else {
        Ok(())
    }
}

/// One run at one concurrency over HTTP or in process: the mode, the
/// stats, the failed pairs, and in process the process's CPU time per
/// pair in microseconds (store and callers together).
async fn once(
    a: &BenchArgs,
    concurrency: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<(&'static str, PairStats, u64, Option<f64>), Failure> {
    let limit = Limit::For(duration);
    let ca_pem = crate::remote::read_ca_cert(a.ca_cert.as_deref())?;
    let access = http::Access {
        token: a.token.as_deref(),
        ca_pem: ca_pem.as_deref(),
    };
    if let (Some(url), Some(size)) = (&a.url, a.batch) {
        let (stats, errors) =
            http::run_batch(url, access, concurrency, size, limit, progress).await?;
        return Ok(("http_batch", stats, errors, None));
    }
    if let Some(url) = &a.url {
        let (stats, errors) = http::run(url, access, concurrency, limit, progress).await?;
        return Ok(("http", stats, errors, None));
    }
    let Some(dir) = &a.data else {
        return Err(Failure::usage(
            "one of --url, --data or --store is required",
        ));
    };
    let store = open_embedded(dir, a.embedded_options())?;
    let pager = a.page_through.then(|| Pager::start(store.clone()));
    let cpu_before = process_cpu_s();
    let result = settle_ledger::bench::run_store(
        store.clone(),
        settle_core::TenantId::default_tenant(),
        &format!("bench-{}", run_id()),
        concurrency,
        limit,
        progress,
    )
    .await;
    let cpu = process_cpu_s().zip(cpu_before).map(|(a, b)| a - b);
    let paged = match pager {
        Some(p) => Some(p.stop().await?),
        None => None,
    };
    store.close();
    let stats = result.map_err(Failure::local)?;
    let cpu_us_per_pair = cpu.map(|cpu| cpu * 1e6 / stats.pairs.max(1) as f64);
    if let Some((pages, records)) = paged {
        eprintln!("paged concurrently: {pages} pages, {records} records listed");
    }
    let mode = if a.page_through {
        "in_process_paging"
    } else {
        "in_process"
    };
    Ok((mode, stats, 0, cpu_us_per_pair))
}

/// CPU seconds (user + system) this process used so far (Linux).
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux platform settle builds for.
    Some(ticks / 100.0)
}

/// A client paging through every record of the default tenant, over and
/// over, until stopped: pages and records listed.
struct Pager {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(u64, u64), settle_ledger::StoreError>>,
}

impl Pager {
    fn start(store: Arc<settle_embedded::EmbeddedStore>) -> Pager {
        use settle_ledger::inspect::{ListFilter, ListQuery, list};
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let tenant = settle_core::TenantId::default_tenant();
            let (mut pages, mut records) = (0u64, 0u64);
            let mut after = None;
            while !flag.load(Ordering::Relaxed) {
                let q = ListQuery {
                    filter: ListFilter::default(),
                    order: Default::default(),
                    after: after.take(),
                    limit: 1000,
                    stuck_after_ms: 3_600_000,
                };
                let page = list(&*store, &tenant, &q).await?;
                pages += 1;
                records += page.records.len() as u64;
                after = page.next;
            }
            Ok((pages, records))
        });
        Pager { stop, task }
    }

    async fn stop(self) -> Result<(u64, u64), Failure> {
        self.stop.store(true, Ordering::Relaxed);
        match self.task.await {
            Ok(r) => r.map_err(Failure::local),
            Err(e) => Err(Failure::local(format!("the pager failed: {e}"))),
        }
    }
}

/// Runs `f` with a progress bar on runs of two seconds or more.
async fn with_progress<T, F, Fut>(duration: Duration, f: F) -> T
where
    F: FnOnce(Arc<AtomicU64>) -> Fut,
    Fut: Future<Output = T>,
{
    let progress = Arc::new(AtomicU64::new(0));
    if duration < Duration::from_secs(2) {
        return f(progress).await;
    }
    let pb = indicatif::ProgressBar::new(duration.as_secs());
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} s  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (pb, progress, stop) = (pb.clone(), progress.clone(), stop.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let secs = start.elapsed().as_secs_f64();
                let n = progress.load(Ordering::Relaxed);
                pb.set_position(secs as u64);
                pb.set_message(format!("{n} pairs, {:.0}/s", n as f64 / secs.max(1e-3)));
            }
        })
    };
    let out = f(progress).await;
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    pb.finish_and_clear();
    out
}

fn open_embedded(
    dir: &Path,
    opts: settle_embedded::EmbeddedOptions,
) -> Result<Arc<settle_embedded::EmbeddedStore>, Failure> {
    settle_embedded::EmbeddedStore::open(dir, opts)
        .map_err(|e| Failure::local(format!("cannot open {}: {e}", dir.display())))
}

/// A name for this run's keys, unique across runs on the same store.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos ^ ((std::process::id() as u128) << 64))
}

fn stats_json(mode: &str, s: &PairStats, errors: u64) -> Value {
    json!({
        "mode": mode,
        "concurrency": s.concurrency,
        "connections": s.concurrency,
        "duration_s": s.duration_s,
        "pairs": s.pairs,
        "pairs_per_s": s.pairs_per_s,
        "p50_ms": s.p50_ms,
        "p99_ms": s.p99_ms,
        "p999_ms": s.p999_ms,
        "max_ms": s.max_ms,
        "errors": errors,
    })
}

fn report(
    mode: &str,
    s: &PairStats,
    errors: u64,
    batch: Option<usize>,
    cpu_us_per_pair: Option<f64>,
    as_json: bool,
) {
    if as_json {
        let mut v = stats_json(mode, s, errors);
        if let Some(n) = batch {
            v["batch"] = json!(n);
        }
        if let Some(c) = cpu_us_per_pair {
            v["cpu_us_per_pair"] = json!((c * 10.0).round() / 10.0);
        }
        println!("{v}");
    } else {
        let mode = match batch {
            Some(n) => format!("{mode} (batches of {n})"),
            None => mode.to_string(),
        };
        println!(
            "{mode}: {} pairs in {:.1} s at concurrency {}: {:.0} pairs/s; latency p50 {:.2} ms, \
             p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms; {errors} errors",
            s.pairs,
            s.duration_s,
            s.concurrency,
            s.pairs_per_s,
            s.p50_ms,
            s.p99_ms,
            s.p999_ms,
            s.max_ms
        );
        if let Some(c) = cpu_us_per_pair {
            println!("  process CPU {c:.1} us per pair (store and callers)");
        }
    }
}

/// settle on PostgreSQL against the raw protocol, per client count.
async fn postgres(url: &str, a: &BenchArgs, duration: Duration) -> Result<(), Failure> {
    let defaults = settle_pg::PgOptions::default();
    let plan = pg::Plan {
        opts: settle_pg::PgOptions {
            group_commit: a.pg.group_commit,
            group_commit_workers: a
                .pg
                .group_commit_workers
                .unwrap_or(defaults.group_commit_workers),
            max_batch: a.pg.max_batch.unwrap_or(defaults.max_batch),
            ..defaults
        },
        duration,
        warmup: Duration::from_secs_f64(a.pg.warmup.max(0.0)),
        rounds: a.pg.rounds,
        sides: a.pg.only,
    };
    for &clients in &a.connections {
        let r = pg::compare(url, &plan, clients.max(1))
            .await
            .map_err(Failure::local)?;
        if a.json {
            let mut v = match &r.settle {
                Some(s) => stats_json("postgres", s, 0),
                None => json!({"mode": "postgres", "concurrency": r.clients}),
            };
            v["baseline"] = r
                .baseline
                .map(|b| stats_json("postgres_baseline", &b, 0))
                .unwrap_or(Value::Null);
            v["ratio"] = json!(r.ratio());
            println!("{v}");
            continue;
        }
        if let Some(b) = &r.baseline {
            report("postgres_baseline", b, 0, None, None, false);
        }
        if let Some(s) = &r.settle {
            report("postgres_settle", s, 0, None, None, false);
        }
        if let Some(ratio) = r.ratio() {
            println!(
                "ratio settle/baseline at {} clients: {:.1} %",
                r.clients,
                100.0 * ratio
            );
        }
    }
    Ok(())
}
