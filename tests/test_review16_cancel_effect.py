"""Review 16: a connector that swallows cancellation cannot hold ``run()`` open.

A dispatch (or a lookup) is never preempted by a cancel or a deadline, but the runtime does
cancel it when its ``effect_timeout`` (``lookup_timeout``) passes and when the run abandons
its work (a lost lease, ``run()`` itself canceled). ``asyncio.wait_for`` and the agent's
unbounded wait for its effect call then waited for a connector that caught the
``CancelledError`` for as long as it kept going: forever. Now such a call gets
:data:`~agentium_graph.runtime._abandon.GRACE` to end, is then abandoned with a warning
naming the task, the node and the connector, and whatever it returns later is ignored; the
ledger says what is known (a dispatch abandoned by a dying run is reconciled by the next
run, and confirmed once).

Every run is awaited under ``asyncio.wait_for`` with a generous limit, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    ExecutionGraphRuntime,
    StaleFenceError,
    TaskCanceledError,
)
from agentium_graph.runtime import _abandon
from tests.conftest import LosableLease
from tests.test_effect_cancel_fixes import KINDS, Connector, catalog, effect_node, program, scripted
from tests.test_review15_tool_ignores_cancel import Stubborn as StubbornTool

HANG_LIMIT = 30.0  # seconds: far beyond the grace; reaching it means run() hung


class Stubborn(Connector):
    """A destination that accepts the dispatch, then ignores every cancellation until
    ``release`` is set (the breach under test: review 15's stubborn tool), and answers."""

    def __init__(self) -> None:
        super().__init__()
        self.held = StubbornTool(swallows=True)
        self.release, self.finished = self.held.release, self.held.finished

    @property
    def canceled(self) -> int:
        return self.held.canceled

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request.action_id)
        self.accepted[request.action_id] = {"charge_id": f"ch_{len(self.accepted) + 1}"}
        self.entered.set()
        await self.held({})
        return ActionOutcome(output=self.accepted[request.action_id],
                             result_ref=request.result_ref)


async def late_answer_is_ignored(rt: ExecutionGraphRuntime, conn: Stubborn) -> None:
    """Release the abandoned dispatch: its answer changes nothing (the action stays
    ``dispatching``, for the next run to reconcile)."""
    before = await rt.inspect("k")
    assert [a.state for a in before.actions] == ["dispatching"]
    conn.release.set()
    await asyncio.wait_for(conn.finished.wait(), HANG_LIMIT)
    await asyncio.sleep(0.05)
    after = await rt.inspect("k")
    assert after.journal_length == before.journal_length
    assert [a.state for a in after.actions] == ["dispatching"]


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.1)


def warnings_naming(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and
            r.name.startswith("agentium_graph") and
            all(w in r.getMessage() for w in words)]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_lost_lease_abandons_a_stubborn_dispatch_and_the_next_run_reconciles_it(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    conn = Stubborn()
    store = LosableLease()
    provider = scripted()
    rt = ExecutionGraphRuntime(catalog=catalog(conn, provider if kind == "agent" else None),
                               store=store, poll_interval=0.05)
    await rt.create("k", program(effect_node(kind)))
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    running = asyncio.create_task(rt.run("k", "w1"))
    try:
        await asyncio.wait_for(conn.entered.wait(), HANG_LIMIT)
        store.lose = True
        with pytest.raises(StaleFenceError):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert conn.canceled >= 1
        assert warnings_naming(caplog, "'k'", "'n'", "abandoned", conn.id)

        await late_answer_is_ignored(rt, conn)

        # The next run reconciles the dispatch: confirmed once, never dispatched again.
        store.lose = False
        rt2 = ExecutionGraphRuntime(catalog=catalog(
            conn, provider if kind == "agent" else None), store=store, poll_interval=0.05)
        result = await asyncio.wait_for(rt2.run("k", "w1"), HANG_LIMIT)
        assert result.status == "completed"
        assert len(conn.dispatched) == 1
        final = await rt2.inspect("k")
        assert [(a.state, a.outcome_source) for a in final.actions] == \
            [("confirmed", "reconcile")]
    finally:
        conn.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


@pytest.mark.parametrize("kind", KINDS)
async def test_canceling_run_itself_abandons_a_stubborn_dispatch(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    conn = Stubborn()
    rt = ExecutionGraphRuntime(catalog=catalog(conn, scripted() if kind == "agent" else None),
                               poll_interval=0.05)
    await rt.create("k", program(effect_node(kind)))
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    running = asyncio.create_task(rt.run("k"))
    try:
        await asyncio.wait_for(conn.entered.wait(), HANG_LIMIT)
        running.cancel()
        done, _ = await asyncio.wait({running}, timeout=HANG_LIMIT)
        assert done, "run() hung on a connector that swallows cancellation"
        assert running.cancelled()
        assert warnings_naming(caplog, "'k'", "'n'", "abandoned", conn.id)
        await late_answer_is_ignored(rt, conn)
    finally:
        conn.release.set()
        await asyncio.gather(running, return_exceptions=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", ["none", "cancel"])
async def test_effect_timeout_bounds_a_dispatch_that_swallows_its_cancel(
        kind: str, stop: str, caplog: pytest.LogCaptureFixture) -> None:
    """The timeout cancels the dispatch, which ignores it: after the grace it is abandoned
    and the dispatch is reconciled at once, as any timed-out dispatch (the destination
    accepted it here, so its outcome is the receipt). A live cancel waits for exactly that
    (it never preempts a dispatch) and then ends the task."""
    conn = Stubborn()
    rt = ExecutionGraphRuntime(catalog=catalog(conn, scripted() if kind == "agent" else None),
                               poll_interval=0.05, effect_timeout=0.3, lookup_timeout=2.0)
    await rt.create("k", program(effect_node(kind)))
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    running = asyncio.create_task(rt.run("k"))
    try:
        await asyncio.wait_for(conn.entered.wait(), HANG_LIMIT)
        if stop == "cancel":
            await rt.cancel("k", reason="enough")
            with pytest.raises(TaskCanceledError):
                await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        else:
            result = await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
            assert result.status == "completed"
        assert conn.canceled >= 1
        assert warnings_naming(caplog, "'k'", "'n'", "abandoned", conn.id)
        view = await rt.inspect("k")
        assert [(a.state, a.outcome_source) for a in view.actions] == \
            [("confirmed", "reconcile")]
        conn.release.set()
        await asyncio.wait_for(conn.finished.wait(), HANG_LIMIT)
        await asyncio.sleep(0.05)
        after = await rt.inspect("k")
        assert after.journal_length == view.journal_length and len(conn.dispatched) == 1
    finally:
        conn.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


@pytest.mark.parametrize("stop", [None, "canceled"])
async def test_an_agents_effect_call_that_ignores_a_stop_is_abandoned_after_its_grace(
        stop: str | None, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's wait for its effect call (``_unpreempted``) is bounded itself, whatever
    in the call swallows the cancellation: on the run abandoning its work (``stop`` None),
    or on a second cancellation during a stop that waits for the effect."""
    from types import SimpleNamespace

    from agentium_graph.runtime._agent import _unpreempted

    tool = StubbornTool(swallows=True)
    run: Any = SimpleNamespace(lost=None, stop=None if stop is None else
                               SimpleNamespace(reason=stop), running={})
    caplog.set_level(logging.WARNING, logger="agentium_graph")
    waiting = asyncio.create_task(_unpreempted(run, tool({}), "the call c1 of node 'n'",
                                               name="effect:k:n:c1", node_id="n"))
    try:
        await asyncio.sleep(0)
        waiting.cancel()
        if stop is not None:  # a live stop waits for the effect: only a second cancel ends it
            await asyncio.sleep(0.05)
            assert not waiting.done()
            waiting.cancel()
        done, _ = await asyncio.wait({waiting}, timeout=HANG_LIMIT)
        assert done, "the agent's wait for its effect call hung"
        assert waiting.cancelled() and not tool.finished.is_set()
        assert warnings_naming(caplog, "the call c1 of node 'n'", "abandoned")
    finally:
        tool.release.set()
        await asyncio.wait_for(tool.finished.wait(), HANG_LIMIT)
