"""``IdempotencyMiddleware``: SPEC §8 for WSGI applications (Flask, Bottle,
Pyramid, any PEP 3333 app), on a remote ``settle serve`` through a sync
``Client``.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, client=Client(url, token),
                                         principal=fixed_principal("acct-1"))

For Flask, ``settle_client.flask.init_app`` does this and also tells the
middleware when a view raised (Flask turns the exception into its own 500
response, which must not be stored as the request's outcome).

It answers as ``settle_client.asgi.IdempotencyMiddleware`` does, with the
same options (sdk/python/README.md has the table), except ``timeout``: a
WSGI handler runs in the server's thread, which cannot be interrupted, so
the option is refused (use the server's worker timeout: a killed worker
leaves its record to lapse to ``unknown``). The request body is read whole
and handed to the app as ``wsgi.input``; the response is buffered whole
(streamed responses included) so that it is settled before the client sees
it.
"""

from __future__ import annotations

import http
import io
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import quote, urlsplit

from . import _mw
from ._mw import ConfigError
from ._mwbase import (
    RETRYABLE,
    Answer,
    Committed,
    MiddlewareOptions,
    Options,
    Principal,
    Resolution,
    RoutePolicy,
    fixed_principal,
)
from ._mwsync import HandlerFailed, Ran, RequestInfo, SyncFlow, Unwrapped
from .client import Client

__all__ = [
    "IdempotencyMiddleware",
    "ConfigError",
    "RoutePolicy",
    "ReconcileRequest",
    "Committed",
    "Resolution",
    "ReconcileHook",
    "mark_retryable",
    "mark_failed",
    "idempotency_key",
    "fixed_principal",
    "remote_user_principal",
    "Principal",
    "PrincipalExtractor",
    "MiddlewareOptions",
    "WSGIEnviron",
]

WSGIEnviron = dict[str, Any]
ExcInfo = Union[tuple[type[BaseException], BaseException, TracebackType], tuple[None, None, None]]
Write = Callable[[bytes], object]


if TYPE_CHECKING:
    # The standard library's own WSGI protocol (typeshed), as Flask and
    # Django annotate it.
    from _typeshed.wsgi import StartResponse
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only read by type checkers
else:
    StartResponse = Callable[..., Write]


WSGIApp = Callable[[WSGIEnviron, StartResponse], Iterable[bytes]]
PrincipalExtractor = Callable[[WSGIEnviron], Principal]
"""The ``principal`` option: the WSGI environ → the caller."""

log = logging.getLogger("settle_client.wsgi")
FAILED = "settle.failed"
"""The environ flag ``mark_failed`` sets: the handler failed even though a
response came back (a framework's own 500 page)."""


@dataclass(frozen=True)
class ReconcileRequest:
    """The retried request a ``reconcile`` hook is asked about: its WSGI
    ``environ`` (``method``, ``path``, ``query``, ``target``: the path with
    its query as sent, ``headers``, ``header(name)``), its whole ``body``,
    the ``Idempotency-Key`` value the client sent (unquoted) and the
    ``principal`` (account) it came from."""

    environ: WSGIEnviron
    body: bytes
    idempotency_key: str
    principal: str

    @property
    def method(self) -> str:
        return str(self.environ.get("REQUEST_METHOD", "GET"))

    @property
    def path(self) -> str:
        """The path (``SCRIPT_NAME`` + ``PATH_INFO``, without the query)."""
        return _path(self.environ)

    @property
    def query(self) -> str:
        """The query string, without ``?`` ("" when none)."""
        return str(self.environ.get("QUERY_STRING", ""))

    @property
    def target(self) -> str:
        """The path with its query, as sent (what the fingerprint covers)."""
        return request_target(self.environ)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The request's headers: (lower-case name, value)."""
        out: list[tuple[str, str]] = []
        for k, v in self.environ.items():
            if k.startswith("HTTP_"):
                out.append((k[5:].lower().replace("_", "-"), str(v)))
            elif k in ("CONTENT_TYPE", "CONTENT_LENGTH") and v:
                out.append((k.lower().replace("_", "-"), str(v)))
        return out

    def header(self, name: str) -> str | None:
        """The value of a request header, or None."""
        values = header_values(self.environ, name.lower())
        return ", ".join(values) if values else None


ReconcileHook = Callable[[str, int, ReconcileRequest], Resolution]
"""The ``reconcile`` option: (ledger key, fence, the retried request) → a
Resolution."""


def _environ_of(target: Any) -> Any:
    # A Flask/werkzeug request has .environ, a Django request .META (also
    # its WSGI environ), or the environ itself.
    for attr in ("environ", "META"):
        env = getattr(target, attr, None)
        if isinstance(env, dict):
            return env
    return target


def mark_retryable(target: Any) -> None:
    """Mark the current response as saying nothing happened: it is not
    stored, the lease is released with ``not_committed`` and a retry runs
    the handler again. ``target``: a Flask/werkzeug request, a Django
    request, or the WSGI environ."""
    _environ_of(target)[RETRYABLE] = True


FAILED_EXCEPTION = "settle.failed_exception"
"""The environ key where ``mark_failed`` keeps the handler's exception."""


def mark_failed(target: Any, exception: BaseException | None = None) -> None:
    """Tell the middleware that the handler failed although a response came
    back (a framework that turns exceptions into a 500 page): that request
    gets 500 ``outcome_unknown`` and the record is ``unknown`` — unless
    ``exception`` (the handler's) is ``EffectNotSent`` or ``EffectRefused``:
    nothing was done, released ``not_committed``, 503
    ``idempotency_unavailable`` with ``Retry-After: 1``.
    ``settle_client.flask.init_app`` and the Django middleware call it for
    you."""
    env = _environ_of(target)
    env[FAILED] = True
    if exception is not None:
        env[FAILED_EXCEPTION] = exception


def header_values(environ: WSGIEnviron, name: str) -> list[str]:
    """A lower-case header's value in the environ, as a one-line list. A WSGI
    server hands each header over once (lines sent twice arrive joined by a
    comma), so a repeated Idempotency-Key is a key with a comma in it, not
    two lines."""
    if name == "content-type":
        v = environ.get("CONTENT_TYPE")
    elif name == "content-length":
        v = environ.get("CONTENT_LENGTH")
    else:
        v = environ.get("HTTP_" + name.upper().replace("-", "_"))
    return [str(v)] if v is not None and (v != "" or name.startswith("idempotency")) else []


def idempotency_key(target: Any) -> str | None:
    """The key of the request's ``Idempotency-Key`` header, unquoted as the
    middleware reads it, or None when absent or malformed: what a handler
    passes on to its remote. ``target``: a Flask/werkzeug or Django request,
    or the WSGI environ."""
    try:
        return _mw.parse_idempotency_key(header_values(_environ_of(target), "idempotency-key"))
    except _mw.KeyError_:
        return None


def remote_user_principal() -> PrincipalExtractor:
    """The principal from ``REMOTE_USER``: the authenticated user as set by
    the WSGI server or an authentication middleware outside this one (None,
    401, when it is absent or empty). Authentication that happens inside the
    app (Flask-Login's ``current_user``) is not visible here: use a function
    of the environ that authenticates the request and returns the
    account."""

    def extract(environ: WSGIEnviron) -> Principal:
        user = environ.get("REMOTE_USER")
        return user if isinstance(user, str) and user else None

    return extract


def _path(environ: WSGIEnviron) -> str:
    return str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))


def request_target(environ: WSGIEnviron) -> str:
    """The request target as sent: ``RAW_URI``/``REQUEST_URI`` when the
    server gives one (gunicorn, werkzeug, uWSGI), else the path re-quoted
    from ``SCRIPT_NAME`` + ``PATH_INFO`` (PEP 3333: bytes as latin-1) and the
    query; ``/p?`` and ``/p`` are the same (sdk/MIDDLEWARE-KEYS.md)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if isinstance(raw, str) and raw:
        if "://" in raw.split("?", 1)[0]:
            # absolute-form (a proxy's request line): the path onwards
            u = urlsplit(raw)
            raw = (u.path or "/") + ("?" + u.query if u.query else "")
        return raw[:-1] if raw.endswith("?") else raw
    path = quote(_path(environ).encode("latin-1"), safe="/:@!$&'()*+,;=-._~%")
    qs = str(environ.get("QUERY_STRING", ""))
    return path + ("?" + qs if qs else "")


def request_info(environ: WSGIEnviron) -> RequestInfo:
    return RequestInfo(
        method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
        path=_path(environ),
        target=request_target(environ),
        header=lambda name: header_values(environ, name),
    )


def _read_body(environ: WSGIEnviron, limit: int) -> tuple[bytes, bool]:
    """The whole body (``CONTENT_LENGTH`` bytes, or to the end when the
    server says the input is terminated), and whether it is over ``limit``
    (then it is not kept)."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b"", False
    try:
        length = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        length = -1
    if length >= 0:
        if length > limit:
            return b"", True
        return _read_exactly(stream, length), False
    if not environ.get("wsgi.input_terminated"):
        return b"", False  # PEP 3333: without a length there is no body to read
    data = stream.read(limit + 1)
    return (b"", True) if len(data) > limit else (data, False)


def _read_exactly(stream: Any, n: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _with_body(environ: WSGIEnviron, body: bytes) -> WSGIEnviron:
    # The app reads the body the middleware read, from the start.
    env = dict(environ)
    env["wsgi.input"] = io.BytesIO(body)
    env["CONTENT_LENGTH"] = str(len(body))
    return env


def _status_line(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


@dataclass(frozen=True)
class _Buffered:
    status: str
    headers: list[tuple[str, str]]
    body: bytes


class IdempotencyMiddleware:
    """SPEC §8's table for a WSGI app; the options are those of
    ``settle_client.asgi.IdempotencyMiddleware`` (without ``timeout``)."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        client: Client,
        principal: PrincipalExtractor | None = None,
        reconcile: ReconcileHook | None = None,
        **options: Unpack[MiddlewareOptions],
    ) -> None:
        if not isinstance(client, Client):
            raise TypeError(
                "IdempotencyMiddleware (WSGI) needs a settle_client.Client (the sync client), not "
                f"{type(client).__name__}: a WSGI app runs in threads; for an ASGI app use "
                "settle_client.asgi.IdempotencyMiddleware with an AsyncClient"
            )
        if options.get("timeout") is not None:
            raise ValueError(
                "timeout is not supported by the WSGI middleware: a handler runs in the server's thread, which "
                "cannot be interrupted; use the server's worker timeout"
            )
        self.app = app
        self.client = client
        self.principal = principal
        self.reconcile = reconcile
        self.options = Options.make(middleware="IdempotencyMiddleware", principal=principal, **options)
        self.flow: SyncFlow[_Buffered] = SyncFlow(client, self.options, log)

    @property
    def counts(self) -> Any:
        """Replays and refusals by kind (a ``collections.Counter``)."""
        return self.flow.counts

    def __call__(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        assert self.principal is not None
        principal, hook = self.principal, self.reconcile
        out = self.flow.handle(
            request_info(environ),
            lambda: principal(environ),
            lambda limit: _read_body(environ, limit),
            lambda body: self._execute(environ, body),
            None if hook is None else lambda lkey, fence, body, key, who: hook(
                lkey, fence, ReconcileRequest(environ, body, key, who)
            ),
        )
        if isinstance(out, Unwrapped):
            env = environ if out.body is None else _with_body(environ, out.body)
            return self.app(env, start_response)
        if isinstance(out, Answer):
            start_response(_status_line(out.status), out.headers)
            return [out.body]
        start_response(out.status, out.headers)
        return [out.body]

    def _execute(self, environ: WSGIEnviron, body: bytes) -> Ran[_Buffered]:
        env = _with_body(environ, body)
        started: list[tuple[str, list[tuple[str, str]]]] = []
        chunks: list[bytes] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None, /) -> Write:
            if started and exc_info is None:
                raise AssertionError("start_response called twice without exc_info (PEP 3333)")
            started[:] = [(status, list(headers))]
            return chunks.append  # the legacy write(): buffered with the rest

        result = self.app(env, start)
        try:
            for chunk in result:
                chunks.append(bytes(chunk))
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if env.get(FAILED) or environ.get(FAILED):
            raised = env.get(FAILED_EXCEPTION) or environ.get(FAILED_EXCEPTION)
            raise HandlerFailed(
                "the framework reported that the handler raised", raised if isinstance(raised, BaseException) else None
            )
        if not started:
            raise HandlerFailed("the app returned without calling start_response")
        status_line, headers = started[0]
        out = b"".join(chunks)
        # Framing headers of a streamed response no longer apply: the body
        # goes out whole, with its length.
        sent = [(n, v) for n, v in headers if n.lower() not in ("content-length", "transfer-encoding")]
        sent.append(("Content-Length", str(len(out))))
        return Ran(
            status=int(status_line.split(" ", 1)[0]),
            headers=headers,
            body=out,
            retryable=bool(env.get(RETRYABLE)),
            response=_Buffered(status_line, sent, out),
        )
