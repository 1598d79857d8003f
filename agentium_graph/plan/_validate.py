"""Plan validation that collects every diagnostic, then compiles the plan for execution.

Validation never stops at the first problem: the shape is checked against a JSON Schema,
then identities, bindings, grants, references and their paths, cycles (including
disconnected ones), size, depth and concurrency, and fully static args against each
binding's input schema. The result is either a :class:`CompiledPlan` or one
:class:`~agentium_graph.errors.PlanValidationError` listing every finding.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from agentium_graph._canonical import NotJSONError, canonical_bytes, check_json
from agentium_graph._program import PlanLimits
from agentium_graph.catalog._bindings import Binding, GraphBinding, RepeatBinding
from agentium_graph.catalog._catalog import HostCatalog
from agentium_graph.errors import Diagnostic, PlanValidationError

PLAN_SCHEMA_VERSION = 1

_ID = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[A-Za-z0-9_.\-]+$"}
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
_PLAN_VALIDATOR = Draft202012Validator(PLAN_SCHEMA)


@dataclass(frozen=True, slots=True)
class Ref:
    """One ``$ref`` inside a node's args: where it sits and what it points at."""

    arg_path: tuple[str | int, ...]
    node: str
    path: tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class CompiledNode:
    id: str
    binding: Binding
    args: dict[str, Any]
    deps: tuple[str, ...]          # control + data dependencies, sorted, unique
    refs: tuple[Ref, ...]
    depth: int                     # 1 + deepest dependency (cumulative with nesting offset)

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

    def successors(self) -> dict[str, list[str]]:
        succ: dict[str, list[str]] = {n: [] for n in self.order}
        for node in self.nodes.values():
            for dep in node.deps:
                succ[dep].append(node.id)
        return succ


def _fmt_path(parts: Collection[str | int], root: str = "$") -> str:
    out = root
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and "$ref" in value


def iter_refs(value: Any, where: tuple[str | int, ...] = ()) -> Iterator[
        tuple[tuple[str | int, ...], Any]]:
    """Yield ``(arg_path, raw $ref body)`` for every reference anywhere in ``value``."""
    if is_ref(value):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_refs(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_refs(v, (*where, i))


def schema_at(schema: dict[str, Any], path: tuple[str | int, ...]) -> tuple[bool, str]:
    """Follow ``path`` through ``schema``. Returns (ok, reason); ok when unknowable."""
    current: Any = schema
    for i, part in enumerate(path):
        if not isinstance(current, dict) or not current:
            return True, ""
        if any(k in current for k in ("$ref", "anyOf", "oneOf", "allOf", "if")):
            return True, ""
        kind = current.get("type")
        here = _fmt_path(path[:i])
        if isinstance(part, str):
            if kind not in (None, "object"):
                return False, f"{here} is of type {kind!r}, so it has no field {part!r}"
            props = current.get("properties", {})
            if part in props:
                current = props[part]
                continue
            extra = current.get("additionalProperties", True)
            if extra is False:
                known = ", ".join(sorted(props)) or "none"
                return False, f"{here} has no field {part!r} (known fields: {known})"
            current = extra if isinstance(extra, dict) else {}
        else:
            if kind not in (None, "array"):
                return False, f"{here} is of type {kind!r}, so it cannot be indexed by {part}"
            items = current.get("items", {})
            current = items if isinstance(items, dict) else {}
    return True, ""


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
    """
    diags = _Collector()
    try:
        check_json(plan)
    except NotJSONError as exc:
        diags.add(exc.path, "not_json", exc.reason)
        raise PlanValidationError(diags.items, subject=subject) from None

    size = len(canonical_bytes(plan))
    if size > limits.max_bytes:
        diags.add("$", "too_large", f"plan is {size} bytes; the limit is {limits.max_bytes}")

    shape_errors = sorted(_PLAN_VALIDATOR.iter_errors(plan), key=lambda e: list(e.absolute_path))
    for err in shape_errors:
        diags.add(_fmt_path(err.absolute_path), "plan_shape", err.message)
    if not isinstance(plan, dict) or not isinstance(plan.get("nodes"), list):
        raise PlanValidationError(diags.items, subject=subject)
    if isinstance(plan.get("schemaVersion"), int) and plan["schemaVersion"] != PLAN_SCHEMA_VERSION:
        diags.add("$.schemaVersion", "unsupported_schema_version",
                  f"schemaVersion {plan['schemaVersion']} is not supported; use "
                  f"{PLAN_SCHEMA_VERSION}")
    requested_conc = plan.get("maxConcurrency")
    if isinstance(requested_conc, int) and requested_conc > limits.max_concurrency:
        diags.add("$.maxConcurrency", "concurrency_limit",
                  f"maxConcurrency {requested_conc} exceeds the host limit "
                  f"{limits.max_concurrency}")

    raw_nodes = [n for n in plan["nodes"] if isinstance(n, dict)]
    if len(raw_nodes) > limits.max_nodes:
        diags.add("$.nodes", "too_many_nodes",
                  f"plan has {len(raw_nodes)} nodes; the limit is {limits.max_nodes}")

    ids: dict[str, int] = {}
    for i, node in enumerate(plan["nodes"]):
        nid = node.get("id") if isinstance(node, dict) else None
        if isinstance(nid, str):
            if nid in ids:
                diags.add(f"$.nodes[{i}].id", "duplicate_node_id",
                          f"node id {nid!r} is already used by $.nodes[{ids[nid]}]", nid)
            else:
                ids[nid] = i

    bindings: dict[str, Binding] = {}
    deps: dict[str, set[str]] = {}
    refs: dict[str, list[Ref]] = {}
    for i, node in enumerate(plan["nodes"]):
        if not isinstance(node, dict) or not isinstance(node.get("id"), str):
            continue
        nid = node["id"]
        if ids.get(nid) != i:
            continue
        where = f"$.nodes[{i}]"
        bid, ver = node.get("binding"), node.get("version")
        binding = catalog.get(bid, ver) if isinstance(bid, str) and isinstance(ver, str) else None
        if binding is None and isinstance(bid, str) and isinstance(ver, str):
            versions = catalog.versions(bid)
            if versions:
                diags.add(f"{where}.version", "unknown_version",
                          f"binding {bid!r} has no version {ver!r} (registered: "
                          f"{', '.join(versions)})", nid)
            else:
                diags.add(f"{where}.binding", "unknown_binding",
                          f"no binding {bid!r} in the host catalog", nid)
        if binding is not None:
            if grants is not None and binding.id not in grants:
                diags.add(f"{where}.binding", "binding_not_granted",
                          f"binding {binding.id!r} is not among the task's grants", nid)
            bindings[nid] = binding
        node_deps: set[str] = set()
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
                    node_deps.add(dep)
        args = node.get("args", {})
        node_refs: list[Ref] = []
        if isinstance(args, dict):
            for arg_path, body in iter_refs(args):
                rwhere = _fmt_path(arg_path, f"{where}.args") + ".$ref"
                ref = _parse_ref(body, rwhere, nid, diags)
                if ref is None:
                    continue
                target, path = ref
                if target == nid:
                    diags.add(rwhere, "self_dependency",
                              f"node {nid!r} cannot reference its own output", nid)
                    continue
                if target not in ids:
                    diags.add(rwhere, "unknown_reference",
                              f"$ref names unknown node {target!r}", nid)
                    continue
                node_deps.add(target)
                node_refs.append(Ref(arg_path=arg_path, node=target, path=path))
                if binding is not None and binding.reference_inputs:
                    dotted = ".".join(str(p) for p in arg_path)
                    if not any(dotted == p or p == "" or dotted.startswith(p + ".")
                               for p in binding.reference_inputs):
                        diags.add(rwhere, "reference_input_not_allowed",
                                  f"binding {binding.id!r} accepts references only at "
                                  f"{list(binding.reference_inputs)}, not at {dotted!r}", nid)
        deps[nid] = node_deps
        refs[nid] = node_refs

    # Reference paths are checked against the producer's declared outputs and schema.
    for nid, node_refs in refs.items():
        i = ids[nid]
        for r in node_refs:
            producer = bindings.get(r.node)
            if producer is None:
                continue
            rwhere = _fmt_path(r.arg_path, f"$.nodes[{i}].args") + ".$r.path"
            dotted = ".".join(str(p) for p in r.path)
            if producer.reference_outputs and not any(
                    p == "" or dotted == p or dotted.startswith(p + ".")
                    for p in producer.reference_outputs):
                diags.add(rwhere, "reference_output_not_allowed",
                          f"{r.node!r} ({producer.id}) exposes only "
                          f"{list(producer.reference_outputs)} to references, not {dotted!r}",
                          nid)
                continue
            ok, reason = schema_at(_output_schema(producer), r.path)
            if not ok:
                diags.add(rwhere, "bad_reference_path",
                          f"{r.node!r} output: {reason}", nid)

    order, cyclic = _toposort(ids, deps)
    for cycle in _cycles(cyclic, deps):
        diags.add(f"$.nodes[{ids[cycle[0]]}]", "cycle",
                  "dependency cycle: " + " -> ".join([*cycle, cycle[0]]), cycle[0])

    depth_of: dict[str, int] = {}
    for nid in order:
        own = 1 + _nested_depth(bindings.get(nid))
        depth_of[nid] = own + max((depth_of[d] for d in deps[nid] if d in depth_of), default=0)
    plan_depth = max(depth_of.values(), default=0)
    if depth_offset + plan_depth > limits.max_depth:
        deepest = max(depth_of, key=lambda n: depth_of[n])
        diags.add(f"$.nodes[{ids[deepest]}]", "too_deep",
                  f"cumulative depth {depth_offset + plan_depth} (dependencies and nesting) "
                  f"exceeds the limit {limits.max_depth}", deepest)

    # Fully static args are checked now; args with references after resolution.
    for nid, binding in bindings.items():
        i = ids[nid]
        args = plan["nodes"][i].get("args", {})
        if not isinstance(args, dict):
            continue
        if not refs.get(nid):
            for err in sorted(binding.input_validator.iter_errors(args),
                              key=lambda e: list(e.absolute_path)):
                diags.add(_fmt_path(err.absolute_path, f"$.nodes[{i}].args"), "args_invalid",
                          f"args violate {binding.id!r} input schema: {err.message}", nid)
        if binding.validate_template is not None:
            try:
                binding.validate_template(args)
            except Exception as exc:  # host callback: any failure is a diagnostic
                diags.add(f"$.nodes[{i}].args", "template_invalid",
                          f"{binding.id!r} rejected the args template: {exc}", nid)

    if diags.items:
        raise PlanValidationError(diags.items, subject=subject)

    compiled = {
        nid: CompiledNode(
            id=nid, binding=bindings[nid],
            args=plan["nodes"][ids[nid]].get("args", {}),
            deps=tuple(sorted(deps[nid])), refs=tuple(refs[nid]),
            depth=depth_offset + depth_of[nid])
        for nid in order
    }
    return CompiledPlan(
        revision=plan["revision"], nodes=compiled, order=tuple(order),
        max_concurrency=min(plan.get("maxConcurrency", limits.max_concurrency),
                            limits.max_concurrency),
        depth=depth_offset + plan_depth, raw=plan)


def _output_schema(binding: Binding) -> dict[str, Any]:
    if isinstance(binding, GraphBinding) and not binding.output_schema:
        return {}
    return binding.output_schema


def _nested_depth(binding: Binding | None) -> int:
    """Nesting depth a graph/repeat binding adds below its node (0 for leaves)."""
    if isinstance(binding, GraphBinding | RepeatBinding):
        plan = binding.program.plan
        if isinstance(plan, dict):
            return _static_depth(plan)
    return 0


def _static_depth(plan: dict[str, Any]) -> int:
    nodes = [n for n in plan.get("nodes", []) if isinstance(n, dict) and "id" in n]
    deps: dict[str, set[str]] = {}
    for n in nodes:
        found = {d for d in n.get("dependsOn", []) + n.get("inputsFrom", [])
                 if isinstance(d, str)}
        for _, body in iter_refs(n.get("args", {})):
            target = body.get("$ref", {}).get("node") if isinstance(body.get("$ref"), dict) \
                else None
            if isinstance(target, str):
                found.add(target)
        deps[n["id"]] = found
    ids = {n["id"]: i for i, n in enumerate(nodes)}
    order, _ = _toposort(ids, deps)
    depth: dict[str, int] = {}
    for nid in order:
        depth[nid] = 1 + max((depth[d] for d in deps[nid] if d in depth), default=0)
    return max(depth.values(), default=0)


def _parse_ref(body: Any, where: str, nid: str,
               diags: _Collector) -> tuple[str, tuple[str | int, ...]] | None:
    if set(body) != {"$ref"}:
        diags.add(where, "bad_reference", "a $ref object must have no other keys", nid)
        return None
    ref = body["$ref"]
    if not isinstance(ref, dict) or not isinstance(ref.get("node"), str) or \
            set(ref) - {"node", "path"}:
        diags.add(where, "bad_reference",
                  'expected {"$ref": {"node": "<id>", "path": [...]}}', nid)
        return None
    path = ref.get("path", [])
    if not isinstance(path, list) or not all(
            isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and p >= 0)
            for p in path):
        diags.add(f"{where}.path", "bad_reference",
                  "path must be a list of field names and non-negative indexes", nid)
        return None
    return ref["node"], tuple(path)


def _toposort(ids: dict[str, int], deps: dict[str, set[str]]) -> tuple[list[str], set[str]]:
    """Kahn's algorithm, ties broken by plan position so the order is deterministic."""
    indeg = {n: len(deps.get(n, set()) & ids.keys()) for n in ids}
    succ: dict[str, list[str]] = {n: [] for n in ids}
    for n, ds in deps.items():
        for d in ds:
            if d in succ:
                succ[d].append(n)
    ready = sorted((n for n, k in indeg.items() if k == 0), key=ids.__getitem__)
    order: list[str] = []
    heap = [(ids[n], n) for n in ready]
    heapq.heapify(heap)
    while heap:
        _, n = heapq.heappop(heap)
        order.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (ids[s], s))
    return order, set(ids) - set(order)


def _cycles(cyclic: set[str], deps: dict[str, set[str]]) -> list[list[str]]:
    """One representative cycle per strongly connected component among ``cyclic`` nodes."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(cyclic):
        if start in seen:
            continue
        # Walk dependencies inside the cyclic set until a node repeats.
        path: list[str] = []
        pos: dict[str, int] = {}
        node = start
        while node not in pos:
            pos[node] = len(path)
            path.append(node)
            nxt = sorted(d for d in deps.get(node, ()) if d in cyclic)
            if not nxt:
                break
            node = nxt[0]
        else:
            cycle = path[pos[node]:]
            if not seen.intersection(cycle):
                found.append(cycle)
        seen.update(path)
    return found


def resolve_args(args: Any, outputs: dict[str, Any]) -> Any:
    """Replace every ``$ref`` in ``args`` with the referenced producer output value.

    Raises ``LookupError`` naming the reference when the path does not exist.
    """
    if is_ref(args):
        ref = args["$ref"]
        value = outputs[ref["node"]]
        for part in ref.get("path", []):
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                raise LookupError(
                    f"$ref {ref['node']}{''.join(f'[{p!r}]' for p in ref.get('path', []))}: "
                    f"the output has no {part!r}") from None
        return value
    if isinstance(args, dict):
        return {k: resolve_args(v, outputs) for k, v in args.items()}
    if isinstance(args, list):
        return [resolve_args(v, outputs) for v in args]
    return args


__all__ = ["PLAN_SCHEMA", "CompiledNode", "CompiledPlan", "Ref", "resolve_args",
           "validate_plan"]


