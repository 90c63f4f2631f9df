//! The payments example: an axum service whose
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
//! "currency": "<str>", "delay_ms": <int, optional>, "crash_after_charge":
//! <bool, optional>}`: the handler first counts the execution (every run
//! counts), sleeps `delay_ms`, charges the (fake, in-process) payment
//! provider under the client's `Idempotency-Key`, and answers 201 `{"id":
//! "pay_<n>", "amount", "currency"}` with `Location: /payments/pay_<n>`.
//! Amount 0 → 400 from the handler (stored and replayed); a negative
//! amount → the handler panics before charging (500 `outcome_unknown`);
//! `crash_after_charge` → it panics after charging (500
//! `outcome_unknown`: the payment exists, the response was lost).
//!
//! The example wires a reconcile hook ([`Payments::reconcile_hook`], SPEC
//! §8): a retry that finds the record `unknown` asks the provider whether
//! a payment with that key exists — yes: the payment is settled and
//! replayed (201); no: nothing happened, the handler runs again. `GET
//! /executions` → `{"count": <handler executions>}`, not wrapped. Port 0
//! picks a free port; `listening on HOST:PORT` is printed once it accepts
//! connections.

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
use settle_middleware::{
    BoxError, BoxFuture, HookResponse, IdempotencyLayer, ReconcileRequest, Resolution, layout,
    principal,
};

/// The one account this example serves (SPEC §8: the principal names the
/// caller's account, never a credential; an application with one caller
/// uses a fixed one, an application with users `principal::from_extension`).
pub const PRINCIPAL: &str = "acct-demo";

/// The service's state: how many times the handler ran, and the fake
/// payment provider's charges by idempotency key (a real provider keeps
/// them; Stripe, for one, de-duplicates by the key it is sent).
#[derive(Default)]
pub struct Payments {
    executions: AtomicU64,
    charges: std::sync::Mutex<std::collections::HashMap<String, Value>>,
}

impl Payments {
    /// Handler executions so far.
    pub fn count(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }

    /// The payment the provider holds under `key`, if any.
    pub fn charge_of(&self, key: &str) -> Option<Value> {
        self.charges.lock().expect("not poisoned").get(key).cloned()
    }

    /// The reconcile hook (SPEC §8): asks the provider whether the attempt
    /// whose outcome is unknown made a payment under the client's
    /// `Idempotency-Key` (the hook is handed the key, the principal and
    /// the whole retried request). It did: that payment is the response
    /// (settled and replayed). It did not: the provider is the source of
    /// truth, so nothing happened and the handler runs again.
    pub fn reconcile_hook(
        self: Arc<Self>,
    ) -> impl Fn(ReconcileRequest) -> BoxFuture<'static, Result<Resolution, BoxError>>
    + Send
    + Sync
    + 'static {
        move |req: ReconcileRequest| {
            let found = self.charge_of(&req.idempotency_key);
            Box::pin(async move {
                Ok(match found {
                    Some(payment) => Resolution::Committed(HookResponse {
                        status: 201,
                        headers: vec![
                            ("content-type".into(), b"application/json".to_vec()),
                            (
                                "location".into(),
                                format!("/payments/{}", payment["id"].as_str().unwrap_or(""))
                                    .into_bytes(),
                            ),
                        ],
                        body: serde_json::to_vec(&payment).expect("JSON").into(),
                    }),
                    None => Resolution::NotCommitted,
                })
            })
        }
    }
}

/// The example's router: `POST /payments` behind `layer`, `GET
/// /executions` unwrapped.
pub fn app(layer: IdempotencyLayer) -> (Router, Arc<Payments>) {
    app_with(Arc::new(Payments::default()), layer)
}

/// [`app`] over a given state (whose [`Payments::reconcile_hook`] the layer may use).
pub fn app_with(state: Arc<Payments>, layer: IdempotencyLayer) -> (Router, Arc<Payments>) {
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

async fn create_payment(
    State(st): State<Arc<Payments>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    // First, on every run, whatever happens next.
    let n = st.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let Ok(Value::Object(body_in)) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body must be a JSON object");
    };
    let Some(amount) = body_in.get("amount").and_then(Value::as_i64) else {
        return bad("amount must be an integer");
    };
    let Some(currency) = body_in.get("currency").and_then(Value::as_str) else {
        return bad("currency must be a string");
    };
    let delay_ms = match body_in.get("delay_ms") {
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
    // Charge the provider under the client's key (the layer already
    // refused a request without a valid one).
    let lines: Vec<&[u8]> = headers
        .get_all("idempotency-key")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(Some(key)) = layout::parse_idempotency_key(&lines) {
        st.charges
            .lock()
            .expect("not poisoned")
            .entry(key)
            .or_insert_with(|| body.clone());
    }
    if body_flag(&body_in, "crash_after_charge") {
        panic!("crashed after charging {id}");
    }
    let mut r = json_response(StatusCode::CREATED, &body);
    r.headers_mut().insert(
        header::LOCATION,
        header::HeaderValue::from_str(&location).expect("an ASCII path"),
    );
    r
}

fn body_flag(body: &serde_json::Map<String, Value>, name: &str) -> bool {
    body.get(name).and_then(Value::as_bool).unwrap_or(false)
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
    let state = Arc::new(Payments::default());
    let layer = layer
        .namespace(args.namespace)
        .reconcile(state.clone().reconcile_hook());
    let (router, _) = app_with(state, layer);
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
