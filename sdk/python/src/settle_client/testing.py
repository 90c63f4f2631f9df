"""pytest fixtures for code that uses settle (registered as the pytest
plugin ``settle`` through the ``pytest11`` entry point: installing
settle-client makes them available, nothing to import).

- ``settle_server``: a real ``settle serve`` on a free port of 127.0.0.1,
  auth off, with a temporary data directory, started once per test session
  and stopped afterwards. The binary is ``$SETTLE_BIN``, else ``settle`` on
  ``PATH``. It yields a ``SettleServer``: ``.url``, ``.client()`` (a sync
  ``Client``, closed at the end of the session) and ``.async_client()``.
- ``settle_ledger``: a fresh in-process ledger per test,
  ``settle_local.LocalLedger()`` (package ``settle-local``: ``pip install
  ./sdk/python-local``), a ``Client`` whose ``.aio`` is an ``AsyncClient``;
  no server, no port.

    def test_charge_runs_once(settle_server):
        ledger = settle_server.client()
        ...

A function decorated at module level with ``@idempotent`` takes its client
as a function, called on every run, so that a test can hand it the
fixture's ledger::

    # myapp/billing.py
    ledgers = types.SimpleNamespace(current=None)

    @idempotent(client=lambda: ledgers.current, key=lambda o: o["id"], principal="svc-billing")
    def charge(order): ...

    # tests/test_billing.py
    def test_charge_runs_once(settle_ledger, monkeypatch):   # or settle_server.client()
        monkeypatch.setattr(billing.ledgers, "current", settle_ledger)
        assert billing.charge.invoke({"id": "o-1"}).replayed is False
        assert billing.charge.invoke({"id": "o-1"}).replayed is True

Every test of a session shares the one server: use fresh keys (or a fresh
namespace) per test. The fixtures are named ``settle_*`` so that they do
not clash with a project's own ``server`` or ``client`` fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .client import AsyncClient, Client

__all__ = ["SettleServer", "settle_binary", "start_settle", "settle_server", "settle_ledger", "SettleBinaryNotFound"]


class SettleBinaryNotFound(RuntimeError):
    """Neither ``$SETTLE_BIN`` nor ``settle`` on ``PATH`` names a binary."""


def settle_binary() -> str:
    """The ``settle`` binary: ``$SETTLE_BIN`` when set (it must exist),
    else ``settle`` on ``PATH``."""
    env = os.environ.get("SETTLE_BIN")
    if env:
        if not Path(env).is_file():
            raise SettleBinaryNotFound(f"SETTLE_BIN={env} does not exist: build it (cargo build --release -p settle)")
        return env
    found = shutil.which("settle")
    if found is None:
        raise SettleBinaryNotFound(
            "no settle binary: set SETTLE_BIN to its path, or put settle on PATH "
            "(cargo build --release -p settle, then target/release/settle)"
        )
    return found


@dataclass
class SettleServer:
    """A running ``settle serve``: its base ``url``; ``client()`` and
    ``async_client()`` make clients of it (closed by ``stop()``)."""

    url: str
    proc: subprocess.Popen[str]
    data: Path
    _clients: list[Client] = field(default_factory=list, repr=False)

    def client(self, token: str | None = None, **options: Any) -> Client:
        c = Client(self.url, token=token, **options)
        self._clients.append(c)
        return c

    def async_client(self, token: str | None = None, **options: Any) -> AsyncClient:
        """An ``AsyncClient`` (it makes one connection pool per event loop,
        closed with that loop)."""
        return AsyncClient(self.url, token=token, **options)

    def stop(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_settle(
    data: Path, *, config: Path | None = None, extra: Sequence[str] = (), binary: str | None = None
) -> SettleServer:
    """Starts ``settle serve`` on a free port of 127.0.0.1 with ``data`` as
    its data directory and returns once it accepts connections (it prints
    ``listening on ADDR`` then)."""
    args = [binary or settle_binary(), "serve", "--data", str(data), "--listen", "127.0.0.1:0", *extra]
    if config is not None:
        args += ["--config", str(config)]
    env = dict(os.environ, SETTLE_LOG=os.environ.get("SETTLE_LOG", "warn"))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"settle serve did not start ({args[0]}): {line!r}")
    return SettleServer("http://" + line.split()[-1], proc, data)


@pytest.fixture(scope="session")
def settle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SettleServer]:
    """A real ``settle serve`` for the test session (see the module doc)."""
    try:
        binary = settle_binary()
    except SettleBinaryNotFound as e:
        pytest.fail(f"settle_server: {e}", pytrace=False)
    s = start_settle(tmp_path_factory.mktemp("settle-data"), binary=binary)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def settle_ledger() -> Iterator[Client]:
    """A fresh in-process ``settle_local.LocalLedger()`` for each test (a
    ``Client``; ``.aio`` is its ``AsyncClient``)."""
    try:
        from settle_local import LocalLedger  # type: ignore[import-not-found,unused-ignore]  # optional package
    except ImportError as e:
        pytest.fail(
            f"settle_ledger needs the settle-local package: pip install ./sdk/python-local ({e})", pytrace=False
        )
    ledger: Client = LocalLedger()
    try:
        yield ledger
    finally:
        ledger.close()
