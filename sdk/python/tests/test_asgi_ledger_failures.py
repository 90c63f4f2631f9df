"""SPEC §8: what the middleware answers when the ledger does not grant a
claim or a dispatch. Only a ledger that gave no answer (or a 503
``unavailable``) lets a fail-open route run the handler; every refusal is a
problem answer and the handler does not run, fail-open or not. And a
dispatch whose answer was lost is retried, then handed back without leaving
an ``unknown`` record behind."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import Server, new_key
from test_asgi import App, problem, run

from settle_client import Client
from settle_client import _mw as mw
from settle_client.asgi import RoutePolicy
from settle_client.errors import (
    DeadlineExceeded,
    ProblemError,
    RecordRefused,
    StaleBinding,
    TransportError,
    Unavailable,
    problem_error,
)

FAIL_OPEN: dict[str, Any] = {"routes": lambda m, p: RoutePolicy(fail_open=True) if m == "POST" else None}


def test_revoked_principal_with_fail_open_does_not_run_a_completed_request_again(server: Server) -> None:
    """Against the real server: the principal of a completed request is
    revoked; the retry's claim is refused (stale_binding) and must not fall
    back to running the handler (fail_open applies to an unreachable
    ledger only)."""

    async def main() -> None:
        principal = new_key("acct")
        a = App(server.url, principal=lambda scope: principal, **FAIL_OPEN)
        async with a.http() as h:
            first = await h.post("/items", json={}, headers={"Idempotency-Key": "pay-1"})
            assert first.status_code == 201 and a.count == 1
            with Client(server.url) as c:
                assert c.revoke(principal).generation == 1
            again = await h.post("/items", json={}, headers={"Idempotency-Key": "pay-1"})
            body = problem(again, 403, "idempotency_forbidden")
            assert body["title"] == "Idempotency forbidden"
            assert body["detail"] == "the ledger refused this caller's binding (its principal was revoked or moved on)"
            assert "retry-after" not in again.headers
            # A new key of the revoked principal: refused too, not run.
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "pay-2"}), 403, "idempotency_forbidden")
            assert a.count == 1

    run(main)


def test_generation_moves_a_revoked_principal_forward(server: Server) -> None:
    async def main() -> None:
        principal = new_key("acct")
        generation = 0
        a = App(server.url, principal=lambda scope: (principal, generation))
        async with a.http() as h:
            assert (await h.post("/items", json={}, headers={"Idempotency-Key": "g-1"})).status_code == 201
            with Client(server.url) as c:
                c.revoke(principal)
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "g-2"}), 403, "idempotency_forbidden")
            generation = 1
            assert (await h.post("/items", json={}, headers={"Idempotency-Key": "g-2"})).status_code == 201
            assert a.count == 2
        ns = str(a.app.user_middleware[0].kwargs["namespace"])
        with Client(server.url) as c:
            rec = c.get(mw.ledger_key(ns, principal, "g-2"))
        assert rec.status == "completed" and rec.reservation["generation"] == 1

    run(main)


# --- the classification, through the middleware, with a scripted ledger ------


def _problem_answer(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"type": f"urn:settle:problem:{code}", "title": code, "status": status, "detail": code, "code": code}
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json", **(headers or {})})


GRANT = {"decision": "execute", "fence": 7, "lease_expires_at": "2030-01-01T00:00:00Z", "attempt": 1}


def _ledger(claim: Callable[[], httpx.Response], dispatch: Callable[[], httpx.Response] | None = None) -> tuple[httpx.MockTransport, list[str]]:
    calls: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        what = req.url.path.rsplit("/", 1)[-1]
        calls.append(what if what != "release" else "release:" + json.loads(req.content).get("reason", ""))
        if what == "claim":
            return claim()
        if what == "dispatch" and dispatch is not None:
            return dispatch()
        if what == "release":
            return httpx.Response(200, json={"fence": 7, "released": True})
        return _problem_answer(500, "unexpected")

    return httpx.MockTransport(handle), calls


def _no_answer() -> httpx.Response:
    raise httpx.ConnectError("connection refused")


REFUSALS: list[tuple[str, Callable[[], httpx.Response], int, str, str | None, bool]] = [
    # name, the ledger's answer, our status, our code, our Retry-After, logged as an error
    ("stale_binding", lambda: _problem_answer(409, "stale_binding"), 403, "idempotency_forbidden", None, False),
    ("record_refused", lambda: _problem_answer(503, "record_refused"), 503, "idempotency_unavailable", "4", False),
    ("429 with Retry-After", lambda: _problem_answer(429, "too_many_requests", {"retry-after": "2.5"}), 503, "idempotency_unavailable", "3", False),
    ("429 with Retry-After 0", lambda: _problem_answer(429, "too_many_requests", {"retry-after": "0"}), 503, "idempotency_unavailable", "1", False),
    ("429 without Retry-After", lambda: _problem_answer(429, "too_many_requests"), 503, "idempotency_unavailable", "4", False),
    ("invalid_request", lambda: _problem_answer(422, "invalid_request"), 503, "idempotency_unavailable", "4", True),
    ("401 from settle", lambda: _problem_answer(401, "unauthorized"), 503, "idempotency_unavailable", "4", True),
    ("a 409 it has no rule for", lambda: _problem_answer(409, "stale_fence"), 503, "idempotency_unavailable", "4", True),
    ("a 200 it cannot read", lambda: httpx.Response(200, json={"decision": "maybe"}), 503, "idempotency_unavailable", "4", True),
    ("a 502 of a proxy", lambda: httpx.Response(502, text="<html>bad gateway</html>"), 503, "idempotency_unavailable", "4", True),
]


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail_closed", "fail_open"])
@pytest.mark.parametrize("name,answer,status,code,retry_after,error", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_claim_never_runs_the_handler(
    fail_open: bool,
    name: str,
    answer: Callable[[], httpx.Response],
    status: int,
    code: str,
    retry_after: str | None,
    error: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        transport, _ = _ledger(answer)
        opts: dict[str, Any] = dict(FAIL_OPEN) if fail_open else {}
        a = App("http://ledger.test", transport=transport, unavailable_retry_after_s=4, **opts)
        async with a.http() as h:
            r = await h.post("/items", json={}, headers={"Idempotency-Key": new_key()})
            problem(r, status, code)
            assert r.headers.get("retry-after") == retry_after
            assert a.count == 0

    with caplog.at_level(logging.INFO, logger="settle_client.asgi"):
        run(main)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert bool(errors) == error, [rec.getMessage() for rec in caplog.records]


@pytest.mark.parametrize(
    "answer",
    [_no_answer, lambda: _problem_answer(503, "unavailable", {"retry-after": "1"})],
    ids=["no answer", "503 unavailable"],
)
def test_an_unreachable_ledger_may_fail_open(answer: Callable[[], httpx.Response]) -> None:
    async def main() -> None:
        transport, _ = _ledger(answer)
        closed = App("http://ledger.test", transport=transport, unavailable_retry_after_s=4)
        async with closed.http() as h:
            r = await h.post("/items", json={}, headers={"Idempotency-Key": new_key()})
            problem(r, 503, "idempotency_unavailable")
            assert r.headers["retry-after"] == "4" and closed.count == 0
        open_ = App("http://ledger.test", transport=transport, **FAIL_OPEN)
        async with open_.http() as h:
            r = await h.post("/items", json={}, headers={"Idempotency-Key": new_key()})
            assert r.status_code == 201 and open_.count == 1

    run(main)


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail_closed", "fail_open"])
def test_a_refused_dispatch_never_runs_the_handler(fail_open: bool) -> None:
    async def main() -> None:
        transport, calls = _ledger(lambda: httpx.Response(200, json=GRANT), lambda: _problem_answer(409, "lease_expired"))
        opts: dict[str, Any] = dict(FAIL_OPEN) if fail_open else {}
        a = App("http://ledger.test", transport=transport, **opts)
        async with a.http() as h:
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": new_key()}), 503, "idempotency_unavailable")
            assert a.count == 0
        assert calls == ["claim", "dispatch", "release:not_dispatched"]

    run(main)


def test_classification_table() -> None:
    def c(err: BaseException) -> tuple[bool, int, str, int | None, bool]:
        f = mw.classify_ledger_error(err, 2)
        return f.fail_open, f.status, f.code, f.retry_after, f.unexpected

    assert c(TransportError("x")) == (True, 503, "idempotency_unavailable", 2, False)
    assert c(problem_error(503, {"code": "unavailable"}, 9.0)) == (True, 503, "idempotency_unavailable", 2, False)
    assert c(DeadlineExceeded("d", TransportError("x"))) == (True, 503, "idempotency_unavailable", 2, False)
    assert c(problem_error(409, {"code": "stale_binding"})) == (False, 403, "idempotency_forbidden", None, False)
    assert c(RecordRefused(503, "record_refused")) == (False, 503, "idempotency_unavailable", 2, False)
    assert c(problem_error(429, {"code": "slow_down"}, 0.2)) == (False, 503, "idempotency_unavailable", 1, False)
    assert c(problem_error(429, {"code": "slow_down"}, 7.0)) == (False, 503, "idempotency_unavailable", 7, False)
    assert c(problem_error(429, None)) == (False, 503, "idempotency_unavailable", 2, False)
    assert c(problem_error(401, None)) == (False, 503, "idempotency_unavailable", 2, True)
    assert c(Unavailable(500, "unavailable")) == (False, 503, "idempotency_unavailable", 2, True)
    assert c(ValueError("unreadable answer")) == (False, 503, "idempotency_unavailable", 2, True)
    assert isinstance(problem_error(409, {"code": "stale_binding"}), StaleBinding)
    assert isinstance(problem_error(429, None, 3.0), ProblemError) and problem_error(429, None, 3.0).retry_after_s == 3.0


# --- a dispatch whose answer is lost ------------------------------------------


class LosesDispatchAnswers(httpx.AsyncBaseTransport):
    """A real connection to settle that drops the answer of the first
    ``lose`` dispatch calls after the server handled them (as a connection
    reset after the request was read would)."""

    def __init__(self, lose: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lose = lose
        self.calls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        what = request.url.path.rsplit("/", 1)[-1]
        if what == "release":
            what += ":" + json.loads(request.content).get("reason", "")
        self.calls.append(what)
        resp = await self.inner.handle_async_request(request)
        if what == "dispatch" and self.lose > 0:
            self.lose -= 1
            await resp.aread()
            await resp.aclose()
            raise httpx.ReadError("connection reset (test: the dispatch answer is lost)")
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_lost_dispatch_answer_is_retried_and_the_handler_runs(server: Server) -> None:
    async def main() -> None:
        t = LosesDispatchAnswers(lose=1)
        a = App(server.url, transport=t)
        async with a.http() as h:
            first = await h.post("/items", json={}, headers={"Idempotency-Key": "d-1"})
            assert first.status_code == 201 and a.count == 1
            again = await h.post("/items", json={}, headers={"Idempotency-Key": "d-1"})
            assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
            assert a.count == 1
        assert t.calls[:4] == ["claim", "dispatch", "dispatch", "settle"]
        await t.aclose()

    run(main)


def test_a_dispatch_that_never_answers_is_settled_unknown_not_attested(server: Server) -> None:
    """Every dispatch answer is lost (the ledger recorded it): the lease is
    handed back with not_dispatched and the ledger decides (SPEC §11.11: an
    SDK never attests on its own inference): receipt_required, so the record
    is settled unknown and the request gets 500 outcome_unknown; a retry
    finds 409 outcome_unknown (a hook or the Reconciler resolves it). Issue
    47: the middleware released not_committed on its own and answered 503."""

    async def main() -> None:
        t = LosesDispatchAnswers(lose=1000)
        a = App(server.url, transport=t, lease_ms=600)
        async with a.http() as h:
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "d-2"}), 500, "outcome_unknown")
            assert a.count == 0
            ns = str(a.app.user_middleware[0].kwargs["namespace"])
            with Client(server.url) as c:
                rec = c.get(mw.ledger_key(ns, "acct-1", "d-2"))
            assert rec.status == "unknown" and rec.reconcile_required
            assert rec.lease is not None and rec.lease["dispatched"] and rec.lease["ended"]["reason"] == "settled"
            t.lose = 0
            problem(await h.post("/items", json={}, headers={"Idempotency-Key": "d-2"}), 409, "outcome_unknown")
            assert a.count == 0
        assert t.calls.count("dispatch") >= 3  # retried, then the retry's own
        i = t.calls.index("release:not_dispatched")
        assert t.calls[i : i + 2] == ["release:not_dispatched", "settle"]
        assert "release:not_committed" not in t.calls
        await t.aclose()

    run(main)


def test_a_dispatch_that_never_answers_is_unknown_on_a_fail_open_route_too(server: Server) -> None:
    async def main() -> None:
        t = LosesDispatchAnswers(lose=1000)
        a = App(server.url, transport=t, lease_ms=600, **FAIL_OPEN)
        async with a.http() as h:
            r = await h.post("/items", json={}, headers={"Idempotency-Key": "d-3"})
            problem(r, 500, "outcome_unknown")
            assert a.count == 0  # the record is unknown: running it unwrapped could be a second effect
            assert t.calls[-2:] == ["release:not_dispatched", "settle"]
        await t.aclose()

    run(main)

