"""Review 16: JSON Schemas a host registers (binding schemas, a program's input_schema) and
the plan args checked against them never crash with a bare RecursionError, AttributeError
or re.error; a schema that could never be used is refused when it is registered.

Each test failed before its fix; the docstrings say how.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ConfigurationError,
    ExecutionGraphProgram,
    HostCatalog,
    PlanLimits,
    PlanValidationError,
    ToolBinding,
)
from agentium_graph.plan import StreamLimits, validate_plan
from tests.test_literal_and_schema_refs import D3, D4, D7

PLAN: dict[str, Any] = {"schemaVersion": 1, "revision": 1, "nodes": []}


def _tool(id: str = "t", version: str = "1", **kw: Any) -> ToolBinding:
    return ToolBinding(id=id, version=version, recovery="pure", execute=lambda a: a, **kw)


def _nested(key: str, levels: int, leaf: Any = None) -> dict[str, Any]:
    top: dict[str, Any] = {}
    cur = top
    for _ in range(levels - 1):
        cur[key] = {}
        cur = cur[key]
    cur[key] = {} if leaf is None else leaf
    return top


# Schemas whose references loop back to the same place without descending into the value:
# validating anything that reaches them recursed until Python's limit (RecursionError
# from plan validation, or from a node's args or output check mid-run).
CYCLES = {
    "self": {"$ref": "#"},
    "mutual": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
               "$ref": "#/$defs/a"},
    "through_anyOf": {"anyOf": [{"type": "string"}, {"$ref": "#"}]},
    "through_allOf_in_defs": {"$defs": {"n": {"allOf": [{"$ref": "#/$defs/n"}]}},
                              "type": "object",
                              "properties": {"x": {"$ref": "#/$defs/n"}}},
    "under_a_property": {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}},
    "if_then": {"if": {"type": "object"}, "then": {"$ref": "#"}},
    "draft7_definitions": {"$schema": D7, "definitions": {"a": {"not": {"$ref": "#"}}},
                           "$ref": "#/definitions/a"},
    "anchor": {"$defs": {"a": {"$anchor": "here", "oneOf": [{"$ref": "#here"}]}},
               "$ref": "#here"},
}

# Recursive schemas that do descend into the value at each level: legitimate, and kept.
RECURSIVE = {
    "tree": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#"}}}},
    "map": {"type": "object", "additionalProperties": {"$ref": "#"}},
    "json_value": {"$defs": {"v": {"anyOf": [
        {"type": ["null", "boolean", "number", "string"]},
        {"type": "array", "items": {"$ref": "#/$defs/v"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}}]}},
        "$ref": "#/$defs/v"},
    "draft7_tree": {"$schema": D7, "definitions": {"n": {"type": "object", "properties": {
        "next": {"$ref": "#/definitions/n"}}}}, "$ref": "#/definitions/n"},
}


@pytest.mark.parametrize("name", sorted(CYCLES))
@pytest.mark.parametrize("field", ["input_schema", "output_schema"])
def test_a_reference_cycle_that_never_descends_is_refused(name: str, field: str) -> None:
    with pytest.raises(ConfigurationError, match="cycle") as caught:
        _tool(**{field: CYCLES[name]})
    assert f"binding 't' {field}" in str(caught.value)


def test_a_program_input_schema_with_a_reference_cycle_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cycle"):
        ExecutionGraphProgram(id="p", version="1", plan=PLAN, input_schema={"$ref": "#"})


@pytest.mark.parametrize("name", sorted(RECURSIVE))
def test_recursive_schemas_that_descend_are_kept(name: str) -> None:
    tool = _tool(input_schema=RECURSIVE[name], output_schema=RECURSIVE[name])
    assert tool.input_errors({}) == []
    ExecutionGraphProgram(id="p", version="1", plan=PLAN, input_schema=RECURSIVE[name])


def test_deep_args_against_a_recursive_schema_are_a_diagnostic() -> None:
    """Args nested 190 levels (plain JSON: under the 200-level bound) against a recursive
    input schema made jsonschema recurse past Python's limit: validate_plan raised a bare
    RecursionError instead of a PlanValidationError naming the node."""
    catalog = HostCatalog([_tool("j", input_schema=RECURSIVE["json_value"])])
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "deep", "binding": "j", "version": "1", "args": _nested("x", 190)},
        {"id": "bad", "binding": "j", "version": "1", "args": {"x": 1}}]}
    with pytest.raises(PlanValidationError) as caught:
        validate_plan(plan, catalog, limits=PlanLimits(max_bytes=1_000_000))
    found = [(d.node_id, d.code) for d in caught.value.diagnostics]
    assert found == [("deep", "args_invalid")]
    assert "too deeply" in caught.value.diagnostics[0].message


def test_deep_values_against_a_recursive_schema_are_errors_not_crashes() -> None:
    tool = _tool(input_schema=RECURSIVE["json_value"], output_schema=RECURSIVE["json_value"])
    deep = _nested("x", 190)
    for errors in (tool.input_errors(deep), tool.output_errors(deep)):
        assert len(errors) == 1 and "too deeply" in errors[0].message
    assert tool.output_errors(_nested("x", 10)) == []


@pytest.mark.parametrize("schema", [{"$schema": 5}, {"$schema": None},
                                    {"$schema": ["x"]}])
def test_a_schema_whose_dialect_is_not_a_string_is_refused(schema: dict[str, Any]) -> None:
    """``{"$schema": 5}`` raised AttributeError ('int' object has no attribute 'decode')
    out of jsonschema's validator_for, in the binding and in a program's input_schema."""
    with pytest.raises(ConfigurationError, match=r"\$schema"):
        _tool(input_schema=schema)
    with pytest.raises(ConfigurationError, match=r"\$schema"):
        ExecutionGraphProgram(id="p", version="1", plan=PLAN, input_schema=schema)


@pytest.mark.parametrize("key", ["items", "not"])
@pytest.mark.parametrize("levels", [150, 190, 5000])
def test_a_schema_nested_too_deeply_is_refused(key: str, levels: int) -> None:
    """A binding schema nested 150 levels (plain JSON) raised RecursionError from the
    metaschema check; 5000 levels raised it from the deep copy of the schema."""
    schema = _nested(key, levels)
    with pytest.raises(ConfigurationError, match="deep"):
        _tool(input_schema=schema)
    with pytest.raises(ConfigurationError, match="deep"):
        ExecutionGraphProgram(id="p", version="1", plan=PLAN, input_schema=schema)


@pytest.mark.parametrize("dialect", [D3, D4])
def test_an_invalid_pattern_property_regex_is_refused(dialect: str) -> None:
    """The draft 3 and 4 metaschemas do not check patternProperties' keys as regexes: the
    schema was accepted, then every check of an object against it raised re.error, and so
    did plan validation of a $ref path into such an output."""
    schema = {"$schema": dialect, "type": "object",
              "properties": {"inner": {"patternProperties": {"(": {}}}}}
    for field in ("input_schema", "output_schema"):
        with pytest.raises(ConfigurationError, match=r"regular expression") as caught:
            _tool(**{field: schema})
        assert "patternProperties" in str(caught.value)


def test_a_version_with_a_non_ascii_digit_does_not_crash_lookups() -> None:
    """'²'.isdigit() is True but int('²') fails: a plan naming a missing version of a
    binding registered as '1.²' raised ValueError from the catalog's version sort."""
    catalog = HostCatalog([_tool("t", "1.²"), _tool("t", "1.2"), _tool("t", "1.10")])
    assert catalog.versions("t") == ["1.²", "1.2", "1.10"]
    assert catalog.latest_tool("t") is catalog.get("t", "1.10")
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "t", "version": "9"}]}
    with pytest.raises(PlanValidationError) as caught:
        validate_plan(plan, catalog, limits=PlanLimits())
    assert [d.code for d in caught.value.diagnostics] == ["unknown_version"]


@pytest.mark.parametrize("cls, field", [
    (PlanLimits, "max_bytes"), (PlanLimits, "max_nodes"), (PlanLimits, "max_depth"),
    (PlanLimits, "max_concurrency"), (StreamLimits, "max_frame_bytes"),
    (StreamLimits, "max_total_bytes"), (StreamLimits, "max_frames"),
    (StreamLimits, "max_latency_ms")])
def test_a_limit_too_large_to_pin_is_refused_at_once(cls: type[Any], field: str) -> None:
    """PlanLimits(max_bytes=10**5000) was accepted; every later use that pins it (create,
    a GraphBinding's descriptor) then raised NotJSONError (a bare ValueError) instead."""
    assert getattr(cls(**{field: 2**63 - 1}), field) == 2**63 - 1
    for huge in (2**63, 10**5000):
        with pytest.raises(ConfigurationError, match=field):
            cls(**{field: huge})


async def test_resolving_an_action_with_a_deep_output_is_refused_not_a_crash() -> None:
    """resolve_action checks the attested output against the pinned output schema with
    jsonschema directly: a deep output (plain JSON) against a recursive schema raised a
    bare RecursionError instead of the ConfigurationError an invalid output gets."""
    from tests.test_resolve_fixes import LostReplies, runtime, stuck

    pay = ToolBinding(id="pay", version="1", connector=LostReplies(), destination="payments",
                      input_schema={"type": "object"}, output_schema=RECURSIVE["json_value"])
    rt = runtime(HostCatalog([pay]))
    [aid] = await stuck(rt, [{"id": "charge", "binding": "pay", "version": "1",
                              "args": {"amount": 5}}])
    deep = ActionOutcome(output=_nested("x", 190), result_ref=aid)
    with pytest.raises(ConfigurationError, match="too deeply"):
        await rt.resolve_action("k", aid, deep, actor="op")
    shallow = ActionOutcome(output={"charge_id": "ch1"}, result_ref=aid)
    view = await rt.resolve_action("k", aid, shallow, actor="op")
    assert view.nodes["charge"].state == "completed"
