"""Review 18: root admission events stay consistent when a run ends abnormally.

SPEC 10: the admission controller reports ``queued``, ``admitted``, ``released``,
``exhausted`` and ``rejected`` to ``on_admission``. Every permit that was admitted is
released exactly once and every request that queued is either admitted or rejected, also
when a run does not end through a stop of its own: the host cancels the ``run()`` call, a
commit finds the lease taken over by another worker, or the store fails a commit. Such a run
released the permits of its running nodes while its queue was still open, so the next
waiter was admitted after the run was over (an ``admitted`` that was never ``released``,
a permit nobody holds) and the waiters behind it stayed ``queued`` for ever.

Every wait is bounded (``asyncio.timeout``), so a hang fails a test instead of blocking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    RootLimits,
    StaleFenceError,
    StoreUnavailableError,
    ToolBinding,
    tool_context,
)
from agentium_graph.store import CommitRequest, CommitResult
from tests.conftest import INT_OUT, ManualClock, wait_until

WAIT = 10.0


def check_permits(events: Iterable[AdmissionEvent]) -> None:
    """Every ``queued`` request is then admitted or rejected, every ``admitted`` permit is
    released exactly once, and nothing is admitted or released twice in a row."""
    state: dict[str | None, str] = {}
    for event in events:
        now = state.get(event.node_id)
        if event.kind == "queued":
            assert now in (None, "released", "rejected"), (event, now)
            state[event.node_id] = "queued"
        elif event.kind == "admitted":
            assert now in (None, "queued", "released", "rejected"), (event, now)
            state[event.node_id] = "admitted"
        elif event.kind == "released":
            assert now == "admitted", (event, now)
            state[event.node_id] = "released"
        elif event.kind == "rejected":
            assert now in (None, "queued"), (event, now)
            state[event.node_id] = "rejected"
    open_ = {node: s for node, s in state.items() if s in ("queued", "admitted")}
    assert open_ == {}, f"permits left open: {open_}"


class Gate:
    """Async tools that record what started (by worker) and wait until opened."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.started: list[tuple[str, str]] = []

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        ctx = tool_context()
        self.started.append((ctx.worker_id, ctx.node_id))
        await self.opened.wait()
        return {"value": 1}


def catalog(gate: Gate) -> HostCatalog:
    return HostCatalog([ToolBinding(id="gate", version="1", execute=gate.tool,
                                    recovery="pure", output_schema=INT_OUT)])


def wide(n: int) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="wide", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": f"n{i}", "binding": "gate", "version": "1", "args": {}}
                  for i in range(n)]})


async def test_a_run_the_host_cancels_admits_nothing_more_and_rejects_its_waiters() -> None:
    gate = Gate()
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=catalog(gate), on_admission=events.append,
                               limits=RootLimits(max_concurrent_work=1))
    await rt.create("k", wide(3))
    run = asyncio.create_task(rt.run("k", "w1"))
    await wait_until(lambda: len(gate.started) == 1, WAIT)
    run.cancel()
    async with asyncio.timeout(WAIT):
        with pytest.raises(asyncio.CancelledError):
            await run
    seen = list(events)
    check_permits(seen)
    # Only n0 ever held a permit: the others were waiting when the run was canceled.
    assert [e.node_id for e in seen if e.kind == "admitted"] == ["n0"]
    assert sorted(e.node_id for e in seen if e.kind == "rejected") == ["n1", "n2"]
    gate.opened.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert events == seen  # nothing is reported for a run that is over
    snapshot = await rt.admission_snapshot("k")
    assert (snapshot.active, snapshot.queued) == (0, 0)


async def test_a_run_whose_commit_finds_its_lease_taken_over_closes_its_queue() -> None:
    gate = Gate()
    clock = ManualClock()
    store = InMemoryDurableTaskStore()
    first_events: list[AdmissionEvent] = []
    # The first worker renews its lease rarely: the lease expires (on the shared clock)
    # before it does, and another worker takes the task over.
    first = ExecutionGraphRuntime(catalog=catalog(gate), store=store, clock=clock,
                                  lease_ttl=3, poll_interval=2.9,
                                  on_admission=first_events.append,
                                  limits=RootLimits(max_concurrent_work=1))
    second = ExecutionGraphRuntime(catalog=catalog(gate), store=store, clock=clock,
                                   lease_ttl=3, poll_interval=0.5)
    await first.create("k", wide(3))
    run1 = asyncio.create_task(first.run("k", "w1"))
    await wait_until(lambda: len(gate.started) == 1, WAIT)
    clock.advance(10)
    run2 = asyncio.create_task(second.run("k", "w2"))
    await wait_until(lambda: ("w2", "n0") in gate.started, WAIT)
    gate.opened.set()  # w1's n0 completes: its commit finds fence 2
    async with asyncio.timeout(WAIT):
        with pytest.raises(StaleFenceError):
            await run1
        result = await run2
    assert result.status == "completed"
    seen = list(first_events)
    check_permits(seen)
    for _ in range(3):
        await asyncio.sleep(0)
    assert first_events == seen  # nothing is reported for a run that is over


class FailingCommits(InMemoryDurableTaskStore):
    """Fails every commit once ``fail`` is set, as a store that went away does."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.fail:
            raise StoreUnavailableError("the database went away")
        return await super().commit(request)


async def test_a_run_ended_by_a_store_failure_closes_its_queue() -> None:
    gate = Gate()
    store = FailingCommits()
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=catalog(gate), store=store,
                               on_admission=events.append,
                               limits=RootLimits(max_concurrent_work=1))
    await rt.create("k", wide(3))
    run = asyncio.create_task(rt.run("k", "w1"))
    await wait_until(lambda: len(gate.started) == 1, WAIT)
    store.fail = True
    gate.opened.set()
    async with asyncio.timeout(WAIT):
        with pytest.raises(StoreUnavailableError):
            await run
    seen = list(events)
    check_permits(seen)
    for _ in range(3):
        await asyncio.sleep(0)
    assert events == seen  # nothing is reported for a run that is over
    snapshot = await rt.admission_snapshot("k")
    assert (snapshot.active, snapshot.queued) == (0, 0)
