"""The same test app (POST /items answers what its JSON body asks for) on
Flask (settle_client.flask.init_app) and on Django
(settle_client.django.IdempotencyMiddleware), both driven as WSGI apps by
werkzeug's test client, so that test_sync_mw.py runs every SPEC §8 row
against both frameworks and a real settle server."""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import django
from conftest import new_key
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.test import override_settings
from django.urls import path as django_path
from werkzeug.test import Client as WerkzeugClient

from settle_client import Client, EffectNotSent, EffectRefused, fixed_principal
from settle_client import wsgi as settle_wsgi

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="settle-tests",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=[],
        MIDDLEWARE=[f"{__name__}.FakeAuth", f"{__name__}.Recording"],
        LOGGING_CONFIG=None,
    )
    django.setup()

from settle_client import django as settle_django  # noqa: E402 - needs the settings above


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Behaviour:
    """What a handler does, the same on every framework: counts the run,
    then follows the body's instructions."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.entered: threading.Event | None = None

    def run(self, raw: bytes, retryable: Callable[[], None]) -> tuple[int, dict[str, str], bytes, bool | str]:
        """(status, headers, body, stream): ``stream`` True streams the body
        in pieces, ``"error"`` streams it and then fails mid-body."""
        with self.lock:
            self.count += 1
            n = self.count
        body = json.loads(raw or b"{}")
        if self.entered is not None:
            self.entered.set()
        if body.get("block") and self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        if body.get("sleep"):
            time.sleep(body["sleep"])  # the handler's work takes this long (the scenario, not a wait for an event)
        if body.get("raise"):
            raise RuntimeError("handler failed")
        if body.get("not_sent") and n == 1:  # the first run only: its retry succeeds
            raise EffectNotSent("the handler did nothing")
        if body.get("refused") and n == 1:
            raise EffectRefused("the remote refused it")
        if body.get("retryable"):
            retryable()
        payload = json.dumps({"n": n, "pad": "x" * int(body.get("size", 0))}, separators=(",", ":")).encode()
        headers = {"Location": f"/items/{n}", "X-Custom": "c", "X-Trace": f"t{n}"}
        return int(body.get("status", 201)), headers, payload, body.get("stream") or False


class Harness:
    """One app with its middleware; ``post`` sends a request through it."""

    framework: str
    behaviour: Behaviour
    wsgi: Any
    mw: Any

    @property
    def count(self) -> int:
        return self.behaviour.count

    @property
    def counts(self) -> Any:
        return self.mw.counts

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> Resp:
        hs = dict(headers or {})
        data = raw
        if raw is None and body is not None:
            data = json.dumps(body).encode()
            hs.setdefault("content-type", "application/json")
        r = WerkzeugClient(self.wsgi).open(path, method=method, data=data, headers=hs)
        try:
            return Resp(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.get_data())
        finally:
            r.close()

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None) -> Resp:
        return self.request("POST", path, body, headers, raw)


# ------------------------------------------------------------------ Flask


class FlaskHarness(Harness):
    def __init__(self, ledger_url: str, **options: Any) -> None:
        import flask

        from settle_client import flask as settle_flask

        self.framework = "flask"
        self.behaviour = b = Behaviour()
        app = flask.Flask(f"settle-test-{new_key()}")

        @app.route("/items", methods=["POST", "PATCH", "PUT"])
        def items() -> flask.Response:
            status, headers, payload, stream = b.run(
                flask.request.get_data(), lambda: settle_wsgi.mark_retryable(flask.request)
            )
            if stream:

                def gen() -> Iterator[bytes]:
                    for i in range(0, len(payload), 7):
                        yield payload[i : i + 7]
                    if stream == "error":
                        raise OSError("the stream broke")

                return flask.Response(gen(), status=status, mimetype="application/json", headers=headers)
            return flask.Response(payload, status=status, mimetype="application/json", headers=headers)

        @app.route("/free", methods=["POST"])
        def free() -> flask.Response:
            with b.lock:
                b.count += 1
            return flask.jsonify({"n": b.count})

        options.setdefault("principal", fixed_principal("acct-1"))
        options.setdefault("namespace", new_key("ns"))
        self.mw = settle_flask.init_app(app, client=Client(ledger_url), **options)
        self.wsgi = app


# ----------------------------------------------------------------- Django

_HARNESSES: dict[str, DjangoHarness] = {}
_BUILT: list[Any] = []


class Recording(settle_django.IdempotencyMiddleware):
    """The middleware, remembered so a test can read its counts."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        super().__init__(get_response)
        _BUILT.append(self)


class FakeAuth:
    """Stands for django.contrib.auth's AuthenticationMiddleware (which
    needs a database): ``X-User: <pk>`` is an authenticated user with that
    primary key, no header an anonymous one; ``X-No-Auth`` leaves
    ``request.user`` unset, as without the authentication middleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if "HTTP_X_NO_AUTH" not in request.META:
            pk = request.META.get("HTTP_X_USER")
            user = types.SimpleNamespace(is_authenticated=pk is not None, pk=pk, username=f"user-{pk}")
            request.user = user  # type: ignore[assignment]
        return self.get_response(request)


def _harness(request: HttpRequest) -> DjangoHarness:
    return _HARNESSES[request.META["HTTP_X_HARNESS"]]


def django_items(request: HttpRequest) -> HttpResponseBase:
    h = _harness(request)
    status, headers, payload, stream = h.behaviour.run(request.body, lambda: settle_wsgi.mark_retryable(request))
    if stream:

        def gen() -> Iterator[bytes]:
            for i in range(0, len(payload), 7):
                yield payload[i : i + 7]
            if stream == "error":
                raise OSError("the stream broke")

        return StreamingHttpResponse(gen(), status=status, content_type="application/json", headers=headers)
    return HttpResponse(payload, status=status, content_type="application/json", headers=headers)


def django_free(request: HttpRequest) -> HttpResponseBase:
    b = _harness(request).behaviour
    with b.lock:
        b.count += 1
    return HttpResponse(json.dumps({"n": b.count}), content_type="application/json")


urlpatterns = [django_path("items", django_items), django_path("free", django_free)]


class DjangoHarness(Harness):
    def __init__(self, ledger_url: str, **options: Any) -> None:
        from django.core.handlers.wsgi import WSGIHandler

        self.framework = "django"
        self.behaviour = Behaviour()
        self.name = new_key("h")
        _HARNESSES[self.name] = self
        options.setdefault("principal", fixed_principal("acct-1"))
        options.setdefault("namespace", new_key("ns"))
        conf = {"client": Client(ledger_url), **options}
        with override_settings(SETTLE_IDEMPOTENCY=conf):
            self.wsgi = WSGIHandler()  # builds the middleware chain: reads the setting now
        self.mw = _BUILT[-1]

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> Resp:
        return super().request(method, path, body, {"X-Harness": self.name, **(headers or {})}, raw)


HARNESSES: dict[str, Callable[..., Harness]] = {"flask": FlaskHarness, "django": DjangoHarness}
