"""The pytest plugin settle_client.testing (entry point pytest11 "settle"),
as a project that installed settle-client sees it: pytester runs a test file
in a subprocess, so the plugin is loaded by its entry point, not imported."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import new_key, settle_bin

USES_THE_SERVER = '''
import uuid
from settle_client import Binding, Grant, Replay, Done, run_once

def test_server(settle_server):
    assert settle_server.url.startswith("http://127.0.0.1:")
    ledger = settle_server.client()
    key = "k-" + uuid.uuid4().hex
    runs = []
    for _ in range(2):
        r = run_once(ledger, key, {"a": 1}, lambda ctx: runs.append(1) or Done({"ok": True}), principal="p")
    assert runs == [1] and r.replayed and r.value == {"ok": True}
    with open("url.txt", "w") as f:
        f.write(settle_server.url)

def test_same_server_for_the_session(settle_server):
    assert open("url.txt").read() == settle_server.url

def server(): pass  # a project's own names do not clash with the plugin's
'''


def test_settle_server_fixture_runs_a_real_server_and_stops_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_BIN", settle_bin())
    pytester.makepyfile(test_app=USES_THE_SERVER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    url = (pytester.path / "url.txt").read_text()
    with pytest.raises(httpx.TransportError):  # stopped after the session
        httpx.get(url + "/v1/health", timeout=2)


def test_settle_server_finds_settle_on_path(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = pytester.path / "bin"
    bindir.mkdir()
    (bindir / "settle").symlink_to(Path(settle_bin()).resolve())
    monkeypatch.delenv("SETTLE_BIN", raising=False)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    pytester.makepyfile(test_app="def test_up(settle_server):\n    assert settle_server.client().health() is not None\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_settle_server_without_a_binary_names_both_ways(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SETTLE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(pytester.path))  # no settle here
    pytester.makepyfile(test_app="def test_up(settle_server):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*settle_server: no settle binary: set SETTLE_BIN*settle on PATH*"])


@pytest.mark.skipif(importlib.util.find_spec("settle_local") is not None, reason="settle-local is installed")
def test_settle_ledger_without_settle_local_says_what_to_install(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_app="def test_local(settle_ledger):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pip install ./sdk/python-local*"])


def test_the_readme_example_with_the_plugin_fixture(settle_server: Any) -> None:
    """README "Testing your code", on the Flask example: the plugin's
    fixture in this suite, next to the conftest's own server fixture."""
    from settle_client.examples.flask_payments import build_app

    app = build_app(settle_server.client(), namespace=new_key("test"))
    http = app.test_client()
    key = {"Idempotency-Key": new_key("order")}
    first = http.post("/payments", json={"amount": 100, "currency": "EUR"}, headers=key)
    again = http.post("/payments", json={"amount": 100, "currency": "EUR"}, headers=key)
    assert first.status_code == 201 and again.data == first.data and again.headers["Idempotent-Replayed"] == "true"
    assert http.get("/provider/payments").json == {"count": 1}


MODULE_LEVEL_FUNCTION = '''
import types, uuid
from settle_client import idempotent

ledgers = types.SimpleNamespace(current=None)

@idempotent(client=lambda: ledgers.current, key=lambda o: o["id"], principal="svc-billing")
def charge(order):
    return {"charged": order["id"]}

def test_charge_runs_once(settle_server, monkeypatch):
    monkeypatch.setattr(ledgers, "current", settle_server.client())
    order = {"id": "o-" + uuid.uuid4().hex}
    assert charge.invoke(order).replayed is False
    again = charge.invoke(order)
    assert again.replayed is True and again.value == {"charged": order["id"]}
'''


def test_a_module_level_function_takes_the_fixtures_ledger(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe of settle_client.testing's docstring: client= as a function."""
    monkeypatch.setenv("SETTLE_BIN", settle_bin())
    pytester.makepyfile(test_billing=MODULE_LEVEL_FUNCTION)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
