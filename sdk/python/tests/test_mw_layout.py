"""The middleware byte layouts (sdk/MIDDLEWARE-KEYS.md): the committed
sdk/middleware-vectors.json is what the Python middleware computes, and the
layouts are what the doc says, rebuilt here by hand."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from settle_client import _mw

SDK = Path(__file__).resolve().parents[2]


def test_committed_vectors_are_current() -> None:
    spec = importlib.util.spec_from_file_location("gen", SDK / "python" / "tools" / "gen_mw_vectors.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (SDK / "middleware-vectors.json").read_text(encoding="utf-8") == gen.render()


def _f(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def test_ledger_key_layout_by_hand() -> None:
    want = "mw-" + hashlib.sha256(_f(b"default") + _f(b"anonymous") + _f(b"abc")).hexdigest()
    assert _mw.ledger_key("default", "anonymous", "abc") == want
    assert _mw.ledger_key("ns", "a", "bc") != _mw.ledger_key("nsa", "", "bc")
    assert len(want) == 67


def test_fingerprint_layout_by_hand() -> None:
    raw = _f(b"POST") + _f(b"/p?q=1") + _f(b"application/json") + _f(b'{"a":1}') + _f(b"x-a") + _f(b"1")
    assert _mw.request_fingerprint("post", "/p?q=1", "application/json", b'{"a":1}', [("X-A", "1")]) == hashlib.sha256(raw).hexdigest()


def test_stored_response_round_trip() -> None:
    result, digest = _mw.encode_response(201, [("Location", "/x"), ("X-No", "1")], b"hello", _mw.DEFAULT_STORED_HEADERS, 100)
    assert result == {"v": 1, "status": 201, "headers": [["location", "/x"]], "body": base64.b64encode(b"hello").decode()}
    assert digest == hashlib.sha256(_f(b"201") + _f(b"hello")).hexdigest()
    stored = _mw.decode_response(json.loads(json.dumps(result)))
    assert stored is not None and stored.body == b"hello" and stored.headers == [("location", "/x")]
    big, _ = _mw.encode_response(200, [], b"x" * 101, (), 100)
    assert big["body"] is None and big["body_bytes"] == 101
    s2 = _mw.decode_response(big)
    assert s2 is not None and s2.body is None
    for bad in [None, {}, {"v": 2}, {"v": 1, "status": "201", "headers": []}, {"v": 1, "status": 201, "headers": [["a"]]}, {"v": 1, "status": 201, "headers": [], "body": "!!"}]:
        assert _mw.decode_response(bad) is None


@pytest.mark.parametrize("ms,want", [(0, "1"), (1000, "1"), (1001, "2")])
def test_retry_after(ms: int, want: str) -> None:
    assert _mw.retry_after_header(ms) == want
