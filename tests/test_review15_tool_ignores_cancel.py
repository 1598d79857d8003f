"""Review 15: a tool that swallows cancellation cannot hold ``run()`` open.

When a run ends abnormally (its lease was lost, or ``run()`` itself was canceled) it
cancels the node tasks it leaves behind. An async tool that catches ``CancelledError`` and
keeps waiting used to hold ``run()`` forever there (the run gathered its tasks without a
bound). Now they get a bounded grace, a task still running is abandoned with a warning
naming it, and whatever it returns later is ignored.

Every run is awaited under ``asyncio.wait_for`` with a generous limit, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    StaleFenceError,
    ToolBinding,
)
from agentium_graph.runtime import _abandon
from tests.conftest import LosableLease

HANG_LIMIT = 30.0  # seconds: far beyond the grace; reaching it means run() hung
LOGGER = "agentium_graph.runtime"


class Stubborn:
    """An async tool that ignores cancellation until released (or one that honors it)."""

    def __init__(self, *, swallows: bool) -> None:
        self.swallows = swallows
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = asyncio.Event()
        self.canceled = 0

    async def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        self.started.set()
        try:
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.canceled += 1
                    if not self.swallows:
                        raise
        finally:
            self.finished.set()
        return {"late": True}


def runtime(tool: Stubborn, store: InMemoryDurableTaskStore) -> ExecutionGraphRuntime:
    catalog = HostCatalog([ToolBinding(id="stubborn", version="1", execute=tool,
                                       recovery="pure")])
    return ExecutionGraphRuntime(catalog=catalog, store=store, poll_interval=0.05)


PROGRAM = ExecutionGraphProgram(id="p", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": "a", "binding": "stubborn", "version": "1", "args": {}}]})


def abandoned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and "abandoned" in
            r.getMessage()]


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.1)


@pytest.mark.parametrize("swallows", [True, False])
async def test_a_lost_lease_ends_the_run_whatever_the_tool_does_with_the_cancel(
        swallows: bool, caplog: pytest.LogCaptureFixture) -> None:
    tool = Stubborn(swallows=swallows)
    store = LosableLease()
    rt = runtime(tool, store)
    await rt.create("k", PROGRAM)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    running = asyncio.create_task(rt.run("k", "w1"))
    try:
        await asyncio.wait_for(tool.started.wait(), HANG_LIMIT)
        store.lose = True
        with pytest.raises(StaleFenceError):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert tool.canceled >= 1
        warnings = abandoned(caplog)
        assert bool(warnings) == swallows
        if swallows:
            assert "'k'" in warnings[0] and "node" in warnings[0].lower()

        # Released at last, the abandoned tool returns: its result is not recorded.
        before = await rt.inspect("k")
        tool.release.set()
        await asyncio.wait_for(tool.finished.wait(), HANG_LIMIT)
        await asyncio.sleep(0.05)
        after = await rt.inspect("k")
        assert after.nodes["a"].state == before.nodes["a"].state != "completed"
        assert after.journal_length == before.journal_length
    finally:
        tool.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_canceling_run_itself_ends_it_though_a_tool_swallows_the_cancel(
        caplog: pytest.LogCaptureFixture) -> None:
    tool = Stubborn(swallows=True)
    rt = runtime(tool, InMemoryDurableTaskStore())
    await rt.create("k", PROGRAM)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    running = asyncio.create_task(rt.run("k", "w1"))
    try:
        await asyncio.wait_for(tool.started.wait(), HANG_LIMIT)
        running.cancel()
        done, _ = await asyncio.wait({running}, timeout=HANG_LIMIT)
        assert done, "run() hung on a tool that swallows cancellation"
        assert running.cancelled()
        assert abandoned(caplog)
    finally:
        tool.release.set()
        await asyncio.wait_for(tool.finished.wait(), HANG_LIMIT)
