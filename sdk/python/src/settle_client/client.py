"""The typed HTTP client of SPEC §7: ``Client`` (sync) and ``AsyncClient``.

Both build the same requests (``_Req``) and parse the same answers; only the
transport differs (httpx.Client / httpx.AsyncClient). Path segments are
percent-encoded (every byte but the unreserved ones), as SPEC §7 asks.

``verify`` (SPEC §12, TLS) follows httpx: True (the default trust store),
False (no verification), the path of a CA bundle (or of a directory of
hashed certificates), or an ``ssl.SSLContext``. Every request carries the
caller's W3C trace context when OpenTelemetry is installed (``_tracing``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import ssl
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, Union
from urllib.parse import quote, urlencode

import httpx

from ._tracing import trace_headers
from .errors import ProblemError, TransportError, problem_error
from .types import (
    MAX_SAFE_INTEGER,
    BatchResult,
    Binding,
    ClaimDecision,
    Dispatched,
    Grant,
    LeaseInfo,
    Outcome,
    Page,
    Receipt,
    Record,
    Released,
    Revoked,
    Stats,
    Warning,
    claim_decision,
)

if TYPE_CHECKING:  # the worker imports this module
    from .worker import AsyncEffectContext, Done, EffectContext, RunResult

__all__ = ["Client", "AsyncClient", "ReconcileAnswer", "DEFAULT_TIMEOUT", "ListOrder", "VerifyTypes", "new_claim_id"]

DEFAULT_TIMEOUT = 10.0
T = TypeVar("T")
ReconcileAnswer = Union[Grant, Receipt, Released]
ListOrder = Literal["key", "updated", "attention"]
VerifyTypes = Union[bool, str, os.PathLike[str], ssl.SSLContext]
"""What ``verify=`` takes: httpx's convention (a path may be ``os.PathLike``)."""
_List = list  # the classes below have a method named list


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")


def _seg(s: str) -> str:
    if not isinstance(s, str):
        raise TypeError(f"path segment must be a str, not {type(s).__name__}")
    if _UNRESERVED.fullmatch(s) is not None:
        return s  # what quote() leaves as it is
    return quote(s, safe="")


def _uint(name: str, v: int, lo: int = 0) -> int:
    # SPEC §2: fences and generations are integers in [0, 2^53 − 1]; bool is
    # an int in Python and is refused here on purpose.
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_SAFE_INTEGER:
        raise ValueError(f"{name} must be an integer in [{lo}, 2^53 - 1], got {v!r}")
    return v


_CLAIM_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")


def new_claim_id() -> str:
    """A fresh ``claim_id`` (SPEC §4 claim rule 5a): 128 random bits, 22
    characters of ``[A-Za-z0-9_-]``."""
    return secrets.token_urlsafe(16)


def _claim_id(v: str) -> str:
    if not isinstance(v, str) or _CLAIM_ID.fullmatch(v) is None:
        raise ValueError(f"claim_id must be 16-64 characters of [A-Za-z0-9_-], got {v!r}")
    return v


def _binding(b: Binding) -> dict[str, Any]:
    if not isinstance(b, Binding):
        raise TypeError("binding must be a settle_client.Binding")
    _uint("binding.generation", b.generation)
    return b.to_json()


def _seconds(v: str | None) -> float | None:
    """A ``Retry-After`` in seconds (a number), else None."""
    if v is None:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        return None


class _Req(Generic[T]):
    """One call: its method, path, JSON body and the parser of its 200
    answer (a plain class: built on every call, a frozen dataclass's
    __init__ costs twice as much)."""

    __slots__ = ("method", "path", "body", "parse", "raw")

    def __init__(
        self, method: str, path: str, body: dict[str, Any] | None, parse: Callable[[Any], T], raw: bool = False
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.parse = parse
        self.raw = raw


def _grant_or_receipt(d: Any) -> ReconcileAnswer:
    if "receipt" in d:
        return Receipt.from_json(d["receipt"])
    if "decision" in d:
        dec = claim_decision(d)
        assert isinstance(dec, Grant), "reconcile(not_committed) answers a grant"
        return dec
    return Released(int(d["fence"]), bool(d["released"]))


class _Calls:
    """Request builders shared by Client and AsyncClient."""

    @staticmethod
    def claim(
        key: str,
        fingerprint: str,
        binding: Binding,
        lease_ms: int | None,
        worker: str | None,
        marks_dispatch: bool,
        retention_s: int | None,
        claim_id: str | None = None,
    ) -> _Req[ClaimDecision]:
        body: dict[str, Any] = {"fingerprint": fingerprint, "binding": _binding(binding)}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        if worker is not None:
            body["worker"] = worker
        if marks_dispatch:
            body["marks_dispatch"] = True
        if retention_s is not None:
            body["retention_s"] = retention_s
        if claim_id is not None:
            body["claim_id"] = _claim_id(claim_id)
        return _Req("POST", f"/v1/operations/{_seg(key)}/claim", body, claim_decision)

    @staticmethod
    def heartbeat(key: str, fence: int, lease_ms: int | None) -> _Req[LeaseInfo]:
        body: dict[str, Any] = {"fence": _uint("fence", fence)}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        return _Req(
            "POST",
            f"/v1/operations/{_seg(key)}/heartbeat",
            body,
            lambda d: LeaseInfo(int(d["fence"]), str(d["lease_expires_at"])),
        )

    @staticmethod
    def dispatch(key: str, fence: int) -> _Req[Dispatched]:
        return _Req(
            "POST",
            f"/v1/operations/{_seg(key)}/dispatch",
            {"fence": _uint("fence", fence)},
            lambda d: Dispatched(int(d["fence"]), str(d["lease_expires_at"]), bool(d["dispatched"])),
        )

    @staticmethod
    def settle(key: str, fence: int, fingerprint: str, binding: Binding, outcome: Outcome) -> _Req[Receipt]:
        body = {
            "fence": _uint("fence", fence),
            "fingerprint": fingerprint,
            "binding": _binding(binding),
            "outcome": outcome.to_json(),
        }
        return _Req("POST", f"/v1/operations/{_seg(key)}/settle", body, lambda d: Receipt.from_json(d["receipt"]))

    @staticmethod
    def release(key: str, fence: int, reason: str | None, forget: bool = False) -> _Req[Released]:
        body: dict[str, Any] = {"fence": _uint("fence", fence)}
        if reason is not None:
            body["reason"] = reason
        if forget:
            body["forget"] = True
        return _Req(
            "POST",
            f"/v1/operations/{_seg(key)}/release",
            body,
            lambda d: Released(int(d["fence"]), bool(d["released"])),
        )

    @staticmethod
    def reconcile(
        key: str,
        fence: int,
        finding: str,
        fingerprint: str | None,
        binding: Binding | None,
        outcome: Outcome | None,
    ) -> _Req[ReconcileAnswer]:
        body: dict[str, Any] = {"fence": _uint("fence", fence), "finding": finding}
        if fingerprint is not None:
            body["fingerprint"] = fingerprint
        if binding is not None:
            body["binding"] = _binding(binding)
        if outcome is not None:
            body["outcome"] = outcome.to_json()
        return _Req("POST", f"/v1/operations/{_seg(key)}/reconcile", body, _grant_or_receipt)

    @staticmethod
    def get(key: str) -> _Req[Record]:
        return _Req("GET", f"/v1/operations/{_seg(key)}", None, Record.from_json)

    @staticmethod
    def list(
        status: str | Sequence[str] | None,
        reconcile_required: bool | None,
        disputed: bool | None,
        stuck: bool | None,
        quarantined: bool | None,
        key_prefix: str | None,
        order: str | None,
        limit: int | None,
        after: str | None,
    ) -> _Req[Page]:
        q: list[tuple[str, str]] = []
        if status is not None:
            q.append(("status", status if isinstance(status, str) else ",".join(status)))
        for name, flag in (
            ("reconcile_required", reconcile_required),
            ("disputed", disputed),
            ("stuck", stuck),
            ("quarantined", quarantined),
        ):
            if flag is not None:
                q.append((name, "true" if flag else "false"))
        if key_prefix is not None:
            q.append(("key_prefix", key_prefix))
        if order is not None:
            q.append(("order", order))
        if limit is not None:
            q.append(("limit", str(_uint("limit", limit, 1))))
        if after is not None:
            q.append(("after", after))
        path = "/v1/operations" + ("?" + urlencode(q, quote_via=quote, safe="") if q else "")
        return _Req("GET", path, None, Page.from_json)

    @staticmethod
    def stats() -> _Req[Stats]:
        return _Req("GET", "/v1/stats", None, Stats.from_json)

    @staticmethod
    def batch(calls: Sequence[dict[str, Any]]) -> _Req[_List[BatchResult]]:
        return _Req(
            "POST",
            "/v1/batch",
            {"calls": [dict(c) for c in calls]},
            lambda d: [BatchResult(int(r["status"]), r.get("body")) for r in d["results"]],
        )

    @staticmethod
    def principal(principal: str) -> _Req[int]:
        return _Req("GET", f"/v1/principals/{_seg(principal)}", None, lambda d: _uint("generation", int(d["generation"])))

    @staticmethod
    def revoke(principal: str) -> _Req[Revoked]:
        return _Req(
            "POST",
            f"/v1/principals/{_seg(principal)}/revoke",
            {},
            lambda d: Revoked(str(d["principal"]), int(d["generation"])),
        )

    @staticmethod
    def warn(task: str, class_: str, detail: str | None) -> _Req[Warning]:
        body: dict[str, Any] = {}
        if detail is not None:
            body["detail"] = detail
        return _Req("POST", f"/v1/tasks/{_seg(task)}/warnings/{_seg(class_)}", body, Warning.from_json)

    @staticmethod
    def warnings(task: str) -> _Req[_List[Warning]]:
        return _Req(
            "GET",
            f"/v1/tasks/{_seg(task)}/warnings",
            None,
            lambda d: [Warning.from_json(w) for w in d["warnings"]],
        )


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_DECODE = json.JSONDecoder().decode


def encode_body(body: dict[str, Any] | None) -> bytes | None:
    if body is None:
        return None
    return _ENCODE(body).encode("utf-8")


def _answer(req: _Req[T], resp: httpx.Response) -> T:
    return read_answer(req, resp.status_code, resp.content, resp.headers.get("retry-after"))


def read_answer(req: _Req[T], status: int, content: bytes, retry_after: str | None) -> T:
    """The parsed 200 answer to ``req``, else the problem it carries,
    raised (shared by the HTTP clients and settle_local's direct calls)."""
    text = content.decode("utf-8", "replace")  # every answer of settle is UTF-8
    if status == 200:
        return req.parse(text if req.raw else _DECODE(text))
    try:
        body: Any = _DECODE(text)
    except ValueError:
        body = text
    raise problem_error(status, body, _seconds(retry_after))


def _ssl_verify(verify: VerifyTypes, url: str = "") -> bool | ssl.SSLContext:
    """``verify`` as httpx takes it without a deprecation warning: a path
    becomes an SSLContext trusting the certificates there (and only those),
    loaded once, here (a missing file fails the constructor, not a call).
    The default trust store is not loaded for a plain ``http://`` URL (every
    request goes to that URL: no TLS ever), which makes a client ~50 times
    cheaper to create."""
    if verify is True and url.lower().startswith("http://"):
        return False
    if isinstance(verify, (bool, ssl.SSLContext)):
        return verify
    if isinstance(verify, (str, os.PathLike)):
        path = os.fspath(verify)
        if os.path.isdir(path):
            return ssl.create_default_context(capath=path)
        return ssl.create_default_context(cafile=path)
    raise TypeError(f"verify must be a bool, a CA bundle path or an ssl.SSLContext, not {type(verify).__name__}")


def _headers(token: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    h = {"accept": "application/json", "content-type": "application/json", "user-agent": "settle-client-python/0.1"}
    if token:
        h["authorization"] = f"Bearer {token}"
    if extra:
        h.update(extra)
    return h


class Client:
    """Synchronous client of a ``settle serve`` (SPEC §7).

    ``transport`` lets tests and proxies plug an ``httpx.BaseTransport`` in.
    ``verify``: the TLS trust of an https URL, as httpx takes it (True: the
    default trust store; a CA bundle path; an ``ssl.SSLContext``; False: no
    verification); ignored when ``transport`` is given. Errors:
    ``ProblemError`` subclasses for every problem answer,
    ``TransportError`` when no answer arrived. Thread-safe (httpx.Client is).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
        verify: VerifyTypes = True,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers=_headers(token, headers),
            timeout=timeout,
            transport=transport,
            verify=_ssl_verify(verify, self.url),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, req: _Req[T]) -> T:
        content = encode_body(req.body)
        trace = trace_headers()  # the caller's trace context, in the caller's thread
        try:
            resp = self._http.request(req.method, req.path, content=content, headers=trace)
        except Exception as e:  # noqa: BLE001 - whatever the transport raised, no answer arrived
            raise TransportError(f"{req.method} {req.path}: {e!r}") from e
        return _answer(req, resp)

    def claim(
        self,
        key: str,
        fingerprint: str,
        binding: Binding,
        *,
        lease_ms: int | None = None,
        worker: str | None = None,
        marks_dispatch: bool = False,
        retention_s: int | None = None,
        claim_id: str | None = None,
    ) -> ClaimDecision:
        """SPEC §4 claim. ``claim_id`` (16-64 of ``[A-Za-z0-9_-]``, e.g.
        ``new_claim_id()``): drawn at random for one claim and sent again
        only when that same claim is retried because its answer was lost;
        the ledger then answers with the same grant (claim rule 5a)."""
        return self._send(
            _Calls.claim(key, fingerprint, binding, lease_ms, worker, marks_dispatch, retention_s, claim_id)
        )

    def heartbeat(self, key: str, fence: int, lease_ms: int | None = None) -> LeaseInfo:
        return self._send(_Calls.heartbeat(key, fence, lease_ms))

    def dispatch(self, key: str, fence: int) -> Dispatched:
        return self._send(_Calls.dispatch(key, fence))

    def settle(self, key: str, fence: int, fingerprint: str, binding: Binding, outcome: Outcome) -> Receipt:
        return self._send(_Calls.settle(key, fence, fingerprint, binding, outcome))

    def release(self, key: str, fence: int, reason: str | None = "not_dispatched", *, forget: bool = False) -> Released:
        """SPEC §4 release. ``forget=True``: remove the record as if
        collected (only when it would be ``pending`` with nothing recorded:
        no receipt, flag, dispute, quarantine or settled attempt; else
        ``ReceiptRequired`` and nothing changes)."""
        return self._send(_Calls.release(key, fence, reason, forget))

    def reconcile(
        self,
        key: str,
        fence: int,
        finding: str,
        *,
        fingerprint: str | None = None,
        binding: Binding | None = None,
        outcome: Outcome | None = None,
    ) -> ReconcileAnswer:
        return self._send(_Calls.reconcile(key, fence, finding, fingerprint, binding, outcome))

    def get(self, key: str) -> Record:
        return self._send(_Calls.get(key))

    def list(
        self,
        *,
        status: str | Sequence[str] | None = None,
        reconcile_required: bool | None = None,
        disputed: bool | None = None,
        stuck: bool | None = None,
        quarantined: bool | None = None,
        key_prefix: str | None = None,
        order: ListOrder | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> Page:
        """SPEC §9: one page of the tenant's records (``Page.operations``,
        ``Page.next``); pass ``next`` as ``after``, with the same filters and
        order, until it is None."""
        return self._send(
            _Calls.list(status, reconcile_required, disputed, stuck, quarantined, key_prefix, order, limit, after)
        )

    def stats(self) -> Stats:
        """SPEC §9: the tenant's counts by status and flag."""
        return self._send(_Calls.stats())

    def batch(self, calls: Sequence[dict[str, Any]]) -> _List[BatchResult]:
        """SPEC §10: several calls in one request (``{"op": "claim", "key":
        ..., ...the call's fields}``), applied in order, not atomically; one
        ``BatchResult`` per call, each what the single call would have
        answered (``.error()`` gives its typed error)."""
        return self._send(_Calls.batch(calls))

    def principal(self, principal: str) -> int:
        """SPEC §7: the principal's current generation (0 for one never seen)."""
        return self._send(_Calls.principal(principal))

    def revoke(self, principal: str) -> Revoked:
        return self._send(_Calls.revoke(principal))

    def warn(self, task: str, class_: str, detail: str | None = None) -> Warning:
        return self._send(_Calls.warn(task, class_, detail))

    def warnings(self, task: str) -> _List[Warning]:
        return self._send(_Calls.warnings(task))

    def health(self) -> dict[str, Any]:
        return self._send(_Req("GET", "/healthz", None, dict))

    def ready(self) -> dict[str, Any]:
        return self._send(_Req("GET", "/readyz", None, dict))

    def metrics(self) -> str:
        return self._send(_Req("GET", "/metrics", None, str, raw=True))

    def openapi(self) -> dict[str, Any]:
        return self._send(_Req("GET", "/openapi.json", None, dict))

    def run_once(self, key: str, request: Any, effect: Callable[[EffectContext], Done], **options: Any) -> RunResult:
        """SPEC §11: ``settle_client.run_once(self, key, request, effect, **options)``."""
        from .worker import run_once

        return run_once(self, key, request, effect, **options)


class AsyncClient:
    """The asyncio twin of ``Client`` (same methods, awaitable).

    One ``AsyncClient`` may be used from several event loops, one after the
    other or at once (a module-level client under Starlette's ``TestClient``,
    which runs each ``with TestClient(app)`` block in a new loop): each
    running loop gets its own ``httpx.AsyncClient``, created on first use
    and closed when that loop shuts down (``asyncio.run`` and anyio close
    the loop's async generators, which closes it) or by ``aclose()`` on that
    loop. A ``transport`` given here is shared by those clients and is only
    closed by ``aclose()``. ``verify`` as for ``Client`` (a path is loaded
    once, into one ``ssl.SSLContext`` that those clients share).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        verify: VerifyTypes = True,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = _headers(token, headers)
        self._timeout = timeout
        self._transport = transport
        self._verify = _ssl_verify(verify, self.url)
        self._lock = threading.Lock()
        # loop -> (its httpx client, the async generator that closes it at
        # the loop's shutdown). Weak keys: a dropped loop drops its entry.
        self._per_loop: MutableMapping[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator[None, None]]]
        self._per_loop = weakref.WeakKeyDictionary()
        self._no_loop: httpx.AsyncClient | None = None  # another async library (trio): one client

    def _new_http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers,
            timeout=self._timeout,
            transport=self._transport,
            verify=self._verify,
        )

    async def _http(self) -> httpx.AsyncClient:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._lock:
                if self._no_loop is None:
                    self._no_loop = self._new_http()
                return self._no_loop
        with self._lock:
            entry = self._per_loop.get(loop)
            if entry is not None:
                return entry[0]
            for old in [lp for lp in self._per_loop if lp.is_closed()]:
                del self._per_loop[old]  # closed without its shutdown hook: nothing left to close
            http = self._new_http()
            closer = self._closer(loop, http)
            self._per_loop[loop] = (http, closer)
        # Started here, so the loop tracks it: its shutdown_asyncgens()
        # (asyncio.run, asyncio.Runner, anyio) runs the finally below.
        await closer.__anext__()
        return http

    async def _closer(self, loop: asyncio.AbstractEventLoop, http: httpx.AsyncClient) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                # Its connections refer to the loop: the entry must go for
                # the loop to be freed.
                if self._per_loop.get(loop, (None,))[0] is http:
                    del self._per_loop[loop]
            if self._transport is None:  # a given transport outlives one loop
                try:
                    await http.aclose()
                except Exception:  # noqa: BLE001 - the loop is going away; nothing to report to
                    pass

    async def aclose(self) -> None:
        """Close the client of the running loop (and the transport given to
        the constructor, if any). A later call opens a new one."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            entry = self._per_loop.pop(loop, None) if loop is not None else None
            no_loop, self._no_loop = (self._no_loop, None) if loop is None else (None, self._no_loop)
        if entry is not None:
            await entry[1].aclose()
            await entry[0].aclose()  # idempotent; closes a given transport too
        elif no_loop is not None:
            await no_loop.aclose()
        elif self._transport is not None:
            await self._transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, req: _Req[T]) -> T:
        content = encode_body(req.body)
        trace = trace_headers()  # the caller's trace context, in the caller's task
        try:
            http = await self._http()
            resp = await http.request(req.method, req.path, content=content, headers=trace)
        except Exception as e:  # noqa: BLE001 - whatever the transport raised, no answer arrived
            raise TransportError(f"{req.method} {req.path}: {e!r}") from e
        return _answer(req, resp)

    async def claim(
        self,
        key: str,
        fingerprint: str,
        binding: Binding,
        *,
        lease_ms: int | None = None,
        worker: str | None = None,
        marks_dispatch: bool = False,
        retention_s: int | None = None,
        claim_id: str | None = None,
    ) -> ClaimDecision:
        return await self._send(
            _Calls.claim(key, fingerprint, binding, lease_ms, worker, marks_dispatch, retention_s, claim_id)
        )

    async def heartbeat(self, key: str, fence: int, lease_ms: int | None = None) -> LeaseInfo:
        return await self._send(_Calls.heartbeat(key, fence, lease_ms))

    async def dispatch(self, key: str, fence: int) -> Dispatched:
        return await self._send(_Calls.dispatch(key, fence))

    async def settle(self, key: str, fence: int, fingerprint: str, binding: Binding, outcome: Outcome) -> Receipt:
        return await self._send(_Calls.settle(key, fence, fingerprint, binding, outcome))

    async def release(
        self, key: str, fence: int, reason: str | None = "not_dispatched", *, forget: bool = False
    ) -> Released:
        return await self._send(_Calls.release(key, fence, reason, forget))

    async def reconcile(
        self,
        key: str,
        fence: int,
        finding: str,
        *,
        fingerprint: str | None = None,
        binding: Binding | None = None,
        outcome: Outcome | None = None,
    ) -> ReconcileAnswer:
        return await self._send(_Calls.reconcile(key, fence, finding, fingerprint, binding, outcome))

    async def get(self, key: str) -> Record:
        return await self._send(_Calls.get(key))

    async def list(
        self,
        *,
        status: str | Sequence[str] | None = None,
        reconcile_required: bool | None = None,
        disputed: bool | None = None,
        stuck: bool | None = None,
        quarantined: bool | None = None,
        key_prefix: str | None = None,
        order: ListOrder | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> Page:
        return await self._send(
            _Calls.list(status, reconcile_required, disputed, stuck, quarantined, key_prefix, order, limit, after)
        )

    async def stats(self) -> Stats:
        return await self._send(_Calls.stats())

    async def batch(self, calls: Sequence[dict[str, Any]]) -> _List[BatchResult]:
        return await self._send(_Calls.batch(calls))

    async def principal(self, principal: str) -> int:
        return await self._send(_Calls.principal(principal))

    async def revoke(self, principal: str) -> Revoked:
        return await self._send(_Calls.revoke(principal))

    async def warn(self, task: str, class_: str, detail: str | None = None) -> Warning:
        return await self._send(_Calls.warn(task, class_, detail))

    async def warnings(self, task: str) -> _List[Warning]:
        return await self._send(_Calls.warnings(task))

    async def health(self) -> dict[str, Any]:
        return await self._send(_Req("GET", "/healthz", None, dict))

    async def ready(self) -> dict[str, Any]:
        return await self._send(_Req("GET", "/readyz", None, dict))

    async def metrics(self) -> str:
        return await self._send(_Req("GET", "/metrics", None, str, raw=True))

    async def openapi(self) -> dict[str, Any]:
        return await self._send(_Req("GET", "/openapi.json", None, dict))

    async def run_once(
        self, key: str, request: Any, effect: Callable[[AsyncEffectContext], Awaitable[Done]], **options: Any
    ) -> RunResult:
        """SPEC §11, the async twin: ``settle_client.run_once_async(self, ...)``."""
        from .worker import run_once_async

        return await run_once_async(self, key, request, effect, **options)


# Re-exported for callers that want to catch everything the client raises.
ClientError = (ProblemError, TransportError)
