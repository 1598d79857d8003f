"""The host catalog: every binding a plan may select, with a stable digest."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from agentium_graph._canonical import digest
from agentium_graph.catalog._bindings import (
    AgentBinding,
    Binding,
    BindingDescriptor,
    GraphBinding,
    RepeatBinding,
    ToolBinding,
)
from agentium_graph.errors import ConfigurationError


class HostCatalog:
    """A versioned set of bindings, keyed by ``(id, version)``.

    The digest covers every binding descriptor (kind, id, version, schemas, recovery,
    destination, connector id/version, nested programs), never the code: behavior is
    attested by version, so changing a callback means bumping its binding's version.
    """

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self._bindings: dict[tuple[str, str], Binding] = {}
        for binding in bindings:
            if not isinstance(binding, ToolBinding | AgentBinding | GraphBinding | RepeatBinding):
                raise ConfigurationError(
                    f"catalog entries must be ToolBinding, AgentBinding, GraphBinding or "
                    f"RepeatBinding, not {type(binding).__name__}")
            key = (binding.id, binding.version)
            if key in self._bindings:
                raise ConfigurationError(
                    f"binding {binding.id!r} version {binding.version!r} is registered twice; "
                    "bump the version of one of them")
            self._bindings[key] = binding
        self._descriptors = {key: b.descriptor() for key, b in self._bindings.items()}
        self._check_agent_tools()
        self._digest = digest([d.model_dump(mode="json") for _, d in
                               sorted(self._descriptors.items())])

    def _check_agent_tools(self) -> None:
        tool_ids = {b.id for b in self._bindings.values() if isinstance(b, ToolBinding)}
        for binding in self._bindings.values():
            if isinstance(binding, AgentBinding):
                missing = [t for t in binding.agent.tools if t not in tool_ids]
                if missing:
                    raise ConfigurationError(
                        f"agent binding {binding.id!r} names tools {missing} that are not "
                        "tool bindings in this catalog; register them first")

    @property
    def digest(self) -> str:
        return self._digest

    def get(self, binding_id: str, version: str) -> Binding | None:
        return self._bindings.get((binding_id, version))

    def versions(self, binding_id: str) -> list[str]:
        return sorted(v for (i, v) in self._bindings if i == binding_id)

    def latest_tool(self, binding_id: str) -> ToolBinding | None:
        """The highest registered version of a tool (for agents naming tools by id)."""
        found = [b for (i, _), b in self._bindings.items()
                 if i == binding_id and isinstance(b, ToolBinding)]
        return max(found, key=lambda b: _version_key(b.version)) if found else None

    def descriptor(self, binding_id: str, version: str) -> BindingDescriptor | None:
        return self._descriptors.get((binding_id, version))

    def __iter__(self) -> Iterator[Binding]:
        return iter(self._bindings.values())

    def __len__(self) -> int:
        return len(self._bindings)


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in version.split("."))
