"""``inspect`` verifies a planned task's committed plan too. Its next run loads that plan
blob (``committed_plan``) and stops with DataIntegrityError when it is missing or does not
match its digest, yet ``inspect`` said ``verified=True`` with no problem: an operator could
not see the damage before a worker tripped on it."""

from __future__ import annotations

import pytest

from agentium_graph import DataIntegrityError, ExecutionGraphRuntime, InMemoryDurableTaskStore
from agentium_graph.providers import ScriptedProvider
from tests.conftest import Calls, make_catalog
from tests.test_planner import GOOD, planned, turn


async def _planned_task(calls: Calls) -> tuple[ExecutionGraphRuntime, InMemoryDurableTaskStore,
                                               str]:
    store = InMemoryDurableTaskStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("t", planned(ScriptedProvider([turn(GOOD)])), input={"start": 1})
    await rt.run("t")
    header = await store.get_header("t")
    assert header is not None and header.plan_digest is not None
    return rt, store, header.plan_digest


async def test_an_intact_planned_task_verifies(calls: Calls) -> None:
    rt, _, _ = await _planned_task(calls)
    view = await rt.inspect("t")
    assert view.verified and view.problems == ()


@pytest.mark.parametrize("damage", ["missing", "damaged"])
async def test_a_missing_or_damaged_plan_blob_is_a_problem(calls: Calls, damage: str) -> None:
    rt, store, plan_digest = await _planned_task(calls)
    if damage == "missing":
        del store._blobs[plan_digest]
    else:
        store._blobs[plan_digest] = '{"schemaVersion":1,"revision":1,"nodes":[]}'
    view = await rt.inspect("t")
    assert not view.verified
    assert [p for p in view.problems if "committed plan" in p] == [
        f"committed plan of revision 1 (blob {plan_digest}) is {damage}"]
    # What the next run meets: the same blob, refused.
    from agentium_graph.runtime._planner import committed_plan

    header = await store.get_header("t")
    assert header is not None
    with pytest.raises(DataIntegrityError, match="committed plan"):
        await committed_plan(store, header)
