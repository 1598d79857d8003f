"""Nested graphs and bounded repeats: children under the parent, no slot while waiting."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    RepeatBinding,
    RootLimits,
    ToolBinding,
)
from agentium_graph.store import AddNodes, CommitRequest, CommitResult
from tests.conftest import Calls, CountingStore, program

NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}


def ref(node: str, *path: Any) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


def tools(calls: Calls) -> list[ToolBinding]:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": args["x"] + 1}

    async def double(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": args["x"] * 2}

    return [ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                        input_schema={"type": "object", "required": ["x"]}, output_schema=NUM),
            ToolBinding(id="double", version="1", execute=double, recovery="pure",
                        input_schema={"type": "object", "required": ["x"]}, output_schema=NUM)]


def inner_program() -> ExecutionGraphProgram:
    """x -> (inc, double) -> sum via inc: uses the container's args through $input."""
    return ExecutionGraphProgram(id="inner", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "up", "binding": "inc", "version": "1", "args": {"x": ref("$input", "x")}},
            {"id": "twice", "binding": "double", "version": "1",
             "args": {"x": ref("up", "value")}}]})


def step_program() -> ExecutionGraphProgram:
    """One repeat iteration: add one to the previous iteration's result (or the input)."""
    return ExecutionGraphProgram(id="step", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "next", "binding": "inc", "version": "1",
             "args": {"x": ref("$input", "x")}}]})


def counter_program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="count", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "read", "binding": "double", "version": "1", "args": {"x": 0}},
            {"id": "next", "binding": "inc", "version": "1",
             "args": {"x": ref("read", "value")}}]})


def catalog(calls: Calls, *, condition: Any = None, max_iterations: int = 5) -> HostCatalog:
    return HostCatalog([
        *tools(calls),
        GraphBinding(id="sub", version="1", program=inner_program(),
                     input_schema={"type": "object", "required": ["x"]}),
        RepeatBinding(id="loop", version="1", program=step_program(),
                      max_iterations=max_iterations,
                      condition=condition or (lambda s: s["iteration"] < 2),
                      input_schema={"type": "object", "required": ["x"]}),
        RepeatBinding(id="count", version="1", program=counter_program(), max_iterations=3,
                      condition=lambda s: True),
    ])


async def test_nested_graph_output_is_the_map_of_its_nodes(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(calls))
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 1}},
        {"id": "g", "binding": "sub", "version": "1", "args": {"x": ref("a", "value")}},
        {"id": "b", "binding": "inc", "version": "1", "args": {"x": ref("g", "twice", "value")}}]}
    await rt.create("n", program(plan))
    result = await rt.run("n")
    assert result.output == {"a": {"value": 2},
                             "g": {"up": {"value": 3}, "twice": {"value": 6}},
                             "b": {"value": 7}}
    view = await rt.inspect("n")
    assert view.nodes["g/up"].parent == "g" and view.nodes["g/twice"].deps == ("g/up",)
    assert view.nodes["g"].kind == "graph" and view.nodes["g"].state == "completed"
    assert view.counters["expanded_nodes"] == 5 and view.counters["plan_revisions"] == 2
    assert view.counters["work_attempts"] == 4  # containers are not work attempts
    assert view.nodes["g/up"].incarnation_id != view.nodes["a"].incarnation_id


async def test_repeat_runs_bounded_iterations_and_journals_guards(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(calls))
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {"x": 10}}]}
    await rt.create("r", program(plan))
    result = await rt.run("r")
    assert result.output["r"] == {"iterations": 3, "stopped": "condition",
                                  "last": {"next": {"value": 11}}}
    view = await rt.inspect("r")
    assert {n for n in view.nodes if n.startswith("r/")} == {"r/0/next", "r/1/next",
                                                             "r/2/next"}
    events = (await rt.timeline("r", limit=1000)).events
    guards = [(e.data["iteration"], e.data["decision"]) for e in events
              if e.kind == "repeat_guard"]
    assert guards == [(0, "continue"), (1, "continue"), (2, "stop")]
    assert view.counters["plan_revisions"] == 4  # root + three iterations


async def test_previous_iteration_outputs_and_max_iterations(calls: Calls) -> None:
    async def accumulate(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        prev = args["prev"]
        return {"value": (prev["acc"]["value"] if prev else 0) + args["step"]}

    prog = ExecutionGraphProgram(id="acc", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "acc", "binding": "accumulate", "version": "1",
             "args": {"prev": ref("$previous"), "step": ref("$input", "step")}}]})
    cat = HostCatalog([
        ToolBinding(id="accumulate", version="1", execute=accumulate, recovery="pure",
                    output_schema=NUM),
        RepeatBinding(id="acc", version="1", program=prog, max_iterations=4,
                      condition=lambda s: True)])
    rt = ExecutionGraphRuntime(catalog=cat)
    await rt.create("p", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "acc", "version": "1", "args": {"step": 5}}]}))
    result = await rt.run("p")
    assert result.output["r"] == {"iterations": 4, "stopped": "max_iterations",
                                  "last": {"acc": {"value": 20}}}
    assert calls.order == ["r/0/acc", "r/1/acc", "r/2/acc", "r/3/acc"]


async def test_condition_that_raises_fails_the_node_by_name(calls: Calls) -> None:
    def bad(state: dict[str, Any]) -> bool:
        raise ValueError("cannot decide")

    rt = ExecutionGraphRuntime(catalog=catalog(calls, condition=bad))
    await rt.create("c", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {"x": 1}}]}))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("c")
    assert info.value.node_id == "r" and "cannot decide" in str(info.value)
    view = await rt.inspect("c")
    assert view.nodes["r"].state == "failed"
    assert view.nodes["r"].error is not None
    assert view.nodes["r"].error.code == "repeat_condition_failed"


async def test_capacity_one_completes_graph_in_repeat_nesting(calls: Calls) -> None:
    nested = ExecutionGraphProgram(id="deep", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "g", "binding": "sub", "version": "1", "args": {"x": 1}},
            {"id": "t", "binding": "inc", "version": "1",
             "args": {"x": ref("g", "twice", "value")}}]})
    cat = HostCatalog([*catalog(calls), RepeatBinding(
        id="outer", version="1", program=nested, max_iterations=2,
        condition=lambda s: True)])
    rt = ExecutionGraphRuntime(catalog=cat, limits=RootLimits(max_concurrent_work=1))
    await rt.create("cap1", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "o", "binding": "outer", "version": "1"}]}))
    result = await rt.run("cap1")
    assert result.output["o"]["iterations"] == 2
    assert result.output["o"]["last"]["t"] == {"value": 5}
    view = await rt.inspect("cap1")
    assert view.nodes["o/1/g/twice"].state == "completed"


class CrashOnIteration(CountingStore):
    """Dies (a BaseException, like a killed worker) when iteration ``n`` is materialized."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if self.n >= 0 and any(isinstance(s, AddNodes) and
                               any(x.node_id.startswith(f"r/{self.n}/") for x in s.nodes)
                               for s in request.steps):
            self.n = -1
            raise _Crash
        return result


class _Crash(BaseException):
    pass


async def test_recovery_resumes_at_the_right_iteration(calls: Calls) -> None:
    store = CrashOnIteration(2)
    rt = ExecutionGraphRuntime(catalog=catalog(calls, max_iterations=5,
                                               condition=lambda s: s["iteration"] < 3),
                               store=store)
    await rt.create("rec", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {"x": 0}}]}))
    with pytest.raises(_Crash):
        await rt.run("rec", "w1")
    assert calls.by_node == {"r/0/next": 1, "r/1/next": 1}
    fresh = ExecutionGraphRuntime(catalog=catalog(calls, max_iterations=5,
                                                  condition=lambda s: s["iteration"] < 3),
                                  store=store)
    result = await fresh.run("rec", "w1")
    assert result.output["r"]["iterations"] == 4
    assert calls.by_node == {"r/0/next": 1, "r/1/next": 1, "r/2/next": 1, "r/3/next": 1}


async def test_the_condition_sees_only_durable_completions(calls: Calls) -> None:
    # (review 36) The guard of iteration i ran in the same turn as the completion of the
    # iteration's last node, before that completion was committed: a worker that died (or
    # lost its lease) during the condition left the node running, and the next run
    # executed it again after its output had been used. The condition now runs once the
    # completion is durable, and here it finds the node completed in the store.
    store = InMemoryDurableTaskStore()
    seen: list[tuple[int, str]] = []
    crashed: list[int] = []

    def condition(state: dict[str, Any]) -> bool:
        i = state["iteration"]
        record = store._tasks["durable"].nodes[f"r/{i}/next"]  # what the store holds now
        seen.append((i, record.state))
        if i == 1 and not crashed:
            crashed.append(i)
            raise SystemExit("the worker dies while the condition runs")
        return i < 2

    rt = ExecutionGraphRuntime(catalog=catalog(calls, condition=condition), store=store)
    await rt.create("durable", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {"x": 0}}]}))
    with pytest.raises(SystemExit):
        await rt.run("durable", "w1")
    result = await ExecutionGraphRuntime(catalog=catalog(calls, condition=condition),
                                         store=store).run("durable", "w1")
    assert result.output["r"]["iterations"] == 3
    assert calls.by_node == {"r/0/next": 1, "r/1/next": 1, "r/2/next": 1}
    assert seen == [(0, "completed"), (1, "completed"), (1, "completed"), (2, "completed")]


async def test_expansion_limit_stops_a_repeat_before_materializing(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(calls, max_iterations=10,
                                               condition=lambda s: True))
    await rt.create("x", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {"x": 0}}]}),
        limits=RootLimits(max_expanded_nodes=4))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("x")
    assert info.value.counter == "expanded_nodes"
    view = await rt.inspect("x")
    assert view.counters["expanded_nodes"] == 4  # root + three iterations, never above
    assert view.status == "pending"


async def test_root_input_is_available_as_dollar_input(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(calls))
    await rt.create("in", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": ref("$input", "start")}}]}),
        input={"start": 41})
    assert (await rt.run("in")).output["a"] == {"value": 42}
