"""Planner windows: SIGKILL a worker while its task is being planned, recover in a fresh
process, and check that no recorded planner response is requested again, an accepted plan is
never planned again, no completed node re-runs, counters are never refunded, and the outputs
are right."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from acceptance._graph import EXPECTED
from acceptance._planner_graph import PREFIX
from acceptance.conftest import Case, check_books, snapshot
from agentium_graph import DurableTaskStore
from agentium_graph.store import TaskSnapshot, TimelineRequest


def planner_config(case: Case, **kw: Any) -> dict[str, Any]:
    return {"graph": "planner", "provider_log": str(case.provider_log), **kw}


async def verdicts(store: DurableTaskStore, key: str) -> list[bool]:
    events = await store.read_timeline(TimelineRequest(key=key, after_seq=0, limit=1000))
    return [bool(e.data["accepted"]) for e in events if e.kind == "plan_proposal"]


async def recover(case: Case, store: DurableTaskStore) -> TaskSnapshot:
    before = await snapshot(store, case.key)
    code, out, err = case.run(**planner_config(case))
    assert code == 0 and out is not None and out["ok"], (out, err)
    assert {n: v["value"] for n, v in out["output"].items()} == EXPECTED
    after = await snapshot(store, case.key)
    assert after.header.status == "completed" and after.header.revision == 1
    check_books(before, after)
    for node in EXPECTED:
        assert case.starts(node) == 1, f"{node} started {case.starts(node)} times"
    assert await verdicts(store, case.key) == [False, True]
    return after


async def test_kill_after_a_rejected_proposal_was_journaled(
        case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(**planner_config(case, create=True, kill_at="after_planner_response"))
    before = await snapshot(store_of, case.key)
    assert before.header.revision == 0 and before.nodes == {}
    assert before.header.counters["model_calls"] == 1
    assert await verdicts(store_of, case.key) == [False]
    after = await recover(case, store_of)
    # The rejected proposal replayed from the journal; only the correction was asked.
    assert sorted(case.provider_calls().values()) == [1, 1]
    assert after.header.counters["model_calls"] == 2


async def test_kill_after_the_plan_was_committed(case: Case,
                                                 store_of: DurableTaskStore) -> None:
    case.run_killed(**planner_config(case, create=True, kill_at="after_plan_commit"))
    before = await snapshot(store_of, case.key)
    assert before.header.revision == 1 and set(before.nodes) == set(EXPECTED)
    assert all(n.state == "pending" for n in before.nodes.values())
    after = await recover(case, store_of)
    assert sorted(case.provider_calls().values()) == [1, 1]  # a committed plan: no new call
    assert after.header.counters["model_calls"] == 2


async def test_kill_inside_a_planner_call(case: Case, store_of: DurableTaskStore) -> None:
    proc = case.start(**planner_config(case, create=True, script="hang"))
    deadline = time.monotonic() + 30
    while not case.provider_calls():  # the first planner call is in flight, hanging
        assert time.monotonic() < deadline and proc.poll() is None
        await asyncio.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = await snapshot(store_of, case.key)
    assert before.header.counters["model_calls"] == 1  # charged before the call was made
    assert before.header.revision == 0
    after = await recover(case, store_of)
    # The interrupted request is asked again once; the correction exactly once.
    assert sorted(case.provider_calls().values()) == [1, 2]
    assert after.header.counters["model_calls"] == 3  # the interrupted call stays charged


@pytest.mark.parametrize("script", ["stream", "stream-rejected"])
async def test_kill_while_a_streamed_plan_is_still_arriving(
        case: Case, store_of: DurableTaskStore, script: str) -> None:
    # Stream mode: the frame a -> b is committed and runs while the stream hangs; the worker
    # is killed there. A fresh process continues from revision 1. (With "stream-rejected" a
    # call whose frame was rejected comes first: recovery reads its verdict too.)
    proc = case.start(**planner_config(case, create=True, script=script))
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline and proc.poll() is None
        state = await store_of.get_task(case.key)
        if state is not None and all(state.nodes.get(n) is not None and
                                     state.nodes[n].state == "completed" for n in PREFIX):
            break
        await asyncio.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = await snapshot(store_of, case.key)
    calls_before = 2 if script == "stream-rejected" else 1
    assert before.header.revision == 1 and set(before.nodes) == set(PREFIX)
    assert before.header.counters["model_calls"] == calls_before

    code, out, err = case.run(**planner_config(case, script=script))
    assert code == 0 and out is not None and out["ok"], (out, err)
    assert {n: v["value"] for n, v in out["output"].items()} == EXPECTED
    after = await snapshot(store_of, case.key)
    assert after.header.status == "completed" and after.header.revision == 2
    for node in EXPECTED:  # the prefix that completed before the kill never re-ran
        assert case.starts(node) == 1, f"{node} started {case.starts(node)} times"
    for name, value in before.header.counters.items():
        assert after.header.counters[name] >= value, f"{name} refunded"
    # The interrupted stream is not asked again: one continuation from revision 1.
    assert sorted(case.provider_calls().values()) == [1] * (calls_before + 1)
    assert after.header.counters["model_calls"] == calls_before + 1
    assert await verdicts(store_of, case.key) == \
        ([False] if script == "stream-rejected" else []) + [True, True]
