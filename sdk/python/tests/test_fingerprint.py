"""The shared fingerprint vectors (testdata/fingerprint-vectors.json), checked
with settle_client and with the independent `rfc8785` package, plus
properties of the canonical form and the refusals."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from settle_client import FingerprintError, canonicalize, fingerprint, select_fields
from settle_client import _jcs
from settle_client._jcs import format_number

VECTORS_PATH = Path(__file__).resolve().parents[3] / "testdata" / "fingerprint-vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))


def test_vector_file_is_well_formed() -> None:
    assert len(VECTORS) >= 90
    names = [v["name"] for v in VECTORS]
    assert len(names) == len(set(names))
    for v in VECTORS:
        assert set(v) <= {"name", "input", "fields", "canonical", "sha256", "error"}
        if "error" in v:
            assert "canonical" not in v and "sha256" not in v
        else:
            assert hashlib.sha256(v["canonical"].encode()).hexdigest() == v["sha256"]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector(v: dict[str, Any]) -> None:
    if "error" in v:
        with pytest.raises(FingerprintError) as e:
            fingerprint(v["input"], v.get("fields"))
        assert e.value.code == v["error"]
        return
    target = v["input"] if "fields" not in v else select_fields(v["input"], v["fields"])
    assert canonicalize(target) == v["canonical"]
    assert fingerprint(v["input"], v.get("fields")) == v["sha256"]


def _as_doubles(x: Any) -> Any:
    # rfc8785 refuses integers beyond 2^53 instead of rounding them to the
    # nearest double as RFC 8785 (and JSON.parse) do: convert first.
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return float(x) if abs(x) > 2**53 - 1 else x
    if isinstance(x, dict):
        return {k: _as_doubles(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_as_doubles(v) for v in x]
    return x


@pytest.mark.parametrize("v", [v for v in VECTORS if "error" not in v], ids=lambda v: v["name"])
def test_vector_with_independent_rfc8785_package(v: dict[str, Any]) -> None:
    target = v["input"] if "fields" not in v else select_fields(v["input"], v["fields"])
    assert rfc8785.dumps(_as_doubles(target)).decode("utf-8") == v["canonical"]


def test_random_doubles_match_rfc8785() -> None:
    r = random.Random(8785)
    for _ in range(20000):
        x = struct.unpack(">d", r.getrandbits(64).to_bytes(8, "big"))[0]
        if math.isnan(x) or math.isinf(x):
            continue
        assert format_number(x) == rfc8785.dumps(x).decode(), repr(x)
    for _ in range(5000):  # "human" numbers: short decimals at every magnitude
        x = float(f"{r.randint(-99999, 99999)}e{r.randint(-30, 30)}")
        assert format_number(x) == rfc8785.dumps(x).decode(), repr(x)


def _random_json(r: random.Random, depth: int = 0) -> Any:
    kind = r.randint(0, 7 if depth < 4 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return r.random() < 0.5
    if kind == 2:
        return r.randint(-(2**53) + 1, 2**53 - 1)
    if kind == 3:
        return r.uniform(-1e6, 1e6) * 10 ** r.randint(-20, 20)
    if kind == 4:
        alphabet = "aZ09 \"\\/\n\t\u0000\u001f\u007f\u00e9\u20ac\U0001f600\ufb33\u2028"
        return "".join(r.choice(alphabet) for _ in range(r.randint(0, 8)))
    if kind in (5, 6):
        return {str(_random_json(r, 5)) if r.random() < 0.3 else "k" + str(r.randint(0, 50)): _random_json(r, depth + 1) for _ in range(r.randint(0, 5))}
    return [_random_json(r, depth + 1) for _ in range(r.randint(0, 5))]


def test_random_documents_match_rfc8785() -> None:
    r = random.Random(13)
    for _ in range(2000):
        doc = _random_json(r)
        assert canonicalize(doc) == rfc8785.dumps(doc).decode("utf-8")


def test_key_order_and_whitespace_do_not_change_the_fingerprint() -> None:
    a = json.loads('{"b": [1, 2, {"y": 1, "x": 2}], "a": "é"}')
    b = json.loads('{ "a" : "\\u00e9", "b" : [ 1.0, 2e0, { "x" : 2, "y" : 1 } ] }')
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint({"a": "é", "b": [2, 1, {"x": 2, "y": 1}]})


def test_tuples_are_arrays() -> None:
    assert canonicalize({"a": (1, 2)}) == canonicalize({"a": [1, 2]})


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), -float("inf"), {1: "int key"}, {"a": b"bytes"}, {"s": {1, 2}}, "\ud800", {"\udc00": 1}, 10**400],
)
def test_values_that_are_not_json_are_refused(bad: Any) -> None:
    with pytest.raises(FingerprintError) as e:
        fingerprint(bad)
    assert e.value.code == "invalid_value"


def test_fields_must_be_a_list_not_a_string() -> None:
    with pytest.raises(FingerprintError):
        fingerprint({"a": 1}, "/a")


def test_missing_field_differs_from_null_field() -> None:
    assert fingerprint({"a": 1}, ["/a", "/b"]) != fingerprint({"a": 1, "b": None}, ["/a", "/b"])
    assert fingerprint({"a": 1}, ["/a", "/b"]) == fingerprint({"a": 1, "c": 2}, ["/a", "/b"])


def test_the_fast_canonical_path_writes_what_the_general_one_does() -> None:
    # canonicalize() hands "plain" values (no floats, integers within
    # ±2^53, ASCII keys, no lone surrogates) to the C JSON encoder; every
    # value, plain or not, must get the general writer's text.


    def general(v: object) -> str:
        out: list[str] = []
        _jcs._value(v, out, 0)
        return "".join(out)

    rng = random.Random(20261207)
    chars = [chr(c) for c in [*range(0x80), 0xE9, 0x2028, 0xFEFF, 0xE000, 0xFFFF, 0x1F600]]
    ints = [0, -1, 2**53, -(2**53), 2**53 + 1, -(2**53) - 1, 10**21, 2**60]

    def text() -> str:
        return "".join(rng.choice(chars) for _ in range(rng.randint(0, 6)))

    def value(depth: int) -> object:
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice([None, True, False, rng.choice(ints), rng.randint(-1000, 1000), text()])
        if r < 0.65:
            return {rng.choice([text(), "a", "b", "é", "\U0001f600", "\ue000", ""]): value(depth + 1) for _ in range(rng.randint(0, 4))}
        return [value(depth + 1) for _ in range(rng.randint(0, 4))]

    fast = 0
    for _ in range(20000):
        v = value(0)
        assert canonicalize(v) == general(v), repr(v)
        fast += _jcs._plain(v, 0)
    assert 0 < fast < 20000  # both paths were taken
