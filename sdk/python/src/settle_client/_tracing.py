"""W3C trace context for the requests to settle (SPEC §12, Traces), without
a dependency on OpenTelemetry.

When the ``opentelemetry`` API package is importable (tried once, when this
module is imported), every request the clients send carries the headers its
global propagator writes for the caller's active context: by default W3C
``traceparent`` (and ``tracestate`` when the context has one), plus
``baggage`` when baggage is set. Without an active span it writes no
``traceparent``; without the package, nothing is added.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["trace_headers"]

_inject: Callable[[dict[str, str]], None] | None
try:
    from opentelemetry.propagate import inject as _otel_inject
except ImportError:  # the package is optional: no trace headers then
    _inject = None
else:
    _inject = _otel_inject


def trace_headers() -> dict[str, str] | None:
    """The trace context headers of the caller's active context, or None
    (no OpenTelemetry, nothing active, or a propagator that failed: tracing
    never fails a call to the ledger)."""
    if _inject is None:
        return None
    carrier: dict[str, str] = {}
    try:
        _inject(carrier)
    except Exception:  # noqa: BLE001 - a broken propagator must not break the request
        return None
    return carrier or None
