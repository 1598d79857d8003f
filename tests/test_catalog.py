"""Bindings, the host catalog and programs: preflight rejects what cannot be recovered."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft7Validator, Draft202012Validator

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    ConfigurationError,
    ExecutionGraphProgram,
    GraphBinding,
    HostCatalog,
    PlanLimits,
    PlannerConfig,
    RepeatBinding,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ScriptedProvider


def echo(args: dict[str, Any]) -> dict[str, Any]:
    return args


class FakeConnector:
    def __init__(self, id: str = "http", version: str = "1", idempotent: bool = True) -> None:
        self.id = id
        self.version = version
        self.idempotent_destination = idempotent

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        return ActionOutcome(output={}, result_ref=request.action_id)

    async def resolve_result(self, result_ref: str) -> Unknown:
        return Unknown(reason="fake")


def pure(id: str = "t", version: str = "1", **kw: Any) -> ToolBinding:
    return ToolBinding(id=id, version=version, recovery="pure", execute=echo, **kw)


def effect(id: str = "send", version: str = "1", destination: str = "https://x.example",
           connector: Any = None, **kw: Any) -> ToolBinding:
    return ToolBinding(id=id, version=version, connector=connector or FakeConnector(),
                       destination=destination, **kw)


def plan(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": list(nodes)}


def program(p: dict[str, Any], id: str = "p", **kw: Any) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id=id, version="1", plan=p, **kw)


# --- ToolBinding recovery policy --------------------------------------------------------

def test_pure_tool_descriptor() -> None:
    d = pure(input_schema={"type": "object"}).descriptor()
    assert (d.kind, d.id, d.version, d.recovery) == ("tool", "t", "1", "pure")
    assert d.destination is None and d.connector_id is None


def test_tool_without_recovery_or_connector_is_rejected_clearly() -> None:
    with pytest.raises(ConfigurationError) as info:
        ToolBinding(id="charge", version="1", execute=echo)
    msg = str(info.value)
    assert "'charge'" in msg
    assert "recovery='pure'" in msg and "connector=" in msg and "destination=" in msg


def test_pure_tool_needs_execute() -> None:
    with pytest.raises(ConfigurationError, match=r"pure tool 't' needs execute=callable"):
        ToolBinding(id="t", version="1", recovery="pure")


def test_destination_without_connector_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"destination= needs connector="):
        ToolBinding(id="t", version="1", recovery="pure", execute=echo, destination="x")


@pytest.mark.parametrize("destination", [None, ""])
def test_connector_without_destination_rejected(destination: str | None) -> None:
    with pytest.raises(ConfigurationError, match=r"connector= needs a host-bound destination"):
        ToolBinding(id="t", version="1", connector=FakeConnector(), destination=destination)


def test_execute_and_connector_together_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot be combined with connector="):
        ToolBinding(id="t", version="1", connector=FakeConnector(), destination="d",
                    execute=echo)


def test_connector_tool_cannot_claim_pure() -> None:
    with pytest.raises(ConfigurationError, match=r"not pure; drop recovery='pure'"):
        ToolBinding(id="t", version="1", connector=FakeConnector(), destination="d",
                    recovery="pure")


@pytest.mark.parametrize("missing", ["id", "version", "idempotent_destination", "dispatch",
                                     "resolve_result"])
def test_connector_must_implement_protocol(missing: str) -> None:
    attrs = {"id": "c", "version": "1", "idempotent_destination": True,
             "dispatch": echo, "resolve_result": echo}
    del attrs[missing]
    connector = type("Partial", (), attrs)()
    with pytest.raises(ConfigurationError, match=rf"connector lacks '{missing}'"):
        ToolBinding(id="t", version="1", connector=connector, destination="d")


def test_unknown_recovery_value_rejected() -> None:
    with pytest.raises(ConfigurationError, match="recovery"):
        ToolBinding(id="t", version="1", recovery="retry", execute=echo)


def test_connector_descriptor() -> None:
    d = effect(connector=FakeConnector("mail", "3", idempotent=False)).descriptor()
    assert (d.recovery, d.destination, d.connector_id, d.connector_version) == (
        "connector", "https://x.example", "mail", "3")
    assert d.idempotent_destination is False


@pytest.mark.parametrize("bad_id", ["", "has space", "a/b", "x" * 201])
def test_binding_id_format(bad_id: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid ToolBinding"):
        pure(id=bad_id)


def test_unknown_binding_option_rejected() -> None:
    with pytest.raises(ConfigurationError, match="retries"):
        ToolBinding(id="t", version="1", recovery="pure", execute=echo,
                    retries=3)  # type: ignore[call-arg]


# --- schemas ----------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["input_schema", "output_schema"])
def test_invalid_json_schema_names_binding_and_location(field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        kw: dict[str, Any] = {field: {"type": "object",
                                      "properties": {"a": {"type": "strin"}}}}
        pure(id="lookup", **kw)
    msg = str(info.value)
    assert f"binding 'lookup' {field} is not a valid JSON Schema" in msg
    assert "schema.properties.a.type" in msg


@pytest.mark.parametrize(("schema", "ref", "at"), [
    ({"$ref": "https://example.com/order.json"}, "https://example.com/order.json",
     "schema.$ref"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "#/$defs/missing",
     "schema.properties.a.$ref"),
    ({"$schema": "http://json-schema.org/draft-07/schema#",
      "items": [{"$ref": "#/definitions/none"}]}, "#/definitions/none", "schema.items[0].$ref"),
    ({"$ref": "other.json#/x"}, "other.json#/x", "schema.$ref"),
], ids=["remote", "dangling-pointer", "draft7-tuple-items", "relative-document"])
@pytest.mark.parametrize("field", ["input_schema", "output_schema"])
def test_a_ref_that_does_not_resolve_within_the_schema_is_refused(
        field: str, schema: dict[str, Any], ref: str, at: str) -> None:
    # jsonschema would accept it now and fail with an untyped error mid-run, or fetch it.
    with pytest.raises(ConfigurationError) as info:
        pure(id="lookup", **{field: schema})
    assert f"binding 'lookup' {field}" in str(info.value)
    assert info.value.details == {"ref": ref, "path": at}
    assert "$defs" in str(info.value)


def test_refs_that_resolve_within_the_schema_are_fine() -> None:
    schema = {
        "$defs": {"n": {"type": "integer"},
                  "pair": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/pair"},
                       # a property *named* "$ref" is data, not a reference
                       "$ref": {"type": "string"}},
        "enum_holder": {"const": {"$ref": "not-a-reference"}},
        "$comment": "an embedded resource resolves against its own $id",
        "allOf": [{"$id": "https://example.com/inner", "$ref": "#/$defs/x",
                   "$defs": {"x": {}}}]}
    binding = pure(id="lookup", input_schema=schema)
    assert binding.input_errors({"a": 1, "b": [2, 3]}) == []
    assert [e.message for e in binding.input_errors({"a": "x"})] == ["'x' is not of type 'integer'"]


def test_program_input_schema_refs_must_resolve() -> None:
    with pytest.raises(ConfigurationError,
                       match=r"program 'p': input_schema: the reference '#/\$defs/gone'"):
        program(plan(), input_schema={"$ref": "#/$defs/gone"})


def test_invalid_regex_in_schema_rejected() -> None:
    with pytest.raises(ConfigurationError, match="'lookup' input_schema"):
        pure(id="lookup", input_schema={"type": "string", "pattern": "("})


def test_non_json_schema_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"'t' output_schema is not JSON data"):
        pure(output_schema={"enum": [float("nan")]})


def test_schema_must_be_object() -> None:
    with pytest.raises(ConfigurationError, match="input_schema"):
        pure(input_schema="string")


def test_schema_draft_follows_dollar_schema() -> None:
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
              "items": [{"type": "integer"}], "additionalItems": False}
    b = pure(input_schema=draft7)
    assert isinstance(b.input_validator, Draft7Validator)
    assert b.input_validator.is_valid([1])
    assert not b.input_validator.is_valid([1, 2])  # draft-07 tuple semantics
    assert isinstance(pure().input_validator, Draft202012Validator)


def test_validators_are_compiled_once() -> None:
    b = pure(input_schema={"type": "object"})
    assert b.input_validator is b.input_validator
    assert b.output_validator is b.output_validator


def test_schemas_are_deep_copied_from_the_caller() -> None:
    schema: dict[str, Any] = {"type": "object",
                              "properties": {"n": {"type": "integer"}}}
    before = copy.deepcopy(schema)
    b = pure(input_schema=schema, output_schema=schema)
    catalog = HostCatalog([b])
    digest = catalog.digest
    schema["properties"]["n"]["type"] = "string"
    schema["required"] = ["n"]
    assert b.input_schema == before and b.output_schema == before
    assert b.input_validator.is_valid({"n": 1}) and b.input_validator.is_valid({})
    assert HostCatalog([b]).digest == digest


def test_descriptor_is_fixed_once_computed() -> None:
    b = pure(input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    catalog = HostCatalog([b])
    b.input_schema["properties"]["n"]["type"] = "string"
    assert b.descriptor() == catalog.descriptor("t", "1")
    assert b.descriptor().input_schema["properties"]["n"] == {"type": "integer"}


def test_validator_does_not_share_the_bindings_schema() -> None:
    b = pure(input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    b.input_schema["properties"]["n"]["type"] = "string"
    assert b.input_validator.is_valid({"n": 1})


# --- Agent ----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "value"), [
    ("result_cache", {}), ("tool_resolver", echo), ("memory", []),
    ("handoffs", ("other",)), ("hooks", (echo,)),
])
def test_agent_opaque_features_rejected(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        Agent(provider=object(), instructions="hi", name="helper", **{name: value})
    assert name in str(info.value)
    assert "'helper'" in str(info.value)


def test_agent_unknown_features_rejected() -> None:
    with pytest.raises(ConfigurationError, match="session"):
        Agent(provider=object(), instructions="hi", session=object())


def test_agent_naming_unknown_tools_rejected() -> None:
    agent = AgentBinding(id="writer", version="1",
                         agent=Agent(provider=ScriptedProvider([]), instructions="w",
                                     tools=("lookup", "nope")))
    with pytest.raises(ConfigurationError) as info:
        HostCatalog([pure(id="lookup"), agent])
    assert "'writer'" in str(info.value)
    assert "names tools ['nope'] that are not tool bindings" in str(info.value)


def test_agent_tools_must_be_tool_bindings() -> None:
    inner = ExecutionGraphProgram(id="g", version="1", plan=plan())
    agent = AgentBinding(id="writer", version="1",
                         agent=Agent(provider=ScriptedProvider([]), instructions="w",
                                     tools=("sub",)))
    with pytest.raises(ConfigurationError, match="'sub'"):
        HostCatalog([GraphBinding(id="sub", version="1", program=inner), agent])


def test_agent_with_known_tools_accepted_and_described() -> None:
    agent = AgentBinding(id="writer", version="1",
                         agent=Agent(provider=ScriptedProvider([]), instructions="w",
                                     tools=("lookup",)))
    catalog = HostCatalog([pure(id="lookup"), agent])
    d = catalog.descriptor("writer", "1")
    assert d is not None and d.kind == "agent" and d.tools == ("lookup",)
    assert d.extra["instructions"] == "w"


# --- HostCatalog ------------------------------------------------------------------------

def test_duplicate_id_and_version_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"'t' version '1' is registered twice"):
        HostCatalog([pure(), pure()])


def test_same_id_other_version_allowed_and_listed_in_version_order() -> None:
    catalog = HostCatalog([pure(version="10"), pure(version="9"), pure(version="2.1")])
    assert catalog.versions("t") == ["2.1", "9", "10"]
    assert catalog.versions("nope") == []
    latest = catalog.latest_tool("t")
    assert latest is not None and latest.version == "10"
    assert catalog.latest_tool("nope") is None
    assert len(catalog) == 3
    assert {b.version for b in catalog} == {"10", "9", "2.1"}


def test_catalog_entries_must_be_bindings() -> None:
    with pytest.raises(ConfigurationError, match="not dict"):
        HostCatalog([{"id": "t"}])  # type: ignore[list-item]


def test_get_and_descriptor() -> None:
    b = pure()
    catalog = HostCatalog([b])
    assert catalog.get("t", "1") is b
    assert catalog.get("t", "2") is None
    assert catalog.descriptor("t", "1") == b.descriptor()
    assert catalog.descriptor("x", "1") is None


def _bindings() -> list[Any]:
    return [pure(id="a", input_schema={"type": "object"}), pure(id="b"), effect()]


def test_catalog_digest_independent_of_registration_order() -> None:
    forward = HostCatalog(_bindings())
    backward = HostCatalog(list(reversed(_bindings())))
    assert forward.digest == backward.digest
    assert forward.digest.startswith("sha256:")


def test_catalog_digest_is_pinned() -> None:
    # Descriptors are persisted with every task: an accidental format change must show here.
    catalog = HostCatalog([pure(id="a", input_schema={"type": "object"}),
                           effect(connector=FakeConnector("c", "2"))])
    assert catalog.digest == (
        "sha256:d7629479b5b63209212a3809d33ac811f9c9413d5a0bfc88651b16e8714c13ba")


@pytest.mark.parametrize("change", [
    lambda: [pure(id="a", input_schema={"type": "array"}), pure(id="b"), effect()],
    lambda: [pure(id="a", input_schema={"type": "object"}),
             pure(id="b", output_schema={"type": "object"}), effect()],
    lambda: [pure(id="a", version="2", input_schema={"type": "object"}), pure(id="b"),
             effect()],
    lambda: [*_bindings()[:2], effect(destination="https://y.example")],
    lambda: [*_bindings()[:2], effect(connector=FakeConnector(version="2"))],
    lambda: [*_bindings()[:2], effect(connector=FakeConnector(id="other"))],
    lambda: [*_bindings()[:2], effect(connector=FakeConnector(idempotent=False))],
    lambda: [pure(id="a", input_schema={"type": "object"}, reference_outputs=("x",)),
             pure(id="b"), effect()],
    lambda: [*_bindings(), pure(id="c")],
], ids=["input-schema", "output-schema", "version", "destination", "connector-version",
        "connector-id", "idempotence", "reference-outputs", "added-binding"])
def test_catalog_digest_changes_with_descriptors(change: Any) -> None:
    assert HostCatalog(change()).digest != HostCatalog(_bindings()).digest


def test_catalog_digest_ignores_code_which_is_attested_by_version() -> None:
    other = [ToolBinding(id="a", version="1", recovery="pure", execute=lambda a: {},
                         input_schema={"type": "object"}), pure(id="b"), effect()]
    assert HostCatalog(other).digest == HostCatalog(_bindings()).digest


# --- programs ---------------------------------------------------------------------------

def test_plan_limits_defaults() -> None:
    limits = PlanLimits()
    assert (limits.max_bytes, limits.max_nodes, limits.max_depth, limits.max_concurrency) == (
        128_000, 100, 32, 5)
    assert program(plan()).limits == limits


@pytest.mark.parametrize("kw", [{}, {"plan": None, "planner": None}])
def test_program_needs_a_plan_or_planner(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of plan"):
        ExecutionGraphProgram(id="p", version="1", **kw)


def test_program_rejects_plan_and_planner_together() -> None:
    planner = PlannerConfig(provider=ScriptedProvider([]), host_instructions="plan")
    with pytest.raises(ConfigurationError, match="exactly one of plan"):
        ExecutionGraphProgram(id="p", version="1", plan=plan(), planner=planner)
    assert ExecutionGraphProgram(id="p", version="1", planner=planner).plan is None


def test_program_deep_copies_plan_and_input_schema() -> None:
    raw = plan({"id": "a", "binding": "t", "version": "1", "args": {"xs": [1]}})
    schema: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
    prog = program(raw, input_schema=schema)
    descriptor = prog.descriptor()
    raw["nodes"][0]["args"]["xs"].append(2)
    raw["nodes"].append({"id": "b"})
    schema["properties"]["q"]["type"] = "integer"
    assert prog.plan is not None
    assert prog.plan["nodes"] == [{"id": "a", "binding": "t", "version": "1",
                                   "args": {"xs": [1]}}]
    assert prog.input_schema == {"type": "object", "properties": {"q": {"type": "string"}}}
    assert prog.descriptor() == descriptor
    assert prog.input_validator is not None and prog.input_validator.is_valid({"q": "s"})


def test_program_rejects_non_json_plan() -> None:
    with pytest.raises(ConfigurationError, match=r"plan\.nodes\[0\]\.args\.x"):
        program(plan({"id": "a", "binding": "t", "version": "1", "args": {"x": {1, 2}}}))


def test_program_rejects_invalid_input_schema() -> None:
    with pytest.raises(ConfigurationError, match=r"input_schema is not a valid JSON Schema"):
        program(plan(), input_schema={"type": 5})
    assert program(plan()).input_validator is None


def test_program_descriptor_identifies_content() -> None:
    a = program(plan({"id": "a", "binding": "t", "version": "1"}))
    b = program(plan({"id": "b", "binding": "t", "version": "1"}))
    assert a.descriptor()["plan_digest"] != b.descriptor()["plan_digest"]
    assert a.descriptor() == program(plan({"id": "a", "binding": "t",
                                           "version": "1"})).descriptor()
    assert a.descriptor()["limits"] == PlanLimits().model_dump()


# --- nested programs are preflighted by the catalog ------------------------------------

def _graph(id: str, p: dict[str, Any], **kw: Any) -> GraphBinding:
    return GraphBinding(id=id, version="1", program=program(p, id=f"{id}-prog"), **kw)


def test_nested_program_with_unknown_binding_rejected_at_catalog_build() -> None:
    g = _graph("g", plan({"id": "x", "binding": "missing", "version": "1"}))
    with pytest.raises(ConfigurationError) as info:
        HostCatalog([pure(), g])
    assert "graph binding 'g' version '1' has an invalid program" in str(info.value)
    assert "unknown_binding" in str(info.value)
    assert info.value.details["codes"] == ["unknown_binding"]


def test_recursive_nested_programs_rejected() -> None:
    g = _graph("g", plan({"id": "x", "binding": "h", "version": "1"}))
    h = _graph("h", plan({"id": "y", "binding": "g", "version": "1"}))
    with pytest.raises(ConfigurationError, match=r"contains itself .*g@1 -> h@1 -> g@1"):
        HostCatalog([g, h, pure()])


def test_repeat_binding_program_is_preflighted() -> None:
    r = RepeatBinding(id="loop", version="1", max_iterations=3, condition=lambda *_: True,
                      program=program(plan({"id": "x", "binding": "t", "version": "9"})))
    with pytest.raises(ConfigurationError, match=r"(?s)repeat binding 'loop'.*unknown_version"):
        HostCatalog([pure(), r])


def test_nested_program_depth_is_cumulative() -> None:
    chain = plan({"id": "a", "binding": "t", "version": "1"},
                 {"id": "b", "binding": "t", "version": "1", "dependsOn": ["a"]})
    inner = _graph("inner", chain)
    outer = _graph("outer", plan({"id": "i", "binding": "inner", "version": "1"}))
    catalog = HostCatalog([pure(), inner, outer])
    assert catalog.program_depth(inner) == 2
    assert catalog.program_depth(outer) == 3  # the inner node itself plus its chain
    assert catalog.program_depth(pure()) == 0


def test_nested_program_limits_apply_inside() -> None:
    chain = plan(*({"id": f"n{i}", "binding": "t", "version": "1",
                    "dependsOn": [f"n{i - 1}"] if i else []} for i in range(3)))
    g = GraphBinding(id="g", version="1",
                     program=program(chain, limits=PlanLimits(max_depth=2)))
    with pytest.raises(ConfigurationError, match="too_deep"):
        HostCatalog([pure(), g])


def test_graph_reference_schema_maps_node_ids_to_outputs() -> None:
    lookup = pure(id="lookup", output_schema={"type": "object",
                                              "properties": {"amount": {"type": "number"}}})
    g = _graph("g", plan({"id": "price", "binding": "lookup", "version": "1"}))
    catalog = HostCatalog([lookup, g])
    schema = catalog.reference_schema(g)
    assert schema["additionalProperties"] is False
    assert schema["properties"] == {"price": lookup.output_schema}
    assert catalog.reference_schema(lookup) == lookup.output_schema
    declared = _graph("g2", plan({"id": "price", "binding": "lookup", "version": "1"}),
                      output_schema={"type": "object"})
    assert HostCatalog([lookup, declared]).reference_schema(declared) == {"type": "object"}


def test_graph_descriptor_carries_program_identity() -> None:
    g = _graph("g", plan({"id": "price", "binding": "lookup", "version": "1"}))
    d = HostCatalog([pure(id="lookup"), g]).descriptor("g", "1")
    assert d is not None and d.kind == "graph"
    assert d.program == g.program.descriptor()


@pytest.mark.parametrize("n", [0, 10_001])
def test_repeat_max_iterations_bounded(n: int) -> None:
    with pytest.raises(ConfigurationError, match="max_iterations"):
        RepeatBinding(id="r", version="1", max_iterations=n, condition=lambda *_: True,
                      program=program(plan()))
