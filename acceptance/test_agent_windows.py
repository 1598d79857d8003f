"""Agent, nested-graph and repeat windows: SIGKILL, recover in a fresh process, and check
that no recorded model response is requested again, no completed child or iteration re-runs,
counters are never refunded, and the outputs are right."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from acceptance._agent_graph import EXPECTED
from acceptance.conftest import Case, check_books, snapshot
from agentium_graph import DurableTaskStore
from agentium_graph.store import TaskSnapshot


def agent_config(case: Case, **kw: Any) -> dict[str, Any]:
    return {"graph": "agent", "provider_log": str(case.provider_log), **kw}


async def recover(case: Case, store: DurableTaskStore) -> TaskSnapshot:
    before = await snapshot(store, case.key)
    code, out, err = case.run(**agent_config(case))
    assert code == 0 and out is not None and out["ok"], (out, err)
    output = out["output"]
    assert output["ask"]["text"] == EXPECTED["ask"]
    assert {k: output[k] for k in ("nested", "loop", "final")} == {
        k: EXPECTED[k] for k in ("nested", "loop", "final")}
    after = await snapshot(store, case.key)
    check_books(before, after)
    return after


async def test_kill_during_a_model_stream(case: Case, store_of: DurableTaskStore) -> None:
    proc = case.start(**agent_config(case, create=True, script="hang"))
    deadline = time.monotonic() + 30
    while not case.provider_calls():  # the stream is open and hanging mid-frame
        assert time.monotonic() < deadline and proc.poll() is None
        await asyncio.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = await snapshot(store_of, case.key)
    assert before.header.counters["model_calls"] == 1  # reserved before the stream began
    after = await recover(case, store_of)
    calls = case.provider_calls()
    # The interrupted request is asked again once; every other request exactly once.
    assert sorted(calls.values()) == [1, 2]
    assert after.header.counters["model_calls"] == 3  # the interrupted one stays charged
    assert case.starts("ask") == 1  # the agent's tool ran once


async def test_kill_after_a_response_was_journaled_before_its_tool(
        case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(**agent_config(case, create=True, kill_at="after_model_response",
                                   node="ask"))
    assert case.starts("ask") == 0 and sum(case.provider_calls().values()) == 1
    after = await recover(case, store_of)
    calls = case.provider_calls()
    assert sorted(calls.values()) == [1, 1]  # the recorded response was replayed, not asked
    assert after.header.counters["model_calls"] == 2
    assert case.starts("ask") == 1


async def test_kill_inside_a_nested_graph_child(case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(**agent_config(case, create=True, kill_in_tool="nested/y"))
    before = await snapshot(store_of, case.key)
    assert before.nodes["nested/x"].state == "completed"
    assert before.nodes["nested/y"].state == "running"
    await recover(case, store_of)
    assert case.starts("nested/x") == 1 and case.starts("nested/y") == 2
    assert sorted(case.provider_calls().values()) == [1, 1]


async def test_kill_between_repeat_iterations(case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(**agent_config(case, create=True, kill_at="after_repeat_guard",
                                   node="loop"))
    before = await snapshot(store_of, case.key)
    assert before.nodes["loop/0/step"].state == "completed"
    assert "loop/1/step" in before.nodes  # the next iteration was materialized with the guard
    after = await recover(case, store_of)
    for i in range(3):
        assert case.starts(f"loop/{i}/step") == 1, i
    assert after.header.counters["plan_revisions"] == 5  # root + nested + three iterations
