"""``IdempotencyMiddleware``: SPEC §8 for ASGI applications (Starlette,
FastAPI, any ASGI 3 app), on a remote ``settle serve``.

    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(url, token),
                       principal=authenticated_principal())   # or fixed_principal("acct-1")

The request body is read whole (to fingerprint it) and the response is
buffered whole (to settle it before the client sees it, so that a client
that loses the answer gets the replay), so streaming responses arrive in one
piece. Decisions where SPEC §8 is silent are in sdk/python/README.md and
sdk/MIDDLEWARE-KEYS.md.

A ``reconcile`` hook resolves records left ``unknown`` when a retry comes:

    async def reconcile(ledger_key, fence, request):      # request: ReconcileRequest
        payment = await provider.find(request.idempotency_key)
        if payment is None:
            return "not_committed"                         # runs the handler under the same fence
        return Committed(201, [("content-type", "application/json")], payment.json_bytes)
        # or "unavailable": 409 outcome_unknown, the record stays unknown

A route's ``wait`` (seconds, default 0) lets a duplicate that finds the
first request in progress wait for its outcome instead of answering 409
``request_in_progress`` at once.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import _mw
from ._mw import ConfigError
from ._mwbase import (
    DEFAULT_LEDGER_DEADLINE_S,
    FAILED_DETAIL,
    MISSING_DETAIL,
    OUTCOME_UNKNOWN_DETAIL,
    RETRYABLE,
    REUSED_DETAIL,
    TOO_LARGE_DETAIL,
    Answer,
    Committed,
    Options,
    Principal,
    Release,
    ReplayResponseHook,
    Resolution,
    RoutePolicy,
    checked_finding,
    committed_answer,
    fixed_principal,
    in_progress_answer,
    ledger_failure_answer,
    not_sent_answer,
    principal_parts,
    hooked_answer,
    problem,
    replay_answer,
    replayed_response,
    response_outcome,
)
from .client import AsyncClient, new_claim_id
from .errors import (
    BindingMismatch,
    EffectNotSent,
    EffectRefused,
    FingerprintMismatch,
    InvalidRequest,
    ReceiptRequired,
    SettleError,
)
from .types import Binding, ClaimDecision, Grant, InFlight, Outcome, Receipt, Replay
from .worker import _aheartbeat, _aretry, _AsyncHeartbeat, _Deadline, _in_flight_wait_s, call_hook_async

__all__ = [
    "IdempotencyMiddleware",
    "ConfigError",
    "RoutePolicy",
    "ReconcileRequest",
    "Committed",
    "Resolution",
    "ReconcileHook",
    "mark_retryable",
    "idempotency_key",
    "fixed_principal",
    "authenticated_principal",
    "Principal",
    "PrincipalExtractor",
    "Scope",
    "Message",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PrincipalExtractor = Callable[[Scope], Union[Principal, Awaitable[Principal]]]
"""The ``principal`` option: the ASGI scope → the caller (may be async)."""



@dataclass(frozen=True)
class ReconcileRequest:
    """The retried request a ``reconcile`` hook is asked about: its ASGI
    ``scope`` (``method``, ``path``, ``query``, ``target``: the path with
    its query, ``headers``, ``header(name)``), its whole ``body``, the
    ``Idempotency-Key`` value the client sent (unquoted) and the
    ``principal`` (account) it came from."""

    scope: Scope
    body: bytes
    idempotency_key: str
    principal: str

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        """The path (without the query)."""
        return str(self.scope["path"])

    @property
    def query(self) -> str:
        """The query string as sent, without ``?`` ("" when none)."""
        qs = self.scope.get("query_string", b"")
        return qs.decode("latin-1") if isinstance(qs, (bytes, bytearray)) else str(qs)

    @property
    def target(self) -> str:
        """The path with its query, as sent (what the fingerprint covers)."""
        return _target(self.scope)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Every request header line: (lower-case name, value)."""
        return [(bytes(n).decode("latin-1").lower(), bytes(v).decode("latin-1")) for n, v in self.scope.get("headers", [])]

    def header(self, name: str) -> str | None:
        """The value of a request header (lines joined by ", "), or None."""
        values = _header_values(self.scope, name.lower().encode("latin-1"))
        return ", ".join(values) if values else None


ReconcileHook = Callable[[str, int, ReconcileRequest], Union[Resolution, Awaitable[Resolution]]]
"""The ``reconcile`` option: (ledger key, fence, the retried request) → a
Resolution (may be ``async``)."""

log = logging.getLogger("settle_client.asgi")


def mark_retryable(target: Any) -> None:
    """Mark the current response as saying nothing happened: it is not
    stored, the lease is released with ``not_committed`` and a retry runs
    the handler again. ``target``: a Starlette ``Request`` or the ASGI
    scope."""
    scope = getattr(target, "scope", target)
    scope.setdefault("state", {})[RETRYABLE] = True


def idempotency_key(target: Any) -> str | None:
    """The key of the request's ``Idempotency-Key`` header, unquoted as the
    middleware reads it (``"k-1"`` → ``k-1``), or None when absent or
    malformed: what a handler passes on to its remote as that remote's
    idempotency key (the reconcile hook gets the same value as
    ``ReconcileRequest.idempotency_key``). ``target``: a Starlette
    ``Request`` or the ASGI scope."""
    scope = getattr(target, "scope", target)
    try:
        return _mw.parse_idempotency_key(_header_values(scope, b"idempotency-key"))
    except _mw.KeyError_:
        return None


def authenticated_principal(identity: Callable[[Any], Principal] | None = None) -> PrincipalExtractor:
    """The ``principal`` from the framework's authenticated identity:
    ``scope["user"]`` (Starlette's and FastAPI's ``request.user``), as set by
    ``starlette.middleware.authentication.AuthenticationMiddleware``, which
    must run before (outside) ``IdempotencyMiddleware``. An unauthenticated
    user (``user.is_authenticated`` false) has no principal (401). The
    principal is ``user.identity``, or ``identity(user)`` when given (a
    ``str``, ``(str, generation)`` or None). It must name the caller's
    account, never a token: a retry after a credential refresh must replay."""

    def extract(scope: Scope) -> Principal:
        if "user" not in scope:
            raise RuntimeError(
                "authenticated_principal(): the request has no scope['user']; add Starlette's "
                "AuthenticationMiddleware outside (before) IdempotencyMiddleware"
            )
        user = scope["user"]
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        if identity is not None:
            return identity(user)
        ident = user.identity
        return ident if isinstance(ident, str) else str(ident)

    return extract


class _Captured:
    def __init__(self) -> None:
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.complete = False

    async def send(self, message: Message) -> None:
        t = message["type"]
        if t == "http.response.start":
            self.start = message
        elif t == "http.response.body":
            if self.complete:
                return
            self.chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.complete = True


def _header_values(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for n, v in scope.get("headers", []) if n.lower() == name]


def _target(scope: Scope) -> str:
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, (bytes, bytearray)) else str(scope.get("path", ""))
    qs = scope.get("query_string", b"")
    return path + ("?" + qs.decode("latin-1") if qs else "")


class IdempotencyMiddleware:
    """SPEC §8's table for an ASGI app. Every option has the default SPEC §8
    names; see sdk/python/README.md for the table of answers."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient,
        namespace: str = "default",
        methods: tuple[str, ...] = ("POST", "PATCH"),
        routes: Callable[[str, str], RoutePolicy | None] | None = None,
        principal: PrincipalExtractor | None = None,
        stored_headers: tuple[str, ...] = (),
        fingerprint_headers: tuple[str, ...] = (),
        canonical_json: bool = True,
        fields: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        max_stored_body: int = _mw.DEFAULT_MAX_STORED_BODY,
        max_request_body: int = 1024 * 1024,
        lease_ms: int = 30000,
        retention_s: int | None = None,
        timeout: float | None = None,
        fail_open: bool = False,
        unavailable_retry_after_s: int = 1,
        reconcile: ReconcileHook | None = None,
        wait: float = 0.0,
        release_on: Sequence[int] = (408, 409, 425, 429),
        ledger_deadline: float = DEFAULT_LEDGER_DEADLINE_S,
        hook_timeout: float | None = None,
        on_replay: ReplayResponseHook | None = None,
    ) -> None:
        if not isinstance(client, AsyncClient):
            raise TypeError(
                "IdempotencyMiddleware (ASGI) needs a settle_client.AsyncClient, not "
                f"{type(client).__name__}: an ASGI app runs on an event loop (a settle_local.LocalLedger: "
                "pass its .aio); for a WSGI app use settle_client.wsgi.IdempotencyMiddleware with a Client"
            )
        self.options = Options.make(
            middleware="IdempotencyMiddleware",
            principal=principal,
            namespace=namespace,
            methods=methods,
            routes=routes,
            stored_headers=stored_headers,
            fingerprint_headers=fingerprint_headers,
            canonical_json=canonical_json,
            fields=fields,
            exclude=exclude,
            max_stored_body=max_stored_body,
            max_request_body=max_request_body,
            lease_ms=lease_ms,
            retention_s=retention_s,
            timeout=timeout,
            fail_open=fail_open,
            unavailable_retry_after_s=unavailable_retry_after_s,
            wait=wait,
            release_on=release_on,
            ledger_deadline=ledger_deadline,
            hook_timeout=hook_timeout,
            on_replay=on_replay,
        )
        assert principal is not None  # Options.make refused None
        self.app = app
        self.client = client
        self.principal = principal
        self.lease_ms = lease_ms
        self.reconcile = reconcile
        # Replays and refusals, by kind (SPEC §8: counted and logged).
        self.counts: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.options.policy(str(scope["method"]), str(scope["path"]))
        if policy is None:
            await self.app(scope, receive, send)
            return
        try:
            key = _mw.parse_idempotency_key(_header_values(scope, b"idempotency-key"))
        except _mw.KeyError_ as e:
            await self._refuse(send, 400, e.code, e.detail, None)
            return
        if key is None:
            if not policy.required:
                await self.app(scope, receive, send)
                return
            await self._refuse(send, 400, "idempotency_key_missing", MISSING_DETAIL, None)
            return
        found = self.principal(scope)
        if inspect.isawaitable(found):
            found = await found
        who = principal_parts(found)
        if who is None:
            await self._refuse(send, 401, "idempotency_principal_missing", _mw.PRINCIPAL_MISSING, key)
            return
        read = await self._read_body(receive)
        if read is None:
            return  # the client went away before its request arrived
        body, too_large = read
        if too_large:
            await self._refuse(send, 413, "payload_too_large", TOO_LARGE_DETAIL, key)
            return
        await self._handle(scope, receive, send, policy, key, body, who)

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool] | None:
        """The whole request body and whether it was over the limit (then
        only the size is kept); None when the client went away first."""
        parts: list[bytes] = []
        size = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                return None
            if m["type"] == "http.request":
                chunk = bytes(m.get("body", b""))
                size += len(chunk)
                if size <= self.options.max_request_body:
                    parts.append(chunk)
                if not m.get("more_body", False):
                    break
        too_large = size > self.options.max_request_body
        return (b"" if too_large else b"".join(parts)), too_large

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, policy: RoutePolicy, key: str, body: bytes, who: tuple[str, int]
    ) -> None:
        ct = _header_values(scope, b"content-type")
        fp = self.options.fingerprint(
            str(scope["method"]),
            _target(scope),
            ct[0] if ct else "",
            body,
            lambda h: ", ".join(_header_values(scope, h.encode("latin-1"))),
        )
        principal, generation = who
        lkey = self.options.ledger_key(principal, key)
        binding = self.options.binding(principal, generation)

        # A duplicate that finds the first request in progress claims again
        # after each retry hint, up to the route's wait, then answers 409.
        waiting = _Deadline(policy.wait or 0.0)
        running: InFlight | None = None
        while True:
            dec = await self._claim(scope, receive, send, policy, key, body, lkey, fp, binding, principal, running, waiting)
            if dec is None:
                return  # answered
            if not isinstance(dec, InFlight):
                break
            running = dec
            left = waiting.left()
            if left <= 0:
                await self._in_progress(send, key, dec)
                return
            await asyncio.sleep(min(left, _in_flight_wait_s(dec.retry_after_ms)))

        if isinstance(dec, Replay):
            await self._replay(send, key, dec)
            return
        assert isinstance(dec, Grant)
        grant = dec
        if grant.decision == "reconcile":
            found = await self._reconcile(send, scope, body, lkey, fp, binding, grant, key, principal)
            if isinstance(found, Receipt):
                return  # the hook's response was settled and sent
            if found is None:
                await self._refuse(send, 409, "outcome_unknown", OUTCOME_UNKNOWN_DETAIL, key)
                return
            grant = found
        # The dispatch is retried under the same fence while its answer is
        # lost (the ledger answers a repeated dispatch alike), within the
        # ledger deadline and half the lease: the rest is left for handing
        # the lease back.
        try:
            await _aretry(lambda: self.client.dispatch(lkey, grant.fence), self._dispatch_deadline(), "dispatch")
        except Exception as e:  # noqa: BLE001 - the handler has not run: hand the lease back, then classify
            if await self._release_undispatched(lkey, grant.fence, fp, binding, key):
                await _send_answer(send, problem(500, "outcome_unknown", FAILED_DETAIL))
                return
            await self._ledger_failed(scope, receive, send, policy, key, body, e, "dispatch")
            return
        await self._execute(scope, receive, send, policy, key, body, lkey, fp, binding, grant.fence)

    def _dispatch_deadline(self) -> _Deadline:
        return _Deadline(min(self.options.ledger_deadline, self.lease_ms / 2000.0))

    def _cleanup_deadline(self) -> _Deadline:
        # Calls that record what happened are retried up to the lease's end.
        return _Deadline(self.lease_ms / 1000.0)

    async def _in_progress(self, send: Send, key: str, dec: InFlight) -> None:
        self.counts["request_in_progress"] += 1
        log.info("idempotency: key %s in progress", key)
        await _send_answer(send, in_progress_answer(dec))

    async def _release_undispatched(self, lkey: str, fence: int, fp: str, binding: Binding, key: str) -> bool:
        """Hands back a lease whose handler never ran after a dispatch that
        failed: ``release(not_dispatched)``, and the ledger decides (SPEC
        §11.11: the SDK never attests on its own inference). When it had
        recorded the dispatch after all (its answer was lost:
        ``receipt_required``), the record is settled ``unknown`` and True is
        returned (the request gets 500 ``outcome_unknown``)."""
        try:
            await _aretry(lambda: self.client.release(lkey, fence, "not_dispatched"), self._cleanup_deadline(), "release")
            return False
        except ReceiptRequired:
            await self._settle_unknown(lkey, fence, fp, binding, key, "the dispatch was recorded but its answer was lost")
            return True
        except Exception:  # noqa: BLE001 - the lease lapses (unknown if the dispatch was recorded)
            log.warning("idempotency: release(not_dispatched) of key %s failed", key, exc_info=True)
            return False

    async def _claim(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        policy: RoutePolicy,
        key: str,
        body: bytes,
        lkey: str,
        fp: str,
        binding: Binding,
        principal: str,
        running: InFlight | None,
        waiting: _Deadline,
    ) -> ClaimDecision | None:
        """The claim's decision, or None when a failure was answered. A
        claim whose answer was lost (or a 503, a 429) is retried with the
        same ``claim_id`` within the ledger deadline; while waiting for a
        request known to be running (``running``), within what is left of
        the wait, and a claim that still fails answers 409
        ``request_in_progress`` (never fail open)."""
        cid = new_claim_id()
        bound = self.options.ledger_deadline if running is None else max(0.0, waiting.left())
        try:
            return await _aretry(
                lambda: self.client.claim(
                    lkey,
                    fp,
                    binding,
                    lease_ms=self.lease_ms,
                    worker=_mw.worker_label(key, principal),
                    marks_dispatch=True,
                    retention_s=self.options.retention_s,
                    claim_id=cid,
                ),
                _Deadline(bound),
                "claim",
            )
        except (FingerprintMismatch, BindingMismatch):
            await self._refuse(send, 422, "idempotency_key_reused", REUSED_DETAIL, key)
        except Exception as e:  # noqa: BLE001 - every failure of the claim is classified; none runs the handler unless allowed
            if running is not None:
                log.warning("idempotency: the claim of key %s failed while it waited for the request in progress: %s", key, e)
                await self._in_progress(send, key, running)
                return None
            await self._ledger_failed(scope, receive, send, policy, key, body, e, "claim")
        return None

    async def _reconcile(
        self,
        send: Send,
        scope: Scope,
        body: bytes,
        lkey: str,
        fp: str,
        binding: Binding,
        grant: Grant,
        key: str,
        principal: str,
    ) -> Grant | Receipt | None:
        """Asks the hook about a record left ``unknown`` (SPEC §8): the
        execute grant under the same fence (``not_committed``), the receipt
        of the hook's response (``Committed``: it was sent), or None (the
        lease was handed back: 409 ``outcome_unknown``). The reconcile lease
        is heartbeated while the hook runs, bounded by ``hook_timeout``
        (past it the hook counts as ``unavailable``)."""
        finding: Resolution = "unavailable"
        hook = self.reconcile
        if hook is not None:
            hb = _AsyncHeartbeat(self.client, lkey, grant.fence, self.lease_ms, asyncio.Event())
            request = ReconcileRequest(scope, body, key, principal)
            try:
                found = await call_hook_async(hook, (lkey, grant.fence, request), self.options.hook_timeout)
                finding = checked_finding(found, key, log)
            except Exception:
                log.exception("idempotency: reconcile hook failed for key %s", key)
                finding = "unavailable"
            finally:
                await hb.stop()
        lease = self._cleanup_deadline()
        try:
            if isinstance(finding, Committed):
                outcome, answer = committed_answer(self.options, finding)
                ans = await _aretry(
                    lambda: self.client.reconcile(
                        lkey, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome
                    ),
                    lease,
                    "reconcile",
                )
                if isinstance(ans, Receipt):
                    self.counts["reconciled"] += 1
                    log.info("idempotency: key %s reconciled as committed (%d); replayed", key, finding.status)
                    await _send_answer(send, answer)
                    return ans
            elif finding == "not_committed":
                ans = await _aretry(lambda: self.client.reconcile(lkey, grant.fence, "not_committed"), lease, "reconcile")
                if isinstance(ans, Grant):
                    log.info("idempotency: key %s reconciled as not committed; the handler runs again", key)
                    return ans
            else:
                await _aretry(lambda: self.client.reconcile(lkey, grant.fence, "unavailable"), lease, "reconcile")
        except SettleError:
            log.warning("idempotency: reconcile of key %s failed", key, exc_info=True)
        return None

    async def _execute(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        policy: RoutePolicy,
        key: str,
        body: bytes,
        lkey: str,
        fp: str,
        binding: Binding,
        fence: int,
    ) -> None:
        # The app sees the body it would have received, and a scope without
        # the zero-copy extensions (their bytes could not be captured).
        inner = dict(scope)
        ext = dict(scope.get("extensions") or {})
        ext.pop("http.response.pathsend", None)
        ext.pop("http.response.zerocopy", None)
        inner["extensions"] = ext
        delivered = False

        async def app_receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        cap = _Captured()
        self.counts["executed"] += 1
        lost = asyncio.Event()
        hb = asyncio.get_running_loop().create_task(_aheartbeat(self.client, lkey, fence, self.lease_ms, lost))
        escaped: BaseException | None = None
        try:
            if policy.timeout is not None:
                await asyncio.wait_for(self.app(inner, app_receive, cap.send), policy.timeout)
            else:
                await self.app(inner, app_receive, cap.send)
        except asyncio.CancelledError as e:
            # The framework cancelled the handler (client disconnect,
            # shutdown): the effect may have happened.
            hb.cancel()
            await asyncio.shield(self._settle_unknown(lkey, fence, fp, binding, key, "cancelled"))
            raise e
        except (EffectNotSent, EffectRefused) as e:
            # The handler's own word: nothing was done (SPEC §8).
            hb.cancel()
            log.info("idempotency: the handler of key %s raised %s: released not_committed", key, type(e).__name__)
            await self._release_not_committed(lkey, fence, fp, binding, key)
            await _send_answer(send, not_sent_answer())
            return
        except BaseException as e:  # noqa: BLE001 - every escape is an unknown outcome
            escaped = e
        finally:
            hb.cancel()
        reraise = escaped is not None and not isinstance(escaped, (asyncio.TimeoutError, TimeoutError))
        if escaped is None and (cap.start is None or not cap.complete):
            escaped = RuntimeError("the handler returned without a complete response")
        if escaped is not None:
            what = "timeout" if not reraise and not isinstance(escaped, RuntimeError) else type(escaped).__name__
            await self._settle_unknown(lkey, fence, fp, binding, key, what)
            await _send_answer(send, problem(500, "outcome_unknown", FAILED_DETAIL))
            if reraise:
                # The server (or an outer middleware) logs it, as without us.
                raise escaped
            return

        assert cap.start is not None
        status = int(cap.start["status"])
        headers = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in cap.start.get("headers", [])]
        out = b"".join(cap.chunks)
        state = inner.get("state")
        outcome = response_outcome(
            self.options,
            status,
            headers,
            out,
            isinstance(state, dict) and bool(state.get(RETRYABLE)),
            policy.release_on,
        )
        if isinstance(outcome, Release):
            await self._release_not_committed(lkey, fence, fp, binding, key, forget=outcome.forget)
        else:
            try:
                await _aretry(
                    lambda: self.client.settle(lkey, fence, fp, binding, outcome),
                    self._cleanup_deadline(),
                    "settle",
                )
            except SettleError:
                # The response goes out anyway (the effect happened); the
                # record becomes unknown when its lease lapses.
                log.error("idempotency: the response of key %s could not be settled", key, exc_info=True)
        start = dict(cap.start)
        start.pop("trailers", None)  # the body goes out whole, without trailers
        await send(start)
        await send({"type": "http.response.body", "body": out, "more_body": False})

    async def _release_not_committed(
        self, lkey: str, fence: int, fp: str, binding: Binding, key: str, forget: bool = False
    ) -> None:
        self.counts["not_committed"] += 1
        deadline = self._cleanup_deadline()
        try:
            if forget:
                try:
                    await _aretry(
                        lambda: self.client.release(lkey, fence, "not_committed", forget=True), deadline, "release"
                    )
                    return
                except (ReceiptRequired, InvalidRequest) as e:
                    # Something was recorded on this key before (or a server
                    # without forget): keep the record, release it.
                    log.info("idempotency: key %s cannot be forgotten (%s); released not_committed", key, e.code)
            await _aretry(lambda: self.client.release(lkey, fence, "not_committed"), deadline, "release")
        except InvalidRequest:
            # A server without release(not_committed) (SPEC §4): the safe
            # record is unknown.
            log.warning("idempotency: the ledger refused release(not_committed) for key %s; settling unknown", key)
            await self._settle_unknown(lkey, fence, fp, binding, key, "not_committed unsupported")
        except SettleError:
            log.error("idempotency: release of key %s failed", key, exc_info=True)

    async def _settle_unknown(self, lkey: str, fence: int, fp: str, binding: Binding, key: str, why: str) -> None:
        self.counts["outcome_unknown"] += 1
        log.warning("idempotency: key %s failed (%s); outcome unknown", key, why)
        try:
            await _aretry(
                lambda: self.client.settle(
                    lkey, fence, fp, binding, Outcome(status="unknown", error=f"handler failed: {why}"[:4096])
                ),
                self._cleanup_deadline(),
                "settle",
            )
        except SettleError:
            # The lease lapses after dispatch: the ledger marks it unknown anyway.
            log.error("idempotency: settle unknown of key %s failed", key, exc_info=True)

    async def _replay(self, send: Send, key: str, dec: Replay) -> None:
        what, answer = replay_answer(dec)
        hook, stored = self.options.on_replay, replayed_response(dec)
        if hook is not None and stored is not None:
            found = hook(stored, dec.receipt)
            answer = hooked_answer(await found if inspect.isawaitable(found) else found)
        self.counts[what] += 1
        log.info("idempotency: %s for key %s", "replay" if what == "replayed" else what, key)
        await _send_answer(send, answer)

    async def _ledger_failed(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        policy: RoutePolicy,
        key: str,
        body: bytes,
        err: BaseException,
        call: str,
    ) -> None:
        """A claim or dispatch that failed (SPEC §8): only a ledger that gave
        no answer or a 503 ``unavailable`` lets a fail-open route run the
        handler; a refusal never does."""
        f = _mw.classify_ledger_error(err, self.options.unavailable_retry_after_s)
        if policy.fail_open and f.fail_open:
            self.counts["fail_open"] += 1
            log.warning("idempotency: ledger unreachable (%s); key %s runs WITHOUT idempotency (fail_open)", err, key)
            delivered = False

            async def again() -> Message:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, again, send)
            return
        self.counts[f.code] += 1
        if f.unexpected:
            log.error("idempotency: unexpected answer of the ledger to the %s of key %s: %r", call, key, err, exc_info=err)
        else:
            log.warning("idempotency: the %s of key %s failed (%s): %s", call, key, f.code, err)
        await _send_answer(send, ledger_failure_answer(f))

    async def _refuse(self, send: Send, status: int, code: str, detail: str, key: str | None) -> None:
        self.counts[code] += 1
        log.info("idempotency: %s for key %s", code, key)
        await _send_answer(send, problem(status, code, detail))


async def _send_answer(send: Send, answer: Answer) -> None:
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in answer.headers]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
