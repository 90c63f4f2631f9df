//! The claim+settle pair benchmark loop, generic over what runs a pair.
//!
//! `concurrency` workers loop until the run's [`Limit`]: claim a fresh key,
//! settle it `completed`, and record the pair's latency. [`run_pairs`] runs
//! it over any [`Store`] (the embedded store, PostgreSQL); `settle bench`
//! also runs it over HTTP with a [`PairWorker`] of its own, so every mode
//! is measured the same way. It is a product feature (`settle bench`): it
//! builds its inputs with the validating constructors and answers errors,
//! never panics.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settle_core::{
    Binding, Claim, ClaimDecision, Command, Digest, InvalidInput, Key, Outcome, Principal, Reply,
    ResultJson, Scopes, Settle, TenantId,
};
use tokio::sync::Notify;

use crate::store::{Store, StoreError};

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStats {
    /// How many workers ran at once.
    pub concurrency: usize,
    /// Wall time of the run, in seconds.
    pub duration_s: f64,
    /// Pairs settled.
    pub pairs: u64,
    /// Settled pairs per second of wall time.
    pub pairs_per_s: f64,
    /// Median pair latency, in ms (µs samples; a batch call's latency counts for
    /// each of its pairs).
    pub p50_ms: f64,
    /// 99th percentile pair latency, in ms.
    pub p99_ms: f64,
    /// 99.9th percentile pair latency, in ms.
    pub p999_ms: f64,
    /// Slowest pair, in ms.
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

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// After this long (workers finish the call they are in).
    For(Duration),
    /// After this many calls of the workers in total.
    Calls(u64),
}

/// One benchmark worker (one connection, one in-process client).
pub trait PairWorker: Send + 'static {
    /// An error that ends the run.
    type Error: Send + 'static;
    /// One call on fresh keys: usually one claim+settle pair; a worker may
    /// settle several pairs per call (a batch). `n` counts this worker's
    /// calls from 0. Returns how many pairs it settled, each timed with the
    /// call's latency; `Ok(0)` counts nothing and the run goes on (a worker
    /// that tolerates failures counts them itself); `Err` ends the run.
    fn call(&mut self, n: u64) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}

/// Runs `workers` concurrently until `limit`, and summarises the settled
/// pairs. `progress` is bumped once per settled pair (for a progress bar).
/// The first error of any worker stops the others and is returned.
pub async fn run_workers<W: PairWorker>(
    workers: Vec<W>,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<PairStats, W::Error> {
    let concurrency = workers.len();
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(Notify::new());
    let tickets = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for mut worker in workers {
        let (stop, failed, tickets, progress) = (
            stop.clone(),
            failed.clone(),
            tickets.clone(),
            progress.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Limit::Calls(total) = limit
                    && tickets.fetch_add(1, Ordering::Relaxed) >= total
                {
                    break;
                }
                let t0 = Instant::now();
                let settled = match worker.call(n).await {
                    Ok(k) => k,
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        failed.notify_one();
                        return Err(e);
                    }
                };
                n += 1;
                let us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                lat.extend(std::iter::repeat_n(us, settled as usize));
                progress.fetch_add(settled, Ordering::Relaxed);
                // A store that answers without awaiting (in-memory) would
                // otherwise starve the timer that stops the run; yielding
                // only when the task's budget is spent costs the others nothing.
                tokio::task::coop::consume_budget().await;
            }
            Ok(lat)
        }));
    }
    if let Limit::For(duration) = limit {
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = failed.notified() => {}
        }
        stop.store(true, Ordering::Relaxed);
    }
    let mut all = Vec::new();
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(lat)) => all.extend(lat),
            Ok(Err(e)) => first_error = first_error.or(Some(e)),
            // A worker panicked: a bug, not a measurement; pass it on.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(summarize(concurrency, start.elapsed(), all)),
    }
}

/// Why an in-process run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store answered something a fresh key cannot get (e.g. the key
    /// was not fresh: the run's prefix was used before).
    #[error("unexpected answer for {key}: {answer}")]
    Unexpected {
        /// The pair's key.
        key: String,
        /// The store's answer, in `Debug` form.
        answer: String,
    },
    /// The pair's input did not validate.
    #[error(transparent)]
    Input(#[from] InvalidInput),
}

/// The request every benchmark pair claims and settles.
#[derive(Debug, Clone)]
pub struct PairInput {
    /// The fingerprint every pair's claim and settle carry.
    pub fingerprint: Digest,
    /// The binding every pair runs under.
    pub binding: Binding,
    /// The outcome every pair settles.
    pub outcome: Outcome,
}

impl PairInput {
    /// Principal `bench`, scope `pay`, result `{"charge":1}`.
    pub fn standard() -> Result<PairInput, InvalidInput> {
        Ok(PairInput {
            fingerprint: Digest([7; 32]),
            binding: Binding {
                principal: Principal::new("bench")?,
                scopes: Scopes::from_strs(["pay"])?,
                generation: 0,
            },
            outcome: Outcome::completed(
                ResultJson::from_text(r#"{"charge":1}"#, 1024)?,
                Digest([101; 32]),
            ),
        })
    }
}

/// A worker that claims and settles over a [`Store`]; keys are
/// `{prefix}-{worker}-{n}`.
pub struct StoreWorker {
    store: Arc<dyn Store>,
    tenant: TenantId,
    prefix: String,
    input: Arc<PairInput>,
}

impl StoreWorker {
    /// Worker number `w` of a run whose keys start with `prefix`.
    pub fn new(
        store: Arc<dyn Store>,
        tenant: TenantId,
        prefix: &str,
        w: usize,
        input: Arc<PairInput>,
    ) -> StoreWorker {
        StoreWorker {
            store,
            tenant,
            prefix: format!("{prefix}-{w}"),
            input,
        }
    }

    /// The pair on key `key`: claim (must execute), then settle.
    pub async fn pair(&self, key: Key) -> Result<(), BenchError> {
        let input = &self.input;
        let claim = Claim::new(key.clone(), input.fingerprint, input.binding.clone());
        let fence = match self
            .store
            .execute(&self.tenant, Command::Claim(claim))
            .await?
        {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => return Err(unexpected(&key, &other)),
        };
        let settle = Settle {
            key: key.clone(),
            fence,
            fingerprint: input.fingerprint,
            binding: input.binding.clone(),
            outcome: input.outcome.clone(),
        };
        match self
            .store
            .execute(&self.tenant, Command::Settle(settle))
            .await?
        {
            Reply::Receipt(_) => Ok(()),
            other => Err(unexpected(&key, &other)),
        }
    }
}

fn unexpected(key: &Key, reply: &Reply) -> BenchError {
    BenchError::Unexpected {
        key: key.to_string(),
        answer: format!("{reply:?}"),
    }
}

impl PairWorker for StoreWorker {
    type Error = BenchError;
    async fn call(&mut self, n: u64) -> Result<u64, BenchError> {
        // `{prefix}-{n}` without the formatting machinery (it showed in
        // the in-process profile, where the loop shares the CPU it measures).
        let mut s = String::with_capacity(self.prefix.len() + 21);
        s.push_str(&self.prefix);
        s.push('-');
        push_decimal(&mut s, n);
        let key = Key::new(s)?;
        self.pair(key).await.map(|()| 1)
    }
}

/// Appends `n` in decimal.
fn push_decimal(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[i..].iter().map(|&d| d as char));
}

/// Runs claim+settle pairs against `store` for `duration`. `progress` is
/// bumped once per completed pair (for a progress bar). Keys are
/// `{prefix}-{worker}-{n}`.
pub async fn run_pairs(
    store: Arc<dyn Store>,
    tenant: TenantId,
    prefix: &str,
    concurrency: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<PairStats, BenchError> {
    run_store(
        store,
        tenant,
        prefix,
        concurrency,
        Limit::For(duration),
        progress,
    )
    .await
}

/// [`run_pairs`] with any [`Limit`]: `Limit::Calls(n)` settles exactly `n`
/// pairs (fills a store).
pub async fn run_store(
    store: Arc<dyn Store>,
    tenant: TenantId,
    prefix: &str,
    concurrency: usize,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<PairStats, BenchError> {
    let input = Arc::new(PairInput::standard()?);
    let workers = (0..concurrency.max(1))
        .map(|w| StoreWorker::new(store.clone(), tenant.clone(), prefix, w, input.clone()))
        .collect();
    run_workers(workers, limit, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut s = String::from("p-");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("p-{n}"));
        }
    }

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

    #[tokio::test]
    async fn a_call_limit_settles_exactly_that_many_pairs() {
        let store: Arc<dyn Store> = Arc::new(crate::MemStore::default());
        let s = run_store(
            store.clone(),
            TenantId::default_tenant(),
            "f",
            3,
            Limit::Calls(10),
            Arc::new(AtomicU64::new(0)),
        )
        .await
        .unwrap();
        assert_eq!(s.pairs, 10);
        let mut stored = 0;
        for w in 0..3 {
            for n in 0..11 {
                let k = Key::new(format!("f-{w}-{n}")).unwrap();
                let r = store.get(&TenantId::default_tenant(), &k).await.unwrap();
                stored += r.unwrap().is_some() as u32;
            }
        }
        assert_eq!(stored, 10);
    }

    /// A reused prefix is an error of the run, not a panic of a worker.
    #[tokio::test]
    async fn a_key_that_is_not_fresh_ends_the_run_with_an_error() {
        let store: Arc<dyn Store> = Arc::new(crate::MemStore::default());
        let tenant = TenantId::default_tenant();
        let progress = Arc::new(AtomicU64::new(0));
        run_store(
            store.clone(),
            tenant.clone(),
            "r",
            1,
            Limit::Calls(1),
            progress.clone(),
        )
        .await
        .unwrap();
        let e = run_pairs(store, tenant, "r", 2, Duration::from_secs(30), progress)
            .await
            .unwrap_err();
        assert!(
            matches!(e, BenchError::Unexpected { ref key, .. } if key == "r-0-0"),
            "{e}"
        );
    }
}
