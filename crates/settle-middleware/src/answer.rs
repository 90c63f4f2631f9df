//! The answers the layer makes itself: its refusals (SPEC §8's problem
//! documents) and the replay of a stored response, each counted and logged.

use axum::body::Body;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use axum::http::{Response, StatusCode};

use crate::layer::{HookResponse, IDEMPOTENT_REPLAYED, ReplayFn};
use crate::layout::{self, StoredResponse};
use crate::table::{self, Problem};

/// Counts and logs an answer of the middleware (SPEC §8: every replay and
/// refusal is counted in metrics and logged with the key).
pub(crate) fn note(answer: &'static str) {
    metrics::counter!("settle_middleware_requests_total", "answer" => answer).increment(1);
}

pub(crate) fn refuse(p: &Problem, key: Option<&str>) -> Response<Body> {
    note(p.code);
    tracing::info!(
        key,
        code = p.code,
        status = p.status,
        "idempotency: refused"
    );
    problem(p)
}

pub(crate) fn problem(p: &Problem) -> Response<Body> {
    let body = layout::problem_body(p.status, p.code, p.detail);
    let mut r = Response::new(Body::from(body.clone()));
    *r.status_mut() = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some(ra) = &p.retry_after
        && let Ok(v) = HeaderValue::from_str(ra)
    {
        h.insert(RETRY_AFTER, v);
    }
    r
}

/// A replay through the layer's `on_replay` hook, when there is one and
/// the response was stored: what the hook returns, as a replay.
pub(crate) fn replay_hooked(
    hook: Option<&ReplayFn>,
    stored: StoredResponse,
    receipt: &settle_core::Receipt,
    key: &str,
) -> Response<Body> {
    let (Some(hook), Some(body)) = (hook, stored.body.as_ref()) else {
        return replay(stored, key);
    };
    let given = HookResponse {
        status: stored.status,
        headers: stored.headers.clone(),
        body: body.clone().into(),
    };
    let r = hook(given, receipt);
    replay(
        StoredResponse {
            status: r.status,
            headers: r
                .headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect(),
            body: Some(r.body.to_vec()),
        },
        key,
    )
}

/// The stored response, as it went out the first time, plus
/// `Idempotent-Replayed: true`.
pub(crate) fn replay(stored: StoredResponse, key: &str) -> Response<Body> {
    let Some(body) = stored.body else {
        return refuse(&table::RESPONSE_NOT_STORED, Some(key));
    };
    note("replayed");
    tracing::info!(key, "idempotency: replay");
    let mut r = Response::new(Body::from(body.clone()));
    *r.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let h = r.headers_mut();
    for (n, v) in stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_bytes(&v),
        ) {
            h.append(n, v);
        }
    }
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    r
}
