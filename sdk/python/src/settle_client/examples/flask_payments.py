"""The payments example on Flask (WSGI), the same service as
``settle_client.examples.payments`` (Starlette): same routes, answers and
reconcile hook, with ``settle_client.flask.init_app`` and a sync ``Client``.

    pip install './sdk/python[flask]'
    python -m settle_client.examples.flask_payments --listen 127.0.0.1:PORT \\
        --settle-url URL [--settle-token T] [--settle-ca FILE] | --local DIR

``POST /payments`` (requires ``Idempotency-Key``) ``{"amount", "currency",
"delay_ms"?, "fail_after_charge"?}`` → 201 ``{"id": "pay_<n>", "amount",
"currency"}``; amount 0 → a stored 400; a negative amount raises before the
charge, ``fail_after_charge`` after it (500 ``outcome_unknown``; the
retry's reconcile hook asks the fake provider). ``GET /executions`` and
``GET /provider/payments`` → ``{"count": n}``. It serves with the standard
library's threaded WSGI server; ``listening on HOST:PORT`` is printed when
it accepts; Ctrl-C or SIGTERM exits 0.
"""

from __future__ import annotations

import threading
import time

try:
    import flask
except ImportError as e:  # pragma: no cover - only without the extra
    raise SystemExit(f"the example needs the 'flask' extra: pip install 'settle-client[flask]' ({e})") from e

from settle_client import Client, fixed_principal
from settle_client import flask as settle_flask
from settle_client.examples._shop import (
    ACCOUNT,
    PaymentProvider,
    charge,
    json_bytes,
    parse_args,
    parse_payment,
    payment_headers,
    provider_key,
    serve_wsgi,
    sync_ledger,
)
from settle_client.wsgi import Committed, ReconcileRequest, Resolution, idempotency_key


def build_app(client: Client, namespace: str = "payments-example", provider: PaymentProvider | None = None) -> flask.Flask:
    app = flask.Flask(__name__)
    psp = provider if provider is not None else PaymentProvider()
    executions = 0
    lock = threading.Lock()  # the WSGI server runs requests in threads

    def reconcile(ledger_key: str, fence: int, request: ReconcileRequest) -> Resolution:
        # A retry found the record unknown: did the provider charge?
        payment = psp.find(provider_key(request.principal, request.idempotency_key))
        if payment is None:
            return "not_committed"  # it did not: the handler runs again under the same fence
        return Committed(201, payment_headers(payment), json_bytes(payment))

    @app.post("/payments")
    def create_payment() -> flask.Response:
        nonlocal executions
        with lock:
            executions += 1  # first, on every run, whatever happens next
            n = executions
        req = parse_payment(flask.request.get_data())
        if isinstance(req, str):
            return flask.Response(json_bytes({"error": req}), status=400, mimetype="application/json")
        if req.delay_ms:
            time.sleep(req.delay_ms / 1000.0)
        status, headers, body = charge(psp, req, n=n, idempotency_key=idempotency_key(flask.request))
        return flask.Response(body, status=status, headers=headers)

    @app.get("/executions")
    def get_executions() -> flask.Response:
        return flask.Response(json_bytes({"count": executions}), mimetype="application/json")

    @app.get("/provider/payments")
    def provider_payments() -> flask.Response:
        return flask.Response(json_bytes({"count": len(psp.payments)}), mimetype="application/json")

    # One caller (no authentication): every request is the account "acct-1".
    settle_flask.init_app(
        app, client=client, namespace=namespace, principal=fixed_principal(ACCOUNT), reconcile=reconcile
    )
    return app


def main(argv: list[str] | None = None) -> None:
    args, host, port = parse_args("python -m settle_client.examples.flask_payments", __doc__, argv)
    serve_wsgi(build_app(sync_ledger(args), args.namespace), host, port)


if __name__ == "__main__":
    main()
