"""Review 19: what a careless host could hand the runtime and have it take.

* A ``$ref`` standing for a node's whole args was accepted at create and resolved at run
  time to whatever it named: a pure tool was called with a list, an effect node failed as
  if its connector had raised (a pydantic error about ActionRequest) and left its action
  intent ``dispatching`` on the failed task, and an agent failed with an AttributeError.
  It is now ``NodeInputError`` naming the node, before any tool, connector or agent.
* A nested program's ``input_schema`` was accepted and pinned but never checked: a graph
  or repeat binding ran its program on args the program refuses as a root task's input.
* A tool returning a dict subclass whose ``__eq__`` raises failed as if the tool had raised
  (the output check compared with it); its plain JSON is taken as the output.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    PlanValidationError,
    RepeatBinding,
    ToolBinding,
)
from agentium_graph.testing import ScriptedProvider

ANY: dict[str, Any] = {}
WHOLE = {"$ref": {"node": "a", "path": ["items"]}}


def node(node_id: str, binding: str, args: Any = None) -> dict[str, Any]:
    return {"id": node_id, "binding": binding, "version": "1",
            "args": {} if args is None else args}


def program(*nodes: dict[str, Any], input_schema: dict[str, Any] | None = None,
            name: str = "p") -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id=name, version="1", input_schema=input_schema,
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


class Destination:
    """A connector whose destination records every dispatch."""

    id = "dest"
    version = "1"
    idempotent_destination = True

    def __init__(self) -> None:
        self.dispatched: list[ActionRequest] = []

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request)
        return ActionOutcome(output={"ok": True}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> Absent:
        return Absent()


@pytest.mark.parametrize("kind", ["pure", "effect", "agent"])
@pytest.mark.parametrize("items", [[1, 2, 3], "text", None, 7])
async def test_a_whole_args_ref_to_no_object_is_node_input_error(kind: str,
                                                                 items: Any) -> None:
    seen: list[Any] = []
    destination = Destination()

    def produce(args: dict[str, Any]) -> dict[str, Any]:
        return {"items": items}

    def consume(args: Any) -> dict[str, Any]:
        seen.append(args)
        return {"ok": True}

    provider = ScriptedProvider(["hi"])
    catalog = HostCatalog([
        ToolBinding(id="produce", version="1", execute=produce, recovery="pure",
                    input_schema=ANY, output_schema=ANY),
        ToolBinding(id="pure", version="1", execute=consume, recovery="pure",
                    input_schema=ANY, output_schema=ANY),
        ToolBinding(id="effect", version="1", connector=destination, destination="charges",
                    input_schema=ANY, output_schema=ANY),
        AgentBinding(id="agent", version="1", agent=Agent(provider, "say hi"))])
    runtime = ExecutionGraphRuntime(catalog=catalog, store=InMemoryDurableTaskStore())
    await runtime.create("k", program(node("a", "produce"), node("b", kind, WHOLE)))
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    assert info.value.cause is not None and info.value.cause.code == "node_input_invalid"
    assert "node 'b'" in str(info.value) and "must be an object" in str(info.value)
    view = await runtime.inspect("k")
    assert view.status == "failed" and view.verified
    assert view.nodes["b"].state == "failed" and not view.nodes["b"].attempts
    assert not view.actions  # no intent recorded for an effect nobody will dispatch
    assert seen == [] and destination.dispatched == []
    assert view.counters["model_calls"] == 0


async def test_a_whole_args_ref_to_an_object_still_works() -> None:
    catalog = HostCatalog([
        ToolBinding(id="produce", version="1", recovery="pure", input_schema=ANY,
                    output_schema=ANY, execute=lambda args: {"items": dict(x=1)}),
        ToolBinding(id="echo", version="1", recovery="pure", input_schema=ANY,
                    output_schema=ANY, execute=lambda args: {"got": args})])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    await runtime.create("k", program(node("a", "produce"), node("b", "echo", WHOLE)))
    result = await runtime.run("k")
    assert result.output["b"] == {"got": {"x": 1}}


SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}


def _nested_catalog(calls: list[Any] | None = None) -> HostCatalog:
    def echo(args: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append(args)
        return {"got": args}

    inner = program(node("i", "echo", {"v": {"$ref": {"node": "$input", "path": []}}}),
                    input_schema=SCHEMA, name="inner")
    return HostCatalog([
        ToolBinding(id="echo", version="1", recovery="pure", input_schema=ANY,
                    output_schema=ANY, execute=echo),
        ToolBinding(id="produce", version="1", recovery="pure", input_schema=ANY,
                    output_schema=ANY, execute=lambda args: {"n": "not an int"}),
        GraphBinding(id="g", version="1", program=inner),
        RepeatBinding(inner, 2, condition=lambda state: False, id="r", version="1")])


@pytest.mark.parametrize("binding", ["g", "r"])
@pytest.mark.parametrize("args", [{"n": "not an int"}, {}])
async def test_a_nested_programs_input_schema_refuses_static_args(binding: str,
                                                                  args: Any) -> None:
    runtime = ExecutionGraphRuntime(catalog=_nested_catalog())
    with pytest.raises(PlanValidationError) as info:
        await runtime.create("k", program(node("c", binding, args)))
    assert [d.code for d in info.value.diagnostics] == ["args_invalid"]
    assert info.value.diagnostics[0].node_id == "c"


@pytest.mark.parametrize("binding", ["g", "r"])
async def test_a_nested_programs_input_schema_refuses_resolved_args(binding: str) -> None:
    calls: list[Any] = []
    runtime = ExecutionGraphRuntime(catalog=_nested_catalog(calls))
    await runtime.create("k", program(
        node("a", "produce"), node("c", binding, {"n": {"$ref": {"node": "a",
                                                                 "path": ["n"]}}})))
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    assert info.value.cause is not None and info.value.cause.code == "node_input_invalid"
    view = await runtime.inspect("k")
    assert view.nodes["c"].state == "failed" and view.verified
    assert calls == []  # the nested program never ran on args it refuses


@pytest.mark.parametrize("binding", ["g", "r"])
async def test_a_nested_program_runs_on_args_its_schema_accepts(binding: str) -> None:
    calls: list[Any] = []
    runtime = ExecutionGraphRuntime(catalog=_nested_catalog(calls))
    await runtime.create("k", program(node("c", binding, {"n": 3})))
    result = await runtime.run("k")
    assert result.status == "completed"
    assert calls and all(call == {"v": {"n": 3}} for call in calls)


class RaisingEq(dict[str, Any]):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = None  # type: ignore[assignment]


async def test_an_output_whose_eq_raises_is_taken_as_its_json() -> None:
    catalog = HostCatalog([ToolBinding(
        id="t", version="1", recovery="pure", input_schema=ANY, output_schema=ANY,
        execute=lambda args: RaisingEq(a=1))])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    await runtime.create("k", program(node("a", "t")))
    result = await runtime.run("k")
    assert result.output["a"] == {"a": 1} and type(result.output["a"]) is dict
