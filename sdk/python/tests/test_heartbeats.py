"""Heartbeats are scheduled by the process's one timer (``_Beats``): many
leases at once are kept alive without a thread per run."""

from __future__ import annotations

import threading
import uuid

from settle_client import Client, Done, EffectContext, run_once
from settle_client.worker import _Beats

RUNS = 12


def _heartbeat_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("settle-heartbeat")}


def test_many_leases_at_once_share_one_scheduler(client: Client) -> None:
    inside = threading.Barrier(RUNS + 1)
    leave = threading.Event()
    lost: list[bool] = []

    def effect(ctx: EffectContext) -> Done:
        inside.wait(10)
        # Longer than the lease (400 ms): only heartbeats keep it.
        lost.append(ctx.lease_lost.wait(1.2))
        leave.wait(10)
        return Done({"ok": True})

    results: list[str] = []

    def one() -> None:
        r = run_once(client, f"hb-{uuid.uuid4().hex}", {"n": 1}, effect, principal="p", lease_ms=400)
        results.append(r.receipt.status)

    runs = [threading.Thread(target=one) for _ in range(RUNS)]
    for t in runs:
        t.start()
    inside.wait(10)  # every run holds its lease now
    threads = _heartbeat_threads()
    leave.set()
    for t in runs:
        t.join(30)
    # The scheduler and its pool, however many leases are heartbeated.
    assert len(threads) <= _Beats.POOL + 1, sorted(threads)
    assert results == ["completed"] * RUNS
    assert lost == [False] * RUNS, "a lease was lost: the shared timer missed beats"
