"""A streamed planner whose next revision the task's budget refuses: the frame's verdict is
journaled, and no later run pays for another provider call that could not commit."""

from __future__ import annotations

import pytest

from agentium_graph import BudgetExhaustedError, ExecutionGraphRuntime, RootLimits
from agentium_graph.providers import ScriptedProvider
from tests.conftest import Calls, make_catalog
from tests.test_planner_stream import frame, node, ref, streamed, turn


async def test_a_revision_refused_by_the_budget_is_journaled_and_not_asked_again(
        calls: Calls) -> None:
    again = frame(1, node("a", 1), node("b", ref("a"), "a"))
    provider = ScriptedProvider([turn(frame(0, node("a", 1)), again),
                                 turn(again), turn(again)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", streamed(provider), limits=RootLimits(max_plan_revisions=1))
    for _ in range(3):  # the first run is refused, and so is every later one
        with pytest.raises(BudgetExhaustedError) as refused:
            await rt.run("t")
        assert refused.value.counter == "plan_revisions"
    assert provider.call_count == 1  # later runs read the refusal: no call paid for again
    view = await rt.inspect("t")
    assert view.status == "pending" and view.verified
    assert view.counters["model_calls"] == 1 and view.counters["plan_revisions"] == 1
    assert view.planner is not None and view.planner.proposals == 2
    verdicts = [e.data for e in (await rt.timeline("t", limit=1000)).events
                if e.kind == "plan_proposal"]
    assert [v["accepted"] for v in verdicts] == [True, False]
    assert verdicts[1]["budget"] == "plan_revisions" and verdicts[1]["base_revision"] == 1
    assert verdicts[1]["diagnostics"][0]["code"] == "budget_exhausted"
    assert calls.by_node == {"a": 1}
