"""Edge cases of ``$literal`` in plan args and of the check that binding and program
schemas resolve every reference within themselves (dialect-aware, nothing fetched).

Each failed once during review of the commits that introduced the two features; the
docstrings say what went wrong then.
"""

from __future__ import annotations

import contextlib
import urllib.request
from typing import Any

import pytest

from agentium_graph import (
    ConfigurationError,
    ExecutionGraphRuntime,
    HostCatalog,
    PlanLimits,
    PlanValidationError,
    ToolBinding,
)
from agentium_graph.plan import validate_plan
from tests.conftest import INT_OUT, program

D3 = "http://json-schema.org/draft-03/schema#"
D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"


def _tool(id: str = "t", **kw: Any) -> ToolBinding:
    kw.setdefault("execute", lambda a: {"value": 1})
    return ToolBinding(id=id, version="1", recovery="pure", **kw)


def _plan(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": list(nodes)}


# --- 25f028b: check_refs --------------------------------------------------------------


@pytest.mark.parametrize("dialect", [D3, D4])
def test_draft4_embedded_id_resources_are_not_refused(dialect: str) -> None:
    """False rejection: draft-03/04 mark an embedded resource with ``id``, not ``$id``.

    ``_schemarefs._refs`` only stops at a subschema holding ``"$id"``, so a ``$ref`` inside a
    draft-04 resource (``{"id": "http://.../inner.json", ...}``) is looked up against the
    root document instead of its own base URI and the binding is refused, although
    jsonschema resolves and validates it fine.
    """
    schema = {"$schema": dialect, "properties": {"a": {
        "id": "http://example.com/inner.json",
        "definitions": {"n": {"type": "integer"}},
        "properties": {"b": {"$ref": "#/definitions/n"}}}}}
    binding = _tool(input_schema=schema)  # raises ConfigurationError today
    assert binding.input_errors({"a": {"b": 1}}) == []
    assert [e.message for e in binding.input_errors({"a": {"b": "x"}})] == [
        "'x' is not of type 'integer'"]


@pytest.mark.parametrize("keyword", ["example", "x-example"])
def test_ref_shaped_data_under_an_unknown_keyword_is_not_refused(keyword: str) -> None:
    """False rejection: ``_refs`` descends into every unknown keyword's object value.

    Only ``enum/const/default/examples`` are skipped as data; an OpenAPI-style ``example``
    or an ``x-...`` extension whose value is a JSON Schema (so holds a ``"$ref"``) is never
    evaluated by jsonschema, yet the binding is refused as if it were a reference.
    """
    schema = {"type": "object", "properties": {"schema": {
        "type": "object",
        keyword: {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}}}}
    binding = _tool(input_schema=schema)  # raises ConfigurationError today
    assert binding.input_errors({"schema": {}}) == []


@pytest.mark.parametrize("schema", [
    # a 2020-12 embedded resource with a dangling pointer
    {"properties": {"x": {"$id": "https://example.com/inner", "$ref": "#/$defs/missing"}}},
    # draft-07: "$id" next to "$ref" is ignored, so this $ref resolves against the root
    {"$schema": D7, "definitions": {}, "properties": {
        "x": {"$id": "http://example.com/other", "$ref": "#/definitions/missing"}}},
    # draft-07: "$id": "#foo" is only an anchor, not a new resource
    {"$schema": D7, "definitions": {"a": {
        "$id": "#foo", "properties": {"y": {"$ref": "#/definitions/missing"}}}},
     "properties": {"x": {"$ref": "#foo"}}},
    # a dangling $dynamicRef is never looked at
    {"properties": {"x": {"$dynamicRef": "#/$defs/missing"}}},
], ids=["embedded-2020", "draft7-id-beside-ref", "draft7-id-anchor", "dynamicRef"])
def test_dangling_refs_that_still_fail_mid_run_are_refused(schema: dict[str, Any]) -> None:
    """False acceptance: ``_refs`` skips every subtree holding ``"$id"`` (even where the
    dialect says it is no resource: draft-07 ignores ``$id`` beside ``$ref``, and
    ``"$id": "#foo"`` is a plain anchor) and never looks at ``$dynamicRef``.

    Such a binding is accepted and then fails the first time a value reaches that part
    of the schema, with jsonschema's untyped ``_WrappedReferencingError`` raised out of
    ``input_errors`` mid-run -- exactly what the commit says it prevents.
    """
    with pytest.raises(ConfigurationError):
        binding = _tool(input_schema=schema)
        binding.input_errors({"x": {"y": 1}})  # today: _WrappedReferencingError


def test_a_remote_ref_inside_an_embedded_resource_is_not_fetched_mid_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """False acceptance with a network fetch: a remote ``$ref`` inside a subschema that has
    its own ``$id`` is skipped by ``check_refs``, the binding is accepted, and at validation
    time jsonschema's default (deprecated) retrieval calls ``urllib.request.urlopen`` on the
    remote URL -- the error message promises "remote schemas are never fetched".
    """
    fetched: list[str] = []

    def urlopen(request: Any, *args: Any, **kwargs: Any) -> Any:
        fetched.append(getattr(request, "full_url", request))
        raise OSError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    schema = {"properties": {"x": {"$id": "https://example.com/inner",
                                   "$ref": "https://example.invalid/remote.json"}}}
    try:
        binding = _tool(input_schema=schema)
    except ConfigurationError:
        return  # refused when it enters: fine
    with contextlib.suppress(Exception):
        binding.input_errors({"x": 1})
    assert fetched == [], f"validating an accepted binding fetched {fetched}"


# --- bf9eeac: $literal ----------------------------------------------------------------


def test_validate_template_can_tell_literal_data_from_a_reference() -> None:
    """``_check_args`` now hands ``validate_template`` the *unwrapped* args, references
    still in place (tests/test_plan_validation.py: "gets a copy with refs"). A literal
    ``{"$literal": {"$ref": {"node": "a"}}}`` therefore reaches the callback as
    ``{"$ref": {"node": "a"}}`` -- byte-identical to a real reference to ``a`` -- so a host
    template check (e.g. "this field must be static" or "refs only from trusted nodes")
    judges data as a reference and vice versa: the ambiguity ``$literal`` was introduced
    to remove is back for the one callback that inspects the template.
    """
    seen: list[dict[str, Any]] = []
    catalog = HostCatalog([_tool("a", output_schema=INT_OUT),
                           _tool("tmpl", validate_template=seen.append)])

    def template_for(value: Any) -> dict[str, Any]:
        seen.clear()
        validate_plan(_plan({"id": "a", "binding": "a", "version": "1"},
                            {"id": "t", "binding": "tmpl", "version": "1",
                             "args": {"v": value}}),
                      catalog, limits=PlanLimits())
        return seen[0]

    real = template_for({"$ref": {"node": "a"}})
    literal = template_for({"$literal": {"$ref": {"node": "a"}}})
    assert literal != real, f"template for the literal and for a real ref: {literal}"


def test_args_invalid_inside_a_literal_points_at_the_plan() -> None:
    """``_check_args`` validates the unwrapped args and reports ``err.absolute_path`` as if
    it were a plan path, so an error inside a literal is reported at
    ``$.nodes[0].args.cfg.n`` -- a location that does not exist in the plan (the value is
    at ``$.nodes[0].args.cfg.$literal.n``). Diagnostic paths are meant to be fixable
    locations in the submitted plan.
    """
    catalog = HostCatalog([_tool("cfg", input_schema={
        "type": "object",
        "properties": {"cfg": {"type": "object",
                               "properties": {"n": {"type": "integer"}}}}})])
    with pytest.raises(PlanValidationError) as info:
        validate_plan(_plan({"id": "c", "binding": "cfg", "version": "1",
                             "args": {"cfg": {"$literal": {"n": "x"}}}}),
                      catalog, limits=PlanLimits())
    paths = [d.path for d in info.value.diagnostics]
    # either the value inside the wrapper or the wrapper itself: both exist in the plan
    assert len(paths) == 1
    assert paths[0] in ("$.nodes[0].args.cfg.$literal.n", "$.nodes[0].args.cfg"), paths


async def test_a_whole_args_literal_must_still_be_an_object() -> None:
    """PLAN_SCHEMA requires ``args`` to be an object and a tool's ``execute`` "receives the
    validated args dict", but ``"args": {"$literal": [1, 2]}`` passes validation (the
    object check runs on the wrapper, the input schema on the unwrapped list) and the
    tool is called with a list (an agent node calls ``args.get`` on it). Unlike a
    whole-args ``$ref``, a literal is known statically, so the plan can be refused.
    """
    seen: list[Any] = []

    def keep(args: Any) -> dict[str, Any]:
        seen.append(args)
        return {"value": 1}

    rt = ExecutionGraphRuntime(catalog=HostCatalog([
        _tool("keep", execute=keep, output_schema=INT_OUT, run_in_thread=False)]))
    with contextlib.suppress(PlanValidationError):
        await rt.create("whole", program(_plan(
            {"id": "k", "binding": "keep", "version": "1", "args": {"$literal": [1, 2]}})))
        await rt.run("whole", "w1")
    assert all(isinstance(a, dict) for a in seen), f"the tool received {seen}"
