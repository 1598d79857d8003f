"""What ``inspect`` says about a planner that failed (review 21).

A stream that sent more frames than ``StreamLimits.max_frames`` failed with the advice of an
exhausted correction budget, and ``view.planner`` showed no rejection and no diagnostics; a
complete-mode call whose provider raised was charged (``model_calls``) but not counted in
``view.planner.calls``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    PlannerFailedError,
    PlanValidationError,
    StreamLimits,
    ToolBinding,
)
from agentium_graph.testing import ScriptedProvider, ScriptedTurn


async def tool(args: dict[str, Any]) -> dict[str, Any]:
    return {"v": 1}


CATALOG = HostCatalog([ToolBinding(id="t", version="1", execute=tool, recovery="pure")])


def node(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "binding": "t", "version": "1", "args": {}}


def frame(base: int, *nodes: dict[str, Any]) -> str:
    return json.dumps({"baseRevision": base, "plan": {
        "schemaVersion": 1, "revision": base + 1, "nodes": list(nodes)}}) + "\n"


async def test_too_many_frames_is_a_journaled_rejection_with_its_own_advice() -> None:
    provider = ScriptedProvider([ScriptedTurn(
        text=frame(0, node("a")) + frame(1, node("a"), node("b")))] * 3)
    program = ExecutionGraphProgram(id="s", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="plan", mode="stream",
        stream=StreamLimits(max_frames=1)))
    rt = ExecutionGraphRuntime(catalog=CATALOG)
    await rt.create("k", program)
    with pytest.raises(PlanValidationError) as info:
        await rt.run("k")
    assert [d.code for d in info.value.diagnostics] == ["too_many_frames"]
    assert "max_frames" in str(info.value) and "correction" not in str(info.value)
    view = await rt.inspect("k")
    assert view.status == "failed" and view.planner is not None
    assert (view.planner.calls, view.planner.proposals, view.planner.rejected) == (1, 2, 1)
    assert [d.code for d in view.planner.last_diagnostics] == ["too_many_frames"]
    assert view.counters["model_calls"] == 1  # no correction call was made for it


async def test_a_call_whose_provider_raised_is_counted_as_charged() -> None:
    program = ExecutionGraphProgram(id="c", version="1", planner=PlannerConfig(
        provider=ScriptedProvider([]), host_instructions="plan"))  # every call raises
    rt = ExecutionGraphRuntime(catalog=CATALOG)
    await rt.create("k", program)
    with pytest.raises(PlannerFailedError):
        await rt.run("k")
    view = await rt.inspect("k")
    assert view.planner is not None and view.planner.state == "failed"
    assert view.planner.calls == view.counters["model_calls"] == 1
    assert (view.planner.proposals, view.planner.rejected) == (0, 0)


async def test_a_completed_task_returns_its_output_in_the_same_order_every_time() -> None:
    plan = {"schemaVersion": 1, "revision": 1,
            "nodes": [node("usd"), node("gbp"), node("aud")]}
    rt = ExecutionGraphRuntime(catalog=CATALOG)
    await rt.create("k", ExecutionGraphProgram(id="p", version="1", plan=plan))
    first = await rt.run("k")
    again = await rt.run("k")  # retained: no dispatch
    assert list(first.output) == list(again.output) == ["aud", "gbp", "usd"]
