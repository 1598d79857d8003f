"""Frozen, keyword-only request and result models of the store protocol.

Node and ledger transitions are *steps*: one frozen model per transition. A store applies
a :class:`CommitRequest` (several steps under one fence) atomically, so "node k completed
+ node k+1 started" or a whole ready wave is one durable commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from agentium_graph._canonical import NotJSONError, check_json
from agentium_graph._config_base import ConfigModel
from agentium_graph.errors import ErrorInfo, bool_only, int_only
from agentium_graph.store._records import (
    COUNTERS,
    ActionRecord,
    CancelRecord,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    TaskStatus,
    trusted,
)


def _utc(value: datetime) -> datetime:
    """An aware datetime as UTC: stored forms keep whole-minute offsets only (a +00:00:30
    zone moved an expiry 30 s), and the records compare instants of one zone."""
    if value.utcoffset() is None:
        raise ValueError("must be timezone-aware, such as datetime.now(UTC)")
    return value if value.tzinfo is UTC else value.astimezone(UTC)


# A request's clock reading: aware, as UTC.
Now = Annotated[datetime, AfterValidator(_utc)]
# The longest lease a request may ask for (30 days): enough for any worker, and an expiry
# (now + ttl) that every store can write.
MAX_TTL_S: Final = 30 * 86_400.0
_INT64: Final = 2**63 - 1  # what MongoDB (and SQLite's INTEGER) can hold


def _check_expiry(now: datetime, ttl_seconds: float) -> None:
    try:
        now + timedelta(seconds=ttl_seconds)
    except OverflowError:
        raise ValueError(f"now + ttl_seconds ({now.isoformat()} + {ttl_seconds:g} s) is past "
                         "the last date a datetime can hold") from None

class _Req(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StoreCapabilities(ConfigModel):
    """What a store promises. ``durable``: acknowledged writes survive process loss."""

    durable: bool
    multi_process: bool = False
    name: str = "store"
    # The largest blob (an output, plan, input or error, as UTF-8 canonical JSON) the store
    # can keep in one record; None: no limit the runtime needs to respect. The runtime
    # fails a node whose output is larger instead of attempting a commit that cannot land.
    max_blob_bytes: int | None = Field(default=None, ge=1)

    # Real bools and ints only, never 1, "yes" or "5" (pydantic's lax mode takes those): a
    # store author's typo would otherwise promise durability or a limit nobody meant.
    @field_validator("durable", "multi_process", mode="before")
    @classmethod
    def _bools_only(cls, value: Any) -> Any:
        return bool_only(value)

    @field_validator("max_blob_bytes", mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        return int_only(value)


# --- steps -----------------------------------------------------------------------------

class AddNodes(_Req):
    """Materialize new pending node incarnations (a nested graph, a planner revision)."""

    type: Literal["add_nodes"] = "add_nodes"
    nodes: tuple[NodeRecord, ...]
    admission_id: str


class CommitRevision(_Req):
    """Advance the task's plan revision: add nodes, tombstone unclaimed pending ones."""

    type: Literal["commit_revision"] = "commit_revision"
    base_revision: int
    revision: int
    plan_digest: str
    add: tuple[NodeRecord, ...] = ()
    tombstone: tuple[str, ...] = ()
    admission_id: str


class ClaimNode(_Req):
    type: Literal["claim_node"] = "claim_node"
    node_id: str
    requires_completed: tuple[str, ...] = ()


class PrepareNode(_Req):
    type: Literal["prepare_node"] = "prepare_node"
    node_id: str
    input_digest: str


class StartAttempt(_Req):
    """Start a fresh attempt of a node under the request's fence, charging its admission."""

    type: Literal["start_attempt"] = "start_attempt"
    node_id: str
    attempt_id: str
    input_digest: str | None = None
    admission_id: str | None = None
    charges: dict[str, int] = {}
    requires_completed: tuple[str, ...] = ()


class SettleNode(_Req):
    type: Literal["settle_node"] = "settle_node"
    node_id: str
    state: Literal["completed", "failed", "canceled", "uncertain"]
    output_digest: str | None = None
    error: ErrorInfo | None = None


class ReopenNode(_Req):
    """Return an uncertain node to pending after an operator attested its effect is absent."""

    type: Literal["reopen_node"] = "reopen_node"
    node_id: str
    reason: str


class Charge(_Req):
    """Charge counters once per admission id; a repeat of the same id charges nothing."""

    type: Literal["charge"] = "charge"
    admission_id: str
    charges: dict[str, int]
    node_id: str | None = None


class RecordAction(_Req):
    """Create or advance a ledger entry (intent -> dispatching -> confirmed | ...)."""

    type: Literal["record_action"] = "record_action"
    action: ActionRecord


class SetStatus(_Req):
    type: Literal["set_status"] = "set_status"
    status: TaskStatus
    error: ErrorInfo | None = None
    release_lease: bool = False


class AppendJournal(_Req):
    type: Literal["append_journal"] = "append_journal"
    kind: str
    node_id: str | None = None
    data: dict[str, Any] = {}

    @field_validator("data")
    @classmethod
    def _json_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Journaled as JSON and read back from it: a set, bytes, NaN or object would come
        # back as something else (or not at all), so only plain JSON is accepted.
        try:
            check_json(value, "data")
        except NotJSONError as exc:
            raise ValueError(f"journal data must be plain JSON: {exc}") from None
        return value


Step = Annotated[
    AddNodes | CommitRevision | ClaimNode | PrepareNode | StartAttempt | SettleNode | Charge
    | RecordAction | SetStatus | AppendJournal | ReopenNode,
    Field(discriminator="type"),
]


# --- requests and results --------------------------------------------------------------

class CreateTaskRequest(_Req):
    header: TaskHeader
    identity: TaskIdentity
    nodes: tuple[NodeRecord, ...]
    admission_id: str
    blobs: dict[str, str] = {}

    @field_validator("header")
    @classmethod
    def _new_header(cls, header: TaskHeader) -> TaskHeader:
        missing = [name for name in COUNTERS if name not in header.counters]
        if missing:
            # A store reads a header back without one as damaged: a counter removed by
            # hand would otherwise count again from zero.
            raise ValueError(f"header.counters must hold every counter (missing {missing}); "
                             "start them at 0")
        for name, value in header.counters.items():
            limit = header.limits.get(name)
            if not 0 <= value <= (_INT64 if limit is None else limit):
                raise ValueError(f"header.counters.{name} is {value}: a new task's counters "
                                 "are 0 or more, and within their limits")
        for name, limit in header.limits.items():
            if limit is not None and not 0 <= limit <= _INT64:
                raise ValueError(f"header.limits.{name} is {limit}: a limit is 0 to 2**63-1 "
                                 "(or None, no limit)")
        if header.status != "pending" or header.lease is not None or header.cancel is not None:
            raise ValueError("header: a new task is pending, with no lease and no cancel request")
        times = {"created_at": _utc(header.created_at), "updated_at": _utc(header.updated_at),
                 "deadline": None if header.deadline is None else _utc(header.deadline)}
        if any(times[name] is not getattr(header, name) for name in times):
            header = header.model_copy(update=times)
        return header

    @field_validator("identity")
    @classmethod
    def _utc_deadline(cls, identity: TaskIdentity) -> TaskIdentity:
        deadline = identity.deadline
        utc = None if deadline is None else _utc(deadline)
        if utc is not deadline:
            identity = identity.model_copy(update={"deadline": utc})
        return identity

    @model_validator(mode="after")
    def _consistent(self) -> CreateTaskRequest:
        if self.header.key != self.identity.key:
            raise ValueError(f"header.key {self.header.key!r} is not identity.key "
                             f"{self.identity.key!r}")
        seen: set[str] = set()
        for node in self.nodes:
            if node.node_id in seen:
                raise ValueError(f"nodes: node id {node.node_id!r} is given twice")
            seen.add(node.node_id)
            if node.state != "pending" or node.attempts:
                raise ValueError(f"nodes: node {node.node_id!r} of a new task must be pending "
                                 "with no attempts")
        return self


class CreateTaskResult(_Req):
    created: bool
    header: TaskHeader


class CommitResult(_Req):
    header: TaskHeader
    nodes: dict[str, NodeRecord] = {}
    actions: dict[str, ActionRecord] = {}
    journal: tuple[JournalEntry, ...] = ()
    charged: tuple[str, ...] = ()          # admission ids newly charged by this commit
    already_charged: tuple[str, ...] = ()  # admission ids that were charged before


_RESULT_SET: Final = frozenset(CommitResult.model_fields)


def commit_result(header: TaskHeader, nodes: dict[str, NodeRecord],
                  actions: dict[str, ActionRecord], journal: Iterable[JournalEntry],
                  charged: Iterable[str], already_charged: Iterable[str]) -> CommitResult:
    """``CommitResult(...)`` with every field given, from records the state machine built,
    without validating them again; like the constructor it copies the containers."""
    return trusted(CommitResult, {
        "header": header, "nodes": dict(nodes), "actions": dict(actions),
        "journal": tuple(journal), "charged": tuple(charged),
        "already_charged": tuple(already_charged)}, _RESULT_SET)


class AcquireLeaseRequest(_Req):
    """Take the task's fenced lease.

    ``snapshot=True`` also asks for the task's node and action records as of the grant,
    read in the same atomic step (a run needs them next, so a store saves the caller a
    separate ``get_task`` round trip).

    ``steps``/``blobs``: a first commit applied under the new fence in the same atomic
    write, exactly as :class:`CommitRequest` would apply them (all or nothing: if any step
    is refused, the lease is not taken either). A run that knows the task's state already
    (it just created it) starts its first ready nodes this way: one durable write, not two.
    ``blobs`` without ``steps`` are not written: there is no commit to carry them.
    """

    key: str
    worker_id: str
    ttl_seconds: float = Field(gt=0, le=MAX_TTL_S)
    now: Now
    snapshot: bool = False

    @model_validator(mode="after")
    def _expiry_fits(self) -> AcquireLeaseRequest:
        _check_expiry(self.now, self.ttl_seconds)
        return self

    steps: tuple[Step, ...] = ()
    blobs: dict[str, str] = {}


class LeaseGrant(_Req):
    fence: int
    expires_at: datetime
    header: TaskHeader  # after the grant and, with ``steps``, after the first commit
    # The whole task as of the grant when the request asked for it (header == ``header``).
    snapshot: TaskSnapshot | None = None
    # What the request's ``steps`` changed (None without steps).
    commit: CommitResult | None = None


class RenewLeaseRequest(_Req):
    key: str
    worker_id: str
    fence: int
    ttl_seconds: float = Field(gt=0, le=MAX_TTL_S)
    now: Now

    @model_validator(mode="after")
    def _expiry_fits(self) -> RenewLeaseRequest:
        _check_expiry(self.now, self.ttl_seconds)
        return self


class LeaseStatus(_Req):
    fence: int
    expires_at: datetime
    cancel: CancelRecord | None


class ReleaseLeaseRequest(_Req):
    key: str
    worker_id: str
    fence: int
    now: Now


class CancelTaskRequest(_Req):
    key: str
    reason: str
    now: Now


class CommitRequest(_Req):
    key: str
    worker_id: str
    fence: int
    now: Now
    steps: tuple[Step, ...]
    blobs: dict[str, str] = {}


# The runtime's own hot path (one pure node: a start, a completion, the group commit)
# builds its requests from values it made itself, as the state machine builds its records:
# without validating them again (``tests/test_trusted_requests.py`` pins each builder to the
# validating constructor). ``fields_set`` is what that constructor records for the same call.
_START_SET: Final = frozenset({"node_id", "attempt_id", "input_digest", "admission_id",
                               "charges", "requires_completed"})
_SETTLE_SET: Final = frozenset({"node_id", "state", "output_digest"})
_COMMIT_SET: Final = frozenset(CommitRequest.model_fields)


def start_attempt(node_id: str, attempt_id: str, input_digest: str, admission_id: str,
                  charges: dict[str, int], requires_completed: tuple[str, ...]
                  ) -> StartAttempt:
    """``StartAttempt(node_id=..., ..., requires_completed=...)`` of a charged attempt."""
    return trusted(StartAttempt, {
        "type": "start_attempt", "node_id": node_id, "attempt_id": attempt_id,
        "input_digest": input_digest, "admission_id": admission_id, "charges": dict(charges),
        "requires_completed": requires_completed}, _START_SET)


def node_completed(node_id: str, output_digest: str) -> SettleNode:
    """``SettleNode(node_id=..., state="completed", output_digest=...)``."""
    return trusted(SettleNode, {"type": "settle_node", "node_id": node_id,
                                "state": "completed", "output_digest": output_digest,
                                "error": None}, _SETTLE_SET)


def commit_request(key: str, worker_id: str, fence: int, now: datetime, steps: Iterable[Step],
                   blobs: dict[str, str]) -> CommitRequest:
    """``CommitRequest(...)`` of steps built by the runtime (each validated or built by the
    functions above). ``now`` comes from a clock the host may inject: anything but a
    ``datetime`` goes through the validating constructor, which says what is wrong."""
    if type(now) is not datetime or now.tzinfo is not UTC:
        return CommitRequest(key=key, worker_id=worker_id, fence=fence, now=now,
                             steps=tuple(steps), blobs=blobs)
    return trusted(CommitRequest, {"key": key, "worker_id": worker_id, "fence": fence,
                                   "now": now, "steps": tuple(steps), "blobs": dict(blobs)},
                   _COMMIT_SET)


class ListTasksRequest(_Req):
    status: TaskStatus | None = None
    after: str | None = None
    limit: int = Field(default=100, ge=1, le=1000)


class TimelineRequest(_Req):
    key: str
    after_seq: int = Field(default=0, ge=0)
    limit: int = Field(default=100, ge=1, le=1000)


__all__ = [
    "AcquireLeaseRequest", "AddNodes", "AppendJournal", "CancelTaskRequest", "Charge",
    "ClaimNode", "CommitRequest", "CommitResult", "CommitRevision", "CreateTaskRequest",
    "CreateTaskResult", "LeaseGrant", "LeaseStatus", "ListTasksRequest", "PrepareNode",
    "RecordAction", "ReleaseLeaseRequest", "RenewLeaseRequest", "ReopenNode", "SetStatus",
    "SettleNode",
    "StartAttempt", "Step", "StoreCapabilities", "TimelineRequest",
]
