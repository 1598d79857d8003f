"""Host catalog and bindings."""

from agentium_graph.catalog._bindings import (
    Agent,
    AgentBinding,
    Binding,
    BindingDescriptor,
    GraphBinding,
    RepeatBinding,
    ToolBinding,
)
from agentium_graph.catalog._catalog import HostCatalog

__all__ = [
    "Agent",
    "AgentBinding",
    "Binding",
    "BindingDescriptor",
    "GraphBinding",
    "HostCatalog",
    "RepeatBinding",
    "ToolBinding",
]
