//! The workload: `run_once` clients (the Rust SDK) on few keys at a time
//! (heavy contention), against the three servers at random, writing to the
//! counting remote; every call's invocation and completion recorded. Runs
//! in the clients' namespace; after its main phase it waits for the
//! orchestrator's word that everything healed (a line on stdin), then runs
//! every key it touched once more, until each has an outcome (bounded).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use settle_core::{Fence, Key};
use settle_worker::{
    BoxError, Done, EffectContext, EffectError, Finding, RunError, RunOptions, RunResult, run_once,
};

use crate::check::Op;
use crate::remote::{self, Answer};
use crate::rng::Rng;

/// What the workload is told.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// The servers' base URLs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// The tenant's bearer token.
    #[arg(long)]
    pub token: String,
    /// The counting remote (host:port).
    #[arg(long)]
    pub remote: String,
    /// Seconds of the main phase.
    #[arg(long)]
    pub seconds: u64,
    #[arg(long)]
    pub seed: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Keys in play at a time (a new set every `window_ms`).
    #[arg(long, default_value_t = 4)]
    pub keys: u64,
    #[arg(long, default_value_t = 2000)]
    pub window_ms: u64,
    /// The lease of every run.
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// Where the history goes (JSON lines of `check::Op`).
    #[arg(long)]
    pub history: std::path::PathBuf,
}

/// The effect's result: the number the remote gave the effect it applied.
fn result_of(id: u64) -> Done {
    Done::completed(json!({ "id": id }))
}

fn outcome_id(r: &RunResult) -> Option<u64> {
    let text = r.outcome.result()?.as_str();
    serde_json::from_str::<serde_json::Value>(text)
        .ok()?
        .get("id")?
        .as_u64()
}

/// The error's class (its variant's name), for the history.
fn class(e: &RunError) -> String {
    let d = format!("{e:?}");
    d.split(['(', ' ', '{'])
        .next()
        .unwrap_or("error")
        .to_string()
}

const REMOTE_TIMEOUT: Duration = Duration::from_secs(2);

fn options(a: &WorkloadArgs, deadline: Duration) -> RunOptions {
    let addr = a.remote.clone();
    let hook = move |key: Key, fence: Fence| {
        let addr = addr.clone();
        async move {
            let line = format!("QUERY {} {}", key.as_str(), fence.0);
            match remote::call(&addr, &line, REMOTE_TIMEOUT).await {
                Ok(Answer::Applied(id)) => Ok(Finding::Committed(result_of(id))),
                Ok(Answer::None) => Ok(Finding::NotCommitted),
                // A later lease asked already: this one cannot tell.
                Ok(Answer::Fenced) => Ok(Finding::Unavailable),
                Err(e) => Err(Box::new(e) as BoxError),
            }
        }
    };
    RunOptions::new("nemesis")
        .lease(Duration::from_millis(a.lease_ms))
        .deadline(Some(deadline))
        .reconcile(hook)
}

async fn one(
    client: &settle_client::Client,
    a: &WorkloadArgs,
    key: &str,
    o: &RunOptions,
) -> Result<RunResult, RunError> {
    let addr = a.remote.as_str();
    run_once(
        client,
        key,
        &json!({ "key": key }),
        async |ctx: &EffectContext<'_>| {
            let line = format!("APPLY {} {}", ctx.key().as_str(), ctx.fence().0);
            match remote::call(addr, &line, REMOTE_TIMEOUT).await {
                Ok(Answer::Applied(id)) => Ok(result_of(id)),
                Ok(Answer::Fenced) => Err(EffectError::refused("the remote saw a higher fence")),
                Ok(Answer::None) => Err(EffectError::unknown("the remote answered NONE")),
                Err(e) if !e.sent => Err(EffectError::not_sent(e)),
                Err(e) => Err(EffectError::unknown(e)),
            }
        },
        o,
    )
    .await
}

fn record(
    c: u32,
    key: &str,
    t0: Instant,
    start: Instant,
    r: &Result<RunResult, RunError>,
    after_heal: bool,
) -> Op {
    let ms = |t: Instant| t.duration_since(t0).as_millis() as u64;
    Op {
        client: c,
        key: key.to_string(),
        start_ms: ms(start),
        end_ms: ms(Instant::now()),
        outcome_id: r.as_ref().ok().and_then(outcome_id),
        replayed: r.as_ref().is_ok_and(|r| r.replayed),
        error: r.as_ref().err().map(class),
        after_heal,
    }
}

fn clients(a: &WorkloadArgs) -> Vec<settle_client::Client> {
    a.servers
        .iter()
        .map(|url| {
            settle_client::Client::builder(url)
                .token(a.token.clone())
                .connect_timeout(Duration::from_secs(1))
                .request_timeout(Duration::from_secs(2))
                .build()
                .expect("a client for each server")
        })
        .collect()
}

/// Runs the workload; the history is written when it ends.
pub async fn run(a: WorkloadArgs) -> std::io::Result<()> {
    let servers = Arc::new(clients(&a));
    let a = Arc::new(a);
    let history = Arc::new(Mutex::new(Vec::<Op>::new()));
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(a.seconds);
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let (a, servers, history) = (a.clone(), servers.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(a.seed ^ (u64::from(c) + 1).wrapping_mul(0x9e37_79b9));
            let o = options(&a, Duration::from_secs(3));
            while Instant::now() < end {
                let window = t0.elapsed().as_millis() as u64 / a.window_ms;
                let key = format!("w{window}-k{}", rng.below(a.keys));
                let server = &servers[rng.below(servers.len() as u64) as usize];
                let start = Instant::now();
                let r = one(server, &a, &key, &o).await;
                let op = record(c, &key, t0, start, &r, false);
                history.lock().unwrap_or_else(|p| p.into_inner()).push(op);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client task ends without panicking");
    }
    eprintln!("workload: main phase done; waiting for the heal");
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(tokio::io::stdin()),
        &mut line,
    )
    .await?;
    let keys: BTreeSet<String> = history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|o| o.key.clone())
        .collect();
    let keys: Vec<String> = keys.into_iter().collect();
    // Every key until it has an outcome, 16 at a time, at most 60 s.
    let give_up = Instant::now() + Duration::from_secs(60);
    let o = Arc::new(options(&a, Duration::from_secs(10)));
    for chunk in keys.chunks(16) {
        let mut tasks = Vec::new();
        for (i, key) in chunk.iter().enumerate() {
            let (a, servers, history, o, key) = (
                a.clone(),
                servers.clone(),
                history.clone(),
                o.clone(),
                key.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = i;
                loop {
                    let start = Instant::now();
                    let r = one(&servers[n % servers.len()], &a, &key, &o).await;
                    n += 1;
                    if r.is_ok() || Instant::now() > give_up {
                        let op = record(u32::MAX, &key, t0, start, &r, true);
                        history.lock().unwrap_or_else(|p| p.into_inner()).push(op);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("a final run ends without panicking");
        }
    }
    let mut out = Vec::new();
    for op in history.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        serde_json::to_writer(&mut out, op).expect("an op serializes");
        out.push(b'\n');
    }
    std::fs::write(&a.history, out)
}
