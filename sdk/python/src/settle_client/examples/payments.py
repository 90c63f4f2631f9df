"""The payments example of issue 10 item 4, on Starlette + uvicorn:

    pip install './sdk/python[examples]'
    python -m settle_client.examples.payments --listen 127.0.0.1:PORT \\
        --settle-url URL [--settle-token T]

- ``POST /payments`` (requires ``Idempotency-Key``), body
  ``{"amount": <int>, "currency": "<str>", "delay_ms": <int, optional>}``:
  the handler first counts the execution (every run counts), then sleeps
  ``delay_ms``, and answers 201 ``{"id": "pay_<n>", "amount", "currency"}``
  with ``Location: /payments/pay_<n>``. Amount 0 → 400 from the handler (a
  client error: stored and replayed); a negative amount → the handler raises
  (→ 500 ``outcome_unknown``, then 409 ``outcome_unknown`` on retries).
- ``GET /executions`` → ``{"count": <handler executions>}`` (not wrapped).

``--listen`` accepts port 0; the bound address is printed as
``listening on HOST:PORT`` once the server accepts connections. Ctrl-C
(SIGINT) or SIGTERM stops it gracefully, exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from settle_client.asgi import IdempotencyMiddleware


class ExampleError(RuntimeError):
    """Raised by the handler for a negative amount (an escaped failure)."""


def build_app(client: AsyncClient, namespace: str = "payments-example") -> Starlette:
    executions = 0

    async def create_payment(request: Request) -> Response:
        nonlocal executions
        executions += 1  # first, on every run, whatever happens next
        n = executions
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        amount, currency, delay_ms = body.get("amount"), body.get("currency"), body.get("delay_ms", 0)
        if not isinstance(amount, int) or isinstance(amount, bool):
            return JSONResponse({"error": "amount must be an integer"}, status_code=400)
        if not isinstance(currency, str):
            return JSONResponse({"error": "currency must be a string"}, status_code=400)
        if not isinstance(delay_ms, int) or isinstance(delay_ms, bool) or delay_ms < 0:
            return JSONResponse({"error": "delay_ms must be a non-negative integer"}, status_code=400)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000.0)
        if amount == 0:
            return JSONResponse({"error": "amount must not be zero"}, status_code=400)
        if amount < 0:
            raise ExampleError(f"negative amount {amount}")
        pid = f"pay_{n}"
        return JSONResponse(
            {"id": pid, "amount": amount, "currency": currency},
            status_code=201,
            headers={"Location": f"/payments/{pid}"},
        )

    async def get_executions(request: Request) -> Response:
        return JSONResponse({"count": executions})

    return Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/executions", get_executions, methods=["GET"]),
        ],
        # One caller (the example has no authentication): every request is
        # the account "acct-1". With Starlette's AuthenticationMiddleware, use
        # authenticated_principal() instead.
        middleware=[Middleware(IdempotencyMiddleware, client=client, namespace=namespace, principal=fixed_principal("acct-1"))],
    )


class _Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for s in server.sockets:
                host, port = s.getsockname()[:2]
                print(f"listening on {host}:{port}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m settle_client.examples.payments", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (port 0: any free port)")
    p.add_argument("--settle-url", required=True, help="URL of a running settle serve")
    p.add_argument("--settle-token", default=None, help="bearer token of the settle tenant")
    p.add_argument("--namespace", default="payments-example", help="middleware namespace of the ledger keys")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        p.error("--listen must be HOST:PORT")
    client = AsyncClient(args.settle_url, args.settle_token)
    app = build_app(client, args.namespace)
    config = uvicorn.Config(app, host=host.strip("[]"), port=int(port), log_level="warning", lifespan="off")
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
