//! OpenTelemetry spans (SPEC §12 "Traces"): one span per request, one per
//! store commit, with the attributes tenant, key, fence, decision and
//! status; an incoming W3C `traceparent` is continued. The spans are
//! `tracing` spans of the target [`TARGET`]; the binary exports them over
//! OTLP/HTTP (crates/settle/src/otlp.rs) and turns them on with
//! [`enable`]. Off (the default), no span is made: a request pays one
//! relaxed atomic load.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::{HeaderMap, Method};
use opentelemetry::propagation::Extractor;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the spans exported as traces (the log leaves
/// them out).
pub const TARGET: &str = "settle_otel";

static ON: AtomicBool = AtomicBool::new(false);

/// Spans are made from now on (the binary installed an exporter and the
/// W3C propagator).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether spans are made.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one request (`Span::none()` when traces are off), a child
/// of the caller's `traceparent` when it sent one.
pub fn request_span(method: &Method, path: &str, headers: &HeaderMap) -> Span {
    if !on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %format_args!("{method} {}", route_of(path)),
        otel.kind = "server",
        http.request.method = %method,
        url.path = path,
        tenant = Empty,
        key = Empty,
        fence = Empty,
        decision = Empty,
        status = Empty,
        http.response.status_code = Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    let _ = span.set_parent(parent);
    span
}

/// The span of one store commit (a command or a batch of them), a child of
/// the request's.
pub fn commit_span(call: &'static str) -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "store commit",
        otel.name = "store commit",
        call,
        decision = Empty,
    )
}

/// Records `field` on the current request span (no-op when traces are off).
pub fn record(field: &'static str, value: impl tracing::Value) {
    if on() {
        Span::current().record(field, value);
    }
}

/// The route of a path, without the key (span names must have few values).
fn route_of(path: &str) -> &'static str {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match seg.as_slice() {
        ["v1", "operations", _, op] => match *op {
            "claim" => "/v1/operations/{key}/claim",
            "heartbeat" => "/v1/operations/{key}/heartbeat",
            "dispatch" => "/v1/operations/{key}/dispatch",
            "settle" => "/v1/operations/{key}/settle",
            "release" => "/v1/operations/{key}/release",
            "reconcile" => "/v1/operations/{key}/reconcile",
            _ => "other",
        },
        ["v1", "operations", _] => "/v1/operations/{key}",
        ["v1", "operations"] => "/v1/operations",
        ["v1", "batch"] => "/v1/batch",
        ["v1", "stats"] => "/v1/stats",
        ["v1", "principals", ..] => "/v1/principals",
        ["v1", "tasks", ..] => "/v1/tasks",
        ["v1", "admin", ..] => "/v1/admin",
        ["healthz"] => "/healthz",
        ["readyz"] => "/readyz",
        ["metrics"] => "/metrics",
        ["openapi.json"] => "/openapi.json",
        ["console", ..] => "/console",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::route_of;

    #[test]
    fn span_names_carry_the_route_not_the_key() {
        assert_eq!(
            route_of("/v1/operations/pay%2F1/claim"),
            "/v1/operations/{key}/claim"
        );
        assert_eq!(route_of("/v1/operations/k"), "/v1/operations/{key}");
        assert_eq!(route_of("/v1/batch"), "/v1/batch");
        assert_eq!(route_of("/nope/x"), "other");
    }
}
