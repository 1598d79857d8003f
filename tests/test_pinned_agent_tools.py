"""An agent's tools are the versions the task pinned at create, also where the runtime
checks what a planned task's plan reaches: a version added to the catalog later is not a
new binding, and a pinned version that is gone stops the run before anything happens."""

from __future__ import annotations

import json

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    DescriptorMismatchError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    PlannerConfig,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, Usage
from agentium_graph.store import CommitRequest, CommitResult, CommitRevision
from tests.conftest import ManualClock

PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "ask", "binding": "ag", "version": "1", "args": {"prompt": "go"}}]}


def inc(version: str) -> ToolBinding:
    return ToolBinding(id="inc", version=version, execute=lambda a: {"v": 1},
                       recovery="pure", input_schema={"type": "object"},
                       description=f"inc v{version}")


def agent() -> AgentBinding:
    provider = ScriptedProvider([ScriptedTurn(text="done", usage=Usage(input_tokens=1,
                                                                       output_tokens=1))])
    return AgentBinding(id="ag", version="1", agent=Agent(
        provider=provider, instructions="answer", tools=("inc",), max_output_tokens=10))


def planned() -> ExecutionGraphProgram:
    planner = ScriptedProvider([ScriptedTurn(text=json.dumps(PLAN),
                                             usage=Usage(input_tokens=1, output_tokens=1))])
    return ExecutionGraphProgram(id="pp", version="1", planner=PlannerConfig(
        provider=planner, host_instructions="plan", max_output_tokens=100))


async def test_a_tool_version_added_after_create_does_not_unpin_a_planned_agent() -> None:
    store = InMemoryDurableTaskStore()
    program = planned()
    first = ExecutionGraphRuntime(catalog=HostCatalog([inc("1"), agent()]), store=store,
                                  programs=[program])
    await first.create("k", program)
    # Another worker, whose catalog also has inc@2, plans and runs the task.
    later = ExecutionGraphRuntime(catalog=HostCatalog([inc("1"), inc("2"), agent()]),
                                  store=store, programs=[program])
    result = await later.run("k")
    assert result.output["ask"]["text"] == "done"


class _Crash(Exception):
    pass


class CrashAfterPlanning(InMemoryDurableTaskStore):
    """The worker dies right after the commit of revision 1 (the plan) landed."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(step, CommitRevision) for step in request.steps):
            raise _Crash("killed after planning")
        return result


async def test_a_pinned_agent_tool_that_is_gone_stops_a_planned_task_before_it_runs(
        ) -> None:
    clock = ManualClock()
    store = CrashAfterPlanning()
    program = planned()
    rt = ExecutionGraphRuntime(catalog=HostCatalog([inc("1"), agent()]), store=store,
                               programs=[program], clock=clock)
    await rt.create("k", program)
    with pytest.raises(_Crash):
        await rt.run("k")
    assert (await rt.inspect("k")).revision == 1  # planned, nothing of the plan ran
    clock.advance(60)  # the dead worker's lease has expired
    # A worker whose catalog has only inc@2: the agent's pinned inc@1 is gone.
    other = ExecutionGraphRuntime(catalog=HostCatalog([inc("2"), agent()]), store=store,
                                  programs=[program], clock=clock)
    with pytest.raises(DescriptorMismatchError, match="'inc' version '1'"):
        await other.run("k")
    view = await other.inspect("k")
    assert view.status == "running" and view.nodes["ask"].state == "pending"  # recoverable
