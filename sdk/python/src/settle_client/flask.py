"""Flask: the SPEC §8 Idempotency-Key middleware for a Flask app.

    from flask import Flask
    from settle_client import Client, fixed_principal
    from settle_client import flask as settle_flask

    app = Flask(__name__)
    settle_flask.init_app(app, client=Client(url, token), principal=fixed_principal("acct-1"))

``init_app`` wraps ``app.wsgi_app`` in ``settle_client.wsgi.IdempotencyMiddleware``
(same options) and connects Flask's ``got_request_exception`` signal for
this app: Flask turns a view's exception into its own 500 page, which must
not be stored as the request's outcome; the signal marks the request failed,
so it gets 500 ``outcome_unknown`` and its record becomes ``unknown``, as
with the ASGI middleware. Inside a view, ``settle_client.wsgi.idempotency_key(request)``
and ``mark_retryable(request)`` take ``flask.request``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import Client
from .wsgi import IdempotencyMiddleware, MiddlewareOptions, PrincipalExtractor, ReconcileHook, mark_failed

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only read by type checkers

try:
    import flask
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError(f"settle_client.flask needs Flask: pip install 'settle-client[flask]' ({e})") from e

__all__ = ["init_app"]


def _failed(sender: Any, exception: BaseException, **extra: Any) -> None:
    # Sent by Flask inside the request context, before it makes its 500.
    mark_failed(flask.request.environ, exception)


def init_app(
    app: flask.Flask,
    *,
    client: Client,
    principal: PrincipalExtractor | None = None,
    reconcile: ReconcileHook | None = None,
    **options: Unpack[MiddlewareOptions],
) -> IdempotencyMiddleware:
    """Wrap ``app`` (its ``wsgi_app``) in the Idempotency-Key middleware and
    return the middleware (its ``counts``). Options: those of
    ``settle_client.wsgi.IdempotencyMiddleware``."""
    mw = IdempotencyMiddleware(app.wsgi_app, client=client, principal=principal, reconcile=reconcile, **options)
    flask.got_request_exception.connect(_failed, app, weak=False)
    app.wsgi_app = mw  # type: ignore[method-assign]  # Flask's documented way to add WSGI middleware
    return mw
