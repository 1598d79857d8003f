"""Public configuration of root limits and budgets."""

from __future__ import annotations

from pydantic import Field

from agentium_graph._config_base import MAX_LIMIT, IntConfigModel

# Seconds a worker's lease lasts unless renewed: the runtime's default, and what the CLI and
# the resolution helpers take when they hold a task briefly (cancel, resolve).
DEFAULT_LEASE_TTL = 15.0


class RootLimits(IntConfigModel):
    """Ceilings over a task's whole lifetime, shared by every nested graph and agent.

    ``max_concurrent_work``: controlled leaf dispatches (tool callbacks, model requests)
    in flight at once. The others are lifetime counters persisted before dispatch and
    never refunded.
    """

    max_concurrent_work: int = Field(default=4, ge=1, le=1024)
    max_expanded_nodes: int = Field(default=1_000, ge=1, le=MAX_LIMIT)
    max_work_attempts: int = Field(default=1_000, ge=1, le=MAX_LIMIT)
    max_plan_revisions: int = Field(default=32, ge=1, le=MAX_LIMIT)


class Budgets(IntConfigModel):
    """Optional budgets in addition to root limits; ``None`` means unbounded.

    Every limit here and in :class:`RootLimits` is at most ``2**63 - 1``: a task pins them as
    JSON numbers every store keeps as int64."""

    model_calls: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    tool_calls: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    input_tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    output_tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)


def counter_limits(limits: RootLimits, budgets: Budgets) -> dict[str, int | None]:
    """The persisted limit for every counter the store enforces."""
    return {
        "expanded_nodes": limits.max_expanded_nodes,
        "work_attempts": limits.max_work_attempts,
        "plan_revisions": limits.max_plan_revisions,
        "tool_calls": budgets.tool_calls,
        "model_calls": budgets.model_calls,
        "input_tokens": budgets.input_tokens,
        "output_tokens": budgets.output_tokens,
    }
