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
from settle_client.errors import LedgerClosed, NotFound
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


class _Recording:
    """A native ledger that notes the thread of each call."""

    def __init__(self, native: Any) -> None:
        self.native = native
        self.durable = native.durable
        self.threads: list[int] = []

    def exchange(self, *a: Any) -> Any:
        self.threads.append(threading.get_ident())
        return self.native.exchange(*a)


def _async_run(ledger: LocalLedger, key: str) -> tuple[int, Any]:
    async def main() -> tuple[int, Any]:
        async def effect(ctx: Any) -> Done:
            return Done({"n": 1})

        loop_thread = threading.get_ident()
        r = await run_once_async(ledger.aio, key, {"n": 1}, effect, principal="svc")
        return loop_thread, r

    return asyncio.run(main())


def test_the_async_view_waits_for_the_disk_off_the_event_loop(tmp_path: Path) -> None:
    ledger = LocalLedger(data=tmp_path / "d")
    rec = _Recording(ledger._native)
    ledger.aio._native = rec  # type: ignore[attr-defined]
    loop_thread, r = _async_run(ledger, "async-1")
    assert r.outcome.result == {"n": 1} and not r.replayed
    assert rec.threads and loop_thread not in rec.threads
    # The sync face sees what the async one wrote: one ledger.
    assert ledger.get("async-1").status == "completed"
    ledger.close()


def test_in_memory_the_async_view_calls_in_place() -> None:
    # A call on the in-memory store never waits: no executor hop for it.
    with LocalLedger() as ledger:
        rec = _Recording(ledger._native)
        ledger.aio._native = rec  # type: ignore[attr-defined]
        loop_thread, r = _async_run(ledger, "async-2")
        assert r.outcome.result == {"n": 1}
        assert rec.threads and set(rec.threads) == {loop_thread}


def test_segment_bytes_sizes_a_new_directory(tmp_path: Path) -> None:
    def size(d: Path) -> int:  # the blocks taken, as du counts them (the index's journal is sparse)
        return sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())

    with LocalLedger(data=tmp_path / "default"):
        pass
    with LocalLedger(data=tmp_path / "small", segment_bytes=65536):
        pass
    # Two segments are preallocated: 4 MiB ones by default (settle serve: 64 MiB).
    assert size(tmp_path / "default") < 16 * 1024 * 1024
    assert size(tmp_path / "small") < 1024 * 1024
    with pytest.raises(ValueError, match="segment_bytes"):
        LocalLedger(data=tmp_path / "bad", segment_bytes=100)


def test_a_closed_ledger_fails_at_once_and_is_never_retried(tmp_path: Path) -> None:
    for ledger in (LocalLedger(), LocalLedger(data=tmp_path / "d")):
        ledger.close()
        # Retried until the deadline, this would be DeadlineExceeded.
        with pytest.raises(LedgerClosed, match="closed"):
            run_once(ledger, "after-close", {"n": 1}, lambda ctx: Done({"n": 1}), principal="svc", deadline=60)
        with pytest.raises(LedgerClosed):
            ledger.get("after-close")

        async def main(led: LocalLedger = ledger) -> None:
            async def effect(ctx: Any) -> Done:
                return Done({"n": 1})

            await run_once_async(led.aio, "after-close", {"n": 1}, effect, principal="svc", deadline=60)

        with pytest.raises(LedgerClosed):
            asyncio.run(main())
        ledger.close()  # twice: nothing


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
