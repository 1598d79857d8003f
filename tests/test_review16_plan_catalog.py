"""Review 16: the catalog's preflight of nested programs does not depend on the order of
binding ids, and plans given to validate_plan directly are checked as the JSON they stand
for. Each test failed before its fix; the docstrings say how."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    Agent,
    ConfigurationError,
    ExecutionGraphProgram,
    GraphBinding,
    HostCatalog,
    PlannerConfig,
    ToolBinding,
)
from tests.conftest import INT_OUT


def _tool(id: str = "t") -> ToolBinding:
    return ToolBinding(id=id, version="1", recovery="pure", execute=lambda a: {"value": 1},
                       output_schema=INT_OUT)


def _graph(id: str, nodes: list[dict[str, Any]]) -> GraphBinding:
    return GraphBinding(id=id, version="1", program=ExecutionGraphProgram(
        id=f"{id}-program", version="1",
        plan={"schemaVersion": 1, "revision": 1, "nodes": nodes}))


INNER = _graph("m_inner", [{"id": "x", "binding": "t", "version": "1"}])


@pytest.mark.parametrize("outer_id", ["a_outer", "z_outer"])
def test_a_nested_ref_path_into_a_sub_graph_is_checked_whatever_the_ids(outer_id: str) -> None:
    """Nested programs are validated in binding-id order, and a graph's output schema
    (its node ids -> their outputs) was only known once its own program had been: a
    program sorted before the sub-graph it reads from had its $ref paths into it accepted
    unchecked, to fail mid-run (which the preflight promises never happens)."""
    outer = _graph(outer_id, [
        {"id": "n1", "binding": "m_inner", "version": "1"},
        {"id": "n2", "binding": "t", "version": "1",
         "args": {"v": {"$ref": {"node": "n1", "path": ["x", "nope"]}}}}])
    with pytest.raises(ConfigurationError, match="bad_reference_path") as caught:
        HostCatalog([_tool(), INNER, outer])
    assert outer_id in str(caught.value)
    assert "'nope'" in str(caught.value)


def _provider() -> Any:
    from agentium_graph.providers import ScriptedProvider, ScriptedTurn

    return ScriptedProvider([ScriptedTurn(text="hi")])


BAD = "a\ud800b"  # a lone surrogate: no UTF-8 form, so no store can hold it


@pytest.mark.parametrize("make", [
    lambda: ToolBinding(id="t", version="1", recovery="pure", execute=print,
                        description=BAD),
    lambda: ToolBinding(id="t", version="1", recovery="pure", execute=print,
                        reference_inputs=(BAD,)),
    lambda: ToolBinding(id="t", version="1", recovery="pure", execute=print,
                        reference_outputs=("", BAD)),
    lambda: Agent(provider=_provider(), instructions=BAD),
    lambda: Agent(provider=_provider(), instructions="x", name=BAD),
    lambda: PlannerConfig(provider=_provider(), host_instructions=BAD),
], ids=["description", "reference_inputs", "reference_outputs", "agent_instructions",
        "agent_name", "host_instructions"])
def test_text_no_store_can_hold_is_refused_at_construction(make: Any) -> None:
    """These texts are pinned with a task (descriptors, the planner's offered catalog and
    settings): a lone surrogate was accepted, then HostCatalog or create raised a bare
    NotJSONError (a ValueError) when it was digested."""
    with pytest.raises(ConfigurationError, match="surrogate"):
        make()
