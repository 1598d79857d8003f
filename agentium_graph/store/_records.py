"""Persisted records. Every record is a frozen pydantic model that round-trips through JSON.

A task is stored as one small **header** (identity digest, status, lease, fence, cancel
request, counters, limits, sequence numbers), one **node record** per node incarnation,
one **action record** per ledger entry, the set of charged **admission ids**, the
append-only **journal**, and content-addressed **blobs** (outputs, plans, identity).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from agentium_graph._canonical import record_digest
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

    @property
    def budget_stopped(self) -> bool:
        """Whether a budget stopped the task's last run: it is pending again, but a run
        stops at the same pinned budget again (so nothing but a cancel ends it)."""
        error = self.error
        return self.status == "pending" and error is not None and \
            error.code == "budget_exhausted"


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


# A task's identity is hashed where it is built (create) and again where it is checked
# (every store's create, an inspect): several kilobytes of canonical JSON each time, a
# tenth of a small task's create. The digest is kept per identity object for as long as
# the object lives (records are frozen; what they hold is JSON the runtime never mutates).
_IDENTITY_DIGESTS: dict[int, tuple[weakref.ref[TaskIdentity], str]] = {}



# Fields every store writes with each record, which parsing would otherwise fill in with a
# default: a header without ``status`` read as pending (a completed task ran again), one
# without ``fence`` as 0 (a used fence granted again), a node without ``state`` as pending
# (a completed node ran again), a counter removed as 0 (a budget counting from zero).
# Written since the first release, so a stored record lacking one is damage, never an
# older format.
_PERSISTED: dict[type[BaseModel], frozenset[str]] = {
    TaskHeader: frozenset({"status", "seq", "fence", "lease", "cancel", "deadline", "revision",
                           "journal_seq", "error"}),
    NodeRecord: frozenset({"parent", "deps", "state", "attempts", "input_digest",
                           "output_digest", "error"}),
    ActionRecord: frozenset({"dispatches", "outcome_digest", "outcome_source",
                             "result_ref_returned", "reason", "resolution", "updated_at"}),
    AttemptRecord: frozenset({"admission_id", "input_digest", "ended_at", "outcome"}),
}


def missing_persisted(rec: BaseModel) -> str | None:
    """The first field (or ``counters.<name>``) that ``rec``, parsed from a store, lacks
    though every store writes it; None when nothing is missing. (A limit left out is no
    limit, as at create: ``limits`` may name only some counters.)"""
    fields = _PERSISTED.get(type(rec))
    if fields is None:
        return None
    gone = fields - rec.model_fields_set
    if gone:
        return min(gone)
    if isinstance(rec, NodeRecord):
        for i, attempt in enumerate(rec.attempts):
            inner = missing_persisted(attempt)
            if inner is not None:
                return f"attempts[{i}].{inner}"
    if isinstance(rec, TaskHeader):
        counters = rec.counters
        for name in COUNTERS:
            if name not in counters:
                return f"counters.{name}"
    return None


def identity_digest_of(identity: TaskIdentity) -> str:
    """``record_digest`` of ``identity``'s JSON-mode dump: the task's identity digest."""
    key = id(identity)
    kept = _IDENTITY_DIGESTS.get(key)
    if kept is not None and kept[0]() is identity:
        return kept[1]
    value = record_digest(identity.model_dump(mode="json"))
    _IDENTITY_DIGESTS[key] = (weakref.ref(identity, lambda _: _forget(key)), value)
    return value


def _forget(key: int) -> None:
    _IDENTITY_DIGESTS.pop(key, None)


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


def record_json(record: BaseModel) -> str:
    """``record.model_dump_json()``: the same serializer, called directly. The method passes
    its sixteen keyword arguments on every call, which costs as much again as serializing
    one of these small records; stores write several per commit."""
    return record.__pydantic_serializer__.to_json(record).decode()


_NO_PLAN_DIGEST: Final[set[str]] = {"plan_digest"}


def stored_header_json(header: TaskHeader) -> str:
    """The JSON a store writes for ``header``. ``plan_digest`` is left out while it is None
    (static plans), so versions that predate the field can still read those headers."""
    return header.__pydantic_serializer__.to_json(
        header, exclude=_NO_PLAN_DIGEST if header.plan_digest is None else None).decode()


# --- trusted construction ------------------------------------------------------------------
# The state machine builds a few records per commit (an attempt, three journal entries,
# copies of node records and the header) from values that already have their declared
# types: fields of validated requests and stored records, and ints and datetimes it computed
# itself. Pydantic's constructor validates them all again, and ``model_copy`` goes through a
# generic ``__copy__``; either costs several microseconds per record. The functions below set
# an instance's state directly, exactly as ``model_copy`` leaves it, for the record classes
# that have nothing else to set up (no validators, private attributes or extra fields: pinned
# with the pydantic internals this relies on by ``tests/test_trusted_records.py``).

R = TypeVar("R", bound=BaseModel)

_new: Final = object.__new__
# BaseModel's instance slots; assigning them is what ``BaseModel.__copy__`` does.
_set_dict: Final[Callable[[object, dict[str, Any]], None]] = \
    BaseModel.__dict__["__dict__"].__set__
_set_fields_set: Final[Callable[[object, set[str]], None]] = \
    BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra: Final[Callable[[object, None], None]] = \
    BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private: Final[Callable[[object, None], None]] = \
    BaseModel.__dict__["__pydantic_private__"].__set__


def trusted(cls: type[R], values: dict[str, Any], fields_set: Collection[str]) -> R:
    """An instance of ``cls`` holding ``values`` as they are, without validation.

    ``values`` must name every field of ``cls`` in declaration order (defaults included) with
    a value of its declared type; ``fields_set`` is what the validating constructor would
    record as explicitly set. Used only by constructor functions that a test compares with
    the validating constructor (:func:`journal_entry`, :func:`new_attempt` and the builders
    in ``_requests``), for classes with nothing else to set up."""
    model = _new(cls)
    _set_dict(model, values)
    _set_fields_set(model, set(fields_set))
    _set_extra(model, None)
    _set_private(model, None)
    return model


def replace(rec: R, /, **update: Any) -> R:
    """``rec.model_copy(update=update)``, made directly for the classes in :data:`TRUSTED`.

    Like ``model_copy`` it validates nothing and shares nested values with ``rec``."""
    cls = type(rec)
    if cls not in TRUSTED:
        return rec.model_copy(update=update)
    # trusted()'s body, inlined: replace() runs several times per commit, and the call
    # plus a second fields-set copy cost about 1 % of a pure node (callgrind).
    model = _new(cls)
    _set_dict(model, {**rec.__dict__, **update})
    _set_fields_set(model, rec.__pydantic_fields_set__.union(update))
    _set_extra(model, None)
    _set_private(model, None)
    return model


_JOURNAL_SET: Final = frozenset(JournalEntry.model_fields)


def journal_entry(seq: int, at: datetime, kind: str, node_id: str | None, fence: int | None,
                  data: dict[str, Any]) -> JournalEntry:
    """``JournalEntry(seq=..., ..., data=data)`` without validation; ``data`` becomes the
    entry's own (the constructor would copy it: pass a dict nothing else holds)."""
    # trusted()'s body, inlined: three entries are built per node.
    model = _new(JournalEntry)
    _set_dict(model, {"seq": seq, "at": at, "kind": kind, "node_id": node_id,
                      "fence": fence, "data": data})
    _set_fields_set(model, set(_JOURNAL_SET))
    _set_extra(model, None)
    _set_private(model, None)
    return model


_ATTEMPT_SET: Final = frozenset(AttemptRecord.model_fields) - {"ended_at", "outcome"}


def new_attempt(number: int, attempt_id: str, fence: int, worker_id: str,
                started_at: datetime, admission_id: str | None,
                input_digest: str | None) -> AttemptRecord:
    """``AttemptRecord(...)`` of a just started attempt (not ended), without validation."""
    return trusted(AttemptRecord, {
        "number": number, "attempt_id": attempt_id, "fence": fence, "worker_id": worker_id,
        "started_at": started_at, "admission_id": admission_id,
        "input_digest": input_digest, "ended_at": None, "outcome": None}, _ATTEMPT_SET)


_NEW_NODE_SET: Final = frozenset({"node_id", "incarnation_id", "kind", "binding", "version",
                                  "revision", "parent", "deps"})


def new_node(node_id: str, incarnation_id: str, kind: str, binding: str, version: str,
             revision: int, parent: str | None, deps: tuple[str, ...]) -> NodeRecord:
    """``NodeRecord(node_id=..., ..., deps=...)`` of a node not yet materialized (pending,
    no attempts), without validation: ``create`` and every nested scope build one per node
    from a compiled plan's values."""
    return trusted(NodeRecord, {
        "node_id": node_id, "incarnation_id": incarnation_id, "kind": kind,
        "binding": binding, "version": version, "revision": revision, "parent": parent,
        "deps": deps, "state": "pending", "attempts": (), "input_digest": None,
        "output_digest": None, "error": None, "updated_at": None}, _NEW_NODE_SET)


# Exactly these classes (not subclasses) take the fast paths above.
TRUSTED: Final[frozenset[type[BaseModel]]] = frozenset({
    LeaseRecord, CancelRecord, AttemptRecord, NodeRecord, ActionRecord, TaskHeader,
    JournalEntry})
