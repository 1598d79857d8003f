"""Containers from a review of this stop: an empty nested program is refused (a crash
after entering one wedged the task), a container's output must fit the store like a
leaf's, a long repeat recovers in linear time, and BudgetExhaustedError carries what
its message says."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeOutputError,
    RepeatBinding,
    StoreCapabilities,
    ToolBinding,
)
from agentium_graph.runtime import _containers
from agentium_graph.store import CommitRequest, CommitResult
from tests.conftest import program
from tests.test_containers import CrashOnIteration, _Crash

EMPTY = ExecutionGraphProgram(id="empty", version="1", plan={
    "schemaVersion": 1, "revision": 1, "nodes": []})


@pytest.mark.parametrize("make", [
    lambda: GraphBinding(id="g", version="1", program=EMPTY),
    lambda: RepeatBinding(EMPTY, 3, id="r", version="1", condition=lambda s: True)])
def test_a_container_of_an_empty_program_is_refused(make: Any) -> None:
    with pytest.raises(ConfigurationError, match="program 'empty' has no nodes"):
        make()


class SmallRecords(InMemoryDurableTaskStore):
    """Keeps records of at most 1,000 bytes, and refuses a larger blob as a store must."""

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(durable=False, multi_process=False, name="small",
                                 max_blob_bytes=1000)

    async def commit(self, request: CommitRequest) -> CommitResult:
        assert all(len(t.encode()) <= 1000 for t in request.blobs.values()), "too large"
        return await super().commit(request)


async def test_a_container_output_larger_than_the_store_keeps_fails_the_node() -> None:
    # Each child's output fits; together they do not. The commit holding the children's
    # completions used to be refused on every run, and the children ran again each time.
    ran: list[str] = []

    def half(args: dict[str, Any]) -> dict[str, Any]:
        ran.append(args["n"])
        return {"blob": "x" * 600}

    inner = ExecutionGraphProgram(id="two", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": n, "binding": "half", "version": "1", "args": {"n": n}} for n in "ab"]})
    rt = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="half", version="1", execute=half, recovery="pure"),
        GraphBinding(id="both", version="1", program=inner)]), store=SmallRecords())
    await rt.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "g", "binding": "both", "version": "1", "args": {}}]}))
    for _ in range(2):
        with pytest.raises(NodeOutputError, match="more than the 1000 bytes") as caught:
            await rt.run("k")
        assert caught.value.node_id == "g" or "'g'" in str(caught.value)
    view = await rt.inspect("k")
    assert view.status == "failed" and view.nodes["g"].state == "failed"
    assert view.nodes["g/a"].state == view.nodes["g/b"].state == "completed"
    assert sorted(ran) == ["a", "b"] and view.verified


async def test_recovering_a_long_repeat_scans_its_nodes_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each iteration holds a nested graph: restore() looked for every container's children
    # among all the task's nodes, quadratic in the iterations (4,000 took 40 s to recover).
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        return {"value": args["x"] + 1}

    one = ExecutionGraphProgram(id="one", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "i", "binding": "inc", "version": "1", "args": {"x": 1}}]})
    body = ExecutionGraphProgram(id="body", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "g", "binding": "one", "version": "1", "args": {}}]})

    def build() -> HostCatalog:
        return HostCatalog([
            ToolBinding(id="inc", version="1", execute=inc, recovery="pure"),
            GraphBinding(id="one", version="1", program=one),
            RepeatBinding(body, 40, id="loop", version="1",
                          condition=lambda s: s["iteration"] < 29)])

    store = CrashOnIteration(20)
    limits = {"max_plan_revisions": 200}
    rt = ExecutionGraphRuntime(catalog=build(), store=store, limits=limits)
    await rt.create("r", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {}}]}))
    with pytest.raises(_Crash):
        await rt.run("r", "w1")

    scans: list[int] = []  # per restore() call: how often it went through all nodes
    real = _containers.restore

    def counting(run: Any) -> None:
        scans.append(0)

        class Nodes(dict):  # type: ignore[type-arg]
            def values(self) -> Any:
                scans[-1] += 1
                return super().values()

        original, run.nodes = run.nodes, Nodes(run.nodes)
        try:
            real(run)
        finally:
            run.nodes = original

    monkeypatch.setattr(_containers, "restore", counting)
    fresh = ExecutionGraphRuntime(catalog=build(), store=store, limits=limits)
    assert (await fresh.run("r", "w1")).output["r"]["iterations"] == 30
    # One pass per restore, not one per container (21 of them at the crash).
    assert scans and set(scans) == {1}, scans


def test_budget_exhausted_error_carries_used_and_requested() -> None:
    error = BudgetExhaustedError("t", "expanded_nodes", 5, 2, 6)
    assert (error.counter, error.used, error.requested, error.limit) == (
        "expanded_nodes", 5, 2, 6)
