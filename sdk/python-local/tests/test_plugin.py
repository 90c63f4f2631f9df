"""The pytest plugin's settle_ledger fixture (settle_client.testing) with
settle-local installed, as a project sees it: pytester runs the file in a
subprocess, so the plugin comes from its pytest11 entry point."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USES_THE_LEDGER = '''
import asyncio
import pytest
from settle_client import AsyncClient, Client, Done, run_once, run_once_async
from settle_client.errors import NotFound

def test_one(settle_ledger):
    assert isinstance(settle_ledger, Client)
    runs = []
    for _ in range(2):
        r = run_once(settle_ledger, "order-1", {"a": 1}, lambda ctx: runs.append(1) or Done({"ok": True}), principal="p")
    assert runs == [1] and r.replayed and r.value == {"ok": True}
    assert r.receipt.durable is False

def test_a_fresh_ledger_for_each_test(settle_ledger):
    with pytest.raises(NotFound):
        settle_ledger.get("order-1")

def test_its_async_view(settle_ledger):
    assert isinstance(settle_ledger.aio, AsyncClient)
    async def effect(ctx):
        return Done(2)
    async def go():
        return await run_once_async(settle_ledger.aio, "order-2", {"a": 2}, effect, principal="p")
    assert asyncio.run(go()).value == 2
'''


def test_settle_ledger_gives_each_test_a_fresh_in_process_ledger(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_app=USES_THE_LEDGER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
