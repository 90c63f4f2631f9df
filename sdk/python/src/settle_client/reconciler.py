"""``Reconciler`` and ``AsyncReconciler`` (SPEC §11.10): turn records left
``unknown`` (reconcile required) into the truth, without a human, wherever
a hook can tell.

    r = Reconciler(client, hooks={"charge-": psp_hook})   # the hook run_once takes
    r.sweep()          # {"seen", "committed", "not_committed", "unavailable", "skipped", "errors"}
    r.start(interval=60.0); ...; r.stop(timeout=5.0)       # in a background thread

For each key prefix, ``sweep()`` pages ``GET
/v1/operations?reconcile_required=true&key_prefix=P`` (the prefix ``""``:
without ``key_prefix``, every key), reads each record, and claims it with
the stored fingerprint, principal and scopes, the principal's current
generation and ``marks_dispatch``. On a ``reconcile`` grant it asks the
prefix's hook (key, fence → ``Done(...)``, ``"not_committed"`` or
``"unavailable"``), its lease heartbeated while the hook runs, and reports
the finding; after ``not_committed`` it hands the execute lease it is given
back with ``release(not_dispatched)`` (it never dispatched: the next claim
of a worker that holds the request executes). On an ``execute`` grant
(someone resolved the record meanwhile) it releases ``not_dispatched``; any
other answer is skipped. A hook that raises or runs past ``hook_timeout``
(default: the lease) counts under ``errors``, the lease is handed back with
``reconcile(unavailable)``, and the sweep goes on. A call whose answer was
lost is retried with the same arguments (a claim with the same
``claim_id``) and counted as what it did. A reconciler never runs effects
(it does not hold the requests) and never guesses: a record whose hook
cannot tell stays ``unknown``.

Records of the Idempotency-Key middleware (``mw-`` keys) can be resolved
by a hook registered as a ``MiddlewareHook``: it is also given the client's
``Idempotency-Key`` value and principal, parsed from the claim's ``worker``
field (SPEC §8), and answers like the middleware's own hook (``Committed(
status, headers, body)``, ``"not_committed"``, ``"unavailable"``); a
``Committed`` response is stored the middleware's way, so that the client's
retry through the middleware replays it.

    def find(ledger_key, fence, rec):        # rec: MiddlewareRecord
        charge = psp.find(idempotency_key=rec.idempotency_key, account=rec.principal)
        return "not_committed" if charge is None else Committed(201, [("content-type", "application/json")], charge.json)

    Reconciler(client, hooks={"mw-": MiddlewareHook(find)})

A key that several prefixes match is handled once per sweep, by the hook of
the longest matching prefix. Every resolution is logged (logger
``settle_client.reconciler``) and counted in ``counts`` (totals since the
reconciler was made).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import _mw
from ._mwbase import Committed, Resolution, checked_finding, stored_outcome
from .client import AsyncClient, Client, new_claim_id
from .errors import LeaseExpired, NotFound, ReconcileRequired, StaleFence
from .types import Binding, Grant, Record
from .worker import (
    AsyncReconcileHook,
    Finding,
    ReconcileHook,
    RunResult,
    Serializer,
    _aretry,
    _Deadline,
    _reconcile_async,
    _reconcile_sync,
    _Recorded,
    _retry,
    call_hook_async,
    hook_timeout_s,
)

__all__ = [
    "Reconciler",
    "AsyncReconciler",
    "MiddlewareHook",
    "MiddlewareRecord",
    "MiddlewareReconcileHook",
    "COUNT_NAMES",
    "WORKER_LABEL",
]

log = logging.getLogger("settle_client.reconciler")

COUNT_NAMES = ("seen", "committed", "not_committed", "unavailable", "skipped", "errors")
"""The keys of a sweep's counts (SPEC §11.10)."""

WORKER_LABEL = "settle-reconciler"
"""The claim's ``worker`` field, for operators (a middleware record's
reconcile claim copies that record's own field instead, SPEC §8)."""


@dataclass(frozen=True)
class MiddlewareRecord:
    """What a ``MiddlewareHook`` is told about a record of the
    Idempotency-Key middleware: the ``idempotency_key`` value the client
    sent and the ``principal`` (account) it came from, as the middleware
    wrote them in the claim's ``worker`` field (``worker``, raw). The
    middleware's own ``ReconcileRequest`` has the same two attributes, so
    one function of them serves both hooks."""

    idempotency_key: str
    principal: str
    worker: str


MiddlewareReconcileHook = Callable[[str, int, MiddlewareRecord], Union[Resolution, Awaitable[Resolution]]]
"""A middleware hook: (ledger key, fence, MiddlewareRecord) → ``Committed(...)``,
``"not_committed"`` or ``"unavailable"`` (``async def`` with an
``AsyncReconciler``; a plain function runs in a thread of its own there)."""


@dataclass(frozen=True)
class MiddlewareHook:
    """Registers ``hook`` for records of the Idempotency-Key middleware (SPEC
    §11.10 ``middleware=True``): ``hooks={"mw-": MiddlewareHook(hook)}``.
    ``max_stored_body`` and ``stored_headers``: the middleware's options of
    the same names, so that a ``Committed`` response is stored as the
    middleware would have stored it (a body over the limit: its digest, and
    a replay answers 409 ``response_not_stored``)."""

    hook: MiddlewareReconcileHook
    max_stored_body: int = _mw.DEFAULT_MAX_STORED_BODY
    stored_headers: Sequence[str] = ()

    def outcome(self, found: Committed) -> Finding:
        names = tuple(dict.fromkeys(list(_mw.DEFAULT_STORED_HEADERS) + [h.lower() for h in self.stored_headers]))
        headers = [(str(n), str(v)) for n, v in found.headers]
        body = found.body.encode("utf-8") if isinstance(found.body, str) else bytes(found.body)
        return _Recorded(stored_outcome(found.status, headers, body, names, self.max_stored_body))

    def finding(self, found: object, key: str) -> Finding:
        checked = checked_finding(found, key, log)
        return self.outcome(checked) if isinstance(checked, Committed) else checked


def _zero() -> dict[str, int]:
    return dict.fromkeys(COUNT_NAMES, 0)


def _binding(rec: Record, current_generation: int) -> tuple[str, Binding]:
    res = rec.reservation
    principal = str(res["principal"])
    generation = max(int(res.get("generation", 0)), current_generation)
    return str(res["fingerprint"]), Binding(principal, tuple(res.get("scopes") or ()), generation)


def _owner(prefixes: list[str], key: str) -> str | None:
    best: str | None = None
    for p in prefixes:
        if key.startswith(p) and (best is None or len(p) > len(best)):
            best = p
    return best


def middleware_record(rec: Record) -> MiddlewareRecord | None:
    """The client's Idempotency-Key value and principal of a middleware
    record, from the ``worker`` field of one of its attempts (the first
    claim wrote it, reconcile claims copy it), or None."""
    for attempt in rec.attempts:
        lease = attempt.get("lease") if isinstance(attempt, dict) else None
        worker = lease.get("worker") if isinstance(lease, dict) else None
        if isinstance(worker, str):
            parsed = _mw.parse_worker_label(worker)
            if parsed is not None:
                return MiddlewareRecord(parsed[0], parsed[1], worker)
    return None


class _Base:
    def __init__(
        self,
        hooks: Mapping[str, Any],
        lease_ms: int,
        deadline: float,
        page_size: int,
        worker: str,
        hook_timeout: float | None,
    ) -> None:
        if not hooks:
            raise ValueError("a Reconciler needs at least one hook: hooks={key_prefix: hook} ('' for every key)")
        for p, h in hooks.items():
            if not isinstance(p, str) or not (callable(h) or isinstance(h, MiddlewareHook)):
                raise TypeError(
                    "hooks maps a key prefix (str) to a reconcile hook (key, fence) -> finding, or to a "
                    "MiddlewareHook(hook) for records of the Idempotency-Key middleware"
                )
        self.hooks = dict(hooks)
        self.lease_ms = lease_ms
        self.deadline = deadline
        self.page_size = page_size
        self.worker = worker
        self.hook_timeout = hook_timeout_s(hook_timeout, lease_ms)
        self.counts = _zero()
        """Totals since the reconciler was made, updated as records are
        resolved (also while a background sweep runs)."""
        self.sweeps = 0
        self._lock = threading.Lock()

    def _count(self, sweep: dict[str, int], what: str) -> None:
        sweep[what] += 1
        with self._lock:
            self.counts[what] += 1

    def _done(self, sweep: dict[str, int]) -> dict[str, int]:
        with self._lock:
            self.sweeps += 1
        if sweep["seen"] or sweep["errors"]:
            log.info("reconciler: sweep %s", sweep)
        return sweep

    def _worker_of(self, key: str, rec: Record, hook: Any) -> tuple[str, MiddlewareRecord | None] | None:
        """The reconcile claim's ``worker`` (a middleware record's own field,
        copied) and, for a MiddlewareHook, what it is told; None when a
        MiddlewareHook's record has no readable field."""
        mw = middleware_record(rec)
        if isinstance(hook, MiddlewareHook) and mw is None:
            log.warning(
                "reconciler: key %s has no idempotency-key=... principal=... worker field (SPEC §8): its "
                "middleware hook cannot be asked; it stays unknown",
                key,
            )
            return None
        return (mw.worker if mw is not None else self.worker), mw


class Reconciler(_Base):
    """SPEC §11.10 over a synchronous ``Client``: ``hooks`` maps key
    prefixes (``""``: every key) to reconcile hooks (the type ``run_once``
    takes: ``(key, fence) -> Done(...) | "not_committed" | "unavailable"``),
    or to a ``MiddlewareHook`` for records of the Idempotency-Key
    middleware. ``lease_ms``: the reconcile lease (heartbeated while a hook
    runs); ``hook_timeout``: seconds a hook may take (default: the lease;
    it runs in a thread of its own, and past that it counts under
    ``errors``); ``deadline``: seconds each ledger call is retried (no
    answer, 503, 429); ``default``: the serializer of a hook's ``Done``
    result, as in ``run_once``."""

    def __init__(
        self,
        client: Client,
        hooks: Mapping[str, ReconcileHook | MiddlewareHook],
        *,
        lease_ms: int = 30000,
        deadline: float = 10.0,
        page_size: int = 100,
        worker: str = WORKER_LABEL,
        default: Serializer | None = None,
        hook_timeout: float | None = None,
    ) -> None:
        super().__init__(hooks, lease_ms, deadline, page_size, worker, hook_timeout)
        self.client = client
        self.default = default
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> dict[str, int]:
        """One pass over every prefix: the counts ``{seen, committed,
        not_committed, unavailable, skipped, errors}`` of this pass. Never
        raises for a record or a listing that fails (counted in
        ``errors``, logged)."""
        return self._sweep(None)

    def _sweep(self, stop: threading.Event | None) -> dict[str, int]:
        s = _zero()
        prefixes = list(self.hooks)
        for prefix in prefixes:
            after: str | None = None
            while stop is None or not stop.is_set():
                try:
                    page = _retry(
                        lambda: self.client.list(
                            reconcile_required=True, key_prefix=prefix or None, limit=self.page_size, after=after
                        ),
                        _Deadline(self.deadline),
                        "list",
                    )
                except Exception:  # noqa: BLE001 - counted and logged; the next sweep tries again
                    log.warning("reconciler: listing prefix %r failed", prefix, exc_info=True)
                    self._count(s, "errors")
                    break
                for op in page.operations:
                    if stop is not None and stop.is_set():
                        break
                    if _owner(prefixes, op.key) != prefix:
                        continue  # a longer prefix's hook handles it
                    self._count(s, "seen")
                    try:
                        what = self._one(op.key, self.hooks[prefix], stop)
                    except Exception:  # noqa: BLE001 - the record stays as it was (its lease handed back)
                        log.warning("reconciler: key %s failed; the record stays as it was", op.key, exc_info=True)
                        what = "errors"
                    self._count(s, what)
                if page.next is None:
                    break
                after = page.next
        return self._done(s)

    def _one(self, key: str, hook: ReconcileHook | MiddlewareHook, stop: threading.Event | None) -> str:
        dl = _Deadline(self.deadline)
        try:
            rec = _retry(lambda: self.client.get(key), dl, "get")
        except NotFound:
            return "skipped"
        if not rec.reconcile_required:
            log.debug("reconciler: key %s no longer requires reconciliation", key)
            return "skipped"
        who = self._worker_of(key, rec, hook)
        if who is None:
            return "errors"
        worker, mw = who
        principal = str(rec.reservation["principal"])
        fp, binding = _binding(rec, _retry(lambda: self.client.principal(principal), dl, "principal"))
        cid = new_claim_id()  # a claim whose answer was lost is retried with it: the same grant
        dec = _retry(
            lambda: self.client.claim(
                key, fp, binding, lease_ms=self.lease_ms, worker=worker, marks_dispatch=True, claim_id=cid
            ),
            dl,
            "claim",
        )
        if not isinstance(dec, Grant):
            log.debug("reconciler: key %s answered %s; skipped", key, dec.decision)
            return "skipped"
        if dec.decision == "execute":
            # Resolved meanwhile: the reconciler never executes.
            self._release(key, dec.fence)
            log.info("reconciler: key %s was resolved meanwhile; lease handed back", key)
            return "skipped"
        if isinstance(hook, MiddlewareHook):
            assert mw is not None
            mwhook, told = hook, mw

            def ask(k: str, fence: int) -> Finding:
                return mwhook.finding(mwhook.hook(k, fence, told), k)

            run: ReconcileHook = ask
        else:
            run = hook
        try:
            found = _reconcile_sync(
                self.client, key, dec, fp, binding, self.lease_ms, dl, run, self.default, self.hook_timeout, stop
            )
        except ReconcileRequired:
            log.info("reconciler: key %s: the hook cannot tell (fence %d); it stays unknown", key, dec.fence)
            return "unavailable"
        if isinstance(found, RunResult):
            log.info("reconciler: key %s committed (fence %d, %s)", key, dec.fence, found.outcome.status)
            return "committed"
        self._release(key, found.fence)
        log.info("reconciler: key %s not committed (fence %d); the next claim executes", key, found.fence)
        return "not_committed"

    def _release(self, key: str, fence: int) -> None:
        try:
            _retry(lambda: self.client.release(key, fence, "not_dispatched"), _Deadline(self.deadline), "release")
        except (StaleFence, LeaseExpired):
            pass  # the lease already ended
        except Exception:  # noqa: BLE001 - nothing was dispatched: the lease lapses without a flag
            log.warning("reconciler: release of key %s failed; its lease lapses", key, exc_info=True)

    # -- background -----------------------------------------------------------

    @property
    def running(self) -> bool:
        """A background loop runs (or a stopped one has not ended yet)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval: float = 60.0) -> None:
        """Sweep now and then every ``interval`` seconds in a daemon thread,
        until ``stop()``. ``RuntimeError`` while a loop runs — also one
        whose ``stop()`` timed out and that has not ended yet."""
        if self.running:
            raise RuntimeError("this Reconciler is already running (stop() it, and let it end, first)")
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(interval, self._stop), daemon=True, name="settle-reconciler"
        )
        self._thread.start()

    def _loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._sweep(stop)
            except Exception:  # noqa: BLE001 - sweep counts its failures; this is a bug guard
                log.exception("reconciler: sweep failed")
            stop.wait(interval)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the background sweeps: a hook running is abandoned (its
        record's lease handed back with ``reconcile(unavailable)``; a thread
        cannot be interrupted, so the hook itself finishes on its own), and
        the loop ends. Waits at most ``timeout`` seconds (None: until it
        ended); True when the loop has ended."""
        self._stop.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        if t.is_alive():
            return False
        self._thread = None
        return True

    def __enter__(self) -> Reconciler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncReconciler(_Base):
    """The asyncio twin of ``Reconciler``: an ``AsyncClient``, ``async def``
    hooks (or ``MiddlewareHook``, whose hook may be either), ``await
    sweep()``, ``start(interval)`` (a task of the running loop) and ``await
    stop(timeout)``. A hook past ``hook_timeout`` is cancelled."""

    def __init__(
        self,
        client: AsyncClient,
        hooks: Mapping[str, AsyncReconcileHook | MiddlewareHook],
        *,
        lease_ms: int = 30000,
        deadline: float = 10.0,
        page_size: int = 100,
        worker: str = WORKER_LABEL,
        default: Serializer | None = None,
        hook_timeout: float | None = None,
    ) -> None:
        super().__init__(hooks, lease_ms, deadline, page_size, worker, hook_timeout)
        self.client = client
        self.default = default
        self._task: asyncio.Task[None] | None = None
        # Set by stop() besides the cancellation: Python 3.10/3.11's
        # asyncio.wait_for can swallow a cancellation that arrives as the
        # awaited hook completes, and the loop must end all the same.
        self._stopping = False

    async def sweep(self) -> dict[str, int]:
        s = _zero()
        prefixes = list(self.hooks)
        for prefix in prefixes:
            after: str | None = None
            while True:
                try:
                    page = await _aretry(
                        lambda: self.client.list(
                            reconcile_required=True, key_prefix=prefix or None, limit=self.page_size, after=after
                        ),
                        _Deadline(self.deadline),
                        "list",
                    )
                except Exception:  # noqa: BLE001
                    log.warning("reconciler: listing prefix %r failed", prefix, exc_info=True)
                    self._count(s, "errors")
                    break
                for op in page.operations:
                    if _owner(prefixes, op.key) != prefix:
                        continue
                    self._count(s, "seen")
                    try:
                        what = await self._one(op.key, self.hooks[prefix])
                    except Exception:  # noqa: BLE001
                        log.warning("reconciler: key %s failed; the record stays as it was", op.key, exc_info=True)
                        what = "errors"
                    self._count(s, what)
                if page.next is None:
                    break
                after = page.next
        return self._done(s)

    async def _one(self, key: str, hook: AsyncReconcileHook | MiddlewareHook) -> str:
        dl = _Deadline(self.deadline)
        try:
            rec = await _aretry(lambda: self.client.get(key), dl, "get")
        except NotFound:
            return "skipped"
        if not rec.reconcile_required:
            log.debug("reconciler: key %s no longer requires reconciliation", key)
            return "skipped"
        who = self._worker_of(key, rec, hook)
        if who is None:
            return "errors"
        worker, mw = who
        principal = str(rec.reservation["principal"])
        fp, binding = _binding(rec, await _aretry(lambda: self.client.principal(principal), dl, "principal"))
        cid = new_claim_id()
        dec = await _aretry(
            lambda: self.client.claim(
                key, fp, binding, lease_ms=self.lease_ms, worker=worker, marks_dispatch=True, claim_id=cid
            ),
            dl,
            "claim",
        )
        if not isinstance(dec, Grant):
            log.debug("reconciler: key %s answered %s; skipped", key, dec.decision)
            return "skipped"
        if dec.decision == "execute":
            await self._release(key, dec.fence)
            log.info("reconciler: key %s was resolved meanwhile; lease handed back", key)
            return "skipped"
        run: Callable[[str, int], Any]
        if isinstance(hook, MiddlewareHook):
            assert mw is not None
            mwhook, told, bound = hook, mw, self.hook_timeout

            async def ask(k: str, fence: int) -> Finding:
                found = await call_hook_async(mwhook.hook, (k, fence, told), bound)
                return mwhook.finding(found, k)

            run = ask
        else:
            run = hook
        try:
            found = await _reconcile_async(
                self.client, key, dec, fp, binding, self.lease_ms, dl, run, self.default, self.hook_timeout
            )
        except ReconcileRequired:
            log.info("reconciler: key %s: the hook cannot tell (fence %d); it stays unknown", key, dec.fence)
            return "unavailable"
        if isinstance(found, RunResult):
            log.info("reconciler: key %s committed (fence %d, %s)", key, dec.fence, found.outcome.status)
            return "committed"
        await self._release(key, found.fence)
        log.info("reconciler: key %s not committed (fence %d); the next claim executes", key, found.fence)
        return "not_committed"

    async def _release(self, key: str, fence: int) -> None:
        try:
            await _aretry(lambda: self.client.release(key, fence, "not_dispatched"), _Deadline(self.deadline), "release")
        except (StaleFence, LeaseExpired):
            pass
        except Exception:  # noqa: BLE001
            log.warning("reconciler: release of key %s failed; its lease lapses", key, exc_info=True)

    @property
    def running(self) -> bool:
        """A background task runs (or a stopped one has not ended yet)."""
        return self._task is not None and not self._task.done()

    def start(self, interval: float = 60.0) -> None:
        """Sweep now and then every ``interval`` seconds in a task of the
        running event loop, until ``await stop()``. ``RuntimeError`` while a
        task runs — also one whose ``stop()`` timed out and that has not
        ended yet."""
        if self.running:
            raise RuntimeError("this AsyncReconciler is already running (stop() it, and let it end, first)")
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._loop(interval), name="settle-reconciler")

    async def _loop(self, interval: float) -> None:
        while not self._stopping:
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001
                log.exception("reconciler: sweep failed")
            if self._stopping:
                break
            await asyncio.sleep(interval)

    async def stop(self, timeout: float | None = None) -> bool:
        """Cancel the background task (a hook running is cancelled and its
        record's lease handed back with ``reconcile(unavailable)``) and wait
        at most ``timeout`` seconds (None: until it ended) for it to end;
        True when it has ended."""
        t = self._task
        if t is None:
            return True
        self._stopping = True
        t.cancel()
        # Not `await t` in a try/except CancelledError: that would also
        # swallow a cancellation of the task calling stop().
        done, _ = await asyncio.wait({t}, timeout=timeout)
        if not done:
            return False
        self._task = None
        return True
