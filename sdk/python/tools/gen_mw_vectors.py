"""Writes sdk/middleware-vectors.json: the SPEC §8 byte layouts of
sdk/MIDDLEWARE-KEYS.md as test vectors (ledger key, request fingerprint,
header parsing, binding principals, stored responses), so that the Python, the
TypeScript (and later the Rust) middleware agree byte for byte.

    python sdk/python/tools/gen_mw_vectors.py        # from the repository root

The Python test suite checks that the committed file equals this output; the
TypeScript tests check their implementation against the file.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from settle_client import _mw  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "middleware-vectors.json"
# Stored header names of the response vectors: the defaults, one extra, and
# the framing headers that are never stored even when configured.
STORED = (*_mw.DEFAULT_STORED_HEADERS, "x-kept", "content-length", "transfer-encoding")


def build() -> dict[str, Any]:
    keys = [
        ("default", "acct-1", "abc"),
        ("default", "acct-1", "abd"),
        ("payments", "acct-1", "abc"),
        ("default", "acct-2", "abc"),
        ("", "", "k"),
        ("ns", "a", "bc"),
        ("nsa", "", "bc"),  # framing: differs from the one above
        ("default", "svc-billing", "order-7"),
        ("default", "has space", "order-7"),
        ("zahlungen-€", "prinçipal", "x" * 255),
    ]
    fps: list[dict[str, Any]] = []

    def fp(method: str, target: str, ct: str, body: bytes, headers: list[tuple[str, str]] = [], canonical: bool = False) -> None:
        fps.append(
            {
                "method": method,
                "target": target,
                "content_type": ct,
                "body_b64": base64.b64encode(body).decode(),
                "headers": [list(h) for h in headers],
                "canonical_json": canonical,
                "sha256": _mw.request_fingerprint(method, target, ct, body, headers, canonical),
            }
        )

    fp("POST", "/payments", "application/json", b'{"amount":10,"currency":"EUR"}')
    fp("post", "/payments", "application/json", b'{"amount":10,"currency":"EUR"}')  # method upper-cased
    fp("PATCH", "/payments", "application/json", b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments?x=1", "application/json", b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments", "", b"")
    fp("POST", "/payments", "text/plain", b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments", "application/json", b'{ "currency": "EUR", "amount": 10.0 }')
    fp("POST", "/payments", "application/json", b'{ "currency": "EUR", "amount": 10.0 }', canonical=True)
    fp("POST", "/payments", "application/json", b'{"amount":10,"currency":"EUR"}', canonical=True)
    fp("POST", "/payments", "application/problem+json; charset=utf-8", b'{"b":1,"a":2}', canonical=True)
    fp("POST", "/payments", "text/plain", b'{"b":1,"a":2}', canonical=True)  # not a JSON media type: raw
    fp("POST", "/payments", "application/json", b"{not json", canonical=True)  # does not parse: raw
    fp("POST", "/payments", "application/json", b"{}", [("X-Tenant", "acme"), ("accept-language", "de")])
    fp("POST", "/payments", "application/json", b"{}", [("accept-language", "de"), ("x-tenant", "acme")])
    fp("POST", "/payments", "application/json", b"{}", [("x-tenant", "")])
    fp("POST", "/payments", "application/octet-stream", bytes(range(256)))

    headers = [
        (["abc"], "abc"),
        (['"abc"'], "abc"),
        ([' \t"abc" '], "abc"),
        (['"a\\"b\\\\c"'], 'a"b\\c'),
        (["a,b"], "a,b"),
        (["x" * 255], "x" * 255),
        ([], None),
        (["x" * 256], "idempotency_key_invalid"),
        ([""], "idempotency_key_invalid"),
        (['""'], "idempotency_key_invalid"),
        (['"a b"'], "idempotency_key_invalid"),
        (["a b"], "idempotency_key_invalid"),
        (['"abc'], "idempotency_key_invalid"),
        (['"a\\x"'], "idempotency_key_invalid"),
        (['"a"b"'], "idempotency_key_invalid"),
        (["abc", "abc"], "idempotency_key_invalid"),
        (["caf\u00e9"], "idempotency_key_invalid"),
        # An sf-string Item with RFC 8941 parameters: parsed and ignored.
        (['"p-1";a=1'], "p-1"),
        (['"p-1";a'], "p-1"),
        (['"p-1"; a=1'], "p-1"),
        (['"p-1";  a=1;b'], "p-1"),
        (['"p-1";a="x;y";b=?1;c=:YWJj:;d=-1.5;e=tok/x'], "p-1"),
        (['"p-1";*k=1'], "p-1"),
        (['"p-1";a=?0;b=::;c=*t:x;d=0.001;e=""'], "p-1"),
        (['"p-1";a="q\\"\\\\"'], "p-1"),
        (['"p-1";a=123456789012345'], "p-1"),
        (['"p-1";a=123456789012.123'], "p-1"),
        ([' "p-1";a=1 '], "p-1"),
        (['"p;1";a=1'], "p;1"),
        (["abc;a=1"], "abc;a=1"),
        (['"p-1" ;a=1'], "idempotency_key_invalid"),
        (['"p-1";'], "idempotency_key_invalid"),
        (['"p-1";A=1'], "idempotency_key_invalid"),
        (['"p-1";a='], "idempotency_key_invalid"),
        (['"p-1";a=1 x'], "idempotency_key_invalid"),
        (['"p-1";a="x'], "idempotency_key_invalid"),
        (['"p-1"x'], "idempotency_key_invalid"),
        (['"p-1";=1'], "idempotency_key_invalid"),
        (['"p-1";1a=1'], "idempotency_key_invalid"),
        (['"p-1";a=1;;b'], "idempotency_key_invalid"),
        (['"p-1";\ta=1'], "idempotency_key_invalid"),
        (['"p-1";a=1234567890123456'], "idempotency_key_invalid"),
        (['"p-1";a=1234567890123.1'], "idempotency_key_invalid"),
        (['"p-1";a=1.1234'], "idempotency_key_invalid"),
        (['"p-1";a=1.'], "idempotency_key_invalid"),
        (['"p-1";a=-'], "idempotency_key_invalid"),
        (['"p-1";a=?2'], "idempotency_key_invalid"),
        (['"p-1";a=:YW*j:'], "idempotency_key_invalid"),
        (['"p-1";a=:YWJj'], "idempotency_key_invalid"),
        (['"p-1";a="\\x"'], "idempotency_key_invalid"),
        (['"p-1";a=@'], "idempotency_key_invalid"),
        (['"p-1",a'], "idempotency_key_invalid"),
        (['"";a=1'], "idempotency_key_invalid"),
    ]
    responses = []
    for status, hs, body, limit in [
        (201, [("Content-Type", "application/json"), ("Location", "/payments/pay_1"), ("X-Other", "1")], b'{"id":"pay_1"}', 32768),
        (400, [("content-type", "application/json")], b'{"error":"amount must not be zero"}', 32768),
        (500, [], b"", 32768),
        (201, [("content-type", "text/plain")], b"x" * 11, 10),
        (200, [("Content-Length", "2"), ("X-Kept", "k"), ("Transfer-Encoding", "chunked")], b"ok", 32768),
    ]:
        result, digest = _mw.encode_response(status, hs, body, STORED, limit)
        responses.append(
            {
                "status": status,
                "headers": [list(h) for h in hs],
                "body_b64": base64.b64encode(body).decode(),
                "stored_headers": list(STORED),
                "max_stored_body": limit,
                "result": result,
                "response_sha256": digest,
            }
        )
    return {
        "about": "SPEC §8 middleware byte layouts (sdk/MIDDLEWARE-KEYS.md); generated by sdk/python/tools/gen_mw_vectors.py",
        "ledger_keys": [{"namespace": n, "principal": p, "key": k, "ledger_key": _mw.ledger_key(n, p, k)} for n, p, k in keys],
        "fingerprints": fps,
        "idempotency_key_header": [
            {"values": v, "key": r} if r is None or r != "idempotency_key_invalid" else {"values": v, "error": r}
            for v, r in headers
        ],
        "binding_principal": [
            {"principal": p, "binding_principal": _mw.binding_principal(p)}
            for p in ["acct-1", "svc-billing", "a" * 255, "a" * 256, "prinçipal", "has space", ""]
        ],
        "worker_label": [
            {"key": k, "principal": p, "worker": _mw.worker_label(k, p)}
            for k, p in [("order-7", "acct-1"), ("order-7", "svc-billing"), ("order-7", "has space")]
        ],
        "responses": responses,
        "retry_after": [{"retry_after_ms": ms, "header": _mw.retry_after_header(ms)} for ms in [0, 10, 999, 1000, 1001, 2500]],
    }


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
