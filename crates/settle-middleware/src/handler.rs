//! How a handler says "nothing was done" (SPEC §8, the handler's
//! `EffectNotSent`): it returns [`HandlerError::NotSent`] (an axum
//! `IntoResponse`), or any service puts the [`EffectNotSent`] extension in
//! its response. The layer then releases the lease `not_committed` (the
//! handler's word that nothing was applied), answers 503
//! `idempotency_unavailable` with `Retry-After: 1` in place of the
//! handler's response, and the client's retry runs the handler again.

use axum::body::Body;
use axum::http::Response;
use axum::response::IntoResponse;

use crate::answer::problem;
use crate::layer::BoxError;
use crate::table;

/// The response extension that says the handler did nothing (SPEC §8): no
/// remote write was made, nothing was applied. [`HandlerError::NotSent`]
/// sets it; a tower service that is not an axum handler inserts it itself
/// (`response.extensions_mut().insert(EffectNotSent)`). Unlike
/// [`Retryable`](crate::Retryable), whose response goes to the client
/// unchanged, the layer answers its own 503 `idempotency_unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EffectNotSent;

/// What an axum handler behind the layer returns when it did nothing, as
/// `Result<impl IntoResponse, HandlerError>`:
///
/// ```
/// use axum::http::StatusCode;
/// use settle_middleware::HandlerError;
/// async fn create() -> Result<(StatusCode, String), HandlerError> {
///     // The provider could not be reached: nothing was charged.
///     Err(HandlerError::not_sent("payment provider unreachable"))
/// }
/// let app: axum::Router = axum::Router::new().route("/charges", axum::routing::post(create));
/// # let _ = app;
/// ```
///
/// Its response is 503 `idempotency_unavailable` with `Retry-After: 1` and
/// the [`EffectNotSent`] extension, also without the layer in front.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Nothing was done: released `not_committed`, the retry runs the handler.
    #[error("nothing was done: {0}")]
    NotSent(BoxError),
}

impl HandlerError {
    /// [`HandlerError::NotSent`] from anything that converts to a boxed error.
    pub fn not_sent(e: impl Into<BoxError>) -> HandlerError {
        HandlerError::NotSent(e.into())
    }
}

impl IntoResponse for HandlerError {
    fn into_response(self) -> Response<Body> {
        match self {
            HandlerError::NotSent(e) => {
                tracing::info!(error = %e, "idempotency: the handler did nothing");
                let mut r = problem(&table::not_sent());
                r.extensions_mut().insert(EffectNotSent);
                r
            }
        }
    }
}
