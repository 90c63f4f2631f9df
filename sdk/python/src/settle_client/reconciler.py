"""``Reconciler`` and ``AsyncReconciler`` (SPEC §11.10): turn records left
``unknown`` (reconcile required) into the truth, without a human, wherever
a hook can tell.

    r = Reconciler(client, hooks={"charge-": psp_hook})   # the hook run_once takes
    r.sweep()          # {"seen", "committed", "not_committed", "unavailable", "skipped", "errors"}
    r.start(interval=60.0); ...; r.stop()                  # in a background thread

For each key prefix, ``sweep()`` pages ``GET
/v1/operations?reconcile_required=true&key_prefix=P``, reads each record,
and claims it with the stored fingerprint, principal and scopes, the
principal's current generation and ``marks_dispatch``. On a ``reconcile``
grant it asks the prefix's hook (key, fence → ``Done(...)``,
``"not_committed"`` or ``"unavailable"``) and reports the finding; after
``not_committed`` it hands the execute lease it is given back with
``release(not_dispatched)`` (it never dispatched: the next claim of a worker
that holds the request executes). On an ``execute`` grant (someone resolved
the record meanwhile) it releases ``not_dispatched``; any other answer is
skipped. A reconciler never runs effects (it does not hold the requests) and
never guesses: a record whose hook cannot tell stays ``unknown``.

A key that several prefixes match is handled once per sweep, by the hook of
the longest matching prefix. Every resolution is logged (logger
``settle_client.reconciler``) and counted in ``counts`` (totals since the
reconciler was made).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from .client import AsyncClient, Client
from .errors import LeaseExpired, NotFound, ReconcileRequired, StaleFence
from .types import Binding, Grant, Record
from .worker import (
    AsyncReconcileHook,
    ReconcileHook,
    RunResult,
    Serializer,
    _aretry,
    _Deadline,
    _reconcile_async,
    _reconcile_sync,
    _retry,
)

__all__ = ["Reconciler", "AsyncReconciler", "COUNT_NAMES", "WORKER_LABEL"]

log = logging.getLogger("settle_client.reconciler")

COUNT_NAMES = ("seen", "committed", "not_committed", "unavailable", "skipped", "errors")
"""The keys of a sweep's counts (SPEC §11.10)."""

WORKER_LABEL = "settle-reconciler"
"""The claim's ``worker`` field, for operators."""


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


class _Base:
    def __init__(self, hooks: Mapping[str, Any], lease_ms: int, deadline: float, page_size: int, worker: str) -> None:
        if not hooks:
            raise ValueError("a Reconciler needs at least one hook: hooks={key_prefix: hook} ('' for every key)")
        for p, h in hooks.items():
            if not isinstance(p, str) or not callable(h):
                raise TypeError("hooks maps a key prefix (str) to a reconcile hook (key, fence) -> finding")
        self.hooks = dict(hooks)
        self.lease_ms = lease_ms
        self.deadline = deadline
        self.page_size = page_size
        self.worker = worker
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


class Reconciler(_Base):
    """SPEC §11.10 over a synchronous ``Client``: ``hooks`` maps key
    prefixes (``""``: every key) to reconcile hooks (the type ``run_once``
    takes: ``(key, fence) -> Done(...) | "not_committed" | "unavailable"``).
    ``lease_ms``: the reconcile lease (heartbeated while a hook runs);
    ``deadline``: seconds each ledger call is retried (no answer, 503, 429);
    ``default``: the serializer of a hook's ``Done`` result, as in
    ``run_once``."""

    def __init__(
        self,
        client: Client,
        hooks: Mapping[str, ReconcileHook],
        *,
        lease_ms: int = 30000,
        deadline: float = 10.0,
        page_size: int = 100,
        worker: str = WORKER_LABEL,
        default: Serializer | None = None,
    ) -> None:
        super().__init__(hooks, lease_ms, deadline, page_size, worker)
        self.client = client
        self.default = default
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> dict[str, int]:
        """One pass over every prefix: the counts ``{seen, committed,
        not_committed, unavailable, skipped, errors}`` of this pass. Never
        raises for a record or a listing that fails (counted in
        ``errors``, logged)."""
        s = _zero()
        prefixes = list(self.hooks)
        for prefix in prefixes:
            after: str | None = None
            while True:
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
                    if _owner(prefixes, op.key) != prefix:
                        continue  # a longer prefix's hook handles it
                    self._count(s, "seen")
                    try:
                        what = self._one(op.key, self.hooks[prefix])
                    except Exception:  # noqa: BLE001 - the record stays as it was
                        log.warning("reconciler: key %s failed; the record stays as it was", op.key, exc_info=True)
                        what = "errors"
                    self._count(s, what)
                if page.next is None:
                    break
                after = page.next
        return self._done(s)

    def _one(self, key: str, hook: ReconcileHook) -> str:
        dl = _Deadline(self.deadline)
        try:
            rec = _retry(lambda: self.client.get(key), dl, "get")
        except NotFound:
            return "skipped"
        if not rec.reconcile_required:
            log.debug("reconciler: key %s no longer requires reconciliation", key)
            return "skipped"
        principal = str(rec.reservation["principal"])
        fp, binding = _binding(rec, _retry(lambda: self.client.principal(principal), dl, "principal"))
        dec = _retry(
            lambda: self.client.claim(key, fp, binding, lease_ms=self.lease_ms, worker=self.worker, marks_dispatch=True),
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
        try:
            found = _reconcile_sync(self.client, key, dec, fp, binding, self.lease_ms, dl, hook, self.default)
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
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval: float = 60.0) -> None:
        """Sweep now and then every ``interval`` seconds in a daemon thread,
        until ``stop()``."""
        if self.running:
            raise RuntimeError("this Reconciler is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True, name="settle-reconciler")
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - sweep counts its failures; this is a bug guard
                log.exception("reconciler: sweep failed")
            self._stop.wait(interval)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the background sweeps (waits for the one running)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)

    def __enter__(self) -> Reconciler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncReconciler(_Base):
    """The asyncio twin of ``Reconciler``: an ``AsyncClient``, ``async def``
    hooks, ``await sweep()``, ``start(interval)`` (a task of the running
    loop) and ``await stop()``."""

    def __init__(
        self,
        client: AsyncClient,
        hooks: Mapping[str, AsyncReconcileHook],
        *,
        lease_ms: int = 30000,
        deadline: float = 10.0,
        page_size: int = 100,
        worker: str = WORKER_LABEL,
        default: Serializer | None = None,
    ) -> None:
        super().__init__(hooks, lease_ms, deadline, page_size, worker)
        self.client = client
        self.default = default
        self._task: asyncio.Task[None] | None = None

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

    async def _one(self, key: str, hook: AsyncReconcileHook) -> str:
        dl = _Deadline(self.deadline)
        try:
            rec = await _aretry(lambda: self.client.get(key), dl, "get")
        except NotFound:
            return "skipped"
        if not rec.reconcile_required:
            log.debug("reconciler: key %s no longer requires reconciliation", key)
            return "skipped"
        principal = str(rec.reservation["principal"])
        fp, binding = _binding(rec, await _aretry(lambda: self.client.principal(principal), dl, "principal"))
        dec = await _aretry(
            lambda: self.client.claim(key, fp, binding, lease_ms=self.lease_ms, worker=self.worker, marks_dispatch=True),
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
        try:
            found = await _reconcile_async(self.client, key, dec, fp, binding, self.lease_ms, dl, hook, self.default)
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
        return self._task is not None and not self._task.done()

    def start(self, interval: float = 60.0) -> None:
        """Sweep now and then every ``interval`` seconds in a task of the
        running event loop, until ``await stop()``."""
        if self.running:
            raise RuntimeError("this AsyncReconciler is already running")
        self._task = asyncio.get_running_loop().create_task(self._loop(interval), name="settle-reconciler")

    async def _loop(self, interval: float) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001
                log.exception("reconciler: sweep failed")
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        """Cancel the background task (a sweep in progress stops at its next
        ledger call; a record it was resolving stays as the ledger has it:
        a held reconcile lease lapses)."""
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            # Not `await t` in a try/except CancelledError: that would also
            # swallow a cancellation of the task calling stop().
            await asyncio.wait({t})
