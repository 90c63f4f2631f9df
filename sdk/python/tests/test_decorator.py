"""@idempotent, the Powertools-style decorator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import Server, new_key

from settle_client import AsyncClient, Client, FingerprintMismatch, OutcomeUnknown, idempotent


def test_key_does_not_depend_on_the_function_name(client: Client) -> None:
    calls: list[str] = []
    order = new_key("order")

    @idempotent(client, key=lambda event: event["order_id"], principal="svc")
    def charge(event: dict[str, Any]) -> dict[str, Any]:
        calls.append("charge")
        return {"charged": event["amount"]}

    @idempotent(client, key=lambda event: event["order_id"], principal="svc")
    def charge_renamed_in_v2(event: dict[str, Any]) -> dict[str, Any]:
        calls.append("renamed")
        return {"charged": -1}

    event = {"order_id": order, "amount": 10}
    assert charge(event) == {"charged": 10}
    inv = charge_renamed_in_v2.invoke(event)
    assert inv.replayed and inv.value == {"charged": 10} and calls == ["charge"]
    assert inv.receipt.key == order
    assert charge.__name__ == "charge"  # the wrapper keeps the function's metadata


def test_replay_indicator_and_namespace(client: Client) -> None:
    @idempotent(client, key=lambda order_id, amount: order_id, principal="svc", namespace="orders/", payload=lambda o, a: {"o": o, "a": a})
    def pay(order_id: str, amount: int) -> int:
        return amount * 2

    oid = new_key()
    first = pay.invoke(oid, 21)
    second = pay.invoke(oid, 21)
    assert (first.value, first.replayed) == (42, False)
    assert (second.value, second.replayed) == (42, True)
    assert client.get("orders/" + oid).status == "completed"


def test_payload_is_validated_before_anything_is_replayed(client: Client) -> None:
    @idempotent(client, key=lambda e: e["id"], principal="svc")
    def handler(e: dict[str, Any]) -> str:
        return "done " + str(e["amount"])

    k = new_key()
    assert handler({"id": k, "amount": 1}) == "done 1"
    with pytest.raises(FingerprintMismatch):
        handler({"id": k, "amount": 2})  # Powertools would replay "done 1" here


def test_fields_choose_the_fingerprint(client: Client) -> None:
    @idempotent(client, key=lambda e: e["id"], principal="svc", fields=["/amount"])
    def handler(e: dict[str, Any]) -> int:
        return int(e["amount"])

    k = new_key()
    assert handler({"id": k, "amount": 5, "trace": "a"}) == 5
    assert handler.invoke({"id": k, "amount": 5, "trace": "b"}).replayed


def test_return_value_is_validated_before_it_is_stored(client: Client) -> None:
    def positive(v: Any) -> None:
        if v < 0:
            raise ValueError("negative result")

    @idempotent(client, key=lambda e: e["id"], principal="svc", validate=positive)
    def handler(e: dict[str, Any]) -> Any:
        return e["value"]

    k = new_key()
    with pytest.raises(OutcomeUnknown) as e:
        handler({"id": k, "value": -1})
    assert isinstance(e.value.__cause__, ValueError)
    rec = client.get(k)
    assert rec.outcome is None or rec.outcome.result is None  # nothing was cached
    k2 = new_key()

    @idempotent(client, key=lambda e: e["id"], principal="svc")
    def not_json(e: dict[str, Any]) -> Any:
        return {1, 2, 3}

    with pytest.raises(OutcomeUnknown):
        not_json({"id": k2})
    assert client.get(k2).status == "unknown"


def test_async_decorator(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as c:
            calls: list[int] = []

            @idempotent(c, key=lambda e: e["id"], principal="svc")
            async def handler(e: dict[str, Any]) -> dict[str, Any]:
                calls.append(1)
                await asyncio.sleep(0.05)
                return {"ok": e["id"]}

            k = new_key()
            results = await asyncio.gather(*[handler.invoke({"id": k}) for _ in range(10)])
            assert len(calls) == 1 and sum(not r.replayed for r in results) == 1
            assert all(r.value == {"ok": k} for r in results)
            assert await handler({"id": k}) == {"ok": k}

    asyncio.run(main())


def test_sync_async_mismatch_is_refused(client: Client, server: Server) -> None:
    with pytest.raises(TypeError):

        @idempotent(client, key=lambda e: "k", principal="p")
        async def f(e: Any) -> None: ...

    ac = AsyncClient(server.url)
    with pytest.raises(TypeError):

        @idempotent(ac, key=lambda e: "k", principal="p")  # type: ignore[arg-type]
        def g(e: Any) -> None: ...
