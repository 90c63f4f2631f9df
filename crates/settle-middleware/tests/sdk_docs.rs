//! Every Rust example of `docs/sdk.md` compiles: each one is written
//! here verbatim as the body of a function (never run: they need a
//! server and a payment provider), with the names it leaves to the
//! reader (`token`, `psp_lookup`, `User`, ...) as stubs, and
//! `the_examples_of_docs_sdk_md_are_the_ones_compiled_here` fails when an
//! example of the page is not found here (lines compared without their
//! indentation), so the page and this file cannot drift.

#![allow(dead_code, unused_variables, clippy::print_stdout)]

use axum::http::StatusCode;
use settle_core::Key;
use settle_middleware::HandlerError;
use settle_worker::BoxError;

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

// -- stubs for the names the examples leave to the reader ---------------

struct Charge {
    id: String,
}

/// A payment provider's answer.
struct PspAnswer {
    status: u16,
    id: String,
    raw: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
#[error("the payment provider failed")]
struct PspError;

impl PspError {
    fn is_connect(&self) -> bool {
        false
    }
}

async fn psp_lookup(_key: &Key) -> Result<Option<Charge>, BoxError> {
    Ok(None)
}

async fn psp_charge(_key: &str, _fence: u64) -> Result<PspAnswer, PspError> {
    Err(PspError)
}

struct Psp;
struct Conn;

impl Psp {
    async fn find(&self, _key: &str) -> Result<Option<Charge>, BoxError> {
        Ok(None)
    }
    async fn connect(&self) -> Result<Conn, PspError> {
        Ok(Conn)
    }
}

impl Conn {
    async fn charge(&self, _key: &str) -> Result<Charge, PspError> {
        Err(PspError)
    }
}

#[derive(Clone)]
struct User {
    account_id: String,
}

async fn create() -> Result<(StatusCode, String), HandlerError> {
    Err(HandlerError::not_sent(
        "the provider is down: nothing was charged",
    ))
}

// -- the examples, verbatim ----------------------------------------------

/// docs/sdk.md "Rust: `settle-worker`".
#[rustfmt::skip] // verbatim, as the page has it
async fn worker_example(token: &str, order_id: u64, order_json: serde_json::Value) -> Result {
    use serde_json::json;
    use settle_core::{Fence, Key};
    use settle_worker::{BoxError, Done, EffectContext, EffectError, Finding, RunOptions, run_once};

    // Over a server: settle_client::Client. In process (the `local` feature):
    // LedgerTransport::new(ledger).
    let ledger = settle_client::Client::builder("http://127.0.0.1:7411").token(token).build()?;

    let options = RunOptions::new("svc-billing")
        .scopes(["charge"])
        .marks_dispatch(true)
        .reconcile(|key: Key, _fence: Fence| async move {
            // Ask the remote about the attempt that ran under (key, fence).
            Ok::<_, BoxError>(match psp_lookup(&key).await? {
                Some(charge) => Finding::Committed(Done::completed(json!({"charge": charge.id}))),
                None => Finding::NotCommitted,
            })
        });

    let run = run_once(&ledger, &format!("charge-{order_id}"), &order_json,
        async |ctx: &EffectContext<'_>| {
            ctx.dispatch().await?;                       // the commit boundary
            let resp = tokio::select! {
                r = psp_charge(ctx.key().as_str(), ctx.fence().0) => r,
                () = ctx.lease_lost().cancelled() => {   // another worker may take over
                    return Err(EffectError::unknown("lease lost mid-charge"));
                }
            };
            match resp {
                Ok(r) if r.status == 429 => Err(EffectError::refused("rate limited")),
                Ok(r) => Ok(Done::completed(json!({"charge": r.id})).with_response(r.raw)),
                Err(e) if e.is_connect() => Err(EffectError::not_sent(e)),
                Err(e) => Err(EffectError::unknown(e)),
            }
        },
        &options,
    ).await?;
    println!("{:?}, replayed: {}", run.outcome, run.replayed);
    Ok(())
}

/// docs/sdk.md "Middleware".
#[rustfmt::skip] // verbatim, as the page has it
async fn middleware_example(url: &str, token: &str) -> Result {
    use std::time::Duration;
    use settle_middleware::{
        BoxError, IdempotencyLayer, Identity, ReconcileRequest, ReleaseOn, Resolution, RoutePolicy,
        principal,
    };

    // Whose keys these are (required): the caller's account, never a credential.
    // An authentication layer in front put a `User` in the request's extensions.
    let who = principal::from_extension(|u: &User| Some(Identity::new(u.account_id.clone())));
    let layer = IdempotencyLayer::remote(settle_client::Client::builder(url).token(token).build()?, who)
        .namespace("payments")                       // separates services sharing a ledger
        .routes(|method, path| (method == "POST" && path.starts_with("/payments")).then(|| RoutePolicy {
            timeout: Some(Duration::from_secs(20)),
            wait: Some(Duration::from_secs(2)),      // a duplicate waits for the first's outcome
            release_on: Some(ReleaseOn::default().with(422)), // the framework's own 422: forgotten
            ..RoutePolicy::default()
        }))
        .stored_headers(["x-request-id"])            // replayed with the body
        .reconcile(|req: ReconcileRequest| async move {
            // Ask the provider for a charge under the client's key and account.
            let _ = (&req.idempotency_key, &req.principal, &req.body);
            Ok::<_, BoxError>(Resolution::Unavailable)
        });
    let app = axum::Router::new().route("/payments", axum::routing::post(create)).layer(layer);
    let _: axum::Router = app;
    Ok(())
}

/// docs/sdk.md "When something fails — Rust".
#[rustfmt::skip] // verbatim, as the page has it
async fn failures_example(
    client: settle_client::Client,
    request: serde_json::Value,
    psp: &'static Psp,
) -> Result {
    use std::time::Duration;
    use settle_core::{Fence, Key};
    use settle_worker::{BoxError, Done, EffectContext, EffectError, Finding, Reconciler, RunOptions, run_once};

    // The hook: asks the payment provider whether a charge with this key exists.
    let hook = move |key: Key, _fence: Fence| async move {
        Ok::<_, BoxError>(match psp.find(key.as_str()).await? {
            Some(c) => Finding::Committed(Done::completed(serde_json::json!({"charge": c.id}))),
            None => Finding::NotCommitted,
        })
    };
    let options = RunOptions::new("svc-billing").marks_dispatch(true).reconcile(hook);
    let run = run_once(&client, "order-42", &request, async |ctx: &EffectContext<'_>| {
        let conn = psp.connect().await.map_err(EffectError::not_sent)?; // before the mark: not sent
        ctx.dispatch().await?;                                          // the commit boundary
        let c = conn.charge(ctx.key().as_str()).await.map_err(EffectError::unknown)?;
        Ok(Done::completed(serde_json::json!({"charge": c.id})))
    }, &options).await?;

    // Records left unknown (by killed workers) resolved without a retry, in
    // the background until stopped:
    let sweeps = Reconciler::new(client.clone()).hook("order-", hook);
    sweeps.start(Duration::from_secs(60))?;
    // ... at shutdown: true when the loop ended within the timeout.
    let ended = sweeps.stop(Duration::from_secs(5)).await;
    Ok(())
}

/// docs/sdk.md "Replay hooks: `on_replay` (all three SDKs)".
#[rustfmt::skip] // verbatim, as the page has it
fn on_replay_example(client: settle_client::Client) {
    use settle_middleware::{IdempotencyLayer, principal};
    let layer = IdempotencyLayer::remote(client, principal::fixed("svc-checkout"))
        .on_replay(|mut stored, _receipt| {
            stored.headers.push(("x-replayed-from".into(), b"settle".to_vec()));
            stored
        });
    let _: IdempotencyLayer = layer;
}

// -- the page and this file agree --------------------------------------

/// The non-empty lines of `text`, without their indentation.
fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_examples_of_docs_sdk_md_are_the_ones_compiled_here() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/sdk.md"),
    )
    .expect("docs/sdk.md");
    let here = lines(include_str!("sdk_docs.rs"));
    let mut found = 0;
    let mut rest = page.as_str();
    while let Some(start) = rest.find("```rust\n") {
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("```").expect("a closed code block");
        let example = lines(&body[..end]);
        assert!(
            here.windows(example.len()).any(|w| w == example.as_slice()),
            "an example of docs/sdk.md is not compiled by this file:\n{}",
            &body[..end]
        );
        found += 1;
        rest = &body[end + 3..];
    }
    assert_eq!(
        found, 4,
        "docs/sdk.md's Rust examples (update this file with the page)"
    );
}
