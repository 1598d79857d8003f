"""Nested graphs and repeats, found by review 26's hostile user.

* A nested graph whose output failed its schema in the turn a repeat's next iteration was
  refused by a budget: the run raised BudgetExhaustedError and left the task ``pending``
  ("recoverable") although the node had failed for good; only a second run failed it.
* A repeat condition that cannot take the one argument it is called with was accepted, and
  failed only after iteration 0 had spent its tool calls and expansion.
* A deadline that passed while the condition ran still let the next iteration expand
  (charging ``expanded_nodes`` and ``plan_revisions`` after the deadline).
* The journal's ``admission_charged`` entry for a container's expansion named no node.
* ``inspect().nodes`` came in each store's own order (node id on SQLite, insertion order
  on the memory store and MongoDB); it is node-id order everywhere.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    ConfigurationError,
    DeadlineExceededError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    NodeOutputError,
    RepeatBinding,
    RootLimits,
    ToolBinding,
)
from agentium_graph.store import TimelineRequest
from tests.conftest import ManualClock, program

NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}


def _one() -> dict[str, Any]:
    return {"value": 1}


def _node(node_id: str, binding: str) -> dict[str, Any]:
    return {"id": node_id, "binding": binding, "version": "1", "args": {}}


def _prog(pid: str, *nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id=pid, version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


def _tool() -> ToolBinding:
    return ToolBinding(id="one", version="1", execute=lambda args: _one(), recovery="pure",
                       output_schema=NUM, run_in_thread=False)


def _repeat(condition: Any, max_iterations: int = 3) -> RepeatBinding:
    return RepeatBinding(id="rep", version="1", program=_prog("rp", _node("a", "one")),
                         max_iterations=max_iterations, condition=condition)


async def test_a_container_failure_beside_a_budget_stop_fails_the_task() -> None:
    catalog = HostCatalog([_tool(), _repeat(lambda s: True), GraphBinding(
        id="bad", version="1", program=_prog("gp", _node("b", "one")),
        output_schema={"type": "object", "required": ["zzz"]})])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
        _node("A", "rep"), _node("B", "bad")]}), limits=RootLimits(max_expanded_nodes=4))
    with pytest.raises(NodeOutputError) as info:
        await runtime.run("k")
    assert info.value.node_id == "B"
    view = await runtime.inspect("k")
    assert view.status == "failed"
    assert view.nodes["B"].state == "failed"
    assert view.nodes["A"].state == "canceled"


@pytest.mark.parametrize("condition", [lambda: True, lambda *, state: True,
                                       lambda a, b: True])
def test_a_condition_that_cannot_take_the_state_is_refused(condition: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _repeat(condition)
    assert "condition" in str(info.value) and "one positional argument" in str(info.value)


def _limited(limit: int) -> Any:
    """A decorator whose wrapper takes the state and calls what it wraps with more."""
    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(state: dict[str, Any]) -> bool:
            return bool(fn(state, limit))
        return wrapper
    return decorate


@_limited(2)
def _wrapped(state: dict[str, Any], limit: int) -> bool:
    return bool(state["iteration"] + 1 < limit)


class _Callable:
    def __call__(self, state: dict[str, Any]) -> bool:
        return False

    def method(self, state: dict[str, Any]) -> bool:
        return False


@pytest.mark.parametrize("condition", [
    lambda s: True, lambda s, extra=1: True, lambda *args: True, bool, _wrapped,
    functools.partial(lambda limit, s: True, 3), _Callable(), _Callable().method])
def test_conditions_that_take_one_argument_are_accepted(condition: Any) -> None:
    assert _repeat(condition).condition is condition


async def test_a_deadline_passed_during_the_condition_expands_no_iteration() -> None:
    clock = ManualClock()

    def slow(state: dict[str, Any]) -> bool:
        clock.advance(120)  # the condition took two minutes
        return True

    store = InMemoryDurableTaskStore()
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([_tool(), _repeat(slow)]),
                                    store=store, clock=clock)
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1,
                                       "nodes": [_node("R", "rep")]}),
                         deadline=timedelta(seconds=60))
    with pytest.raises(DeadlineExceededError):
        await runtime.run("k")
    view = await runtime.inspect("k")
    assert set(view.nodes) == {"R", "R/0/a"}
    assert view.counters["expanded_nodes"] == 2 and view.counters["plan_revisions"] == 2
    entries = await store.read_timeline(TimelineRequest(key="k", limit=500))
    assert not [e for e in entries if e.kind in ("repeat_guard", "repeat_iteration")
                and e.data.get("iteration", 0) >= 1]


async def test_an_expansion_charge_names_its_container_and_nodes_come_sorted() -> None:
    store = InMemoryDurableTaskStore()
    runtime = ExecutionGraphRuntime(
        catalog=HostCatalog([_tool(), _repeat(lambda s: s["iteration"] < 1)]), store=store)
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
        _node("z", "one"), _node("R", "rep"), _node("b", "one")]}))
    await runtime.run("k")
    entries = await store.read_timeline(TimelineRequest(key="k", limit=500))
    expansions = [e for e in entries if e.kind == "admission_charged"
                  and "expanded_nodes" in e.data.get("charges", e.data)]
    assert [e.node_id for e in expansions] == ["R", "R"]  # its two iterations
    view = await runtime.inspect("k")
    assert list(view.nodes) == sorted(view.nodes) == ["R", "R/0/a", "R/1/a", "b", "z"]


@pytest.mark.parametrize("kind", [GraphBinding, RepeatBinding])
def test_a_plan_dict_as_the_program_names_the_binding_and_the_fix(kind: Any) -> None:
    extra = {"max_iterations": 2, "condition": lambda s: True} if kind is RepeatBinding else {}
    with pytest.raises(ConfigurationError) as info:
        kind(id="nested", version="1", program={"schemaVersion": 1, "revision": 1,
                                                "nodes": [_node("a", "one")]}, **extra)
    text = str(info.value)
    assert "'nested'" in text and "program" in text and "not a plan dict" in text


class bool_:
    """Named as numpy's, whose type calls itself 'bool' in numpy 2."""

    def __bool__(self) -> bool:
        return True


bool_.__qualname__ = "bool"  # what type(numpy.True_).__name__ shows


async def test_a_bool_look_alike_from_another_module_is_named_by_its_module() -> None:
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([_tool(), _repeat(lambda s: bool_())]))
    await runtime.create("k", program({"schemaVersion": 1, "revision": 1,
                                       "nodes": [_node("R", "rep")]}))
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    assert f"returned {__name__}.bool on iteration 0" in str(info.value)
    assert "a Python bool" in str(info.value)
