//! The middleware's overhead per request: a handler that returns at once,
//! served without the layer, with it over the embedded ledger, and with
//! it over a `settle serve` (started in this process on an ephemeral port,
//! or `--settle-url`), under `--connections` keep-alive connections each
//! sending one request after another with a fresh `Idempotency-Key`.
//!
//! ```text
//! cargo run --release -p settle-middleware --example overhead -- [--seconds 5] [--runs 3] [--connections 64]
//! ```
//!
//! Prints one JSON object per run and one summary per mode (medians of the
//! runs), then the overhead per request against the bare handler. Load
//! generator, service and ledger share the machine: the figures are of
//! this machine under whatever else it runs.

#![allow(clippy::print_stdout, clippy::print_stderr)] // an example prints its figures

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::json;
use settle_middleware::IdempotencyLayer;

#[derive(clap::Parser)]
struct Args {
    /// Seconds each run measures (after one second of warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Runs per mode; the summary gives their medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// A running `settle serve` for the remote mode (default: one started
    /// in this process on a temporary directory).
    #[arg(long)]
    settle_url: Option<String>,
    /// Modes to run, comma-separated: none, embedded, remote.
    #[arg(long, default_value = "none,embedded,remote")]
    modes: String,
}

struct Run {
    requests: u64,
    errors: u64,
    seconds: f64,
    latencies_us: Vec<u64>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// One connection's loop until `until`; latencies only after `from`.
async fn connection(addr: SocketAddr, tag: String, from: Instant, until: Instant) -> Run {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut run = Run {
        requests: 0,
        errors: 0,
        seconds: 0.0,
        latencies_us: Vec::new(),
    };
    let mut i = 0u64;
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        i += 1;
        let req = hyper::Request::post("/op")
            .header("content-type", "application/json")
            .header("idempotency-key", format!("{tag}-{i}"))
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
            .unwrap();
        let ok = match sender.send_request(req).await {
            Ok(resp) => {
                let ok = resp.status().is_success();
                ok && resp.into_body().collect().await.is_ok()
            }
            Err(_) => false,
        };
        if start >= from {
            run.requests += 1;
            if !ok {
                run.errors += 1;
            }
            run.latencies_us
                .push(u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
        if sender.ready().await.is_err() {
            break;
        }
    }
    run
}

async fn measure(addr: SocketAddr, args: &Args, tag: &str) -> Run {
    let from = Instant::now() + Duration::from_secs(1);
    let until = from + Duration::from_secs(args.seconds);
    let tasks: Vec<_> = (0..args.connections)
        .map(|c| tokio::spawn(connection(addr, format!("{tag}-{c}"), from, until)))
        .collect();
    let mut all = Run {
        requests: 0,
        errors: 0,
        seconds: args.seconds as f64,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        let r = t.await.unwrap();
        all.requests += r.requests;
        all.errors += r.errors;
        all.latencies_us.extend(r.latencies_us);
    }
    all.latencies_us.sort_unstable();
    all
}

fn router(layer: Option<IdempotencyLayer>) -> Router {
    let r = Router::new().route("/op", post(|| async { "ok" }));
    match layer {
        Some(l) => r.layer(l),
        None => r,
    }
}

#[tokio::main]
async fn main() {
    use clap::Parser as _;
    let args = Args::parse();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let dir = tempfile::tempdir().unwrap();
    let mut summaries = Vec::new();
    for mode in args.modes.split(',') {
        let layer = match mode {
            "none" => None,
            "embedded" => {
                let store = settle_embedded::EmbeddedStore::open(
                    dir.path().join("embedded"),
                    Default::default(),
                )
                .unwrap();
                Some(IdempotencyLayer::embedded(
                    settle_ledger::Ledger::new(store),
                    settle_core::TenantId::default_tenant(),
                    settle_middleware::principal::fixed("acct-bench"),
                ))
            }
            "remote" => {
                let url = match &args.settle_url {
                    Some(u) => u.clone(),
                    None => settle_serve(dir.path().join("remote")).await,
                };
                Some(IdempotencyLayer::remote(
                    settle_client::Client::new(&url).unwrap(),
                    settle_middleware::principal::fixed("acct-bench"),
                ))
            }
            other => panic!("unknown mode {other:?}"),
        };
        let addr = serve(router(layer)).await;
        let mut rps = Vec::new();
        let mut p50 = Vec::new();
        let mut p99 = Vec::new();
        for run in 0..args.runs {
            let r = measure(addr, &args, &format!("{stamp}-{mode}-{run}")).await;
            let line = json!({
                "mode": mode, "run": run, "connections": args.connections,
                "requests": r.requests, "errors": r.errors,
                "rps": r.requests as f64 / r.seconds,
                "p50_us": percentile(&r.latencies_us, 0.5),
                "p99_us": percentile(&r.latencies_us, 0.99),
            });
            println!("{line}");
            rps.push(r.requests as f64 / r.seconds);
            p50.push(percentile(&r.latencies_us, 0.5) as f64);
            p99.push(percentile(&r.latencies_us, 0.99) as f64);
        }
        summaries.push((mode.to_string(), median(rps), median(p50), median(p99)));
    }
    let base = summaries.iter().find(|s| s.0 == "none").map(|s| (s.1, s.2));
    for (mode, rps, p50, p99) in &summaries {
        let mut line = json!({
            "summary": mode, "connections": args.connections, "runs": args.runs,
            "median_rps": rps.round(), "median_p50_us": p50, "median_p99_us": p99,
        });
        if let Some((base_rps, base_p50)) = base
            && mode != "none"
        {
            // Service time per request the layer adds (throughput view) and
            // the added median latency under this concurrency.
            line["overhead_us_per_request"] = json!(((1e6 / rps) - (1e6 / base_rps)).round());
            line["added_p50_us"] = json!(p50 - base_p50);
        }
        println!("{line}");
    }
}

/// `settle serve` in this process, on an ephemeral port.
async fn settle_serve(dir: std::path::PathBuf) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = settle_server::Config::local(addr, dir.clone());
    // The binary picks the engine; here it is the embedded store.
    let store = settle_embedded::EmbeddedStore::open(
        &dir,
        settle_embedded::EmbeddedOptions {
            limits: config.limits(),
            ..Default::default()
        },
    )
    .unwrap();
    let closer = store.clone();
    let opened = settle_server::OpenedStore::new(store, move || closer.close());
    tokio::spawn(settle_server::run(
        config,
        opened,
        listener,
        std::future::pending(),
    ));
    format!("http://{addr}")
}
