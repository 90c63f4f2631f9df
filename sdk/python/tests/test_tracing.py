"""SPEC §12, Traces: every request to settle carries the caller's W3C trace
context (``traceparent``, ``tracestate``) when OpenTelemetry is installed and
a span is active, and no trace header otherwise; without the
``opentelemetry`` package the client works and sends none. The requests are
captured by an httpx ``MockTransport``: no settle server is needed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from settle_client import AsyncClient, Client, Done, EffectContext, run_once

RECORD = {
    "key": "k",
    "status": "pending",
    "rank": 0,
    "reservation": {"fingerprint": "0" * 64, "principal": "svc", "scopes": [], "generation": 0},
    "lease": None,
    "outcome": None,
    "receipt": None,
    "reconcile_required": False,
    "disputed": False,
    "attempts": [],
    "quarantine": [],
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
    "expires_at": None,
}

tracer = TracerProvider().get_tracer("settle-client-tests")  # not registered globally: nothing leaks


class Captured:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.lock = threading.Lock()

    def answer(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        return httpx.Response(200, json=RECORD)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.answer)

    def last(self) -> httpx.Headers:
        return self.requests[-1].headers


@pytest.fixture
def captured() -> Iterator[Captured]:
    yield Captured()


def trace_id_of(traceparent: str) -> int:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2), traceparent
    return int(trace_id, 16)


def test_sync_client_sends_the_active_span_s_trace_context(captured: Captured) -> None:
    with Client("http://settle.test", transport=captured.transport()) as c:
        c.get("k")
        assert "traceparent" not in captured.last() and "tracestate" not in captured.last()
        with tracer.start_as_current_span("charge") as span:
            c.get("k")
            sent = captured.last()["traceparent"]
            ctx = span.get_span_context()
            assert trace_id_of(sent) == ctx.trace_id
            assert sent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
        c.get("k")  # the span ended: nothing active any more
        assert "traceparent" not in captured.last()


def test_tracestate_of_the_active_context_is_sent(captured: Captured) -> None:
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque")]),
    )
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        with Client("http://settle.test", transport=captured.transport()) as c:
            c.get("k")
    finally:
        otel_context.detach(token)
    h = captured.last()
    assert h["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert h["tracestate"] == "vendor=opaque"


def test_async_client_sends_the_active_span_s_trace_context(captured: Captured) -> None:
    async def main() -> None:
        async with AsyncClient("http://settle.test", transport=captured.transport()) as c:
            await c.get("k")
            assert "traceparent" not in captured.last()
            with tracer.start_as_current_span("charge") as span:
                await c.get("k")
                assert trace_id_of(captured.last()["traceparent"]) == span.get_span_context().trace_id
            await c.get("k")
            assert "traceparent" not in captured.last()

    asyncio.run(main())


def test_run_once_requests_and_heartbeats_carry_the_caller_s_trace_context() -> None:
    # run_once's heartbeat thread runs in a copy of the caller's context:
    # its requests are in the caller's trace, as the claim and release are.
    seen: list[httpx.Request] = []
    beat = threading.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        op = request.url.path.rsplit("/", 1)[-1]
        if op == "claim":
            return httpx.Response(
                200, json={"decision": "execute", "fence": 1, "attempt": 1, "lease_expires_at": "2026-01-01T00:00:30Z"}
            )
        if op == "heartbeat":
            beat.set()
            return httpx.Response(200, json={"fence": 1, "lease_expires_at": "2026-01-01T00:00:30Z"})
        assert op == "release", request.url
        return httpx.Response(200, json={"fence": 1, "released": True})

    def effect(ctx: EffectContext) -> Done:
        assert beat.wait(10), "no heartbeat"  # a lease of 30 ms: a beat every 10 ms
        raise RuntimeError("stopped before the dispatch mark: the lease is released")

    with Client("http://settle.test", transport=httpx.MockTransport(answer)) as c:
        with tracer.start_as_current_span("job") as span, pytest.raises(RuntimeError):
            run_once(c, "k", {"a": 1}, effect, principal="svc", lease_ms=30, marks_dispatch=True)
    ops = [r.url.path.rsplit("/", 1)[-1] for r in seen]
    assert ops[0] == "claim" and ops[-1] == "release" and "heartbeat" in ops, ops
    assert {trace_id_of(r.headers["traceparent"]) for r in seen} == {span.get_span_context().trace_id}


def test_without_opentelemetry_no_trace_header() -> None:
    # A fresh interpreter where `import opentelemetry` fails: the client
    # imports and works, and sends no trace header.
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["opentelemetry"] = None  # ImportError on import
        import httpx
        from settle_client import Client
        seen = []
        def answer(request):
            seen.append(dict(request.headers))
            return httpx.Response(200, json={"status": "ok"})
        with Client("http://settle.test", transport=httpx.MockTransport(answer)) as c:
            c.health()
        print(json.dumps(seen))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    (headers,) = json.loads(out)
    assert "traceparent" not in headers and "user-agent" in headers
