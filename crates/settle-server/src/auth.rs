//! Bearer token → tenant (SPEC §7), and the admin tokens of the operator
//! endpoints (SPEC §12). Tokens are configured as SHA-256 digests; the
//! presented token is hashed and compared in constant time.

use axum::http::{HeaderMap, header};
use sha2::{Digest as _, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use settle_core::{Digest, TenantId};

use crate::config::AuthConfig;
use crate::problem::Problem;

/// Who may call.
pub enum Auth {
    /// Loopback-only mode without tenants: everything is tenant `default`.
    Off(TenantId),
    /// Configured tenants: (SHA-256 of token, tenant).
    Tenants(Vec<([u8; 32], TenantId)>),
}

impl Auth {
    /// The validated auth settings as the request path uses them.
    pub fn from_config(c: &AuthConfig) -> Auth {
        match c {
            AuthConfig::Off => Auth::Off(TenantId::default_tenant()),
            AuthConfig::Tenants(t) => {
                Auth::Tenants(t.iter().map(|(n, d)| (d.0, n.clone())).collect())
            }
        }
    }

    /// Every tenant a token can act for (the per-tenant gauges sum over them).
    pub fn tenants(&self) -> Vec<TenantId> {
        let mut out: Vec<TenantId> = match self {
            Auth::Off(t) => vec![t.clone()],
            Auth::Tenants(ts) => ts.iter().map(|(_, t)| t.clone()).collect(),
        };
        out.sort();
        out.dedup();
        out
    }

    /// Whether every call is tenant `default` (no tenants configured, loopback only).
    pub fn is_off(&self) -> bool {
        matches!(self, Auth::Off(_))
    }

    /// The tenant the request's `Authorization: Bearer` token belongs to.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<&TenantId, Problem> {
        let tenants = match self {
            Auth::Off(t) => return Ok(t),
            Auth::Tenants(t) => t,
        };
        let presented: [u8; 32] = Sha256::digest(bearer_token(headers)?).into();
        // Every configured digest is compared (no early exit), so the time
        // taken does not depend on which tenant, if any, matched.
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for (i, (digest, _)) in tenants.iter().enumerate() {
            let eq = digest.ct_eq(&presented);
            index.conditional_assign(&(i as u32), eq);
            found |= eq;
        }
        if bool::from(found) {
            Ok(&tenants[index as usize].1)
        } else {
            Err(Problem::unauthorized("unknown token"))
        }
    }
}

/// Who may call the operator endpoints (SPEC §12 "Admin access").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAuth {
    /// Authentication is off (loopback, no tenants, no `[admin]`): the
    /// admin endpoints are open like the rest.
    Open,
    /// A bearer token whose SHA-256 is one of these. Empty (tenants but
    /// no `[admin]`): no token is an admin's, every admin call is 401.
    Tokens(Vec<[u8; 32]>),
}

impl AdminAuth {
    /// The admin access that `auth` and the `[admin]` digests give.
    pub fn from_config(auth: &AuthConfig, admin: &[Digest]) -> AdminAuth {
        if matches!(auth, AuthConfig::Off) && admin.is_empty() {
            AdminAuth::Open
        } else {
            AdminAuth::Tokens(admin.iter().map(|d| d.0).collect())
        }
    }

    /// `Ok` when the request may call an admin endpoint: access is open,
    /// or its bearer token is an admin token (compared with every digest
    /// in constant time, no early exit). A tenant's token is refused like
    /// an unknown one: 401 `unauthorized`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Problem> {
        let digests = match self {
            AdminAuth::Open => return Ok(()),
            AdminAuth::Tokens(d) => d,
        };
        if digests.is_empty() {
            return Err(Problem::unauthorized(
                "the admin endpoints need an admin token, and this server has none \
                 configured ([admin] token_sha256)",
            ));
        }
        let presented: [u8; 32] = Sha256::digest(bearer_token(headers)?).into();
        let mut found = subtle::Choice::from(0u8);
        for digest in digests {
            found |= digest.ct_eq(&presented);
        }
        if bool::from(found) {
            Ok(())
        } else {
            Err(Problem::unauthorized(
                "the admin endpoints need an admin token ([admin] token_sha256); \
                 this token is not one",
            ))
        }
    }
}

/// The token of the request's `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Result<&[u8], Problem> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| Problem::unauthorized("missing Authorization: Bearer <token>"))?;
    // The scheme name is case-insensitive (RFC 9110 §11.1) and one or
    // more spaces separate it from the token (RFC 9110 §11.4: `1*SP`).
    let raw = value.as_bytes();
    raw.get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"Bearer "))
        .map(|_| {
            let rest = &raw[7..];
            &rest[rest.iter().take_while(|&&b| b == b' ').count()..]
        })
        .ok_or_else(|| Problem::unauthorized("the Authorization header is not Bearer <token>"))
}

/// `Ok` when `digest` is `None` (the endpoint is open) or the request's
/// bearer token hashes to it (compared in constant time).
pub fn check_token(digest: Option<&[u8; 32]>, headers: &HeaderMap) -> Result<(), Problem> {
    let Some(digest) = digest else {
        return Ok(());
    };
    let presented: [u8; 32] = Sha256::digest(bearer_token(headers)?).into();
    if bool::from(digest.ct_eq(&presented)) {
        Ok(())
    } else {
        Err(Problem::unauthorized("unknown token"))
    }
}

/// The hex SHA-256 of a token, as written in `token_sha256`.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn auth() -> Auth {
        let d = |t: &str| Digest::parse("t", &token_sha256(t)).unwrap();
        Auth::from_config(&AuthConfig::Tenants(vec![
            (TenantId::new("acme").unwrap(), d("tok-acme")),
            (TenantId::new("beta").unwrap(), d("tok-beta")),
        ]))
    }

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn tokens_map_to_their_tenant() {
        let a = auth();
        assert_eq!(
            a.tenant(&headers("Bearer tok-acme")).unwrap().as_str(),
            "acme"
        );
        assert_eq!(
            a.tenant(&headers("BEARER tok-beta")).unwrap().as_str(),
            "beta"
        );
        assert_eq!(
            a.tenant(&headers("Bearer nope")).unwrap_err().code.as_str(),
            "unauthorized"
        );
        assert_eq!(
            a.tenant(&headers("Basic tok-acme"))
                .unwrap_err()
                .code
                .as_str(),
            "unauthorized"
        );
        assert_eq!(
            a.tenant(&headers("Bearertok-acme"))
                .unwrap_err()
                .code
                .as_str(),
            "unauthorized"
        );
        assert_eq!(
            a.tenant(&headers("Bearer ")).unwrap_err().code.as_str(),
            "unauthorized"
        );
        assert_eq!(
            a.tenant(&HeaderMap::new()).unwrap_err().code.as_str(),
            "unauthorized"
        );
    }

    /// RFC 9110 §11.4: `credentials = auth-scheme [ 1*SP ( token68 / #auth-param ) ]`.
    #[test]
    fn several_spaces_may_separate_scheme_and_token() {
        let a = auth();
        for h in ["Bearer  tok-acme", "bearer     tok-acme"] {
            assert_eq!(a.tenant(&headers(h)).unwrap().as_str(), "acme", "{h:?}");
        }
        // Only spaces: a tab is not `SP`, and the token itself is exact.
        assert!(a.tenant(&headers("Bearer \ttok-acme")).is_err());
    }

    #[test]
    fn admin_tokens_open_only_the_admin_endpoints() {
        let d = |t: &str| Digest::parse("t", &token_sha256(t)).unwrap();
        let tenants = AuthConfig::Tenants(vec![(TenantId::new("acme").unwrap(), d("tok-acme"))]);
        let a = AdminAuth::from_config(&tenants, &[d("adm-1"), d("adm-2")]);
        assert!(a.check(&headers("Bearer adm-1")).is_ok());
        assert!(a.check(&headers("bearer  adm-2")).is_ok());
        for h in ["Bearer tok-acme", "Bearer nope", "Basic adm-1", "Bearer "] {
            assert_eq!(
                a.check(&headers(h)).unwrap_err().code.as_str(),
                "unauthorized",
                "{h:?}"
            );
        }
        assert_eq!(
            a.check(&HeaderMap::new()).unwrap_err().code.as_str(),
            "unauthorized"
        );
        // Tenants and no [admin]: nobody is an admin.
        let none = AdminAuth::from_config(&tenants, &[]);
        assert_eq!(none, AdminAuth::Tokens(vec![]));
        assert!(none.check(&headers("Bearer tok-acme")).is_err());
        // Authentication off: open; off with [admin]: the admin token only.
        assert_eq!(
            AdminAuth::from_config(&AuthConfig::Off, &[]),
            AdminAuth::Open
        );
        assert!(AdminAuth::Open.check(&HeaderMap::new()).is_ok());
        let off = AdminAuth::from_config(&AuthConfig::Off, &[d("adm-1")]);
        assert!(off.check(&HeaderMap::new()).is_err());
        assert!(off.check(&headers("Bearer adm-1")).is_ok());
    }

    #[test]
    fn auth_off_is_tenant_default() {
        let a = Auth::from_config(&AuthConfig::Off);
        assert_eq!(a.tenant(&HeaderMap::new()).unwrap().as_str(), "default");
    }
}
