"""Review 18: a deadline is enforced on the runtime's own clock, while nodes run and wait.

SPEC 12: the deadline is absolute and enforced at admission and during waits; SPEC 8:
recovery never extends it. A run that waited for its running nodes computed how long to
wait from the deadline *once*, and then waited that long on the event loop's monotonic
clock: when the runtime's clock (``clock=``, or the wall clock after a suspend or a clock
step) passed the deadline sooner, nothing noticed until the loop's wait ran out (60 s in
the test below instead of at the next lease renewal). The lease keeper now wakes the run
when a renewal finds the deadline passed, so it stops within ``poll_interval``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    DeadlineExceededError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    RootLimits,
    ToolBinding,
    tool_context,
)
from tests.conftest import INT_OUT, ManualClock, wait_until

WAIT = 5.0  # far below the 60 s a run waited before it noticed the deadline


class Hang:
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        ctx = tool_context()
        self.started.append((ctx.node_id, ctx.fence))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def setup(hang: Hang, clock: ManualClock, store: InMemoryDurableTaskStore,
          events: list[AdmissionEvent] | None = None) -> ExecutionGraphRuntime:
    catalog = HostCatalog([ToolBinding(id="hang", version="1", execute=hang.tool,
                                       recovery="pure", output_schema=INT_OUT)])
    return ExecutionGraphRuntime(catalog=catalog, store=store, clock=clock, lease_ttl=2,
                                 poll_interval=0.05, on_admission=events.append if
                                 events is not None else None,
                                 limits=RootLimits(max_concurrent_work=1))


PROGRAM = ExecutionGraphProgram(id="late", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": f"n{i}", "binding": "hang", "version": "1", "args": {}}
              for i in range(2)]})


async def test_a_deadline_passed_on_the_runtime_clock_stops_running_and_queued_work() -> None:
    hang, clock, events = Hang(), ManualClock(), []
    store = InMemoryDurableTaskStore()
    rt = setup(hang, clock, store, events)
    await rt.create("d", PROGRAM, deadline=timedelta(seconds=60))
    run = asyncio.create_task(rt.run("d", "w1"))
    await wait_until(lambda: hang.started == [("n0", 1)], WAIT)
    clock.advance(61)
    async with asyncio.timeout(WAIT):
        with pytest.raises(DeadlineExceededError):
            await run
    view = await rt.inspect("d")
    assert view.status == "failed" and view.error is not None
    assert view.error.code == "deadline_exceeded"
    assert {n: v.state for n, v in view.nodes.items()} == {"n0": "canceled", "n1": "canceled"}
    # n1 was waiting for the only permit: the deadline rejected it at admission.
    assert [(e.kind, e.node_id, e.reason) for e in events if e.node_id == "n1"] == [
        ("queued", "n1", None), ("rejected", "n1", "deadline")]


async def test_recovery_keeps_the_deadline_set_at_create() -> None:
    hang, clock = Hang(), ManualClock()
    store = InMemoryDurableTaskStore()
    first = setup(hang, clock, store)
    created = await first.create("r", PROGRAM, deadline=timedelta(seconds=60))
    assert created.deadline == clock.now + timedelta(seconds=60)
    run = asyncio.create_task(first.run("r", "w1"))
    await wait_until(lambda: hang.started == [("n0", 1)], WAIT)
    run.cancel()  # the worker goes away mid-run
    async with asyncio.timeout(WAIT):
        with pytest.raises(asyncio.CancelledError):
            await run
    clock.advance(50)
    second = setup(hang, clock, store)  # another worker of the same store
    recovering = asyncio.create_task(second.run("r", "w2"))
    await wait_until(lambda: ("n0", 2) in hang.started, WAIT)
    assert (await second.inspect("r")).deadline == created.deadline  # not 60 s from now
    clock.advance(11)
    async with asyncio.timeout(WAIT):
        with pytest.raises(DeadlineExceededError):
            await recovering
    error = (await second.inspect("r")).error
    assert error is not None and error.code == "deadline_exceeded"
