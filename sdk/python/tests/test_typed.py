"""Pydantic models and dataclasses as payloads and results of run_once,
run_once_async and @idempotent, against a real settle server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

import pytest
from conftest import Server, new_key
from pydantic import BaseModel

from settle_client import AsyncClient, Client, Done, FingerprintMismatch, fingerprint, idempotent, run_once, run_once_async
from settle_client._typed import restore, to_json


class Charge(BaseModel):
    order: str
    amount: int
    currency: str = "EUR"


class Receipt(BaseModel):
    id: str
    amount: int
    tags: list[str] = []


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class Order:
    id: str
    lines: list[Line]
    note: Optional[str] = None
    meta: dict[str, Line] = field(default_factory=dict)


def test_to_json_and_restore_round_trip() -> None:
    o = Order("o-1", [Line("a", 1), Line("b", 2)], meta={"x": Line("c", 3)})
    j = to_json(o)
    assert j == {"id": "o-1", "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}], "note": None, "meta": {"x": {"sku": "c", "qty": 3}}}
    assert restore(j, Order) == o
    assert restore([j], list[Order]) == [o]
    assert restore(None, Optional[Order]) is None and restore(j, Optional[Order]) == o
    r = Receipt(id="r", amount=1, tags=["t"])
    assert restore(to_json(r), Receipt) == r
    assert restore({"a": 1}, dict) == {"a": 1}  # no model in the type: the JSON as it is


def test_a_model_payload_is_fingerprinted_as_its_json() -> None:
    c = Charge(order="o-1", amount=100)
    assert fingerprint(c) == fingerprint({"order": "o-1", "amount": 100, "currency": "EUR"})
    assert fingerprint(Line("a", 1)) == fingerprint({"sku": "a", "qty": 1})
    assert fingerprint(c, ["/amount"]) == fingerprint({"amount": 100}, ["/amount"])


def test_run_once_with_models_first_run_and_replay_are_equal(client: Client) -> None:
    key = new_key("typed")
    runs = 0

    def effect(ctx: object) -> Done:
        nonlocal runs
        runs += 1
        return Done(Receipt(id=f"r-{runs}", amount=100, tags=["x"]))

    first = run_once(client, key, Charge(order="o-1", amount=100), effect, principal="p", result_type=Receipt)
    again = run_once(client, key, Charge(order="o-1", amount=100), effect, principal="p", result_type=Receipt)
    assert isinstance(first.value, Receipt) and first.value == again.value == Receipt(id="r-1", amount=100, tags=["x"])
    assert not first.replayed and again.replayed and runs == 1
    assert again.outcome.result == {"id": "r-1", "amount": 100, "tags": ["x"]}  # stored as JSON
    # Another payload under the same key: a mismatch, never the stored result.
    with pytest.raises(FingerprintMismatch):
        run_once(client, key, Charge(order="o-1", amount=101), effect, principal="p", result_type=Receipt)
    assert runs == 1


def test_run_once_async_with_dataclasses(server: Server) -> None:
    async def main() -> None:
        ledger = AsyncClient(server.url)
        key = new_key("typed")

        async def effect(ctx: object) -> Done:
            return Done(Order("o-9", [Line("a", 2)]))

        first = await run_once_async(ledger, key, Line("a", 2), effect, principal="p", result_type=Order)
        again = await run_once_async(ledger, key, Line("a", 2), effect, principal="p", result_type=Order)
        assert first.value == again.value == Order("o-9", [Line("a", 2)]) and again.replayed
        assert isinstance(again.value.lines[0], Line)
        with pytest.raises(FingerprintMismatch):
            await run_once_async(ledger, key, Line("a", 3), effect, principal="p", result_type=Order)
        await ledger.aclose()

    asyncio.run(main())


def test_idempotent_restores_the_return_annotation(client: Client) -> None:
    runs: list[str] = []

    @idempotent(client, key=lambda c: c.order, principal="p", namespace=new_key("ns") + "/")
    def charge(c: Charge) -> Receipt:
        runs.append(c.order)
        return Receipt(id=f"r-{len(runs)}", amount=c.amount)

    first = charge.invoke(Charge(order="o-1", amount=5))
    again = charge.invoke(Charge(order="o-1", amount=5))
    assert isinstance(first.value, Receipt) and first.value == again.value and again.replayed and runs == ["o-1"]
    with pytest.raises(FingerprintMismatch):
        charge(Charge(order="o-1", amount=6))

    @idempotent(client, key=lambda o: o.id, principal="p", namespace=new_key("ns") + "/")
    def lines(o: Order) -> list[Line]:
        return o.lines

    o = Order("o-2", [Line("a", 1), Line("b", 2)])
    assert lines(o) == lines(o) == [Line("a", 1), Line("b", 2)]

    @idempotent(client, key=lambda o: o.id, principal="p", namespace=new_key("ns") + "/")
    def maybe(o: Order) -> Optional[Order]:
        return o if o.note else None

    assert maybe(o) is None and maybe(o) is None
    noted = Order("o-3", [Line("z", 9)], note="n")
    assert maybe(noted) == maybe(noted) == noted


def test_idempotent_async_restores_the_awaited_type(server: Server) -> None:
    async def main() -> None:
        ledger = AsyncClient(server.url)

        @idempotent(ledger, key=lambda c: c.order, principal="p", namespace=new_key("ns") + "/")
        async def charge(c: Charge) -> Receipt:
            return Receipt(id="r-a", amount=c.amount)

        a = await charge.invoke(Charge(order="o-1", amount=7))
        b = await charge.invoke(Charge(order="o-1", amount=7))
        assert a.value == b.value == Receipt(id="r-a", amount=7) and b.replayed
        await ledger.aclose()

    asyncio.run(main())
