"""``$previous`` and ``$input`` references are checked where their answer is already known:
``$previous`` only exists in a repeat's program, and the root's ``$input`` is the task's
input, given at create."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    NodeInputError,
    PlanValidationError,
    RepeatBinding,
    ToolBinding,
)

OBJ = {"type": "object"}


def plan(*nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


def echo_node(node_id: str, ref_node: str, *path: Any) -> dict[str, Any]:
    return {"id": node_id, "binding": "echo", "version": "1",
            "args": {"x": {"$ref": {"node": ref_node, "path": list(path)}}}}


def echo() -> ToolBinding:
    return ToolBinding(id="echo", version="1", execute=lambda a: a, recovery="pure",
                       input_schema=OBJ, output_schema=OBJ)


async def test_previous_in_a_root_plan_is_refused_at_create() -> None:
    rt = ExecutionGraphRuntime(catalog=HostCatalog([echo()]))
    with pytest.raises(PlanValidationError) as caught:
        await rt.create("k", plan(echo_node("a", "$previous")))
    [diag] = caught.value.diagnostics
    assert (diag.code, diag.node_id, diag.path) == \
        ("bad_reference", "a", "$.nodes[0].args.x.$ref.node")
    assert "RepeatBinding" in diag.message


async def test_an_input_path_the_given_input_lacks_is_refused_at_create() -> None:
    rt = ExecutionGraphRuntime(catalog=HostCatalog([echo()]))
    program = plan(echo_node("a", "$input", "customer", "id"), echo_node("b", "$input", "sku"))
    with pytest.raises(PlanValidationError) as caught:
        await rt.create("k", program, input={"customer": {"name": "x"}, "sku": "A-1"})
    [diag] = caught.value.diagnostics
    assert (diag.code, diag.node_id, diag.path) == \
        ("bad_reference_path", "a", "$.nodes[0].args.x.$ref.path")
    assert "input has no 'id'" in diag.message
    # The same plan with an input that has the path is fine, and resolves it.
    await rt.create("ok", program, input={"customer": {"id": 7}, "sku": "A-1"})
    assert (await rt.run("ok")).output == {"a": {"x": 7}, "b": {"x": "A-1"}}


def test_previous_in_a_nested_graph_program_is_refused_with_the_catalog() -> None:
    inner = plan(echo_node("x", "$previous"))
    with pytest.raises(ConfigurationError,
                       match=r"(?s)graph binding 'g'.*\$previous .*only inside"):
        HostCatalog([echo(), GraphBinding(id="g", version="1", program=inner)])


async def test_previous_and_input_in_a_repeat_program_are_accepted_and_resolve() -> None:
    inner = plan(echo_node("x", "$previous"), echo_node("y", "$input", "n"))
    rt = ExecutionGraphRuntime(catalog=HostCatalog([echo(), RepeatBinding(
        id="loop", version="1", program=inner, max_iterations=2,
        condition=lambda state: True)]))
    await rt.create("k", plan({"id": "r", "binding": "loop", "version": "1",
                               "args": {"n": 5}}))
    out = (await rt.run("k")).output["r"]
    assert out["iterations"] == 2
    assert out["last"]["x"] == {"x": {"x": {"x": None}, "y": {"x": 5}}}  # iteration 0's
    assert out["last"]["y"] == {"x": 5}


async def test_a_container_input_path_that_is_missing_names_the_input_at_run() -> None:
    inner = plan(echo_node("y", "$input", "nope"))
    rt = ExecutionGraphRuntime(catalog=HostCatalog([echo(), GraphBinding(
        id="g", version="1", program=inner)]))
    await rt.create("k", plan({"id": "c", "binding": "g", "version": "1", "args": {"n": 1}}))
    with pytest.raises(NodeInputError, match="the input has no 'nope'"):
        await rt.run("k")
