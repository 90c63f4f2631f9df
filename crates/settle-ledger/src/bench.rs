//! The in-process claim+settle pair benchmark, generic over any [`Store`].
//!
//! `concurrency` workers loop for `duration`: claim a fresh key, settle it
//! `completed`, and record the pair's latency. Used by `settle bench` for
//! the embedded store and for PostgreSQL, so both are measured the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settle_core::testkit::{binding, completed};
use settle_core::{Claim, ClaimDecision, Command, Digest, Key, Reply, Settle, TenantId};

use crate::store::{Store, StoreError};

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStats {
    pub concurrency: usize,
    pub duration_s: f64,
    pub pairs: u64,
    pub pairs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Percentile of sorted microsecond samples, in milliseconds.
pub fn percentile_ms(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let idx = ((sorted_us.len() as f64 * q).ceil() as usize).clamp(1, sorted_us.len()) - 1;
    sorted_us[idx] as f64 / 1000.0
}

/// Summarises microsecond latency samples.
pub fn summarize(concurrency: usize, elapsed: Duration, mut lat_us: Vec<u32>) -> PairStats {
    lat_us.sort_unstable();
    let secs = elapsed.as_secs_f64();
    PairStats {
        concurrency,
        duration_s: secs,
        pairs: lat_us.len() as u64,
        pairs_per_s: lat_us.len() as f64 / secs.max(1e-9),
        p50_ms: percentile_ms(&lat_us, 0.50),
        p99_ms: percentile_ms(&lat_us, 0.99),
        p999_ms: percentile_ms(&lat_us, 0.999),
        max_ms: lat_us.last().map(|v| *v as f64 / 1000.0).unwrap_or(0.0),
    }
}

/// Runs claim+settle pairs against `store`. `progress` is bumped once per
/// completed pair (for a progress bar). Keys are `{prefix}-{worker}-{n}`.
pub async fn run_pairs(
    store: Arc<dyn Store>,
    tenant: TenantId,
    prefix: &str,
    concurrency: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<PairStats, StoreError> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let store = store.clone();
        let tenant = tenant.clone();
        let stop = stop.clone();
        let progress = progress.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let b = binding("bench", 0);
            let fp = Digest([7; 32]);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = Key::new(format!("{prefix}-{w}-{n}")).expect("valid key");
                n += 1;
                let t0 = Instant::now();
                let reply = store
                    .execute(
                        &tenant,
                        Command::Claim(Claim::new(key.clone(), fp, b.clone())),
                    )
                    .await?;
                let fence = match reply {
                    Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
                    other => panic!("bench key {key} was not fresh: {other:?}"),
                };
                let reply = store
                    .execute(
                        &tenant,
                        Command::Settle(Settle {
                            key,
                            fence,
                            fingerprint: fp,
                            binding: b.clone(),
                            outcome: completed(1),
                        }),
                    )
                    .await?;
                assert!(matches!(reply, Reply::Receipt(_)), "{reply:?}");
                lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                progress.fetch_add(1, Ordering::Relaxed);
                // A store that answers without awaiting (in-memory) would
                // otherwise starve the timer that stops the run.
                tokio::task::yield_now().await;
            }
            Ok::<_, StoreError>(lat)
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("bench worker panicked")?);
    }
    Ok(summarize(concurrency, start.elapsed(), all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_sample() {
        let v: Vec<u32> = (1..=1000).map(|i| i * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.5), 500.0);
        assert_eq!(percentile_ms(&v, 0.99), 990.0);
        assert_eq!(percentile_ms(&v, 0.999), 999.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
    }

    #[tokio::test]
    async fn run_pairs_settles_every_pair_it_counts() {
        let store: Arc<dyn Store> = Arc::new(crate::MemStore::default());
        let progress = Arc::new(AtomicU64::new(0));
        let s = run_pairs(
            store.clone(),
            TenantId::default_tenant(),
            "b",
            4,
            Duration::from_millis(50),
            progress.clone(),
        )
        .await
        .unwrap();
        assert!(s.pairs > 0);
        assert_eq!(progress.load(Ordering::Relaxed), s.pairs);
        let r = store
            .get(&TenantId::default_tenant(), &Key::new("b-0-0").unwrap())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.status, settle_core::Status::Completed);
    }
}
