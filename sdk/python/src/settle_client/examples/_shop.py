"""What the three payments examples (Starlette ``payments``, Flask
``flask_payments``, Django ``django_payments``) share: the fake payment
provider, the request's validation, the payment's JSON, the command line
and, for the two WSGI ones, a threaded server that stops cleanly on Ctrl-C
or SIGTERM. Each example answers the same requests with the same statuses
and bodies (tests/test_example.py runs one suite against all three)."""

from __future__ import annotations

import argparse
import json
import signal
import socketserver
import sys
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from settle_client import AsyncClient, Client

ACCOUNT = "acct-1"


class ExampleError(RuntimeError):
    """Raised by the handler for a negative amount, or after the charge with
    ``fail_after_charge`` (an escaped failure)."""


class PaymentProvider:
    """A fake payment provider, in process: it records payments by
    idempotency key, and a charge with a key it has seen applies nothing
    and answers the first payment (as Stripe's ``Idempotency-Key`` does)."""

    def __init__(self) -> None:
        self.payments: dict[str, dict[str, Any]] = {}

    def charge(self, key: str, payment: dict[str, Any]) -> dict[str, Any]:
        return self.payments.setdefault(key, payment)

    def find(self, key: str) -> dict[str, Any] | None:
        return self.payments.get(key)


def provider_key(account: str, idempotency_key: str) -> str:
    # The client's key, scoped by the account it came from (two accounts
    # may choose the same key).
    return f"{account}:{idempotency_key}"


@dataclass(frozen=True)
class PaymentRequest:
    amount: int
    currency: str
    delay_ms: int
    fail_after_charge: bool


def parse_payment(raw: bytes) -> PaymentRequest | str:
    """The request, or the message of its 400."""
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return "the body must be JSON"
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    amount, currency, delay_ms = body.get("amount"), body.get("currency"), body.get("delay_ms", 0)
    fail_after_charge = body.get("fail_after_charge", False)
    if not isinstance(amount, int) or isinstance(amount, bool):
        return "amount must be an integer"
    if not isinstance(currency, str):
        return "currency must be a string"
    if not isinstance(delay_ms, int) or isinstance(delay_ms, bool) or delay_ms < 0:
        return "delay_ms must be a non-negative integer"
    if not isinstance(fail_after_charge, bool):
        return "fail_after_charge must be a boolean"
    return PaymentRequest(amount, currency, delay_ms, fail_after_charge)


def json_bytes(value: Any) -> bytes:
    """Compact JSON, as Starlette's JSONResponse writes it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def payment_headers(payment: dict[str, Any]) -> list[tuple[str, str]]:
    """The headers of a 201 for ``payment`` (the handler's and the
    reconcile hook's, so that a reconciled replay equals the original)."""
    return [("content-type", "application/json"), ("location", f"/payments/{payment['id']}")]


def charge(
    psp: PaymentProvider, req: PaymentRequest, idempotency_key: str | None, n: int
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The handler's work after its delay, for the two WSGI examples: amount
    0 → 400; a negative amount raises before the charge; the charge under
    the request's key; ``fail_after_charge`` raises after it; else 201."""
    if req.amount == 0:
        return 400, [("content-type", "application/json")], json_bytes({"error": "amount must not be zero"})
    if req.amount < 0:
        raise ExampleError(f"negative amount {req.amount}")
    assert idempotency_key is not None  # the middleware requires it on this route
    payment = psp.charge(
        provider_key(ACCOUNT, idempotency_key), {"id": f"pay_{n}", "amount": req.amount, "currency": req.currency}
    )
    if req.fail_after_charge:
        raise ExampleError("the handler died after the provider recorded the payment")
    return 201, payment_headers(payment), json_bytes(payment)


def sync_ledger(args: argparse.Namespace) -> Client:
    """The ledger the command line names: a server's ``Client``, or with
    ``--local DIR`` a ``settle_local.LocalLedger`` (itself a ``Client``)."""
    if args.local is not None:
        from settle_local import LocalLedger  # type: ignore[import-not-found,unused-ignore]  # optional package

        ledger: Client = LocalLedger(data=args.local)
        return ledger
    return Client(args.settle_url, args.settle_token, verify=args.settle_ca or True)


def async_ledger(args: argparse.Namespace) -> AsyncClient:
    """``sync_ledger``'s async twin (a ``LocalLedger``'s ``.aio``)."""
    if args.local is not None:
        aio: AsyncClient = sync_ledger(args).aio  # type: ignore[attr-defined]
        return aio
    return AsyncClient(args.settle_url, args.settle_token, verify=args.settle_ca or True)


def parse_args(prog: str, doc: str, argv: list[str] | None) -> tuple[argparse.Namespace, str, int]:
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (port 0: any free port)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--settle-url", help="URL of a running settle serve")
    where.add_argument(
        "--local", metavar="DIR", help="the ledger in this process, durable in DIR (package settle-local)"
    )
    p.add_argument("--settle-token", default=None, help="bearer token of the settle tenant (with --settle-url)")
    p.add_argument(
        "--settle-ca", metavar="FILE", default=None, help="CA bundle (PEM) to trust for an https --settle-url"
    )
    p.add_argument("--namespace", default="payments-example", help="middleware namespace of the ledger keys")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        p.error("--listen must be HOST:PORT")
    return args, host.strip("[]"), int(port)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request in flight does not keep the process up after Ctrl-C
    request_queue_size = 128  # socketserver's default backlog (5) drops concurrent clients


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: stderr stays for errors


def serve_wsgi(app: Any, host: str, port: int) -> None:
    """Serves ``app`` (threads: concurrent duplicates reach the middleware
    together), prints ``listening on HOST:PORT`` once it accepts, and exits
    0 on Ctrl-C or SIGTERM."""
    # SIGTERM is Ctrl-C from here on, and both are caught from before the
    # "listening" line: a signal sent as soon as it is read stops cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    try:
        bound_host, bound_port = server.socket.getsockname()[:2]
        print(f"listening on {bound_host}:{bound_port}", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)
