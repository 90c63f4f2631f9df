"""The payments example app (issue 10 item 4), run exactly as documented:
``python -m settle_client.examples.payments --listen 127.0.0.1:PORT
--settle-url URL [--settle-token T]``, against a real settle server (with
``SETTLE_TEST_LEDGER=local``: ``--local DIR``, its own in-process ledger); and
its Flask and Django twins (``flask_payments``, ``django_payments``), which
must answer alike: every test runs against the three."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LOCAL_URL, TOKENS, Server, new_key, stop


EXAMPLES = ["payments", "flask_payments", "django_payments"]


def start_example(
    settle_url: str, token: str | None = None, stderr: int = subprocess.DEVNULL, module: str = "payments"
) -> tuple[str, subprocess.Popen[str]]:
    args = [sys.executable, "-m", f"settle_client.examples.{module}", "--listen", "127.0.0.1:0"]
    data = None
    if settle_url == LOCAL_URL:
        # Local ledger mode: the example's own in-process ledger (--local DIR).
        data = tempfile.mkdtemp(prefix="settle-example-")
        args += ["--local", data]
    else:
        args += ["--settle-url", settle_url]
    if token:
        args += ["--settle-token", token]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=dict(os.environ))
    if data is not None:
        weakref.finalize(proc, shutil.rmtree, data, True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"the example did not start: {line!r}")
    return "http://" + line.split()[-1], proc


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request: pytest.FixtureRequest, server: Server) -> Iterator[str]:
    url, proc = start_example(server.url, module=request.param)
    yield url
    stop(proc)


def executions(url: str) -> int:
    r = httpx.get(url + "/executions")
    assert r.status_code == 200 and set(r.json()) == {"count"}
    n: int = r.json()["count"]
    return n


def pay(url: str, key: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(url + "/payments", json=body, headers=headers, timeout=30)


def test_create_and_replay(example: str) -> None:
    before = executions(example)
    key = new_key()
    first = pay(example, key, {"amount": 1000, "currency": "EUR"})
    assert first.status_code == 201
    body = first.json()
    n = before + 1
    assert body == {"id": f"pay_{n}", "amount": 1000, "currency": "EUR"}
    assert first.headers["location"] == f"/payments/pay_{n}" and "idempotent-replayed" not in first.headers
    again = pay(example, key, {"amount": 1000, "currency": "EUR"})
    assert again.status_code == 201 and again.content == first.content
    assert again.headers["idempotent-replayed"] == "true" and again.headers["location"] == first.headers["location"]
    assert executions(example) == n


def test_missing_key_and_reuse(example: str) -> None:
    before = executions(example)
    r = pay(example, None, {"amount": 1, "currency": "EUR"})
    assert r.status_code == 400 and r.json()["code"] == "idempotency_key_missing"
    key = new_key()
    assert pay(example, key, {"amount": 1, "currency": "EUR"}).status_code == 201
    r = pay(example, key, {"amount": 2, "currency": "EUR"})
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    assert executions(example) == before + 1


def test_amount_zero_is_a_stored_400(example: str) -> None:
    before = executions(example)
    key = new_key()
    first = pay(example, key, {"amount": 0, "currency": "EUR"})
    assert first.status_code == 400
    again = pay(example, key, {"amount": 0, "currency": "EUR"})
    assert again.status_code == 400 and again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert executions(example) == before + 1


def provider_payments(url: str) -> int:
    r = httpx.get(url + "/provider/payments")
    assert r.status_code == 200
    n: int = r.json()["count"]
    return n


def test_negative_amount_is_unknown_and_the_hook_lets_the_retry_run(example: str) -> None:
    """The handler raises before it charges: the outcome is unknown; on
    retry the reconcile hook asks the provider, which has no payment with
    that key, so the handler runs again (and fails again)."""
    before, paid = executions(example), provider_payments(example)
    key = new_key()
    for _ in range(2):
        r = pay(example, key, {"amount": -5, "currency": "EUR"})
        assert r.status_code == 500 and r.json()["code"] == "outcome_unknown"
    assert executions(example) == before + 2 and provider_payments(example) == paid


def test_a_handler_killed_after_the_charge_is_resolved_by_the_hook(example: str) -> None:
    """The handler dies after the provider recorded the payment: 500
    outcome_unknown. The retry's reconcile hook finds the payment by its
    idempotency key: it is settled and replayed, 201 with the provider's
    payment, and the handler does not run (nor charge) again."""
    before, paid = executions(example), provider_payments(example)
    key = new_key()
    body = {"amount": 4200, "currency": "EUR", "fail_after_charge": True}
    r = pay(example, key, body)
    assert r.status_code == 500 and r.json()["code"] == "outcome_unknown"
    assert provider_payments(example) == paid + 1
    n = before + 1
    retry = pay(example, key, body)
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == {"id": f"pay_{n}", "amount": 4200, "currency": "EUR"}
    assert retry.headers["location"] == f"/payments/pay_{n}"
    again = pay(example, key, body)
    assert again.status_code == 201 and again.content == retry.content
    assert executions(example) == n and provider_payments(example) == paid + 1


def test_fifty_concurrent_duplicates_execute_once(example: str) -> None:
    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(timeout=30, limits=limits) as h:
            key = new_key()
            body = {"amount": 700, "currency": "USD", "delay_ms": 300}
            return await asyncio.gather(
                *[h.post(example + "/payments", json=body, headers={"Idempotency-Key": key}) for _ in range(50)]
            )

    before = executions(example)
    rs = asyncio.run(main())
    assert executions(example) == before + 1
    created = [r for r in rs if r.status_code == 201]
    others = [r for r in rs if r.status_code != 201]
    assert created and len({r.content for r in created}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in created) == 1
    for r in others:
        assert r.status_code == 409 and r.json()["code"] == "request_in_progress" and int(r.headers["retry-after"]) >= 1


@pytest.mark.parametrize("module", EXAMPLES)
def test_ledger_unreachable_is_503(server: Server, module: str) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    url, proc = start_example(dead, module=module)
    try:
        r = pay(url, new_key(), {"amount": 1, "currency": "EUR"})
        assert r.status_code == 503 and r.json()["code"] == "idempotency_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert executions(url) == 0
    finally:
        stop(proc)


@pytest.mark.parametrize("module", EXAMPLES)
def test_with_a_token(auth_server: Server, module: str) -> None:
    url, proc = start_example(auth_server.url, TOKENS["alpha"], module=module)
    try:
        key = new_key()
        first = pay(url, key, {"amount": 3, "currency": "EUR"})
        assert first.status_code == 201
        assert pay(url, key, {"amount": 3, "currency": "EUR"}).headers["idempotent-replayed"] == "true"
    finally:
        stop(proc)
    url, proc = start_example(auth_server.url, "wrong-token", module=module)
    try:
        r = pay(url, new_key(), {"amount": 3, "currency": "EUR"})
        assert r.status_code == 503 and r.json()["code"] == "idempotency_unavailable"
    finally:
        stop(proc)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("used", [False, True], ids=["idle", "after requests"])
@pytest.mark.parametrize("module", EXAMPLES)
def test_ctrl_c_exits_cleanly(server: Server, sig: signal.Signals, used: bool, module: str) -> None:
    """Ctrl-C (or SIGTERM) stops the example gracefully: exit status 0 and
    nothing on stderr (no traceback)."""
    url, proc = start_example(server.url, stderr=subprocess.PIPE, module=module)
    try:
        if used:
            key = new_key()
            assert pay(url, key, {"amount": 1, "currency": "EUR"}).status_code == 201
            assert pay(url, key, {"amount": 1, "currency": "EUR"}).headers["idempotent-replayed"] == "true"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and err.strip() == "", err
    assert proc.returncode == 0
