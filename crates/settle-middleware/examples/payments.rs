//! The payments example (issue 10 item 4): an axum service whose
//! `POST /payments` is made idempotent by the settle middleware.
//!
//! ```text
//! cargo run --release -p settle-middleware --example payments -- --listen 127.0.0.1:PORT \
//!     [--settle-url URL [--settle-token T] | --data DIR]
//! ```
//!
//! * `--settle-url`: the ledger is a remote `settle serve`;
//! * `--data DIR`: the embedded ledger in this process, stored in DIR;
//! * neither: the embedded ledger in a fresh temporary directory, removed
//!   on exit (nothing survives a restart).
//!
//! `POST /payments` (requires `Idempotency-Key`), body `{"amount": <int>,
//! "currency": "<str>", "delay_ms": <int, optional>}`: the handler first
//! counts the execution (every run counts), sleeps `delay_ms`, and answers
//! 201 `{"id": "pay_<n>", "amount", "currency"}` with `Location:
//! /payments/pay_<n>`. Amount 0 → 400 from the handler (stored and
//! replayed); a negative amount → the handler panics (500
//! `outcome_unknown`, then 409 `outcome_unknown`). `GET /executions` →
//! `{"count": <handler executions>}`, not wrapped. Port 0 picks a free
//! port; `listening on HOST:PORT` is printed once it accepts connections.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use settle_middleware::{IdempotencyLayer, principal};

/// The one account this example serves (SPEC §8: the principal names the
/// caller's account, never a credential; an application with one caller
/// uses a fixed one, an application with users `principal::from_extension`).
pub const PRINCIPAL: &str = "acct-demo";

/// The service's state: how many times the handler ran.
#[derive(Default)]
pub struct Payments {
    executions: AtomicU64,
}

impl Payments {
    /// Handler executions so far.
    pub fn count(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

/// The example's router: `POST /payments` behind `layer`, `GET
/// /executions` unwrapped.
pub fn app(layer: IdempotencyLayer) -> (Router, Arc<Payments>) {
    let state = Arc::new(Payments::default());
    let router = Router::new()
        .route("/payments", post(create_payment))
        .layer(layer)
        // Added after the layer: never wrapped.
        .route("/executions", get(executions))
        .with_state(state.clone());
    (router, state)
}

/// A JSON answer (axum's `json` feature is not needed for three bodies).
fn json_response(status: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).expect("a JSON value serializes");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn bad(msg: &str) -> Response {
    json_response(StatusCode::BAD_REQUEST, &json!({"error": msg}))
}

async fn create_payment(State(st): State<Arc<Payments>>, body: Bytes) -> Response {
    // First, on every run, whatever happens next.
    let n = st.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body must be a JSON object");
    };
    let Some(amount) = body.get("amount").and_then(Value::as_i64) else {
        return bad("amount must be an integer");
    };
    let Some(currency) = body.get("currency").and_then(Value::as_str) else {
        return bad("currency must be a string");
    };
    let delay_ms = match body.get("delay_ms") {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(d) => d,
            None => return bad("delay_ms must be a non-negative integer"),
        },
    };
    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    if amount == 0 {
        return bad("amount must not be zero");
    }
    assert!(amount > 0, "negative amount {amount}");
    let id = format!("pay_{n}");
    let location = format!("/payments/{id}");
    let body = json!({"id": id, "amount": amount, "currency": currency});
    let mut r = json_response(StatusCode::CREATED, &body);
    r.headers_mut().insert(
        header::LOCATION,
        header::HeaderValue::from_str(&location).expect("an ASCII path"),
    );
    r
}

async fn executions(State(st): State<Arc<Payments>>) -> Response {
    json_response(StatusCode::OK, &json!({"count": st.count()}))
}

#[derive(clap::Parser)]
#[command(about = "The settle middleware's payments example (SPEC §8).")]
struct Args {
    /// HOST:PORT to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// URL of a running `settle serve` (else the embedded ledger).
    #[arg(long, conflicts_with = "data")]
    settle_url: Option<String>,
    /// Bearer token of the settle tenant.
    #[arg(long, requires = "settle_url")]
    settle_token: Option<String>,
    /// Data directory of the embedded ledger (default: a temporary one).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Namespace of the middleware's ledger keys.
    #[arg(long, default_value = "payments-example")]
    namespace: String,
}

#[allow(dead_code)] // the tests include this file for `app`
#[allow(clippy::print_stdout, clippy::print_stderr)] // an example tells where it listens
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use clap::Parser as _;
    let args = Args::parse();
    let mut temp = None;
    let mut store = None;
    let layer = match (&args.settle_url, &args.data) {
        (Some(url), _) => {
            let mut b = settle_client::Client::builder(url);
            if let Some(t) = &args.settle_token {
                b = b.token(t.clone());
            }
            eprintln!("ledger: settle serve at {url}");
            IdempotencyLayer::remote(b.build()?, principal::fixed(PRINCIPAL))
        }
        (None, data) => {
            let dir = match data {
                Some(d) => d.clone(),
                None => {
                    let t = tempfile::tempdir()?;
                    let p = t.path().to_path_buf();
                    temp = Some(t);
                    p
                }
            };
            let s = settle_embedded::EmbeddedStore::open(&dir, Default::default())?;
            store = Some(s.clone());
            let what = if temp.is_some() {
                " (temporary, removed on exit)"
            } else {
                ""
            };
            eprintln!("ledger: embedded in {}{what}", dir.display());
            IdempotencyLayer::embedded(
                settle_ledger::Ledger::new(s),
                settle_core::TenantId::default_tenant(),
                principal::fixed(PRINCIPAL),
            )
        }
    };
    let (router, _) = app(layer.namespace(args.namespace));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    if let Some(s) = store {
        s.close();
    }
    drop(temp);
    Ok(())
}
