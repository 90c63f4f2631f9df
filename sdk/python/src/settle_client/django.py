"""Django: the SPEC §8 Idempotency-Key middleware, on a remote ``settle
serve`` through a sync ``Client``.

settings.py::

    from settle_client import Client
    from settle_client.django import authenticated_principal

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",   # before: sets request.user
        "settle_client.django.IdempotencyMiddleware",
        ...,
    ]
    SETTLE_IDEMPOTENCY = {
        "client": Client("http://127.0.0.1:7411", token=None),
        "principal": authenticated_principal(),      # or fixed_principal("acct-1")
        "namespace": "payments",
        # every option of settle_client.asgi.IdempotencyMiddleware but timeout,
        # plus "reconcile": a hook (ledger key, fence, ReconcileRequest) -> Resolution
    }

The settings are read once, when Django builds its middleware chain.
Options are the same as the ASGI middleware's (sdk/python/README.md), with
the same answers; ``timeout`` is refused (a view runs in the server's
thread, which cannot be interrupted). The middleware is synchronous; under
Django's ASGI handler, Django runs it in a thread like any sync middleware.
A view that raises is seen through Django's ``got_request_exception``
signal (Django turns the exception into its 500 page before the middleware
sees the response): that request gets 500 ``outcome_unknown`` and the
record becomes ``unknown``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._mwbase import RETRYABLE, Answer, Committed, Options, Principal, Resolution, RoutePolicy, fixed_principal
from ._mwsync import HandlerFailed, Ran, RequestInfo, SyncFlow, Unwrapped
from .client import Client
from .wsgi import FAILED, FAILED_EXCEPTION, header_values, idempotency_key, mark_failed, mark_retryable, request_target

try:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.signals import got_request_exception
    from django.http import HttpRequest, HttpResponse, HttpResponseBase
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError(f"settle_client.django needs Django: pip install 'settle-client[django]' ({e})") from e

__all__ = [
    "IdempotencyMiddleware",
    "SETTING",
    "RoutePolicy",
    "ReconcileRequest",
    "Committed",
    "Resolution",
    "ReconcileHook",
    "authenticated_principal",
    "fixed_principal",
    "idempotency_key",
    "mark_retryable",
    "PrincipalExtractor",
]

SETTING = "SETTLE_IDEMPOTENCY"
"""The name of the Django setting that configures the middleware (a dict)."""

PrincipalExtractor = Callable[[HttpRequest], Principal]
"""The ``principal`` option: the Django request → the caller."""

log = logging.getLogger("settle_client.django")


@dataclass(frozen=True)
class ReconcileRequest:
    """The retried request a ``reconcile`` hook is asked about: the Django
    ``request`` (``method``, ``path``, ``query``, ``target``: the path with
    its query as sent, ``headers``, ``header(name)``), its whole ``body``,
    the ``Idempotency-Key`` value the client sent (unquoted) and the
    ``principal`` (account) it came from."""

    request: HttpRequest
    body: bytes
    idempotency_key: str
    principal: str

    @property
    def method(self) -> str:
        return str(self.request.method)

    @property
    def path(self) -> str:
        """The path (without the query)."""
        return self.request.path

    @property
    def query(self) -> str:
        """The query string, without ``?`` ("" when none)."""
        return str(self.request.META.get("QUERY_STRING", ""))

    @property
    def target(self) -> str:
        """The path with its query, as sent (what the fingerprint covers)."""
        return request_target(self.request.META)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The request's headers: (lower-case name, value)."""
        return [(str(n).lower(), str(v)) for n, v in self.request.headers.items()]

    def header(self, name: str) -> str | None:
        return self.request.headers.get(name)


ReconcileHook = Callable[[str, int, ReconcileRequest], Resolution]
"""The ``reconcile`` option: (ledger key, fence, the retried request) → a
Resolution."""


def authenticated_principal(identity: Callable[[Any], Principal] | None = None) -> PrincipalExtractor:
    """The principal from Django's authenticated user, ``request.user``, as
    set by ``django.contrib.auth.middleware.AuthenticationMiddleware``
    (which must come before this middleware in ``MIDDLEWARE``). An anonymous
    user has no principal (401). The principal is ``str(user.pk)`` — the
    primary key, which survives a password change, a new session and a
    renamed username — or ``identity(user)`` when given (a ``str``, ``(str,
    generation)`` or None). Never a token or a session id: a retry after a
    credential refresh must replay."""

    def extract(request: HttpRequest) -> Principal:
        if not hasattr(request, "user"):
            raise ImproperlyConfigured(
                "settle_client.django.authenticated_principal(): the request has no user; put "
                "django.contrib.auth.middleware.AuthenticationMiddleware before "
                "settle_client.django.IdempotencyMiddleware in MIDDLEWARE"
            )
        user = request.user
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        if identity is not None:
            return identity(user)
        return str(user.pk)

    return extract


def _failed(sender: Any, request: HttpRequest | None = None, **extra: Any) -> None:
    # Sent by Django's exception handling before it makes the 500 page,
    # while it handles the view's exception (sys.exc_info() names it).
    if request is not None:
        mark_failed(request, sys.exc_info()[1])


# One receiver for every instance (dispatch_uid), held strongly.
got_request_exception.connect(_failed, weak=False, dispatch_uid="settle_client.django.failed")


def _read_body(request: HttpRequest, limit: int) -> tuple[bytes, bool]:
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        declared = -1
    if declared > limit:
        return b"", True  # not read: 413 without buffering it
    body = request.body  # cached by Django: the view reads it again
    return (b"", True) if len(body) > limit else (body, False)


def _headers(response: HttpResponseBase) -> list[tuple[str, str]]:
    return [(str(n), str(v)) for n, v in response.items()]


class IdempotencyMiddleware:
    """SPEC §8's table for a Django project, configured by the
    ``SETTLE_IDEMPOTENCY`` setting (a dict of the options: ``client`` and
    ``principal`` required)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        conf = dict(getattr(settings, SETTING, None) or {})
        client = conf.pop("client", None)
        if not isinstance(client, Client):
            raise ImproperlyConfigured(
                f"settings.{SETTING}['client'] must be a settle_client.Client (the sync client), "
                f"e.g. Client('http://127.0.0.1:7411', token=None); got {client!r}"
            )
        if conf.get("timeout") is not None:
            raise ImproperlyConfigured(
                f"settings.{SETTING}['timeout'] is not supported: a view runs in the server's thread, which "
                "cannot be interrupted; use the server's worker timeout"
            )
        self.get_response = get_response
        self.client = client
        self.principal: PrincipalExtractor | None = conf.pop("principal", None)
        self.reconcile: ReconcileHook | None = conf.pop("reconcile", None)
        try:
            self.options = Options.make(
                middleware=f"settle_client.django.IdempotencyMiddleware (settings.{SETTING}['principal'])",
                principal=self.principal,
                **conf,
            )
        except (TypeError, ValueError) as e:
            raise ImproperlyConfigured(f"settings.{SETTING}: {e}") from e
        self.flow: SyncFlow[HttpResponseBase] = SyncFlow(client, self.options, log)

    @property
    def counts(self) -> Any:
        """Replays and refusals by kind (a ``collections.Counter``)."""
        return self.flow.counts

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        assert self.principal is not None
        principal, hook = self.principal, self.reconcile
        meta = request.META
        out = self.flow.handle(
            RequestInfo(
                method=str(request.method or "GET").upper(),
                path=request.path,
                target=request_target(meta),
                header=lambda name: header_values(meta, name),
            ),
            lambda: principal(request),
            lambda limit: _read_body(request, limit),
            lambda body: self._execute(request),
            None if hook is None else lambda lkey, fence, body, key, who: hook(
                lkey, fence, ReconcileRequest(request, body, key, who)
            ),
        )
        if isinstance(out, Unwrapped):
            return self.get_response(request)
        if isinstance(out, Answer):
            resp = HttpResponse(out.body, status=out.status)
            for n, v in out.headers:
                resp[n] = v
            return resp
        return out

    def _execute(self, request: HttpRequest) -> Ran[HttpResponseBase]:
        response = self.get_response(request)
        if request.META.get(FAILED):
            raised = request.META.get(FAILED_EXCEPTION)
            raise HandlerFailed(
                "Django reported that the view raised", raised if isinstance(raised, BaseException) else None
            )
        if response.streaming:
            # Buffered whole, to settle it before the client sees it.
            body = b"".join(bytes(c) for c in response.streaming_content)  # type: ignore[attr-defined]
            response.streaming_content = [body]  # type: ignore[attr-defined]
            if "Content-Length" not in response:
                response["Content-Length"] = str(len(body))
        else:
            body = response.content  # type: ignore[attr-defined]
        return Ran(
            status=response.status_code,
            headers=_headers(response),
            body=bytes(body),
            retryable=bool(request.META.get(RETRYABLE)),
            response=response,
        )

