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

Faults between the SDK and settle (§11.11): every claim draws a random
``claim_id`` and a retry of that claim (no answer, 503, 429) sends it again,
so a lost grant is answered again instead of meeting our own lease as
``in_flight``; every other call is retried with identical arguments. The
SDK never attests on its own inference: after a ``dispatch()`` that failed
it releases ``not_dispatched`` and lets the ledger decide
(``receipt_required`` → settle ``unknown``, ``OutcomeUnknown``);
``not_committed`` only on the effect's own ``EffectNotSent`` /
``EffectRefused`` or a hook's finding. A settle refused 422 (a result over
``max_result_bytes``) is settled ``unknown`` at once; a settle without an
answer up to the lease's end, a hook that raises or runs past
``hook_timeout``: ``OutcomeUnknown``.

Refusals (409) raise their typed error and are never retried (§11.7); 503
``unavailable``, 429 and transport errors back off (honouring
``Retry-After``) and retry until the deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import heapq
import inspect
import math
import os
import queue
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn, TypeVar, Union

from ._jcs import FingerprintError, canonicalize, fingerprint as compute_fingerprint, plain_json
from ._kinds import require_async, require_sync
from ._typed import restore, to_json
from .client import AsyncClient, Client, new_claim_id
from .errors import (
    DeadlineExceeded,
    EffectNotSent,
    EffectRefused,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
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
    "ReplayHook",
    "AsyncReplayHook",
    "dispatch",
    "effect_context",
    "encode_result",
    "run_once",
    "run_once_async",
    "hook_timeout_s",
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
    return _encode_canonical(value, default)[0]


def _encode_canonical(value: Any, default: Serializer | None) -> tuple[Any, str]:
    """``encode_result``'s value and its canonical text."""
    text = plain_json(value)
    if text is not None:
        return value, text  # already what would be stored: nothing to convert or check

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
        text = canonicalize(encoded)  # what only the canonical form checks: surrogates, integer range
    except FingerprintError as e:
        raise ResultNotSerializable(type(value).__name__, "", str(e)) from e
    return encoded, text


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
        result, text = _encode_canonical(self.result, default)  # validates the result before anything is stored
        raw = self.response if self.response is not None else text
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


ReplayHook = Callable[[Outcome, Receipt], Any]
"""The ``on_replay`` option (``run_once``, ``@idempotent`` with a
``Client``): called on every replay (the answer is a receipt stored before
this run, the effect was not called) with the stored outcome and its
receipt; what it returns is the run's ``value`` (``RunResult.value``, the
decorated function's return value) instead of the stored result."""

AsyncReplayHook = Callable[[Outcome, Receipt], Any]
"""``on_replay`` of ``run_once_async`` and ``@idempotent`` with an
``AsyncClient``: a function or an ``async def`` (its answer is awaited)."""


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


class _Recorded(Done):
    """A finding whose outcome is already made (a middleware hook's response
    stored the middleware's way, in the Reconciler)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.result, failed=outcome.status == "failed")
        object.__setattr__(self, "_recorded", outcome)

    def outcome(self, default: Serializer | None = None) -> Outcome:
        recorded: Outcome = object.__getattribute__(self, "_recorded")
        return recorded


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
        deadline: _Deadline | None = None,
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
        self._deadline = deadline if deadline is not None else _Deadline(None)
        # Whether dispatch() was called at all, and the error it raised
        # (the SDK's inference, never the caller's word: SPEC §11.11).
        self._called = False
        self._dispatch_error: BaseException | None = None

    def dispatch(self) -> None:
        """Record the commit boundary before the remote write (required when
        the run uses ``marks_dispatch``). A dispatch whose answer was lost
        (or a 503, a 429) is retried under the same fence until the run's
        deadline (at most half the lease); when it still has no answer it
        raises ``EffectNotSent`` (caused by ``DeadlineExceeded``), a refusal
        raises its typed error (``LeaseExpired``, ``StaleFence``): either
        way the effect must not make its remote write (let it propagate)."""
        self._called = True
        if self.marks_dispatch and not self.dispatched and not self.resend:
            try:
                _retry(
                    lambda: self._client.dispatch(self.key, self.fence),
                    _dispatch_deadline(self._deadline, self._lease_ms),
                    "dispatch",
                )
            except DeadlineExceeded as e:
                err = _dispatch_not_recorded(self.key, e)
                self._dispatch_error = err
                raise err from e
            except BaseException as e:
                self._dispatch_error = e
                raise
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
        deadline: _Deadline | None = None,
    ) -> None:
        self._lease_ms = lease_ms
        self.key = key
        self.fence = fence
        self.attempt = attempt
        self.marks_dispatch = marks_dispatch
        self.resend = resend
        self.dispatched = False
        # Set as soon as dispatch() is called, awaited or not: a dispatch
        # that was asked for and not awaited counts as crossed (failures
        # are then unknown, never "not sent"), even when its awaitable was
        # dropped. One that was awaited and failed does not (SPEC §11.11).
        self.dispatch_requested = False
        self.lease_lost = asyncio.Event()
        self._client = client
        self._deadline = deadline if deadline is not None else _Deadline(None)
        self._requested = 0
        self._finished = 0
        self._dispatch_error: BaseException | None = None

    def dispatch(self) -> Awaitable[None]:
        self.dispatch_requested = True
        self._requested += 1
        return self._dispatch()

    async def _dispatch(self) -> None:
        try:
            if self.marks_dispatch and not self.dispatched and not self.resend:
                try:
                    await _aretry(
                        lambda: self._client.dispatch(self.key, self.fence),
                        _dispatch_deadline(self._deadline, self._lease_ms),
                        "dispatch",
                    )
                except DeadlineExceeded as e:
                    err = _dispatch_not_recorded(self.key, e)
                    self._dispatch_error = err
                    raise err from e
                except BaseException as e:
                    self._dispatch_error = e
                    raise
            self.dispatched = True
        finally:
            self._finished += 1

    @property
    def crossed(self) -> bool:
        """The commit boundary is crossed: a dispatch was answered, or one
        was asked for and not awaited to its end."""
        return self.dispatched or self._requested > self._finished


def _dispatch_not_recorded(key: str, e: DeadlineExceeded) -> EffectNotSent:
    return EffectNotSent(f"the dispatch mark of operation {key!r} could not be recorded ({e}); nothing may be written")


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
    # The calls that record what happened (the settle, a release, the
    # settle unknown after a failure, a reconcile finding) are retried past
    # the caller's deadline up to the lease's end (the lease is heartbeated
    # meanwhile; rule 0 answers a retry of a committed settle with its
    # receipt even after that), so that the record is not left stuck; and
    # to the caller's deadline when that is later.
    d = _Deadline(lease_ms / 1000.0)
    if deadline.at is not None and d.at is not None and deadline.at > d.at:
        return deadline
    return d


def _dispatch_deadline(deadline: _Deadline, lease_ms: int) -> _Deadline:
    # dispatch() is retried until the run's deadline, and for at most half
    # the lease: the rest is left for handing the lease back.
    return _Deadline(max(0.0, min(deadline.left(), lease_ms / 2000.0)))


def hook_timeout_s(hook_timeout: float | None, lease_ms: int) -> float:
    """The bound of a reconcile hook in seconds: ``hook_timeout``, or the
    lease when None (SPEC §8, §11.10)."""
    if hook_timeout is None:
        return lease_ms / 1000.0
    if isinstance(hook_timeout, bool) or not isinstance(hook_timeout, (int, float)) or not hook_timeout > 0:
        raise ValueError(f"hook_timeout is a number of seconds above 0 (or None: the lease), got {hook_timeout!r}")
    return float(hook_timeout)


def _hook_timed_out(timeout: float) -> TimeoutError:
    return TimeoutError(f"the reconcile hook did not answer within hook_timeout ({timeout:g} s)")


def _unknown(e: BaseException | None = None) -> Outcome:
    if isinstance(e, ResultNotSerializable):
        why = str(e)
    elif isinstance(e, (InvalidRequest, PayloadTooLarge)):
        why = f"the ledger refused the outcome: {e}"
    elif e is not None:
        why = f"the effect failed after it may have reached the remote: {type(e).__name__}"
    else:
        why = "the effect failed after it may have reached the remote"
    return Outcome(status="unknown", error=why[:4096])


# What the run does when the effect did not return a Done (SPEC §11.8, §11.11).
_RELEASE_NOT_DISPATCHED = "before_mark"  # release not_dispatched, the ledger decides
_RELEASE_NOT_COMMITTED = "word"  # the caller's word: release not_committed
_SETTLE_UNKNOWN = "unknown"


def _plan(e: BaseException, marks_dispatch: bool, crossed: bool) -> str:
    if marks_dispatch and not crossed:
        # Nothing was marked: whatever was raised, nothing could have been
        # sent — unless the ledger recorded a mark whose answer was lost.
        return _RELEASE_NOT_DISPATCHED
    if isinstance(e, (EffectNotSent, EffectRefused)):
        return _RELEASE_NOT_COMMITTED
    return _SETTLE_UNKNOWN


def _caller_word(e: BaseException, sdk_error: BaseException | None) -> bool:
    """The effect's own EffectNotSent / EffectRefused (not the one
    ``dispatch()`` raised: that is the SDK's inference)."""
    return isinstance(e, (EffectNotSent, EffectRefused)) and e is not sdk_error


def _lapses(e: BaseException) -> bool:
    """A cleanup call that got no answer until its deadline: the lease lapses."""
    return isinstance(e, DeadlineExceeded)


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


class _Beats:
    """Every heartbeat of the process, scheduled by one thread (a heap of
    due times); each due beat runs on a small pool of daemon threads, so
    one slow answer delays no other lease's beat and none holds up the
    interpreter's exit. A run adds one heap entry and starts no thread: a
    stopped entry is dropped when it comes due (or when stopped entries
    outnumber live ones)."""

    POOL = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, _Heartbeat]] = []
        self._seq = 0
        self._stale = 0  # stopped entries still in the heap
        self._thread: threading.Thread | None = None
        self._due: queue.SimpleQueue[_Heartbeat] = queue.SimpleQueue()

    def add(self, hb: _Heartbeat, due: float) -> None:
        with self._lock:
            self._push(hb, due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="settle-heartbeats")
                self._thread.start()
                for n in range(self.POOL):
                    threading.Thread(target=self._work, daemon=True, name=f"settle-heartbeat-{n}").start()
            elif self._heap[0][2] is hb:
                self._cond.notify_all()  # it is due before whatever the thread waits for

    def _push(self, hb: _Heartbeat, due: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, hb))

    def stopped(self) -> None:
        """Called when a scheduled entry was stopped."""
        self._stale += 1  # a hint for compaction: exactness is not needed
        if self._stale > 1024 and self._stale * 2 > len(self._heap):
            with self._lock:
                self._compact()

    def _compact(self) -> None:
        if self._stale > 1024 and self._stale * 2 > len(self._heap):
            self._heap = [e for e in self._heap if not e[2].stopped]
            heapq.heapify(self._heap)
            self._stale = 0

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, hb = self._heap[0]
                if hb.stopped:
                    heapq.heappop(self._heap)
                    self._stale = max(0, self._stale - 1)
                    continue
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                hb.running = True
                if hb.stopped:  # stop() saw running false: it returned without waiting
                    hb.running = False
                    continue
                self._due.put(hb)

    def _work(self) -> None:
        while True:
            try:
                self._beat(self._due.get())
            except Exception as e:  # noqa: BLE001 - a bug in one beat must not stop the others'
                sys.excepthook(type(e), e, e.__traceback__)

    def _beat(self, hb: _Heartbeat) -> None:
        again = False
        try:
            again = hb.context.run(hb.beat)
        finally:
            with self._cond:
                hb.running = False
                if again and not hb.stopped:
                    self._push(hb, time.monotonic() + hb.interval)
                else:
                    hb.stopped = True
                self._cond.notify_all()

    def reset(self) -> None:
        """In a forked child: the parent's threads are not there."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap, self._seq, self._stale = [], 0, 0
        self._thread, self._due = None, queue.SimpleQueue()


_BEATS = _Beats()
os.register_at_fork(after_in_child=_BEATS.reset)


class _Heartbeat:
    """A lease heartbeated at a third of ``lease_ms`` until ``stop()``
    (by the process's one scheduler, ``_Beats``)."""

    def __init__(self, client: Client, key: str, fence: int, lease_ms: int, lost: threading.Event) -> None:
        self._client, self._key, self._fence, self._lost = client, key, fence, lost
        self.interval = lease_ms / 3000.0
        # The caller's context: the heartbeats carry its trace context
        # (SPEC §12, Traces), as the calls made in its thread do.
        self.context = contextvars.copy_context()
        self.stopped = False
        self.running = False
        _BEATS.add(self, time.monotonic() + self.interval)

    def beat(self) -> bool:
        """One heartbeat; whether to go on."""
        try:
            self._client.heartbeat(self._key, self._fence)
        except (Refusal, NotFound):
            self._lost.set()  # expired, revoked or taken over: tell the effect
            return False
        except SettleError as e:
            if _retryable(e):
                return True  # the next beat may get through; the lease still runs
            self._lost.set()
            return False
        return True

    def stop(self) -> None:
        """No beat runs after this returns (one under way is waited for).

        Without the lock in the common case: this thread writes
        ``stopped`` then reads ``running``; the scheduler writes
        ``running`` then reads ``stopped`` (``_Beats._run``). Each step is
        one bytecode under the GIL, so at least one of the two sees the
        other's write: the beat is skipped, or this waits for it."""
        if self.stopped:
            return
        self.stopped = True
        if self.running:
            beats = _BEATS
            with beats._lock:
                while self.running:
                    beats._cond.wait()
        else:
            _BEATS.stopped()


def call_hook_sync(fn: Callable[[], T], timeout: float, stop: threading.Event | None = None) -> T:
    """``fn()`` in a daemon thread (in a copy of the caller's context),
    waited for at most ``timeout`` seconds (and until ``stop`` is set):
    past that, ``TimeoutError`` — the thread is left to finish on its own
    (a thread cannot be interrupted)."""
    done = threading.Event()
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box.append((False, e))
        finally:
            done.set()

    t = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True, name="settle-hook")
    t.start()
    end = time.monotonic() + timeout
    while not done.is_set():
        left = end - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            break
        done.wait(left if stop is None else min(left, 0.05))
    if not done.is_set():
        if stop is not None and stop.is_set():
            raise TimeoutError("the reconcile hook was abandoned: the reconciler is stopping")
        raise _hook_timed_out(timeout)
    ok, value = box[0]
    if not ok:
        raise value
    result: T = value
    return result


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
    hook_timeout: float | None = None,
    default: Serializer | None = None,
    result_type: Any = None,
    on_replay: ReplayHook | None = None,
) -> RunResult:
    """Run ``effect`` at most once for ``key`` (SPEC §11); see the module
    docstring. ``deadline`` (seconds, None: no limit) bounds the in_flight
    waits and the retries of claim and dispatch (the calls that record what
    happened are retried past it, up to the lease's end). ``reconcile``: a
    hook (key, fence → Finding), or ``"resend"`` (SPEC §11.9: run the
    effect again under the reconcile lease with the same key; only for a
    remote that de-duplicates by that key). ``hook_timeout``: seconds the
    hook may take (default: the lease; it runs in a thread of its own, its
    lease heartbeated); past it, or when it raises, the lease is handed back
    with ``reconcile(unavailable)`` and ``OutcomeUnknown`` is raised.
    ``default``: the serializer of result values that are not JSON (as
    ``json.dumps``'s ``default``). ``request`` and the result may be
    pydantic models or dataclasses (fingerprinted and stored as their JSON);
    ``result_type``: the type ``RunResult.value`` is restored to.
    ``on_replay(outcome, receipt)``: called on a replay; its answer is
    ``RunResult.value`` (an exception it raises is raised to the caller; the
    record is not touched)."""
    require_sync(client, "run_once", "run_once_async")
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
        hook_timeout=hook_timeout,
        default=default,
    )
    if r.replayed and on_replay is not None:
        return replace(r, value=on_replay(r.outcome, r.receipt))
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
    hook_timeout: float | None,
    default: Serializer | None,
) -> RunResult:
    fp = fingerprint if fingerprint is not None else compute_fingerprint(request, fields)
    binding = Binding(principal, tuple(scopes), generation)
    bound = hook_timeout_s(hook_timeout, lease_ms)
    dl = _Deadline(deadline)
    while True:
        # One claim_id per claim: a retry of this claim whose answer was
        # lost sends it again and gets the same grant (claim rule 5a).
        cid = new_claim_id()
        dec = _retry(
            lambda: client.claim(
                key,
                fp,
                binding,
                lease_ms=lease_ms,
                worker=worker,
                marks_dispatch=marks_dispatch,
                retention_s=retention_s,
                claim_id=cid,
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
            found = _reconcile_sync(client, key, grant, fp, binding, lease_ms, dl, reconcile, default, bound)
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
    hook_timeout: float | None = None,
    stop: threading.Event | None = None,
) -> RunResult | Grant:
    """Asks the hook about a reconcile lease (heartbeated meanwhile) and
    reports its finding: the receipt (committed), the execute grant under
    the same fence (not_committed); ``ReconcileRequired`` (no hook, or it
    cannot tell); ``OutcomeUnknown`` (the hook raised or ran past
    ``hook_timeout``: the lease was handed back with ``unavailable``)."""
    bound = hook_timeout_s(hook_timeout, lease_ms)
    lost = threading.Event()
    hb = _Heartbeat(client, key, grant.fence, lease_ms, lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            finding: Finding = "unavailable" if hook is None else call_hook_sync(lambda: hook(key, grant.fence), bound, stop)
            outcome = finding.outcome(default) if isinstance(finding, Done) else None
        except BaseException as e:
            _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, None, e) from e
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
    ctx = EffectContext(client, key, grant.fence, grant.attempt, marks_dispatch=False, resend=True, deadline=dl)
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


def _settle_unknown_sync(
    client: Client, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, cause: BaseException
) -> NoReturn:
    """Settle ``unknown`` after the effect failed, then raise
    ``OutcomeUnknown`` (the cause re-raised as it is when it is not an
    Exception: KeyboardInterrupt, SystemExit). A refusal of the settle (the
    lease was lost meanwhile) is raised instead."""
    receipt: Receipt | None = None
    try:
        receipt = _retry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), sdl, "settle")
    except DeadlineExceeded:
        pass  # the lease lapses: the ledger marks the record unknown itself
    if isinstance(cause, Exception):
        raise OutcomeUnknown(key, receipt, cause) from cause
    raise cause


def _release_word_sync(
    client: Client, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, cause: BaseException
) -> None:
    """The caller's word (EffectNotSent, EffectRefused): release
    ``not_committed``. A server without that reason (422): settle
    ``unknown`` (the safe record) and re-raise the effect's error."""
    try:
        _retry(lambda: client.release(key, fence, "not_committed"), sdl, "release")
    except InvalidRequest:
        try:
            _retry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), sdl, "settle")
        except DeadlineExceeded:
            pass
    except DeadlineExceeded as e:
        # The lease lapses: the record becomes unknown.
        raise OutcomeUnknown(key, None, cause) from e


def _failed_sync(
    client: Client,
    key: str,
    fence: int,
    fp: str,
    binding: Binding,
    sdl: _Deadline,
    e: BaseException,
    marks_dispatch: bool,
    ctx: EffectContext,
) -> NoReturn:
    """SPEC §11.8 and §11.11 for an effect that did not return a Done."""
    plan = _plan(e, marks_dispatch, ctx.dispatched)
    if plan == _RELEASE_NOT_DISPATCHED:
        try:
            _retry(lambda: client.release(key, fence, "not_dispatched"), sdl, "release")
        except ReceiptRequired:
            # The ledger recorded a mark whose answer never arrived here.
            if _caller_word(e, ctx._dispatch_error):
                _release_word_sync(client, key, fence, fp, binding, sdl, e)
                raise e from None
            _settle_unknown_sync(client, key, fence, fp, binding, sdl, e)
        except DeadlineExceeded as d:
            if ctx._called:  # a mark may have been recorded: the lapse may leave it unknown
                raise OutcomeUnknown(key, None, e) from d
        raise e
    if plan == _RELEASE_NOT_COMMITTED:
        _release_word_sync(client, key, fence, fp, binding, sdl, e)
        raise e
    _settle_unknown_sync(client, key, fence, fp, binding, sdl, e)


def _record_sync(
    client: Client, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, outcome: Outcome
) -> Receipt:
    """Settle the effect's outcome (retried with the same arguments while
    its answer is lost). Refused 422 (e.g. a result over
    ``max_result_bytes``): settle ``unknown`` at once with that error and
    raise ``OutcomeUnknown``; no answer up to the lease's end:
    ``OutcomeUnknown`` carrying the outcome (the lease lapses)."""
    try:
        return _retry(lambda: client.settle(key, fence, fp, binding, outcome), sdl, "settle")
    except (InvalidRequest, PayloadTooLarge) as r:
        receipt: Receipt | None = None
        try:
            receipt = _retry(lambda: client.settle(key, fence, fp, binding, _unknown(r)), sdl, "settle")
        except SettleError:
            pass  # the lease lapses: unknown all the same
        raise OutcomeUnknown(key, receipt, r, outcome) from r
    except DeadlineExceeded as d:
        raise OutcomeUnknown(key, None, d, outcome) from d


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
    ctx = EffectContext(client, key, grant.fence, grant.attempt, marks_dispatch, lease_ms=lease_ms, deadline=dl)
    hb = _Heartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = _call_effect_sync(ctx, effect, default)
        except BaseException as e:
            _failed_sync(client, key, grant.fence, fp, binding, sdl, e, marks_dispatch, ctx)
        receipt = _record_sync(client, key, grant.fence, fp, binding, sdl, outcome)
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


async def call_hook_async(hook: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    """``hook(*args)``, awaited when it answers an awaitable, at most
    ``timeout`` seconds: past that the hook is cancelled and
    ``TimeoutError`` is raised. A plain function (not ``async def``) runs in
    a thread of its own so that it neither blocks the event loop nor escapes
    the bound (such a thread is left to finish on its own)."""
    end = time.monotonic() + timeout
    try:
        if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(getattr(hook, "__call__", None)):
            found = hook(*args)
        else:
            found = await asyncio.wait_for(asyncio.to_thread(hook, *args), timeout)
        if inspect.isawaitable(found):
            found = await asyncio.wait_for(found, max(0.0, end - time.monotonic()))
        return found
    except asyncio.TimeoutError as e:
        raise _hook_timed_out(timeout) from e


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
    hook_timeout: float | None = None,
    default: Serializer | None = None,
    result_type: Any = None,
    on_replay: AsyncReplayHook | None = None,
) -> RunResult:
    """The asyncio twin of ``run_once`` (a hook past ``hook_timeout`` is
    cancelled; ``on_replay`` may be an ``async def``)."""
    require_async(client, "run_once_async", "run_once")
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
        hook_timeout=hook_timeout,
        default=default,
    )
    if r.replayed and on_replay is not None:
        value = on_replay(r.outcome, r.receipt)
        return replace(r, value=await value if inspect.isawaitable(value) else value)
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
    hook_timeout: float | None,
    default: Serializer | None,
) -> RunResult:
    fp = fingerprint if fingerprint is not None else compute_fingerprint(request, fields)
    binding = Binding(principal, tuple(scopes), generation)
    bound = hook_timeout_s(hook_timeout, lease_ms)
    dl = _Deadline(deadline)
    while True:
        cid = new_claim_id()
        dec = await _aretry(
            lambda: client.claim(
                key,
                fp,
                binding,
                lease_ms=lease_ms,
                worker=worker,
                marks_dispatch=marks_dispatch,
                retention_s=retention_s,
                claim_id=cid,
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
            found = await _reconcile_async(client, key, grant, fp, binding, lease_ms, dl, reconcile, default, bound)
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
    hook: Callable[[str, int], Any] | None,
    default: Serializer | None,
    hook_timeout: float | None = None,
) -> RunResult | Grant:
    bound = hook_timeout_s(hook_timeout, lease_ms)
    lost = asyncio.Event()
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            finding: Finding = "unavailable" if hook is None else await call_hook_async(hook, (key, grant.fence), bound)
            outcome = finding.outcome(default) if isinstance(finding, Done) else None
        except BaseException as e:
            # Also on cancellation: the lease is handed back before it goes on.
            await asyncio.shield(_aretry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile"))
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, None, e) from e
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
    ctx = AsyncEffectContext(client, key, grant.fence, grant.attempt, marks_dispatch=False, resend=True, deadline=dl)
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


async def _settle_unknown_async(
    client: AsyncClient, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, cause: BaseException
) -> NoReturn:
    receipt: Receipt | None = None
    try:
        receipt = await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), sdl, "settle")
    except DeadlineExceeded:
        pass
    if isinstance(cause, Exception):
        raise OutcomeUnknown(key, receipt, cause) from cause
    raise cause


async def _release_word_async(
    client: AsyncClient, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, cause: BaseException
) -> None:
    try:
        await _aretry(lambda: client.release(key, fence, "not_committed"), sdl, "release")
    except InvalidRequest:
        try:
            await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown(cause)), sdl, "settle")
        except DeadlineExceeded:
            pass
    except DeadlineExceeded as e:
        raise OutcomeUnknown(key, None, cause) from e


async def _failed_async(
    client: AsyncClient,
    key: str,
    fence: int,
    fp: str,
    binding: Binding,
    sdl: _Deadline,
    e: BaseException,
    marks_dispatch: bool,
    ctx: AsyncEffectContext,
) -> NoReturn:
    plan = _plan(e, marks_dispatch, ctx.crossed)
    if plan == _RELEASE_NOT_DISPATCHED:
        try:
            await _aretry(lambda: client.release(key, fence, "not_dispatched"), sdl, "release")
        except ReceiptRequired:
            if _caller_word(e, ctx._dispatch_error):
                await _release_word_async(client, key, fence, fp, binding, sdl, e)
                raise e from None
            await _settle_unknown_async(client, key, fence, fp, binding, sdl, e)
        except DeadlineExceeded as d:
            if ctx.dispatch_requested:
                raise OutcomeUnknown(key, None, e) from d
        raise e
    if plan == _RELEASE_NOT_COMMITTED:
        await _release_word_async(client, key, fence, fp, binding, sdl, e)
        raise e
    await _settle_unknown_async(client, key, fence, fp, binding, sdl, e)


async def _record_async(
    client: AsyncClient, key: str, fence: int, fp: str, binding: Binding, sdl: _Deadline, outcome: Outcome
) -> Receipt:
    try:
        return await _aretry(lambda: client.settle(key, fence, fp, binding, outcome), sdl, "settle")
    except (InvalidRequest, PayloadTooLarge) as r:
        receipt: Receipt | None = None
        try:
            receipt = await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown(r)), sdl, "settle")
        except SettleError:
            pass
        raise OutcomeUnknown(key, receipt, r, outcome) from r
    except DeadlineExceeded as d:
        raise OutcomeUnknown(key, None, d, outcome) from d


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
    ctx = AsyncEffectContext(client, key, grant.fence, grant.attempt, marks_dispatch, lease_ms=lease_ms, deadline=dl)
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            outcome = await _call_effect_async(ctx, effect, default)
        except BaseException as e:
            # Also on cancellation: the effect may have reached the remote.
            await _failed_async(client, key, grant.fence, fp, binding, sdl, e, marks_dispatch, ctx)
        receipt = await _record_async(client, key, grant.fence, fp, binding, sdl, outcome)
        return RunResult(outcome, receipt, replayed=False, fence=grant.fence)
    finally:
        await hb.stop()


# Keep the names importable for type annotations in user code.
_ = (ProblemError, Released)
