"""Fixtures: a real ``settle serve`` per session (auth off, and one with
tenants), started on a free port with a temporary data directory and stopped
afterwards. SETTLE_BIN names the binary (default: target/release/settle of
the repository)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from settle_client import Binding, Client, Grant, InvalidRequest, fingerprint
from settle_client.testing import SettleServer, start_settle

REPO = Path(__file__).resolve().parents[3]


def settle_bin() -> str:
    b = os.environ.get("SETTLE_BIN") or str(REPO / "target" / "release" / "settle")
    if not Path(b).exists():
        pytest.exit(f"settle binary not found at {b}: build it (cargo build --release -p settle) or set SETTLE_BIN", 2)
    return b


# The plugin's server (settle_client.testing), with this repository's binary.
Server = SettleServer


def start_server(data: Path, config: Path | None = None, extra: list[str] | None = None) -> Server:
    return start_settle(data, config=config, extra=extra or (), binary=settle_bin())


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("settle-data"))
    yield s
    s.stop()


TOKENS = {"alpha": "token-alpha-0123456789", "beta": "token-beta-9876543210"}


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
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
    s.stop()


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
