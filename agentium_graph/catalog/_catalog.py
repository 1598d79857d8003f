"""The host catalog: every binding a plan may select, with a stable digest."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import digest, json_path
from agentium_graph.catalog._bindings import (
    AgentBinding,
    Binding,
    BindingDescriptor,
    GraphBinding,
    RepeatBinding,
    ToolBinding,
    _BindingBase,
)
from agentium_graph.errors import ConfigurationError, Diagnostic, PlanValidationError

if TYPE_CHECKING:
    from agentium_graph.plan._validate import CompiledPlan


class HostCatalog:
    """A versioned set of bindings, keyed by ``(id, version)``.

    The digest covers every binding descriptor (kind, id, version, schemas, recovery,
    destination, connector id/version, nested programs), never the code: behavior is
    attested by version, so changing a callback means bumping its binding's version.

    Construction is the preflight: agents may name only registered tools, and every static
    program of a graph or repeat binding is validated here against this catalog (with the
    program's own limits), so a nested plan can never fail validation mid-run.
    """

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self._bindings: dict[tuple[str, str], Binding] = {}
        if isinstance(bindings, _BindingBase):
            raise ConfigurationError(
                f"HostCatalog takes a list of bindings, not one {type(bindings).__name__}: "
                "wrap it, HostCatalog([binding])")
        if isinstance(bindings, str | bytes | Mapping) or not isinstance(bindings, Iterable):
            raise ConfigurationError(
                f"HostCatalog takes a list of bindings (ToolBinding, AgentBinding, "
                f"GraphBinding, RepeatBinding), not {type(bindings).__name__}; pass "
                "HostCatalog([binding, ...])")
        for binding in bindings:
            if not isinstance(binding, ToolBinding | AgentBinding | GraphBinding | RepeatBinding):
                raise ConfigurationError(
                    f"catalog entries must be ToolBinding, AgentBinding, GraphBinding or "
                    f"RepeatBinding, not {type(binding).__name__}")
            key = (binding.id, binding.version)
            if isinstance(binding, GraphBinding | RepeatBinding) and \
                    binding.program.planner is not None:
                raise ConfigurationError(
                    f"{binding.kind} binding {binding.id!r} version {binding.version!r} has a "
                    "planner program; nested programs need a static plan (only a task's root "
                    "program may be planned)")
            if key in self._bindings:
                raise ConfigurationError(
                    f"binding {binding.id!r} version {binding.version!r} is registered twice; "
                    "bump the version of one of them")
            self._bindings[key] = binding
        self._descriptors = {key: b.descriptor() for key, b in self._bindings.items()}
        self._check_agent_tools()
        self._program_depths: dict[tuple[str, str], int] = {}
        self._output_schemas: dict[tuple[str, str], dict[str, Any]] = {}
        self._visiting: list[tuple[str, str]] = []
        for key in sorted(self._bindings):
            self.program_depth(self._bindings[key])
        # Each descriptor's JSON form, made once: every run compares its task's pinned
        # descriptors with these (never handed out: callers compare, they do not keep).
        self._descriptor_json = {key: d.model_dump(mode="json")
                                 for key, d in self._descriptors.items()}
        self._digest = digest([self._descriptor_json[key]
                               for key in sorted(self._descriptor_json)])

    def _check_agent_tools(self) -> None:
        tool_ids = {b.id for b in self._bindings.values() if isinstance(b, ToolBinding)}
        for binding in self._bindings.values():
            if isinstance(binding, AgentBinding):
                missing = [t for t in binding.agent.tools if t not in tool_ids]
                if missing:
                    raise ConfigurationError(
                        f"agent binding {binding.id!r} names tools {missing} that are not "
                        "tool bindings in this catalog; register them first")

    def program_depth(self, binding: Binding) -> int:
        """Depth a graph/repeat binding's static program adds below its node (0 otherwise).

        The nested program is validated (once) on first use; invalid or self-recursive
        programs raise :class:`ConfigurationError` naming the binding.
        """
        if not isinstance(binding, GraphBinding | RepeatBinding) or binding.program.plan is None:
            return 0
        key = (binding.id, binding.version)
        if key in self._program_depths:
            return self._program_depths[key]
        if key in self._visiting:
            chain = " -> ".join(f"{i}@{v}" for i, v in [*self._visiting, key])
            raise ConfigurationError(
                f"{binding.kind} binding {binding.id!r} version {binding.version!r} contains "
                f"itself through nested programs ({chain}); nested programs cannot recurse: "
                "for a bounded loop, let one RepeatBinding run a program that does not "
                "contain it again")
        from agentium_graph.plan._validate import (  # plan imports the catalog
            pseudo_ref_problems,
            validate_plan,
        )

        self._visiting.append(key)
        try:
            nested = binding.program.checked_plan()
            assert nested is not None
            compiled = validate_plan(
                nested, self, limits=binding.program.limits,
                subject=f"program {binding.program.id!r} of {binding.kind} binding "
                        f"{binding.id!r} version {binding.version!r}")
            problems = pseudo_ref_problems(compiled, repeat=isinstance(binding, RepeatBinding))
            problems.extend(_previous_path_problems(compiled))
            if problems:
                raise PlanValidationError(problems)
        except PlanValidationError as exc:
            raise ConfigurationError(
                f"{binding.kind} binding {binding.id!r} version {binding.version!r} has an "
                f"invalid program: {exc}", details={"codes": exc.details.get("codes", [])}
            ) from None
        finally:
            self._visiting.pop()
        if not binding.output_schema:
            # A graph's output maps its node ids to their outputs, and a repeat's wraps the
            # last iteration's such map in a fixed shape: refs into either are checkable.
            outputs = {
                "type": "object", "additionalProperties": False,
                "properties": {nid: self.reference_schema(node.binding)
                               for nid, node in compiled.nodes.items()}}
            self._output_schemas[key] = outputs if isinstance(binding, GraphBinding) else {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "iterations": {"type": "integer", "minimum": 1,
                                   "maximum": binding.max_iterations},
                    "stopped": {"type": "string", "enum": ["condition", "max_iterations"]},
                    "last": outputs}}
        self._program_depths[key] = compiled.depth
        return compiled.depth

    def reference_schema(self, binding: Binding) -> dict[str, Any]:
        """The schema ``$ref`` paths into ``binding``'s output are checked against."""
        # A graph's is built from its program, which the preflight validates in id order:
        # make sure it is, or a program sorted first would see only the declared schema.
        self.program_depth(binding)
        return self._output_schemas.get((binding.id, binding.version), binding.output_schema)

    @property
    def digest(self) -> str:
        return self._digest

    def get(self, binding_id: str, version: str) -> Binding | None:
        return self._bindings.get((binding_id, version))

    def versions(self, binding_id: str) -> list[str]:
        return sorted((v for (i, v) in self._bindings if i == binding_id), key=_version_key)

    def latest_tool(self, binding_id: str) -> ToolBinding | None:
        """The highest registered version of a tool (for agents naming tools by id)."""
        found = [b for (i, _), b in self._bindings.items()
                 if i == binding_id and isinstance(b, ToolBinding)]
        return max(found, key=lambda b: _version_key(b.version)) if found else None

    def descriptor(self, binding_id: str, version: str) -> BindingDescriptor | None:
        return self._descriptors.get((binding_id, version))

    def pins_same_descriptor(self, binding_id: str, version: str,
                             pinned: dict[str, Any]) -> bool | None:
        """Whether ``pinned`` (a descriptor's JSON form, as a task pinned it) is this
        catalog's descriptor of ``binding_id`` ``version``; None when it has no such
        binding."""
        current = self._descriptor_json.get((binding_id, version))
        return None if current is None else current == pinned

    def __iter__(self) -> Iterator[Binding]:
        return iter(self._bindings.values())

    def __len__(self) -> int:
        return len(self._bindings)


def _previous_path_problems(plan: CompiledPlan) -> list[Diagnostic]:
    """``$previous`` is null in a repeat's first iteration, so a path into it never resolves
    there: the first iteration would fail on every run. Only the whole value may be taken."""
    problems: list[Diagnostic] = []
    index = {node.get("id"): i for i, node in enumerate(plan.raw.get("nodes", []))
             if isinstance(node, dict)}
    for node_id in plan.order:
        for r in plan.nodes[node_id].refs:
            if r.node == "$previous" and r.path:
                where = json_path(r.arg_path, f"$.nodes[{index.get(node_id, 0)}].args")
                problems.append(Diagnostic(
                    path=where + ".$ref.path", code="bad_reference_path", node_id=node_id,
                    message=f"$previous is null in the first iteration, so the path "
                            f"{list(r.path)} into it never resolves there; take it whole "
                            "({\"$ref\": {\"node\": \"$previous\"}}) and let the node "
                            "handle null"))
    return problems


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    # isdigit() is also true of "²", which int() refuses: ASCII digits only.
    return tuple((int(p), "") if p.isascii() and p.isdigit() else (-1, p)
                 for p in version.split("."))
