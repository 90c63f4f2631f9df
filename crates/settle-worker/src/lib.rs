//! # settle-worker: the Rust worker SDK (SPEC §11)
//!
//! [`run_once`] performs an effect at most once per key, over any
//! [`Transport`]: a remote server (`settle_client::Client`) or, with the
//! `local` feature, the in-process ledger (`LedgerTransport`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), settle_worker::RunError> {
//! use serde_json::json;
//! use settle_worker::{Done, EffectContext, EffectError, RunOptions, run_once};
//!
//! let client = settle_client::Client::new("http://127.0.0.1:7411").expect("a valid URL");
//! let request = json!({"amount": 1000, "currency": "EUR"});
//! let run = run_once(
//!     &client,
//!     "order-42",
//!     &request,
//!     async |ctx: &EffectContext<'_>| {
//!         // Pass ctx.key() and ctx.fence() to the remote as its idempotency
//!         // key and fencing token; watch ctx.lease_lost().
//!         let _ = (ctx.key(), ctx.fence());
//!         Ok::<_, EffectError>(Done::completed(json!({"id": "pay_1"})))
//!     },
//!     &RunOptions::new("svc-billing").scopes(["charge"]),
//! )
//! .await?;
//! println!("{:?} (replayed: {})", run.outcome, run.replayed);
//! # Ok(()) }
//! ```
//!
//! * [`fingerprint`](mod@fingerprint): the canonical fingerprint of a
//!   request (SHA-256 of its RFC 8785 canonical JSON, or of chosen fields),
//!   identical in the Rust, Python and TypeScript SDKs.
//! * [`Transport`]: how the worker reaches the ledger; a test or simulator
//!   can put a network in between.
//! * [`Batching`]: a transport that a pool of workers shares, sending
//!   their concurrent calls to a server as §10 batches.
//! * [`Reconciler`]: sweeps the records left `unknown` with hooks by key
//!   prefix, once or in the background (`start`/`stop`); its
//!   [`middleware_hook`](Reconciler::middleware_hook) resolves records of
//!   the Idempotency-Key middleware with the client's key and principal.
//! * [`middleware`]: what the middleware (`settle-middleware`) and the
//!   Reconciler share: the claim's `worker` field, the stored response,
//!   the hook's [`Resolution`].
//! * [`new_claim_id`]: the random `claim_id` every claim carries (SPEC §4
//!   rule 5a), so that a claim whose answer was lost is retried to the
//!   same grant.
//! * [`names`]: the metrics it records. Tracing: every run is a `run_once`
//!   span with `key` and `fence`.
//!
//! ## Features
//!
//! * `local` (off by default): the in-process ledger, `LedgerTransport`
//!   (a `Transport` and an [`Inspect`] over a `settle_ledger::Ledger`), and
//!   `TransportError: From<settle_ledger::StoreError>`. Without it the
//!   crate does not depend on `settle-ledger`, the store boundary, so a
//!   worker that talks to a server compiles only the client side
//!   (`./test` checks it).
//!
//! `docs/sdk.md` has the client contract and what happens when each step
//! fails.

mod batching;
mod claim_id;
mod error;
pub mod fingerprint;
mod inspect;
pub mod middleware;
pub mod names;
mod op;
mod reconciler;
mod retry;
mod run;
mod transport;

pub use batching::{BatchAnswers, BatchOptions, BatchTransport, Batching, is_batchable};
pub use claim_id::new_claim_id;
pub use error::{BoxError, EffectError, RunError, Unrecorded};
pub use fingerprint::{
    FingerprintError, canonicalize, fingerprint, fingerprint_fields, select_fields, sha256,
};
pub use inspect::{Inspect, KeyPage, ReconcileRecord};
pub use middleware::{HookResponse, MiddlewareHook, MiddlewareRecord, Resolution};
pub use reconciler::{Reconciler, ReconcilerError, Sweep, WORKER_LABEL};
pub use run::{
    DEFAULT_DEADLINE, Done, EffectContext, Finding, Reconcile, ReconcileHook, ReplayHook,
    RunOptions, RunResult, run_once,
};
#[cfg(feature = "local")]
pub use transport::LedgerTransport;
pub use transport::{BoxFuture, Transport, TransportError};
