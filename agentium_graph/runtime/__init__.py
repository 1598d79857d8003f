"""The runtime: create, run, inspect and cancel durable tasks."""

from agentium_graph.runtime._config import Budgets, RootLimits
from agentium_graph.runtime._context import ToolContext, tool_context
from agentium_graph.runtime._operator import TimelinePage
from agentium_graph.runtime._runtime import ExecutionGraphRuntime
from agentium_graph.runtime._views import (
    AdmissionEvent,
    AdmissionSnapshot,
    NodeView,
    PlannerView,
    TaskResult,
    TaskView,
)

__all__ = [
    "AdmissionEvent",
    "AdmissionSnapshot",
    "Budgets",
    "ExecutionGraphRuntime",
    "NodeView",
    "PlannerView",
    "RootLimits",
    "TaskResult",
    "TaskView",
    "TimelinePage",
    "ToolContext",
    "tool_context",
]
