"""RFC 8785 (JCS) canonical JSON and the SPEC §11.1 fingerprint.

The rules are the RFC's: object members sorted by their UTF-16 code units,
no whitespace, strings escaped as ECMAScript's JSON.stringify does, numbers
formatted as ECMAScript's Number.prototype.toString (every number is an IEEE
754 double: an integer beyond 2^53 is rounded to the nearest double, exactly
as JSON.parse in a browser would). Field selection by JSON pointers is the
SDKs' convention, written down in sdk/MIDDLEWARE-KEYS.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["canonicalize", "fingerprint", "select_fields", "FingerprintError"]


class FingerprintError(ValueError):
    """The value cannot be canonicalised (not JSON, NaN, lone surrogate...)
    or the field list is malformed. ``code`` is ``invalid_value`` or
    ``invalid_fields`` (the ``error`` of the shared vectors)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_ESCAPES = {
    0x08: "\\b",
    0x09: "\\t",
    0x0A: "\\n",
    0x0C: "\\f",
    0x0D: "\\r",
    0x22: '\\"',
    0x5C: "\\\\",
}


def _string(s: str, out: list[str]) -> None:
    parts = ['"']
    start = 0
    for i, ch in enumerate(s):
        c = ord(ch)
        if c < 0x20 or c == 0x22 or c == 0x5C:
            parts.append(s[start:i])
            parts.append(_ESCAPES.get(c) or "\\u%04x" % c)
            start = i + 1
        elif 0xD800 <= c <= 0xDFFF:
            # A Python str holds code points, so a surrogate here is always
            # unpaired: it has no UTF-8 form (RFC 8785 §3.2.2.2 refuses it).
            raise FingerprintError("invalid_value", "lone surrogate in a string")
    parts.append(s[start:])
    parts.append('"')
    out.append("".join(parts))


def format_number(x: float) -> str:
    """ECMAScript Number::toString for a finite double (RFC 8785 §3.2.2.3)."""
    if math.isnan(x) or math.isinf(x):
        raise FingerprintError("invalid_value", "NaN and Infinity are not JSON")
    if x == 0:
        return "0"  # also -0
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip (as ECMAScript requires).
    r = repr(abs(x))
    mant, _, exp_s = r.partition("e")
    exp = int(exp_s) if exp_s else 0
    int_part, _, frac_part = mant.partition(".")
    # digits: the significant digits; n: where the decimal point sits
    # relative to them (value = 0.digits × 10^n).
    all_digits = int_part + frac_part
    stripped = all_digits.lstrip("0")
    n = len(int_part) + exp - (len(all_digits) - len(stripped))
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    es = ("+" if e > 0 else "-") + str(abs(e))
    if k == 1:
        return sign + digits + "e" + es
    return sign + digits[0] + "." + digits[1:] + "e" + es


def _utf16_key(s: str) -> bytes:
    return s.encode("utf-16-be", "surrogatepass")


def _value(v: Any, out: list[str], depth: int) -> None:
    if depth > 1000:
        raise FingerprintError("invalid_value", "nesting deeper than 1000")
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        _string(v, out)
    elif isinstance(v, int):
        try:
            f = float(v)
        except OverflowError:
            raise FingerprintError("invalid_value", "integer out of the double range") from None
        out.append(format_number(f))
    elif isinstance(v, float):
        out.append(format_number(v))
    elif isinstance(v, Mapping):
        items = []
        for k, item in v.items():
            if not isinstance(k, str):
                raise FingerprintError("invalid_value", f"object key {k!r} is not a string")
            items.append((k, item))
        items.sort(key=lambda kv: _utf16_key(kv[0]))
        out.append("{")
        for i, (k, item) in enumerate(items):
            if i:
                out.append(",")
            _string(k, out)
            out.append(":")
            _value(item, out, depth + 1)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _value(item, out, depth + 1)
        out.append("]")
    else:
        raise FingerprintError("invalid_value", f"{type(v).__name__} is not a JSON value")


# The C encoder writes the canonical text of a "plain" value (_plain): no
# floats (their ECMAScript form differs from repr's), integers within
# ±2^53 (beyond, JCS writes the double's digits), ASCII object keys (so
# Python's sort is the UTF-16 one) and no lone surrogates (JCS refuses
# them; the encoder would not). Anything else takes the general path.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, check_circular=False).encode
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_EXACT = 2**53


def _plain(v: Any, depth: int, tuples: bool = True) -> bool:
    t = type(v)
    if t is str:
        return bool(v.isascii() or _SURROGATE.search(v) is None)
    if t is int:
        return bool(-_MAX_EXACT <= v <= _MAX_EXACT)
    if v is None or t is bool:
        return True
    if depth >= 1000:
        return False
    if t is dict:
        for k, item in v.items():
            if type(k) is not str or not k.isascii() or not _plain(item, depth + 1, tuples):
                return False
        return True
    if t is list or (tuples and t is tuple):
        return all(_plain(item, depth + 1, tuples) for item in v)
    return False


def plain_json(v: Any) -> str | None:
    """The canonical text of ``v`` when it is plain JSON (dicts, lists, str,
    bool, None and integers within ±2^53, ASCII keys) written as a JSON
    decoder would give it back (no tuples); else None."""
    return _ENCODE(v) if _plain(v, 0, tuples=False) else None


def canonicalize(value: Any) -> str:
    """The RFC 8785 canonical text of a JSON value (dict, list, tuple, str,
    int, float, bool, None)."""
    if _plain(value, 0):
        return _ENCODE(value)
    out: list[str] = []
    _value(value, out, 0)
    return "".join(out)


_MISSING = object()


def _parse_pointer(p: str) -> list[str]:
    if not isinstance(p, str):
        raise FingerprintError("invalid_fields", f"field {p!r} is not a JSON pointer string")
    if p == "":
        return []
    if not p.startswith("/"):
        raise FingerprintError("invalid_fields", f"JSON pointer {p!r} must start with '/'")
    tokens = []
    for t in p[1:].split("/"):
        i = t.find("~")
        while i != -1:
            if i + 1 >= len(t) or t[i + 1] not in "01":
                raise FingerprintError("invalid_fields", f"JSON pointer {p!r}: '~' must be followed by 0 or 1")
            i = t.find("~", i + 2)
        tokens.append(t.replace("~1", "/").replace("~0", "~"))
    return tokens


def _is_index(t: str) -> bool:
    return t == "0" or (t[:1] in "123456789" and t != "" and t.isascii() and t.isdigit())


def _resolve(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for t in tokens:
        if isinstance(cur, Mapping):
            if t not in cur:
                return _MISSING
            cur = cur[t]
        elif isinstance(cur, (list, tuple)):
            if not _is_index(t):
                return _MISSING
            i = int(t)
            if i >= len(cur):
                return _MISSING
            cur = cur[i]
        else:
            return _MISSING
    return cur


def select_fields(value: Any, fields: Iterable[str]) -> dict[str, Any]:
    """The object {pointer: value} of the pointers (RFC 6901) that resolve in
    ``value``; a pointer that does not resolve is left out, so an absent
    field differs from a null one. A malformed pointer or an empty list
    raises FingerprintError('invalid_fields')."""
    if isinstance(fields, str):
        raise FingerprintError("invalid_fields", "fields must be a list of JSON pointers, not one string")
    fl = list(fields)
    if not fl:
        raise FingerprintError("invalid_fields", "fields must name at least one JSON pointer")
    parsed = [(p, _parse_pointer(p)) for p in fl]  # validate all before resolving
    out: dict[str, Any] = {}
    for p, tokens in parsed:
        v = _resolve(value, tokens)
        if v is not _MISSING:
            out[p] = v
    return out


def fingerprint(value: Any, fields: Sequence[str] | None = None) -> str:
    """SPEC §11.1: lowercase hex SHA-256 of the RFC 8785 canonical UTF-8 text
    of ``value``, or of the selection ``select_fields(value, fields)``. A
    pydantic model or a dataclass (also inside ``value``) counts as its JSON
    (``model_dump(mode="json")``, its fields by name)."""
    from ._typed import to_json  # late: _typed is not needed by canonicalize alone

    plain = _plain(value, 0)
    if not plain:  # plain JSON holds no model or dataclass
        value = to_json(value)
    if fields is None:
        text = _ENCODE(value) if plain else canonicalize(value)
    else:
        text = canonicalize(select_fields(value, fields))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
