"""The flattened graph a run schedules: the root plan plus every materialized nested scope.

Nested graphs and repeat iterations are materialized as child node incarnations whose ids
are paths under their container: ``<container>/<node>`` for a graph and
``<container>/<iteration>/<node>`` for a repeat. One scheduler runs them all, so root
admission, budgets and group commits cover every level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentium_graph.catalog._bindings import (
    AgentBinding,
    Binding,
    GraphBinding,
    RepeatBinding,
    ToolBinding,
    is_async_callable,
)
from agentium_graph.plan._validate import CompiledPlan, Ref

NodeKind = Literal["container", "agent", "effect", "tool", "other"]


def node_kind(binding: Binding) -> NodeKind:
    if isinstance(binding, GraphBinding | RepeatBinding):
        return "container"
    if isinstance(binding, AgentBinding):
        return "agent"
    if isinstance(binding, ToolBinding):
        return "effect" if binding.connector is not None else "tool"
    return "other"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node of the run in full-path space."""

    id: str                       # full path id
    local: str                    # the id inside its scope's plan
    scope: str                    # the scope prefix ("" for the root plan)
    binding: Binding
    args: dict[str, Any]
    refs: tuple[Ref, ...]         # ``Ref.node`` is a local id (or ``$input``/``$previous``)
    deps: tuple[str, ...]         # full ids
    literal: bool = False         # args hold ``$literal`` wrappers (resolved like refs)
    # Derived from ``binding`` once, for the scheduler's per-node checks.
    kind: NodeKind = field(init=False, compare=False, repr=False)
    # A tool whose ``execute`` gives an awaitable by declaration: an ``async def`` (also
    # through ``functools.partial``) or an object whose ``__call__`` is one. It is awaited on
    # the loop, not called in a thread, and a stop of the run cancels it.
    is_async: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        binding = self.binding
        object.__setattr__(self, "kind", node_kind(binding))
        object.__setattr__(self, "is_async", isinstance(binding, ToolBinding) and
                           binding.execute is not None and
                           is_async_callable(binding.execute))


@dataclass(slots=True)
class Scope:
    prefix: str
    plan: CompiledPlan
    parent: str | None            # the container's full id (None for the root)
    iteration: int | None         # repeat iteration, else None
    members: list[str] = field(default_factory=list)

    @property
    def concurrency(self) -> int:
        return self.plan.max_concurrency


def _specs(plan: CompiledPlan, prefix: str) -> list[NodeSpec]:
    """The specs of ``plan``'s nodes under ``prefix``, in plan order. A root plan's are
    built once per compiled plan (specs are immutable), so a task of a cached plan reuses
    them; a nested scope's ids depend on its container, so those are built per scope."""
    if not prefix:
        cached: list[NodeSpec] | None = plan.derived.get("root_specs")
        if cached is not None:
            return cached
    specs = []
    for local in plan.order:
        node = plan.nodes[local]
        specs.append(NodeSpec(
            id=prefix + local, local=local, scope=prefix, binding=node.binding,
            args=node.args, refs=node.refs,
            deps=tuple(prefix + d for d in node.deps) if prefix else node.deps,
            literal=node.literal))
    if not prefix:
        plan.derived["root_specs"] = specs
    return specs


def child_prefix(container: str, iteration: int | None) -> str:
    return f"{container}/" if iteration is None else f"{container}/{iteration}/"


class FlatGraph:
    def __init__(self, root: CompiledPlan) -> None:
        self.specs: dict[str, NodeSpec] = {}
        self.scopes: dict[str, Scope] = {}
        self.order: list[str] = []
        self.pos: dict[str, int] = {}          # schedule position: FIFO ties by plan order
        self.succ: dict[str, list[str]] = {}   # full id -> nodes that depend on it
        self.fresh: list[str] = []             # members added since the scheduler looked
        self.changed = False
        # container -> its latest scope (a graph's one scope, a repeat's highest iteration):
        # the scheduler asks for it every turn, so it is kept here rather than found by
        # scanning every scope (which made a long repeat quadratic).
        self._latest: dict[str, Scope] = {}
        self.add_scope("", root, None, None)

    @property
    def root(self) -> Scope:
        return self.scopes[""]

    def add_scope(self, prefix: str, plan: CompiledPlan, parent: str | None,
                  iteration: int | None) -> Scope:
        existing = self.scopes.get(prefix)
        if existing is not None:
            return existing
        scope = Scope(prefix, plan, parent, iteration)
        self.changed = True
        for spec in _specs(plan, prefix):
            self.specs[spec.id] = spec
            self.pos[spec.id] = len(self.order)
            self.order.append(spec.id)
            scope.members.append(spec.id)
            self.succ.setdefault(spec.id, [])
            for dep in spec.deps:
                self.succ.setdefault(dep, []).append(spec.id)
            self.fresh.append(spec.id)
        self.scopes[prefix] = scope
        if parent is not None:
            latest = self._latest.get(parent)
            if latest is None or (iteration or 0) >= (latest.iteration or 0):
                self._latest[parent] = scope
        return scope

    def set_root(self, plan: CompiledPlan) -> Scope:
        """Install the root plan of a task that was planned after it started (revision 0
        had no nodes)."""
        if self.scopes[""].members:
            raise ValueError("the root plan is already installed")
        del self.scopes[""]
        return self.add_scope("", plan, None, None)

    def revise_root(self, plan: CompiledPlan, tombstoned: tuple[str, ...]) -> None:
        """Install a later revision of the root plan: drop the ``tombstoned`` nodes (unclaimed
        pending ones the revision removed or replaced) and add the revision's new nodes.
        Nodes the revision kept are left as they are, with whatever state they have."""
        root = self.scopes[""]
        gone = set(tombstoned)
        if gone:
            for node_id in gone:
                spec = self.specs.pop(node_id, None)
                if spec is None:
                    continue
                for dep in spec.deps:
                    followers = self.succ.get(dep)
                    if followers is not None and node_id in followers:
                        followers.remove(node_id)
                self.succ.pop(node_id, None)
            self.order = [n for n in self.order if n not in gone]
            # Renumbered in place: the scheduler's frontier holds this dict's lookup.
            self.pos.clear()
            self.pos.update((n, i) for i, n in enumerate(self.order))
            root.members = [n for n in root.members if n not in gone]
            self.fresh = [n for n in self.fresh if n not in gone]
        root.plan = plan
        for local in plan.order:
            if local in self.specs:
                continue
            node = plan.nodes[local]
            spec = NodeSpec(id=local, local=local, scope="", binding=node.binding,
                            args=node.args, refs=node.refs, deps=node.deps,
                            literal=node.literal)
            self.specs[local] = spec
            self.pos[local] = len(self.order)
            self.order.append(local)
            root.members.append(local)
            for dep in spec.deps:
                self.succ.setdefault(dep, []).append(local)
            # Its dependents may already be known (kept nodes never depend on new ones, but
            # a replaced node keeps its id).
            self.succ.setdefault(local, [n for n in root.members
                                         if local in self.specs[n].deps and n != local])
            self.fresh.append(local)
        self.changed = True

    def scope_of(self, node_id: str) -> Scope:
        return self.scopes[self.specs[node_id].scope]

    def last_scope(self, container: str) -> Scope | None:
        """The latest scope a container materialized (its graph's scope, or its repeat's
        highest iteration), or None."""
        return self._latest.get(container)
