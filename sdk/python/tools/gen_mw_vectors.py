"""Writes sdk/middleware-vectors.json: the SPEC §8 byte layouts of
sdk/MIDDLEWARE-KEYS.md as test vectors (ledger key, request fingerprint,
header parsing, binding principals, stored responses), so that the Python, the
TypeScript and the Rust middleware agree byte for byte (with the fingerprint
body options: canonical JSON, fields, exclude, and the refused options).

    python sdk/python/tools/gen_mw_vectors.py        # from the repository root

The Python test suite checks that the committed file equals this output and
every case; the TypeScript and Rust tests check theirs against every case.
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
    groups: dict[str, str] = {}

    def fp(
        method: str,
        target: str,
        ct: str,
        body: bytes,
        headers: list[tuple[str, str]] = [],
        canonical: bool = False,
        fields: list[str] | None = None,
        exclude: list[str] | None = None,
        same: str | None = None,
    ) -> None:
        opts = _mw.fingerprint_options(canonical, fields, exclude)
        case: dict[str, Any] = {
            "method": method,
            "target": target,
            "content_type": ct,
            "body_b64": base64.b64encode(body).decode(),
            "headers": [list(h) for h in headers],
            "canonical_json": canonical,
        }
        if fields is not None:
            case["fields"] = fields
        if exclude is not None:
            case["exclude"] = exclude
        case["fingerprinted_body_b64"] = base64.b64encode(_mw.fingerprint_body(opts, ct, body)).decode()
        case["sha256"] = _mw.request_fingerprint(method, target, ct, body, headers, options=opts)
        if same is not None:
            # Cases of one group must fingerprint alike (and others not).
            case["same"] = same
            want = groups.setdefault(same, case["sha256"])
            assert want == case["sha256"], (same, body)
        fps.append(case)

    J = "application/json"
    fp("POST", "/payments", J, b'{"amount":10,"currency":"EUR"}')
    fp("post", "/payments", J, b'{"amount":10,"currency":"EUR"}')  # method upper-cased
    fp("PATCH", "/payments", J, b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments?x=1", J, b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments", "", b"")
    fp("POST", "/payments", "text/plain", b'{"amount":10,"currency":"EUR"}')
    fp("POST", "/payments", J, b'{ "currency": "EUR", "amount": 10.0 }')
    fp("POST", "/payments", J, b"{}", [("X-Tenant", "acme"), ("accept-language", "de")])
    fp("POST", "/payments", J, b"{}", [("accept-language", "de"), ("x-tenant", "acme")])
    fp("POST", "/payments", J, b"{}", [("x-tenant", "")])
    fp("POST", "/payments", "application/octet-stream", bytes(range(256)))

    # canonical_json (the default): key order, whitespace and number
    # spellings do not matter for a JSON media type.
    for body in [
        b'{"amount":10,"currency":"EUR"}',
        b'{ "currency": "EUR", "amount": 10.0 }',
        b'\n\t{"currency" :"EUR",\r\n "amount":1e1}  ',
        b'{"currency":"\\u0045UR","amount":10}',
    ]:
        fp("POST", "/payments", J, body, canonical=True, same="order")
    for ct in ["application/json; charset=utf-8", "Application/JSON", " application/json\t;x=1"]:
        fp("POST", "/payments", ct, b'{"b":1,"a":2}', canonical=True)
    fp("POST", "/payments", "application/problem+json; charset=utf-8", b'{"b":1,"a":2}', canonical=True)
    fp("POST", "/payments", "application/vnd.api+JSON", b'{"b":1,"a":2}', canonical=True)
    fp("POST", "/payments", "application/merge-patch+json", b'{ "b" : null }', canonical=True)
    fp("POST", "/payments", "text/plain", b'{"b":1,"a":2}', canonical=True)  # not a JSON media type: raw
    fp("POST", "/payments", "text/json", b'{"b":1,"a":2}', canonical=True)  # not a JSON media type: raw
    fp("POST", "/payments", "application/json-seq", b'{"b":1,"a":2}', canonical=True)  # raw
    fp("POST", "/payments", "", b'{"b":1,"a":2}', canonical=True)  # no content-type: raw
    nested_a = r'{"b":{"y":[1,{"d":1,"c":2}],"x":null},"a":"\u00e9\ud83d\ude00","\ue000":0,"\ud83d\ude00":1}'
    nested_b = '{"\U0001F600":1,"\ue000":0,"a":"\u00e9\U0001F600","b":{"x":null,"y":[1,{"c":2,"d":1}]}}'
    fp("POST", "/payments", J, nested_a.encode(), canonical=True, same="nested")
    fp("POST", "/payments", J, nested_b.encode(), canonical=True, same="nested")
    fp("POST", "/payments", J, b'[3, "x", true, null, {"b": [], "a": {}}]', canonical=True)
    fp("POST", "/payments", J, b' "only a string" ', canonical=True)
    fp("POST", "/payments", J, b"-0.0", canonical=True)
    fp("POST", "/payments", J, b'{"n":[1E30,4.50,0.000001,1e-7,12345678901234567890,9007199254740993]}', canonical=True)
    fp("POST", "/payments", J, b'{"a":1,"a":2}', canonical=True)  # duplicate names: the last one counts
    fp("POST", "/payments", J, b'{"a":' * 100 + b"1" + b"}" * 100, canonical=True)  # 100 deep: canonical
    fp("POST", "/payments", J, b"[ " * 100 + b"]" * 100, canonical=True)
    # Bodies that do not parse (or that the helper refuses) count as raw bytes.
    for body in [
        b"{not json",
        b'{"a":1,}',
        b"\xef\xbb\xbf{}",  # a BOM
        b'{"a":"\xff"}',  # not UTF-8
        b'{"a":"\xed\xa0\x80"}',  # an encoded surrogate
        b'{"a":"\\ud800"}',  # a lone surrogate escape
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":1e400}',
        b'{"a":1' + b"0" * 400 + b"}",
        b'{"a":"tab\there"}',  # a raw control character in a string
        b"  ",
        b"{} {}",
        b"[ " * 101 + b"]" * 101,  # deeper than 100
        b'{"a":' * 101 + b"1" + b"}" * 101,
    ]:
        fp("POST", "/payments", J, body, canonical=True)
    fp("POST", "/payments", J, b"", canonical=True)

    # fields: only the selection {pointer: value} counts.
    order = b'{"amount":10,"currency":"EUR","client_ts":"2026-12-05T14:00:00Z","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}'
    order2 = b'{"items":[{"qty":1,"sku":"a"},{"qty":2,"sku":"b"}],"client_ts":"2026-12-05T14:00:09Z","currency":"EUR","amount":10.0, "note":"x"}'
    order3 = b'{"amount":11,"currency":"EUR","client_ts":"2026-12-05T14:00:00Z","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}'
    sel = ["/amount", "/currency", "/items"]
    fp("POST", "/orders", J, order, canonical=True, fields=sel, same="fields")
    fp("POST", "/orders", J, order2, canonical=True, fields=sel, same="fields")
    fp("POST", "/orders", J, order3, canonical=True, fields=sel)  # a kept field changed
    fp("POST", "/orders", J, order, canonical=True, fields=["/items", "/currency", "/amount", "/amount"], same="fields-reordered")
    fp("POST", "/orders", J, order, canonical=True, fields=["/amount", "/missing", "/items/2", "/items/-", "/items/01", "/amount/x"])
    fp("POST", "/orders", J, order, canonical=True, fields=["/items/1/sku", ""])
    fp("POST", "/orders", J, b'{"a/b":1,"m~n":2,"":3,"x":4}', canonical=True, fields=["/a~1b", "/m~0n", "/"])
    fp("POST", "/orders", J, b'{"x":4}', canonical=True, fields=["/nothing"])  # {}
    fp("POST", "/orders", J, b"[10, 20, 30]", canonical=True, fields=["/1", "/0"])
    fp("POST", "/orders", "text/plain", order, canonical=True, fields=sel)  # not JSON: raw
    fp("POST", "/orders", J, b"{not json", canonical=True, fields=sel)  # does not parse: raw
    fp("POST", "/orders", J, b'{"amount":10,"other":NaN}', canonical=True, fields=["/amount"])  # the whole body must be JSON: raw

    # exclude: every resolving pointer's value is left out.
    fp("POST", "/orders", J, order, canonical=True, exclude=["/client_ts"], same="exclude")
    fp("POST", "/orders", J, order2.replace(b', "note":"x"', b""), canonical=True, exclude=["/client_ts"], same="exclude")
    fp("POST", "/orders", J, order2, canonical=True, exclude=["/client_ts"])  # another member: differs
    fp("POST", "/orders", J, order3, canonical=True, exclude=["/client_ts"])  # a kept field changed
    fp("POST", "/orders", J, order, canonical=True, exclude=["/items/0", "/items/1/qty"], same="exclude-items")
    fp("POST", "/orders", J, order, canonical=True, exclude=["/items/1/qty", "/items/0", "/items/0"], same="exclude-items")
    fp("POST", "/orders", J, order, canonical=True, exclude=["/items/0", "/items/1"])  # items: []
    fp("POST", "/orders", J, order, canonical=True, exclude=["/items", "/items/0/sku"])
    fp("POST", "/orders", J, order, canonical=True, exclude=["/missing", "/items/2", "/items/-", "/items/01", "/amount/x", "/client_ts/0"], same="exclude-none")
    fp("POST", "/orders", J, order, canonical=True, same="exclude-none")
    fp("POST", "/orders", J, b"[0, 1, 2, 3, 4]", canonical=True, exclude=["/3", "/1"])  # [0,2,4]
    fp("POST", "/orders", J, b'{"a/b":1,"m~n":2,"":3,"x":4}', canonical=True, exclude=["/a~1b", "/m~0n", "/"])
    fp("POST", "/orders", J, b'[[0, 1, 2], {"k": [5, 6]}]', canonical=True, exclude=["/0/0", "/0/2", "/1/k/1", "/1/k/0"])
    fp("POST", "/orders", "text/plain", order, canonical=True, exclude=["/client_ts"])  # not JSON: raw
    fp("POST", "/orders", J, b'{"a":1,"ts":NaN}', canonical=True, exclude=["/ts"])  # the whole body must be JSON: raw

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
    refused = []
    for canonical, fields, exclude in [
        (True, [], None),
        (True, ["a"], None),
        (True, ["/a~2"], None),
        (True, ["/a~"], None),
        (True, None, []),
        (True, None, [""]),
        (True, None, ["x"]),
        (True, None, ["/a", ""]),
        (True, None, ["/a~"]),
        (True, ["/a"], ["/b"]),
        (True, [], []),
        (False, ["/a"], None),
        (False, None, ["/a"]),
        (False, [], None),
        (False, None, [""]),
    ]:
        try:
            _mw.fingerprint_options(canonical, fields, exclude)
        except _mw.ConfigError as e:
            case: dict[str, Any] = {"canonical_json": canonical}
            if fields is not None:
                case["fields"] = fields
            if exclude is not None:
                case["exclude"] = exclude
            case["error"] = e.code
            refused.append(case)
        else:
            raise AssertionError(f"accepted: {canonical, fields, exclude}")
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
        "fingerprint_options_refused": refused,
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
            for k, p in [
                ("order-7", "acct-1"),
                ("order-7", "svc-billing"),
                ("order-7", "has space"),
                ("a b", "prinçipal"),
                ('"x%=', "k~._-"),
            ]
        ],
        "responses": responses,
        "retry_after": [{"retry_after_ms": ms, "header": _mw.retry_after_header(ms)} for ms in [0, 10, 999, 1000, 1001, 2500]],
    }


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
