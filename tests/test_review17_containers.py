"""Nested graphs and repeats attacked as a hostile user would (review 17).

* A ``$ref`` into a repeat node's output along a field that output never has (``r.nope``,
  ``r.last.nope``) was accepted by ``create``: the whole repeat ran (charging budgets,
  dispatching effects) and only then did the consumer fail with ``NodeInputError``. A
  repeat's output has a fixed shape (``iterations``, ``stopped``, ``last`` = the map of
  its program's node ids to their outputs), so such a path is now a ``bad_reference_path``
  diagnostic at ``create``, as one into a graph node's output already was.
* ``{"$ref": {"node": "$previous", "path": [...]}}`` with a non-empty path was accepted by
  the catalog, but ``$previous`` is null in the first iteration, so the first iteration
  failed on every run: such a repeat could never complete. The catalog refuses it now.
* When one repeat's guard failed, or its next iteration was refused by a budget, another
  repeat settled in the same turn still materialized its next iteration, charging
  ``expanded_nodes`` and ``plan_revisions`` for nodes born canceled or never runnable.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    PlanValidationError,
    RepeatBinding,
    ToolBinding,
)
from tests.conftest import program

NUM = {"type": "object", "properties": {"value": {"type": "integer"}},
       "required": ["value"], "additionalProperties": False}


def ref(node: str, *path: Any) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


def _inc(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": int(args.get("x") or 0) + 1}


def _tool() -> ToolBinding:
    return ToolBinding(id="inc", version="1", execute=_inc, recovery="pure",
                       output_schema=NUM, run_in_thread=False)


STEP = ExecutionGraphProgram(id="step", version="1", plan={
    "schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "up", "binding": "inc", "version": "1", "args": {"x": 1}}]})


def _loop_catalog(**extra: Any) -> HostCatalog:
    return HostCatalog([_tool(), RepeatBinding(id="loop", version="1", program=STEP,
                                               max_iterations=2,
                                               condition=lambda s: True, **extra)])


def _consumer_plan(*path: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {}},
        {"id": "b", "binding": "inc", "version": "1", "args": {"x": ref("r", *path)}}]}


@pytest.mark.parametrize(("path", "field"), [
    (("nope",), "nope"), (("last", "nope"), "nope"), (("last", "up", "nope"), "nope"),
    (("iterations", "x"), "x")])
async def test_a_path_a_repeat_output_never_has_is_refused_at_create(
        path: tuple[str, ...], field: str) -> None:
    runtime = ExecutionGraphRuntime(catalog=_loop_catalog())
    with pytest.raises(PlanValidationError) as caught:
        await runtime.create("k", program(_consumer_plan(*path)))
    (problem,) = caught.value.diagnostics
    assert problem.code == "bad_reference_path"
    assert problem.node_id == "b" and problem.path == "$.nodes[1].args.x.$ref.path"
    assert field in problem.message
    assert await runtime.store.get_header("k") is None  # nothing stored


@pytest.mark.parametrize("path", [
    ("iterations",), ("stopped",), ("last",), ("last", "up"), ("last", "up", "value")])
async def test_paths_a_repeat_output_has_are_taken_and_resolve(path: tuple[str, ...]) -> None:
    runtime = ExecutionGraphRuntime(catalog=_loop_catalog())
    await runtime.create("k", program(_consumer_plan(*path)))
    view = await runtime.inspect("k")
    assert set(view.nodes) == {"r", "b"}


async def test_a_declared_repeat_output_schema_still_decides_what_refs_may_name() -> None:
    # The host's own output_schema is what references are checked against, as for a graph.
    declared = {"type": "object", "properties": {"iterations": {"type": "integer"}},
                "additionalProperties": True}
    runtime = ExecutionGraphRuntime(catalog=_loop_catalog(output_schema=declared))
    await runtime.create("k", program(_consumer_plan("anything")))


@pytest.mark.parametrize("path", [["up"], ["up", "value"]])
def test_a_path_into_previous_is_refused_by_the_catalog(path: list[str]) -> None:
    body = ExecutionGraphProgram(id="acc", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "up", "binding": "inc", "version": "1",
             "args": {"x": {"$ref": {"node": "$previous", "path": path}}}}]})
    with pytest.raises(ConfigurationError) as caught:
        HostCatalog([_tool(), RepeatBinding(id="loop", version="1", program=body,
                                            max_iterations=3, condition=lambda s: True)])
    message = str(caught.value)
    assert "'loop'" in message and "$previous" in message and "null" in message
    assert "bad_reference_path" in caught.value.details["codes"]


async def test_previous_taken_whole_still_works() -> None:
    def acc(args: dict[str, Any]) -> dict[str, Any]:
        prev = args["prev"]
        return {"value": (prev["up"]["value"] if prev else 0) + 1}

    body = ExecutionGraphProgram(id="acc", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "up", "binding": "acc", "version": "1", "args": {"prev": ref("$previous")}}]})
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="acc", version="1", execute=acc, recovery="pure", output_schema=NUM),
        RepeatBinding(id="loop", version="1", program=body, max_iterations=3,
                      condition=lambda s: True)]))
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "r", "binding": "loop", "version": "1", "args": {}}]}))
    result = await runtime.run("k")
    assert result.output["r"] == {"iterations": 3, "stopped": "max_iterations",
                                  "last": {"up": {"value": 3}}}


# A stopping run starts no new iteration: when one repeat's guard failed (or its next
# iteration was refused by a budget), another repeat settled in the same turn still
# materialized its next iteration, charging expanded_nodes and plan_revisions for nodes
# born canceled (or never runnable), and journaled a "continue" guard in a failed task.

def _mark(args: dict[str, Any]) -> dict[str, Any]:
    return {"v": 1}


def _two_loops(bad_condition: Any, bad_width: int) -> HostCatalog:
    def body(width: int) -> ExecutionGraphProgram:
        return ExecutionGraphProgram(id=f"body{width}", version="1", plan={
            "schemaVersion": 1, "revision": 1, "nodes": [
                {"id": f"x{i}", "binding": "mark", "version": "1", "args": {}}
                for i in range(width)]})

    return HostCatalog([
        ToolBinding(id="mark", version="1", execute=_mark, recovery="pure",
                    run_in_thread=False),
        RepeatBinding(id="first", version="1", program=body(bad_width), max_iterations=3,
                      condition=bad_condition),
        RepeatBinding(id="second", version="1", program=body(1), max_iterations=3,
                      condition=lambda s: True)])


TWO_LOOPS = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "first", "version": "1", "args": {}},
    {"id": "b", "binding": "second", "version": "1", "args": {}}]}


async def _guards(runtime: ExecutionGraphRuntime, key: str) -> list[tuple[str | None, Any]]:
    events = (await runtime.timeline(key, limit=1000)).events
    return [(e.node_id, e.data) for e in events if e.kind in ("repeat_guard",
                                                               "repeat_iteration")]


async def test_a_failing_run_starts_no_new_iteration_of_another_repeat() -> None:
    def broken(state: dict[str, Any]) -> bool:
        raise ValueError("cannot decide")

    runtime = ExecutionGraphRuntime(catalog=_two_loops(broken, 1))
    await runtime.create("k", program(TWO_LOOPS))
    with pytest.raises(NodeFailedError, match="cannot decide") as caught:
        await runtime.run("k")
    assert caught.value.node_id == "a"
    view = await runtime.inspect("k")
    assert view.status == "failed" and view.verified
    assert set(view.nodes) == {"a", "b", "a/0/x0", "b/0/x0"}  # no b/1/x0 born canceled
    assert view.counters["expanded_nodes"] == 4 and view.counters["plan_revisions"] == 3
    assert ("b", {"iteration": 0, "decision": "continue"}) not in await _guards(runtime, "k")


async def test_a_budget_stop_starts_no_new_iteration_of_another_repeat() -> None:
    # a's next iteration needs 2 nodes, b's 1; one is left: a is refused, and b must not
    # take the rest while the run stops (its iteration could never run before a's anyway).
    runtime = ExecutionGraphRuntime(catalog=_two_loops(lambda s: True, 2))
    await runtime.create("k", program(TWO_LOOPS), limits={"max_expanded_nodes": 6})
    for _ in range(2):  # the next run stops the same way and charges nothing more
        with pytest.raises(BudgetExhaustedError) as caught:
            await runtime.run("k")
        assert caught.value.counter == "expanded_nodes" and caught.value.node_id == "a"
        view = await runtime.inspect("k")
        assert view.status == "pending" and view.verified
        assert set(view.nodes) == {"a", "b", "a/0/x0", "a/0/x1", "b/0/x0"}
        assert view.counters["expanded_nodes"] == 5 and view.counters["plan_revisions"] == 3
