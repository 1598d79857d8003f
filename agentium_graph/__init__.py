"""agentium-graph: durable execution of tool, agent and nested task graphs.

The public API is exactly what this module exports (see ``__all__``); everything in a
``_private`` module may change without notice.

A public name is imported when it is first used, not when the package is: importing
``agentium_graph.errors``, a store package or the CLI does not first load the runtime, the
plan compiler and every pydantic model. ``from agentium_graph import X`` works as it always
has, and a name once imported is kept in the module like any other. Type checkers read the
``TYPE_CHECKING`` block; ``tests/test_exported_members.py`` checks that each name resolves
to the object that block names. This is what lets the CLI's entry module turn a Ctrl-C that
arrives while the runtime is still being imported into "Aborted!" (:mod:`agentium_graph._entry`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentium_graph._program import (
        ExecutionGraphProgram,
        PlanLimits,
        PlannerConfig,
        StreamLimits,
    )
    from agentium_graph.catalog import (
        Agent,
        AgentBinding,
        GraphBinding,
        HostCatalog,
        RepeatBinding,
        ToolBinding,
    )
    from agentium_graph.connectors import (
        Absent,
        ActionOutcome,
        ActionRequest,
        DurableActionConnector,
        Unknown,
    )
    from agentium_graph.errors import (
        AgentiumGraphError,
        BudgetExhaustedError,
        ConfigurationError,
        DataIntegrityError,
        DeadlineExceededError,
        DescriptorMismatchError,
        Diagnostic,
        DurableRecoveryRequiredError,
        ErrorInfo,
        InvalidTransitionError,
        LeaseHeldError,
        NestedDispatchError,
        NodeFailedError,
        NodeInputError,
        NodeOutputError,
        PlannerFailedError,
        PlanValidationError,
        ResolutionConflictError,
        StaleFenceError,
        StoreError,
        StoreNotDurableError,
        StoreSchemaError,
        StoreUnavailableError,
        TaskCanceledError,
        TaskConflictError,
        TaskNotFoundError,
    )
    from agentium_graph.runtime import (
        AdmissionEvent,
        AdmissionSnapshot,
        Budgets,
        ExecutionGraphRuntime,
        NodeView,
        PlannerView,
        RootLimits,
        TaskResult,
        TaskView,
        TimelinePage,
        ToolContext,
        tool_context,
    )
    from agentium_graph.store import DurableTaskStore, InMemoryDurableTaskStore, StoreCapabilities

__version__ = "0.1.0"

__all__ = [
    "Absent",
    "ActionOutcome",
    "ActionRequest",
    "AdmissionEvent",
    "AdmissionSnapshot",
    "Agent",
    "AgentBinding",
    "AgentiumGraphError",
    "BudgetExhaustedError",
    "Budgets",
    "ConfigurationError",
    "DataIntegrityError",
    "DeadlineExceededError",
    "DescriptorMismatchError",
    "Diagnostic",
    "DurableActionConnector",
    "DurableRecoveryRequiredError",
    "DurableTaskStore",
    "ErrorInfo",
    "ExecutionGraphProgram",
    "ExecutionGraphRuntime",
    "GraphBinding",
    "HostCatalog",
    "InMemoryDurableTaskStore",
    "InvalidTransitionError",
    "LeaseHeldError",
    "NestedDispatchError",
    "NodeFailedError",
    "NodeInputError",
    "NodeOutputError",
    "NodeView",
    "PlanLimits",
    "PlanValidationError",
    "PlannerConfig",
    "PlannerFailedError",
    "PlannerView",
    "RepeatBinding",
    "ResolutionConflictError",
    "RootLimits",
    "StaleFenceError",
    "StoreCapabilities",
    "StoreError",
    "StoreNotDurableError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StreamLimits",
    "TaskCanceledError",
    "TaskConflictError",
    "TaskNotFoundError",
    "TaskResult",
    "TaskView",
    "TimelinePage",
    "ToolBinding",
    "ToolContext",
    "Unknown",
    "__version__",
    "tool_context",
]

#: The modules the public names live in, lightest first: a name is looked for in each in
#: turn, so using an error class never imports the runtime.
_HOMES = (
    "agentium_graph.errors",
    "agentium_graph.store",
    "agentium_graph.connectors",
    "agentium_graph.catalog",
    "agentium_graph.runtime",
    "agentium_graph._program",
)
_PUBLIC = frozenset(__all__)
_MISSING = object()


def __getattr__(name: str) -> Any:
    """Import a public name, or a subpackage (which eager imports used to load), on first use."""
    if name in _PUBLIC:
        for home in _HOMES:
            module = importlib.import_module(home)
            value = vars(module).get(name, _MISSING)
            if value is not _MISSING:
                globals()[name] = value
                return value
    elif not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
