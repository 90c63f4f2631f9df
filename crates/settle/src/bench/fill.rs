//! `settle bench --data DIR --records N`: fills the embedded store with `N`
//! settled records, reporting the resident memory at 1M, 10M, … and at the
//! end, then closes it and times the reopen.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use settle_core::{Key, TenantId};
use settle_embedded::EmbeddedOptions;
use settle_ledger::Store;
use settle_ledger::bench::{Limit, run_store};

use super::{open_embedded, run_id};
use crate::exit::Failure;

/// Fills the store with `n` settled records (claim+settle pairs at
/// `concurrency`), then reopens it.
pub async fn run(
    dir: &Path,
    opts: EmbeddedOptions,
    n: u64,
    concurrency: usize,
    as_json: bool,
) -> Result<(), Failure> {
    let store = open_embedded(dir, opts.clone())?;
    let tenant = TenantId::default_tenant();
    let prefix = format!("fill-{}", run_id());
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let fill = {
        let (store, tenant, prefix, done) =
            (store.clone(), tenant.clone(), prefix.clone(), done.clone());
        tokio::spawn(async move {
            run_store(store, tenant, &prefix, concurrency, Limit::Calls(n), done).await
        })
    };
    let pb = (n >= 100_000).then(|| progress_bar(n));
    // Sample RSS at each milestone while the fill runs.
    let mut milestone = 1_000_000u64;
    while !fill.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let d = done.load(Ordering::Relaxed);
        if let Some(pb) = &pb {
            pb.set_position(d);
        }
        while milestone <= n && d >= milestone {
            print(
                json!({"mode": "fill", "records": milestone, "rss_mib": rss_mib(),
                       "resident_entities": store.resident(),
                       "elapsed_s": start.elapsed().as_secs_f64()}),
                as_json,
            );
            milestone *= 10;
        }
    }
    let filled = fill
        .await
        .map_err(|e| Failure::local(format!("the fill stopped: {e}")));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    filled?.map_err(Failure::local)?;
    let elapsed = start.elapsed().as_secs_f64();
    print(
        json!({"mode": "fill", "records": n, "rss_mib": rss_mib(),
               "resident_entities": store.resident(),
               "elapsed_s": elapsed, "pairs_per_s": n as f64 / elapsed}),
        as_json,
    );
    store.close();
    drop(store);
    reopen(dir, opts, &tenant, &prefix, n, as_json).await
}

/// Reopens the store and times it, and the first read of a filled key.
async fn reopen(
    dir: &Path,
    opts: EmbeddedOptions,
    tenant: &TenantId,
    prefix: &str,
    n: u64,
    as_json: bool,
) -> Result<(), Failure> {
    let t0 = Instant::now();
    let store = open_embedded(dir, opts)?;
    let opened = t0.elapsed().as_secs_f64() * 1000.0;
    // Worker 0's first key: settled whenever n > 0.
    let probe = Key::new(format!("{prefix}-0-0")).map_err(Failure::local)?;
    let found = matches!(store.get(tenant, &probe).await, Ok(Ok(Some(_))));
    let first_get = t0.elapsed().as_secs_f64() * 1000.0;
    print(
        json!({"mode": "reopen", "records": n, "reopen_ms": opened, "first_get_ms": first_get,
               "found": found, "rss_mib": rss_mib()}),
        as_json,
    );
    store.close();
    if found || n == 0 {
        Ok(())
    } else {
        Err(Failure::local(format!(
            "the reopened store does not have {probe}"
        )))
    }
}

fn print(v: Value, as_json: bool) {
    if as_json {
        println!("{v}");
    } else {
        println!("{v:#}");
    }
}

fn progress_bar(n: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} records  {per_sec}  eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}

/// This process's resident set size in MiB (NaN where /proc is missing).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}
