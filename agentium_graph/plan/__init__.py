"""Programs, plan models and validation."""

from agentium_graph._program import (
    ExecutionGraphProgram,
    PlanLimits,
    PlannerConfig,
    StreamLimits,
)
from agentium_graph.plan._validate import (
    PLAN_SCHEMA,
    CompiledNode,
    CompiledPlan,
    Ref,
    resolve_args,
    validate_plan,
)

__all__ = [
    "PLAN_SCHEMA",
    "CompiledNode",
    "CompiledPlan",
    "ExecutionGraphProgram",
    "PlanLimits",
    "PlannerConfig",
    "Ref",
    "StreamLimits",
    "resolve_args",
    "validate_plan",
]
