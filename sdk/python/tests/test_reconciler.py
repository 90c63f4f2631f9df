"""SPEC §11.10: the Reconciler against a real server. Workers are "killed"
the two ways a process dies: after dispatch it settles ``unknown`` (it
caught its own failure) or it vanishes and its short lease lapses."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import Server, new_key

from settle_client import (
    AsyncClient,
    AsyncReconciler,
    Binding,
    Client,
    Done,
    EffectContext,
    Finding,
    Grant,
    Outcome,
    Reconciler,
    Replay,
    fingerprint,
    run_once,
)

SCOPES = ("charge",)


def request_of(key: str) -> dict[str, Any]:
    return {"charge": key, "amount": 100}


def wait_until(cond: Callable[[], bool], seconds: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def killed(client: Client, key: str, principal: str = "svc", lapse: bool = False) -> int:
    """A worker that dispatched and died: settled ``unknown``, or (``lapse``)
    gone without a word, its 300 ms lease left to expire. The fence."""
    b = Binding(principal, SCOPES)
    fp = fingerprint(request_of(key))
    g = client.claim(key, fp, b, marks_dispatch=True, lease_ms=300 if lapse else 30000)
    assert isinstance(g, Grant) and g.decision == "execute"
    client.dispatch(key, g.fence)
    if lapse:
        wait_until(lambda: client.get(key).reconcile_required, what=f"the lease of {key} to lapse")
    else:
        client.settle(key, g.fence, fp, b, Outcome("unknown", error="worker killed"))
    return g.fence


class Provider:
    """The remote: what it applied, by idempotency key; ``down`` keys it
    cannot answer for (yet)."""

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}
        self.down: set[str] = set()
        self.asked: list[tuple[str, int]] = []

    def hook(self, key: str, fence: int) -> Finding:
        self.asked.append((key, fence))
        if key in self.down:
            return "unavailable"
        found = self.applied.get(key)
        return Done(found) if found is not None else "not_committed"


def test_reconciler_resolves_records_left_unknown_by_killed_workers(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = new_key("charge") + "/"
    provider = Provider()
    k = {name: prefix + name for name in ("c1", "c2", "c3", "n1", "u1", "u2")}
    fences = {}
    for name in ("c1", "c2", "c3"):
        provider.applied[k[name]] = {"charge": "ch_" + name}
    provider.down = {k["u1"], k["u2"]}
    revoked = new_key("acct")
    fences["c1"] = killed(client, k["c1"])
    fences["c2"] = killed(client, k["c2"], principal=revoked)
    client.revoke(revoked)  # the principal moved on: the reconciler claims with its current generation
    fences["c3"] = killed(client, k["c3"], lapse=True)
    for name in ("n1", "u1", "u2"):
        fences[name] = killed(client, k[name])
    elsewhere = new_key("other")
    killed(client, elsewhere)
    done = prefix + "done"
    run_once(client, done, request_of(done), lambda ctx: Done({"ok": 1}), principal="svc", scopes=SCOPES)

    r = Reconciler(client, hooks={prefix: provider.hook})
    with caplog.at_level(logging.INFO, logger="settle_client.reconciler"):
        first = r.sweep()
    assert first == {"seen": 6, "committed": 3, "not_committed": 1, "unavailable": 2, "skipped": 0, "errors": 0}
    assert sorted(key for key, _ in provider.asked) == sorted(k.values())
    asked_fence = dict(provider.asked)  # the hook is asked under the reconciler's own, newer lease
    assert all(asked_fence[k[name]] > fences[name] for name in k)
    for name in ("c1", "c2", "c3"):
        rec = client.get(k[name])
        assert rec.status == "completed" and not rec.reconcile_required
        assert rec.outcome is not None and rec.outcome.result == {"charge": "ch_" + name}
    # not_committed: the flag is cleared and nothing is leased; the next
    # worker that holds the request executes at once.
    rec = client.get(k["n1"])
    assert not rec.reconcile_required and rec.lease is not None and rec.lease["ended"]["reason"] == "released"
    ran: list[int] = []

    def effect(ctx: EffectContext) -> Done:
        ran.append(ctx.fence)
        return Done({"charge": "ch_n1"})

    again = run_once(client, k["n1"], request_of(k["n1"]), effect, principal="svc", scopes=SCOPES, deadline=2)
    assert ran == [again.fence] and again.receipt.status == "completed"
    # unavailable: left alone, still unknown; the other prefix untouched.
    for key in (k["u1"], k["u2"], elsewhere):
        rec = client.get(key)
        assert rec.status == "unknown" and rec.reconcile_required
    # One log line per resolution, naming the key.
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "settle_client.reconciler"]
    for name in k:
        assert sum(k[name] in line for line in lines) == 1, (name, lines)

    provider.asked.clear()
    second = r.sweep()
    assert second == {"seen": 2, "committed": 0, "not_committed": 0, "unavailable": 2, "skipped": 0, "errors": 0}
    assert r.counts == {"seen": 8, "committed": 3, "not_committed": 1, "unavailable": 4, "skipped": 0, "errors": 0}
    provider.down.clear()
    provider.applied[k["u1"]] = {"charge": "ch_u1"}
    assert r.sweep() == {"seen": 2, "committed": 1, "not_committed": 1, "unavailable": 0, "skipped": 0, "errors": 0}
    assert r.sweeps == 3


def test_a_failing_hook_is_an_error_and_the_lease_is_handed_back(client: Client) -> None:
    prefix = new_key("boom") + "/"
    key = prefix + "1"
    killed(client, key)

    def hook(k: str, fence: int) -> Finding:
        raise ConnectionError("the provider's API is down")

    r = Reconciler(client, hooks={prefix: hook})
    assert r.sweep()["errors"] == 1
    rec = client.get(key)
    assert rec.reconcile_required and rec.lease is not None and rec.lease["ended"] is not None
    g = client.claim(key, fingerprint(request_of(key)), Binding("svc", SCOPES))  # at once: not in flight
    assert isinstance(g, Grant) and g.decision == "reconcile"


def test_an_execute_grant_is_released_and_skipped(server: Server) -> None:
    """Between the reconciler's read and its claim, someone resolves the
    record (reconcile not_committed, then hands the lease back): the
    reconciler's claim gets ``execute``, which it must not keep."""
    prefix = new_key("race") + "/"
    key = prefix + "1"
    with Client(server.url) as other:
        killed(other, key)

    def resolve_first(request: httpx.Request) -> None:
        if request.url.path.endswith("/claim") and key in request.url.path:
            with Client(server.url) as other:
                b, fp = Binding("svc", SCOPES), fingerprint(request_of(key))
                g = other.claim(key, fp, b, marks_dispatch=True)
                assert isinstance(g, Grant) and g.decision == "reconcile"
                other.reconcile(key, g.fence, "not_committed")
                other.release(key, g.fence, "not_dispatched")

    class Race(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            resolve_first(request)
            return self.inner.handle_request(request)

    asked: list[str] = []
    with Client(server.url, transport=Race()) as c:
        r = Reconciler(c, hooks={prefix: lambda k, f: asked.append(k) or "unavailable"})  # type: ignore[func-returns-value]
        assert r.sweep() == {"seen": 1, "committed": 0, "not_committed": 0, "unavailable": 0, "skipped": 1, "errors": 0}
    assert asked == []
    with Client(server.url) as c:
        rec = c.get(key)
        assert not rec.reconcile_required and rec.lease is not None and rec.lease["ended"]["reason"] == "released"
        assert rec.lease["purpose"] == "execute" and not rec.lease["dispatched"]


def test_the_longest_prefix_hook_handles_a_key(client: Client) -> None:
    base = new_key("nest") + "/"
    inner = base + "vip/"
    killed(client, base + "a")
    killed(client, inner + "b")
    by: dict[str, list[str]] = {"base": [], "inner": []}

    def hook_of(name: str) -> Callable[[str, int], Finding]:
        def hook(key: str, fence: int) -> Finding:
            by[name].append(key)
            return "unavailable"

        return hook

    r = Reconciler(client, hooks={base: hook_of("base"), inner: hook_of("inner")})
    assert r.sweep()["seen"] == 2
    assert by == {"base": [base + "a"], "inner": [inner + "b"]}


def test_background_sweeps_and_counts(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    prefix = new_key("bg") + "/"
    provider = Provider()
    r = Reconciler(client, hooks={prefix: provider.hook})
    with caplog.at_level(logging.INFO, logger="settle_client.reconciler"):
        r.start(interval=0.05)
        try:
            assert r.running
            with pytest.raises(RuntimeError):
                r.start()
            keys = [prefix + str(i) for i in range(3)]
            for key in keys:
                provider.applied[key] = {"found": key}
                killed(client, key)
            wait_until(lambda: r.counts["committed"] >= 3, what="the background reconciler")
        finally:
            r.stop()
    assert not r.running and r.counts["committed"] == 3 and r.counts["errors"] == 0
    assert all(client.get(key).status == "completed" for key in keys)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "settle_client.reconciler"]
    assert all(sum(key in line and "committed" in line for line in lines) == 1 for key in keys)


def test_async_reconciler(server: Server) -> None:
    prefix = new_key("async") + "/"
    with Client(server.url) as c:
        killed(c, prefix + "yes")
        killed(c, prefix + "no")
        killed(c, prefix + "later", lapse=True)

    async def hook(key: str, fence: int) -> Finding:
        await asyncio.sleep(0)
        return {"yes": Done({"ok": True}), "no": "not_committed"}.get(key.rsplit("/", 1)[1], "unavailable")  # type: ignore[return-value]

    async def main() -> None:
        async with AsyncClient(server.url) as ac:
            r = AsyncReconciler(ac, hooks={prefix: hook})
            assert await r.sweep() == {
                "seen": 3, "committed": 1, "not_committed": 1, "unavailable": 1, "skipped": 0, "errors": 0,
            }  # fmt: skip
            rep = await ac.claim(prefix + "yes", fingerprint(request_of(prefix + "yes")), Binding("svc", SCOPES))
            assert isinstance(rep, Replay) and rep.outcome.result == {"ok": True}
            r.start(interval=0.05)
            deadline = time.monotonic() + 10
            while r.counts["seen"] < 5:  # the background sweeps see the unavailable one again
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await r.stop()
            assert not r.running and r.counts["errors"] == 0

    asyncio.run(main())


def test_a_reconciler_needs_hooks(client: Client) -> None:
    with pytest.raises(ValueError):
        Reconciler(client, hooks={})


def test_a_cancelled_caller_stays_cancelled_while_a_heartbeat_or_the_reconciler_stops(server: Server) -> None:
    """A task cancelled while it waits for a heartbeat (or a background
    reconciler) to stop ends cancelled: the waits once caught that task's
    own CancelledError with the helper's, and the cancelled task ran on (the
    async reconciler test then hung in stop())."""
    from settle_client.worker import _AsyncHeartbeat

    async def main() -> None:
        async with AsyncClient(server.url) as ac:
            hb = _AsyncHeartbeat(ac, new_key(), 1, 60_000, asyncio.Event())
            ran_on = asyncio.Event()

            async def caller() -> None:
                await hb.stop()
                ran_on.set()

            t = asyncio.get_running_loop().create_task(caller())
            await asyncio.sleep(0)  # caller is now waiting in hb.stop()
            t.cancel()
            await asyncio.wait({t}, timeout=5)
            assert t.cancelled() and not ran_on.is_set()

            async def unavailable(key: str, fence: int) -> Finding:
                return "unavailable"

            r = AsyncReconciler(ac, hooks={new_key("none") + "/": unavailable})
            r.start(interval=60)
            stopper = asyncio.get_running_loop().create_task(r.stop())
            await asyncio.sleep(0)
            stopper.cancel()
            await asyncio.wait({stopper}, timeout=5)
            assert stopper.cancelled()

    asyncio.run(main())
