"""SPEC §8 as amended, for the ASGI middleware, against a real server: the
``reconcile`` hook's three answers, the per-route ``wait``, the
``Retry-After`` of ``request_in_progress`` from the lease's time left, and
429 from settle on the middleware's own retries."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from conftest import Server, new_key
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from test_asgi import App, problem, run

from settle_client import Client, fixed_principal
from settle_client import _mw as mw
from settle_client.asgi import (
    Committed,
    IdempotencyMiddleware,
    ReconcileRequest,
    RoutePolicy,
    idempotency_key,
    mark_retryable,
)

H = {"Idempotency-Key": "liveness-1"}


def ledger_key(a: App, key: str = "liveness-1", principal: str = "acct-1") -> str:
    return mw.ledger_key(str(a.app.user_middleware[0].kwargs["namespace"]), principal, key)


class Watch(httpx.AsyncBaseTransport):
    """The ledger's real transport, with a look at the answers: ``in_flight``
    is set when a claim was answered ``in_flight``; the first ``fail`` calls
    named in it are answered 429 ``rate_limited`` instead."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.in_flight: asyncio.Event | None = None
        self.fail = dict(fail or {})
        self.calls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = request.url.path.rsplit("/", 1)[-1]
        self.calls.append(call)
        if self.fail.get(call, 0) > 0:
            self.fail[call] -= 1
            body = {"type": "urn:settle:problem:rate_limited", "title": "Too many requests", "status": 429,
                    "detail": "quota", "code": "rate_limited"}  # fmt: skip
            return httpx.Response(429, json=body, headers={"retry-after": "0"})
        resp = await self.inner.handle_async_request(request)
        if call == "claim" and self.in_flight is not None:
            await resp.aread()
            if b'"in_flight"' in resp.content:
                self.in_flight.set()
        return resp


# --- the reconcile hook ----------------------------------------------------------


def test_reconcile_hook_committed_settles_and_replays_its_response(server: Server) -> None:
    asked: list[tuple[str, int, ReconcileRequest]] = []

    async def hook(lkey: str, fence: int, request: ReconcileRequest) -> Committed:
        asked.append((lkey, fence, request))
        return Committed(
            201,
            [("Content-Type", "application/json"), ("Location", "/items/found"), ("X-Custom", "not stored")],
            b'{"found":true}',
        )

    async def main() -> None:
        a = App(server.url, reconcile=hook)
        async with a.http() as h:
            problem(await h.post("/items", json={"raise": True}, headers=H), 500, "outcome_unknown")
            r = await h.post("/items", json={"raise": True}, headers={**H, "X-Trace": "t-2"})
            assert r.status_code == 201 and r.content == b'{"found":true}'
            assert r.headers["idempotent-replayed"] == "true" and r.headers["location"] == "/items/found"
            assert r.headers["content-type"] == "application/json" and "x-custom" not in r.headers
            # Stored: later retries replay it without asking the hook.
            again = await h.post("/items", json={"raise": True}, headers=H)
            assert again.status_code == 201 and again.content == r.content and again.headers["idempotent-replayed"] == "true"
            assert a.count == 1 and len(asked) == 1
        lkey, fence, req = asked[0]
        assert lkey == ledger_key(a)
        assert json.loads(req.body) == {"raise": True} and req.idempotency_key == "liveness-1"
        assert req.principal == "acct-1" and req.method == "POST" and req.path == "/items"
        assert req.header("x-trace") == "t-2" and req.scope["path"] == "/items"
        with Client(server.url) as c:
            rec = c.get(lkey)
        assert rec.status == "completed" and not rec.reconcile_required and rec.receipt is not None
        assert rec.receipt.fence == fence and rec.receipt.response_sha256 == mw.response_sha256(201, b'{"found":true}')

    run(main)


def test_reconcile_hook_committed_5xx_is_stored_failed(server: Server) -> None:
    async def main() -> None:
        a = App(server.url, reconcile=lambda lkey, fence, req: Committed(502, [], "upstream said no"))
        async with a.http() as h:
            problem(await h.post("/items", json={"raise": True}, headers=H), 500, "outcome_unknown")
            r = await h.post("/items", json={"raise": True}, headers=H)
            assert r.status_code == 502 and r.text == "upstream said no"
        with Client(server.url) as c:
            assert c.get(ledger_key(a)).status == "failed"

    run(main)


def test_reconcile_hook_not_committed_runs_the_handler_under_the_same_fence(server: Server) -> None:
    fences: list[int] = []

    def hook(lkey: str, fence: int, request: ReconcileRequest) -> str:
        fences.append(fence)
        return "not_committed"

    async def main() -> None:
        a = App(server.url, reconcile=hook)
        async with a.http() as h:
            problem(await h.post("/items", json={"raise": True}, headers=H), 500, "outcome_unknown")
            # The hook says it did not happen: the handler runs again (and
            # raises again: unknown again, under the hook's fence).
            problem(await h.post("/items", json={"raise": True}, headers=H), 500, "outcome_unknown")
            assert a.count == 2 and len(fences) == 1
        with Client(server.url) as c:
            rec = c.get(ledger_key(a))
        assert rec.status == "unknown" and len(rec.attempts) == 2
        assert rec.attempts[1]["lease"]["fence"] == fences[0] and rec.attempts[1]["lease"]["dispatched"]

    run(main)


def test_reconcile_hook_unavailable_is_409_and_the_record_stays_unknown(server: Server) -> None:
    asked: list[int] = []

    async def hook(lkey: str, fence: int, request: ReconcileRequest) -> str:
        asked.append(fence)
        return "unavailable"

    async def main() -> None:
        a = App(server.url, reconcile=hook)
        async with a.http() as h:
            problem(await h.post("/items", json={"raise": True}, headers=H), 500, "outcome_unknown")
            for _ in range(2):  # the lease was handed back at once: the next retry asks again
                problem(await h.post("/items", json={"raise": True}, headers=H), 409, "outcome_unknown")
            assert a.count == 1 and len(asked) == 2
        with Client(server.url) as c:
            rec = c.get(ledger_key(a))
        assert rec.status == "unknown" and rec.reconcile_required

    run(main)


# --- wait -----------------------------------------------------------------------------


def _gated_app(server_url: str, transport: httpx.AsyncBaseTransport, answers: list[int], **options: Any) -> tuple[Starlette, dict[str, Any]]:
    """POST /pay: each run takes the next status of ``answers``; the first
    run waits for ``state["gate"]``; 429 runs are not stored."""
    from settle_client import AsyncClient

    state: dict[str, Any] = {"runs": 0, "gate": None, "entered": None}

    async def pay(request: Request) -> Response:
        n = state["runs"]
        state["runs"] += 1
        if n == 0:
            state["entered"].set()
            await state["gate"].wait()
        status = answers[n]
        if status == 429:
            mark_retryable(request)
        return Response(json.dumps({"run": n}), status_code=status, media_type="application/json")

    app = Starlette(
        routes=[Route("/pay", pay, methods=["POST"])],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                client=AsyncClient(server_url, transport=transport),
                namespace=new_key("ns"),
                principal=fixed_principal("acct-1"),
                **options,
            )
        ],
    )
    return app, state


def _http(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://app.test")


@pytest.mark.parametrize("per_route", [False, True], ids=["middleware wait", "route wait"])
def test_wait_answers_the_first_requests_outcome_as_a_replay(server: Server, per_route: bool) -> None:
    async def main() -> None:
        watch = Watch()
        watch.in_flight = asyncio.Event()
        opts: dict[str, Any] = {"routes": lambda m, p: RoutePolicy(wait=10)} if per_route else {"wait": 10}
        app, state = _gated_app(server.url, watch, [201, 201], **opts)
        state["gate"], state["entered"] = asyncio.Event(), asyncio.Event()
        async with _http(app) as h:
            first = asyncio.create_task(h.post("/pay", json={}, headers=H))
            await state["entered"].wait()
            second = asyncio.create_task(h.post("/pay", json={}, headers=H))
            await watch.in_flight.wait()  # the duplicate was told in_flight and waits
            assert not second.done()
            state["gate"].set()
            a, b = await first, await second
        assert a.status_code == 201 and "idempotent-replayed" not in a.headers
        assert b.status_code == 201 and b.content == a.content and b.headers["idempotent-replayed"] == "true"
        assert state["runs"] == 1

    run(main)


def test_wait_runs_the_handler_when_the_first_released_not_committed(server: Server) -> None:
    async def main() -> None:
        watch = Watch()
        watch.in_flight = asyncio.Event()
        app, state = _gated_app(server.url, watch, [429, 201], wait=10)
        state["gate"], state["entered"] = asyncio.Event(), asyncio.Event()
        async with _http(app) as h:
            first = asyncio.create_task(h.post("/pay", json={}, headers=H))
            await state["entered"].wait()
            second = asyncio.create_task(h.post("/pay", json={}, headers=H))
            await watch.in_flight.wait()
            state["gate"].set()
            a, b = await first, await second
        assert a.status_code == 429  # said nothing happened: released not_committed
        assert b.status_code == 201 and b.json() == {"run": 1} and "idempotent-replayed" not in b.headers
        assert state["runs"] == 2

    run(main)


def test_wait_ends_with_409_request_in_progress(server: Server) -> None:
    async def main() -> None:
        watch = Watch()
        app, state = _gated_app(server.url, watch, [201], routes=lambda m, p: RoutePolicy(wait=0.4))
        state["gate"], state["entered"] = asyncio.Event(), asyncio.Event()
        async with _http(app) as h:
            first = asyncio.create_task(h.post("/pay", json={}, headers=H))
            await state["entered"].wait()
            t0 = time.monotonic()
            r = await h.post("/pay", json={}, headers=H)
            took = time.monotonic() - t0
            problem(r, 409, "request_in_progress")
            assert took >= 0.4 and watch.calls.count("claim") >= 3  # it claimed again while it waited
            state["gate"].set()
            assert (await first).status_code == 201
        assert state["runs"] == 1

    run(main)


# --- Retry-After of request_in_progress -------------------------------------------------


def test_request_in_progress_retry_after_is_the_leases_time_left(server: Server) -> None:
    async def main() -> None:
        a = App(server.url, lease_ms=6000)
        a.gate, a.entered = asyncio.Event(), asyncio.Event()
        async with a.http() as h:
            first = asyncio.create_task(h.post("/items", json={"block": True}, headers=H))
            await a.entered.wait()
            busy = await h.post("/items", json={"block": True}, headers=H)
            problem(busy, 409, "request_in_progress")
            # The lease (6 s, just granted) has about 6 s left; the claim's
            # retry hint alone (capped at 1 s) would say 1.
            assert 5 <= int(busy.headers["retry-after"]) <= 6
            a.gate.set()
            assert (await first).status_code == 201

    run(main)


def test_in_progress_retry_after_rules() -> None:
    now = mw.parse_rfc3339("2026-01-01T00:00:00Z")
    assert now is not None
    assert mw.in_progress_retry_after(1000, "2026-01-01T00:00:12.300Z", now) == "13"
    assert mw.in_progress_retry_after(1000, "2026-01-01T01:00:12.300+01:00", now) == "13"
    assert mw.in_progress_retry_after(10, "2026-01-01T00:00:00.200Z", now) == "1"  # at least 1
    assert mw.in_progress_retry_after(2500, "2026-01-01T00:00:01Z", now) == "3"  # at least the hint
    assert mw.in_progress_retry_after(10, "2025-12-31T23:59:00Z", now) == "1"  # already past
    assert mw.in_progress_retry_after(1500, None, now) == "2" and mw.in_progress_retry_after(1500, "garbage", now) == "2"


# --- 429 on the middleware's own retries ---------------------------------------------------


def test_a_429_of_settle_on_settle_and_release_is_retried(server: Server) -> None:
    async def main() -> None:
        watch = Watch(fail={"settle": 1})
        a = App(server.url, transport=watch)
        async with a.http() as h:
            r = await h.post("/items", json={}, headers=H)
            assert r.status_code == 201
        assert watch.calls.count("settle") == 2
        with Client(server.url) as c:
            assert c.get(ledger_key(a)).status == "completed"

        watch2 = Watch(fail={"release": 1})
        b = App(server.url, transport=watch2)
        async with b.http() as h:
            assert (await h.post("/items", json={"status": 429}, headers=H)).status_code == 429
        assert watch2.calls.count("release") == 2
        with Client(server.url) as c:
            rec = c.get(ledger_key(b))
        assert rec.lease is not None and rec.lease["ended"]["reason"] == "not_committed" and not rec.reconcile_required

    run(main)


def test_idempotency_key_helper_reads_the_key_as_the_middleware_does() -> None:
    def scope(*values: bytes) -> dict[str, Any]:
        return {"type": "http", "headers": [(b"idempotency-key", v) for v in values]}

    assert idempotency_key(scope(b'"k-1";a=1')) == "k-1" and idempotency_key(scope(b"k-1;a=1")) == "k-1;a=1"
    assert idempotency_key(scope()) is None and idempotency_key(scope(b"a", b"a")) is None
