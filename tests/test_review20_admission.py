"""Review 20: admission across runs, after a budget stop, and deadlines near year 9999.

* ``max_concurrent_work`` did not hold when the host canceled ``run()`` and ran the task
  again in the same runtime: the ended run released the permits of the node tasks it
  abandoned at once (a sync tool's thread, an async tool swallowing its cancellation), and
  the next run started with every permit free, so one node ran twice at the same moment
  with a capacity of 1. A canceled ``run()`` also ended at once with a sync tool still in
  its thread, instead of giving it the grace period the docs promise.
* A budget stop released the exhausted node's permit before rejecting the queue, so one
  more waiter was ``admitted`` after the ``exhausted`` event (never dispatched).
* A timezone-aware deadline just before the year 9999 that is after it in UTC raised a
  bare OverflowError.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlanLimits,
    RootLimits,
    ToolBinding,
)
from tests.conftest import wait_until


def fan_out(width: int) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="fan", version="1", limits=PlanLimits(max_concurrency=width),
                                 plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": f"n{i}", "binding": "work", "version": "1", "args": {"i": i}}
                  for i in range(width)]})


class Running:
    """How many calls of a tool run at once, at most, across threads and tasks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.calls = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


async def _cancel_then_run_again(runtime: ExecutionGraphRuntime, running: Running) -> float:
    """Cancel the first run() while its first tool runs; run the task again at once."""
    first = asyncio.ensure_future(runtime.run("k"))
    await wait_until(lambda: running.calls > 0, 10.0)
    first.cancel()
    began = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await first
    waited = time.monotonic() - began
    result = await runtime.run("k")
    assert result.status == "completed"
    return waited


async def test_a_sync_tool_still_running_after_run_was_canceled_keeps_its_permit(
        caplog: pytest.LogCaptureFixture) -> None:
    running = Running()

    def slow(args: dict[str, Any]) -> dict[str, Any]:
        running.enter()
        try:
            time.sleep(4.0)  # longer than the 3 s grace: the thread outlives the first run
        finally:
            running.leave()
        return {}

    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="work", version="1", execute=slow, recovery="pure")]))
    await runtime.create("k", fan_out(2), limits=RootLimits(max_concurrent_work=1))
    waited = await _cancel_then_run_again(runtime, running)
    assert running.peak == 1, "two calls ran at once with max_concurrent_work=1"
    assert waited >= 2.5  # the thread got its grace before run() gave it up
    assert "abandoned" in caplog.text
    assert running.calls == 3  # n0 twice (its first attempt was abandoned), n1 once


async def test_an_async_tool_ignoring_its_cancellation_keeps_its_permit_into_the_next_run(
        ) -> None:
    running = Running()

    async def stubborn(args: dict[str, Any]) -> dict[str, Any]:
        running.enter()
        try:
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                try:
                    await asyncio.sleep(end - time.monotonic())
                except asyncio.CancelledError:
                    continue  # swallowed: the tool goes on
        finally:
            running.leave()
        return {}

    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="work", version="1", execute=stubborn, recovery="pure")]))
    await runtime.create("k", fan_out(2), limits=RootLimits(max_concurrent_work=1))
    await _cancel_then_run_again(runtime, running)
    assert running.peak == 1
    assert not runtime._lingering  # released when the abandoned call really ended


async def test_a_budget_stop_admits_no_waiter_after_it() -> None:
    events: list[AdmissionEvent] = []

    async def work(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {}

    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="work", version="1", execute=work, recovery="pure")]),
        on_admission=events.append)
    await runtime.create("k", fan_out(50), budgets=Budgets(tool_calls=10),
                         limits=RootLimits(max_concurrent_work=20))
    with pytest.raises(BudgetExhaustedError):
        await runtime.run("k")
    kinds = [e.kind for e in events]
    stopped = kinds.index("exhausted")
    assert "admitted" not in kinds[stopped:], [(e.kind, e.node_id) for e in events[stopped:]]
    assert kinds.count("admitted") == kinds.count("released")
    assert (await runtime.inspect("k")).counters["tool_calls"] == 10


@pytest.mark.parametrize("deadline", [
    datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
    datetime.max.replace(tzinfo=timezone(timedelta(hours=-1))),
])
async def test_a_deadline_after_the_year_9999_in_utc_is_a_configuration_error(
        deadline: datetime) -> None:
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="work", version="1", execute=lambda args: {}, recovery="pure")]))
    with pytest.raises(ConfigurationError, match="after the year 9999 in UTC"):
        await runtime.create("k", fan_out(1), deadline=deadline)
    assert await runtime.store.get_header("k") is None
    ok = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)  # the same wall time in UTC is fine
    assert (await runtime.create("k", fan_out(1), deadline=ok)).status == "pending"
