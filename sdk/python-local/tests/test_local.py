"""settle_local.LocalLedger: a Client (and, as .aio, an AsyncClient) over
settle in this process. The SDK's whole scenario suite also runs on it
(SETTLE_TEST_LEDGER=local, sdk/test.sh); these tests pin what is particular
to the local ledger: durability, the directory lock, closing, threads."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from settle_client import AsyncClient, Binding, Client, Done, Grant, run_once, run_once_async
from settle_client.errors import NotFound
from settle_local import LocalLedger


def test_is_a_client_and_in_memory_receipts_are_not_durable() -> None:
    with LocalLedger() as ledger:
        assert isinstance(ledger, Client) and isinstance(ledger.aio, AsyncClient)
        assert ledger.durable is False
        calls: list[int] = []

        def effect(ctx: Any) -> Done:
            calls.append(ctx.fence)
            return Done({"charged": 10})

        first = run_once(ledger, "order-1", {"amount": 10}, effect, principal="svc")
        again = run_once(ledger, "order-1", {"amount": 10}, effect, principal="svc")
        assert len(calls) == 1 and not first.replayed and again.replayed
        assert again.outcome.result == {"charged": 10}
        assert first.receipt.durable is False and again.receipt.durable is False
        assert ledger.get("order-1").status == "completed"


def test_on_disk_it_is_durable_locked_and_survives_reopening(tmp_path: Path) -> None:
    data = tmp_path / "settle-data"
    ledger = LocalLedger(data=data)
    assert ledger.durable is True
    r = run_once(ledger, "order-2", {"amount": 5}, lambda ctx: Done({"ok": True}), principal="svc")
    assert r.receipt.durable is True
    with pytest.raises(OSError, match="settle data directory"):
        LocalLedger(data=data)  # one process (one ledger) per directory
    ledger.close()
    with pytest.raises(RuntimeError, match="closed"):
        ledger._native.request("GET", "/v1/stats", [], b"")

    reopened = LocalLedger(data=str(data))
    try:
        replay = run_once(reopened, "order-2", {"amount": 5}, lambda ctx: Done({"ok": False}), principal="svc")
        assert replay.replayed and replay.outcome.result == {"ok": True}
        with pytest.raises(NotFound):
            reopened.get("never-claimed")
    finally:
        reopened.close()


def test_the_async_view_runs_the_ledger_off_the_event_loop() -> None:
    ledger = LocalLedger()
    threads: list[int] = []
    native = ledger._native

    class Recording:
        durable = native.durable

        def request(self, *a: Any) -> Any:
            threads.append(threading.get_ident())
            return native.request(*a)

        def close(self) -> None:
            native.close()

    ledger.aio._transport._native = Recording()  # type: ignore[union-attr]

    async def main() -> tuple[int, Any]:
        async def effect(ctx: Any) -> Done:
            return Done({"n": 1})

        loop_thread = threading.get_ident()
        r = await run_once_async(ledger.aio, "async-1", {"n": 1}, effect, principal="svc")
        return loop_thread, r

    loop_thread, r = asyncio.run(main())
    assert r.outcome.result == {"n": 1} and not r.replayed
    assert threads and loop_thread not in threads
    # The sync face sees what the async one wrote: one ledger.
    assert ledger.get("async-1").status == "completed"
    ledger.close()


def test_threads_share_one_ledger() -> None:
    with LocalLedger() as ledger:
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                g = ledger.claim(f"t-{i}", "a" * 64, Binding("svc"))
                assert isinstance(g, Grant)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
        assert ledger.stats().by_status["running"] == 16
