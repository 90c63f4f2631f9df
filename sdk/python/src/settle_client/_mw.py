"""The framework-independent half of the SPEC §8 middleware: header parsing,
the ledger key, the request fingerprint, the stored-response format and the
problem answers. The byte layouts are in sdk/MIDDLEWARE-KEYS.md; the
TypeScript middleware implements the same ones (src/mwcore.ts), and both are
tested against the same expected digests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import time
from datetime import datetime, timezone
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._jcs import FingerprintError, _is_index, _parse_pointer, canonicalize, select_fields
from .errors import DeadlineExceeded, RecordRefused, StaleBinding, TransportError, Unavailable

__all__ = [
    "KeyError_",
    "parse_idempotency_key",
    "frame",
    "ledger_key",
    "request_fingerprint",
    "ConfigError",
    "FingerprintOptions",
    "fingerprint_options",
    "fingerprint_body",
    "exclude_pointers",
    "is_json_media",
    "MAX_JSON_DEPTH",
    "binding_principal",
    "worker_label",
    "parse_worker_label",
    "StoredResponse",
    "encode_response",
    "decode_response",
    "response_sha256",
    "problem_body",
    "retry_after_header",
    "in_progress_retry_after",
    "parse_rfc3339",
    "LedgerFailure",
    "classify_ledger_error",
    "PRINCIPAL_MISSING",
    "NOT_COMMITTED_STATUSES",
    "DEFAULT_STORED_HEADERS",
    "DEFAULT_MAX_STORED_BODY",
]

NOT_COMMITTED_STATUSES = frozenset({408, 409, 425, 429})
DEFAULT_STORED_HEADERS = ("content-type", "location")
DEFAULT_MAX_STORED_BODY = 32 * 1024
_RESULT_VERSION = 1


class KeyError_(Exception):
    """The Idempotency-Key header is missing or malformed (``code`` is
    ``idempotency_key_missing`` or ``idempotency_key_invalid``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _visible(s: str) -> bool:
    return 1 <= len(s) <= 255 and all(0x21 <= ord(c) <= 0x7E for c in s)


def _sf_string(v: str, i: int) -> tuple[str, int]:
    """The RFC 8941 sf-string that starts at ``v[i]`` (a ``"``): its
    unescaped text and the index after its closing quote. Escapes ``\\"``
    and ``\\\\`` only; characters 0x20-0x7E."""
    out: list[str] = []
    i += 1
    while i < len(v):
        c = v[i]
        if c == "\\":
            if i + 1 >= len(v) or v[i + 1] not in '"\\':
                raise KeyError_("idempotency_key_invalid", "bad escape in an Idempotency-Key sf-string")
            out.append(v[i + 1])
            i += 2
        elif c == '"':
            return "".join(out), i + 1
        elif 0x20 <= ord(c) <= 0x7E:
            out.append(c)
            i += 1
        else:
            raise KeyError_("idempotency_key_invalid", "bad character in an Idempotency-Key sf-string")
    raise KeyError_("idempotency_key_invalid", "unterminated sf-string in Idempotency-Key")


_LCALPHA = frozenset("abcdefghijklmnopqrstuvwxyz")
_DIGIT = frozenset("0123456789")
_ALPHA = _LCALPHA | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_KEY_FIRST = _LCALPHA | {"*"}
_KEY_CHAR = _LCALPHA | _DIGIT | frozenset("_-.*")
_TOKEN_FIRST = _ALPHA | {"*"}
_TOKEN_CHAR = _ALPHA | _DIGIT | frozenset("!#$%&'*+-.^_`|~:/")
_BASE64 = _ALPHA | _DIGIT | frozenset("+/=")


def _bad_parameter(what: str) -> KeyError_:
    return KeyError_("idempotency_key_invalid", f"malformed parameter after the Idempotency-Key sf-string: {what}")


def _bare_item_end(v: str, i: int) -> int:
    """The index after the RFC 8941 bare item that starts at ``v[i]``
    (sf-string, token, integer or decimal, byte sequence, boolean)."""
    if i >= len(v):
        raise _bad_parameter("a value is missing after '='")
    c = v[i]
    if c == '"':
        return _sf_string(v, i)[1]
    if c == "-" or c in _DIGIT:
        j = i + 1 if c == "-" else i
        k = j
        while k < len(v) and v[k] in _DIGIT:
            k += 1
        whole = k - j
        if k < len(v) and v[k] == ".":
            f = k + 1
            while f < len(v) and v[f] in _DIGIT:
                f += 1
            if not 1 <= whole <= 12 or not 1 <= f - k - 1 <= 3:
                raise _bad_parameter("a decimal has 1-12 integer and 1-3 fraction digits")
            return f
        if not 1 <= whole <= 15:
            raise _bad_parameter("an integer has 1-15 digits")
        return k
    if c == ":":
        j = i + 1
        while j < len(v) and v[j] in _BASE64:
            j += 1
        if j >= len(v) or v[j] != ":":
            raise _bad_parameter("unterminated byte sequence")
        return j + 1
    if c == "?":
        if i + 1 < len(v) and v[i + 1] in "01":
            return i + 2
        raise _bad_parameter("a boolean is ?0 or ?1")
    if c in _TOKEN_FIRST:
        j = i + 1
        while j < len(v) and v[j] in _TOKEN_CHAR:
            j += 1
        return j
    raise _bad_parameter(f"unexpected {c!r}")


def _skip_parameters(v: str, i: int) -> None:
    """Checks that ``v[i:]`` is zero or more RFC 8941 parameters (which are
    then ignored): ``;``, spaces, a key, optionally ``=`` and a bare item."""
    while i < len(v):
        if v[i] != ";":
            raise KeyError_("idempotency_key_invalid", "unexpected characters after the Idempotency-Key sf-string")
        i += 1
        while i < len(v) and v[i] == " ":
            i += 1
        if i >= len(v) or v[i] not in _KEY_FIRST:
            raise _bad_parameter("a key is lower-case letters, digits, '_-.*', starting with a letter or '*'")
        i += 1
        while i < len(v) and v[i] in _KEY_CHAR:
            i += 1
        if i < len(v) and v[i] == "=":
            i = _bare_item_end(v, i + 1)


def parse_idempotency_key(values: Sequence[str]) -> str | None:
    """The key of the Idempotency-Key header field lines ``values``: None
    when absent. After trimming spaces and tabs, a value starting with ``"``
    is an RFC 8941 sf-string, optionally followed by RFC 8941 parameters
    (parsed and ignored: ``"abc";a=1`` is the key ``abc``); any other value is
    the key as it is (``abc;a=1`` is the key ``abc;a=1``). The key is 1-255
    visible ASCII after unquoting. Sent twice → ``idempotency_key_invalid``."""
    if not values:
        return None
    if len(values) > 1:
        raise KeyError_("idempotency_key_invalid", "the Idempotency-Key header was sent more than once")
    v = values[0].strip(" \t")
    if v.startswith('"'):
        key, end = _sf_string(v, 0)
        _skip_parameters(v, end)
    else:
        key = v
    if not _visible(key):
        raise KeyError_("idempotency_key_invalid", "the Idempotency-Key must be 1-255 visible ASCII characters")
    return key


def frame(*fields: bytes) -> bytes:
    """Each field as a 4-byte big-endian length followed by its bytes."""
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def ledger_key(namespace: str, principal: str, key: str) -> str:
    """SPEC §8 scope: ``mw-`` + hex SHA-256 of the framed namespace,
    principal and (unquoted) header value, all UTF-8."""
    digest = hashlib.sha256(frame(namespace.encode(), principal.encode(), key.encode())).hexdigest()
    return "mw-" + digest


def is_json_media(content_type: str) -> bool:
    """``application/json`` or any ``*+json`` media type (parameters and
    case ignored): the bodies the fingerprint reads as JSON."""
    media = content_type.split(";", 1)[0].strip(" \t").lower()
    return media == "application/json" or media.endswith("+json")


_is_json_media = is_json_media  # the name before the fingerprint options

# A JSON body nested deeper than this (arrays and objects) is fingerprinted
# as raw bytes, in every SDK (the Rust parser's own limit is 127).
MAX_JSON_DEPTH = 100


class ConfigError(ValueError):
    """A middleware option is refused at construction. ``option`` names it
    (``canonical_json``, ``fields`` or ``exclude``); ``code`` is the shared
    vectors' ``error``: ``invalid_fields``, ``invalid_exclude``,
    ``fields_and_exclude`` or ``canonical_json_off`` (and
    ``invalid_canonical_json`` for a value that is not a bool)."""

    def __init__(self, code: str, option: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.option = option


@dataclass(frozen=True)
class FingerprintOptions:
    """How a request body enters the fingerprint (checked by
    ``fingerprint_options``): ``canonical_json`` (RFC 8785 form of JSON
    bodies), and at most one of ``fields`` (keep only these JSON pointers)
    and ``exclude`` (leave these out)."""

    canonical_json: bool = True
    fields: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None


def _pointer_list(option: str, code: str, pointers: Sequence[str]) -> tuple[str, ...]:
    if isinstance(pointers, (str, bytes)) or not isinstance(pointers, (list, tuple)):
        raise ConfigError(code, option, f"{option} must be a list of JSON pointers (RFC 6901), not {type(pointers).__name__}")
    if not pointers:
        raise ConfigError(code, option, f"{option} must name at least one JSON pointer")
    for p in pointers:
        try:
            _parse_pointer(p)
        except FingerprintError as e:
            raise ConfigError(code, option, f"{option}: {e}") from None
    return tuple(pointers)


def fingerprint_options(
    canonical_json: bool = True,
    fields: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> FingerprintOptions:
    """The body options of the fingerprint, checked (sdk/MIDDLEWARE-KEYS.md):
    ``fields`` and ``exclude`` are non-empty lists of RFC 6901 pointers, not
    both; ``exclude`` may not hold ``""`` (the whole document); either needs
    ``canonical_json``. Anything else raises ``ConfigError`` naming the
    option."""
    if not isinstance(canonical_json, bool):
        raise ConfigError("invalid_canonical_json", "canonical_json", "canonical_json must be True or False")
    if fields is not None and exclude is not None:
        raise ConfigError("fields_and_exclude", "exclude", "fields and exclude cannot both be given (fields keeps, exclude leaves out)")
    f = None if fields is None else _pointer_list("fields", "invalid_fields", fields)
    x = None if exclude is None else _pointer_list("exclude", "invalid_exclude", exclude)
    if x is not None and "" in x:
        raise ConfigError("invalid_exclude", "exclude", 'exclude cannot hold "" (the whole document)')
    if (f is not None or x is not None) and not canonical_json:
        option = "fields" if f is not None else "exclude"
        raise ConfigError("canonical_json_off", option, f"{option} needs canonical_json (the body is read as JSON, then canonicalised)")
    return FingerprintOptions(canonical_json, f, x)


def _depth(v: Any, limit: int) -> bool:
    """True when ``v`` nests at most ``limit`` arrays/objects deep."""
    stack: list[tuple[Any, int]] = [(v, 0)]
    while stack:
        cur, d = stack.pop()
        if isinstance(cur, (dict, list)):
            if d + 1 > limit:
                return False
            items = cur.values() if isinstance(cur, dict) else cur
            stack.extend((c, d + 1) for c in items)
    return True


def _path_key(path: list[str | int]) -> list[tuple[int, int | str]]:
    return [(0, t) if isinstance(t, int) else (1, t) for t in path]


def exclude_pointers(value: Any, pointers: Iterable[str]) -> Any:
    """``value`` without the values at ``pointers`` (sdk/MIDDLEWARE-KEYS.md):
    every pointer is resolved in the document as given (before any
    removal; one that does not resolve is ignored), then each value found
    is removed, an object member by its name, an array element by its index
    (later elements shift down). Removed last-first, deepest first, so the
    order of the pointers does not matter. ``value`` is changed in place
    and returned; ``""`` is not accepted (checked by ``fingerprint_options``)."""
    paths: list[list[str | int]] = []
    for p in pointers:
        tokens = _parse_pointer(p)
        if not tokens:
            raise FingerprintError("invalid_fields", 'exclude cannot hold "" (the whole document)')
        cur = value
        path: list[str | int] = []
        for t in tokens:
            if isinstance(cur, dict):
                if t not in cur:
                    break
                path.append(t)
                cur = cur[t]
            elif isinstance(cur, list):
                if not _is_index(t) or int(t) >= len(cur):
                    break
                path.append(int(t))
                cur = cur[int(t)]
            else:
                break
        else:
            paths.append(path)
    # Descending: a later array index before an earlier one, a descendant
    # before its ancestor; equal paths are one.
    paths.sort(key=_path_key, reverse=True)
    done: list[list[str | int]] = []
    for path in paths:
        if done and done[-1] == path:
            continue
        done.append(path)
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]
    return value


def fingerprint_body(options: FingerprintOptions, content_type: str, body: bytes) -> bytes:
    """The body bytes that enter the fingerprint. With ``canonical_json``,
    when the media type is JSON (``is_json_media``) and the body is not
    empty, is strict UTF-8 (a BOM makes it not JSON), parses as JSON, nests
    at most ``MAX_JSON_DEPTH`` deep and is accepted whole by the fingerprint
    helper: its RFC 8785 text, after ``fields`` (the selection
    ``{pointer: value}`` of the fingerprint helper) or ``exclude``. Any
    other body: the raw bytes."""
    if not options.canonical_json or not body or not is_json_media(content_type):
        return body
    try:
        value = json.loads(body.decode("utf-8"))
        if not _depth(value, MAX_JSON_DEPTH):
            return body
        whole = canonicalize(value)  # the whole body must be JSON the helper accepts
        if options.fields is not None:
            return canonicalize(select_fields(value, options.fields)).encode("utf-8")
        if options.exclude is not None:
            return canonicalize(exclude_pointers(value, options.exclude)).encode("utf-8")
        return whole.encode("utf-8")
    except (ValueError, UnicodeDecodeError, FingerprintError, RecursionError):
        return body  # not JSON after all: the raw bytes count


def request_fingerprint(
    method: str,
    target: str,
    content_type: str,
    body: bytes,
    headers: Iterable[tuple[str, str]] = (),
    canonical_json: bool = True,
    fields: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    *,
    options: FingerprintOptions | None = None,
) -> str:
    """SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
    request target (path with its query, as sent), the content-type (as
    sent, "" when absent), the body (``fingerprint_body``: by default the
    RFC 8785 form of a JSON body), then each configured header as name
    (lower case) and value, sorted by name. ``options`` (from
    ``fingerprint_options``, checked once) wins over ``canonical_json``,
    ``fields`` and ``exclude`` (checked on every call)."""
    opts = options if options is not None else fingerprint_options(canonical_json, fields, exclude)
    body = fingerprint_body(opts, content_type, body)
    parts = [method.upper().encode(), target.encode(), content_type.encode(), body]
    for name, value in sorted((n.lower(), v) for n, v in headers):
        parts += [name.encode(), value.encode()]
    return hashlib.sha256(frame(*parts)).hexdigest()


def binding_principal(principal: str) -> str:
    """The claim's ``binding.principal``: the principal itself when it fits
    the key syntax, else ``sha256:`` + its hex digest."""
    if _visible(principal):
        return principal
    return "sha256:" + hashlib.sha256(principal.encode()).hexdigest()


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_WORKER_MAX = 4096  # the ledger's limit for the claim's worker field (SPEC §7)


def _pct(value: str) -> str:
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in value.encode("utf-8"))


def worker_label(key: str, principal: str) -> str:
    """The claim's ``worker`` field (SPEC §8): ``idempotency-key=<key>
    principal=<principal>``, the header value after unquoting and the
    principal the extractor gave (not the binding's ``sha256:`` form), every
    byte outside ``A-Za-z0-9-._~`` of their UTF-8 as uppercase ``%XX``, so
    that a Reconciler can hand a middleware hook both. A principal whose
    encoded form would make the field longer than the ledger's 4096 bytes is
    written in its binding form instead (``sha256:`` + hex)."""
    label = f"idempotency-key={_pct(key)} principal={_pct(principal)}"
    if len(label) > _WORKER_MAX:
        label = f"idempotency-key={_pct(key)} principal={_pct(binding_principal(principal))}"
    return label


_WORKER_RE = re.compile(r"idempotency-key=([A-Za-z0-9\-._~%]+) principal=([A-Za-z0-9\-._~%]*)")


def parse_worker_label(worker: str) -> tuple[str, str] | None:
    """The (Idempotency-Key value, principal) of a claim's ``worker`` field
    written by ``worker_label``, or None when it is not one."""
    m = _WORKER_RE.fullmatch(worker)
    if m is None:
        return None
    try:
        return _unpct(m.group(1)), _unpct(m.group(2))
    except ValueError:
        return None


def _unpct(s: str) -> str:
    out = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c == "%":
            h = s[i + 1 : i + 3]
            if len(h) != 2 or any(x not in "0123456789ABCDEFabcdef" for x in h):
                raise ValueError("bad %XX")
            out.append(int(h, 16))
            i += 3
        else:
            out.append(ord(c))
            i += 1
    return out.decode("utf-8")  # UnicodeDecodeError is a ValueError


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes | None  # None: too large, only its digest was stored


def response_sha256(status: int, body: bytes) -> str:
    return hashlib.sha256(frame(str(status).encode(), body)).hexdigest()


def encode_response(
    status: int, headers: Iterable[tuple[str, str]], body: bytes, stored_names: Iterable[str], max_body: int
) -> tuple[dict[str, Any], str]:
    """The settled ``result`` for a response and its ``response_sha256``."""
    # The replay sets its own content-length; framing headers are never stored.
    names = {n.lower() for n in stored_names} - {"content-length", "transfer-encoding"}
    kept = [[n.lower(), v] for n, v in headers if n.lower() in names]
    result: dict[str, Any] = {"v": _RESULT_VERSION, "status": status, "headers": kept}
    if len(body) <= max_body:
        result["body"] = base64.b64encode(body).decode("ascii")
    else:
        result["body"] = None
        result["body_bytes"] = len(body)
        result["body_sha256"] = hashlib.sha256(body).hexdigest()
    return result, response_sha256(status, body)


def decode_response(result: Any) -> StoredResponse | None:
    """A stored response, or None when ``result`` is not one."""
    if not isinstance(result, dict) or result.get("v") != _RESULT_VERSION:
        return None
    status = result.get("status")
    headers = result.get("headers")
    if not isinstance(status, int) or not isinstance(headers, list):
        return None
    hs: list[tuple[str, str]] = []
    for h in headers:
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)):
            return None
        hs.append((h[0], h[1]))
    b = result.get("body")
    if b is None:
        return StoredResponse(status, hs, None)
    if not isinstance(b, str):
        return None
    try:
        return StoredResponse(status, hs, base64.b64decode(b, validate=True))
    except ValueError:
        return None


_TITLES = {
    "idempotency_key_missing": "Idempotency-Key missing",
    "idempotency_key_invalid": "Idempotency-Key invalid",
    "idempotency_key_reused": "Idempotency-Key reused",
    "request_in_progress": "Request in progress",
    "outcome_unknown": "Outcome unknown",
    "idempotency_unavailable": "Idempotency unavailable",
    "response_not_stored": "Response not stored",
    "payload_too_large": "Payload too large",
    "idempotency_forbidden": "Idempotency forbidden",
    "idempotency_principal_missing": "Idempotency principal missing",
}

PRINCIPAL_MISSING = "no principal was found for this request (see the principal option)"
UNAVAILABLE_DETAIL = "the idempotency ledger is unreachable; the request was not run"
FORBIDDEN_DETAIL = "the ledger refused this caller's binding (its principal was revoked or moved on)"


@dataclass(frozen=True)
class LedgerFailure:
    """How the middleware answers a ledger call that failed (SPEC §8).

    ``fail_open``: a route with the fail-open option may run the handler
    (only when settle gave no answer, or a 503 ``unavailable``);
    ``status``/``code``: the problem answered otherwise; ``retry_after``:
    its Retry-After header in whole seconds (None for a 403);
    ``unexpected``: an answer the middleware has no rule for (logged as an
    error)."""

    fail_open: bool
    status: int
    code: str
    detail: str
    retry_after: int | None
    unexpected: bool


def classify_ledger_error(err: BaseException, unavailable_retry_after_s: int) -> LedgerFailure:
    """SPEC §8's rule for a claim or dispatch that failed, shared by the
    three SDKs: no answer or 503 ``unavailable`` → 503
    ``idempotency_unavailable`` (fail-open allowed); ``stale_binding`` → 403
    ``idempotency_forbidden``; ``record_refused`` and any 429 → 503 (a 429's
    own Retry-After, rounded up, when it sent one); anything else
    (``invalid_request``, 401, ...) → 503, logged as an error. A refusal
    never runs the handler."""
    configured = max(1, unavailable_retry_after_s)
    if isinstance(err, DeadlineExceeded) and err.last is not None:
        err = err.last  # retried until the deadline: what the last try got
    if isinstance(err, TransportError) or (isinstance(err, Unavailable) and err.status == 503):
        return LedgerFailure(True, 503, "idempotency_unavailable", UNAVAILABLE_DETAIL, configured, False)
    if isinstance(err, StaleBinding):
        return LedgerFailure(False, 403, "idempotency_forbidden", FORBIDDEN_DETAIL, None, False)
    status = getattr(err, "status", None)
    if status == 429:
        ra = getattr(err, "retry_after_s", None)
        secs = max(1, math.ceil(ra)) if isinstance(ra, (int, float)) and math.isfinite(ra) else configured
        return LedgerFailure(False, 503, "idempotency_unavailable", UNAVAILABLE_DETAIL, secs, False)
    if isinstance(err, RecordRefused):
        return LedgerFailure(False, 503, "idempotency_unavailable", UNAVAILABLE_DETAIL, configured, False)
    return LedgerFailure(False, 503, "idempotency_unavailable", UNAVAILABLE_DETAIL, configured, True)


def problem_body(status: int, code: str, detail: str) -> bytes:
    """An RFC 9457 problem+json body with the extra ``code`` member."""
    body = {
        "type": f"urn:settle:problem:{code}",
        "title": _TITLES.get(code, code),
        "status": status,
        "detail": detail,
        "code": code,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def retry_after_header(retry_after_ms: int) -> str:
    """Whole seconds, at least 1 (SPEC §8)."""
    return str(max(1, math.ceil(retry_after_ms / 1000)))


_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_rfc3339(s: str) -> float | None:
    """An RFC 3339 timestamp (as settle writes them: ``...T17:05:38.147Z``)
    as POSIX seconds, or None when it is not one."""
    m = _RFC3339.match(s)
    if m is None:
        return None
    y, mo, d, h, mi, sec, frac, z, sign, oh, om = m.groups()
    try:
        dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=timezone.utc)
    except ValueError:
        return None
    t = dt.timestamp() + (float("0." + frac) if frac else 0.0)
    if not z:
        off = int(oh) * 3600 + int(om) * 60
        t -= off if sign == "+" else -off
    return t


def in_progress_retry_after(retry_after_ms: int, lease_expires_at: str | None, now: float | None = None) -> str:
    """The ``Retry-After`` of 409 ``request_in_progress`` (SPEC §8 as
    amended): the time the running lease has left, ceil of
    (``lease_expires_at`` − now) in whole seconds, at least 1 and at least
    the ``retry_after_ms`` hint rounded up. Without a readable
    ``lease_expires_at`` (an older server): the hint alone."""
    hint = max(1, math.ceil(retry_after_ms / 1000))
    at = parse_rfc3339(lease_expires_at) if lease_expires_at else None
    if at is None:
        return str(hint)
    left = at - (time.time() if now is None else now)
    return str(max(hint, math.ceil(left) if math.isfinite(left) else hint))
