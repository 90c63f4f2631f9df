//! The caller's trace context on every request (feature `opentelemetry`,
//! SPEC §12 "Traces"): the OpenTelemetry context current on the calling
//! thread when the call is made, written by the global propagator — with
//! `TraceContextPropagator` installed, `traceparent` (and `tracestate`).
//! No active span, or no propagator installed: no header.

use hyper::HeaderMap;
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::Injector;

struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        // A propagator's header that is not a valid header is left out
        // rather than failing the call.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Adds the current context's propagation headers to `headers`.
pub(crate) fn inject(headers: &mut HeaderMap) {
    let cx = opentelemetry::Context::current();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut Headers(headers))
    });
}
