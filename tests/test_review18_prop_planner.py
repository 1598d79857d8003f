"""Streamed planning: regressions found by the property tests of planner programs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    RootLimits,
    StreamLimits,
    ToolBinding,
)
from agentium_graph.testing import ScriptedProvider, ScriptedTurn, TurnMatch

RESERVE = 40
INC_IN = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
INT_OUT = {"type": "object", "properties": {"value": {"type": "integer"}},
           "required": ["value"], "additionalProperties": False}


def catalog() -> HostCatalog:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        return {"value": args["x"] + 1}

    return HostCatalog([ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                                    input_schema=INC_IN, output_schema=INT_OUT)])


def _summary(entry: Any) -> tuple[Any, ...]:
    if entry.kind == "planner_call":
        return (entry.data["call"],)
    if entry.kind == "plan_proposal":
        return (entry.data["accepted"],
                tuple(d["code"] for d in entry.data.get("diagnostics", ())))
    if entry.kind == "planner_interrupted":
        return (tuple(d["code"] for d in entry.data["diagnostics"]),)
    return (entry.data["revision"],)


def _inc(node_id: str, x: int) -> dict[str, Any]:
    return {"id": node_id, "binding": "inc", "version": "1", "args": {"x": x}}


def _frame(base: int, *nodes: dict[str, Any]) -> str:
    return json.dumps({"baseRevision": base, "plan": {"schemaVersion": 1, "revision": base + 1,
                                                      "nodes": list(nodes)}}) + "\n"


def _streamed(provider: ScriptedProvider, **limits: int) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="streamed", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="Plan.", mode="stream", max_corrections=1,
        max_output_tokens=RESERVE, stream=StreamLimits(**limits)))


@pytest.mark.parametrize("limit", ["max_frame_bytes", "max_total_bytes"])
@pytest.mark.parametrize("chunks", [1, 2, 3])
async def test_frames_before_an_oversized_line_are_judged_however_the_text_is_cut(
        limit: str, chunks: int) -> None:
    # The first frame is fine; the line after it is over the limit. Whether both arrive in
    # one delta or not, the first frame commits revision 1 and the stream then closes: the
    # reader used to raise for the whole delta, so the first frame was dropped unjudged
    # (and the continuation asked from revision 0) only when it shared a delta with the
    # oversized line.
    first = _frame(0, _inc("a", 1))
    provider = ScriptedProvider([
        ScriptedTurn(text=first + "x" * 400 + "\n", match=TurnMatch(metadata={"call": 0})),
        ScriptedTurn(text="", match=TurnMatch(metadata={"call": 1, "revision": 1}))],
        chunks=chunks)
    bound = 300 if limit == "max_frame_bytes" else len(first) + 100
    rt = ExecutionGraphRuntime(catalog=catalog())
    await rt.create("k", _streamed(provider, **{limit: bound}))
    result = await rt.run("k")
    assert result.output == {"a": {"value": 2}} and result.revision == 1
    entries = [(e.kind, *_summary(e)) for e in (await rt.timeline("k", limit=100)).events
               if e.kind.startswith("plan") or e.kind == "revision_committed"]
    code = "frame_too_large" if limit == "max_frame_bytes" else "stream_too_large"
    assert entries == [("planner_call", 0), ("plan_proposal", True, ()),
                       ("revision_committed", 1), ("planner_interrupted", (code,)),
                       ("planner_call", 1), ("planner_sealed", 1)]
    assert json.loads(provider.calls[1].model_messages[-1].content)[
        "continue_from_revision"] == 1


async def test_a_revision_the_budget_refused_stays_a_budget_stop_on_the_last_call() -> None:
    # The only call's second frame is refused by max_plan_revisions: the run stops on the
    # budget and the task stays pending. A later run said the planner had used every
    # correction and failed the task with PlanValidationError (advice: clearer
    # instructions), although no proposal was invalid.
    provider = ScriptedProvider([ScriptedTurn(text=_frame(0, _inc("a", 1)) +
                                              _frame(1, _inc("a", 1), _inc("b", 2)))])
    rt = ExecutionGraphRuntime(catalog=catalog())
    config = PlannerConfig(provider=provider, host_instructions="Plan.", mode="stream",
                           max_corrections=0, max_output_tokens=RESERVE)
    await rt.create("k", ExecutionGraphProgram(id="one", version="1", planner=config),
                    limits=RootLimits(max_plan_revisions=1))
    for _ in range(2):
        with pytest.raises(BudgetExhaustedError) as refused:
            await rt.run("k")
        assert refused.value.counter == "plan_revisions"
        view = await rt.inspect("k")
        assert view.status == "pending" and view.revision == 1
        assert view.counters["model_calls"] == 1 and provider.call_count == 1
