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


VECTORS = json.loads((SDK / "middleware-vectors.json").read_text(encoding="utf-8"))


def test_every_fingerprint_vector() -> None:
    groups: dict[str, str] = {}
    for c in VECTORS["fingerprints"]:
        body = base64.b64decode(c["body_b64"])
        opts = _mw.fingerprint_options(c["canonical_json"], c.get("fields"), c.get("exclude"))
        got_body = _mw.fingerprint_body(opts, c["content_type"], body)
        assert base64.b64encode(got_body).decode() == c["fingerprinted_body_b64"], c
        headers = [(n, v) for n, v in c["headers"]]
        got = _mw.request_fingerprint(c["method"], c["target"], c["content_type"], body, headers, options=opts)
        assert got == c["sha256"], c
        unchecked = _mw.request_fingerprint(
            c["method"], c["target"], c["content_type"], body, headers, c["canonical_json"], c.get("fields"), c.get("exclude")
        )
        assert unchecked == c["sha256"]
        if "same" in c:
            assert groups.setdefault(c["same"], c["sha256"]) == c["sha256"], c["same"]
    assert len(groups) >= 5


def test_every_refused_option_vector() -> None:
    assert VECTORS["fingerprint_options_refused"]
    for c in VECTORS["fingerprint_options_refused"]:
        with pytest.raises(_mw.ConfigError) as e:
            _mw.fingerprint_options(c["canonical_json"], c.get("fields"), c.get("exclude"))
        assert e.value.code == c["error"], c


def test_exclude_by_hand() -> None:
    # Resolved in the document as given: the order of the pointers and
    # duplicates do not matter; array elements shift down.
    doc = {"a": [0, 1, 2, 3], "b": {"c": 1, "d": 2}, "e": None}
    for ptrs in (["/a/1", "/a/2", "/b/c"], ["/b/c", "/a/2", "/a/1", "/a/1"]):
        got = _mw.exclude_pointers(json.loads(json.dumps(doc)), ptrs)
        assert got == {"a": [0, 3], "b": {"d": 2}, "e": None}
    assert _mw.exclude_pointers({"a": [1]}, ["/a", "/a/0"]) == {}
    assert _mw.exclude_pointers({"a": [1]}, ["/x", "/a/1", "/a/-", "/a/00", "/a/0/q"]) == {"a": [1]}
    assert _mw.exclude_pointers({"e": None}, ["/e"]) == {}


def test_canonical_json_is_the_default() -> None:
    a = _mw.request_fingerprint("POST", "/p", "application/json", b'{"b":1,"a":2}')
    assert a == _mw.request_fingerprint("POST", "/p", "application/json", b'{ "a": 2, "b": 1 }')
    assert a != _mw.request_fingerprint("POST", "/p", "application/json", b'{"b":1,"a":2}', canonical_json=False)
    assert _mw.fingerprint_options() == _mw.FingerprintOptions(True, None, None)


def _f(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def test_ledger_key_layout_by_hand() -> None:
    want = "mw-" + hashlib.sha256(_f(b"default") + _f(b"acct-1") + _f(b"abc")).hexdigest()
    assert _mw.ledger_key("default", "acct-1", "abc") == want
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


# The shared header grammar (sdk/MIDDLEWARE-KEYS.md, "Idempotency-Key
# header"), written out here rather than read from the generated vectors.
@pytest.mark.parametrize(
    "value,key",
    [
        ('"p-1";a=1', "p-1"),
        ('"p-1";a', "p-1"),
        ('"p-1"; a=1', "p-1"),
        ('"p-1";a="x;y";b=?1;c=:YWJj:;d=-1.5;e=tok/x', "p-1"),
        ('"p-1";*k=1', "p-1"),
        ('"p-1";a=123456789012345;b=123456789012.123;c=?0;d=::;e=""', "p-1"),
        ('\t"p-1";a=1 ', "p-1"),
        ('"p\\"1";a=1', 'p"1'),
        ("abc;a=1", "abc;a=1"),
        ('"abc"', "abc"),
        ("abc", "abc"),
    ],
)
def test_sf_string_item_with_parameters(value: str, key: str) -> None:
    assert _mw.parse_idempotency_key([value]) == key


@pytest.mark.parametrize(
    "value",
    [
        '"p-1" ;a=1',
        '"p-1";',
        '"p-1";A=1',
        '"p-1";a=',
        '"p-1";a=1 x',
        '"p-1";a="x',
        '"p-1"x',
        '"p-1";=1',
        '"p-1";a=1;;b',
        '"p-1";\ta=1',
        '"p-1";a=1234567890123456',
        '"p-1";a=1234567890123.1',
        '"p-1";a=1.1234',
        '"p-1";a=1.',
        '"p-1";a=?2',
        '"p-1";a=:YW*j:',
        '"p-1";a="\\x"',
        '"";a=1',
    ],
)
def test_sf_string_item_with_bad_parameters(value: str) -> None:
    with pytest.raises(_mw.KeyError_) as e:
        _mw.parse_idempotency_key([value])
    assert e.value.code == "idempotency_key_invalid"


def test_vectors_have_no_default_principal_and_account_like_principals() -> None:
    v = json.loads((SDK / "middleware-vectors.json").read_text(encoding="utf-8"))
    assert "default_principal" not in v
    principals = [c["principal"] for c in v["ledger_keys"] + v["binding_principal"] + v["worker_label"]]
    assert "anonymous" not in principals and "acct-1" in principals and "svc-billing" in principals
    assert all(len(p) != 64 or not all(c in "0123456789abcdef" for c in p) for p in principals)  # no hashed header
    assert {"", "prinçipal", "has space", "a" * 255, "a" * 256} <= set(principals)


def test_parser_agrees_with_the_header_vectors() -> None:
    # The header cases of the vector file are written by hand in the
    # generator (not computed by this parser): check the parser against them.
    v = json.loads((SDK / "middleware-vectors.json").read_text(encoding="utf-8"))
    for case in v["idempotency_key_header"]:
        if "error" in case:
            with pytest.raises(_mw.KeyError_) as e:
                _mw.parse_idempotency_key(case["values"])
            assert e.value.code == case["error"], case
        else:
            assert _mw.parse_idempotency_key(case["values"]) == case["key"], case
