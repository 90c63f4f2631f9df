//! `settle bench`: claim+settle pairs per second over HTTP, in process on
//! the embedded store (alone, or against the probe: `--reference probe`),
//! or on PostgreSQL against the raw SQL protocol. Every mode runs the
//! generic pair loop of `settle_ledger::bench`.

mod fill;
mod http;
mod pg;
mod probe;

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
    /// With --data: alternating rounds (--rounds) of settle in process and
    /// of a reference store at each concurrency, each run as long as
    /// --duration, then the medians and settle's ratio to the reference.
    /// `probe`: the minimal durable claim/settle store (a hash map, an
    /// append-only log, group commit with one fdatasync per group).
    #[arg(
        long,
        value_enum,
        requires = "data",
        conflicts_with_all = ["records", "page_through", "postgres_baseline"]
    )]
    reference: Option<Reference>,
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

/// What `--reference` measures settle against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Reference {
    /// The minimal durable claim/settle store (crates/settle/src/bench/probe.rs).
    Probe,
}

/// The knobs of `--store` (and `--rounds` of `--reference`).
#[derive(Args)]
struct PgBenchArgs {
    /// Alternating rounds per client count: with --store, of baseline and
    /// settle (slices of --duration); with --reference, of settle and the
    /// reference (each run as long as --duration).
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
    /// With --store: group commit in one round trip when the process knows
    /// what a batch needs (checked by its write); off always reads first.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    one_round_trip: bool,
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

/// Refuses a flag given with the wrong target. clap's `requires` is met by
/// any member of the `target` group (clap-rs/clap#4707), so without this
/// `--data D --batch 3` ran in process and reported "batches of 3".
fn check_target(a: &BenchArgs) -> Result<(), Failure> {
    let for_url = [
        ("--batch", a.batch.is_some()),
        ("--ca-cert", a.ca_cert.is_some()),
    ];
    let for_data = [
        ("--reference", a.reference.is_some()),
        ("--records", a.records.is_some()),
        ("--page-through", a.page_through),
        ("--postgres-baseline", a.postgres_baseline.is_some()),
        ("--thread-priorities", a.thread_priorities.is_some()),
    ];
    let wrong = |flags: &[(&'static str, bool)], target: bool, needs: &str| {
        flags
            .iter()
            .find(|(_, given)| *given && !target)
            .map(|(flag, _)| Failure::usage(format!("{flag} needs {needs}")))
    };
    match wrong(&for_url, a.url.is_some(), "--url URL")
        .or_else(|| wrong(&for_data, a.data.is_some(), "--data DIR"))
    {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

pub async fn run(a: BenchArgs) -> Result<(), Failure> {
    crate::serve::init_tracing("warn");
    if a.thread_priorities.is_some() {
        tracing::warn!(
            "--thread-priorities is deprecated and ignored; it will be removed in the next release"
        );
    }
    check_target(&a)?;
    let duration = Duration::from_secs_f64(a.duration.max(0.1));
    if let Some(url) = &a.store {
        return postgres(url, &a, duration).await;
    }
    if let (Some(dir), Some(Reference::Probe)) = (&a.data, a.reference) {
        return reference(dir, &a, duration).await;
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
    let (stats, cpu_us_per_pair) = in_process(a, dir, concurrency, limit, progress).await?;
    let mode = if a.page_through {
        "in_process_paging"
    } else {
        "in_process"
    };
    Ok((mode, stats, 0, cpu_us_per_pair))
}

/// One in-process run on the embedded store in `dir`: the stats and the
/// process's CPU time per pair in microseconds.
async fn in_process(
    a: &BenchArgs,
    dir: &Path,
    concurrency: usize,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<(PairStats, Option<f64>), Failure> {
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
    Ok((stats, cpu_us_per_pair))
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
            one_round_trip: a.pg.one_round_trip,
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

/// One run of `--reference`: what it measured and the process's CPU time
/// per pair in microseconds.
#[derive(Clone, Copy)]
struct Run {
    stats: PairStats,
    cpu_us_per_pair: Option<f64>,
}

/// settle in process against the probe, per concurrency: `--rounds`
/// alternating runs (settle, probe, settle, probe, …), each as long as
/// --duration, then the medians of each side and settle's ratio to the
/// probe.
async fn reference(dir: &Path, a: &BenchArgs, duration: Duration) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::local(format!("cannot create {}: {e}", dir.display())))?;
    let rounds = a.pg.rounds.max(1);
    for &c in &a.connections {
        let c = c.max(1);
        let (mut settle, mut probe) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let run = with_progress(duration, |p| fresh_in_process(a, dir, c, duration, p)).await?;
            report_run("in_process", round, &run, a.json);
            settle.push(run);
            let (stats, cpu_us_per_pair) =
                with_progress(duration, |p| probe::run(dir, c, duration, p))
                    .await
                    .map_err(Failure::local)?;
            let run = Run {
                stats,
                cpu_us_per_pair,
            };
            report_run("probe", round, &run, a.json);
            probe.push(run);
        }
        report_reference(c, rounds, &settle, &probe, a.json);
    }
    Ok(())
}

/// One in-process run on a fresh store in a new directory under `dir`
/// (removed afterwards, so every round starts from the same empty store).
async fn fresh_in_process(
    a: &BenchArgs,
    dir: &Path,
    concurrency: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<Run, Failure> {
    let fresh = dir.join(format!("settle-{}", run_id()));
    std::fs::create_dir(&fresh)
        .map_err(|e| Failure::local(format!("cannot create {}: {e}", fresh.display())))?;
    let run = in_process(a, &fresh, concurrency, Limit::For(duration), progress).await;
    let removed = std::fs::remove_dir_all(&fresh)
        .map_err(|e| Failure::local(format!("cannot remove {}: {e}", fresh.display())));
    let (stats, cpu_us_per_pair) = run?;
    removed?;
    Ok(Run {
        stats,
        cpu_us_per_pair,
    })
}

fn report_run(mode: &str, round: u32, r: &Run, as_json: bool) {
    if as_json {
        let mut v = stats_json(mode, &r.stats, 0);
        v["round"] = json!(round);
        if let Some(c) = r.cpu_us_per_pair {
            v["cpu_us_per_pair"] = json!((c * 10.0).round() / 10.0);
        }
        println!("{v}");
    } else {
        let mode = format!("{mode}, round {round}");
        report(&mode, &r.stats, 0, None, r.cpu_us_per_pair, false);
    }
}

/// The median (of two middle values, their mean).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[m]),
        _ => Some((v[m - 1] + v[m]) / 2.0),
    }
}

/// The medians of one side's runs.
struct Medians {
    pairs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us_per_pair: Option<f64>,
}

impl Medians {
    fn of(runs: &[Run]) -> Medians {
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect()).unwrap_or(0.0);
        Medians {
            pairs_per_s: m(|r| r.stats.pairs_per_s),
            p50_ms: m(|r| r.stats.p50_ms),
            p99_ms: m(|r| r.stats.p99_ms),
            cpu_us_per_pair: median(runs.iter().filter_map(|r| r.cpu_us_per_pair).collect()),
        }
    }

    fn json(&self) -> Value {
        json!({
            "pairs_per_s": self.pairs_per_s,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "cpu_us_per_pair": self.cpu_us_per_pair.map(|c| (c * 10.0).round() / 10.0),
        })
    }
}

/// The summary of one concurrency: the medians of each side, settle's
/// pairs/s over the probe's, the probe's CPU per pair over settle's, and
/// settle's p99 over its p50.
fn report_reference(concurrency: usize, rounds: u32, settle: &[Run], probe: &[Run], as_json: bool) {
    let (s, p) = (Medians::of(settle), Medians::of(probe));
    let ratio = s.pairs_per_s / p.pairs_per_s.max(1e-9);
    let cpu_ratio = match (p.cpu_us_per_pair, s.cpu_us_per_pair) {
        (Some(p), Some(s)) if s > 0.0 => Some(p / s),
        _ => None,
    };
    let tail = (s.p50_ms > 0.0).then(|| s.p99_ms / s.p50_ms);
    if as_json {
        let v = json!({
            "mode": "reference",
            "reference": "probe",
            "concurrency": concurrency,
            "rounds": rounds,
            "settle": s.json(),
            "probe": p.json(),
            "ratio": ratio,
            "cpu_ratio": cpu_ratio,
            "p99_over_p50": tail,
        });
        println!("{v}");
        return;
    }
    let cpu = |c: Option<f64>| c.map_or("-".to_string(), |c| format!("{c:.1} us"));
    println!("settle against the probe at concurrency {concurrency}, medians of {rounds} rounds:");
    println!(
        "          {:>10} {:>10} {:>10} {:>12}",
        "pairs/s", "p50 ms", "p99 ms", "CPU/pair"
    );
    for (name, m) in [("settle", &s), ("probe", &p)] {
        println!(
            "  {name:<7} {:>10.0} {:>10.2} {:>10.2} {:>12}",
            m.pairs_per_s,
            m.p50_ms,
            m.p99_ms,
            cpu(m.cpu_us_per_pair)
        );
    }
    let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    println!(
        "  ratio settle/probe: {:.1} % of the pairs/s; CPU per pair probe/settle: {}; \
         settle p99/p50: {}",
        100.0 * ratio,
        opt(cpu_ratio),
        opt(tail)
    );
}
