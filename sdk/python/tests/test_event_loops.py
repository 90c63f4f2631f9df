"""One ``AsyncClient`` across event loops: the README's module-level client
under Starlette's ``TestClient`` (each ``with TestClient(app)`` block runs
its own loop), and whatever the transport raises becomes a
``TransportError`` (so the middleware answers 503 instead of crashing)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import httpx
import pytest
from conftest import Server, new_key
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from settle_client import AsyncClient, TransportError, fixed_principal
from settle_client.asgi import IdempotencyMiddleware

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette may prefer another httpx package for its TestClient
    from starlette.testclient import TestClient


def make_app(ledger: AsyncClient) -> tuple[Starlette, list[int]]:
    runs: list[int] = []

    async def pay(request: Request) -> Response:
        runs.append(1)
        return JSONResponse({"n": len(runs)}, status_code=201)

    app = Starlette(
        routes=[Route("/pay", pay, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, client=ledger, namespace=new_key("ns"), principal=fixed_principal("acct-1"))],
    )
    return app, runs


def test_a_module_level_client_serves_two_test_clients(server: Server) -> None:
    ledger = AsyncClient(server.url)  # as at module level in an application
    app, runs = make_app(ledger)
    for block in range(3):
        with TestClient(app) as tc:
            first = tc.post("/pay", json={}, headers={"Idempotency-Key": f"block-{block}"})
            assert first.status_code == 201, first.text
            again = tc.post("/pay", json={}, headers={"Idempotency-Key": f"block-{block}"})
            assert again.headers["idempotent-replayed"] == "true"
    assert len(runs) == 3
    gc.collect()
    assert len(ledger._per_loop) == 0  # each loop's client was closed with its loop


def test_one_client_on_successive_asyncio_runs(server: Server) -> None:
    ledger = AsyncClient(server.url)
    seen: list[httpx.AsyncClient] = []

    async def main() -> None:
        assert (await ledger.health())["status"]
        seen.append(await ledger._http())

    asyncio.run(main())
    asyncio.run(main())
    assert seen[0] is not seen[1] and seen[0].is_closed and seen[1].is_closed


class Explodes(httpx.AsyncBaseTransport):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise self.exc


@pytest.mark.parametrize("exc", [RuntimeError("Event loop is closed"), OSError("bad fd"), ValueError("?")], ids=str)
def test_any_transport_exception_is_a_transport_error(exc: BaseException) -> None:
    async def main() -> None:
        c = AsyncClient("http://ledger.test", transport=Explodes(exc))
        with pytest.raises(TransportError) as e:
            await c.health()
        assert e.value.__cause__ is exc
        app, runs = make_app(c)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app.test") as h:
            r = await h.post("/pay", json={}, headers={"Idempotency-Key": "x"})
            assert r.status_code == 503 and r.json()["code"] == "idempotency_unavailable" and not runs

    asyncio.run(main())
