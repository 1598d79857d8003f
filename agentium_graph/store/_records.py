"""Persisted records. Every record is a frozen pydantic model that round-trips through JSON.

A task is stored as one small **header** (identity digest, status, lease, fence, cancel
request, counters, limits, sequence numbers), one **node record** per node incarnation,
one **action record** per ledger entry, the set of charged **admission ids**, the
append-only **journal**, and content-addressed **blobs** (outputs, plans, identity).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from agentium_graph.errors import ErrorInfo

NodeState = Literal["pending", "claimed", "prepared", "running", "completed", "failed",
                    "canceled", "uncertain", "tombstoned"]
TaskStatus = Literal["pending", "running", "completed", "failed", "canceled",
                     "recovery_required"]
ActionState = Literal["intent", "dispatching", "confirmed", "rejected", "uncertain"]
AttemptOutcome = Literal["completed", "failed", "canceled", "interrupted", "uncertain"]

TERMINAL_TASK: frozenset[str] = frozenset({"completed", "failed", "canceled"})
COUNTERS: tuple[str, ...] = ("expanded_nodes", "work_attempts", "plan_revisions",
                             "tool_calls", "model_calls", "input_tokens", "output_tokens")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LeaseRecord(_Record):
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime


class CancelRecord(_Record):
    reason: str
    requested_at: datetime


class AttemptRecord(_Record):
    number: int
    attempt_id: str
    fence: int
    worker_id: str
    started_at: datetime
    admission_id: str | None = None
    input_digest: str | None = None
    ended_at: datetime | None = None
    outcome: AttemptOutcome | None = None


class NodeRecord(_Record):
    node_id: str
    incarnation_id: str
    kind: str
    binding: str
    version: str
    revision: int
    parent: str | None = None
    deps: tuple[str, ...] = ()
    state: NodeState = "pending"
    attempts: tuple[AttemptRecord, ...] = ()
    input_digest: str | None = None
    output_digest: str | None = None
    error: ErrorInfo | None = None
    updated_at: datetime | None = None


class ActionRecord(_Record):
    action_id: str
    node_id: str
    state: ActionState
    admission_id: str
    origin: dict[str, Any]
    request_digest: str
    result_ref: str
    fence: int
    dispatches: int = 0
    outcome_digest: str | None = None
    outcome_source: str | None = None
    result_ref_returned: str | None = None
    reason: str | None = None
    resolution: dict[str, Any] | None = None
    updated_at: datetime | None = None


class TaskHeader(_Record):
    key: str
    task_id: str
    identity_digest: str
    status: TaskStatus = "pending"
    created_at: datetime
    updated_at: datetime
    seq: int = 0
    fence: int = 0
    lease: LeaseRecord | None = None
    cancel: CancelRecord | None = None
    counters: dict[str, int]
    limits: dict[str, int | None]
    deadline: datetime | None = None
    revision: int = 1
    journal_seq: int = 0
    error: ErrorInfo | None = None
    # The plan blob of the current revision when a CommitRevision set it (planned tasks);
    # None for a static plan, and in headers written before this field existed.
    plan_digest: str | None = None


class TaskIdentity(_Record):
    """Everything a task pins at create; its digest is the task's identity digest."""

    key: str
    catalog_digest: str
    program: dict[str, Any]
    plan: dict[str, Any] | None
    descriptors: dict[str, dict[str, Any]]
    input: Any = None
    input_digest: str
    policy_revision: str
    grants: tuple[str, ...] | None
    budgets: dict[str, int | None]
    root_limits: dict[str, int]
    plan_limits: dict[str, int]
    deadline: datetime | None
    deadline_after_seconds: float | None = None


class JournalEntry(_Record):
    seq: int
    at: datetime
    kind: str
    node_id: str | None = None
    fence: int | None = None
    data: dict[str, Any] = {}


class TaskSnapshot(_Record):
    """A consistent read of a whole task."""

    header: TaskHeader
    nodes: dict[str, NodeRecord]
    actions: dict[str, ActionRecord]


_NO_PLAN_DIGEST: Final[set[str]] = {"plan_digest"}


def stored_header_json(header: TaskHeader) -> str:
    """The JSON a store writes for ``header``. ``plan_digest`` is left out while it is None
    (static plans), so versions that predate the field can still read those headers."""
    return header.model_dump_json(exclude=_NO_PLAN_DIGEST if header.plan_digest is None
                                  else None)
