"""SPEC §8's principal: configured by the application (no default), the
caller's account (never a credential), so that a retry after a token
refresh replays; no identity → 401; helpers for one caller and for the
framework's authenticated user."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import Server, new_key
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import settle_client
from settle_client import AsyncClient, Client, authenticated_principal, fixed_principal
from settle_client import _mw as mw
from settle_client.asgi import IdempotencyMiddleware
from test_asgi import App, problem, run

# OAuth-style access tokens: two tokens of alice (before and after a
# refresh) and one of bob.
TOKENS = {"tok-alice-1": "alice", "tok-alice-2": "alice", "tok-bob-1": "bob"}


class BearerBackend(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        auth = conn.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None  # unauthenticated: request.user is an UnauthenticatedUser
        user = TOKENS.get(auth[len("Bearer ") :])
        return (AuthCredentials(["pay"]), SimpleUser(user)) if user else None


class AuthApp:
    def __init__(self, server_url: str, principal: Any, auth: bool = True) -> None:
        self.count = 0
        self.namespace = new_key("ns")

        async def pay(request: Request) -> Response:
            self.count += 1
            return JSONResponse({"n": self.count}, status_code=201)

        stack = [Middleware(AuthenticationMiddleware, backend=BearerBackend())] if auth else []
        stack.append(Middleware(IdempotencyMiddleware, client=AsyncClient(server_url), namespace=self.namespace, principal=principal))
        self.app = Starlette(routes=[Route("/pay", pay, methods=["POST"])], middleware=stack)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app, raise_app_exceptions=False), base_url="http://app.test")


@pytest.mark.parametrize("principal", [None, "acct-1"], ids=["absent", "not callable"])
def test_the_principal_option_is_required(principal: Any) -> None:
    with pytest.raises(TypeError) as e:
        IdempotencyMiddleware(lambda s, r, se: None, client=AsyncClient("http://127.0.0.1:1"), principal=principal)  # type: ignore[arg-type, return-value]
    msg = str(e.value)
    assert "principal" in msg and "fixed_principal" in msg and "authenticated_principal" in msg


def test_the_default_principal_is_gone() -> None:
    assert not hasattr(mw, "default_principal")
    assert settle_client.fixed_principal is fixed_principal
    assert settle_client.authenticated_principal is authenticated_principal


def test_a_retry_with_a_refreshed_token_replays(server: Server) -> None:
    async def main() -> None:
        a = AuthApp(server.url, authenticated_principal())
        async with a.http() as h:
            key = {"Idempotency-Key": "order-1"}
            first = await h.post("/pay", json={"amount": 5}, headers={**key, "Authorization": "Bearer tok-alice-1"})
            assert first.status_code == 201 and a.count == 1
            # The token was refreshed; the same user retries the same request.
            again = await h.post("/pay", json={"amount": 5}, headers={**key, "Authorization": "Bearer tok-alice-2"})
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.content == first.content and a.count == 1
            # Another user with the same key is another request.
            bob = await h.post("/pay", json={"amount": 5}, headers={**key, "Authorization": "Bearer tok-bob-1"})
            assert bob.status_code == 201 and "idempotent-replayed" not in bob.headers and a.count == 2
        with Client(server.url) as c:
            rec = c.get(mw.ledger_key(a.namespace, "alice", "order-1"))
        assert rec.status == "completed" and rec.reservation["principal"] == "alice"

    run(main)


def test_no_identity_is_401_and_the_handler_does_not_run(server: Server) -> None:
    async def main() -> None:
        a = AuthApp(server.url, authenticated_principal())
        async with a.http() as h:
            for headers in ({}, {"Authorization": "Bearer expired"}):
                r = await h.post("/pay", json={}, headers={"Idempotency-Key": "k", **headers})
                body = problem(r, 401, "idempotency_principal_missing")
                assert body["title"] == "Idempotency principal missing"
                assert body["detail"] == "no principal was found for this request (see the principal option)"
            # Without a key the route's 400 comes first, as before.
            problem(await h.post("/pay", json={}), 400, "idempotency_key_missing")
            assert a.count == 0

    run(main)


def test_extractors_may_return_none_a_generation_or_be_async(server: Server) -> None:
    async def main() -> None:
        async def by_header(scope: Any) -> tuple[str, int] | None:
            for n, v in scope["headers"]:
                if n == b"x-account":
                    return v.decode(), 3
            return None

        a = App(server.url, principal=by_header)
        async with a.http() as h:
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "e-1"}), 401, "idempotency_principal_missing")
            account = new_key("acct")
            assert (await h.post("/items", json={}, headers={"Idempotency-Key": "e-1", "X-Account": account})).status_code == 201
            assert a.count == 1
        ns = str(a.app.user_middleware[0].kwargs["namespace"])
        with Client(server.url) as c:
            rec = c.get(mw.ledger_key(ns, account, "e-1"))
        assert (rec.reservation["principal"], rec.reservation["generation"]) == (account, 3)

    run(main)


def test_authenticated_principal_with_an_identity_function(server: Server) -> None:
    async def main() -> None:
        a = AuthApp(server.url, authenticated_principal(lambda user: ("acct-" + user.identity, 0)))
        async with a.http() as h:
            await h.post("/pay", json={}, headers={"Idempotency-Key": "i-1", "Authorization": "Bearer tok-alice-1"})
            r = await h.post("/pay", json={}, headers={"Idempotency-Key": "i-1", "Authorization": "Bearer tok-alice-2"})
            assert r.headers["idempotent-replayed"] == "true" and a.count == 1
        with Client(server.url) as c:
            assert c.get(mw.ledger_key(a.namespace, "acct-alice", "i-1")).status == "completed"

    run(main)


def test_authenticated_principal_without_authentication_middleware_is_a_500(server: Server) -> None:
    async def main() -> None:
        a = AuthApp(server.url, authenticated_principal(), auth=False)
        async with a.http() as h:
            r = await h.post("/pay", json={}, headers={"Idempotency-Key": "x"})
            assert r.status_code == 500 and a.count == 0

    run(main)


def test_helpers() -> None:
    assert fixed_principal("svc-billing")({}) == ("svc-billing", 0)
    assert fixed_principal("svc-billing", 2)({}) == ("svc-billing", 2)
    for bad in (-1, True, 2**53):
        with pytest.raises(ValueError):
            fixed_principal("a", bad)

    class Anonymous:
        is_authenticated = False

    extract = authenticated_principal()
    assert extract({"user": SimpleUser("alice")}) == "alice"
    assert extract({"user": Anonymous()}) is None
    with pytest.raises(RuntimeError, match="AuthenticationMiddleware"):
        extract({})
