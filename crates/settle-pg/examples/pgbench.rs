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

use std::time::Duration;

use settle_ledger::bench::PairStats;
use settle_pg::PgOptions;
use settle_pg::bench::{baseline, merge, settle};

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

impl Args {
    fn opts(&self) -> PgOptions {
        PgOptions {
            group_commit: self.group_commit,
            group_commit_workers: self.workers,
            max_batch: self.max_batch,
            ..PgOptions::default()
        }
    }
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
                settle(&a.url, &a.opts(), c, a.warmup).await;
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
                ss.push(settle(&a.url, &a.opts(), c, slice).await);
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
