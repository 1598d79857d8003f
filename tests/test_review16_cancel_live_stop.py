"""Review 16: a tool that swallows cancellation cannot hold a live stop of the run open.

A task cancel or a deadline cancels the run's running tools and waits for them to end, so
that each node is settled as the stop says. An async tool that caught the
``CancelledError`` and kept waiting held that stop -- and ``run()`` -- until it ended of its
own accord. Now a node's task still running three times
:data:`~agentium_graph.runtime._abandon.GRACE` after its cancel is abandoned with a warning
naming the task and the node, the node is settled ``canceled`` like every node the stop
closes, and whatever the tool returns later is ignored: nothing of it is committed, and
what was journaled before the stop stays.

Every run is awaited under ``asyncio.wait_for`` with a generous limit, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    DeadlineExceededError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    TaskCanceledError,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch
from agentium_graph.runtime import _abandon
from tests.conftest import wait_until
from tests.test_effect_cancel_fixes import Connector, effect_node, setup, stop_seen
from tests.test_effect_cancel_fixes import program as effect_program
from tests.test_review15_tool_ignores_cancel import Stubborn

HANG_LIMIT = 30.0  # seconds: far beyond the grace; reaching it means run() hung
OUTCOMES: dict[str, tuple[type[Exception], str]] = {
    "cancel": (TaskCanceledError, "canceled"),
    "deadline": (DeadlineExceededError, "failed"),
}


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.1)


def quick(args: dict[str, Any]) -> dict[str, Any]:
    return {"quick": True}


def catalog(tool: Stubborn, kind: str) -> HostCatalog:
    """``stubborn`` is the tool object itself (an ``async def __call__``) or, for
    ``kind="function"``, an ``async def`` function that awaits it."""

    async def function(args: dict[str, Any]) -> dict[str, Any]:
        return await tool(args)

    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c1", name="stubborn", arguments={}),),
                     match=TurnMatch(assistant_turns=0)),
        ScriptedTurn(text="done", match=TurnMatch(assistant_turns=1))])
    return HostCatalog([
        ToolBinding(id="stubborn", version="1", execute=function if kind == "function"
                    else tool, recovery="pure"),
        ToolBinding(id="quick", version="1", execute=quick, recovery="pure"),
        AgentBinding(id="ag", version="1", agent=Agent(provider, "Use the tool.",
                                                       tools=("stubborn",)))])


def program(kind: str) -> ExecutionGraphProgram:
    """Node ``a`` runs the stubborn tool (itself, or through an agent); ``b`` completes."""
    a = {"id": "a", "binding": "stubborn", "version": "1", "args": {}} if kind != "agent" \
        else {"id": "a", "binding": "ag", "version": "1", "args": {"prompt": "go"}}
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [a, {"id": "b", "binding": "quick", "version": "1", "args": {}}]})


@pytest.mark.parametrize("kind", ["tool", "function", "agent"])
@pytest.mark.parametrize("stop", sorted(OUTCOMES))
async def test_a_live_stop_abandons_a_tool_that_swallows_its_cancel(
        stop: str, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    tool = Stubborn(swallows=True)
    rt = ExecutionGraphRuntime(catalog=catalog(tool, kind), poll_interval=0.05)
    deadline = timedelta(milliseconds=400) if stop == "deadline" else None
    await rt.create("k", program(kind), deadline=deadline)
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    running = asyncio.create_task(rt.run("k"))
    try:
        await asyncio.wait_for(tool.started.wait(), HANG_LIMIT)
        if stop == "cancel":
            await rt.cancel("k", reason="enough")
        error, status = OUTCOMES[stop]
        with pytest.raises(error):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert tool.canceled >= 1 and not tool.finished.is_set()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and "abandoned" in r.getMessage()]
        assert any("'k'" in w and "'a'" in w for w in warnings), warnings
        view = await rt.inspect("k")
        assert view.status == status
        assert view.nodes["a"].state == "canceled" and view.nodes["a"].output is None
        # What completed before the stop stays, journaled.
        assert view.nodes["b"].state == "completed" and view.nodes["b"].output == \
            {"quick": True}
        if kind == "agent":
            kinds = [e.kind for e in (await rt.timeline("k")).events]
            assert "model_response" in kinds and "agent_tool_result" not in kinds

        # Released at last, the abandoned tool returns: nothing of it is committed.
        tool.release.set()
        await asyncio.wait_for(tool.finished.wait(), HANG_LIMIT)
        await asyncio.sleep(0.05)
        after = await rt.inspect("k")
        assert after.journal_length == view.journal_length
        assert (after.status, after.nodes["a"].state) == (status, "canceled")
        assert after.revision == view.revision and after.counters == view.counters
    finally:
        tool.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_live_stop_never_abandons_an_agent_waiting_for_its_effect_in_flight(
        caplog: pytest.LogCaptureFixture) -> None:
    """The effect is never preempted (and bounded itself): its agent is not abandoned even
    when the dispatch outlasts the time a stop gives canceled tools."""
    conn = Connector(gate=True)
    rt, _ = setup("agent", conn)
    await rt.create("k", effect_program(effect_node("agent")))
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    running = asyncio.create_task(rt.run("k"))
    try:
        await asyncio.wait_for(conn.entered.wait(), HANG_LIMIT)
        await rt.cancel("k", reason="enough")
        await stop_seen(rt, "k")
        # The time a stop gives canceled tools passed while the dispatch was held.
        await wait_until(lambda: rt._active["k"].overdue_at is None, limit=HANG_LIMIT)
        assert conn.gate is not None
        conn.gate.set()
        with pytest.raises(TaskCanceledError):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert not [r for r in caplog.records if "abandoned" in r.getMessage()]
        view = await rt.inspect("k")
        assert [(a.state, a.outcome_source) for a in view.actions] == \
            [("confirmed", "dispatch")]
        assert view.nodes["n"].state == "canceled" and not conn.dispatch_canceled
    finally:
        if conn.gate is not None:
            conn.gate.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
