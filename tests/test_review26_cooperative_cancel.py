"""The documented cooperative cancel (found by review 26's user journey): a sync tool that
waits with ``ctx.wait_cancelled()`` and stops with ``ctx.raise_if_cancelled()`` ended its
node ``failed`` with ``task_canceled`` (under a deadline too), while an async tool the
runtime cancels ends ``canceled`` with the stop's error. Both end ``canceled`` now."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    DeadlineExceededError,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    TaskCanceledError,
    ToolBinding,
    tool_context,
)
from tests.conftest import program, wait_until

STARTED: list[str] = []


def _cooperative(args: dict[str, Any]) -> dict[str, Any]:
    ctx = tool_context()
    STARTED.append(ctx.node_id)
    ctx.wait_cancelled(30)
    ctx.raise_if_cancelled()
    return {"ok": True}


def _raising_on_its_own(args: dict[str, Any]) -> dict[str, Any]:
    raise TaskCanceledError("a task of some other runtime was canceled")


PLAN = {"schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "n", "binding": "coop", "version": "1", "args": {}}]}


def _runtime() -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="coop", version="1", execute=_cooperative, recovery="pure"),
        ToolBinding(id="own", version="1", execute=_raising_on_its_own, recovery="pure")]),
        poll_interval=0.05)


@pytest.mark.parametrize(("stop", "code"), [("cancel", "task_canceled"),
                                            ("deadline", "deadline_exceeded")])
async def test_raise_if_cancelled_ends_the_node_canceled(stop: str, code: str) -> None:
    STARTED.clear()
    runtime = _runtime()
    await runtime.create("k", program(PLAN),
                         deadline=timedelta(seconds=0.5) if stop == "deadline" else None)
    run = asyncio.create_task(runtime.run("k"))
    await wait_until(lambda: STARTED == ["n"])
    if stop == "cancel":
        await runtime.cancel("k", reason="host said stop")
    with pytest.raises(TaskCanceledError if stop == "cancel" else DeadlineExceededError):
        await asyncio.wait_for(run, 30)
    node = (await runtime.inspect("k")).nodes["n"]
    assert node.state == "canceled" and node.attempts[-1].outcome == "canceled"
    assert node.error is not None and node.error.code == code


async def test_a_task_canceled_error_nobody_asked_for_still_fails_the_node() -> None:
    runtime = _runtime()
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "n", "binding": "own", "version": "1", "args": {}}]}))
    with pytest.raises(NodeFailedError):
        await runtime.run("k")
    node = (await runtime.inspect("k")).nodes["n"]
    assert node.state == "failed"

