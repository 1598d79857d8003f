"""Plan validation: every diagnostic, with its code, JSON path and node id, all at once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    GraphBinding,
    HostCatalog,
    PlanLimits,
    PlanValidationError,
    ToolBinding,
)
from agentium_graph.plan import PLAN_SCHEMA, CompiledPlan, Ref, resolve_args, validate_plan
from agentium_graph.plan._validate import _PLAN_VALIDATOR, _shape_ok

LIMITS = PlanLimits()
OUT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "amount": {"type": "number"},
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "pair": {"type": "array", "prefixItems": [{"type": "object", "properties": {
            "x": {"type": "integer"}}, "additionalProperties": False}], "maxItems": 2},
        "meta": {},
        "maybe": {"type": ["object", "null"], "properties": {"k": {"type": "string"}},
                  "additionalProperties": False},
        "labels": {"type": "object", "patternProperties": {"^l_": {"type": "string"}},
                   "additionalProperties": False},
        "free": {"type": "object", "additionalProperties": {"type": "object", "properties": {
            "q": {"type": "string"}}, "additionalProperties": False}},
        "either": {"anyOf": [{"type": "string"}, {"type": "object"}]},
        "never": False,
    },
}


def _tool(id: str, version: str = "1", **kw: Any) -> ToolBinding:
    return ToolBinding(id=id, version=version, recovery="pure", execute=lambda a: a, **kw)


def _template_check(args: dict[str, Any]) -> None:
    args["mutated"] = True  # must not leak into the plan
    if args.get("mode") == "bad":
        raise ValueError("mode 'bad' is not allowed")


def _chain(n: int, binding: str = "any") -> list[dict[str, Any]]:
    return [{"id": f"n{i}", "binding": binding, "version": "1",
             **({"dependsOn": [f"n{i - 1}"]} if i else {})} for i in range(n)]


def _program(nodes: list[dict[str, Any]], id: str) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id=id, version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes})


CATALOG = HostCatalog([
    _tool("lookup", input_schema={"type": "object", "required": ["sku"],
                                  "properties": {"sku": {"type": "string"}},
                                  "additionalProperties": False},
          output_schema=OUT),
    _tool("lookup", "2", output_schema=OUT),
    _tool("writer", input_schema={"type": "object", "required": ["price"], "properties": {
        "price": {"type": "number"}, "note": {"type": "string"},
        "items": {"type": "array", "maxItems": 2}}}),
    _tool("any"),
    _tool("combo", output_schema={"oneOf": [{"type": "string"}, {"type": "integer"}]}),
    _tool("guarded", reference_inputs=("price", "deep.x")),
    _tool("open", reference_inputs=("",)),
    _tool("exposer", reference_outputs=("amount",), output_schema=OUT),
    _tool("whole", reference_outputs=("",), output_schema=OUT),
    _tool("templated", validate_template=_template_check),
    GraphBinding(id="sub", version="1", program=_program(_chain(3), "sub-prog")),
    GraphBinding(id="prices", version="1", program=_program(
        [{"id": "price", "binding": "lookup", "version": "1", "args": {"sku": "A"}}],
        "prices-prog")),
])


def node(id: Any, binding: Any = "any", version: Any = "1", **extra: Any) -> dict[str, Any]:
    return {"id": id, "binding": binding, "version": version, **extra}


def ref(target: str, *path: str | int) -> dict[str, Any]:
    return {"$ref": {"node": target, "path": list(path)}}


def plan(*nodes: Any, **top: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": list(nodes), **top}


def ok(p: Any, **kw: Any) -> CompiledPlan:
    kw.setdefault("limits", LIMITS)
    return validate_plan(p, CATALOG, **kw)


def problems(p: Any, **kw: Any) -> list[tuple[str, str, str | None]]:
    """Every diagnostic as (code, path, node id)."""
    kw.setdefault("limits", LIMITS)
    with pytest.raises(PlanValidationError) as info:
        validate_plan(p, CATALOG, **kw)
    err = info.value
    assert err.code == "plan_invalid"
    assert err.details["codes"] == [d.code for d in err.diagnostics]
    for d in err.diagnostics:
        assert str(d) in str(err)
    return [(d.code, d.path, d.node_id) for d in err.diagnostics]


def messages(p: Any, **kw: Any) -> list[str]:
    kw.setdefault("limits", LIMITS)
    with pytest.raises(PlanValidationError) as info:
        validate_plan(p, CATALOG, **kw)
    return [d.message for d in info.value.diagnostics]


# --- a valid plan compiles ----------------------------------------------------------

def test_valid_plan_compiles() -> None:
    p = plan(node("price", "lookup", args={"sku": "A-1"}),
             node("quote", "writer", args={"price": ref("price", "amount")},
                  dependsOn=[], inputsFrom=[]))
    compiled = ok(p)
    assert compiled.order == ("price", "quote")
    assert compiled.revision == 1 and compiled.max_concurrency == 5 and compiled.depth == 2
    assert compiled.nodes["quote"].deps == ("price",)
    assert compiled.nodes["quote"].refs == (Ref(arg_path=("price",), node="price",
                                                path=("amount",)),)
    assert compiled.nodes["price"].static and not compiled.nodes["quote"].static
    assert compiled.nodes["price"].binding is CATALOG.get("lookup", "1")
    assert compiled.successors() == {"price": ["quote"], "quote": []}
    assert compiled.raw is p


def test_requested_concurrency_is_used() -> None:
    assert ok(plan(node("a"), maxConcurrency=2)).max_concurrency == 2
    assert ok(plan(node("a"), maxConcurrency=5)).max_concurrency == 5


def test_empty_plan_is_valid() -> None:
    compiled = ok(plan())
    assert compiled.order == () and compiled.depth == 0


# --- bindings -----------------------------------------------------------------------

def test_unknown_binding() -> None:
    assert problems(plan(node("a", "nope"))) == [
        ("unknown_binding", "$.nodes[0].binding", "a")]


def test_unknown_version_lists_registered_versions() -> None:
    p = plan(node("a"), node("b", "lookup", "7", args={"sku": "x"}))
    assert problems(p) == [("unknown_version", "$.nodes[1].version", "b")]
    assert "registered: 1, 2" in messages(p)[0]


def test_binding_not_granted() -> None:
    p = plan(node("a", "lookup", args={"sku": "x"}), node("b", "writer", args={"price": 1}))
    assert problems(p, grants=["lookup"]) == [
        ("binding_not_granted", "$.nodes[1].binding", "b")]
    assert ok(p, grants=["lookup", "writer"]).order == ("a", "b")
    assert problems(p, grants=[]) == [("binding_not_granted", "$.nodes[0].binding", "a"),
                                      ("binding_not_granted", "$.nodes[1].binding", "b")]


# --- identities and dependencies -------------------------------------------------------

def test_duplicate_node_id() -> None:
    p = plan(node("a"), node("b"), node("a"))
    assert problems(p) == [("duplicate_node_id", "$.nodes[2].id", "a")]
    assert "$.nodes[0]" in messages(p)[0]


def test_a_duplicated_node_still_reports_its_own_problems() -> None:
    # Every diagnostic at once: the duplicate's unknown version and its reference to a node
    # that does not exist come with the duplicate id, not in a later round.
    p = plan(node("a"), node("b"), node("a", version="9"),
             node("b", "writer", args={"price": ref("nowhere", "x")}))
    found = problems(p, grants=["any", "writer"])
    assert ("duplicate_node_id", "$.nodes[2].id", "a") in found
    assert ("duplicate_node_id", "$.nodes[3].id", "b") in found
    assert ("unknown_version", "$.nodes[2].version", "a") in found
    assert ("unknown_reference", "$.nodes[3].args.price.$ref.node", "b") in found


@pytest.mark.parametrize("field", ["dependsOn", "inputsFrom"])
def test_unknown_dependency(field: str) -> None:
    p = plan(node("a"), node("b", **{field: ["a", "ghost"]}))
    assert problems(p) == [("unknown_dependency", f"$.nodes[1].{field}[1]", "b")]
    assert "'ghost'" in messages(p)[0]


@pytest.mark.parametrize("field", ["dependsOn", "inputsFrom"])
def test_self_dependency(field: str) -> None:
    assert problems(plan(node("a", **{field: ["a"]}))) == [
        ("self_dependency", f"$.nodes[0].{field}[0]", "a")]


def test_self_reference() -> None:
    assert problems(plan(node("a", args={"x": ref("a")}))) == [
        ("self_dependency", "$.nodes[0].args.x.$ref.node", "a")]


def test_unknown_reference_node() -> None:
    p = plan(node("a"), node("b", args={"x": [1, {"y": ref("ghost", "v")}]}))
    assert problems(p) == [("unknown_reference", "$.nodes[1].args.x[1].y.$ref.node", "b")]
    assert "'ghost'" in messages(p)[0]


@pytest.mark.parametrize("value", [ref("ghost"), {"$ref": {"node": "ghost", "oops": 1}},
                                   {"$ref": "ghost"}], ids=["unknown", "unknown-field", "string"])
def test_a_bad_reference_is_not_also_judged_as_a_literal_arg(value: Any) -> None:
    # (review 39) The input schema wants a string at "sku": a $ref there is a future value
    # whether or not it names a node that exists, so only the reference's own problem is
    # reported, not an args_invalid about the {"$ref": ...} object.
    p = plan(node("a", "lookup", args={"sku": value}))
    assert [code for code, _, _ in problems(p)] in (["unknown_reference"], ["bad_reference"])
    assert problems(plan(node("a", "lookup", args={"sku": 3}))) == [
        ("args_invalid", "$.nodes[0].args.sku", "a")]


def test_dependencies_on_later_nodes_are_fine() -> None:
    compiled = ok(plan(node("b", dependsOn=["a"]), node("a")))
    assert compiled.order == ("a", "b")


# --- malformed references --------------------------------------------------------------

@pytest.mark.parametrize(("value", "path"), [
    ({"$ref": {"node": "a"}, "extra": 1}, "$.nodes[1].args.x"),
    ({"$ref": "a"}, "$.nodes[1].args.x.$ref"),
    ({"$ref": {"path": []}}, "$.nodes[1].args.x.$ref"),
    ({"$ref": {"node": 5}}, "$.nodes[1].args.x.$ref"),
    ({"$ref": {"node": "a", "field": "v"}}, "$.nodes[1].args.x.$ref"),
    ({"$ref": {"node": "a", "path": "amount"}}, "$.nodes[1].args.x.$ref.path"),
    ({"$ref": {"node": "a", "path": ["ok", -1]}}, "$.nodes[1].args.x.$ref.path[1]"),
    ({"$ref": {"node": "a", "path": [True]}}, "$.nodes[1].args.x.$ref.path[0]"),
    ({"$ref": {"node": "a", "path": [1.5]}}, "$.nodes[1].args.x.$ref.path[0]"),
    ({"$ref": {"node": "a", "path": [None]}}, "$.nodes[1].args.x.$ref.path[0]"),
], ids=["extra-keys", "not-object", "no-node", "node-not-string", "unknown-field",
        "path-not-list", "negative-index", "bool-item", "float-item", "null-item"])
def test_malformed_reference(value: Any, path: str) -> None:
    assert problems(plan(node("a"), node("b", args={"x": value}))) == [
        ("bad_reference", path, "b")]


def test_every_bad_path_item_is_reported() -> None:
    p = plan(node("a"), node("b", args={"x": ref("a", -1, "ok", False)}))
    assert problems(p) == [("bad_reference", "$.nodes[1].args.x.$ref.path[0]", "b"),
                           ("bad_reference", "$.nodes[1].args.x.$ref.path[2]", "b")]


def test_malformed_reference_does_not_create_a_dependency() -> None:
    # The bad ref is reported; no phantom cycle or dependency is invented from it.
    p = plan(node("a", args={"x": {"$ref": {"node": "b", "oops": 1}}}),
             node("b", dependsOn=["a"]))
    assert [c for c, _, _ in problems(p)] == ["bad_reference"]


# --- reference paths against the producer's output schema ------------------------------

def _ref_problems(*path: str | int, producer: str = "lookup",
                  **kw: Any) -> list[tuple[str, str, str | None]]:
    args = {"sku": "A"} if producer == "lookup" else {}
    p = plan(node("p", producer, args=args), node("c", args={"v": ref("p", *path)}))
    try:
        ok(p, **kw)
    except PlanValidationError as exc:
        return [(d.code, d.path, d.node_id) for d in exc.diagnostics]
    return []


@pytest.mark.parametrize("path", [
    ("nope",), ("amount", 0), ("amount", "x"), ("name", "first"), ("tags", "x"),
    ("pair", 0, "y"), ("pair", 2), ("maybe", "other"), ("labels", "x_1"),
    ("free", "any", "z"), ("never",),
], ids=["missing-field", "index-number", "field-of-number", "field-of-string",
        "field-of-array", "prefix-items-field", "beyond-max-items", "type-list-field",
        "pattern-miss", "additional-schema", "false-schema"])
def test_bad_reference_path(path: tuple[str | int, ...]) -> None:
    assert _ref_problems(*path) == [("bad_reference_path", "$.nodes[1].args.v.$ref.path", "c")]


def test_bad_reference_path_messages_explain() -> None:
    p = plan(node("p", "lookup", args={"sku": "A"}),
             node("c", args={"a": ref("p", "nope"), "b": ref("p", "name", "x"),
                             "c": ref("p", "tags", "x"), "d": ref("p", "amount", 0)}))
    msgs = messages(p)
    assert "has no field 'nope' (known fields: amount, either" in msgs[0]
    assert "output.name is of type 'string', so it has no field 'x'" in msgs[1]
    assert "output.tags is of type 'array', so it has no field 'x'" in msgs[2]
    assert "output.amount is of type 'number', so it cannot be indexed by 0" in msgs[3]


@pytest.mark.parametrize("path", [
    (), ("amount",), ("tags", 3), ("meta", "anything", 0), ("pair", 0, "x"), ("pair", 1),
    ("maybe", "k"), ("labels", "l_1"), ("free", "any", "q"), ("either", "x"),
], ids=["whole", "field", "array-item", "open-schema", "prefix-items", "items-default",
        "type-list", "pattern", "additional-schema", "combinator"])
def test_good_or_unknowable_reference_paths_accepted(path: tuple[str | int, ...]) -> None:
    assert _ref_problems(*path) == []


@pytest.mark.parametrize("producer", ["any", "combo"])
def test_unknowable_output_schemas_accept_any_path(producer: str) -> None:
    assert _ref_problems("a", 0, "b", producer=producer) == []


def test_reference_path_against_known_outputs() -> None:
    p = plan(node("p", "lookup", args={"sku": "A"}),
             node("c", args={"a": ref("p", "tags", 1), "b": ref("p", "tags", 0)}))
    known = {"p": {"tags": ["only"]}}
    assert problems(p, known_outputs=known) == [
        ("bad_reference_path", "$.nodes[1].args.a.$ref.path", "c")]
    assert ok(p, known_outputs={"p": {"tags": ["x", "y"]}}).order == ("p", "c")


def test_reference_into_graph_output_checks_nested_node_ids() -> None:
    p = plan(node("g", "prices"),
             node("ok", args={"v": ref("g", "price", "amount")}),
             node("bad", args={"v": ref("g", "cost")}),
             node("deep", args={"v": ref("g", "price", "nope")}))
    assert problems(p) == [("bad_reference_path", "$.nodes[2].args.v.$ref.path", "bad"),
                           ("bad_reference_path", "$.nodes[3].args.v.$ref.path", "deep")]


# --- reference_inputs / reference_outputs ------------------------------------------------

def test_reference_inputs_restrict_where_refs_may_appear() -> None:
    p = plan(node("a"),
             node("g", "guarded", args={"price": ref("a"), "deep": {"x": {"y": ref("a")}},
                                        "note": ref("a"), "deep2": [ref("a")]}))
    assert problems(p) == [
        ("reference_input_not_allowed", "$.nodes[1].args.note", "g"),
        ("reference_input_not_allowed", "$.nodes[1].args.deep2[0]", "g")]


def test_reference_inputs_prefix_is_by_segment() -> None:
    p = plan(node("a"), node("g", "guarded", args={"priceless": ref("a")}))
    assert problems(p) == [("reference_input_not_allowed", "$.nodes[1].args.priceless", "g")]


def test_reference_inputs_empty_string_means_whole_value() -> None:
    assert ok(plan(node("a"), node("o", "open", args={"x": [{"y": ref("a")}]}))).order == (
        "a", "o")
    assert ok(plan(node("a"), node("o", "open", args=ref("a")))).nodes["o"].refs[0].arg_path \
        == ()


def test_reference_outputs_restrict_what_may_be_referenced() -> None:
    p = plan(node("e", "exposer"),
             node("c", args={"ok": ref("e", "amount"), "whole": ref("e"),
                             "other": ref("e", "name")}))
    assert problems(p) == [
        ("reference_output_not_allowed", "$.nodes[1].args.whole.$ref.path", "c"),
        ("reference_output_not_allowed", "$.nodes[1].args.other.$ref.path", "c")]


def test_reference_outputs_empty_string_means_whole_value() -> None:
    p = plan(node("w", "whole"), node("c", args={"a": ref("w"), "b": ref("w", "name")}))
    assert ok(p).order == ("w", "c")
    # "" exposes everything, but paths are still checked against the schema.
    bad = plan(node("w", "whole"), node("c", args={"a": ref("w", "nope")}))
    assert problems(bad) == [("bad_reference_path", "$.nodes[1].args.a.$ref.path", "c")]


# --- references anywhere in args -------------------------------------------------------

def test_refs_inside_lists_and_nested_dicts() -> None:
    p = plan(node("a"), node("b"),
             node("c", args={"list": [1, ref("a", "x"), {"deep": [ref("b")]}],
                             "obj": {"k": {"m": ref("a")}}}))
    compiled = ok(p)
    c = compiled.nodes["c"]
    assert c.deps == ("a", "b")
    assert {(r.arg_path, r.node, r.path) for r in c.refs} == {
        (("list", 1), "a", ("x",)), (("list", 2, "deep", 0), "b", ()),
        (("obj", "k", "m"), "a", ())}
    assert compiled.order == ("a", "b", "c")


def test_ref_path_empty_is_whole_output() -> None:
    compiled = ok(plan(node("p", "lookup", args={"sku": "A"}), node("c", args={"v": ref("p")})))
    assert compiled.nodes["c"].refs[0].path == ()
    assert resolve_args(compiled.nodes["c"].args, {"p": {"amount": 3}}) == {"v": {"amount": 3}}


def test_ref_without_path_means_whole_output() -> None:
    compiled = ok(plan(node("p"), node("c", args={"v": {"$ref": {"node": "p"}}})))
    assert compiled.nodes["c"].refs[0].path == ()


# --- cycles -------------------------------------------------------------------------

def test_two_node_cycle() -> None:
    p = plan(node("a", dependsOn=["b"]), node("b", args={"x": ref("a")}))
    assert problems(p) == [("cycle", "$.nodes[0]", "a")]
    assert messages(p) == ["dependency cycle: a -> b -> a (each node waits for the next)"]


def test_two_disconnected_cycles_both_reported() -> None:
    p = plan(node("a", dependsOn=["b"]), node("b", dependsOn=["a"]), node("ok"),
             node("c", inputsFrom=["d"]), node("d", dependsOn=["e"]),
             node("e", dependsOn=["c"]))
    assert problems(p) == [("cycle", "$.nodes[0]", "a"), ("cycle", "$.nodes[3]", "c")]
    assert messages(p)[1] == "dependency cycle: c -> d -> e -> c (each node waits for the next)"


def test_cycles_joined_by_an_edge_are_both_reported() -> None:
    # x1 waits on cycle {a, b} and on its own cycle {x1, x2}: two components, two reports.
    p = plan(node("a", dependsOn=["b"]), node("b", dependsOn=["a"]),
             node("x1", dependsOn=["a", "x2"]), node("x2", dependsOn=["x1"]))
    assert problems(p) == [("cycle", "$.nodes[0]", "a"), ("cycle", "$.nodes[2]", "x1")]


def test_nodes_waiting_on_a_cycle_are_not_reported_as_cycles() -> None:
    p = plan(node("a", dependsOn=["b"]), node("b", dependsOn=["a"]),
             node("after", dependsOn=["a"]), node("later", dependsOn=["after"]))
    assert problems(p) == [("cycle", "$.nodes[0]", "a")]


def test_long_cycle_is_found_without_recursion_limits() -> None:
    n = 3000
    nodes = [node(f"n{i}", dependsOn=[f"n{(i + 1) % n}"]) for i in range(n)]
    found = problems(plan(*nodes), limits=PlanLimits(max_nodes=n, max_bytes=10**7,
                                                     max_depth=n))
    assert found == [("cycle", "$.nodes[0]", "n0")]


# --- limits -------------------------------------------------------------------------

def test_plan_byte_limit_default() -> None:
    big = plan(node("a", args={"blob": "x" * 128_000}))
    assert problems(big) == [("too_large", "$", None)]
    assert ok(plan(node("a", args={"blob": "x" * 127_000}))).order == ("a",)


def test_plan_byte_limit_custom() -> None:
    p = plan(node("a", args={"blob": "x" * 200}))
    assert problems(p, limits=PlanLimits(max_bytes=200)) == [("too_large", "$", None)]
    assert "limit is 200" in messages(p, limits=PlanLimits(max_bytes=200))[0]


def test_node_limit_default() -> None:
    assert problems(plan(*(node(f"n{i}") for i in range(101)))) == [
        ("too_many_nodes", "$.nodes", None)]
    assert len(ok(plan(*(node(f"n{i}") for i in range(100)))).order) == 100


def test_depth_limit_default() -> None:
    assert problems(plan(*_chain(33))) == [("too_deep", "$.nodes[32]", "n32")]
    compiled = ok(plan(*_chain(32)))
    assert compiled.depth == 32 and compiled.nodes["n31"].depth == 32


def test_depth_counts_nested_graph_programs() -> None:
    # "sub" runs a 3-node chain, so it adds 3 levels below its own node.
    compiled = ok(plan(*_chain(28), node("g", "sub", dependsOn=["n27"])))
    assert compiled.depth == 32 and compiled.nodes["g"].depth == 32
    assert problems(plan(*_chain(29), node("g", "sub", dependsOn=["n28"]))) == [
        ("too_deep", "$.nodes[29]", "g")]


def test_depth_counts_multiple_nesting_levels() -> None:
    inner = GraphBinding(id="inner", version="1", program=_program(_chain(4), "inner"))
    outer = GraphBinding(id="outer", version="1", program=_program(
        [node("i", "inner"), node("after", dependsOn=["i"])], "outer"))
    catalog = HostCatalog([_tool("any"), inner, outer])
    compiled = validate_plan(plan(node("o", "outer")), catalog, limits=LIMITS)
    assert compiled.depth == 1 + (5 + 1)
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan(node("o", "outer")), catalog, limits=PlanLimits(max_depth=6))
    assert [(d.code, d.node_id) for d in info.value.diagnostics] == [("too_deep", "o")]


def test_depth_offset_is_cumulative() -> None:
    assert ok(plan(*_chain(2)), depth_offset=30).nodes["n1"].depth == 32
    found = problems(plan(*_chain(3)), depth_offset=30)
    assert found == [("too_deep", "$.nodes[2]", "n2")]
    assert "30 above this plan" in messages(plan(*_chain(3)), depth_offset=30)[0]


def test_depth_offset_alone_can_exceed_the_limit() -> None:
    assert problems(plan(), depth_offset=33) == [("too_deep", "$.nodes", None)]


def test_nested_program_validates_under_its_nodes_depth() -> None:
    outer = ok(plan(*_chain(2), node("g", "sub", dependsOn=["n1"])))
    g = outer.nodes["g"]
    assert g.depth == 2 + 1 + 3
    sub = CATALOG.get("sub", "1")
    assert isinstance(sub, GraphBinding) and sub.program.plan is not None
    inner = ok(sub.program.plan, depth_offset=g.depth - CATALOG.program_depth(sub))
    assert inner.depth == g.depth


def test_max_concurrency_above_limit() -> None:
    assert problems(plan(node("a"), maxConcurrency=6)) == [
        ("concurrency_limit", "$.maxConcurrency", None)]
    assert problems(plan(node("a"), maxConcurrency=3),
                    limits=PlanLimits(max_concurrency=2)) == [
        ("concurrency_limit", "$.maxConcurrency", None)]


# --- args ---------------------------------------------------------------------------

def test_static_args_violating_input_schema() -> None:
    p = plan(node("a", "lookup", args={"sku": 5, "extra": 1}), node("b", "writer"))
    assert problems(p) == [
        ("args_invalid", "$.nodes[0].args", "a"),       # additionalProperties: 'extra'
        ("args_invalid", "$.nodes[0].args.sku", "a"),   # 5 is not a string
        ("args_invalid", "$.nodes[1].args", "b"),       # missing args -> {} lacks 'price'
    ]
    msgs = messages(p)
    assert "'lookup' input schema" in msgs[1] and "not of type 'string'" in msgs[1]
    assert "'price' is a required property" in msgs[2]


def test_args_with_refs_are_checked_where_static() -> None:
    p = plan(node("a"),
             node("b", "writer", args={"price": ref("a"), "note": 5}),
             node("c", "writer", args={"note": "x", "items": [ref("a")]}),
             node("d", "writer", args={"price": ref("a"), "items": [ref("a"), 1, 2]}))
    assert problems(p) == [("args_invalid", "$.nodes[1].args.note", "b"),
                           ("args_invalid", "$.nodes[2].args", "c"),
                           ("args_invalid", "$.nodes[3].args.items", "d")]


def test_args_with_refs_not_judged_on_the_future_value() -> None:
    # The ref placeholder is an object, but "price" must be a number: decided after resolve.
    assert ok(plan(node("a"), node("b", "writer", args={"price": ref("a")}))).order == (
        "a", "b")


def test_validate_template_raising() -> None:
    p = plan(node("t", "templated", args={"mode": "bad"}))
    assert problems(p) == [("template_invalid", "$.nodes[0].args", "t")]
    assert "mode 'bad' is not allowed" in messages(p)[0]


def test_validate_template_gets_a_copy_with_refs() -> None:
    p = plan(node("a"), node("t", "templated", args={"v": ref("a")}))
    compiled = ok(p)
    assert "mutated" not in p["nodes"][1]["args"]
    assert compiled.nodes["t"].args == {"v": ref("a")}


# --- plan shape ---------------------------------------------------------------------

def test_unsupported_schema_version() -> None:
    assert problems(plan(node("a"), schemaVersion=2)) == [
        ("unsupported_schema_version", "$.schemaVersion", None)]


SHAPE_CASES: list[tuple[Any, list[tuple[str, str, str | None]]]] = [
    ({"schemaVersion": 1, "revision": 1}, [("plan_shape", "$", None)]),
    ({"schemaVersion": 1, "revision": 1, "nodes": [], "extra": 1}, [("plan_shape", "$", None)]),
    ([], [("plan_shape", "$", None)]),
    ("plan", [("plan_shape", "$", None)]),
    (plan(revision="1"), [("plan_shape", "$.revision", None)]),
    (plan(revision=0), [("plan_shape", "$.revision", None)]),
    (plan(revision=1.0), [("plan_shape", "$.revision", None)]),
    (plan(schemaVersion=True), [("plan_shape", "$.schemaVersion", None)]),
    (plan(maxConcurrency=0), [("plan_shape", "$.maxConcurrency", None)]),
    (plan(maxConcurrency=2.0), [("plan_shape", "$.maxConcurrency", None)]),
    ({"schemaVersion": 1, "revision": 1, "nodes": {"a": {}}}, [("plan_shape", "$.nodes", None)]),
    (plan("a"), [("plan_shape", "$.nodes[0]", None)]),
    (plan({"id": "a", "binding": "any"}), [("plan_shape", "$.nodes[0]", "a")]),
    (plan(node("a", when="always")), [("plan_shape", "$.nodes[0]", "a")]),
    (plan(node("a", dependsOn="b")), [("plan_shape", "$.nodes[0].dependsOn", "a")]),
    (plan(node("a", inputsFrom=[1])), [("plan_shape", "$.nodes[0].inputsFrom[0]", "a")]),
    (plan(node("a", args=[1])), [("plan_shape", "$.nodes[0].args", "a")]),
    (plan(node("has space")), [("plan_shape", "$.nodes[0].id", "has space")]),
    (plan(node("trailing\n")), [("plan_shape", "$.nodes[0].id", "trailing\n")]),
    (plan(node("")), [("plan_shape", "$.nodes[0].id", "")]),
    (plan({"id": 5, "binding": "any", "version": "1"}), [("plan_shape", "$.nodes[0].id", None)]),
    (plan(node("a", version=1)), [("plan_shape", "$.nodes[0].version", "a")]),
]
SHAPE_IDS = ["missing-nodes", "extra-key", "list", "string", "revision-str", "revision-zero",
        "revision-float", "schema-version-bool", "concurrency-zero", "concurrency-float",
        "nodes-object", "node-string", "node-missing-version", "node-extra-key",
        "depends-on-string", "inputs-from-int", "args-list", "id-space", "id-newline",
        "id-empty", "id-int", "version-int"]


@pytest.mark.parametrize(("p", "expected"), SHAPE_CASES, ids=SHAPE_IDS)
def test_plan_shape(p: Any, expected: list[tuple[str, str, str | None]]) -> None:
    assert problems(p) == expected


@pytest.mark.parametrize("p", [
    *(case for case, _ in SHAPE_CASES),
    plan(), plan(node("a")), plan(node("a", args={}, dependsOn=[], inputsFrom=[]),
                                  maxConcurrency=1),
    plan(node("a.b-c_9" + "x" * 193)), plan(node("x" * 201)), plan(node("a", binding="")),
    plan(node("a", version="")), plan(node("a", args=None)),
    {"schemaVersion": 1, "revision": 1, "nodes": [], "maxConcurrency": True},
    {"schemaVersion": 1, "revision": True, "nodes": []},
    {"schemaVersion": 1.5, "revision": 1, "nodes": []},
])
def test_fast_shape_check_agrees_with_plan_schema(p: Any) -> None:
    # The fast path may only skip jsonschema when the schema would accept the plan.
    assert _shape_ok(p) == (not list(_PLAN_VALIDATOR.iter_errors(p)))


def test_shape_errors_do_not_hide_other_problems() -> None:
    p = {"schemaVersion": 3, "revision": 1, "maxConcurrency": 9,
         "nodes": [node("a", "nope", extra=True)]}
    assert problems(p) == [
        ("plan_shape", "$.nodes[0]", "a"),
        ("unsupported_schema_version", "$.schemaVersion", None),
        ("concurrency_limit", "$.maxConcurrency", None),
        ("unknown_binding", "$.nodes[0].binding", "a")]


def test_missing_nodes_still_reports_top_level_problems() -> None:
    assert problems({"schemaVersion": 9, "revision": 1}) == [
        ("plan_shape", "$", None), ("unsupported_schema_version", "$.schemaVersion", None)]


@pytest.mark.parametrize(("bad", "path"), [
    (float("nan"), "$.nodes[0].args.x"),
    ({1, 2}, "$.nodes[0].args.x"),
    (b"bytes", "$.nodes[0].args.x"),
    ({1: "a"}, "$.nodes[0].args.x"),
])
def test_non_json_plan_values(bad: Any, path: str) -> None:
    assert problems(plan(node("a", args={"x": bad}))) == [("not_json", path, "a")]


def test_absurdly_nested_plan_is_a_diagnostic_not_a_crash() -> None:
    deep: Any = []
    for _ in range(10_000):
        deep = [deep]
    [(code, path, node_id)] = problems(plan(node("a", args={"x": deep})))
    assert code == "not_json" and path.startswith("$.nodes[0].args.x[0]") and node_id == "a"


def test_non_json_outside_nodes_has_no_node_id() -> None:
    assert problems({"schemaVersion": 1, "revision": 1, "nodes": [], "x": {2: 1}}) == [
        ("not_json", "$.x", None)]
    assert problems(plan({"id": 7, "args": {"v": float("inf")}})) == [
        ("not_json", "$.nodes[0].args.v", None)]


def test_plan_schema_is_plain_json() -> None:
    assert json.loads(json.dumps(PLAN_SCHEMA)) == PLAN_SCHEMA


# --- everything at once -------------------------------------------------------------

def test_one_invalid_plan_reports_every_problem() -> None:
    p = {
        "schemaVersion": 2, "revision": 1, "maxConcurrency": 50,
        "nodes": [
            node("a", "nope"),
            node("b", "lookup", "9"),
            node("a"),
            node("c", dependsOn=["ghost", "c"]),
            node("d", args={"v": ref("missing")}),
            node("e", args={"v": {"$ref": "bad"}}),
            node("f", "lookup", args={"sku": 1}),
            node("g", args={"v": ref("f", "nope")}),
            node("h", dependsOn=["i"]),
            node("i", dependsOn=["h"]),
            node("j", "templated", args={"mode": "bad"}),
            node("k", "writer", args={"price": "x"}),
            node("l", "exposer"),
            node("m", args={"v": ref("l", "name")}),
            node("n", "guarded", args={"note": ref("l", "amount")}),
            node("o", "lookup", args={"sku": "A"}, unknown=1),
        ],
    }
    found = problems(p, grants=["any", "lookup", "templated", "exposer", "guarded"])
    assert sorted(found, key=str) == sorted([
        ("plan_shape", "$.nodes[15]", "o"),
        ("unsupported_schema_version", "$.schemaVersion", None),
        ("concurrency_limit", "$.maxConcurrency", None),
        ("duplicate_node_id", "$.nodes[2].id", "a"),
        ("unknown_binding", "$.nodes[0].binding", "a"),
        ("unknown_version", "$.nodes[1].version", "b"),
        ("unknown_dependency", "$.nodes[3].dependsOn[0]", "c"),
        ("self_dependency", "$.nodes[3].dependsOn[1]", "c"),
        ("unknown_reference", "$.nodes[4].args.v.$ref.node", "d"),
        ("bad_reference", "$.nodes[5].args.v.$ref", "e"),
        ("binding_not_granted", "$.nodes[11].binding", "k"),
        ("reference_input_not_allowed", "$.nodes[14].args.note", "n"),
        ("bad_reference_path", "$.nodes[7].args.v.$ref.path", "g"),
        ("reference_output_not_allowed", "$.nodes[13].args.v.$ref.path", "m"),
        ("cycle", "$.nodes[8]", "h"),
        ("args_invalid", "$.nodes[6].args.sku", "f"),
        ("template_invalid", "$.nodes[10].args", "j"),
        ("args_invalid", "$.nodes[11].args.price", "k"),
    ], key=str)


def test_limit_problems_come_with_every_other_problem() -> None:
    # Over every size limit at once, with two shape problems and bad args: each limit is
    # one more diagnostic, never a reason to stop looking.
    limits = PlanLimits(max_bytes=400, max_nodes=3, max_depth=3)
    p = plan(*_chain(4), node("x", "lookup", args={"sku": 1}, unknown=1),
             node("y", "lookup", args={"sku": "A"}, extra=True))
    found = problems(p, limits=limits)
    codes = sorted({code for code, _, _ in found})
    assert codes == sorted({"too_large", "too_many_nodes", "too_deep", "plan_shape",
                            "args_invalid"})
    assert [(c, n) for c, _, n in found if c == "plan_shape"] == [("plan_shape", "x"),
                                                                    ("plan_shape", "y")]
    assert ("args_invalid", "$.nodes[4].args.sku", "x") in found


def test_diagnostics_are_deterministic() -> None:
    p = plan(node("b", dependsOn=["a"]), node("a", dependsOn=["b"]), node("x", "nope"),
             node("y", "lookup", args={"sku": 1, "z": 2}))
    assert problems(p) == problems(json.loads(json.dumps(p)))


# --- deterministic order --------------------------------------------------------------

def test_topological_order_ties_broken_by_plan_position() -> None:
    p = plan(node("z"), node("y", dependsOn=["x"]), node("x"), node("w"),
             node("v", inputsFrom=["z"]))
    assert ok(p).order == ("z", "x", "y", "w", "v")


def test_order_is_independent_of_dependency_listing() -> None:
    a = plan(node("a"), node("b"), node("c", dependsOn=["b", "a"]))
    b = plan(node("a"), node("b"), node("c", dependsOn=["a", "b"]))
    assert ok(a).order == ok(b).order == ("a", "b", "c")
    assert ok(a).nodes["c"].deps == ok(b).nodes["c"].deps == ("a", "b")


def test_validation_does_not_mutate_the_plan() -> None:
    p = plan(node("a", "lookup", args={"sku": "x"}), node("b", args={"v": ref("a", "tags")}))
    before = json.loads(json.dumps(p))
    ok(p)
    assert p == before


# --- $literal: data that contains "$ref" keys ---------------------------------------

SCHEMA_WITH_REF = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}


def test_literal_content_is_never_a_reference() -> None:
    p = plan(node("a"), node("b", args={
        "schema": {"$literal": SCHEMA_WITH_REF},
        "items": [{"$literal": {"$ref": {"node": "a"}}}, ref("a", "x")]}))
    compiled = ok(p)
    b = compiled.nodes["b"]
    assert b.literal and [r.arg_path for r in b.refs] == [("items", 1)]
    assert b.deps == ("a",)  # only the real reference makes a dependency


def test_a_literal_with_other_keys_is_named() -> None:
    p = plan(node("a"), node("b", args={"x": {"$literal": 1, "$ref": {"node": "a"}},
                                        "y": [{"$literal": 2, "why": 3}]}))
    assert problems(p) == [("bad_literal", "$.nodes[1].args.x", "b"),
                           ("bad_literal", "$.nodes[1].args.y[0]", "b")]


def test_literal_values_are_checked_against_the_input_schema_as_written() -> None:
    # What the tool receives is the unwrapped value: a literal string is not a number.
    p = plan(node("w", "writer", args={"price": {"$literal": "12"}}))
    assert problems(p) == [("args_invalid", "$.nodes[0].args.price.$literal", "w")]
    assert ok(plan(node("w", "writer", args={"price": {"$literal": 12}}))).nodes["w"].literal


def test_a_diagnostic_quoting_a_huge_value_is_bounded() -> None:
    # (review 46) A schema error embeds the repr of the value: a 300 KB rejected planner
    # answer was journaled again, and billed again as input, through its diagnostic.
    with pytest.raises(PlanValidationError) as info:
        validate_plan(["z" * 300_000], CATALOG, limits=LIMITS)
    [shape] = [d for d in info.value.diagnostics if d.code == "plan_shape"]
    assert len(shape.message) < 1100 and shape.message.endswith("more characters)")
