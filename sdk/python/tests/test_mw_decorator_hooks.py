"""The client's kind refused where it is given, ``client=`` as a callable,
``on_replay`` (unit tests beside the shared vectors' ``replay.*``
scenarios), the warning for a return annotation without a serializer."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import json
import warnings
from typing import Any, Optional

import httpx
import pytest
from conftest import Server, new_key
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from settle_client import (
    AsyncClient,
    Client,
    Committed,
    Done,
    NotFound,
    Outcome,
    Receipt,
    fixed_principal,
    idempotent,
    run_once,
    run_once_async,
)
from settle_client.asgi import IdempotencyMiddleware as AsgiIdempotency
from settle_client.wsgi import IdempotencyMiddleware as WsgiIdempotency

REQ = {"amount": 10}


# ------------------------------------------------ the client's kind (item 6)


def test_run_once_refuses_an_async_client_before_any_ledger_call(server: Server, client: Client) -> None:
    key = new_key()
    calls: list[int] = []

    def eff(ctx: Any) -> Done:
        calls.append(1)
        return Done(1)

    with pytest.raises(TypeError, match=r"settle_client\.Client.*run_once_async"):
        run_once(AsyncClient(server.url), key, REQ, eff, principal="p")  # type: ignore[arg-type]
    assert calls == []
    with pytest.raises(NotFound):
        client.get(key)  # no lease was taken


def test_run_once_async_refuses_a_sync_client_before_any_ledger_call(client: Client) -> None:
    key = new_key()

    async def eff(ctx: Any) -> Done:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"AsyncClient.*\.aio.*run_once"):
        asyncio.run(run_once_async(client, key, REQ, eff, principal="p"))  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        client.get(key)  # before: "object Grant can't be used in 'await' expression", a lease left


def test_idempotent_names_the_client_that_fits(server: Server, client: Client) -> None:
    with pytest.raises(TypeError, match=r"AsyncClient.*\.aio"):

        @idempotent(client, key=lambda e: "k", principal="p")
        async def f(e: Any) -> None: ...

    with pytest.raises(TypeError, match=r"settle_client\.Client"):

        @idempotent(AsyncClient(server.url), key=lambda e: "k", principal="p")  # type: ignore[arg-type]
        def g(e: Any) -> None: ...


def test_flask_refuses_an_async_client(server: Server) -> None:
    import flask

    from settle_client import flask as settle_flask

    with pytest.raises(TypeError, match=r"settle_client\.Client"):
        settle_flask.init_app(flask.Flask("x"), client=AsyncClient(server.url), principal=fixed_principal("a"))  # type: ignore[arg-type]


# ------------------------------------------- client= as a callable (item 8)


class App:
    ledger: Any = None


app = App()


@idempotent(client=lambda: app.ledger, key=lambda e: e["id"], principal="p")
def charge(e: dict[str, Any]) -> dict[str, Any]:
    return {"charged": e["id"]}


@idempotent(client=lambda: app.ledger, key=lambda e: e["id"], principal="p")
async def acharge(e: dict[str, Any]) -> dict[str, Any]:
    return {"charged": e["id"]}


def test_a_module_level_function_uses_the_client_current_at_each_run(server: Server) -> None:
    k = new_key()
    taps: list[list[str]] = [[], []]

    def tapped(i: int) -> Client:
        def handle(request: httpx.Request) -> httpx.Response:
            taps[i].append(request.url.path)
            return httpx.HTTPTransport().handle_request(request)

        return Client(server.url, transport=httpx.MockTransport(handle))

    app.ledger = tapped(0)
    assert charge.invoke({"id": k}).replayed is False
    app.ledger = tapped(1)  # what a test fixture does: another ledger, same function
    again = charge.invoke({"id": k})
    assert again.replayed is True and again.value == {"charged": k}
    assert taps[0] and taps[1], taps  # each run asked the client current then


def test_the_async_twin_calls_its_factory_and_checks_the_kind(server: Server, client: Client) -> None:
    k = new_key()
    app.ledger = client  # a sync client for an async def: refused, naming AsyncClient
    with pytest.raises(TypeError, match=r"AsyncClient"):
        asyncio.run(acharge({"id": k}))
    with pytest.raises(NotFound):
        client.get(k)
    app.ledger = AsyncClient(server.url)
    assert asyncio.run(acharge({"id": k})) == {"charged": k}
    app.ledger = AsyncClient(server.url)
    with pytest.raises(TypeError, match=r"settle_client\.Client"):
        charge({"id": new_key()})


# --------------------------------------------------- on_replay (item 9)


def test_on_replay_replaces_the_value_of_a_replay_only(client: Client) -> None:
    k = new_key()
    seen: list[tuple[Outcome, Receipt]] = []

    def hook(outcome: Outcome, receipt: Receipt) -> Any:
        seen.append((outcome, receipt))
        return {"from_hook": outcome.result}

    first = run_once(client, k, REQ, lambda ctx: Done({"ok": 1}), principal="p", on_replay=hook)
    assert first.value == {"ok": 1} and seen == []
    again = run_once(client, k, REQ, lambda ctx: Done({"ok": 2}), principal="p", on_replay=hook)
    assert again.replayed and again.value == {"from_hook": {"ok": 1}}
    assert again.outcome.result == {"ok": 1}  # the stored outcome is unchanged
    assert len(seen) == 1 and seen[0][1].key == k and seen[0][1].status == "completed"


def test_on_replay_may_be_async_in_the_async_variants(server: Server) -> None:
    k = new_key()

    async def hook(outcome: Outcome, receipt: Receipt) -> Any:
        await asyncio.sleep(0)
        return ["hooked", outcome.result]

    async def main() -> tuple[Any, Any]:
        @idempotent(AsyncClient(server.url), key=lambda e: k, principal="p", on_replay=hook)
        async def f(e: Any) -> int:
            return 7

        return await f({}), await f({})

    assert asyncio.run(main()) == (7, ["hooked", 7])


def test_an_error_of_on_replay_reaches_the_caller(client: Client) -> None:
    k = new_key()
    run_once(client, k, REQ, lambda ctx: Done(1), principal="p")

    def hook(outcome: Outcome, receipt: Receipt) -> Any:
        raise LookupError("hook")

    with pytest.raises(LookupError):
        run_once(client, k, REQ, lambda ctx: Done(1), principal="p", on_replay=hook)
    assert client.get(k).status == "completed"


def _asgi_app(server: Server, on_replay: Any) -> Starlette:
    calls: list[int] = []

    async def pay(request: Request) -> Response:
        calls.append(1)
        return JSONResponse({"paid": len(calls)}, status_code=201, headers={"x-a": "1"})

    return Starlette(
        routes=[Route("/pay", pay, methods=["POST"])],
        middleware=[
            Middleware(AsgiIdempotency, client=AsyncClient(server.url), principal=fixed_principal("acct"), on_replay=on_replay)
        ],
    )


def test_asgi_on_replay_async_hook_replaces_the_replayed_response(server: Server) -> None:
    got: list[tuple[Committed, Receipt]] = []

    async def hook(response: Committed, receipt: Receipt) -> Committed:
        got.append((response, receipt))
        body = json.loads(response.body)
        return dataclasses.replace(response, status=200, body=json.dumps({"again": body}).encode())

    async def main() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=_asgi_app(server, hook))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            h = {"Idempotency-Key": new_key()}
            return await http.post("/pay", json=REQ, headers=h), await http.post("/pay", json=REQ, headers=h)

    first, again = asyncio.run(main())
    assert first.status_code == 201 and first.json() == {"paid": 1} and "idempotent-replayed" not in first.headers
    assert again.status_code == 200 and again.json() == {"again": {"paid": 1}}
    assert again.headers["idempotent-replayed"] == "true" and again.headers["content-type"] == "application/json"
    assert len(got) == 1 and got[0][0].status == 201 and got[0][1].status == "completed"


def test_wsgi_on_replay_must_answer_a_committed(server: Server) -> None:
    def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"made"]

    mw = WsgiIdempotency(wsgi_app, client=Client(server.url), principal=fixed_principal("acct"), on_replay=lambda r, rec: "nope")
    with httpx.Client(transport=httpx.WSGITransport(app=mw), base_url="http://app") as http:
        h = {"Idempotency-Key": new_key()}
        assert http.post("/pay", json=REQ, headers=h).text == "made"
        with pytest.raises(TypeError, match="Committed"):
            http.post("/pay", json=REQ, headers=h)


# ------------------------------------- a return type without serializer (10)


def test_a_return_annotation_without_serializer_warns_at_decoration(client: Client) -> None:
    with pytest.warns(UserWarning, match=r"decimal\.Decimal.*default="):

        @idempotent(client, key=lambda e: "k", principal="p")
        def price(e: Any) -> decimal.Decimal:
            return decimal.Decimal("1.5")

    with pytest.warns(UserWarning, match=r"datetime\.datetime"):

        @idempotent(client, key=lambda e: "k", principal="p")
        def when(e: Any) -> Optional[list[datetime.datetime]]:
            return None


@dataclasses.dataclass
class Charge:
    id: str


def test_json_models_dataclasses_and_default_do_not_warn(client: Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @idempotent(client, key=lambda e: "k", principal="p")
        def a(e: Any) -> dict[str, list[int]]:
            return {}

        @idempotent(client, key=lambda e: "k", principal="p")
        def b(e: Any) -> Optional[list[Charge]]:
            return None

        @idempotent(client, key=lambda e: "k", principal="p", default=str)
        def c(e: Any) -> decimal.Decimal:
            return decimal.Decimal(1)

        @idempotent(client, key=lambda e: "k", principal="p")
        def d(e: Any):  # type: ignore[no-untyped-def]  # no annotation: nothing to tell
            return 1
