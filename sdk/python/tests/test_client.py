"""Every SPEC §7 call through the typed client, and the typed error of every
problem code the server answers."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from pathlib import Path

import httpx
import pytest
from conftest import TOKENS, Server, new_key, start_server, stop

from settle_client import (
    AsyncClient,
    BadRequest,
    Binding,
    BindingMismatch,
    Client,
    FingerprintMismatch,
    Grant,
    InFlight,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    Outcome,
    PayloadTooLarge,
    ProblemError,
    Receipt,
    ReceiptRequired,
    RecordRefused,
    Refusal,
    Released,
    Replay,
    RequestTimeout,
    ResultMismatch,
    StaleBinding,
    StaleFence,
    TooManyClasses,
    TransportError,
    Unauthorized,
    Unavailable,
    WrongPurpose,
    fingerprint,
)
from settle_client.errors import problem_error

FP = fingerprint({"charge": "order-42", "amount": 1000})
OTHER_FP = fingerprint({"charge": "order-42", "amount": 2000})
RESP = hashlib.sha256(b'{"charge":"ch_1"}').hexdigest()


def completed(result: object = None) -> Outcome:
    return Outcome("completed", result if result is not None else {"charge": "ch_1"}, RESP)


def grant(c: Client, key: str, b: Binding, **kw: object) -> Grant:
    g = c.claim(key, FP, b, **kw)  # type: ignore[arg-type]
    assert isinstance(g, Grant), g
    return g


def test_claim_settle_replay_and_get(client: Client) -> None:
    key, b = new_key(), Binding("svc-billing", ("charge", "refund", "charge"), 0)
    g = grant(client, key, b, worker="w1", lease_ms=5000, retention_s=600)
    assert g.decision == "execute" and g.fence >= 1 and g.attempt == 1
    r = client.settle(key, g.fence, FP, b, completed())
    assert isinstance(r, Receipt) and r.status == "completed" and r.fence == g.fence and r.durable
    assert r.key == key and r.fingerprint == FP and r.response_sha256 == RESP
    again = client.claim(key, FP, b)
    assert isinstance(again, Replay)
    assert again.outcome.result == {"charge": "ch_1"} and again.receipt == r
    rec = client.get(key)
    assert rec.status == "completed" and rec.receipt == r and rec.outcome == again.outcome
    assert rec.reservation["scopes"] == ["charge", "refund"]  # sorted, de-duplicated
    assert rec.lease is not None and rec.lease["worker"] == "w1"
    # Settle rule 0: the same settle again (a lost acknowledgement) returns the original receipt.
    assert client.settle(key, g.fence, FP, b, completed()) == r


def test_heartbeat_dispatch_release_and_in_flight(client: Client) -> None:
    key, b = new_key(), Binding("p")
    g = grant(client, key, b, marks_dispatch=True)
    hb = client.heartbeat(key, g.fence, lease_ms=20000)
    assert hb.fence == g.fence and hb.lease_expires_at
    busy = client.claim(key, FP, b)
    assert isinstance(busy, InFlight) and 10 <= busy.retry_after_ms <= 1000
    assert client.release(key, g.fence) == Released(g.fence, True)  # not_dispatched: nothing was sent
    g2 = grant(client, key, b, marks_dispatch=True)
    assert g2.fence > g.fence
    d = client.dispatch(key, g2.fence)
    assert d.dispatched and d.fence == g2.fence
    with pytest.raises(ReceiptRequired):
        client.release(key, g2.fence)
    # settle unknown keeps `error` (SPEC §4), and the next claim must reconcile.
    r = client.settle(key, g2.fence, FP, b, Outcome("unknown", error="timed out after send"))
    assert r.status == "unknown"
    rg = client.claim(key, FP, b)
    assert isinstance(rg, Grant) and rg.decision == "reconcile"
    with pytest.raises(WrongPurpose):
        client.settle(key, rg.fence, FP, b, completed())
    ans = client.reconcile(key, rg.fence, "unavailable")
    assert ans == Released(rg.fence, True)
    rg2 = client.claim(key, FP, b)
    assert isinstance(rg2, Grant) and rg2.decision == "reconcile"
    ex = client.reconcile(key, rg2.fence, "not_committed")
    assert isinstance(ex, Grant) and ex.decision == "execute" and ex.fence == rg2.fence
    rc = client.settle(key, ex.fence, FP, b, completed())
    assert rc.status == "completed"


def test_reconcile_committed_returns_a_receipt(client: Client) -> None:
    key, b = new_key(), Binding("p")
    g = grant(client, key, b)
    client.settle(key, g.fence, FP, b, Outcome("unknown"))
    rg = client.claim(key, FP, b)
    assert isinstance(rg, Grant) and rg.decision == "reconcile"
    r = client.reconcile(key, rg.fence, "committed", fingerprint=FP, binding=b, outcome=completed())
    assert isinstance(r, Receipt) and r.status == "completed" and r.fence == rg.fence


def test_revoke_warn_warnings_health_metrics_openapi(client: Client) -> None:
    principal = new_key("principal")
    assert client.revoke(principal).generation == 1
    assert client.revoke(principal).generation == 2
    task = new_key("task")
    w = client.warn(task, "slow-upstream", "took 40 s")
    assert (w.task, w.class_, w.count, w.detail, w.saturated) == (task, "slow-upstream", 1, "took 40 s", False)
    w2 = client.warn(task, "slow-upstream")
    assert w2.count == 2 and w2.detail == "took 40 s"
    assert [x.class_ for x in client.warnings(task)] == ["slow-upstream"]
    assert client.warnings(new_key("none")) == []
    assert client.health()["status"] == "ok"
    assert client.ready()["status"] == "ready"
    assert "settle_http_requests_total" in client.metrics()
    assert client.openapi()["openapi"].startswith("3.1")


def test_keys_are_percent_encoded(client: Client) -> None:
    b = Binding("p")
    for key in ["a/b", "%41", "q?x=1", "frag#1", "~tilde", "+plus", "x" * 255]:
        g = grant(client, key + new_key(""), b) if len(key) < 200 else grant(client, key, b)
        assert g.decision == "execute"
    rec = client.get("x" * 255)
    assert rec.key == "x" * 255


def test_fences_and_generations_are_exact_at_2_pow_53_minus_1(client: Client) -> None:
    top = 2**53 - 1
    key, b = new_key(), Binding(new_key("gen"), (), top)
    g = grant(client, key, b)
    assert client.get(key).reservation["generation"] == top
    client.settle(key, g.fence, FP, b, completed())
    with pytest.raises(ValueError):
        client.heartbeat(key, 2**53)
    with pytest.raises(ValueError):
        client.claim(new_key(), FP, Binding("p", (), 2**53))
    with pytest.raises(ValueError):
        client.dispatch(key, True)


# --------------------------------------------------------- typed errors


def test_refusal_errors(client: Client) -> None:
    key, b = new_key(), Binding("p", ("s",))
    g = grant(client, key, b)
    with pytest.raises(FingerprintMismatch) as fm:
        client.claim(key, OTHER_FP, b)
    assert isinstance(fm.value, Refusal) and fm.value.status == 409 and fm.value.code == "fingerprint_mismatch"
    with pytest.raises(BindingMismatch):
        client.claim(key, FP, Binding("p", ("other",)))
    with pytest.raises(StaleFence):
        client.heartbeat(key, g.fence + 1000)
    with pytest.raises(WrongPurpose):
        client.reconcile(key, g.fence, "unavailable")
    with pytest.raises(ReceiptRequired):
        client.release(key, g.fence)
    r = client.settle(key, g.fence, FP, b, completed())
    with pytest.raises(ResultMismatch):
        client.settle(key, r.fence, FP, b, Outcome("completed", {"charge": "ch_2"}, OTHER_FP))
    assert client.get(key).disputed


def test_stale_binding_after_revoke(client: Client) -> None:
    principal = new_key("rev")
    client.revoke(principal)
    with pytest.raises(StaleBinding):
        client.claim(new_key(), FP, Binding(principal, (), 0))


def test_lease_expired(client: Client) -> None:
    key, b = new_key(), Binding("p")
    g = grant(client, key, b, lease_ms=200)
    time.sleep(0.15)  # the lease has < lease_margin (100 ms) left: settle must refuse
    with pytest.raises(LeaseExpired):
        client.settle(key, g.fence, FP, b, completed())


def test_too_many_classes(client: Client) -> None:
    task = new_key("task")
    for i in range(64):
        client.warn(task, f"c{i}")
    with pytest.raises(TooManyClasses):
        client.warn(task, "c64")


def test_invalid_request_names_the_field(client: Client) -> None:
    with pytest.raises(InvalidRequest) as e:
        client.claim(new_key(), FP, Binding("p"), lease_ms=5)
    assert e.value.status == 422 and e.value.field == "lease_ms"
    with pytest.raises(InvalidRequest):
        client.claim("bad key with spaces", FP, Binding("p"))


def test_not_found(client: Client) -> None:
    with pytest.raises(NotFound) as e:
        client.get(new_key())
    assert e.value.status == 404


def test_payload_too_large(tmp_path: Path) -> None:
    # A server with a small body limit: a small body is written whole before
    # the server answers 413 and closes (a 1 MiB upload races that close).
    small = start_server(tmp_path / "data", extra=["--max-body-bytes", "300"])
    try:
        with Client(small.url) as c, pytest.raises(PayloadTooLarge) as e:
            c.claim(new_key(), FP, Binding("p"), worker="w" * 400)
        assert e.value.status == 413
    finally:
        stop(small.proc)


def test_bad_request_maps_from_a_real_answer(server: Server) -> None:
    resp = httpx.post(server.url + "/v1/operations/%zz/claim", content=b"{}")
    err = problem_error(resp.status_code, resp.json())
    assert isinstance(err, BadRequest) and err.status == 400
    resp = httpx.post(server.url + "/v1/operations/k/claim", content=b"{not json")
    assert isinstance(problem_error(resp.status_code, resp.json()), BadRequest)


def test_every_problem_code_has_its_class() -> None:
    for status, code, cls in [
        (400, "bad_request", BadRequest),
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (408, "request_timeout", RequestTimeout),
        (413, "payload_too_large", PayloadTooLarge),
        (422, "invalid_request", InvalidRequest),
        (409, "fingerprint_mismatch", FingerprintMismatch),
        (409, "binding_mismatch", BindingMismatch),
        (409, "stale_binding", StaleBinding),
        (409, "stale_fence", StaleFence),
        (409, "lease_expired", LeaseExpired),
        (409, "wrong_purpose", WrongPurpose),
        (409, "result_mismatch", ResultMismatch),
        (409, "receipt_required", ReceiptRequired),
        (409, "too_many_classes", TooManyClasses),
        (503, "record_refused", RecordRefused),
        (503, "unavailable", Unavailable),
        (409, "some_future_refusal", Refusal),
        (418, "teapot", ProblemError),
    ]:
        e = problem_error(status, {"code": code, "title": "t", "detail": "d", "status": status})
        assert type(e) is cls and e.code == code and e.status == status
    u = problem_error(503, {"code": "unavailable", "correlation_id": "c-1"}, retry_after_s=2.0)
    assert isinstance(u, Unavailable) and u.retry_after_s == 2.0 and u.correlation_id == "c-1"
    assert isinstance(problem_error(502, "<html>bad gateway</html>"), ProblemError)


def test_transport_error_when_nothing_listens() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with Client(f"http://127.0.0.1:{port}", timeout=2) as c, pytest.raises(TransportError):
        c.health()


def test_auth_tokens_and_tenant_isolation(auth_server: Server) -> None:
    with Client(auth_server.url) as anon, pytest.raises(Unauthorized) as e:
        anon.get("k")
    assert e.value.status == 401
    with Client(auth_server.url, token="wrong") as bad, pytest.raises(Unauthorized):
        bad.claim(new_key(), FP, Binding("p"))
    key = new_key()
    with Client(auth_server.url, token=TOKENS["alpha"]) as a, Client(auth_server.url, token=TOKENS["beta"]) as b:
        g = a.claim(key, FP, Binding("p"))
        assert isinstance(g, Grant)
        with pytest.raises(NotFound):
            b.get(key)  # another tenant's key is unknown
        gb = b.claim(key, OTHER_FP, Binding("p"))  # and free to use there
        assert isinstance(gb, Grant)


def test_async_client_parity(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as c:
            key, b = new_key(), Binding("p")
            g = await c.claim(key, FP, b, marks_dispatch=True)
            assert isinstance(g, Grant)
            assert (await c.heartbeat(key, g.fence)).fence == g.fence
            assert (await c.dispatch(key, g.fence)).dispatched
            r = await c.settle(key, g.fence, FP, b, completed())
            assert r.status == "completed"
            rep = await c.claim(key, FP, b)
            assert isinstance(rep, Replay) and rep.receipt == r
            assert (await c.get(key)).receipt == r
            with pytest.raises(FingerprintMismatch):
                await c.claim(key, OTHER_FP, b)
            with pytest.raises(NotFound):
                await c.get(new_key())
            assert (await c.health())["status"] == "ok"
            task = new_key("t")
            await c.warn(task, "c")
            assert len(await c.warnings(task)) == 1
            assert (await c.revoke(new_key("pr"))).generation == 1

    asyncio.run(main())
