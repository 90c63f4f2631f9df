"""Writes sdk/middleware-vectors.json: the SPEC §8 byte layouts of
sdk/MIDDLEWARE-KEYS.md as test vectors (ledger key, request fingerprint,
header parsing, principals, stored responses), so that the Python, the
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
        ("default", "anonymous", "abc"),
        ("default", "anonymous", "abd"),
        ("payments", "anonymous", "abc"),
        ("", "", "k"),
        ("ns", "a", "bc"),
        ("nsa", "", "bc"),  # framing: differs from the one above
        ("default", _mw.default_principal("Bearer alice"), "order-7"),
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
        "default_principal": [
            {"authorization": a, "principal": _mw.default_principal(a)} for a in [None, "Bearer alice", "Basic YTpi", ""]
        ],
        "binding_principal": [
            {"principal": p, "binding_principal": _mw.binding_principal(p)}
            for p in ["anonymous", "svc-1", "a" * 255, "a" * 256, "prinçipal", "has space", ""]
        ],
        "worker_label": [{"key": "order-7", "principal": "anonymous", "worker": _mw.worker_label("order-7", "anonymous")}],
        "responses": responses,
        "retry_after": [{"retry_after_ms": ms, "header": _mw.retry_after_header(ms)} for ms in [0, 10, 999, 1000, 1001, 2500]],
    }


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
