"""Review 18: how a run ends when a node fails while it stops for another reason.

* A budget stop leaves the task ``pending`` and resumable (nothing is refunded, nothing is
  dispatched). A node already running when it began goes on; when that node then failed,
  the task still ended ``pending`` with the budget's error: ``run`` raised
  ``BudgetExhaustedError`` ("stays recoverable") although the task could never complete,
  and the next ``run`` (or ``cancel``) found the failed node and failed the task then. The
  failure now ends the task ``failed`` with the node's error in the run that saw it.
* ``cancel`` of a task nobody runs applies the cancel by running the task; when that run's
  recovery found a node a crashed worker left failed, ``cancel`` raised the node's
  ``NodeFailedError`` instead of returning the task's view (fixed in
  ``runtime/_operator.py``: the view says how the task ended; the cancel stays recorded).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    StoreUnavailableError,
    ToolBinding,
)
from agentium_graph.store import CommitRequest, CommitResult, SetStatus, SettleNode
from tests.conftest import INT_OUT, wait_until

WAIT = 10.0


class Tools:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls: list[str] = []

    async def fails_later(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("fails_later")
        await self.gate.wait()
        raise RuntimeError("the tool broke")

    async def fails_now(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("fails_now")
        raise RuntimeError("the tool broke")

    async def waits(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("waits")
        await self.gate.wait()
        return {"value": 1}


def catalog(tools: Tools) -> HostCatalog:
    return HostCatalog([
        ToolBinding(id=name, version="1", execute=getattr(tools, name), recovery="pure",
                    output_schema=INT_OUT) for name in ("fails_later", "fails_now", "waits")])


def two(first: str, second: str) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="two", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "a", "binding": first, "version": "1", "args": {}},
            {"id": "b", "binding": second, "version": "1", "args": {}}]})


async def test_a_node_failing_while_a_budget_stop_waits_for_it_fails_the_task() -> None:
    tools = Tools()
    rt = ExecutionGraphRuntime(catalog=catalog(tools))
    # a starts; b would be the second tool call of a budget of one: the run stops for the
    # budget while a is still running, and then a fails.
    await rt.create("k", two("fails_later", "waits"), budgets=Budgets(tool_calls=1))
    run = asyncio.create_task(rt.run("k", "w1"))
    await wait_until(lambda: tools.calls == ["fails_later"], WAIT)
    tools.gate.set()
    async with asyncio.timeout(WAIT):
        with pytest.raises(NodeFailedError) as failed:
            await run
    assert failed.value.node_id == "a" and "the tool broke" in str(failed.value)
    view = await rt.inspect("k")
    assert view.status == "failed" and view.error is not None
    assert view.error.code == "tool_error" and view.error.node_id == "a"
    assert {n: v.state for n, v in view.nodes.items()} == {"a": "failed", "b": "canceled"}
    assert view.counters["tool_calls"] == 1 and tools.calls == ["fails_later"]
    assert view.lease is None


class CrashBeforeStatus(InMemoryDurableTaskStore):
    """A worker that dies right before the commit that would end the task."""

    def __init__(self) -> None:
        super().__init__()
        self.crash = True
        self.failed: list[str] = []  # nodes whose failure was committed

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.crash and any(isinstance(step, SetStatus) for step in request.steps):
            raise StoreUnavailableError("the worker died here")
        result = await super().commit(request)
        self.failed += [step.node_id for step in request.steps
                        if isinstance(step, SettleNode) and step.state == "failed"]
        return result


async def test_cancel_returns_the_view_when_recovery_finds_a_failed_node() -> None:
    tools = Tools()
    store = CrashBeforeStatus()
    rt = ExecutionGraphRuntime(catalog=catalog(tools), store=store)
    await rt.create("k", two("fails_now", "waits"))
    run = asyncio.create_task(rt.run("k", "w1"))
    await wait_until(lambda: store.failed == ["a"], WAIT)  # b still runs
    tools.gate.set()
    async with asyncio.timeout(WAIT):
        with pytest.raises(StoreUnavailableError):
            await run
    store.crash = False
    left = await rt.inspect("k")
    assert left.status == "running" and left.nodes["a"].state == "failed" and left.lease is None
    async with asyncio.timeout(WAIT):
        view = await rt.cancel("k", "no longer needed")  # raised NodeFailedError
    assert view.status == "failed" and view.nodes["a"].state == "failed"
    assert view.cancel is not None and view.cancel.reason == "no longer needed"
