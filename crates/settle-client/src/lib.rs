//! # settle-client: a typed async client for a settle server
//!
//! Every call of the HTTP API (SPEC §7) and the batch call (§10), over the
//! wire types of [`settle_api`] (re-exported as [`api`]):
//!
//! ```no_run
//! # async fn demo() -> Result<(), settle_client::ClientError> {
//! use settle_client::Client;
//! use settle_client::api::{Binding, ClaimDecision, ClaimRequest};
//!
//! let client = Client::builder("http://127.0.0.1:7411").token("secret").build()?;
//! let claim = ClaimRequest {
//!     fingerprint: "07".repeat(32),
//!     binding: Binding { principal: "svc-billing".into(), scopes: vec!["charge".into()], generation: 0 },
//!     lease_ms: None, worker: None, marks_dispatch: false, retention_s: None,
//!     // Random per claim; sent again only to retry this claim after a lost answer.
//!     claim_id: Some("Q2xhaW1JZC0wMDAwMDAx".into()),
//! };
//! match client.claim("order-42", &claim).await {
//!     Ok(ClaimDecision::Execute(grant)) => { /* the effect, under grant.fence; then settle */ }
//!     Ok(other) => { /* in_flight, replay or reconcile */ }
//!     Err(e) if e.is_retryable() => { /* no answer or 503: retry the same call later */ }
//!     Err(e) => eprintln!("{e}"), // e.g. `refused (409 fingerprint_mismatch): …`
//! }
//! # Ok(()) }
//! ```
//!
//! * **One pool.** A [`Client`] is cheap to clone; clones share keep-alive
//!   HTTP/1.1 connections, opened as concurrent calls need them. (Or one
//!   dedicated connection, [`ClientBuilder::single_connection`], for load
//!   generators.)
//! * **HTTPS.** An `https://HOST[:PORT]` URL (port 443 by default) is
//!   reached over TLS (rustls), the server's certificate checked against
//!   the platform's trusted roots. A server whose certificate a private CA
//!   issued: trust that CA with
//!   [`ClientBuilder::add_root_certificate_pem`] (and, to trust it alone,
//!   [`ClientBuilder::tls_only_custom_roots`]):
//!
//!   ```no_run
//!   # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//!   let ca = std::fs::read("/etc/settle/ca.pem")?;
//!   let client = settle_client::Client::builder("https://settle.internal:7411")
//!       .add_root_certificate_pem(&ca)
//!       .token("secret")
//!       .build()?;
//!   # Ok(()) }
//!   ```
//!
//!   A certificate that does not verify is a [`ClientError::Connect`]
//!   (nothing was sent); a CA file that is not PEM fails
//!   [`ClientBuilder::build`] with [`ClientError::Tls`].
//! * **Traces.** With the feature `opentelemetry` (off by default: no
//!   OpenTelemetry dependency otherwise), every request carries the
//!   OpenTelemetry context current while the call runs, through the global
//!   propagator (`traceparent` with `TraceContextPropagator`); attach yours
//!   with `opentelemetry::context::FutureExt::with_context`, or run inside a
//!   `tracing` span with tracing-opentelemetry. The server continues it.
//! * **Timeouts.** A connect timeout and a per-request timeout
//!   ([`ClientBuilder`]); a timeout is [`ClientError::Timeout`].
//! * **Errors.** [`ClientError`] separates "no answer" (connect, timeout,
//!   transport: [`ClientError::is_transport`]) from the server's answer
//!   ([`ClientError::Http`]: status, the problem's `code`, `detail`,
//!   `correlation_id`, `Retry-After`). Its `Display` is one line that names
//!   the code once.
//! * **Three levels.** Typed methods (`claim`, `settle`, ...); [`Call`]
//!   values sent with [`Client::call`] (typed) or [`Client::send`] (the
//!   answer as received, e.g. to print it); and [`Client::execute`], which
//!   runs a `settle_core::Command` exactly as `Ledger::execute` does, so a
//!   worker or middleware can run over either.
//! * **Downloads.** [`Client::download`] and [`Client::export`] (the admin
//!   export of SPEC §12) hand back the answer as soon as its head arrives
//!   and the body piece by piece ([`Download`]); a body the server aborted
//!   is an error, never a short success.

mod call;
mod client;
mod core;
mod download;
mod error;
mod reply;
/// Request bodies and answer checks for HTTP tests (behind the `testkit`
/// feature: not in production builds).
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;
#[cfg(feature = "opentelemetry")]
mod trace;
mod transport;

pub use call::{Call, ListParams, encode_segment, operation_path};
pub use client::{
    Client, ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_IDLE_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use download::Download;
pub use error::{BoxError, ClientError, HttpError};
pub use hyper::Method;
pub use hyper::body::Bytes;
pub use reply::Reply;
pub use settle_api as api;

/// Constructors of every [`Call`]: `calls::claim(key, &body)`, ...
pub mod calls {
    pub use crate::call::{
        batch, claim, dispatch, get, health, heartbeat, list, ready, reconcile, release, revoke,
        settle, stats, warn, warnings,
    };
}
