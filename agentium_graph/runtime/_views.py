"""What the runtime returns to callers: task views, results and admission events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentium_graph.errors import Diagnostic, ErrorInfo
from agentium_graph.store._records import (
    ActionRecord,
    AttemptRecord,
    CancelRecord,
    LeaseRecord,
    NodeState,
    TaskStatus,
)


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeView(_View):
    node_id: str
    state: NodeState
    kind: str
    binding: str
    version: str
    revision: int
    incarnation_id: str
    parent: str | None
    deps: tuple[str, ...]
    attempts: list[AttemptRecord]  # oldest first, each with its fence
    input_digest: str | None
    output: Any = None
    output_digest: str | None
    error: ErrorInfo | None


PlannerState = Literal["planning", "planned", "failed", "canceled"]


class PlannerView(_View):
    """What a planned task's planner has done so far, read from the task's journal.

    ``state``: ``planning`` until the plan is settled (also between runs), ``planned`` once
    it is (complete mode: revision 1 committed; stream mode: the stream sealed),
    ``failed`` / ``canceled`` when the task ended before that. ``calls``: provider calls
    charged (each before it was made), whether an answer came or not.
    ``proposals``: answers (complete) or frames (stream) judged so far, accepted or
    rejected; ``rejected`` of them were sent back with diagnostics. ``plan_digest``: the
    latest committed plan's blob. ``last_diagnostics``: why the latest rejected answer was
    refused, or why the latest stream broke off.
    """

    mode: str
    provider: dict[str, Any]
    state: PlannerState
    calls: int = 0
    proposals: int
    rejected: int
    max_corrections: int
    plan_digest: str | None = None
    last_diagnostics: tuple[Diagnostic, ...] = ()


class TaskView(_View):
    """A read-only picture of a task, built by ``inspect`` without a lease or a write."""

    key: str
    task_id: str
    status: TaskStatus
    revision: int
    program: dict[str, Any]
    catalog_digest: str
    identity_digest: str
    nodes: dict[str, NodeView]
    counters: dict[str, int]
    limits: dict[str, int | None]
    actions: tuple[ActionRecord, ...]
    lease: LeaseRecord | None
    cancel: CancelRecord | None
    deadline: datetime | None
    error: ErrorInfo | None
    created_at: datetime
    updated_at: datetime
    fence: int
    journal_length: int
    verified: bool
    problems: tuple[str, ...] = ()
    planner: PlannerView | None = None  # None for a task with a static plan

    @property
    def pending_actions(self) -> tuple[ActionRecord, ...]:
        return tuple(a for a in self.actions if a.state in ("intent", "dispatching"))

    @property
    def uncertain_actions(self) -> tuple[ActionRecord, ...]:
        return tuple(a for a in self.actions if a.state == "uncertain")


class TaskResult(_View):
    key: str
    status: TaskStatus
    output: dict[str, Any]
    revision: int = 1
    counters: dict[str, int] = {}


AdmissionEventKind = Literal["queued", "admitted", "released", "exhausted", "rejected"]


class AdmissionEvent(_View):
    kind: AdmissionEventKind
    key: str
    node_id: str | None
    admission_id: str | None = None
    active: int
    queued: int
    capacity: int
    at: datetime
    reason: str | None = None
    counter: str | None = None


class AdmissionSnapshot(_View):
    """A task's lifetime counters against their limits, and its root admission queue:
    ``active`` permits held, ``queued`` requests waiting (its queue depth), ``capacity``."""

    key: str
    counters: dict[str, int]
    limits: dict[str, int | None]
    active: int
    queued: int
    capacity: int

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a root permit (the same as ``queued``)."""
        return self.queued
