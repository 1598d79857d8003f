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
The seeded mixes at the end (40 seeds; ``REVIEW18_DEEP=1``: 300) stop runs of tools,
effects and agents at random points; before the fix 5 of the 40 seeds (39 of 300) left permits
open, all of them runs the host canceled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Iterable
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    AdmissionEvent,
    Agent,
    AgentBinding,
    AgentiumGraphError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    RootLimits,
    StaleFenceError,
    StoreUnavailableError,
    ToolBinding,
    Unknown,
    tool_context,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall
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


# --- seeded mixes of tools, effects and agents, stopped at random points ---------------

SEEDS = range(300 if os.environ.get("REVIEW18_DEEP") else 40)


class Mix:
    """The work of one seeded scenario: tools that may fail, an idempotent connector whose
    dispatch may fail and whose lookup may not tell, and how much of it runs at once."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.now = 0
        self.most = 0

    async def busy(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.rnd.random() * 0.005)
        finally:
            self.now -= 1

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        await self.busy()
        if self.rnd.random() < 0.1:
            raise RuntimeError("the tool broke")
        return {"value": 1}


class MixConnector:
    id = "mix-pay"
    version = "1"
    idempotent_destination = True

    def __init__(self, mix: Mix) -> None:
        self.mix = mix

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        await self.mix.busy()
        if self.mix.rnd.random() < 0.3:
            raise ConnectionError("the destination hung up")
        return ActionOutcome(output={"value": 1}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> Absent | Unknown:
        await asyncio.sleep(0)
        return Absent() if self.mix.rnd.random() < 0.5 else Unknown("no answer")


@pytest.mark.parametrize("seed", SEEDS)
async def test_permits_stay_consistent_whatever_stops_a_mixed_run(seed: int) -> None:
    rnd = random.Random(seed)
    mix = Mix(rnd)
    turns = [ScriptedTurn(tool_calls=(ToolCall(id="c1", name="t", arguments={}),)),
             ScriptedTurn(text="done")] * 3
    catalog = HostCatalog([
        ToolBinding(id="t", version="1", execute=mix.tool, recovery="pure",
                    output_schema=INT_OUT),
        ToolBinding(id="e", version="1", connector=MixConnector(mix), destination="d",
                    output_schema=INT_OUT),
        AgentBinding(id="ag", version="1", agent=Agent(ScriptedProvider(turns), "use t",
                                                       tools=("t",)))])
    kinds = [rnd.choice(["t", "t", "e", "ag"]) for _ in range(rnd.randint(2, 6))]
    capacity = rnd.randint(1, 2)
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=catalog, on_admission=events.append, lookup_attempts=1,
                               limits=RootLimits(max_concurrent_work=capacity))
    await rt.create("k", ExecutionGraphProgram(id="mix", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": f"n{i}", "binding": k, "version": "1", "args": {}}
                  for i, k in enumerate(kinds)]}), budgets=Budgets(tool_calls=rnd.randint(1, 8)))
    run = asyncio.create_task(rt.run("k", "w1"))
    stop = rnd.choice(["none", "cancel", "host"])
    if stop != "none":
        await asyncio.sleep(rnd.random() * 0.01)
        if stop == "cancel":
            await rt.cancel("k", "operator stop")
        else:
            run.cancel()
    async with asyncio.timeout(WAIT):
        with contextlib.suppress(AgentiumGraphError, asyncio.CancelledError):
            await run
    await wait_until(lambda: mix.now == 0, WAIT)  # abandoned work (if any) ended
    check_permits(events)
    assert mix.most <= capacity
    assert {e.capacity for e in events} <= {capacity}
