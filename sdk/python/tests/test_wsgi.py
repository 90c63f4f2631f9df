"""settle_client.wsgi on a bare WSGI app (no framework): what Flask's
harness in test_sync_mw.py does not reach — an exception that escapes the
app, the legacy write() callable, an app that never starts a response,
the request target without RAW_URI, and the helpers."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from conftest import Server, new_key
from werkzeug.test import Client as WerkzeugClient

from settle_client import Client, _mw, fixed_principal
from settle_client.wsgi import (
    IdempotencyMiddleware,
    idempotency_key,
    mark_retryable,
    remote_user_principal,
    request_target,
)

H = {"Idempotency-Key": "k-1"}


class BareApp:
    """POST: runs ``self.mode``; counts runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.mode = "ok"
        self.seen: list[bytes] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.runs += 1
        self.seen.append(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        if self.mode == "raise":
            raise ValueError("boom")
        if self.mode == "no-start":
            return [b"never started"]
        if self.mode == "write":
            write = start_response("201 Created", [("Content-Type", "text/plain")])
            write(b"legacy ")
            return [b"write"]
        if self.mode == "raise-in-body":
            start_response("200 OK", [("Content-Type", "text/plain")])

            def body() -> Iterator[bytes]:
                yield b"part"
                raise OSError("the stream broke")

            return body()
        if self.mode == "retryable":
            mark_retryable(environ)
        start_response("201 Created", [("Content-Type", "application/json"), ("Location", f"/x/{self.runs}")])
        return [json.dumps({"run": self.runs}).encode()]


def wrap(server_url: str, **options: Any) -> tuple[BareApp, IdempotencyMiddleware, WerkzeugClient]:
    app = BareApp()
    options.setdefault("principal", fixed_principal("acct-1"))
    mw = IdempotencyMiddleware(app, client=Client(server_url), namespace=new_key("ns"), **options)
    return app, mw, WerkzeugClient(mw)


def test_an_escaping_exception_is_500_outcome_unknown_and_logged(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    app, mw, http = wrap(server.url)
    app.mode = "raise"
    with caplog.at_level(logging.ERROR, logger="settle_client.wsgi"):
        r = http.post("/x", data=b"{}", headers=H)
    assert r.status_code == 500 and r.json is not None and r.json["code"] == "outcome_unknown"
    assert any(rec.exc_info and isinstance(rec.exc_info[1], ValueError) for rec in caplog.records)
    again = http.post("/x", data=b"{}", headers=H)
    assert again.status_code == 409 and again.json is not None and again.json["code"] == "outcome_unknown"
    # counted twice, as in ASGI: the failed run and the refused retry
    assert app.runs == 1 and mw.counts["executed"] == 1 and mw.counts["outcome_unknown"] == 2


@pytest.mark.parametrize("mode", ["no-start", "raise-in-body"])
def test_no_complete_response_is_outcome_unknown(server: Server, mode: str) -> None:
    app, _, http = wrap(server.url)
    app.mode = mode
    r = http.post("/x", data=b"{}", headers=H)
    assert r.status_code == 500 and r.json is not None and r.json["code"] == "outcome_unknown"
    assert http.post("/x", data=b"{}", headers=H).status_code == 409 and app.runs == 1


def test_the_legacy_write_callable_is_buffered_and_replayed(server: Server) -> None:
    app, _, http = wrap(server.url)
    app.mode = "write"
    first = http.post("/x", data=b"{}", headers=H)
    assert first.status_code == 201 and first.data == b"legacy write"
    again = http.post("/x", data=b"{}", headers=H)
    assert again.data == b"legacy write" and again.headers["Idempotent-Replayed"] == "true" and app.runs == 1


def test_the_app_reads_the_body_the_middleware_read(server: Server) -> None:
    app, _, http = wrap(server.url)
    http.post("/x", data=b'{"a": 1}', headers=H)
    assert app.seen == [b'{"a": 1}']


def test_fail_open_hands_the_body_to_the_app(server: Server) -> None:
    from settle_client.wsgi import RoutePolicy

    app, mw, http = wrap("http://127.0.0.1:9", routes=lambda m, p: RoutePolicy(fail_open=True))
    r = http.post("/x", data=b'{"b": 2}', headers=H)
    assert r.status_code == 201 and app.seen == [b'{"b": 2}'] and mw.counts["fail_open"] == 1


def test_remote_user_principal(server: Server) -> None:
    app, _, http = wrap(server.url, principal=remote_user_principal())
    r = http.post("/x", data=b"{}", headers=H)
    assert r.status_code == 401 and r.json is not None and r.json["code"] == "idempotency_principal_missing"
    ok = http.post("/x", data=b"{}", headers=H, environ_overrides={"REMOTE_USER": "alice"})
    assert ok.status_code == 201
    bob = http.post("/x", data=b"{}", headers=H, environ_overrides={"REMOTE_USER": "bob"})
    assert bob.status_code == 201 and "Idempotent-Replayed" not in bob.headers  # another account: its own key
    assert app.runs == 2


def test_request_target() -> None:
    assert request_target({"RAW_URI": "/a%20b?x=1"}) == "/a%20b?x=1"
    assert request_target({"REQUEST_URI": "/p?"}) == "/p"
    assert request_target({"RAW_URI": "http://host:8080/p/q?z=1"}) == "/p/q?z=1"
    # No raw URI (wsgiref): the path re-quoted from PEP 3333's latin-1 string.
    env = {"SCRIPT_NAME": "/app", "PATH_INFO": "/a b/\u00e9".encode().decode("latin-1"), "QUERY_STRING": "q=1"}
    assert request_target(env) == "/app/a%20b/%C3%A9?q=1"


def test_idempotency_key_helper() -> None:
    assert idempotency_key({"HTTP_IDEMPOTENCY_KEY": '"k-1";v=2'}) == "k-1"
    assert idempotency_key({"HTTP_IDEMPOTENCY_KEY": "has space"}) is None
    assert idempotency_key({}) is None
    env: dict[str, Any] = {"wsgi.input": io.BytesIO()}
    mark_retryable(env)
    assert env["settle_retryable"] is True


def test_ledger_key_is_the_shared_layout(server: Server) -> None:
    app, mw, http = wrap(server.url)
    http.post("/x", data=b"{}", headers=H)
    with Client(server.url) as c:
        rec = c.get(_mw.ledger_key(mw.options.namespace, "acct-1", "k-1"))
    assert rec.status == "completed"
