//! Who a request acts for (SPEC §8): the principal extractor every
//! [`IdempotencyLayer`](crate::IdempotencyLayer) is built with, and the
//! two helpers for the common cases.
//!
//! The principal scopes a client's keys and is the binding of every claim,
//! so it must name the caller's *account*, stable across credential
//! refresh: never a token or a header value (a retry sent after an OAuth
//! refresh must replay, not run again). There is no default.

use std::sync::Arc;

use axum::http::request::Parts;

/// A request's principal and the generation its claims carry (SPEC §8:
/// the extractor may move a revoked principal forward; default 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The caller's account (any text; keys of different principals never meet).
    pub principal: String,
    /// The binding's generation.
    pub generation: u64,
}

impl Identity {
    /// `principal` at generation 0.
    pub fn new(principal: impl Into<String>) -> Identity {
        Identity {
            principal: principal.into(),
            generation: 0,
        }
    }

    /// The same principal at generation `g`.
    #[must_use]
    pub fn generation(self, g: u64) -> Identity {
        Identity {
            generation: g,
            ..self
        }
    }
}

impl From<&str> for Identity {
    fn from(p: &str) -> Identity {
        Identity::new(p)
    }
}

impl From<String> for Identity {
    fn from(p: String) -> Identity {
        Identity::new(p)
    }
}

/// The principal extractor: `None` when the request carries no identity
/// (401 `idempotency_principal_missing`, the handler does not run).
pub type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<Identity> + Send + Sync>;

/// Every request acts for one principal: an application with one caller
/// (or one whose callers share their keys on purpose).
pub fn fixed(
    identity: impl Into<Identity>,
) -> impl Fn(&Parts) -> Option<Identity> + Clone + Send + Sync + 'static {
    let identity = identity.into();
    move |_: &Parts| Some(identity.clone())
}

/// The identity an authentication layer in front of this one put in the
/// request's extensions (axum's convention: `req.extensions_mut().insert(user)`),
/// mapped to an [`Identity`] by `pick`; no such extension, or `pick`
/// answering `None`, is a request without identity.
///
/// ```
/// # use settle_middleware::principal::{self, Identity};
/// #[derive(Clone)]
/// struct User { account: String }
/// let extractor = principal::from_extension(|u: &User| Some(Identity::new(u.account.clone())));
/// # let _ = extractor;
/// ```
pub fn from_extension<T, F>(
    pick: F,
) -> impl Fn(&Parts) -> Option<Identity> + Clone + Send + Sync + 'static
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> Option<Identity> + Clone + Send + Sync + 'static,
{
    move |parts: &Parts| parts.extensions.get::<T>().and_then(&pick)
}
