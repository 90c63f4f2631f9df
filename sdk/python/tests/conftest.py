"""Fixtures: a real ``settle serve`` per session (auth off, and one with
tenants), started on a free port with a temporary data directory and stopped
afterwards. SETTLE_BIN names the binary (default: target/release/settle of
the repository).

With ``SETTLE_TEST_LEDGER=local`` the same suites run against
``settle_local.LocalLedger`` instead (settle in this process, on a temporary
data directory; ``pip install ./sdk/python-local``): the ``server`` fixture's
URL is then ``http://settle.local``, and every httpx transport the tests
build (the taps that inject failures wrap one) hands requests for that host
to the local ledger through settle_local's own transport. Tests that need a
second server process (authentication, other flags, the example app in a
subprocess) are skipped in that mode, with the reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from settle_client import Binding, Client, Grant, InvalidRequest, fingerprint

REPO = Path(__file__).resolve().parents[3]


def settle_bin() -> str:
    b = os.environ.get("SETTLE_BIN") or str(REPO / "target" / "release" / "settle")
    if not Path(b).exists():
        pytest.exit(f"settle binary not found at {b}: build it (cargo build --release -p settle) or set SETTLE_BIN", 2)
    return b


LEDGER = os.environ.get("SETTLE_TEST_LEDGER", "remote")
if LEDGER not in ("remote", "local"):
    raise RuntimeError(f"SETTLE_TEST_LEDGER must be remote or local, not {LEDGER!r}")
LOCAL = LEDGER == "local"
LOCAL_URL = "http://settle.local"


def remote_only(why: str) -> None:
    """Skips the calling test or fixture in local mode."""
    if LOCAL:
        pytest.skip(f"local ledger mode: {why}")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str] | None


def route_to_local(data: Path) -> Iterator[None]:
    """Opens a LocalLedger on ``data`` and sends every httpx request for
    ``settle.local`` to it, through settle_local's own transports."""
    import httpx
    from settle_local import LocalLedger, _AsyncTransport, _Transport

    ledger = LocalLedger(data)
    sync, asyn = _Transport(ledger._native), _AsyncTransport(ledger._native)
    orig_sync = httpx.HTTPTransport.handle_request
    orig_async = httpx.AsyncHTTPTransport.handle_async_request

    def handle(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.url.host == "settle.local":
            # typed without settle_local installed too (mypy sees Any then)
            resp: httpx.Response = sync.handle_request(request)
            return resp
        return orig_sync(self, request)

    async def handle_async(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.url.host == "settle.local":
            aresp: httpx.Response = await asyn.handle_async_request(request)
            return aresp
        return await orig_async(self, request)

    mp = pytest.MonkeyPatch()
    mp.setattr(httpx.HTTPTransport, "handle_request", handle)
    mp.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async)
    try:
        yield
    finally:
        mp.undo()
        ledger.close()


def start_server(data: Path, config: Path | None = None, extra: list[str] | None = None) -> Server:
    remote_only("this test starts a settle server process of its own")
    args = [settle_bin(), "serve", "--data", str(data), "--listen", "127.0.0.1:0", *(extra or [])]
    if config is not None:
        args += ["--config", str(config)]
    env = dict(os.environ, SETTLE_LOG=os.environ.get("SETTLE_LOG", "warn"))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "listening on ADDR", printed once it accepts
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"settle serve did not start: {line!r}")
    return Server("http://" + line.split()[-1], proc)


def stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if LOCAL:
        yield from _local_server(tmp_path_factory.mktemp("settle-local"))
        return
    s = start_server(tmp_path_factory.mktemp("settle-data"))
    yield s
    stop(s.proc)


def _local_server(data: Path) -> Iterator[Server]:
    for _ in route_to_local(data):
        yield Server(LOCAL_URL, None)


TOKENS = {"alpha": "token-alpha-0123456789", "beta": "token-beta-9876543210"}


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    remote_only("a local ledger has no authentication (one tenant)")
    d = tmp_path_factory.mktemp("settle-auth")
    cfg = d / "settle.toml"
    cfg.write_text(
        "".join(
            f'[[tenants]]\nname = "{name}"\ntoken_sha256 = "{hashlib.sha256(tok.encode()).hexdigest()}"\n\n'
            for name, tok in TOKENS.items()
        )
    )
    s = start_server(d / "data", cfg)
    yield s
    stop(s.proc)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


def new_key(prefix: str = "k") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def not_committed_supported(server: Server) -> bool:
    """Whether the server accepts release(reason="not_committed") (SPEC §4;
    issue 10 item 0 adds it). Tests that need it xfail ONLY when the server
    answers 422 for that reason."""
    with Client(server.url) as c:
        key = new_key("probe")
        b = Binding("probe")
        g = c.claim(key, fingerprint({"probe": 1}), b, marks_dispatch=True)
        assert isinstance(g, Grant)
        c.dispatch(key, g.fence)
        try:
            c.release(key, g.fence, "not_committed")
            return True
        except InvalidRequest as e:
            if e.field != "reason":
                raise
            return False


NOT_COMMITTED_MISSING = (
    "server lacks release(reason=\"not_committed\") (SPEC §4, issue 10 item 0): it answers 422 invalid_request "
    "for that reason, so the SDK falls back to settle unknown"
)
