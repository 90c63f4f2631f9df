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
    BoxError, BoxFuture, Done, EffectContext, EffectError, Finding, ReconcileHook, Reconciler,
    RunError, RunOptions, RunResult, Sweep, run_once,
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
    /// The number of the first client (several workload processes).
    #[arg(long, default_value_t = 0)]
    pub client_base: u32,
    /// Keys in play at a time (a new set every `window_ms`).
    #[arg(long, default_value_t = 4)]
    pub keys: u64,
    #[arg(long, default_value_t = 1000)]
    pub window_ms: u64,
    /// The lease of every run.
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// Where the history goes (JSON lines of `check::Op`).
    #[arg(long)]
    pub history: std::path::PathBuf,
    /// The main phase's clients are a deliberately broken SDK that runs
    /// the effect again when a settle's answer is lost (the final pass
    /// still uses the real one).
    #[arg(long)]
    pub rerun_after_lost_settle: bool,
    /// Run a `Reconciler` through the first server: a sweep a second
    /// during the main phase, racing the clients, then sweeps after the
    /// heal until none sees a record to reconcile (before the final pass).
    /// Its counts go to `<history>.reconciler.json`.
    #[arg(long)]
    pub reconciler: bool,
}

/// What the Reconciler's sweeps did, in all.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Sweeps {
    pub sweeps: u64,
    #[serde(flatten)]
    pub total: Sweep,
}

impl Sweeps {
    fn add(&mut self, s: Sweep) {
        self.sweeps += 1;
        self.total.add(s);
    }
}

fn reconciler(a: &WorkloadArgs, server: &settle_client::Client) -> Reconciler {
    let lease = settle_core::LeaseMs::new(a.lease_ms).expect("the lease is in range");
    Reconciler::new(server.clone())
        .hook(
            "w",
            QueryHook {
                addr: a.remote.clone(),
            },
        )
        .lease(lease)
        .deadline(Duration::from_secs(3))
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

/// An effect takes a while (5-35 ms, or two leases and a second for one
/// in 16; fixed per request) before it sends:
/// faults land between a claim and its effect, and a worker paused there
/// sends its effect late, under a lease that may have lapsed.
async fn prepare(line: &str, lease_ms: u64) {
    let spread = line
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    // One effect in 16 prepares for two leases (heartbeated meanwhile, and
    // not watching `lease_lost`): a fault on its server can then cost it
    // the lease while its write is still to come, and that late write
    // meets the remote's fencing, as a paused worker's would.
    let ms = if spread % 16 == 0 {
        2 * lease_ms + 1000
    } else {
        5 + spread % 31
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The reconcile hook of every run and of the Reconciler: it asks the
/// remote.
#[derive(Clone)]
struct QueryHook {
    addr: String,
}

impl ReconcileHook for QueryHook {
    fn reconcile(&self, key: Key, fence: Fence) -> BoxFuture<'_, Result<Finding, BoxError>> {
        Box::pin(async move {
            let line = format!("QUERY {} {}", key.as_str(), fence.0);
            match remote::call(&self.addr, &line, REMOTE_TIMEOUT).await {
                Ok(Answer::Applied(id)) => Ok(Finding::Committed(result_of(id))),
                Ok(Answer::None) => Ok(Finding::NotCommitted),
                // A later lease asked already: this one cannot tell.
                Ok(Answer::Fenced) => Ok(Finding::Unavailable),
                Err(e) => Err(Box::new(e) as BoxError),
            }
        })
    }
}

fn options(a: &WorkloadArgs, deadline: Duration) -> RunOptions {
    let hook: Arc<dyn ReconcileHook> = Arc::new(QueryHook {
        addr: a.remote.clone(),
    });
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
            prepare(&line, a.lease_ms).await;
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

/// The deliberately broken client (`--bug rerun-after-lost-settle`): the
/// protocol by hand, except that a settle whose answer is lost makes it
/// run the effect again and settle that — what SPEC §11.11 forbids (a
/// lost settle answer is retried as the same settle). A `reconcile` grant
/// or a busy key ends the call (the final pass's real SDK resolves it).
async fn buggy(
    client: &settle_client::Client,
    a: &WorkloadArgs,
    key: &str,
) -> Result<(u64, bool), String> {
    use settle_client::api;
    let binding = api::Binding {
        principal: "nemesis".into(),
        scopes: vec![],
        generation: 0,
    };
    let fp = settle_worker::fingerprint(&json!({ "key": key }))
        .map_err(|e| e.to_string())?
        .to_hex();
    let claim = api::ClaimRequest {
        fingerprint: fp.clone(),
        binding: binding.clone(),
        lease_ms: Some(a.lease_ms),
        worker: None,
        marks_dispatch: false,
        retention_s: None,
        claim_id: Some(settle_worker::new_claim_id().as_str().to_string()),
    };
    let fence = match client
        .claim(key, &claim)
        .await
        .map_err(|e| format!("{e:?}"))?
    {
        api::ClaimDecision::Execute(g) => g.fence,
        api::ClaimDecision::Replay { outcome, .. } => {
            let id = outcome
                .result
                .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
                .and_then(|v| v.get("id")?.as_u64())
                .ok_or("a replay without an id")?;
            return Ok((id, true));
        }
        _ => return Err("BusyOrReconcile".into()),
    };
    for _ in 0..3 {
        let line = format!("APPLY {key} {fence}");
        prepare(&line, a.lease_ms).await;
        let id = match remote::call(&a.remote, &line, REMOTE_TIMEOUT).await {
            Ok(Answer::Applied(id)) => id,
            other => return Err(format!("EffectFailed {other:?}")),
        };
        let settle = api::SettleRequest {
            fence,
            fingerprint: fp.clone(),
            binding: binding.clone(),
            outcome: api::Outcome {
                status: api::OutcomeStatus::Completed,
                result: Some(
                    serde_json::value::RawValue::from_string(format!("{{\"id\":{id}}}"))
                        .map_err(|e| e.to_string())?,
                ),
                response_sha256: None,
                error: None,
            },
        };
        match client.settle(key, &settle).await {
            Ok(_) => return Ok((id, false)),
            // THE BUG: the answer was lost, so the effect runs again.
            Err(e) if e.is_transport() => continue,
            Err(e) => return Err(format!("{e:?}")),
        }
    }
    Err("SettleLost".into())
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
        receipt_fence: r.as_ref().ok().map(|r| r.receipt.fence.0),
        error: r.as_ref().err().map(class),
        after_heal,
    }
}

/// One fault proxy per server, in the clients' namespace: the answer
/// nemesis's lost and delayed answers (this kernel has no netem).
async fn proxies(a: &WorkloadArgs) -> std::io::Result<Vec<settle_faultproxy::Proxy>> {
    let mut out = Vec::new();
    for url in &a.servers {
        let addr: std::net::SocketAddr = url
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| std::io::Error::other(format!("{url}: {e}")))?;
        out.push(
            settle_faultproxy::Proxy::start("127.0.0.1:0".parse().expect("an address"), addr)
                .await?,
        );
    }
    Ok(out)
}

/// Seeded, until `end`: every 0.3-1.5 s one proxy gets a rule for the
/// next claim or settle (or any call): its answer dropped after the server
/// handled it, or delayed 0.1-2.5 s; then the rules are cleared. Counts
/// what it set, by kind.
async fn answer_nemesis(
    proxies: &[settle_faultproxy::Proxy],
    seed: u64,
    end: Instant,
) -> std::collections::BTreeMap<String, usize> {
    use settle_faultproxy::{Action, Call, Rule};
    let mut rng = Rng::new(seed ^ 0x5eed_a115);
    let mut counts = std::collections::BTreeMap::new();
    while Instant::now() < end {
        tokio::time::sleep(rng.ms(300, 1500)).await;
        let p = &proxies[rng.below(proxies.len() as u64) as usize];
        let call = match rng.below(3) {
            0 => Some(Call::Claim),
            1 => Some(Call::Settle),
            _ => None,
        };
        let (action, kind) = if rng.below(2) == 0 {
            (Action::DropAnswer, "lost answer")
        } else {
            let delay_ms = 100 + rng.below(2400);
            (Action::Delay { delay_ms }, "delayed answer")
        };
        let what = call.map_or("any call", |c| c.as_str());
        *counts.entry(format!("{kind} ({what})")).or_insert(0) += 1;
        p.set_rules(vec![Rule::new(call, action).times(1 + rng.below(3))]);
        tokio::time::sleep(rng.ms(200, 1500)).await;
        p.set_rules(Vec::new());
    }
    counts
}

fn clients(a: &WorkloadArgs, urls: &[String]) -> Vec<settle_client::Client> {
    urls.iter()
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

/// After the heal: every key the history touched, until it has an
/// outcome, 16 at a time, at most 60 s in all (the real SDK).
async fn final_pass(
    a: &Arc<WorkloadArgs>,
    servers: &Arc<Vec<settle_client::Client>>,
    history: &Arc<Mutex<Vec<Op>>>,
    t0: Instant,
) {
    let keys: BTreeSet<String> = history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|o| o.key.clone())
        .collect();
    let keys: Vec<String> = keys.into_iter().collect();
    // Every key until it has an outcome, 16 at a time, at most 60 s.
    let give_up = Instant::now() + Duration::from_secs(60);
    let o = Arc::new(options(a, Duration::from_secs(10)));
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
}

/// After the heal, the Reconciler sweeps until a sweep finds nothing to
/// reconcile (at most 30 s); then every count is written.
async fn sweep_after_heal(
    a: &WorkloadArgs,
    server: &settle_client::Client,
    mut sweeps: Sweeps,
) -> std::io::Result<()> {
    let r = reconciler(a, server);
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let s = r.sweep().await;
        sweeps.add(s);
        if s.seen == 0 || Instant::now() > give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    std::fs::write(
        a.history.with_extension("reconciler.json"),
        serde_json::to_vec(&sweeps).expect("counts serialize"),
    )
}

/// Runs the workload; the history is written when it ends.
pub async fn run(a: WorkloadArgs) -> std::io::Result<()> {
    let proxies = proxies(&a).await?;
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    let servers = Arc::new(clients(&a, &urls));
    let a = Arc::new(a);
    let history = Arc::new(Mutex::new(Vec::<Op>::new()));
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(a.seconds);
    let answers = answer_nemesis(&proxies, a.seed, end);
    let sweeping = a.reconciler.then(|| {
        let r = reconciler(&a, &servers[0]);
        tokio::spawn(async move {
            let mut sweeps = Sweeps::default();
            while Instant::now() < end {
                sweeps.add(r.sweep().await);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            sweeps
        })
    });
    let mut tasks = Vec::new();
    for c in a.client_base..a.client_base + a.clients {
        let (a, servers, history) = (a.clone(), servers.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(a.seed ^ (u64::from(c) + 1).wrapping_mul(0x9e37_79b9));
            let o = options(&a, Duration::from_secs(3));
            while Instant::now() < end {
                // The keys of this window and the three before: a key stays
                // in play longer than a lease.
                let window =
                    (t0.elapsed().as_millis() as u64 / a.window_ms).saturating_sub(rng.below(4));
                let key = format!("w{window}-k{}", rng.below(a.keys));
                let server = &servers[rng.below(servers.len() as u64) as usize];
                let start = Instant::now();
                let op = if a.rerun_after_lost_settle {
                    let r = buggy(server, &a, &key).await;
                    let op = Op {
                        client: c,
                        key: key.clone(),
                        start_ms: start.duration_since(t0).as_millis() as u64,
                        end_ms: t0.elapsed().as_millis() as u64,
                        outcome_id: r.as_ref().ok().map(|x| x.0),
                        replayed: r.as_ref().is_ok_and(|x| x.1),
                        receipt_fence: None,
                        error: r
                            .err()
                            .map(|e| e.split(' ').next().unwrap_or("").to_string()),
                        after_heal: false,
                    };
                    if op.error.is_some() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    op
                } else {
                    let r = one(server, &a, &key, &o).await;
                    record(c, &key, t0, start, &r, false)
                };
                history.lock().unwrap_or_else(|p| p.into_inner()).push(op);
            }
        }));
    }
    let answer_faults = answers.await;
    for p in &proxies {
        p.set_rules(Vec::new());
    }
    for t in tasks {
        t.await.expect("a client task ends without panicking");
    }
    std::fs::write(
        a.history.with_extension("answers.json"),
        serde_json::to_vec(&answer_faults).expect("counts serialize"),
    )?;
    eprintln!("workload: main phase done; waiting for the heal");
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(tokio::io::stdin()),
        &mut line,
    )
    .await?;
    if let Some(t) = sweeping {
        let sweeps = t.await.expect("the sweeps end without panicking");
        sweep_after_heal(&a, &servers[0], sweeps).await?;
    }
    final_pass(&a, &servers, &history, t0).await;
    let mut out = Vec::new();
    for op in history.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        serde_json::to_writer(&mut out, op).expect("an op serializes");
        out.push(b'\n');
    }
    std::fs::write(&a.history, out)
}
