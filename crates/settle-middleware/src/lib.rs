//! # settle-middleware: Stripe-style `Idempotency-Key` endpoints (SPEC §8)
//!
//! A tower [`Layer`](tower::Layer) for axum and hyper services that makes a
//! route idempotent over the settle ledger, on a remote `settle serve`
//! ([`IdempotencyLayer::remote`]) or in-process (`IdempotencyLayer::embedded`,
//! the `local` feature), scoped by the caller's principal (a required
//! extractor, [`principal`]: the account, never a credential):
//!
//! * the first request with a key runs the handler once; its response is
//!   captured, settled and sent unchanged;
//! * the same request again gets the stored response, byte for byte, with
//!   `Idempotent-Replayed: true`; the handler does not run;
//! * the same key with another request: 422 `idempotency_key_reused`;
//!   while the first still runs: 409 `request_in_progress` + `Retry-After`;
//! * a panic, a timeout or a client disconnect after the handler started
//!   leaves the record `unknown`: retries get 409 `outcome_unknown` until
//!   it is reconciled (an operator, the [`reconcile`](IdempotencyLayer::reconcile)
//!   hook, or a `settle_worker::Reconciler` with a middleware hook);
//! * a handler that did nothing says so ([`HandlerError::NotSent`], or the
//!   [`EffectNotSent`] extension): released `not_committed`, 503
//!   `idempotency_unavailable` with `Retry-After: 1`, the retry runs it;
//! * statuses that say nothing happened (`release_on`: 408, 409, 425, 429,
//!   and any the application adds, which are released with `forget`) are
//!   not stored;
//! * the ledger unreachable: 503 `idempotency_unavailable`, the handler
//!   does not run (fail closed, unless the route fails open); a ledger
//!   refusal never runs it (`stale_binding`: 403 `idempotency_forbidden`);
//! * no principal for the request: 401 `idempotency_principal_missing`.
//!
//! The byte layouts (ledger key, fingerprint, stored response) are those
//! of the Python and TypeScript middlewares (`sdk/MIDDLEWARE-KEYS.md`), in
//! [`layout`]; the table of answers is [`table`], as pure functions.
//!
//! ## The request fingerprint
//!
//! JSON bodies (`application/json`, `*+json`) count by their RFC 8785
//! canonical form **by default** ([`IdempotencyLayer::canonical_json`]), so
//! key order and whitespace never make a retry a mismatch; a body that does
//! not parse counts by its raw bytes. [`IdempotencyLayer::fields`] keeps
//! only some JSON pointers of the body, [`IdempotencyLayer::exclude`] leaves
//! some out (e.g. a client timestamp); bad combinations are refused when
//! the layer is configured ([`FingerprintOptions::new`]).
//!
//! **Upgrading**: canonicalisation was off by default before. The
//! fingerprint of a JSON request whose body is not already canonical
//! changes, so a key first seen by the previous version and retried after
//! the upgrade with a non-canonical body answers 422
//! `idempotency_key_reused`. To keep the old behaviour during a rollout,
//! set `.canonical_json(false)`, and drop it once the keys' retention
//! ([`IdempotencyLayer::retention`], default one day) has passed since the
//! upgrade.
//!
//! ## Features
//!
//! * `local` (off by default): `IdempotencyLayer::embedded`, the layer over
//!   a `settle_ledger::Ledger` in the same process (and `settle-worker`'s
//!   `local`, its `LedgerTransport`). Without it the crate does not depend
//!   on `settle-ledger`, the store boundary, so a service that talks to a
//!   remote `settle serve` compiles only the client side (`./test` checks
//!   it).

mod answer;
pub mod backend;
mod capture;
mod handler;
mod layer;
pub mod layout;
pub mod principal;
mod run;
pub mod table;

pub use backend::{BoxFuture, CallError, Transport};
pub use handler::{EffectNotSent, HandlerError};
pub use layer::{
    BoxError, CanonicalFn, DEFAULT_LEDGER_DEADLINE, HookResponse, IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED, Idempotency, IdempotencyLayer, ReconcileFn, ReconcileRequest, ReplayFn,
    Resolution, Retryable, RoutesFn,
};
pub use layout::{ConfigError, FingerprintOptions};
pub use principal::{Identity, PrincipalFn};
pub use table::{ReleaseOn, RoutePolicy};

/// The RFC 8785 canonical text of a JSON body (the `canonical_json`
/// option, SPEC §8), or `None` when the body is not JSON the fingerprint
/// reads: not strict UTF-8, not JSON, nested deeper than
/// [`layout::MAX_JSON_DEPTH`], or refused by the fingerprint helper of
/// `settle-worker` (then the raw bytes count).
pub fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    layout::canonical_json_body(body)
}
