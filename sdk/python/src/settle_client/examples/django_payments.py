"""The payments example on Django, the same service as
``settle_client.examples.payments`` (Starlette): same routes, answers and
reconcile hook, with ``settle_client.django.IdempotencyMiddleware``
configured by the ``SETTLE_IDEMPOTENCY`` setting. A one-file Django project
(settings, URLs and views here).

    pip install './sdk/python[django]'
    python -m settle_client.examples.django_payments --listen 127.0.0.1:PORT \\
        --settle-url URL [--settle-token T] [--settle-ca FILE] | --local DIR

``POST /payments`` (requires ``Idempotency-Key``) ``{"amount", "currency",
"delay_ms"?, "fail_after_charge"?}`` → 201 ``{"id": "pay_<n>", "amount",
"currency"}``; amount 0 → a stored 400; a negative amount raises before the
charge, ``fail_after_charge`` after it (500 ``outcome_unknown``; the
retry's reconcile hook asks the fake provider). ``GET /executions`` and
``GET /provider/payments`` → ``{"count": n}``. It serves with the standard
library's threaded WSGI server (``manage.py runserver`` would do too);
``listening on HOST:PORT`` is printed when it accepts; Ctrl-C or SIGTERM
exits 0.

In a real project the settings are in settings.py; with authentication,
``"principal": settle_client.django.authenticated_principal()`` (after
``AuthenticationMiddleware`` in ``MIDDLEWARE``) names the caller by
``request.user``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

try:
    import django
    from django.conf import settings
    from django.http import HttpRequest, HttpResponse
    from django.urls import path
except ImportError as e:  # pragma: no cover - only without the extra
    raise SystemExit(f"the example needs the 'django' extra: pip install 'settle-client[django]' ({e})") from e

from settle_client import Client, fixed_principal
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

psp = PaymentProvider()
_executions = 0
_lock = threading.Lock()  # the WSGI server runs requests in threads


def reconcile(ledger_key: str, fence: int, request: ReconcileRequest) -> Resolution:
    # A retry found the record unknown: did the provider charge?
    payment = psp.find(provider_key(request.principal, request.idempotency_key))
    if payment is None:
        return "not_committed"  # it did not: the view runs again under the same fence
    return Committed(201, payment_headers(payment), json_bytes(payment))


def _json(value: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(json_bytes(value), status=status, content_type="application/json")


def create_payment(request: HttpRequest) -> HttpResponse:
    global _executions
    if request.method != "POST":
        return _json({"error": "method not allowed"}, 405)
    with _lock:
        _executions += 1  # first, on every run, whatever happens next
        n = _executions
    req = parse_payment(request.body)
    if isinstance(req, str):
        return _json({"error": req}, 400)
    if req.delay_ms:
        time.sleep(req.delay_ms / 1000.0)
    status, headers, body = charge(psp, req, n=n, idempotency_key=idempotency_key(request))
    resp = HttpResponse(body, status=status)
    for name, value in headers:
        resp[name] = value
    return resp


def get_executions(request: HttpRequest) -> HttpResponse:
    return _json({"count": _executions})


def provider_payments(request: HttpRequest) -> HttpResponse:
    return _json({"count": len(psp.payments)})


urlpatterns = [
    path("payments", create_payment),
    path("executions", get_executions),
    path("provider/payments", provider_payments),
]


def configure(client: Client, namespace: str = "payments-example") -> None:
    """The project's settings (what settings.py would say)."""
    settings.configure(
        DEBUG=False,
        SECRET_KEY="settle-example-not-secret",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=[],
        MIDDLEWARE=["settle_client.django.IdempotencyMiddleware"],
        SETTLE_IDEMPOTENCY={
            "client": client,
            # One caller (no authentication): every request is "acct-1".
            "principal": fixed_principal(ACCOUNT),
            "namespace": namespace,
            "reconcile": reconcile,
        },
    )
    django.setup()


def main(argv: list[str] | None = None) -> None:
    args, host, port = parse_args("python -m settle_client.examples.django_payments", __doc__, argv)
    configure(sync_ledger(args), args.namespace)
    from django.core.wsgi import get_wsgi_application

    serve_wsgi(get_wsgi_application(), host, port)


if __name__ == "__main__":
    main()
