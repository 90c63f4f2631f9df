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

Refusals (409) raise their typed error and are never retried (§11.7); 503
``unavailable`` and transport errors back off and retry until the deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, Union

from ._jcs import canonicalize, fingerprint as compute_fingerprint
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
    "run_once",
    "run_once_async",
    "DEFAULT_DEADLINE_S",
]

DEFAULT_DEADLINE_S = 30.0
T = TypeVar("T")


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

    def outcome(self) -> Outcome:
        canonical = canonicalize(self.result)  # validates the result before anything is stored
        raw = self.response if self.response is not None else canonical
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
        return Outcome(
            status="failed" if self.failed else "completed",
            result=self.result,
            response_sha256=hashlib.sha256(data).hexdigest(),
        )


Finding = Union[Done, Literal["not_committed", "unavailable"]]
"""What a reconcile hook reports: ``Done(...)`` (the effect was applied:
committed with this outcome), ``"not_committed"`` (it was not: execute now
under the same fence) or ``"unavailable"`` (cannot tell yet)."""


@dataclass(frozen=True)
class RunResult:
    """The one true outcome of the operation. ``replayed``: it was stored
    before this run and the effect was not called. ``reconciled``: the
    reconcile hook found the effect applied and recorded it."""

    outcome: Outcome
    receipt: Receipt
    replayed: bool
    fence: int | None = None
    reconciled: bool = False


class EffectContext:
    """Handed to a synchronous effect: the key and fence to pass to the
    remote, ``dispatch()``, and ``lease_lost`` (set when a heartbeat learns
    that the lease ended: stop, the settle will be refused)."""

    def __init__(self, client: Client, key: str, fence: int, attempt: int, marks_dispatch: bool) -> None:
        self.key = key
        self.fence = fence
        self.attempt = attempt
        self.marks_dispatch = marks_dispatch
        self.dispatched = False
        self.lease_lost = threading.Event()
        self._client = client

    def dispatch(self) -> None:
        """Record the commit boundary before the remote write (required when
        the run uses ``marks_dispatch``)."""
        if self.marks_dispatch and not self.dispatched:
            self._client.dispatch(self.key, self.fence)
        self.dispatched = True


class AsyncEffectContext:
    """The asyncio twin of EffectContext."""

    def __init__(self, client: AsyncClient, key: str, fence: int, attempt: int, marks_dispatch: bool) -> None:
        self.key = key
        self.fence = fence
        self.attempt = attempt
        self.marks_dispatch = marks_dispatch
        self.dispatched = False
        self.lease_lost = asyncio.Event()
        self._client = client

    async def dispatch(self) -> None:
        if self.marks_dispatch and not self.dispatched:
            await self._client.dispatch(self.key, self.fence)
        self.dispatched = True


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (TransportError, Unavailable))


def _backoff_s(n: int, e: BaseException | None) -> float:
    # Full jitter, 50 ms doubling to 1 s; a Retry-After of a 503 is a floor.
    base = min(1.0, 0.05 * (2 ** min(n, 10)))
    wait = random.uniform(base / 2, base)
    if isinstance(e, Unavailable) and e.retry_after_s:
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


def _unknown() -> Outcome:
    return Outcome(status="unknown", error="the effect failed after it may have reached the remote")


# --------------------------------------------------------------------- sync


def _retry(fn: Callable[[], T], deadline: _Deadline, what: str) -> T:
    n = 0
    while True:
        try:
            return fn()
        except (TransportError, Unavailable) as e:
            wait = _backoff_s(n, e)
            if deadline.left() < wait:
                raise DeadlineExceeded(f"{what}: deadline passed after {n + 1} tries", e) from e
            time.sleep(wait)
            n += 1


class _Heartbeat:
    def __init__(self, client: Client, key: str, fence: int, lease_ms: int, lost: threading.Event) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, key, fence, lease_ms / 3000.0, lost), daemon=True, name=f"settle-heartbeat-{key}"
        )
        self._thread.start()

    def _run(self, client: Client, key: str, fence: int, interval: float, lost: threading.Event) -> None:
        while not self._stop.wait(interval):
            try:
                client.heartbeat(key, fence)
            except (TransportError, Unavailable):
                continue  # the next beat may get through; the lease still runs
            except (Refusal, NotFound):
                lost.set()  # expired, revoked or taken over: tell the effect
                return
            except SettleError:
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
    reconcile: Callable[[str, int], Finding] | None = None,
) -> RunResult:
    """Run ``effect`` at most once for ``key`` (SPEC §11); see the module
    docstring. ``deadline`` (seconds, None: no limit) bounds the in_flight
    waits and the retries of claim."""
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
            found = _reconcile_sync(client, key, grant, fp, binding, lease_ms, dl, reconcile)
            if isinstance(found, RunResult):
                return found
            grant = found
        return _execute_sync(client, key, grant, fp, binding, lease_ms, marks_dispatch, dl, effect)


def _reconcile_sync(
    client: Client,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    hook: Callable[[str, int], Finding] | None,
) -> RunResult | Grant:
    lost = threading.Event()
    hb = _Heartbeat(client, key, grant.fence, lease_ms, lost)
    try:
        finding: Finding = "unavailable" if hook is None else hook(key, grant.fence)
    except BaseException:
        hb.stop()
        _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), _settle_deadline(dl, lease_ms), "reconcile")
        raise
    try:
        if isinstance(finding, Done):
            outcome = finding.outcome()
            ans = _retry(
                lambda: client.reconcile(key, grant.fence, "committed", fingerprint=fp, binding=binding, outcome=outcome),
                _settle_deadline(dl, lease_ms),
                "reconcile",
            )
            assert isinstance(ans, Receipt)
            return RunResult(outcome, ans, replayed=False, fence=grant.fence, reconciled=True)
        if finding == "not_committed":
            ans = _retry(lambda: client.reconcile(key, grant.fence, "not_committed"), _settle_deadline(dl, lease_ms), "reconcile")
            assert isinstance(ans, Grant)
            return ans
        _retry(lambda: client.reconcile(key, grant.fence, "unavailable"), _settle_deadline(dl, lease_ms), "reconcile")
        raise ReconcileRequired(key, grant.fence)
    finally:
        hb.stop()


def _release_sync(client: Client, key: str, fence: int, reason: str, fp: str, binding: Binding, dl: _Deadline) -> None:
    try:
        _retry(lambda: client.release(key, fence, reason), dl, "release")
    except (ReceiptRequired, InvalidRequest):
        # not_dispatched refused (dispatch was recorded), or a server without
        # release(not_committed): the ledger cannot be told nothing happened,
        # so the safe record is unknown (reconcile required).
        _retry(lambda: client.settle(key, fence, fp, binding, _unknown()), dl, "settle")


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
) -> RunResult:
    ctx = EffectContext(client, key, grant.fence, grant.attempt, marks_dispatch)
    hb = _Heartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            done = effect(ctx)
            if not isinstance(done, Done):
                raise TypeError(f"the effect must return settle_client.Done, not {type(done).__name__}")
            outcome = done.outcome()
        except EffectNotSent:
            reason = "not_dispatched" if marks_dispatch and not ctx.dispatched else "not_committed"
            _release_sync(client, key, grant.fence, reason, fp, binding, sdl)
            raise
        except EffectRefused:
            _release_sync(client, key, grant.fence, "not_committed", fp, binding, sdl)
            raise
        except BaseException as e:
            if marks_dispatch and not ctx.dispatched:
                # Nothing could have been sent: hand the lease back.
                _release_sync(client, key, grant.fence, "not_dispatched", fp, binding, sdl)
                raise
            receipt = _retry(lambda: client.settle(key, grant.fence, fp, binding, _unknown()), sdl, "settle")
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, receipt) from e
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
        except (TransportError, Unavailable) as e:
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
        except (TransportError, Unavailable):
            continue
        except SettleError:
            lost.set()
            return


class _AsyncHeartbeat:
    def __init__(self, client: AsyncClient, key: str, fence: int, lease_ms: int, lost: asyncio.Event) -> None:
        self._task = asyncio.get_running_loop().create_task(_aheartbeat(client, key, fence, lease_ms, lost))

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


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
    reconcile: Callable[[str, int], Awaitable[Finding]] | None = None,
) -> RunResult:
    """The asyncio twin of ``run_once``."""
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
            found = await _reconcile_async(client, key, grant, fp, binding, lease_ms, dl, reconcile)
            if isinstance(found, RunResult):
                return found
            grant = found
        return await _execute_async(client, key, grant, fp, binding, lease_ms, marks_dispatch, dl, effect)


async def _reconcile_async(
    client: AsyncClient,
    key: str,
    grant: Grant,
    fp: str,
    binding: Binding,
    lease_ms: int,
    dl: _Deadline,
    hook: Callable[[str, int], Awaitable[Finding]] | None,
) -> RunResult | Grant:
    lost = asyncio.Event()
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            finding: Finding = "unavailable" if hook is None else await hook(key, grant.fence)
        except BaseException:
            await _aretry(lambda: client.reconcile(key, grant.fence, "unavailable"), sdl, "reconcile")
            raise
        if isinstance(finding, Done):
            outcome = finding.outcome()
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
        raise ReconcileRequired(key, grant.fence)
    finally:
        await hb.stop()


async def _release_async(
    client: AsyncClient, key: str, fence: int, reason: str, fp: str, binding: Binding, dl: _Deadline
) -> None:
    try:
        await _aretry(lambda: client.release(key, fence, reason), dl, "release")
    except (ReceiptRequired, InvalidRequest):
        await _aretry(lambda: client.settle(key, fence, fp, binding, _unknown()), dl, "settle")


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
) -> RunResult:
    ctx = AsyncEffectContext(client, key, grant.fence, grant.attempt, marks_dispatch)
    hb = _AsyncHeartbeat(client, key, grant.fence, lease_ms, ctx.lease_lost)
    sdl = _settle_deadline(dl, lease_ms)
    try:
        try:
            done = await effect(ctx)
            if not isinstance(done, Done):
                raise TypeError(f"the effect must return settle_client.Done, not {type(done).__name__}")
            outcome = done.outcome()
        except EffectNotSent:
            reason = "not_dispatched" if marks_dispatch and not ctx.dispatched else "not_committed"
            await _release_async(client, key, grant.fence, reason, fp, binding, sdl)
            raise
        except EffectRefused:
            await _release_async(client, key, grant.fence, "not_committed", fp, binding, sdl)
            raise
        except BaseException as e:
            # Also on cancellation: the effect may have reached the remote.
            if marks_dispatch and not ctx.dispatched:
                await _release_async(client, key, grant.fence, "not_dispatched", fp, binding, sdl)
                raise
            receipt = await _aretry(lambda: client.settle(key, grant.fence, fp, binding, _unknown()), sdl, "settle")
            if isinstance(e, Exception):
                raise OutcomeUnknown(key, receipt) from e
            raise
        receipt = await _aretry(lambda: client.settle(key, grant.fence, fp, binding, outcome), sdl, "settle")
        return RunResult(outcome, receipt, replayed=False, fence=grant.fence)
    finally:
        await hb.stop()


# Keep the names importable for type annotations in user code.
_ = (ProblemError, Released)
