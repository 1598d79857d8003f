"""A container whose child fails is failed (naming the child), not canceled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    RepeatBinding,
    ToolBinding,
)
from agentium_graph.store import CommitRequest, CommitResult, SetStatus
from tests.conftest import program, wait_until


def _catalog(started: list[str]) -> HostCatalog:
    async def boom(args: dict[str, Any]) -> dict[str, Any]:
        # Fails only once its sibling is running: a failure lets running work finish.
        await wait_until(lambda: "slow" in started)
        started.append("boom")
        raise RuntimeError("boom")

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        started.append("slow")
        await wait_until(lambda: "boom" in started)
        for _ in range(5):
            await asyncio.sleep(0)
        return {}

    async def ok(args: dict[str, Any]) -> dict[str, Any]:
        return {}

    pair = ExecutionGraphProgram(id="pair", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "bad", "binding": "boom", "version": "1", "args": {}},
            {"id": "busy", "binding": "slow", "version": "1", "args": {}},
            {"id": "later", "binding": "ok", "version": "1", "args": {},
             "dependsOn": ["bad"]}]})
    outer = ExecutionGraphProgram(id="outer", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "inner", "binding": "pair", "version": "1", "args": {}}]})
    return HostCatalog([
        ToolBinding(id="boom", version="1", execute=boom, recovery="pure"),
        ToolBinding(id="slow", version="1", execute=slow, recovery="pure"),
        ToolBinding(id="ok", version="1", execute=ok, recovery="pure"),
        GraphBinding(id="pair", version="1", program=pair),
        GraphBinding(id="outer", version="1", program=outer),
        RepeatBinding(id="loop", version="1", program=pair, max_iterations=3,
                      condition=lambda s: True),
    ])


def _plan(binding: str) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "c", "binding": binding, "version": "1", "args": {}},
        {"id": "after", "binding": "ok", "version": "1", "args": {}, "dependsOn": ["c"]}]}


@pytest.mark.parametrize(("binding", "child"), [
    ("pair", "c/bad"), ("loop", "c/0/bad"), ("outer", "c/inner/bad")])
async def test_a_container_whose_child_fails_is_failed(binding: str, child: str) -> None:
    started: list[str] = []
    rt = ExecutionGraphRuntime(catalog=_catalog(started))
    await rt.create("k", program(_plan(binding)))
    with pytest.raises(NodeFailedError, match="boom") as caught:
        await rt.run("k")
    assert caught.value.node_id == child
    view = await rt.inspect("k")
    assert view.status == "failed" and view.verified
    assert view.error is not None and view.error.node_id == child
    assert "boom" in view.error.message
    assert view.nodes[child].state == "failed"
    scope = child.rsplit("/", 1)[0]
    assert view.nodes[scope + "/busy"].state == "completed"  # running work finishes
    assert view.nodes[scope + "/later"].state == "canceled"  # never started
    assert view.nodes["after"].state == "canceled"  # never started: canceled, as before
    # Every container between the failed child and the root failed, naming the child.
    containers = ["c", "c/inner"] if binding == "outer" else ["c"]
    for container in containers:
        node = view.nodes[container]
        assert node.state == "failed", (container, node.state)
        assert node.error is not None and node.error.code == "child_failed"
        assert node.error.node_id == container
        assert child in node.error.message and "boom" in node.error.message
        assert node.error.details["child"] == child
    # A second run reports the same failure and changes nothing.
    with pytest.raises(NodeFailedError, match="boom"):
        await rt.run("k")
    again = await rt.inspect("k")
    assert {n: v.state for n, v in again.nodes.items()} == \
        {n: v.state for n, v in view.nodes.items()}


class Crash(Exception):
    pass


class CrashBeforeFailedStatus(InMemoryDurableTaskStore):
    """Dies on the commit that would end the task ``failed``: the next run finds the failed
    child without the task's status (and its container still running)."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.armed and any(isinstance(s, SetStatus) and s.status == "failed"
                              for s in request.steps):
            self.armed = False
            raise Crash
        return await super().commit(request)


async def test_a_recovered_run_fails_the_container_of_a_failed_child() -> None:
    started: list[str] = []
    store = CrashBeforeFailedStatus()
    rt = ExecutionGraphRuntime(catalog=_catalog(started), store=store)
    await rt.create("k", program(_plan("outer")))
    with pytest.raises(Crash):
        await rt.run("k")
    snap = await store.get_task("k")
    assert snap is not None and snap.header.status == "running"
    with pytest.raises(NodeFailedError, match="boom"):
        await rt.run("k")
    view = await rt.inspect("k")
    assert view.status == "failed" and view.nodes["c/inner/bad"].state == "failed"
    for container in ("c", "c/inner"):
        error = view.nodes[container].error
        assert view.nodes[container].state == "failed"
        assert error is not None and error.details["child"] == "c/inner/bad"
