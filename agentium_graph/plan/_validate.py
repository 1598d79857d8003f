"""Plan validation that collects every diagnostic, then compiles the plan for execution.

Validation never stops at the first problem: the shape is checked against a JSON Schema,
then identities, bindings, grants, references and their paths (against the producer's
output schema where knowable), cycles (one per strongly connected component, so
disconnected cycles are all reported), size, cumulative depth (nested static programs
count, see :meth:`HostCatalog.program_depth`) and concurrency, and args against each
binding's input schema as far as they are static (parts holding a ``$ref`` are checked
after resolution, before dispatch). The result is either a :class:`CompiledPlan` or one
:class:`~agentium_graph.errors.PlanValidationError` listing every finding.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaViolation
from jsonschema.protocols import Validator
from jsonschema.validators import extend

from agentium_graph._canonical import (
    NotJSONError,
    canonical_bytes,
    digest,
    json_copy,
    json_path,
)
from agentium_graph._program import PlanLimits
from agentium_graph.errors import Diagnostic, PlanValidationError

if TYPE_CHECKING:  # the catalog imports this module lazily, so only type-check this import
    from agentium_graph.catalog._bindings import Binding
    from agentium_graph.catalog._catalog import HostCatalog

PLAN_SCHEMA_VERSION = 1

# ``$(?!\n)``: Python's ``$`` also matches before a trailing newline; ECMA regexes ignore it.
_ID = {"type": "string", "maxLength": 200,
       "pattern": r"^[A-Za-z0-9_.\-]+$(?!\n)"}
PLAN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schemaVersion", "revision", "nodes"],
    "additionalProperties": False,
    "properties": {
        "schemaVersion": {"type": "integer"},
        "revision": {"type": "integer", "minimum": 1},
        "maxConcurrency": {"type": "integer", "minimum": 1},
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "binding", "version"],
                "additionalProperties": False,
                "properties": {
                    "id": _ID,
                    "binding": {"type": "string", "minLength": 1},
                    "version": {"type": "string", "minLength": 1},
                    "args": {"type": "object"},
                    "dependsOn": {"type": "array", "items": {"type": "string"}},
                    "inputsFrom": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
# JSON Schema counts 1.0 as an integer; a plan's counters must be real ints (1.0 would
# change every derived id), and bools are not numbers.
_PlanValidator = extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer",
                                                            lambda _, v: type(v) is int))
_PLAN_VALIDATOR: Validator = _PlanValidator(PLAN_SCHEMA)

# Keywords whose verdict on a container holding a ``$ref`` does not depend on the value the
# reference will take later, so they are decided before dispatch.
_STRUCTURAL = frozenset({"type", "required", "additionalProperties", "propertyNames",
                         "minProperties", "maxProperties", "dependentRequired", "minItems",
                         "maxItems"})
# Schema keywords that make a sub-schema's shape unknowable without evaluating it.
_OPAQUE = ("$ref", "$dynamicRef", "anyOf", "oneOf", "allOf", "not", "if", "dependentSchemas")


@dataclass(frozen=True, slots=True)
class Ref:
    """One ``$ref`` inside a node's args: where it sits and what it points at."""

    arg_path: tuple[str | int, ...]
    node: str
    path: tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class CompiledNode:
    """One validated node. ``args`` is the plan's template (shared, never mutate it).

    ``depth`` is cumulative: the depth offset, plus the longest dependency chain to this
    node, plus the depth of its own nested program. A nested program of this node is
    therefore validated with ``depth_offset=depth - catalog.program_depth(binding)``.
    """

    id: str
    binding: Binding
    args: dict[str, Any]
    deps: tuple[str, ...]          # control + data dependencies, sorted, unique
    refs: tuple[Ref, ...]
    depth: int
    literal: bool = False          # ``args`` hold ``{"$literal": ...}`` wrappers to unwrap
    args_digest: str = ""          # digest of ``args`` as written (part of incarnation ids)

    @property
    def static(self) -> bool:
        return not self.refs


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    revision: int
    nodes: dict[str, CompiledNode]
    order: tuple[str, ...]         # a deterministic topological order
    max_concurrency: int
    depth: int
    raw: dict[str, Any] = field(repr=False)
    # What a run derives from this plan alone, kept with it: compiled plans are cached per
    # runtime, so every task of the same plan reuses it (``runtime._graph`` fills it).
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def successors(self) -> dict[str, list[str]]:
        succ: dict[str, list[str]] = {n: [] for n in self.order}
        for node in self.nodes.values():
            for dep in node.deps:
                succ[dep].append(node.id)
        return succ


# ``{"$literal": value}`` in args stands for ``value`` exactly as written: nothing inside it
# is a reference. It is how a plan passes data that itself contains a "$ref" key (a JSON
# Schema, a MongoDB DBRef) to a tool.
LITERAL = "$literal"


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and "$ref" in value and LITERAL not in value


def is_literal(value: Any) -> bool:
    return isinstance(value, dict) and LITERAL in value


def unwrap_literals(value: Any) -> Any:
    """``value`` with every ``{"$literal": v}`` replaced by ``v`` (references untouched);
    shares unchanged parts with ``value``."""
    if is_literal(value):
        return value[LITERAL]
    if isinstance(value, dict):
        return {k: unwrap_literals(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_literals(v) for v in value]
    return value


def iter_literals(value: Any, where: tuple[str | int, ...] = ()) -> Iterator[
        tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Yield ``(arg_path, wrapper)`` for every ``$literal`` wrapper outside other wrappers
    and outside references."""
    if is_literal(value):
        yield where, value
    elif is_ref(value):
        return
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_literals(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_literals(v, (*where, i))


def iter_refs(value: Any, where: tuple[str | int, ...] = ()) -> Iterator[
        tuple[tuple[str | int, ...], Any]]:
    """Yield ``(arg_path, raw $ref body)`` for every reference anywhere in ``value``
    (nothing inside a ``$literal`` wrapper is one)."""
    if is_literal(value):
        return
    if is_ref(value):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_refs(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_refs(v, (*where, i))


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return None


def schema_at(schema: Any, path: Sequence[str | int]) -> tuple[bool, str]:
    """Follow ``path`` through ``schema``. Returns (ok, reason); ok when unknowable."""
    current: Any = schema
    for i, part in enumerate(path):
        here = json_path(path[:i], "output")
        if current is False:
            return False, f"{here} cannot exist (its schema is false)"
        if not isinstance(current, dict) or not current or any(k in current for k in _OPAQUE):
            return True, ""
        kinds = _types(current)
        if isinstance(part, str):
            if kinds is not None and "object" not in kinds:
                return False, f"{here} is of type {_show(kinds)}, so it has no field {part!r}"
            props = current.get("properties", {})
            if isinstance(props, dict) and part in props:
                current = props[part]
                continue
            patterns = current.get("patternProperties", {})
            matched = [sub for pat, sub in patterns.items() if re.search(pat, part)] \
                if isinstance(patterns, dict) else []
            if matched:
                current = matched[0] if len(matched) == 1 else {}
                continue
            extra = current.get("additionalProperties", True)
            if extra is False:
                known = ", ".join(sorted(props)) if isinstance(props, dict) and props else "none"
                return False, f"{here} has no field {part!r} (known fields: {known})"
            current = extra
        else:
            if kinds is not None and "array" not in kinds:
                return False, f"{here} is of type {_show(kinds)}, so it cannot be indexed by " \
                              f"{part}"
            max_items = current.get("maxItems")
            if isinstance(max_items, int) and part >= max_items:
                return False, f"{here} holds at most {max_items} item(s), so index {part} " \
                              "never exists"
            prefix = current.get("prefixItems", [])
            if isinstance(prefix, list) and part < len(prefix):
                current = prefix[part]
            else:
                current = current.get("items", {})
    if current is False:
        return False, f"{json_path(path, 'output')} cannot exist (its schema is false)"
    return True, ""


def _show(kinds: set[str]) -> str:
    return repr(next(iter(kinds))) if len(kinds) == 1 else repr(sorted(kinds))


def _value_at(value: Any, path: Sequence[str | int]) -> tuple[bool, Any]:
    """Follow a ``$ref`` path through a JSON value: str parts index objects, ints arrays."""
    for part in path:
        if isinstance(part, str):
            found = isinstance(value, dict) and part in value
        else:
            found = type(part) is int and isinstance(value, list) and 0 <= part < len(value)
        if not found:
            return False, part
        value = value[part]
    return True, value


_NODE_KEYS = frozenset(PLAN_SCHEMA["properties"]["nodes"]["items"]["properties"])
_PLAN_KEYS = frozenset(PLAN_SCHEMA["properties"])
_ID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


def _shape_ok(plan: Any) -> bool:
    """A fast, sound pre-check of :data:`PLAN_SCHEMA` (jsonschema is slow on big plans).

    True only if the schema accepts ``plan``; on False the schema itself explains why.
    """
    if not isinstance(plan, dict) or not plan.keys() <= _PLAN_KEYS:
        return False
    conc = plan.get("maxConcurrency", 1)
    if type(plan.get("schemaVersion")) is not int or type(plan.get("revision")) is not int \
            or plan["revision"] < 1 or type(conc) is not int or conc < 1:
        return False
    nodes = plan.get("nodes")
    if not isinstance(nodes, list):
        return False
    for n in nodes:
        if not isinstance(n, dict) or not n.keys() <= _NODE_KEYS:
            return False
        nid, binding, version = n.get("id"), n.get("binding"), n.get("version")
        if not isinstance(nid, str) or not _ID_RE.fullmatch(nid) \
                or not isinstance(binding, str) or not binding \
                or not isinstance(version, str) or not version \
                or not isinstance(n.get("args", {}), dict):
            return False
        for name in ("dependsOn", "inputsFrom"):
            deps = n.get(name, [])
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                return False
    return True


class _Collector:
    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def add(self, path: str, code: str, message: str, node_id: str | None = None) -> None:
        self.items.append(Diagnostic(path=path, code=code, message=message, node_id=node_id))


def validate_plan(
    plan: Any,
    catalog: HostCatalog,
    *,
    limits: PlanLimits,
    grants: Collection[str] | None = None,
    depth_offset: int = 0,
    subject: str = "plan",
    known_outputs: dict[str, Any] | None = None,
) -> CompiledPlan:
    """Validate ``plan`` completely and compile it, or raise one PlanValidationError.

    ``grants``: binding ids the task may use (``None`` = every catalog binding).
    ``depth_offset``: nesting depth already used by enclosing graphs/repeats.
    ``known_outputs``: outputs of already completed nodes (by node id); references to them
    are checked against the actual value instead of the producer's output schema.
    """
    diags = _Collector()
    try:
        size = len(canonical_bytes(plan))  # also proves the plan is plain JSON
    except NotJSONError as exc:
        diags.add(exc.path, "not_json", exc.reason, _node_at(plan, exc.path))
        raise PlanValidationError(diags.items, subject=subject) from None
    if size > limits.max_bytes:
        diags.add("$", "too_large", f"plan is {size} bytes; the limit is {limits.max_bytes}")

    shape_errors = [] if _shape_ok(plan) else _PLAN_VALIDATOR.iter_errors(plan)
    for err in sorted(shape_errors, key=lambda e: list(e.absolute_path)):
        where = json_path(err.absolute_path)
        diags.add(where, "plan_shape", err.message, _node_at(plan, where))
    if not isinstance(plan, dict):
        raise PlanValidationError(diags.items, subject=subject)
    version = plan.get("schemaVersion")
    if type(version) is int and version != PLAN_SCHEMA_VERSION:
        diags.add("$.schemaVersion", "unsupported_schema_version",
                  f"schemaVersion {version} is not supported; use {PLAN_SCHEMA_VERSION}")
    requested_conc = plan.get("maxConcurrency")
    if type(requested_conc) is int and requested_conc > limits.max_concurrency:
        diags.add("$.maxConcurrency", "concurrency_limit",
                  f"maxConcurrency {requested_conc} exceeds the host limit "
                  f"{limits.max_concurrency}")
    if not isinstance(plan.get("nodes"), list):
        raise PlanValidationError(diags.items, subject=subject)
    nodes: list[Any] = plan["nodes"]
    if len(nodes) > limits.max_nodes:
        diags.add("$.nodes", "too_many_nodes",
                  f"plan has {len(nodes)} nodes; the limit is {limits.max_nodes}")

    ids: dict[str, int] = {}
    duplicates: list[tuple[str, int]] = []
    for i, node in enumerate(nodes):
        nid = node.get("id") if isinstance(node, dict) else None
        if isinstance(nid, str):
            if nid in ids:
                diags.add(f"$.nodes[{i}].id", "duplicate_node_id",
                          f"node id {nid!r} is already used by $.nodes[{ids[nid]}]", nid)
                duplicates.append((nid, i))
            else:
                ids[nid] = i

    bindings: dict[str, Binding] = {}
    deps: dict[str, set[str]] = {}
    refs: dict[str, list[Ref]] = {}
    for nid, i in ids.items():
        node = nodes[i]
        binding = _check_binding(node, f"$.nodes[{i}]", nid, catalog, grants, diags)
        if binding is not None:
            bindings[nid] = binding
        deps[nid], refs[nid] = _check_dependencies(node, f"$.nodes[{i}]", nid, binding, ids,
                                                   diags)

    for nid, node_refs in refs.items():
        for r in node_refs:
            _check_ref_path(r, ids[nid], nid, bindings.get(r.node), catalog, known_outputs,
                            diags)

    order, cyclic = _toposort(ids, deps)
    for cycle in _cycles(cyclic, deps, ids):
        diags.add(f"$.nodes[{ids[cycle[0]]}]", "cycle",
                  "dependency cycle: " + " -> ".join([*cycle, cycle[0]])
                  + " (each node waits for the next)", cycle[0])

    depth_of: dict[str, int] = {}
    for nid in order:
        own = 1 + (catalog.program_depth(bindings[nid]) if nid in bindings else 0)
        depth_of[nid] = own + max((depth_of[d] for d in deps[nid] if d in depth_of), default=0)
    plan_depth = max(depth_of.values(), default=0)
    if depth_offset + plan_depth > limits.max_depth:
        deepest = max(order, key=lambda n: depth_of[n]) if order else None
        diags.add("$.nodes" if deepest is None else f"$.nodes[{ids[deepest]}]", "too_deep",
                  f"cumulative depth {depth_offset + plan_depth} (dependency chain plus nested "
                  f"programs{f', plus {depth_offset} above this plan' if depth_offset else ''})"
                  f" exceeds the limit {limits.max_depth}", deepest)

    for nid, binding in bindings.items():
        args = nodes[ids[nid]].get("args", {})
        if isinstance(args, dict):
            _check_args(args, f"$.nodes[{ids[nid]}].args", nid, binding, diags)
    # A node under a duplicated id is not part of the graph, but its own problems are still
    # reported: every diagnostic at once, not one fix-and-retry round per problem.
    for nid, i in duplicates:
        node = nodes[i]
        binding = _check_binding(node, f"$.nodes[{i}]", nid, catalog, grants, diags)
        _check_dependencies(node, f"$.nodes[{i}]", nid, binding, ids, diags)
        args = node.get("args", {})
        if binding is not None and isinstance(args, dict):
            _check_args(args, f"$.nodes[{i}].args", nid, binding, diags)

    if diags.items:
        raise PlanValidationError(diags.items, subject=subject)

    compiled = {
        nid: CompiledNode(
            id=nid, binding=bindings[nid], args=nodes[ids[nid]].get("args", {}),
            deps=tuple(sorted(deps[nid])), refs=tuple(refs[nid]),
            depth=depth_offset + depth_of[nid],
            literal=next(iter_literals(nodes[ids[nid]].get("args", {})), None) is not None,
            # The whole plan was checked as JSON above: its parts need no second walk.
            args_digest=digest(nodes[ids[nid]].get("args", {}), trusted=True))
        for nid in order
    }
    return CompiledPlan(
        revision=plan["revision"], nodes=compiled, order=tuple(order),
        max_concurrency=min(plan.get("maxConcurrency", limits.max_concurrency),
                            limits.max_concurrency),
        depth=depth_offset + plan_depth, raw=plan)


def _node_at(plan: Any, path: str) -> str | None:
    """The id of the node a ``$.nodes[i]...`` path points into, when it has one."""
    found = re.match(r"\$\.nodes\[(\d+)\]", path)
    if found is None or not isinstance(plan, dict) or not isinstance(plan.get("nodes"), list):
        return None
    i = int(found.group(1))
    raw = plan["nodes"][i] if i < len(plan["nodes"]) else None
    nid = raw.get("id") if isinstance(raw, dict) else None
    return nid if isinstance(nid, str) else None


def _check_binding(node: dict[str, Any], where: str, nid: str, catalog: HostCatalog,
                   grants: Collection[str] | None, diags: _Collector) -> Binding | None:
    bid, ver = node.get("binding"), node.get("version")
    if not isinstance(bid, str) or not isinstance(ver, str):
        return None  # a shape diagnostic already says so
    binding = catalog.get(bid, ver)
    if binding is None:
        versions = catalog.versions(bid)
        if versions:
            diags.add(f"{where}.version", "unknown_version",
                      f"binding {bid!r} has no version {ver!r} (registered: "
                      f"{', '.join(versions)})", nid)
        else:
            diags.add(f"{where}.binding", "unknown_binding",
                      f"no binding {bid!r} in the host catalog", nid)
        return None
    if grants is not None and binding.id not in grants:
        diags.add(f"{where}.binding", "binding_not_granted",
                  f"binding {binding.id!r} is not among the task's grants", nid)
    return binding


def _check_dependencies(node: dict[str, Any], where: str, nid: str, binding: Binding | None,
                        ids: dict[str, int], diags: _Collector) -> tuple[set[str], list[Ref]]:
    found: set[str] = set()
    for field_name in ("dependsOn", "inputsFrom"):
        values = node.get(field_name, [])
        if not isinstance(values, list):
            continue
        for j, dep in enumerate(values):
            if not isinstance(dep, str):
                continue
            if dep == nid:
                diags.add(f"{where}.{field_name}[{j}]", "self_dependency",
                          f"node {nid!r} cannot depend on itself", nid)
            elif dep not in ids:
                diags.add(f"{where}.{field_name}[{j}]", "unknown_dependency",
                          f"node {nid!r} names unknown node {dep!r}", nid)
            else:
                found.add(dep)
    node_refs: list[Ref] = []
    args = node.get("args", {})
    if not isinstance(args, dict):
        return found, node_refs
    for arg_path, wrapper in iter_literals(args):
        if set(wrapper) != {LITERAL}:
            extra = sorted(k for k in wrapper if k != LITERAL)
            diags.add(json_path(arg_path, f"{where}.args"), "bad_literal",
                      f'a $literal object must have no other keys (found {extra}); write '
                      '{"$literal": <value>} and put everything inside <value>', nid)
        elif not arg_path and not isinstance(wrapper[LITERAL], dict):
            diags.add(f"{where}.args", "bad_literal",
                      "args must be an object; a $literal standing for the whole args must "
                      f"hold an object, not {type(wrapper[LITERAL]).__name__}", nid)
    for arg_path, body in iter_refs(args):
        rwhere = json_path(arg_path, f"{where}.args")
        ref = _parse_ref(body, rwhere, nid, diags)
        if ref is None:
            continue
        target, path = ref
        if target == nid:
            diags.add(f"{rwhere}.$ref.node", "self_dependency",
                      f"node {nid!r} cannot reference its own output", nid)
            continue
        if target in PSEUDO_REFS and target not in ids:
            # Values the runtime supplies, not node outputs: no dependency, no path check.
            node_refs.append(Ref(arg_path=arg_path, node=target, path=path))
            continue
        if target not in ids:
            diags.add(f"{rwhere}.$ref.node", "unknown_reference",
                      f"$ref names unknown node {target!r}", nid)
            continue
        found.add(target)
        node_refs.append(Ref(arg_path=arg_path, node=target, path=path))
        if binding is not None and binding.reference_inputs:
            dotted = ".".join(str(p) for p in arg_path)
            if not _covered(dotted, binding.reference_inputs):
                diags.add(rwhere, "reference_input_not_allowed",
                          f"binding {binding.id!r} accepts references only at "
                          f"{list(binding.reference_inputs)}, not at {dotted!r}", nid)
    return found, node_refs


# Reference targets supplied by the runtime instead of a node: ``$input`` is the task's
# input at the root and the container's args inside a nested graph or repeat; ``$previous``
# is the previous iteration's outputs inside a repeat (null in the first iteration).
PSEUDO_REFS: frozenset[str] = frozenset({"$input", "$previous"})


def pseudo_ref_problems(plan: CompiledPlan, *, repeat: bool, input_known: bool = False,
                        input_value: Any = None) -> list[Diagnostic]:
    """What a plan's ``$previous``/``$input`` references get wrong where that is known
    before anything runs: ``$previous`` exists only in a repeat's program, and at the root
    the task's input is given at create, so a ``$input`` path it lacks never resolves."""
    problems: list[Diagnostic] = []
    index = {node_id: i for i, node_id in enumerate(
        n.get("id") for n in plan.raw.get("nodes", []) if isinstance(n, dict))}
    for node_id in plan.order:
        for r in plan.nodes[node_id].refs:
            where = json_path(r.arg_path, f"$.nodes[{index.get(node_id, 0)}].args") + ".$ref"
            if r.node == "$previous" and not repeat:
                problems.append(Diagnostic(
                    path=where + ".node", code="bad_reference", node_id=node_id,
                    message="$previous (the previous iteration's outputs) exists only inside "
                            "a RepeatBinding's program; refer to a node of this plan instead"))
            elif r.node == "$input" and input_known:
                ok, missing = _value_at(input_value, r.path)
                if not ok:
                    problems.append(Diagnostic(
                        path=where + ".path", code="bad_reference_path", node_id=node_id,
                        message=f"the task's input has no {missing!r} along {list(r.path)}; "
                                "pass an input that has it, or fix the path"))
    return problems


def _covered(dotted: str, allowed: Collection[str]) -> bool:
    """Whether a dot path lies at or below one of ``allowed`` (``""`` = the whole value)."""
    return any(p == "" or dotted == p or dotted.startswith(p + ".") for p in allowed)


def _check_ref_path(r: Ref, i: int, nid: str, producer: Binding | None, catalog: HostCatalog,
                    known_outputs: dict[str, Any] | None, diags: _Collector) -> None:
    if producer is None:
        return  # the producer's own binding diagnostic explains it
    where = json_path(r.arg_path, f"$.nodes[{i}].args") + ".$ref.path"
    dotted = ".".join(str(p) for p in r.path)
    if producer.reference_outputs and not _covered(dotted, producer.reference_outputs):
        diags.add(where, "reference_output_not_allowed",
                  f"{r.node!r} ({producer.id}) exposes only {list(producer.reference_outputs)} "
                  f"to references, not {dotted!r}", nid)
        return
    if known_outputs is not None and r.node in known_outputs:
        ok, missing = _value_at(known_outputs[r.node], r.path)
        if not ok:
            diags.add(where, "bad_reference_path",
                      f"{r.node!r} output has no {missing!r} along {list(r.path)}", nid)
        return
    ok, reason = schema_at(catalog.reference_schema(producer), r.path)
    if not ok:
        diags.add(where, "bad_reference_path", f"{r.node!r} {reason}", nid)


def _check_args(args: dict[str, Any], where: str, nid: str, binding: Binding,
                diags: _Collector) -> None:
    """Args are checked now as far as they are static; the rest after resolution.

    The input schema sees what the tool will receive (literals unwrapped, references still
    in place); an error inside a literal is reported at its place in the plan. The host's
    ``validate_template`` sees the args as written, so it can tell literal data from a
    reference. Every ``$ref`` stands for a future value, also one that names an unknown node
    or is malformed: its own diagnostic says so, not a schema error about the ``$ref``
    object.
    """
    ref_paths = [p for p, _ in iter_refs(args)]
    literals = [p for p, _ in iter_literals(args)]
    for err in binding.input_errors(unwrap_literals(args)):
        if _static_verdict(err, ref_paths):
            at = tuple(err.absolute_path)
            for lit in literals:
                if at[:len(lit)] == lit:
                    at = (*lit, LITERAL, *at[len(lit):])
                    break
            diags.add(json_path(at, where), "args_invalid",
                      f"args violate {binding.id!r} input schema: {err.message}", nid)
    if binding.validate_template is not None:
        try:
            binding.validate_template(json_copy(args))
        except Exception as exc:  # host callback: any failure is a diagnostic
            diags.add(where, "template_invalid",
                      f"{binding.id!r} rejected the args template: {exc}", nid)


def _static_verdict(err: SchemaViolation, ref_paths: list[tuple[str | int, ...]]) -> bool:
    """Whether a schema error stands no matter what values the references resolve to."""
    at = tuple(err.absolute_path)
    for ref in ref_paths:
        if at[:len(ref)] == ref:
            return False  # at or inside a future value
        if ref[:len(at)] == at and err.validator not in _STRUCTURAL:
            return False  # a container's verdict that may depend on the future value
    return True


def _parse_ref(body: Any, where: str, nid: str,
               diags: _Collector) -> tuple[str, tuple[str | int, ...]] | None:
    if set(body) != {"$ref"}:
        extra = sorted(k for k in body if k != "$ref")
        diags.add(where, "bad_reference",
                  f"a $ref object must have no other keys (found {extra})", nid)
        return None
    ref = body["$ref"]
    if not isinstance(ref, dict) or not isinstance(ref.get("node"), str) or \
            set(ref) - {"node", "path"}:
        diags.add(f"{where}.$ref", "bad_reference",
                  'expected {"$ref": {"node": "<id>", "path": [...]}}', nid)
        return None
    path = ref.get("path", [])
    if not isinstance(path, list):
        diags.add(f"{where}.$ref.path", "bad_reference",
                  "path must be a list of field names and non-negative indexes", nid)
        return None
    bad = [k for k, p in enumerate(path)
           if not (isinstance(p, str) or (type(p) is int and p >= 0))]
    for k in bad:
        diags.add(f"{where}.$ref.path[{k}]", "bad_reference",
                  f"path item {path[k]!r} is neither a field name nor a non-negative index", nid)
    return None if bad else (ref["node"], tuple(path))


def _toposort(ids: dict[str, int], deps: dict[str, set[str]]) -> tuple[list[str], set[str]]:
    """Kahn's algorithm, ties broken by plan position so the order is deterministic."""
    indeg = {n: len(deps.get(n, set()) & ids.keys()) for n in ids}
    succ: dict[str, list[str]] = {n: [] for n in ids}
    for n, ds in deps.items():
        for d in ds:
            if d in succ:
                succ[d].append(n)
    heap = [(ids[n], n) for n, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        _, n = heapq.heappop(heap)
        order.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (ids[s], s))
    return order, set(ids) - set(order)


def _cycles(cyclic: set[str], deps: dict[str, set[str]],
            ids: dict[str, int]) -> list[list[str]]:
    """One cycle per strongly connected component among ``cyclic`` nodes, in plan order.

    ``cyclic`` also holds nodes that merely wait on a cycle; they form no component of
    their own, so they are not reported.
    """
    pos = ids.__getitem__
    inner = {n: sorted((d for d in deps[n] if d in cyclic), key=pos) for n in cyclic}
    found: list[list[str]] = []
    for comp in _components(sorted(cyclic, key=pos), inner):
        if len(comp) < 2:
            continue
        # Every member has a dependency inside the component, so this walk closes a loop.
        walk: list[str] = []
        at: dict[str, int] = {}
        n = min(comp, key=pos)
        while n not in at:
            at[n] = len(walk)
            walk.append(n)
            n = next(d for d in inner[n] if d in comp)
        cycle = walk[at[n]:]
        first = cycle.index(min(cycle, key=pos))
        found.append(cycle[first:] + cycle[:first])
    return sorted(found, key=lambda c: pos(c[0]))


def _components(nodes: list[str], edges: dict[str, list[str]]) -> list[set[str]]:
    """Strongly connected components (Kosaraju, iterative: plans may be large)."""
    finished: list[str] = []
    seen: set[str] = set()
    for root in nodes:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(edges[root]))]
        while stack:
            n, it = stack[-1]
            nxt = next((d for d in it if d not in seen), None)
            if nxt is None:
                stack.pop()
                finished.append(n)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(edges[nxt])))
    reverse: dict[str, list[str]] = {n: [] for n in nodes}
    for n in nodes:
        for d in edges[n]:
            reverse[d].append(n)
    comps: list[set[str]] = []
    assigned: set[str] = set()
    for root in reversed(finished):
        if root in assigned:
            continue
        comp = {root}
        assigned.add(root)
        todo = [root]
        while todo:
            for m in reverse[todo.pop()]:
                if m not in assigned:
                    assigned.add(m)
                    comp.add(m)
                    todo.append(m)
        comps.append(comp)
    return comps


def resolve_args(args: Any, outputs: dict[str, Any]) -> Any:
    """Replace every ``$ref`` in ``args`` with a copy of the referenced output value.

    Raises ``LookupError`` naming the reference when the producer has no output or the
    path does not exist in it (string parts index objects, integer parts index arrays).
    A ``{"$literal": value}`` wrapper becomes a copy of ``value``, searched for nothing.
    """
    if not isinstance(args, dict):
        return [resolve_args(v, outputs) for v in args] if isinstance(args, list) else args
    # is_literal() and is_ref(), tested in place: this runs for every value of every args.
    if LITERAL in args:
        return json_copy(args[LITERAL], trusted=True)
    if "$ref" in args:
        ref = args["$ref"]
        node, path = ref["node"], ref.get("path", [])
        if node not in outputs:
            raise LookupError(f"{json_path(path, f'$ref {node}')}: node {node!r} has no output")
        ok, missing = _value_at(outputs[node], path)
        if not ok:
            what = {"$input": "the input", "$previous": "the previous iteration's outputs"}
            raise LookupError(f"{json_path(path, f'$ref {node}')}: "
                              f"{what.get(node, 'the output')} has no {missing!r}")
        # Consumers must not share (and mutate) stored outputs; those are checked JSON.
        return json_copy(missing, trusted=True)
    return {k: resolve_args(v, outputs) for k, v in args.items()}


__all__ = ["LITERAL", "PLAN_SCHEMA", "CompiledNode", "CompiledPlan", "Ref", "resolve_args",
           "unwrap_literals", "validate_plan"]
