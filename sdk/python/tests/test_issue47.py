"""Issue 47 beyond the fault vectors (test_fault_vectors.py): what the
vectors do not reach — the wire form of ``claim_id`` and ``forget``, a new
``claim_id`` per claim, the middlewares refusing the other kind of client,
the ``worker`` field's encoding, a streamed body over the limit that
breaks, a handler's ``EffectNotSent`` on Flask and Django, a Reconciler
whose ``stop()`` timed out, a middleware hook with no ``worker`` field, and
what ``OutcomeUnknown`` carries."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from conftest import Server, new_key
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from sync_apps import HARNESSES, Harness
from test_asgi import problem

from settle_client import (
    AsyncClient,
    Binding,
    Client,
    Committed,
    Done,
    Grant,
    InvalidRequest,
    MiddlewareHook,
    Outcome,
    OutcomeUnknown,
    Reconciler,
    fingerprint,
    fixed_principal,
    new_claim_id,
    run_once,
)
from settle_client import _mw
from settle_client.asgi import IdempotencyMiddleware as AsgiIdempotency
from settle_client.reconciler import middleware_record
from settle_client.wsgi import IdempotencyMiddleware as WsgiIdempotency

REQ = {"amount": 7}


class Tap(httpx.BaseTransport):
    """Forwards to the server and keeps every request's body."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.block_list: threading.Event | None = None
        self.listing = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        what = request.url.path.rsplit("/", 1)[-1]
        if request.url.path == "/v1/operations" and self.block_list is not None:
            self.listing.set()
            self.block_list.wait(30)
        self.bodies.append((what, json.loads(request.content) if request.content else {}))
        return self.inner.handle_request(request)


def test_claim_id_and_forget_on_the_wire() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if request.url.path.endswith("/claim"):
            return httpx.Response(200, json={"decision": "execute", "fence": 1, "lease_expires_at": "x", "attempt": 1})
        return httpx.Response(200, json={"fence": 1, "released": True})

    with Client("http://settle.test", transport=httpx.MockTransport(handler)) as c:
        cid = new_claim_id()
        assert len(cid) == 22 and all(ch.isalnum() or ch in "-_" for ch in cid)
        c.claim("k", "a" * 64, Binding("p"), claim_id=cid)
        c.release("k", 1, "not_committed", forget=True)
        c.release("k", 1)
        with pytest.raises(ValueError, match="claim_id"):
            c.claim("k", "a" * 64, Binding("p"), claim_id="short")
    assert sent[0]["claim_id"] == cid
    assert sent[1] == {"fence": 1, "reason": "not_committed", "forget": True}
    assert sent[2] == {"fence": 1, "reason": "not_dispatched"}  # forget only when asked


def test_each_claim_draws_its_claim_id_and_in_flight_draws_a_new_one(server: Server) -> None:
    """A claim that met another holder's lease (in_flight) is a definitive
    answer: the next claim is a new claim with a new id (a retry of a lost
    answer resends the same one: the fault vectors' claim.lost_once)."""
    key = new_key()
    with Client(server.url) as direct:
        held = direct.claim(key, fingerprint(REQ), Binding("p"), lease_ms=300, marks_dispatch=True)
        assert isinstance(held, Grant)
    tap = Tap()
    with Client(server.url, transport=tap) as c:
        r = run_once(c, key, REQ, lambda ctx: Done({"ok": True}), principal="p", deadline=5)
    assert r.outcome.result == {"ok": True}
    ids = [b["claim_id"] for what, b in tap.bodies if what == "claim"]
    assert len(ids) >= 2 and len(set(ids)) == len(ids), ids


def test_the_asgi_middleware_refuses_a_sync_client_and_wsgi_an_async_one() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="AsyncClient"):
        AsgiIdempotency(app, client=Client("http://x"), principal=fixed_principal("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"settle_client\.Client"):
        WsgiIdempotency(lambda e, s: [], client=AsyncClient("http://x"), principal=fixed_principal("a"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key,principal,label",
    [
        ("order-7", "acct-1", "idempotency-key=order-7 principal=acct-1"),
        ("a b", "prinçipal", "idempotency-key=a%20b principal=prin%C3%A7ipal"),
        ('"x%=', "has space", "idempotency-key=%22x%25%3D principal=has%20space"),
        ("k~._-", "", "idempotency-key=k~._- principal="),
    ],
)
def test_worker_field_is_percent_encoded_and_parses_back(key: str, principal: str, label: str) -> None:
    """SPEC §8: the extractor's principal (not the sha256: binding form),
    every byte outside A-Za-z0-9-._~ as %XX. Issue 47: the field carried the
    binding's form, unencoded (a space split it)."""
    assert _mw.worker_label(key, principal) == label
    assert _mw.parse_worker_label(label) == (key, principal)
    assert _mw.parse_worker_label("settle-reconciler") is None
    assert _mw.parse_worker_label("idempotency-key=a%zz principal=b") is None


def test_a_worker_field_over_the_ledgers_limit_carries_the_binding_form() -> None:
    label = _mw.worker_label("k", "é" * 2000)
    assert len(label) <= 4096 and _mw.parse_worker_label(label) == ("k", _mw.binding_principal("é" * 2000))


def _streaming_app(server_url: str, size: int) -> tuple[Starlette, AsyncClient]:
    ledger = AsyncClient(server_url)

    async def items(request: Request) -> Response:
        await request.body()

        async def body() -> AsyncIterator[bytes]:
            yield b"x" * size
            raise OSError("the stream broke")

        return StreamingResponse(body(), media_type="application/json")

    app = Starlette(
        routes=[Route("/items", items, methods=["POST"])],
        middleware=[
            Middleware(
                AsgiIdempotency, client=ledger, principal=fixed_principal("acct-1"), namespace=new_key("ns"), max_stored_body=64
            )
        ],
    )
    return app, ledger


@pytest.mark.parametrize("size", [16, 4096], ids=["below-the-limit", "over-the-limit"])
def test_asgi_a_streamed_body_that_breaks_is_unknown(server: Server, size: int) -> None:
    """SPEC §8 as amended: a streamed response whose body errors is
    ``unknown``, over the stored-body limit as below it."""

    async def main() -> None:
        app, ledger = _streaming_app(server.url, size)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
        ) as h:
            r = await h.post("/items", json={}, headers={"Idempotency-Key": "s-1"})
            problem(r, 500, "outcome_unknown")
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "s-1"}), 409, "outcome_unknown")
        await ledger.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("size", [16, 4096], ids=["below-the-limit", "over-the-limit"])
def test_wsgi_a_streamed_body_that_breaks_is_unknown(server: Server, size: int) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])
        yield b"x" * size
        raise OSError("the stream broke")

    mw = WsgiIdempotency(
        app, client=Client(server.url), principal=fixed_principal("acct-1"), namespace=new_key("ns"), max_stored_body=64
    )
    with httpx.Client(transport=httpx.WSGITransport(app=mw), base_url="http://t") as h:
        r = h.post("/items", json={}, headers={"Idempotency-Key": "s-1"})
        assert r.status_code == 500 and r.json()["code"] == "outcome_unknown"
        r = h.post("/items", json={}, headers={"Idempotency-Key": "s-1"})
        assert r.status_code == 409 and r.json()["code"] == "outcome_unknown"


@pytest.fixture(params=sorted(HARNESSES))
def make(request: pytest.FixtureRequest, server: Server) -> Iterator[Any]:
    kind = HARNESSES[request.param]

    def build(**options: Any) -> Harness:
        return kind(server.url, **options)

    yield build


@pytest.mark.parametrize("what", ["not_sent", "refused"])
def test_a_handler_that_raises_effect_not_sent_is_released_and_runs_again(make: Any, server: Server, what: str) -> None:
    """SPEC §8: the handler's ``EffectNotSent`` (and §11.11's
    ``EffectRefused``) says nothing was done: released ``not_committed``,
    503 ``idempotency_unavailable`` with ``Retry-After: 1``, and the next
    retry runs the handler. Flask and Django turn the exception into their
    own 500 page: the middleware reads it from the framework's signal."""
    a = make()
    r = a.post("/items", {what: True}, {"Idempotency-Key": "ns-1"})
    assert r.status == 503 and r.json()["code"] == "idempotency_unavailable" and r.headers["retry-after"] == "1"
    ns = a.mw.options.namespace
    with Client(server.url) as c:
        rec = c.get(_mw.ledger_key(ns, "acct-1", "ns-1"))
    assert rec.status == "pending" and not rec.reconcile_required
    assert rec.lease is not None and rec.lease["ended"]["reason"] == "not_committed"
    again = a.post("/items", {what: True}, {"Idempotency-Key": "ns-1"})
    assert again.status == 201 and a.count == 2


def test_a_stream_that_breaks_on_flask_and_django_is_unknown(make: Any) -> None:
    a = make(max_stored_body=64)
    r = a.post("/items", {"stream": "error", "size": 4096}, {"Idempotency-Key": "se-1"})
    assert r.status == 500 and r.json()["code"] == "outcome_unknown"
    assert a.post("/items", {"stream": "error", "size": 4096}, {"Idempotency-Key": "se-1"}).status == 409


def test_a_release_on_status_added_by_the_application_is_forgotten(make: Any, server: Server) -> None:
    """SPEC §8 ``release_on``: a status the application adds (FastAPI's
    422) is released with ``forget``: no record, and the corrected request
    with the same key runs (issue 47: the 422's record blocked it as
    ``idempotency_key_reused``)."""
    a = make(release_on=(408, 409, 425, 429, 422))
    r = a.post("/items", {"status": 422}, {"Idempotency-Key": "f-1"})
    assert r.status == 422
    with Client(server.url) as c:
        with pytest.raises(settle_client_not_found()):
            c.get(_mw.ledger_key(a.mw.options.namespace, "acct-1", "f-1"))
    fixed = a.post("/items", {"status": 201, "fixed": True}, {"Idempotency-Key": "f-1"})
    assert fixed.status == 201 and "idempotent-replayed" not in fixed.headers and a.count == 2


def settle_client_not_found() -> type[Exception]:
    from settle_client import NotFound

    return NotFound


def test_a_reconciler_whose_stop_timed_out_cannot_be_started_twice(server: Server) -> None:
    """Issue 47 item 10: ``start()`` after a ``stop()`` that timed out ran a
    second loop beside the first. Here the first loop is stuck in a listing
    (a ledger call, not a hook: it cannot be abandoned)."""
    tap = Tap()
    tap.block_list = threading.Event()
    with Client(server.url, transport=tap) as c:
        r = Reconciler(c, {new_key("none-"): lambda k, f: "unavailable"})
        r.start(interval=60)
        assert tap.listing.wait(10)
        assert r.stop(timeout=0.1) is False and r.running
        with pytest.raises(RuntimeError, match="already running"):
            r.start(interval=60)
        tap.block_list.set()
        assert r.stop(timeout=10) is True and not r.running
        r.start(interval=60)  # a stopped loop can be started again
        assert r.stop(timeout=10) is True


def test_a_middleware_hook_needs_the_worker_field(server: Server) -> None:
    """A middleware hook is told the client's key and principal from the
    claim's worker field; a record without one is counted under ``errors``
    and left untouched (nothing claimed)."""
    key = "mw-" + new_key()
    fp = fingerprint(REQ)
    with Client(server.url) as c:
        g = c.claim(key, fp, Binding("p"), worker="some worker")
        assert isinstance(g, Grant)
        c.settle(key, g.fence, fp, Binding("p"), Outcome(status="unknown"))
        assert middleware_record(c.get(key)) is None
        asked: list[Any] = []

        def hook(k: str, fence: int, rec: Any) -> Committed:
            asked.append(rec)
            return Committed(201)

        r = Reconciler(c, {key: MiddlewareHook(hook)})
        assert r.sweep() == {"seen": 1, "committed": 0, "not_committed": 0, "unavailable": 0, "skipped": 0, "errors": 1}
        rec = c.get(key)
    assert not asked and rec.raw["attempts_total"] == 1 and rec.status == "unknown"


def test_outcome_unknown_carries_the_refusal_and_the_outcome(server: Server) -> None:
    """SPEC §11.11: a settle refused 422 (a result over max_result_bytes) is
    settled unknown at once, and OutcomeUnknown carries the refusal and the
    outcome that could not be recorded (issue 47 item 9: the lease lapsed)."""
    key = new_key()
    with Client(server.url) as c:
        with pytest.raises(OutcomeUnknown) as e:
            run_once(c, key, REQ, lambda ctx: Done({"pad": "x" * 70000}), principal="p")
        rec = c.get(key)
    assert isinstance(e.value.__cause__, InvalidRequest)
    assert e.value.receipt is not None and e.value.receipt.status == "unknown"
    assert e.value.outcome is not None and e.value.outcome.result == {"pad": "x" * 70000}
    assert rec.status == "unknown" and rec.attempts[0]["error"].startswith("the ledger refused the outcome")


def test_hook_timeout_is_checked() -> None:
    with Client("http://x") as c:
        with pytest.raises(ValueError, match="hook_timeout"):
            Reconciler(c, {"": lambda k, f: "unavailable"}, hook_timeout=0)
        with pytest.raises(ValueError, match="hook_timeout"):
            run_once(c, "k", REQ, lambda ctx: Done(1), principal="p", hook_timeout=-1)
