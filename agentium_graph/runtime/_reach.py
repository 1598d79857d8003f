"""Which bindings a plan reaches: its nodes, the nodes of nested programs, and agents'
tools. At create that is what the task pins (an agent's tools at the catalog's latest
version); afterwards an agent's tools are the versions pinned then."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentium_graph.catalog._bindings import AgentBinding, Binding, GraphBinding, RepeatBinding
from agentium_graph.catalog._catalog import HostCatalog
from agentium_graph.catalog._catalog import _version_key as version_key
from agentium_graph.plan._validate import CompiledPlan


def used_bindings(plan: CompiledPlan, catalog: HostCatalog) -> list[Binding]:
    """Every binding the plan can reach: its nodes, nested programs and agent tools (at the
    catalog's latest version, which is what ``create`` pins)."""
    found = _reach(plan, catalog, None)
    return [b for _, b in sorted(found.items()) if b is not None]


def pinned_keys_used(plan: CompiledPlan, catalog: HostCatalog,
                     pinned: Mapping[str, Any]) -> set[str]:
    """``id@version`` of every binding the plan reaches once the task pinned its catalog:
    an agent's tools at the versions pinned at create (as the agent uses them), even when
    this catalog no longer registers them (the descriptor check then names them)."""
    return set(_reach(plan, catalog, pinned))


def ungranted_by_node(plan: CompiledPlan, catalog: HostCatalog,
                      grants: set[str]) -> list[tuple[int, str, list[str]]]:
    """For each node of the plan (its index in the plan's nodes, its id) the bindings it
    reaches through nested programs and agent tools that ``grants`` leaves out (the node's
    own binding is checked with the plan). For a diagnostic that names the node."""
    out = []
    for index, raw in enumerate(plan.raw.get("nodes", [])):
        node = plan.nodes.get(raw.get("id"))
        if node is None:
            continue
        missing = sorted({b.id for b in _reach_from([node.binding], catalog, None).values()
                          if b is not None and b is not node.binding} - grants)
        if missing:
            out.append((index, node.id, missing))
    return out


def _reach(plan: CompiledPlan, catalog: HostCatalog,
           pinned: Mapping[str, Any] | None) -> dict[str, Binding | None]:
    return _reach_from([n.binding for n in plan.nodes.values()], catalog, pinned)


def _reach_from(roots: list[Binding], catalog: HostCatalog,
                pinned: Mapping[str, Any] | None) -> dict[str, Binding | None]:
    seen: dict[str, Binding | None] = {}
    stack: list[Binding] = list(roots)
    while stack:
        binding = stack.pop()
        key = f"{binding.id}@{binding.version}"
        if key in seen:
            continue
        seen[key] = binding
        if isinstance(binding, GraphBinding | RepeatBinding) and binding.program.plan:
            for raw in binding.program.plan.get("nodes", []):
                found = catalog.get(raw.get("binding"), raw.get("version"))
                if found is not None:
                    stack.append(found)
        if isinstance(binding, AgentBinding):
            for tool in binding.agent.tools:
                version = None if pinned is None else pinned_tool_version(pinned, tool)
                if version is not None:
                    tool_binding = catalog.get(tool, version)
                    if tool_binding is None:
                        seen.setdefault(f"{tool}@{version}", None)
                    else:
                        stack.append(tool_binding)
                    continue
                latest = catalog.latest_tool(tool)
                if latest is not None:
                    stack.append(latest)
    return seen


def pinned_tool_version(pinned: Mapping[str, Any], name: str) -> str | None:
    """The version of tool ``name`` an agent uses: the highest one the task pinned (what
    the catalog's latest was at create), or None when the task pinned none."""
    versions = [key.rpartition("@")[2] for key, desc in pinned.items()
                if key.rpartition("@")[0] == name and desc.get("kind") == "tool"]
    return max(versions, key=version_key) if versions else None
