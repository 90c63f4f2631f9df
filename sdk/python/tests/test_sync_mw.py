"""SPEC §8, row by row, for the synchronous middlewares: the same rows as
test_asgi.py, on Flask (settle_client.flask) and Django
(settle_client.django), each against a real settle server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import NOT_COMMITTED_MISSING, Server, new_key
from sync_apps import HARNESSES, Harness, Resp

from settle_client import Client, _mw
from settle_client._mwbase import Committed, RoutePolicy

H = {"Idempotency-Key": "k-1"}


@pytest.fixture(params=sorted(HARNESSES))
def make(request: pytest.FixtureRequest, server: Server) -> Iterator[Any]:
    """A factory of test apps of one framework: make(**options) → Harness
    (the ledger: the session's settle server unless ledger_url= says)."""
    kind = HARNESSES[request.param]

    def build(ledger_url: str | None = None, **options: Any) -> Harness:
        return kind(ledger_url or server.url, **options)

    yield build


def problem(r: Resp, status: int, code: str) -> dict[str, Any]:
    assert r.status == status, (r.status, r.body)
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["code"] == code and body["status"] == status and body["type"].endswith(code)
    return body


def test_row_key_missing_and_not_wrapped_methods(make: Any) -> None:
    a = make()
    problem(a.post("/items", {}), 400, "idempotency_key_missing")
    assert a.count == 0
    put = a.request("PUT", "/items", {})  # PUT is not wrapped by default: runs without a key
    assert put.status == 201 and a.count == 1


@pytest.mark.parametrize("raw", ['"unterminated', "has space", "x" * 256, '"k-1";A=1'])
def test_row_key_malformed(make: Any, raw: str) -> None:
    a = make()
    problem(a.post("/items", {}, {"Idempotency-Key": raw}), 400, "idempotency_key_invalid")
    assert a.count == 0


def test_row_first_request_and_byte_for_byte_replay(make: Any) -> None:
    a = make()
    first = a.post("/items", {"x": 1}, H)
    assert first.status == 201 and "idempotent-replayed" not in first.headers
    again = a.post("/items", {"x": 1}, H)
    assert again.status == 201 and again.body == first.body
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"] == "/items/1"
    assert again.headers["content-type"] == "application/json"
    assert again.headers["content-length"] == str(len(first.body))
    assert "x-custom" not in again.headers  # not a stored header
    assert a.count == 1
    # An sf-string is the same key.
    assert a.post("/items", {"x": 1}, {"Idempotency-Key": '"k-1";v=1'}).headers["idempotent-replayed"] == "true"


def test_stored_headers_are_configurable(make: Any) -> None:
    a = make(stored_headers=("X-Custom",))
    a.post("/items", {}, H)
    again = a.post("/items", {}, H)
    assert again.headers["x-custom"] == "c" and "x-trace" not in again.headers


def test_row_4xx_is_stored_and_5xx_is_stored_as_failed(make: Any, server: Server) -> None:
    ns = new_key("ns")
    a = make(namespace=ns)
    with Client(server.url) as c:
        for status in (400, 422, 500, 503):
            key = new_key()
            first = a.post("/items", {"status": status}, {"Idempotency-Key": key})
            again = a.post("/items", {"status": status}, {"Idempotency-Key": key})
            assert first.status == again.status == status
            assert again.body == first.body and again.headers["idempotent-replayed"] == "true"
            record = c.get(_mw.ledger_key(ns, "acct-1", key))
            assert record.status == ("failed" if status >= 500 else "completed")
    assert a.count == 4


def test_row_key_reused_with_another_request(make: Any) -> None:
    a = make()
    assert a.post("/items", {"a": 1}, H).status == 201
    problem(a.post("/items", {"a": 2}, H), 422, "idempotency_key_reused")
    problem(a.post("/items?x=1", {"a": 1}, H), 422, "idempotency_key_reused")
    problem(a.request("PATCH", "/items", {"a": 1}, H), 422, "idempotency_key_reused")
    problem(a.post("/free", {"a": 1}, H), 422, "idempotency_key_reused")  # another route
    problem(a.post("/items", None, {**H, "content-type": "text/plain"}, raw=b'{"a": 1}'), 422, "idempotency_key_reused")
    assert a.count == 1


def test_fingerprint_matches_the_asgi_layout(make: Any, server: Server) -> None:
    """The target is the path as sent plus the query: the record's
    fingerprint is the one MIDDLEWARE-KEYS.md defines, as in ASGI."""
    ns = new_key("ns")
    a = make(namespace=ns)
    raw = b'{"a":1}'
    assert a.post("/items?b=2&c=%20", None, {**H, "content-type": "application/json"}, raw=raw).status == 201
    with Client(server.url) as c:
        rec = c.get(_mw.ledger_key(ns, "acct-1", "k-1"))
    assert rec.reservation["fingerprint"] == _mw.request_fingerprint("POST", "/items?b=2&c=%20", "application/json", raw)


def test_row_no_principal_is_401(make: Any) -> None:
    a = make(principal=lambda request: None)
    problem(a.post("/items", {}, H), 401, "idempotency_principal_missing")
    assert a.count == 0


def test_the_principal_option_is_required(make: Any) -> None:
    with pytest.raises(Exception, match="principal"):
        make(principal=None)


def test_timeout_is_refused(make: Any) -> None:
    with pytest.raises(Exception, match="timeout"):
        make(timeout=1.0)


def _in_background(a: Harness, body: Any, headers: dict[str, str]) -> tuple[threading.Thread, list[Resp]]:
    out: list[Resp] = []
    t = threading.Thread(target=lambda: out.append(a.post("/items", body, headers)))
    t.start()
    return t, out


def test_row_in_progress_409_with_retry_after(make: Any) -> None:
    a = make()
    a.behaviour.gate, a.behaviour.entered = threading.Event(), threading.Event()
    t, out = _in_background(a, {"block": True}, H)
    assert a.behaviour.entered.wait(30)
    busy = a.post("/items", {"block": True}, H)
    problem(busy, 409, "request_in_progress")
    assert int(busy.headers["retry-after"]) >= 1
    a.behaviour.gate.set()
    t.join(30)
    assert out[0].status == 201 and a.count == 1
    assert a.counts["request_in_progress"] == 1


def test_wait_answers_the_first_requests_outcome_as_a_replay(make: Any) -> None:
    a = make(wait=20.0)
    a.behaviour.gate, a.behaviour.entered = threading.Event(), threading.Event()
    t, out = _in_background(a, {"block": True}, H)
    assert a.behaviour.entered.wait(30)
    t2, out2 = _in_background(a, {"block": True}, H)  # finds the first in flight and waits
    a.behaviour.gate.set()
    t.join(30)
    t2.join(30)
    assert out[0].status == out2[0].status == 201 and out2[0].body == out[0].body
    assert out2[0].headers["idempotent-replayed"] == "true" and a.count == 1


def test_row_handler_error_is_unknown_then_409(make: Any, server: Server) -> None:
    ns = new_key("ns")
    a = make(namespace=ns)
    problem(a.post("/items", {"raise": True}, H), 500, "outcome_unknown")
    problem(a.post("/items", {"raise": True}, H), 409, "outcome_unknown")
    assert a.count == 1
    with Client(server.url) as c:
        assert c.get(_mw.ledger_key(ns, "acct-1", "k-1")).status == "unknown"


def test_reconcile_hook_committed_replays_and_not_committed_runs(make: Any) -> None:
    asked: list[tuple[str, str, bytes]] = []

    def hook(lkey: str, fence: int, request: Any) -> Any:
        asked.append((request.idempotency_key, request.principal, request.body))
        if request.idempotency_key == "found":
            return Committed(201, [("content-type", "application/json"), ("x-other", "no")], b'{"from":"hook"}')
        return "not_committed"

    a = make(reconcile=hook)
    problem(a.post("/items", {"raise": True}, {"Idempotency-Key": "found"}), 500, "outcome_unknown")
    r = a.post("/items", {"raise": True}, {"Idempotency-Key": "found"})
    assert r.status == 201 and r.body == b'{"from":"hook"}' and r.headers["idempotent-replayed"] == "true"
    assert "x-other" not in r.headers
    assert a.post("/items", {"raise": True}, {"Idempotency-Key": "found"}).body == b'{"from":"hook"}'
    assert a.count == 1 and asked == [("found", "acct-1", b'{"raise": true}')]

    problem(a.post("/items", {"raise": True}, {"Idempotency-Key": "lost"}), 500, "outcome_unknown")
    problem(a.post("/items", {"raise": True}, {"Idempotency-Key": "lost"}), 500, "outcome_unknown")  # ran again
    assert a.count == 3


def test_reconcile_hook_unavailable_keeps_409(make: Any) -> None:
    a = make(reconcile=lambda lkey, fence, request: "unavailable")
    problem(a.post("/items", {"raise": True}, H), 500, "outcome_unknown")
    problem(a.post("/items", {"raise": True}, H), 409, "outcome_unknown")
    assert a.count == 1


@pytest.mark.parametrize("status", [408, 409, 425, 429])
def test_row_nothing_happened_responses_are_not_stored(make: Any, status: int, not_committed_supported: bool) -> None:
    a = make()
    first = a.post("/items", {"status": status}, H)
    assert first.status == status and "idempotent-replayed" not in first.headers
    again = a.post("/items", {"status": status}, H)
    if not not_committed_supported:
        problem(again, 409, "outcome_unknown")
        pytest.xfail(NOT_COMMITTED_MISSING)
    assert again.status == status and "idempotent-replayed" not in again.headers
    assert a.count == 2


def test_handler_marked_retryable_is_not_stored(make: Any, not_committed_supported: bool) -> None:
    a = make()
    a.post("/items", {"retryable": True, "status": 503}, H)
    again = a.post("/items", {"retryable": True, "status": 503}, H)
    if not not_committed_supported:
        problem(again, 409, "outcome_unknown")
        pytest.xfail(NOT_COMMITTED_MISSING)
    assert "idempotent-replayed" not in again.headers and a.count == 2


def test_row_large_body_is_settled_with_its_digest_and_not_replayed(make: Any) -> None:
    a = make(max_stored_body=1000)
    first = a.post("/items", {"size": 5000}, H)
    assert first.status == 201 and len(first.body) > 5000
    problem(a.post("/items", {"size": 5000}, H), 409, "response_not_stored")
    assert a.count == 1


def test_streamed_response_is_buffered_settled_and_replayed(make: Any) -> None:
    a = make()
    first = a.post("/items", {"stream": True, "size": 100}, H)
    assert first.status == 201 and first.headers["content-length"] == str(len(first.body)) and len(first.body) > 100
    again = a.post("/items", {"stream": True, "size": 100}, H)
    assert again.body == first.body and again.headers["idempotent-replayed"] == "true" and a.count == 1


def _dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_row_ledger_unreachable_503_and_fail_open(make: Any) -> None:
    a = make(ledger_url=_dead_url())
    r = a.post("/items", {}, H)
    problem(r, 503, "idempotency_unavailable")
    assert int(r.headers["retry-after"]) >= 1 and a.count == 0
    b = make(ledger_url=_dead_url(), routes=lambda m, p: RoutePolicy(fail_open=True) if m == "POST" else None)
    r = b.post("/items", {"x": 1}, H)
    assert r.status == 201 and b.count == 1 and b.counts["fail_open"] == 1


def test_revoked_principal_is_403_fail_open_or_not(make: Any, server: Server) -> None:
    principal = new_key("acct")
    a = make(principal=lambda request: principal, routes=lambda m, p: RoutePolicy(fail_open=True))
    assert a.post("/items", {}, {"Idempotency-Key": "pay-1"}).status == 201
    with Client(server.url) as c:
        assert c.revoke(principal).generation == 1
    again = a.post("/items", {}, {"Idempotency-Key": "pay-1"})
    problem(again, 403, "idempotency_forbidden")
    assert "retry-after" not in again.headers
    problem(a.post("/items", {}, {"Idempotency-Key": "pay-2"}), 403, "idempotency_forbidden")
    assert a.count == 1
    # The application moves the principal forward: served again.
    b = make(principal=lambda request: (principal, 1))
    assert b.post("/items", {}, {"Idempotency-Key": "pay-3"}).status == 201


def test_route_selection(make: Any) -> None:
    a = make(routes=lambda m, p: RoutePolicy(required=False) if p == "/items" and m == "POST" else None)
    assert a.post("/items", {}).status == 201  # optional key: runs unwrapped
    assert a.post("/free", {}).status == 200  # not selected
    a.post("/items", {}, H)
    assert a.post("/items", {}, H).headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in a.request("PUT", "/items", {}, H).headers
    assert a.count == 4


def test_heartbeat_keeps_a_slow_handler_lease(make: Any) -> None:
    a = make(lease_ms=400)
    assert a.post("/items", {"sleep": 1.0}, H).status == 201
    again = a.post("/items", {"sleep": 1.0}, H)
    assert again.headers["idempotent-replayed"] == "true" and a.count == 1


def test_request_body_over_the_limit_is_413(make: Any) -> None:
    a = make(max_request_body=100)
    problem(a.post("/items", {"pad": "x" * 200}, H), 413, "payload_too_large")
    assert a.count == 0
    assert a.post("/items", {"pad": "x" * 10}, H).status == 201


def test_counts_replays_and_refusals(make: Any) -> None:
    a = make()
    a.post("/items", {}, H)
    a.post("/items", {}, H)
    a.post("/items", {"z": 1}, H)
    a.post("/items", {})
    assert a.counts["replayed"] == 1 and a.counts["idempotency_key_reused"] == 1
    assert a.counts["idempotency_key_missing"] == 1 and a.counts["executed"] == 1


def test_canonical_json_is_on_by_default(make: Any) -> None:
    a = make()
    assert a.post("/items", None, {**H, "content-type": "application/json"}, raw=b'{"a": 1, "b": 2}').status == 201
    again = a.post("/items", None, {**H, "content-type": "application/json"}, raw=b'{"b":2,"a":1}')
    assert again.headers["idempotent-replayed"] == "true" and a.count == 1


def test_fields_and_exclude_select_the_body(make: Any) -> None:
    a = make(fields=["/order"])
    assert a.post("/items", {"order": "o-1", "ts": 1}, H).status == 201
    assert a.post("/items", {"order": "o-1", "ts": 2}, H).headers["idempotent-replayed"] == "true"
    problem(a.post("/items", {"order": "o-2", "ts": 1}, H), 422, "idempotency_key_reused")
    b = make(exclude=["/ts"])
    assert b.post("/items", {"order": "o-1", "ts": 1}, H).status == 201
    assert b.post("/items", {"order": "o-1", "ts": 9}, H).headers["idempotent-replayed"] == "true"
    problem(b.post("/items", {"order": "o-2", "ts": 1}, H), 422, "idempotency_key_reused")
    assert a.count == b.count == 1


@pytest.mark.parametrize(
    "options, name",
    [({"fields": ["no-slash"]}, "fields"), ({"fields": ["/a"], "exclude": ["/b"]}, "exclude"),
     ({"exclude": ["/a"], "canonical_json": False}, "exclude")],
)
def test_fingerprint_options_are_checked_at_construction(make: Any, options: dict[str, Any], name: str) -> None:
    with pytest.raises(Exception, match=name):  # ConfigError; ImproperlyConfigured under Django
        make(**options)
