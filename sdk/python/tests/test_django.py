"""What only the Django middleware has: the SETTLE_IDEMPOTENCY setting
and the request.user principal (the SPEC §8 rows run in test_sync_mw.py)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Server
from sync_apps import DjangoHarness

from settle_client import AsyncClient, Client
from settle_client.django import IdempotencyMiddleware, authenticated_principal

H = {"Idempotency-Key": "k-1"}


def test_authenticated_principal_is_the_users_primary_key(server: Server) -> None:
    a = DjangoHarness(server.url, principal=authenticated_principal())
    anonymous = a.post("/items", {}, H)
    assert anonymous.status == 401 and anonymous.json()["code"] == "idempotency_principal_missing"
    assert a.post("/items", {}, {**H, "X-User": "7"}).status == 201
    assert a.post("/items", {}, {**H, "X-User": "7"}).headers["idempotent-replayed"] == "true"
    other = a.post("/items", {}, {**H, "X-User": "8"})  # another account, the same key: its own request
    assert other.status == 201 and "idempotent-replayed" not in other.headers
    assert a.count == 2


def test_authenticated_principal_with_an_identity_function(server: Server) -> None:
    a = DjangoHarness(server.url, principal=authenticated_principal(lambda user: (f"acct-{user.pk}", 0)))
    assert a.post("/items", {}, {**H, "X-User": "1"}).status == 201
    assert a.post("/items", {}, {**H, "X-User": "1"}).headers["idempotent-replayed"] == "true"


def test_without_authentication_middleware_the_request_fails_unclaimed(server: Server) -> None:
    a = DjangoHarness(server.url, principal=authenticated_principal())
    r = a.post("/items", {}, {**H, "X-No-Auth": "1"})
    assert r.status == 500 and a.count == 0  # Django's 500: a configuration error, nothing claimed
    assert a.counts["executed"] == 0


@pytest.mark.parametrize(
    "conf, match",
    [
        (None, "client"),
        ({"principal": lambda r: "p"}, "client"),
        ({"client": "http://127.0.0.1:7411", "principal": lambda r: "p"}, "Client"),
        # An AsyncClient is the ASGI middleware's: the message names the sync Client.
        ({"client": AsyncClient("http://127.0.0.1:9"), "principal": lambda r: "p"}, r"settle_client\.Client \(the sync client\)"),
        ({"client": Client("http://127.0.0.1:9")}, "principal"),
        ({"client": Client("http://127.0.0.1:9"), "principal": lambda r: "p", "timeout": 1.0}, "timeout"),
    ],
)
def test_setting_errors_are_improperly_configured(conf: Any, match: str) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    with override_settings(SETTLE_IDEMPOTENCY=conf), pytest.raises(ImproperlyConfigured, match=match):
        IdempotencyMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]
