"""SPEC §11.8 and §11.9 against a real server: what each kind of failure
does to the record and to the next call (through run_once and
@idempotent), the result that cannot be encoded, 429 from settle, and
resend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import pytest
from conftest import Server, new_key

import settle_client
from settle_client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    Done,
    EffectContext,
    EffectNotSent,
    OutcomeUnknown,
    RateLimited,
    ReconcileRequired,
    ResultNotSerializable,
    encode_result,
    idempotent,
    run_once,
)

REQ = {"order": "o-9", "amount": 1000}


class Remote:
    """A payment provider that de-duplicates by idempotency key (as Stripe
    does): a second call with a key it has seen applies nothing and answers
    the first call's result. ``applied`` counts effects really applied."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, Any]] = {}
        self.applied = 0
        self.calls = 0

    def charge(self, key: str, amount: int) -> dict[str, Any]:
        self.calls += 1
        if key not in self.by_key:
            self.applied += 1
            self.by_key[key] = {"charge": f"ch_{self.applied}", "amount": amount}
        return self.by_key[key]

    def find(self, key: str) -> dict[str, Any] | None:
        return self.by_key.get(key)


def _lease_of_attempt(client: Client, key: str, n: int) -> dict[str, Any]:
    lease: dict[str, Any] = client.get(key).attempts[n]["lease"]
    return lease


# --- not sent before the dispatch mark (marks_dispatch) -----------------------


def test_pre_dispatch_failure_releases_and_the_next_call_runs(client: Client) -> None:
    calls: list[int] = []

    @idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True)
    def charge(e: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            # The connection to the provider fails before anything is sent:
            # a plain exception, not EffectNotSent.
            raise ConnectionError("connection refused by the provider")
        settle_client.dispatch()
        return {"charged": e["amount"]}

    k = new_key()
    with pytest.raises(ConnectionError):
        charge({"id": k, "amount": 5})
    rec = client.get(k)
    assert rec.status == "pending" and not rec.reconcile_required
    assert _lease_of_attempt(client, k, 0)["ended"]["reason"] == "released"
    inv = charge.invoke({"id": k, "amount": 5})  # no ReconcileRequired: it executes
    assert inv.value == {"charged": 5} and not inv.replayed and len(calls) == 2
    assert client.get(k).status == "completed" and _lease_of_attempt(client, k, 1)["dispatched"]


def test_pre_dispatch_failure_async(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as c:
            calls: list[int] = []

            @idempotent(c, key=lambda e: e["id"], principal="svc", marks_dispatch=True)
            async def charge(e: dict[str, Any]) -> dict[str, Any]:
                calls.append(1)
                if len(calls) == 1:
                    raise ConnectionError("refused")
                await settle_client.dispatch()
                return {"n": len(calls)}

            k = new_key()
            with pytest.raises(ConnectionError):
                await charge({"id": k})
            assert await charge({"id": k}) == {"n": 2}
            rec = await c.get(k)
            assert rec.status == "completed" and rec.attempts[1]["lease"]["dispatched"]

    asyncio.run(main())


def test_an_async_dispatch_that_was_asked_for_counts_as_crossed(server: Server) -> None:
    """``settle_client.dispatch()`` without ``await`` in an async function
    records nothing; the SDK then treats a failure as possibly sent
    (unknown), never as "not sent"."""

    async def main() -> None:
        async with AsyncClient(server.url) as c:

            @idempotent(c, key=lambda e: e["id"], principal="svc", marks_dispatch=True)
            async def forgetful(e: dict[str, Any]) -> None:
                settle_client.dispatch()  # the bug under test: not awaited
                raise ConnectionError("reset after the request was sent")

            k = new_key()
            with pytest.raises(OutcomeUnknown):
                await forgetful({"id": k})
            rec = await c.get(k)
            assert rec.status == "unknown" and rec.reconcile_required

    with pytest.warns(RuntimeWarning, match="never awaited"):
        asyncio.run(main())
        import gc

        gc.collect()


# --- after the mark: unknown, and the hook resolves it ------------------------


def test_post_dispatch_failure_is_resolved_by_the_hook(client: Client) -> None:
    remote, calls = Remote(), []

    def hook(key: str, fence: int) -> settle_client.Finding:
        found = remote.find(key)
        return Done(found) if found is not None else "not_committed"

    @idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True, reconcile=hook)
    def charge(e: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        ctx = settle_client.effect_context()
        settle_client.dispatch()
        result = remote.charge(ctx.key, e["amount"])
        if len(calls) == 1:
            raise ConnectionError("the answer was lost after the provider applied the charge")
        return result

    k = new_key()
    with pytest.raises(OutcomeUnknown) as err:
        charge({"id": k, "amount": 7})
    assert isinstance(err.value.__cause__, ConnectionError) and "ConnectionError" in str(err.value)
    rec = client.get(k)
    assert rec.status == "unknown" and rec.reconcile_required
    assert "ConnectionError" in rec.attempts[0]["error"]
    inv = charge.invoke({"id": k, "amount": 7})
    assert inv.reconciled and not inv.replayed and inv.value == {"charge": "ch_1", "amount": 7}
    assert len(calls) == 1 and remote.applied == 1
    assert charge.invoke({"id": k, "amount": 7}).replayed
    assert client.get(k).status == "completed"


# --- resend (SPEC §11.9) -------------------------------------------------------


def test_resend_resolves_through_the_remotes_own_deduplication(client: Client) -> None:
    remote, calls, resends = Remote(), [], []

    @idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True, reconcile="resend")
    def charge(e: dict[str, Any]) -> dict[str, Any]:
        ctx = settle_client.effect_context()
        calls.append(ctx.fence)
        resends.append(ctx.resend)
        settle_client.dispatch()  # a local no-op in the resend: a reconcile lease cannot dispatch
        result = remote.charge(ctx.key, e["amount"])
        if len(calls) == 1:
            raise TimeoutError("the provider did not answer in time")
        return result

    k = new_key()
    with pytest.raises(OutcomeUnknown):
        charge({"id": k, "amount": 3})
    assert client.get(k).reconcile_required
    inv = charge.invoke({"id": k, "amount": 3})
    assert inv.reconciled and inv.value == {"charge": "ch_1", "amount": 3}
    # The effect ran twice, under two fences, with the same key; the remote
    # applied it once.
    assert len(calls) == 2 and calls[1] > calls[0] and resends == [False, True]
    assert remote.calls == 2 and remote.applied == 1
    rec = client.get(k)
    assert rec.status == "completed" and not rec.reconcile_required and rec.outcome is not None
    assert rec.outcome.result == {"charge": "ch_1", "amount": 3}
    assert charge.invoke({"id": k, "amount": 3}).replayed


def test_a_failed_resend_reports_unavailable(client: Client) -> None:
    def first(ctx: EffectContext) -> Done:
        ctx.dispatch()
        raise TimeoutError("lost")

    k = new_key()
    with pytest.raises(OutcomeUnknown):
        run_once(client, k, REQ, first, principal="p", marks_dispatch=True)

    def still_down(ctx: EffectContext) -> Done:
        assert ctx.resend
        raise ConnectionError("the provider is still down")

    with pytest.raises(ReconcileRequired) as e:
        run_once(client, k, REQ, still_down, principal="p", marks_dispatch=True, reconcile="resend")
    assert isinstance(e.value.__cause__, ConnectionError) and "resend failed" in str(e.value)
    rec = client.get(k)
    assert rec.status == "unknown" and rec.reconcile_required and rec.lease is not None
    assert rec.lease["ended"] is not None  # handed back at once: reconcile(unavailable)


# --- a result that cannot be encoded -------------------------------------------


def test_decimal_result_before_the_mark_is_not_sent_and_default_settles_it(client: Client) -> None:
    calls: list[int] = []

    def body(e: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        # Computed before the remote write (which would follow dispatch()).
        return {"total": Decimal("10.50")}

    k = new_key()
    plain = idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True)(body)
    with pytest.raises(ResultNotSerializable) as err:
        plain({"id": k})
    msg = str(err.value)
    assert "Decimal" in msg and "default=" in msg and "/total" in msg
    assert err.value.type_name == "Decimal" and err.value.path == "/total"
    rec = client.get(k)
    assert rec.status == "pending" and not rec.reconcile_required  # released: the key is still usable

    with_default = idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True, default=str)(body)
    inv = with_default.invoke({"id": k})
    assert inv.value == {"total": "10.50"} and not inv.replayed and len(calls) == 2
    rec = client.get(k)
    assert rec.status == "completed" and rec.outcome is not None and rec.outcome.result == {"total": "10.50"}
    assert with_default.invoke({"id": k}).value == {"total": "10.50"}


def test_decimal_result_after_the_mark_is_unknown_with_the_message(client: Client) -> None:
    @idempotent(client, key=lambda e: e["id"], principal="svc", marks_dispatch=True)
    def charged(e: dict[str, Any]) -> dict[str, Any]:
        settle_client.dispatch()
        return {"fee": [1, Decimal("0.3")]}

    k = new_key()
    with pytest.raises(OutcomeUnknown) as err:
        charged({"id": k})
    cause = err.value.__cause__
    assert isinstance(cause, ResultNotSerializable) and cause.path == "/fee/1" and "Decimal" in str(err.value)
    rec = client.get(k)
    assert rec.status == "unknown" and rec.reconcile_required
    assert "Decimal" in rec.attempts[0]["error"] and "default=" in rec.attempts[0]["error"]
    # Never silently run again: the next call needs reconciliation, and
    # the error says how to resolve it and how to find what waits.
    with pytest.raises(ReconcileRequired) as req:
        charged({"id": k})
    msg = str(req.value)
    assert "reconcile hook" in msg and "Reconciler" in msg and "client.reconcile" in msg
    assert "settle list --status unknown" in msg


def test_encode_result_rules() -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

    def money(o: Any) -> Any:
        if isinstance(o, Money):
            return {"cents": o.cents}
        raise TypeError(f"no serializer for {type(o).__name__}")

    assert encode_result({"a": (1, Money(5))}, money) == {"a": [1, {"cents": 5}]}
    for bad, type_name, path in [
        ({"a": {1, 2}}, "set", "/a"),
        ({"x/y": [float("nan")]}, "float", "/x~1y/0"),
        ({1: "int key"}, "int", ""),
        (Money(1), "Money", ""),
    ]:
        with pytest.raises(ResultNotSerializable) as e:
            encode_result(bad)
        assert (e.value.type_name, e.value.path) == (type_name, path)
    with pytest.raises(ResultNotSerializable, match="default= refused it"):
        encode_result({"when": object()}, money)


# --- 429 from settle -----------------------------------------------------------


class RateLimitedOnce(httpx.BaseTransport):
    """In front of the real server: answers the first ``limit`` claims with
    429 problem+json ``rate_limited`` and ``Retry-After``."""

    def __init__(self, limit: int = 1, retry_after: str = "1") -> None:
        self.inner = httpx.HTTPTransport()
        self.limit = limit
        self.retry_after = retry_after
        self.calls: list[tuple[str, float]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call = request.url.path.rsplit("/", 1)[-1]
        self.calls.append((call, time.monotonic()))
        if call == "claim" and self.limit > 0:
            self.limit -= 1
            body = {"type": "urn:settle:problem:rate_limited", "title": "Too many requests", "status": 429,
                    "detail": "quota", "code": "rate_limited"}  # fmt: skip
            return httpx.Response(
                429, json=body, headers={"content-type": "application/problem+json", "retry-after": self.retry_after}
            )
        return self.inner.handle_request(request)


def test_429_from_settle_is_retried_after_its_retry_after(server: Server) -> None:
    tap = RateLimitedOnce()
    with Client(server.url, transport=tap) as c:
        r = run_once(c, new_key(), REQ, lambda ctx: Done({"ok": 1}), principal="p")
    assert r.receipt.status == "completed"
    claims = [t for call, t in tap.calls if call == "claim"]
    assert len(claims) == 2
    assert claims[1] - claims[0] >= 0.95  # Retry-After: 1, not the 50 ms backoff


def test_429_until_the_deadline(server: Server) -> None:
    tap = RateLimitedOnce(limit=10**6)
    with Client(server.url, transport=tap) as c, pytest.raises(DeadlineExceeded) as e:
        run_once(c, new_key(), REQ, lambda ctx: pytest.fail("must not run"), principal="p", deadline=0.5)
    assert isinstance(e.value.last, RateLimited) and e.value.last.retry_after_s == 1.0
    assert [call for call, _ in tap.calls] == ["claim"]  # the hint is past the deadline: no second try


# --- dispatch() and effect_context() outside an effect -------------------------


def test_dispatch_outside_an_effect_is_a_clear_error() -> None:
    for fn in (settle_client.dispatch, settle_client.effect_context):
        f: Callable[[], object] = fn
        with pytest.raises(RuntimeError, match="@idempotent"):
            f()


def test_async_resend_default_and_refusal(server: Server) -> None:
    """The asyncio twins of resend, default= and ResultNotSerializable."""

    async def main() -> None:
        async with AsyncClient(server.url) as c:
            remote, calls = Remote(), []

            @idempotent(c, key=lambda e: e["id"], principal="svc", marks_dispatch=True, reconcile="resend", default=str)
            async def charge(e: dict[str, Any]) -> dict[str, Any]:
                ctx = settle_client.effect_context()
                calls.append(ctx.resend)
                await settle_client.dispatch()
                result = dict(remote.charge(ctx.key, e["amount"]), fee=Decimal("0.25"))
                if len(calls) == 1:
                    raise TimeoutError("no answer")
                return result

            k = new_key()
            with pytest.raises(OutcomeUnknown):
                await charge({"id": k, "amount": 9})
            inv = await charge.invoke({"id": k, "amount": 9})
            assert inv.reconciled and inv.value == {"charge": "ch_1", "amount": 9, "fee": "0.25"}
            assert calls == [False, True] and remote.applied == 1

            @idempotent(c, key=lambda e: e["id"], principal="svc", marks_dispatch=True)
            async def early(e: dict[str, Any]) -> Any:
                return Decimal("1")

            k2 = new_key()
            with pytest.raises(ResultNotSerializable, match="Decimal"):
                await early({"id": k2})
            rec = await c.get(k2)
            assert rec.status == "pending" and not rec.reconcile_required

    asyncio.run(main())


def test_a_lost_dispatch_answer_is_retried_under_the_same_fence(server: Server) -> None:
    from test_run_once import tapped

    c, tap = tapped(server)
    tap.fail_after["dispatch"] = 1  # recorded by the ledger, its answer lost
    calls: list[int] = []

    def effect(ctx: EffectContext) -> Done:
        ctx.dispatch()
        calls.append(ctx.fence)
        return Done({"ok": 1})

    k = new_key()
    r = run_once(c, k, REQ, effect, principal="p", marks_dispatch=True)
    assert r.receipt.status == "completed" and tap.calls.count("dispatch") == 2 and calls == [r.fence]


def test_a_dispatch_that_never_answers_is_settled_unknown(server: Server) -> None:
    """dispatch() gives up (no answer until the deadline) and raises
    EffectNotSent caused by DeadlineExceeded; the effect lets it propagate.
    The ledger did record the dispatch (only its answers were lost): the SDK
    releases not_dispatched, the ledger refuses it (receipt_required), and
    the SDK settles unknown (SPEC §11.11: never not_committed on its own
    inference). Issue 47 defect 1/5: sync released not_committed."""
    from test_run_once import tapped

    c, tap = tapped(server)
    tap.fail_after["dispatch"] = 10**6
    k = new_key()

    def effect(ctx: EffectContext) -> Done:
        ctx.dispatch()
        raise AssertionError("dispatch() must raise")

    with pytest.raises(OutcomeUnknown) as ei:
        run_once(c, k, REQ, effect, principal="p", marks_dispatch=True, lease_ms=600)
    assert isinstance(ei.value.__cause__, EffectNotSent)
    assert isinstance(ei.value.__cause__.__cause__, DeadlineExceeded)
    rec = c.get(k)
    assert rec.status == "unknown" and rec.reconcile_required
    assert rec.attempts[0]["lease"]["ended"]["reason"] == "settled"
    tap.fail_after.clear()
    with pytest.raises(ReconcileRequired):
        run_once(c, k, REQ, lambda ctx: Done({"second": 1}), principal="p", deadline=2)
