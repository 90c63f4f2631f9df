"""The payments example of issue 10 item 4, on Starlette + uvicorn:

    pip install './sdk/python[examples]'
    python -m settle_client.examples.payments --listen 127.0.0.1:PORT \\
        --settle-url URL [--settle-token T] [--settle-ca FILE] | --local DIR

- ``POST /payments`` (requires ``Idempotency-Key``), body
  ``{"amount": <int>, "currency": "<str>", "delay_ms": <int, optional>,
  "fail_after_charge": <bool, optional>}``: the handler first counts the
  execution (every run counts), then sleeps ``delay_ms``, charges the
  payment provider with the request's ``Idempotency-Key`` and answers 201
  ``{"id": "pay_<n>", "amount", "currency"}`` with ``Location:
  /payments/pay_<n>``. Amount 0 → 400 from the handler (a client error:
  stored and replayed); a negative amount → the handler raises before it
  charges (→ 500 ``outcome_unknown``; a retry asks the provider, which has
  no such payment, so the handler runs again); ``fail_after_charge`` → the
  handler raises *after* the provider recorded the payment, as a process
  that dies there would (→ 500 ``outcome_unknown``; a retry asks the
  provider, which has it: the payment is settled and replayed, 201
  ``Idempotent-Replayed: true``, the handler does not run again).
- ``GET /executions`` → ``{"count": <handler executions>}`` and ``GET
  /provider/payments`` → ``{"count": <payments the provider recorded>}``
  (not wrapped).

The payment provider is a fake that lives in this process
(``PaymentProvider``): like Stripe, it records each payment under the
idempotency key it was sent (here the client's ``Idempotency-Key``, scoped
by the account), and answers a second charge with that key with the first
payment. The middleware's ``reconcile`` hook asks it whether a payment with
the retried request's key exists: that is how a request whose outcome is
``unknown`` (the handler raised or timed out after the provider charged,
or — with a real provider, which outlives this process — the process died
there) is resolved on retry, without a human and without charging twice.

``--listen`` accepts port 0; the bound address is printed as
``listening on HOST:PORT`` once the server accepts connections. Ctrl-C
(SIGINT) or SIGTERM stops it gracefully, exit status 0.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - only without the extra
    raise SystemExit(f"the example needs the 'examples' extra: pip install 'settle-client[examples]' ({e})") from e

from settle_client import AsyncClient, fixed_principal
from settle_client.asgi import Committed, IdempotencyMiddleware, ReconcileRequest, Resolution, idempotency_key
from settle_client.examples._shop import (
    ACCOUNT,
    ExampleError,
    PaymentProvider,
    PaymentRequest,
    parse_args,
    parse_payment,
    provider_key,
    async_ledger,
)

def payment_response(payment: dict[str, Any]) -> Response:
    return JSONResponse(payment, status_code=201, headers={"Location": f"/payments/{payment['id']}"})


def build_app(
    client: AsyncClient, namespace: str = "payments-example", provider: PaymentProvider | None = None
) -> Starlette:
    executions = 0
    psp = provider if provider is not None else PaymentProvider()

    async def reconcile(ledger_key: str, fence: int, request: ReconcileRequest) -> Resolution:
        # A retry found the record unknown: did the provider charge?
        payment = psp.find(provider_key(request.principal, request.idempotency_key))
        if payment is None:
            return "not_committed"  # it did not: the handler runs again under the same fence
        resp = payment_response(payment)  # the response the handler would have sent
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in resp.raw_headers]
        return Committed(resp.status_code, headers, bytes(resp.body))

    async def create_payment(request: Request) -> Response:
        nonlocal executions
        executions += 1  # first, on every run, whatever happens next
        n = executions
        req: PaymentRequest | str = parse_payment(await request.body())
        if isinstance(req, str):
            return JSONResponse({"error": req}, status_code=400)
        if req.delay_ms:
            await asyncio.sleep(req.delay_ms / 1000.0)
        if req.amount == 0:
            return JSONResponse({"error": "amount must not be zero"}, status_code=400)
        if req.amount < 0:
            raise ExampleError(f"negative amount {req.amount}")
        key = idempotency_key(request)
        assert key is not None  # the middleware requires it on this route
        payment = psp.charge(
            provider_key(ACCOUNT, key), {"id": f"pay_{n}", "amount": req.amount, "currency": req.currency}
        )
        if req.fail_after_charge:
            raise ExampleError("the handler died after the provider recorded the payment")
        return payment_response(payment)

    async def get_executions(request: Request) -> Response:
        return JSONResponse({"count": executions})

    async def provider_payments(request: Request) -> Response:
        return JSONResponse({"count": len(psp.payments)})

    return Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/executions", get_executions, methods=["GET"]),
            Route("/provider/payments", provider_payments, methods=["GET"]),
        ],
        # One caller (the example has no authentication): every request is
        # the account "acct-1". With Starlette's AuthenticationMiddleware, use
        # authenticated_principal() instead.
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                client=client,
                namespace=namespace,
                principal=fixed_principal(ACCOUNT),
                reconcile=reconcile,
            )
        ],
    )


class _Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for s in server.sockets:
                host, port = s.getsockname()[:2]
                print(f"listening on {host}:{port}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args, host, port = parse_args("python -m settle_client.examples.payments", __doc__, argv)
    client = async_ledger(args)
    app = build_app(client, args.namespace)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = _Server(config)
    # Ctrl-C (SIGINT) and SIGTERM stop the server gracefully: uvicorn
    # finishes the requests in flight, then re-raises the signal it caught;
    # with SIGTERM handled like SIGINT, both end here as KeyboardInterrupt
    # and the example exits 0, without a traceback. The ledger client is
    # closed with the server's event loop.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    sys.exit(0 if server.started else 1)


if __name__ == "__main__":
    main()
