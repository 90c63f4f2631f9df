"""The reads a reconciler needs (SPEC §7, §9, §10), through the typed
client, against the real server: list with its filters and paging, stats,
batch, and a principal's generation; and the typed 429."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Server, new_key

from settle_client import (
    AsyncClient,
    Binding,
    Client,
    FingerprintMismatch,
    Grant,
    InFlight,
    NotFound,
    Outcome,
    Page,
    RateLimited,
    Stats,
    fingerprint,
)
from settle_client.errors import problem_error

FP = fingerprint({"inspect": 1})
OTHER_FP = fingerprint({"inspect": 2})


def _unknown(c: Client, key: str, b: Binding) -> None:
    g = c.claim(key, FP, b, marks_dispatch=True)
    assert isinstance(g, Grant)
    c.dispatch(key, g.fence)
    c.settle(key, g.fence, FP, b, Outcome("unknown", error="lost"))


def test_list_filters_and_pages_by_key(client: Client) -> None:
    prefix = new_key("ls") + "-"
    b = Binding("p")
    keys = [f"{prefix}{i}" for i in range(5)]
    for k in keys[:3]:
        _unknown(client, k, b)
    for k in keys[3:]:
        g = client.claim(k, FP, b)
        assert isinstance(g, Grant)
    # Every record of the prefix, two per page, in key order, each once.
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        page = client.list(key_prefix=prefix, limit=2, after=after)
        assert isinstance(page, Page) and len(page.operations) <= 2
        seen += [o.key for o in page.operations]
        pages += 1
        if page.next is None:
            break
        after = page.next
    assert seen == keys and pages >= 3
    # The filters: reconcile required, status (one or several).
    rr = client.list(key_prefix=prefix, reconcile_required=True)
    assert [o.key for o in rr.operations] == keys[:3] and rr.next is None
    o = rr.operations[0]
    assert o.status == "unknown" and o.reconcile_required and not o.disputed and o.attempts == 1 and o.lease is None
    assert o.raw["key"] == o.key
    running = client.list(key_prefix=prefix, status="running")
    assert [x.key for x in running.operations] == keys[3:]
    both = client.list(key_prefix=prefix, status=["running", "unknown"], reconcile_required=False)
    assert [x.key for x in both.operations] == keys[3:]
    # Another order is accepted (the cursor carries it).
    assert {x.key for x in client.list(key_prefix=prefix, order="updated", limit=1000).operations} >= set(keys)


def test_stats_principal_and_batch(client: Client) -> None:
    st = client.stats()
    assert isinstance(st, Stats) and st.total >= 0
    assert set(st.by_status) == {"pending", "running", "unknown", "conflict", "failed", "completed"}
    before = st.reconcile_required
    _unknown(client, new_key(), Binding("p"))
    assert client.stats().reconcile_required == before + 1

    who = new_key("pr")
    assert client.principal(who) == 0  # never seen
    client.revoke(who)
    client.revoke(who)
    assert client.principal(who) == 2

    key = new_key()
    results = client.batch(
        [
            {"op": "claim", "key": key, "fingerprint": FP, "binding": Binding("p").to_json()},
            {"op": "get", "key": key},
            {"op": "claim", "key": key, "fingerprint": OTHER_FP, "binding": Binding("p").to_json()},
            {"op": "get", "key": new_key()},
        ]
    )
    assert [r.status for r in results] == [200, 200, 409, 404]
    assert results[0].ok and results[0].body["decision"] == "execute" and results[0].error() is None
    assert results[1].body["key"] == key and results[1].body["status"] == "running"
    assert isinstance(results[2].error(), FingerprintMismatch)
    assert isinstance(results[3].error(), NotFound)


def test_in_flight_carries_the_leases_expiry(client: Client) -> None:
    key = new_key()
    g = client.claim(key, FP, Binding("p"), lease_ms=5000)
    assert isinstance(g, Grant)
    busy = client.claim(key, FP, Binding("p"))
    assert isinstance(busy, InFlight) and busy.lease_expires_at == g.lease_expires_at


def test_429_is_rate_limited() -> None:
    e = problem_error(429, {"code": "rate_limited", "detail": "slow down"}, retry_after_s=1.0)
    assert type(e) is RateLimited and e.status == 429 and e.retry_after_s == 1.0
    # Any 429, whatever its code (a proxy's), and one without a body.
    assert isinstance(problem_error(429, {"code": "too_many_requests"}), RateLimited)
    assert problem_error(429, "<html>").code == "rate_limited"


def test_async_parity(server: Server) -> None:
    async def main() -> None:
        prefix = new_key("als") + "-"
        with Client(server.url) as sc:
            _unknown(sc, prefix + "a", Binding("p"))
        async with AsyncClient(server.url) as c:
            page = await c.list(key_prefix=prefix, reconcile_required=True)
            assert [o.key for o in page.operations] == [prefix + "a"] and page.next is None
            assert (await c.stats()).total >= 1
            assert await c.principal(new_key("nobody")) == 0
            (r,) = await c.batch([{"op": "get", "key": prefix + "a"}])
            assert r.ok and r.body["reconcile_required"] is True

    asyncio.run(main())


def test_list_refuses_a_bad_limit(client: Client) -> None:
    with pytest.raises(ValueError):
        client.list(limit=0)
