"""The FastAPI recipe of sdk/python/README.md and docs/sdk.md: FastAPI
answers 422 itself when a body does not validate, before the handler runs;
stored, that 422 would make the corrected request with the same
Idempotency-Key a different payload under a used key (422
``idempotency_key_reused``). ``release_on`` with 422 added releases it with
``forget`` (SPEC §4, §8): no record is left, the corrected request runs."""

from __future__ import annotations

from collections.abc import Sequence

from conftest import Server, new_key
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from settle_client import AsyncClient, fixed_principal
from settle_client.asgi import IdempotencyMiddleware

# The recipe: FastAPI's own 422 (request validation) is released, not stored.
FASTAPI_RELEASE_ON = (408, 409, 425, 429, 422)


class ChargeIn(BaseModel):
    amount: int
    currency: str


def make_app(url: str, release_on: Sequence[int]) -> tuple[FastAPI, list[ChargeIn]]:
    ran: list[ChargeIn] = []
    app = FastAPI()

    @app.post("/charges", status_code=201)
    async def create_charge(charge: ChargeIn) -> dict[str, object]:
        ran.append(charge)
        return {"id": f"ch_{len(ran)}", "amount": charge.amount}

    app.add_middleware(
        IdempotencyMiddleware,
        client=AsyncClient(url),
        principal=fixed_principal("acct-1"),
        release_on=release_on,
    )
    return app, ran


BAD = {"amount": "ten", "currency": "EUR"}
GOOD = {"amount": 10, "currency": "EUR"}


def test_the_recipe_lets_the_corrected_request_run(server: Server) -> None:
    app, ran = make_app(server.url, FASTAPI_RELEASE_ON)
    h = {"Idempotency-Key": new_key()}
    with TestClient(app, raise_server_exceptions=False) as http:
        bad = http.post("/charges", json=BAD, headers=h)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "amount"]  # FastAPI's own
        assert ran == []
        good = http.post("/charges", json=GOOD, headers=h)
        assert good.status_code == 201, good.text
        assert good.json() == {"id": "ch_1", "amount": 10} and ran == [ChargeIn(amount=10, currency="EUR")]
        again = http.post("/charges", json=GOOD, headers=h)
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true" and len(ran) == 1


def test_without_the_recipe_the_validation_422_is_stored(server: Server) -> None:
    app, ran = make_app(server.url, (408, 409, 425, 429))  # the default release_on
    h = {"Idempotency-Key": new_key()}
    with TestClient(app, raise_server_exceptions=False) as http:
        assert http.post("/charges", json=BAD, headers=h).status_code == 422
        good = http.post("/charges", json=GOOD, headers=h)
        assert good.status_code == 422 and good.json()["code"] == "idempotency_key_reused"
        assert ran == []
