"""The worker client contract of SPEC §11: ``run_once`` and ``run_once_async``.

A run claims the key (the same key on every retry), and then:

- ``replay``: returns the stored outcome, ``replayed=True``, without calling
  the effect (§11.6);
- ``in_flight``: waits ``retry_after_ms`` with jitter and claims again, until
  the deadline (§11.5);
- ``reconcile``: asks the caller's hook whether the remote effect happened
  and reports the finding; ``not_committed`` continues as ``execute`` under
  the same fence; without a hook it raises ``ReconcileRequired`` (§11.4);
- ``execute``: heartbeats at a third of ``lease_ms`` in the background, calls
  ``effect(ctx)`` (``ctx.key`` and ``ctx.fence`` go to the remote as its
  idempotency key and fencing token; ``ctx.dispatch()`` before the remote
  write when ``marks_dispatch``), then settles the outcome, retrying a settle
  that got no answer under the same fence until it answers (§11.3).

Failure classes (§11.8): an effect that raises ``EffectNotSent`` (or, under
``marks_dispatch``, anything before the dispatch mark) releases the lease
and the next run executes; ``EffectRefused`` releases ``not_committed`` and
the next run executes; anything else settles ``unknown`` (reconcile
required). ``reconcile="resend"`` (§11.9) runs the effect again under the
reconcile lease, for remotes that de-duplicate by the key themselves.

Refusals (409) raise their typed error and are never retried (§11.7); 503
``unavailable``, 429 and transport errors back off (honouring
``Retry-After``) and retry until the deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, Union

from ._jcs import FingerprintError, canonicalize, fingerprint as compute_fingerprint
from ._typed import restore, to_json
from .client import AsyncClient, Client
from .errors import (
    DeadlineExceeded,
    EffectNotSent,
    EffectRefused,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    ProblemError,
    ReceiptRequired,
    ReconcileRequired,
    Refusal,
    ResultNotSerializable,
    SettleError,
    TransportError,
    Unavailable,
)
from .types import JSON, Binding, Grant, InFlight, Outcome, Receipt, Released, Replay

__all__ = [
    "Done",
    "RunResult",
    "EffectContext",
    "AsyncEffectContext",
    "Finding",
    "ReconcileHook",
    "AsyncReconcileHook",
    "Serializer",
    "dispatch",
    "effect_context",
    "encode_result",
    "run_once",
    "run_once_async",
    "DEFAULT_DEADLINE_S",
]

DEFAULT_DEADLINE_S = 30.0
T = TypeVar("T")

Serializer = Callable[[Any], Any]
"""The ``default=`` option: called with every value of a result that is not
JSON; returns a JSON-able value (which is encoded in turn) or raises
``TypeError`` (like ``json.dumps``'s ``default``)."""


def _pointer_token(k: str) -> str:
    return k.replace("~", "~0").replace("/", "~1")


def encode_result(value: Any, default: Serializer | None = None) -> Any:
    """The JSON value (dicts, lists, str, int, float, bool, None) that is
    stored for ``value``: mappings become dicts and tuples lists; any other
    value goes through ``default`` (when given) and its answer is encoded in
    turn. Raises ``ResultNotSerializable`` naming the type and where it sits
    (a JSON pointer) for what cannot be encoded: another type without
    ``default``, a non-string object key, NaN or an infinity, a lone
    surrogate, an integer beyond the double range."""

    def enc(v: Any, path: str, depth: int) -> Any:
        if depth > 500:
            raise ResultNotSerializable(type(v).__name__, path, "nesting deeper than 500 (does default= return its argument?)")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ResultNotSerializable("float", path, f"the float {v!r} is not a JSON number")
            return v
        if isinstance(v, Mapping):
            out: dict[str, Any] = {}
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ResultNotSerializable(
                        type(k).__name__, path, f"the object key {k!r} is a {type(k).__name__}, not a str"
                    )
                out[k] = enc(item, f"{path}/{_pointer_token(k)}", depth + 1)
            return out
        if isinstance(v, (list, tuple)):
            return [enc(x, f"{path}/{i}", depth + 1) for i, x in enumerate(v)]
        as_json = to_json(v)
        if as_json is not v:
            return enc(as_json, path, depth + 1)  # a pydantic model or a dataclass: its JSON
        if default is None:
            raise ResultNotSerializable(type(v).__name__, path)
        try:
            converted = default(v)
        except (TypeError, ValueError) as e:
            raise ResultNotSerializable(
                type(v).__name__, path, f"{type(v).__name__} is not a JSON value and default= refused it ({e})"
            ) from e
        return enc(converted, path, depth + 1)

    encoded = enc(value, "", 0)
    try:
        canonicalize(encoded)  # what only the canonical form checks: surrogates, integer range
    except FingerprintError as e:
        raise ResultNotSerializable(type(value).__name__, "", str(e)) from e
    return encoded


@dataclass(frozen=True)
class Done:
    """What an effect (or a reconcile hook that found the effect applied)
    returns: the result to record and, when there is one, the upstream's raw
    response. ``response_sha256`` is the SHA-256 of ``response``, or of the
    canonical JSON of ``result`` when there is no raw response. ``failed``
    records a definitive failure of the upstream (SPEC §3 ``failed``)."""

    result: JSON
    response: bytes | str | None = None
    failed: bool = False

    def outcome(self, default: Serializer | None = None) -> Outcome:
        """The outcome to settle: the result encoded as JSON (through
        ``default`` for values that are not JSON; ``ResultNotSerializable``
        when it cannot be) and its ``response_sha256``."""
        result = encode_result(self.result, default)  # validates the result before anything is stored
        raw = self.response if self.response is not None else canonicalize(result)
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
        return Outcome(
            status="failed" if self.failed else "completed",
            result=result,
            response_sha256=hashlib.sha256(data).hexdigest(),
        )


Finding = Union[Done, Literal["not_committed", "unavailable"]]
"""What a reconcile hook reports: ``Done(...)`` (the effect was applied:
committed with this outcome), ``"not_committed"`` (it was not: execute now
under the same fence) or ``"unavailable"`` (cannot tell yet)."""

ReconcileHook = Callable[[str, int], Finding]
"""A reconcile hook (``run_once``, ``@idempotent`` with a ``Client``,
``Reconciler``): the key and the fence of the reconcile lease → a Finding."""

AsyncReconcileHook = Callable[[str, int], Awaitable[Finding]]
"""The asyncio twin of ReconcileHook (``run_once_async``, ``@idempotent``
with an ``AsyncClient``, ``AsyncReconciler``)."""


@dataclass(frozen=True)
class RunResult:
    """The one true outcome of the operation. ``replayed``: it was stored
    before this run and the effect was not called. ``reconciled``: the
    reconcile hook found the effect applied and recorded it. ``value``: the
    stored result as ``run_once``'s ``result_type`` (a pydantic model, a
    dataclass, ``list[...]``/``Optional[...]`` of them), the same on the
    first run and on replays; without ``result_type``, the stored JSON
    (``outcome.result``)."""

    outcome: Outcome
    receipt: Receipt
    replayed: bool
    fence: int | None = None
    reconciled: bool = False
    value: Any = None


class EffectContext:
    """Handed to a synchronous effect: the key and fence to pass to the
    remote, ``dispatch()``, and ``lease_lost`` (set when a heartbeat learns
    that the lease ended: stop, the settle will be refused). ``resend``: the
    effect runs again under a reconcile lease (SPEC §11.9); ``dispatch()``
    is then a local no-op."""

    def __init__(
        self,
        client: Client,
        key: str,
        fence: int,
        attempt: int,
        marks_dispatch: bool,
        resend: bool = False,
        lease_ms: int = 30000,
    ) -> None:
        self.key = key
        self.fence = fence
        self.attempt = attempt
        self.marks_dispatch = marks_dispatch
        self.resend = resend
        self.dispatched = False
        self.lease_lost = threading.Event()
        self._client = client
        self._lease_ms = lease_ms

    def dispatch(self) -> None:
        """Record the commit boundary before the remote write (required when
        the run uses ``marks_dispatch``). A dispatch whose answer was lost
        (or a 503, a 429) is retried under the same fence for half the
        lease; when it still fails it raises, and the effect must not make
        its remote write (let the error propagate: "not sent")."""
        if self.marks_dispatch and not self.dispatched and not self.resend:
            _retry(lambda: self._client.dispatch(self.key, self.fence), _Deadline(self._lease_ms / 2000.0), "dispatch")
        self.dispatched = True


class AsyncEffectContext:
    """The asyncio twin of EffectContext: ``await ctx.dispatch()``."""

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        fence: int,
        attempt: int,
        marks_dispatch: bool,
        resend: bool = False,
        lease_ms: int = 30000,
    ) -> None:
        self._lease_ms = lease_ms
        self.key = key
        self.fence = fence
        self.attempt = attempt
        self.marks_dispatch = marks_dispatch
        self.resend = resend
        self.dispatched = False
        # Set as soon as dispatch() is called, awaited or not: a dispatch
        # that was asked for counts as crossed (failures are then unknown,
        # never "not sent"), even when its awaitable was dropped.
        self.dispatch_requested = False
        self.lease_lost = asyncio.Event()
        self._client = client

    def dispatch(self) -> Awaitable[None]:
        self.dispatch_requested = True
        return self._dispatch()

    async def _dispatch(self) -> None:
        if self.marks_dispatch and not self.dispatched and not self.resend:
            await _aretry(
                lambda: self._client.dispatch(self.key, self.fence), _Deadline(self._lease_ms / 2000.0), "dispatch"
            )
        self.dispatched = True

    @property
    def crossed(self) -> bool:
        return self.dispatched or self.dispatch_requested


_current: contextvars.ContextVar[EffectContext | AsyncEffectContext | None] = contextvars.ContextVar(
    "settle_client_effect", default=None
)

_OUTSIDE = (
    "is only available while an effect runs: inside a function decorated with @idempotent, or an effect "
    "called by run_once / run_once_async"
)


def effect_context() -> EffectContext | AsyncEffectContext:
    """The context of the effect running now (``key``, ``fence``,
    ``attempt``, ``lease_lost``, ``resend``): inside an ``@idempotent``
    function, the key and fence to pass to the remote. ``RuntimeError``
    outside an effect."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(f"settle_client.effect_context() {_OUTSIDE}")
    return ctx


class _Completed:
    """The awaitable ``dispatch()`` returns in a synchronous effect: the
    dispatch is already done."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that returns at once


def dispatch() -> Awaitable[None]:
    """Mark the commit boundary (SPEC §11.8) of the effect running now,
    right before its remote write: ``settle_client.dispatch()`` in a
    synchronous ``@idempotent`` function (or effect), ``await
    settle_client.dispatch()`` in an ``async def`` one. It records the
    dispatch when the run uses ``marks_dispatch``; in a resend (SPEC §11.9)
    it is a local no-op. ``RuntimeError`` outside an effect."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(f"settle_client.dispatch() {_OUTSIDE}")
    if isinstance(ctx, AsyncEffectContext):
        return ctx.dispatch()
    ctx.dispatch()
    return _Completed()


def _retryable(e: BaseException) -> bool:
    """No answer, 503 ``unavailable`` or any 429 (SPEC §11.7, §11.8)."""
    return isinstance(e, (TransportError, Unavailable)) or (isinstance(e, ProblemError) and e.status == 429)


def _backoff_s(n: int, e: BaseException | None) -> float:
    # Full jitter, 50 ms doubling to 1 s; a Retry-After (503, 429) is a
    # floor, capped at 5 s.
    base = min(1.0, 0.05 * (2 ** min(n, 10)))
    wait = random.uniform(base / 2, base)
    if isinstance(e, ProblemError) and e.retry_after_s:
        wait = max(wait, min(e.retry_after_s, 5.0))
    return wait


def _in_flight_wait_s(retry_after_ms: int) -> float:
    # Jitter above, never below, the server's hint, so that waiters spread out.
    return retry_after_ms / 1000.0 * random.uniform(1.0, 1.25)


class _Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return float("inf") if self.at is None else self.at - time.monotonic()


def _settle_deadline(deadline: _Deadline, lease_ms: int) -> _Deadline:
    # A settle that got no answer is retried at least for as long as the
    # lease could still be held (rule 0 answers a retry of a committed settle
    # with its receipt even after that), and at most to the caller's deadline
    # when that is later.
    d = _Deadline(lease_ms / 1000.0 + 1.0)
    if deadline.at is not None and d.at is not None and deadline.at > d.at:
        return deadline
    return d


def _unknown(e: BaseException | None = None) -> Outcome:
    if isinstance(e, ResultNotSerializable):
        why = str(e)
    elif e is not None:
        why = f"the effect failed after it may have reached the remote: {type(e).__name__}"
    else:
        why = "the effect failed after it may have reached the remote"
    return Outcome(status="unknown", error=why[:4096])


# --------------------------------------------------------------------- sync


def _retry(fn: Callable[[], T], deadline: _Deadline, what: str) -> T:
    n = 0
    while True:
        try:
            return fn()
        except SettleError as e:
            if not _retryable(e):
                raise
            wait = _backoff_s(n, e)
            if deadline.left() < wait:
                raise DeadlineExceeded(f"{what}: deadline passed after {n + 1} tries", e) from e
            time.sleep(wait)
            n += 1


class _Heartbeat:
    def __init__(self, client: Client, key: str, fence: int, lease_ms: int, lost: threading.Event) -> None:
        self._stop = threading.Event()
        # In a copy of the caller's context: the heartbeats carry its trace
        # context (SPEC §12, Traces), as the calls made in its thread do.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._run, client, key, fence, lease_ms / 3000.0, lost),
            daemon=True,
            name=f"settle-heartbeat-{key}",
        )
        self._thread.start()

    def _run(self, client: Client, key: str, fence: int, interval: float, lost: threading.Event) -> None:
        while not self._stop.wait(interval):
            try:
                client.heartbeat(key, fence)
            except (Refusal, NotFound):
                lost.set()  # expired, revoked or taken over: tell the effect
                return
            except SettleError as e:
                if _retryable(e):
                    continue  # the next beat may get through; the lease still runs
                lost.set()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_once(
    client: Client,
    key: str,
    request: JSON,
    effect: Callable[[EffectContext], Done],
    *,
    principal: str,
    scopes: Sequence[str] = (),
    generation: int = 0,
    fields: Sequence[str] | None = None,
    fingerprint: str | None = None,
    lease_ms: int = 30000,
    marks_dispatch: bool = False,
    worker: str | None = None,
    retention_s: int | None = None,
    deadline: float | None = DEFAULT_DEADLINE_S,
    reconcile: ReconcileHook | Literal["resend"] | None = None,
    default: Serializer | None = None,
    result_type: Any = None,
) -> RunResult:
    """Run ``effect`` at most once for ``key`` (SPEC §11); see the module
    docstring. ``deadline`` (seconds, None: no limit) bounds the in_flight
    waits and the retries of claim. ``reconcile``: a hook (key, fence →
    Finding), or ``"resend"`` (SPEC §11.9: run the effect again under the
    reconcile lease with the same key; only for a remote that de-duplicates
    by that key). ``default``: the serializer of result values that are not
    JSON (as ``json.dumps``'s ``default``). ``request`` and the result may
    be pydantic models or dataclasses (fingerprinted and stored as their
    JSON); ``result_type``: the type ``RunResult.value`` is restored to."""
    r = _run_once(
        client,
        key,
        request,
        effect,
        principal=principal,
        scopes=scopes,
        generation=generation,
        fields=fields,
        fingerprint=fingerprint,
        lease_ms=lease_ms,
        marks_dispatch=marks_dispatch,
        worker=worker,
        retention_s=retention_s,
        deadline=deadline,
        reconcile=reconcile,
        default=default,
    )
    return _typed_result(r, result_type)


def _typed_result(r: RunResult, result_type: Any) -> RunResult:
    return replace(r, value=restore(r.outcome.result, result_type))


def _run_once(
    client: Client,
    key: str,
    request: JSON,
    effect: Callable[[EffectContext], Done],
    *,
    principal: str,
    scopes: Sequence[str],
    generation: int,
    fields: Sequence[str] | None,
    fingerprint: str | None,
    lease_ms: int,
    marks_dispatch: bool,
    worker: str | None,
    retention_s: int | None,
    deadline: float | None,
    reconcile: ReconcileHook | Literal["resend"] | None,
    default: Serializer | None,
) -> RunResult:
    fp = fingerprint if fingerprint is not None else compute_fingerprint(request, fields)
    binding = Binding(principal, tuple(scopes), generation)
    dl = _Deadline(deadline)
    while True:
        dec = _retry(
            lambda: client.claim(
                key, fp, binding, lease_ms=lease_ms, worker=worker, marks_dispatch=marks_dispatch, retention_s=retention_s
            ),
            dl,
            "claim",
        )
        if isinstance(dec, Replay):
            return RunResult(dec.outcome, dec.receipt, replayed=True)
        if isinstance(dec, InFlight):
            wait = _in_flight_wait_s(dec.retry_after_ms)
            if dl.left() < wait:
                raise DeadlineExceeded(f"operation {key!r} still in flight at the deadline")
            time.sleep(wait)
            continue
        assert isinstance(dec, Grant)
        grant = dec
        if grant.decision == "reconcile":
            if reconcile == "resend":
                return _resend_sync(client, key, grant, fp, binding, lease_ms, dl, effect, default)
            found = _reconcile_sync(client, key, grant, fp, binding, lease_ms, dl, reconcile, default)
            if isinstance(found, RunResult):
                return found
            grant = found
        return _execute_sync(client, key, grant, fp, binding, lease_ms, marks_dispatch, dl, effect, default)


def _call_effect_sync(ctx: EffectContext, effect: Callable[[EffectContext], Done], default: Serializer | None) -> Outcome:
    token = _current.set(ctx)
    try:
        done = effect(ctx)
    finally:
        _current.reset(token)
    if not isinstance(done, Done):
        raise TypeError(f"the effect must return settle_client.Done, not {type(done).__name__}")
    return done.outcome(default)


def _reconcile_sync(
    client: Client,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    hook: ReconcileHook | None,
    default: Serializer | None,
) -> RunResult | Grant:
    lost = threading.Event()
    hb = _Heartbeat(client, key, grant.fence, lease_ms, lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            finding: Finding = "unavailable" if hook is None else hook(key, grant.fence)
            outcome = finding.outcome(default) if isinstance(finding, Done) else None
        except BaseException:
            _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            raise
        if outcome is not None:
            ans = _retry(
                lambda: client.reconcile(key, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome),
                sdl,
                "reconcile",
            )
            assert isinstance(ans, Receipt)
            return RunResult(outcome, ans, replayed=False, fence=grant.fence, reconciled=True)
        if finding == "not_committed":
            ans = _retry(lambda: client.reconcile(key, grant.fence, "not_committed"), sdl, "reconcile")
            assert isinstance(ans, Grant)
            return ans
        _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
        raise ReconcileRequired(key, grant.fence, "no reconcile hook was given" if hook is None else "the hook cannot tell")
    finally:
        hb.stop()


def _resend_sync(
    client: Client,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    effect: Callable[[EffectContext], Done],
    default: Serializer | None,
) -> RunResult:
    """SPEC §11.9: the effect again, same key, the reconcile lease's fence;
    the remote's own de-duplication answers for the first attempt."""
    ctx = EffectContext(client, key, grant.fence, grant.attempt, marks_dispatch=False, resend=True)
    hb = _Heartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = _call_effect_sync(ctx, effect, default)
        except BaseException as e:
            _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            if isinstance(e, Exception):
                raise ReconcileRequired(key, grant.fence, f"the resend failed ({type(e).__name__}: {e})") from e
            raise
        ans = _retry(
            lambda: client.reconcile(key, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome),
            sdl,
            "reconcile",
        )
        assert isinstance(ans, Receipt)
        return RunResult(outcome, ans, replayed=False, fence=grant.fence, reconciled=True)
    finally:
        hb.stop()


def _release_sync(
    client: Client, key: str, fence: int, reason: str, fp: str, binding: Binding, dl: _Deadline, cause: BaseException
) -> None:
    try:
        _retry(lambda: client.release(key, fence, reason), dl, "release")
        return
    except ReceiptRequired:
        if reason != "not_dispatched":
            raise
        # The dispatch was recorded although its answer never arrived here
        # (dispatch() raised, so the effect stopped before its remote
        # write): nothing was applied.
    except InvalidRequest:
        # A server without release(not_committed): the ledger cannot be
        # told that nothing happened, so the safe record is unknown.
        _retry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), dl, "settle")
        return
    try:
        _retry(lambda: client.release(key, fence, "not_committed"), dl, "release")
    except InvalidRequest:
        _retry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), dl, "settle")


def _execute_sync(
    client: Client,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    marks_dispatch: bool,
    dl: _Deadline,
    effect: Callable[[EffectContext], Done],
    default: Serializer | None,
) -> RunResult:
    ctx = EffectContext(client, key, grant.fence, grant.attempt, marks_dispatch, lease_ms=lease_ms)
    hb = _Heartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = _call_effect_sync(ctx, effect, default)
        except EffectNotSent as e:
            reason = "not_dispatched" if marks_dispatch and not ctx.dispatched else "not_committed"
            _release_sync(client, key, grant.fence, reason, fp, binding, sdl, e)
            raise
        except EffectRefused as e:
            _release_sync(client, key, grant.fence, "not_committed", fp, binding, sdl, e)
            raise
        except BaseException as e:
            if marks_dispatch and not ctx.dispatched:
                # Before the dispatch mark: nothing could have been sent
                # (SPEC §11.8), whatever was raised. Hand the lease back.
                _release_sync(client, key, grant.fence, "not_dispatched", fp, binding, sdl, e)
                raise
            receipt = _retry(lambda: client.settle(key, grant.fence, fp, binding, _unknown(e)), sdl, "settle")
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, receipt, e) from e
            raise
        receipt = _retry(lambda: client.settle(key, grant.fence, fp, binding, outcome), sdl, "settle")
        return RunResult(outcome, receipt, replayed=False, fence=grant.fence)
    finally:
        hb.stop()



# -------------------------------------------------------------------- async


async def _aretry(fn: Callable[[], Awaitable[T]], deadline: _Deadline, what: str) -> T:
    n = 0
    while True:
        try:
            return await fn()
        except SettleError as e:
            if not _retryable(e):
                raise
            wait = _backoff_s(n, e)
            if deadline.left() < wait:
                raise DeadlineExceeded(f"{what}: deadline passed after {n + 1} tries", e) from e
            await asyncio.sleep(wait)
            n += 1


async def _aheartbeat(client: AsyncClient, key: str, fence: int, lease_ms: int, lost: asyncio.Event) -> None:
    while True:
        await asyncio.sleep(lease_ms / 3000.0)
        try:
            await client.heartbeat(key, fence)
        except SettleError as e:
            if _retryable(e):
                continue
            lost.set()
            return


class _AsyncHeartbeat:
    def __init__(self, client: AsyncClient, key: str, fence: int, lease_ms: int, lost: asyncio.Event) -> None:
        self._task = asyncio.get_running_loop().create_task(_aheartbeat(client, key, fence, lease_ms, lost))

    async def stop(self) -> None:
        self._task.cancel()
        # asyncio.wait, not `await self._task` in a try/except
        # CancelledError: that would also swallow a cancellation of our own
        # caller arriving meanwhile (a cancelled AsyncReconciler ran on).
        await asyncio.wait({self._task})


async def run_once_async(
    client: AsyncClient,
    key: str,
    request: JSON,
    effect: Callable[[AsyncEffectContext], Awaitable[Done]],
    *,
    principal: str,
    scopes: Sequence[str] = (),
    generation: int = 0,
    fields: Sequence[str] | None = None,
    fingerprint: str | None = None,
    lease_ms: int = 30000,
    marks_dispatch: bool = False,
    worker: str | None = None,
    retention_s: int | None = None,
    deadline: float | None = DEFAULT_DEADLINE_S,
    reconcile: AsyncReconcileHook | Literal["resend"] | None = None,
    default: Serializer | None = None,
    result_type: Any = None,
) -> RunResult:
    """The asyncio twin of ``run_once``."""
    r = await _run_once_async(
        client,
        key,
        request,
        effect,
        principal=principal,
        scopes=scopes,
        generation=generation,
        fields=fields,
        fingerprint=fingerprint,
        lease_ms=lease_ms,
        marks_dispatch=marks_dispatch,
        worker=worker,
        retention_s=retention_s,
        deadline=deadline,
        reconcile=reconcile,
        default=default,
    )
    return _typed_result(r, result_type)


async def _run_once_async(
    client: AsyncClient,
    key: str,
    request: JSON,
    effect: Callable[[AsyncEffectContext], Awaitable[Done]],
    *,
    principal: str,
    scopes: Sequence[str],
    generation: int,
    fields: Sequence[str] | None,
    fingerprint: str | None,
    lease_ms: int,
    marks_dispatch: bool,
    worker: str | None,
    retention_s: int | None,
    deadline: float | None,
    reconcile: AsyncReconcileHook | Literal["resend"] | None,
    default: Serializer | None,
) -> RunResult:
    fp = fingerprint if fingerprint is not None else compute_fingerprint(request, fields)
    binding = Binding(principal, tuple(scopes), generation)
    dl = _Deadline(deadline)
    while True:
        dec = await _aretry(
            lambda: client.claim(
                key, fp, binding, lease_ms=lease_ms, worker=worker, marks_dispatch=marks_dispatch, retention_s=retention_s
            ),
            dl,
            "claim",
        )
        if isinstance(dec, Replay):
            return RunResult(dec.outcome, dec.receipt, replayed=True)
        if isinstance(dec, InFlight):
            wait = _in_flight_wait_s(dec.retry_after_ms)
            if dl.left() < wait:
                raise DeadlineExceeded(f"operation {key!r} still in flight at the deadline")
            await asyncio.sleep(wait)
            continue
        assert isinstance(dec, Grant)
        grant = dec
        if grant.decision == "reconcile":
            if reconcile == "resend":
                return await _resend_async(client, key, grant, fp, binding, lease_ms, dl, effect, default)
            found = await _reconcile_async(client, key, grant, fp, binding, lease_ms, dl, reconcile, default)
            if isinstance(found, RunResult):
                return found
            grant = found
        return await _execute_async(client, key, grant, fp, binding, lease_ms, marks_dispatch, dl, effect, default)


async def _call_effect_async(
    ctx: AsyncEffectContext, effect: Callable[[AsyncEffectContext], Awaitable[Done]], default: Serializer | None
) -> Outcome:
    token = _current.set(ctx)
    try:
        done = await effect(ctx)
    finally:
        _current.reset(token)
    if not isinstance(done, Done):
        raise TypeError(f"the effect must return settle_client.Done, not {type(done).__name__}")
    return done.outcome(default)


async def _reconcile_async(
    client: AsyncClient,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    hook: AsyncReconcileHook | None,
    default: Serializer | None,
) -> RunResult | Grant:
    lost = asyncio.Event()
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            finding: Finding = "unavailable" if hook is None else await hook(key, grant.fence)
            outcome = finding.outcome(default) if isinstance(finding, Done) else None
        except BaseException:
            await _aretry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            raise
        if outcome is not None:
            ans = await _aretry(
                lambda: client.reconcile(key, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome),
                sdl,
                "reconcile",
            )
            assert isinstance(ans, Receipt)
            return RunResult(outcome, ans, replayed=False, fence=grant.fence, reconciled=True)
        if finding == "not_committed":
            ans = await _aretry(lambda: client.reconcile(key, grant.fence, "not_committed"), sdl, "reconcile")
            assert isinstance(ans, Grant)
            return ans
        await _aretry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
        raise ReconcileRequired(key, grant.fence, "no reconcile hook was given" if hook is None else "the hook cannot tell")
    finally:
        await hb.stop()


async def _resend_async(
    client: AsyncClient,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    effect: Callable[[AsyncEffectContext], Awaitable[Done]],
    default: Serializer | None,
) -> RunResult:
    ctx = AsyncEffectContext(client, key, grant.fence, grant.attempt, marks_dispatch=False, resend=True)
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = await _call_effect_async(ctx, effect, default)
        except BaseException as e:
            await _aretry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            if isinstance(e, Exception):
                raise ReconcileRequired(key, grant.fence, f"the resend failed ({type(e).__name__}: {e})") from e
            raise
        ans = await _aretry(
            lambda: client.reconcile(key, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome),
            sdl,
            "reconcile",
        )
        assert isinstance(ans, Receipt)
        return RunResult(outcome, ans, replayed=False, fence=grant.fence, reconciled=True)
    finally:
        await hb.stop()


async def _release_async(
    client: AsyncClient, key: str, fence: int, reason: str, fp: str, binding: Binding, dl: _Deadline, cause: BaseException
) -> None:
    try:
        await _aretry(lambda: client.release(key, fence, reason), dl, "release")
        return
    except ReceiptRequired:
        if reason != "not_dispatched":
            raise
    except InvalidRequest:
        await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), dl, "settle")
        return
    try:
        await _aretry(lambda: client.release(key, fence, "not_committed"), dl, "release")
    except InvalidRequest:
        await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), dl, "settle")


async def _execute_async(
    client: AsyncClient,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    marks_dispatch: bool,
    dl: _Deadline,
    effect: Callable[[AsyncEffectContext], Awaitable[Done]],
    default: Serializer | None,
) -> RunResult:
    ctx = AsyncEffectContext(client, key, grant.fence, grant.attempt, marks_dispatch, lease_ms=lease_ms)
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = await _call_effect_async(ctx, effect, default)
        except EffectNotSent as e:
            reason = "not_dispatched" if marks_dispatch and not ctx.crossed else "not_committed"
            await _release_async(client, key, grant.fence, reason, fp, binding, sdl, e)
            raise
        except EffectRefused as e:
            await _release_async(client, key, grant.fence, "not_committed", fp, binding, sdl, e)
            raise
        except BaseException as e:
            # Also on cancellation: the effect may have reached the remote.
            if marks_dispatch and not ctx.crossed:
                await _release_async(client, key, grant.fence, "not_dispatched", fp, binding, sdl, e)
                raise
            receipt = await _aretry(lambda: client.settle(key, grant.fence, fp, binding, _unknown(e)), sdl, "settle")
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, receipt, e) from e
            raise
        receipt = await _aretry(lambda: client.settle(key, grant.fence, fp, binding, outcome), sdl, "settle")
        return RunResult(outcome, receipt, replayed=False, fence=grant.fence)
    finally:
        await hb.stop()


# Keep the names importable for type annotations in user code.
_ = (ProblemError, Released)
