"""The one state machine. Every store applies every transition through this module.

A store loads the pieces of a task a commit touches (:func:`needs`), calls
:func:`apply_commit`, and persists the returned :class:`Delta` atomically, conditioned on
nothing else having changed the header in between. Stores never re-implement the rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agentium_graph._canonical import INT64_MAX
from agentium_graph.errors import (
    BudgetExhaustedError,
    InvalidTransitionError,
    LeaseHeldError,
    StaleFenceError,
    TaskConflictError,
)
from agentium_graph.store._records import (
    TERMINAL_TASK,
    ActionRecord,
    CancelRecord,
    JournalEntry,
    LeaseRecord,
    NodeRecord,
    NodeState,
    TaskHeader,
    TaskIdentity,
    identity_digest_of,
    journal_entry,
    new_attempt,
    replace,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    AddNodes,
    AppendJournal,
    CancelTaskRequest,
    Charge,
    ClaimNode,
    CommitRequest,
    CommitResult,
    CommitRevision,
    CreateTaskRequest,
    PrepareNode,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    ReopenNode,
    SetStatus,
    SettleNode,
    StartAttempt,
    Step,
    commit_result,
)

# Allowed node transitions. ``running -> running`` is a new attempt under a newer fence
# (recovery of interrupted work); ``uncertain`` leaves only by host-attested resolution
# (``uncertain -> pending`` when an operator attests the effect never happened).
NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    "pending": frozenset({"claimed", "prepared", "running", "failed", "canceled",
                          "tombstoned", "completed"}),
    "claimed": frozenset({"claimed", "prepared", "running", "failed", "canceled",
                          "completed"}),
    "prepared": frozenset({"prepared", "running", "failed", "canceled", "completed",
                           "uncertain"}),
    "running": frozenset({"running", "completed", "failed", "canceled", "uncertain"}),
    "uncertain": frozenset({"running", "completed", "failed", "canceled", "pending"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
    "tombstoned": frozenset(),
}
TERMINAL_NODE: frozenset[str] = frozenset({"completed", "failed", "canceled", "tombstoned"})

# Allowed action (ledger) transitions.
ACTION_TRANSITIONS: dict[str, frozenset[str]] = {
    "intent": frozenset({"dispatching", "rejected", "confirmed", "uncertain"}),
    "dispatching": frozenset({"dispatching", "confirmed", "uncertain", "rejected"}),
    "uncertain": frozenset({"intent", "dispatching", "confirmed", "rejected"}),
    "confirmed": frozenset(),
    "rejected": frozenset(),
}

# The largest counter value every store can hold (MongoDB's integers are int64): an
# unlimited counter stops here, as the runtime's clamp_usage stops token counts.
MAX_COUNTER = INT64_MAX

# Which counter each limit bounds (limits are pinned in the task header).
COUNTER_LIMITS = ("expanded_nodes", "work_attempts", "plan_revisions", "tool_calls",
                  "model_calls", "input_tokens", "output_tokens")


@dataclass(frozen=True, slots=True)
class Needs:
    """What a store must load before applying a commit."""

    node_ids: frozenset[str]
    action_ids: frozenset[str]
    admission_ids: frozenset[str]


@dataclass(slots=True)
class Delta:
    """What a commit changes; a store persists all of it or nothing."""

    header: TaskHeader
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    actions: dict[str, ActionRecord] = field(default_factory=dict)
    charges: dict[str, dict[str, int]] = field(default_factory=dict)  # new admission ids
    already_charged: list[str] = field(default_factory=list)
    journal: list[JournalEntry] = field(default_factory=list)

    def result(self, header: TaskHeader | None = None) -> CommitResult:
        """What a store returns for this delta; ``header``: the stored post-image when the
        store reads one back (else the delta's own)."""
        return commit_result(header or self.header, self.nodes, self.actions, self.journal,
                             self.charges, self.already_charged)


def needs(steps: Iterable[Step]) -> Needs:
    nodes: set[str] = set()
    actions: set[str] = set()
    admissions: set[str] = set()
    for step in steps:
        # Every node settles and starts: those first. (An isinstance check that misses a
        # pydantic class costs several times one that hits: it goes through ABCMeta.)
        if isinstance(step, SettleNode):
            nodes.add(step.node_id)
        elif isinstance(step, StartAttempt | ClaimNode):
            nodes.add(step.node_id)
            nodes.update(step.requires_completed)
            if isinstance(step, StartAttempt) and step.admission_id:
                admissions.add(step.admission_id)
        elif isinstance(step, PrepareNode | ReopenNode):
            nodes.add(step.node_id)
        elif isinstance(step, AddNodes):
            nodes.update(n.node_id for n in step.nodes)
            admissions.add(step.admission_id)
        elif isinstance(step, CommitRevision):
            nodes.update(n.node_id for n in step.add)
            nodes.update(step.tombstone)
            admissions.add(step.admission_id)
            admissions.add(step.admission_id + ":rev")
        elif isinstance(step, Charge):
            admissions.add(step.admission_id)
        elif isinstance(step, RecordAction):
            actions.add(step.action.action_id)
            nodes.add(step.action.node_id)
            admissions.add(step.action.admission_id)
    return Needs(frozenset(nodes), frozenset(actions), frozenset(admissions))


def check_fence(header: TaskHeader, worker_id: str, fence: int) -> None:
    """Raise StaleFenceError unless ``(worker_id, fence)`` holds the current lease."""
    lease = header.lease
    if fence != header.fence or lease is None or lease.owner != worker_id or \
            lease.fence != fence:
        raise StaleFenceError(header.key, fence, header.fence)


class _Apply:
    def __init__(self, header: TaskHeader, nodes: dict[str, NodeRecord],
                 actions: dict[str, ActionRecord], charged: AbstractSet[str],
                 request: CommitRequest) -> None:
        self.header = header
        self.nodes = nodes
        self.actions = actions
        self.charged = charged
        self.req = request
        # Read once: every field read of a pydantic model costs several times a plain one.
        self.now = request.now
        self.fence = request.fence
        self.journal_seq = header.journal_seq
        self.counters = dict(header.counters)
        self.status = header.status
        self.error = header.error
        self.revision = header.revision
        self.plan_digest = header.plan_digest
        self.lease: LeaseRecord | None = header.lease
        self.changed_nodes: dict[str, NodeRecord] = {}
        self.changed_actions: dict[str, ActionRecord] = {}
        self.new_charges: dict[str, dict[str, int]] = {}
        self.already: list[str] = []
        self.journal: list[JournalEntry] = []

    # helpers ------------------------------------------------------------------------
    def node(self, node_id: str) -> NodeRecord:
        rec = self.changed_nodes.get(node_id) or self.nodes.get(node_id)
        if rec is None:
            raise InvalidTransitionError(
                f"task {self.header.key!r} has no node {node_id!r}", node_id=node_id)
        return rec

    def put(self, rec: NodeRecord) -> None:
        self.changed_nodes[rec.node_id] = rec

    def log(self, kind: str, node_id: str | None = None, **data: object) -> None:
        # ``data`` is this call's own dict (keyword arguments): the entry can keep it.
        # (entry()'s body: log runs three times per node.)
        self.journal.append(journal_entry(
            self.journal_seq + len(self.journal) + 1, self.now, kind, node_id, self.fence,
            data))

    def entry(self, kind: str, node_id: str | None, data: dict[str, object]) -> None:
        """Append an entry holding ``data`` itself (pass a dict nothing else holds)."""
        self.journal.append(journal_entry(
            self.journal_seq + len(self.journal) + 1, self.now, kind, node_id, self.fence,
            data))

    def move(self, rec: NodeRecord, to: NodeState) -> None:
        if to not in NODE_TRANSITIONS[rec.state]:
            raise InvalidTransitionError(
                f"node {rec.node_id!r} of task {self.header.key!r} cannot go from "
                f"{rec.state!r} to {to!r}", node_id=rec.node_id,
                details={"from": rec.state, "to": to})

    def charge(self, admission_id: str, amounts: dict[str, int],
               node_id: str | None) -> bool:
        """Charge once per admission id; False when it was charged before."""
        if admission_id in self.charged or admission_id in self.new_charges:
            self.already.append(admission_id)
            return False
        limits = self.header.limits
        counters = self.counters
        ordered = sorted(amounts.items())
        for name, amount in ordered:
            if amount < 0:
                raise InvalidTransitionError(f"charge {name}={amount} is negative; counters "
                                             "are never refunded")
            limit = limits.get(name)
            used = counters.get(name, 0)
            if limit is None or limit > MAX_COUNTER:
                limit = MAX_COUNTER  # a counter stops where every store can hold it
            if used + amount > limit:
                raise BudgetExhaustedError(self.header.key, name, used, amount, limit,
                                           node_id=node_id)
        for name, amount in amounts.items():
            counters[name] = counters.get(name, 0) + amount
        self.new_charges[admission_id] = dict(amounts)
        self.log("admission_charged", node_id, admission_id=admission_id,
                 charges=dict(ordered))
        return True

    def require_completed(self, node_id: str, deps: Iterable[str]) -> None:
        changed, nodes = self.changed_nodes, self.nodes  # node()'s lookup, inlined: per start
        for dep in deps:
            rec = changed.get(dep) or nodes.get(dep)
            if rec is None or rec.state != "completed":
                state = self.node(dep).state  # raises for a node the task does not have
                raise InvalidTransitionError(
                    f"node {node_id!r} cannot start: dependency {dep!r} is {state!r}, not "
                    "completed", node_id=node_id)

    # steps --------------------------------------------------------------------------
    def add_nodes(self, new: Iterable[NodeRecord], admission_id: str, *,
                  replace_tombstoned: bool = False) -> None:
        """``replace_tombstoned`` (plan revisions only): a new incarnation may take the id of
        a tombstoned node; the journal's node_tombstoned entry keeps the one it replaced."""
        fresh = []
        for rec in new:
            existing = self.changed_nodes.get(rec.node_id) or self.nodes.get(rec.node_id)
            if existing is not None and not (replace_tombstoned and
                                             existing.state == "tombstoned" and
                                             existing.incarnation_id != rec.incarnation_id):
                if existing.incarnation_id != rec.incarnation_id:
                    raise InvalidTransitionError(
                        f"node {rec.node_id!r} already exists as another incarnation",
                        node_id=rec.node_id)
                continue  # idempotent re-materialization
            fresh.append(rec)
        if fresh:
            # Named after the container that grows (the one parent of a nested scope).
            parents = {rec.parent for rec in fresh}
            self.charge(admission_id, {"expanded_nodes": len(fresh)},
                        parents.pop() if len(parents) == 1 else None)
        for rec in fresh:
            self.put(replace(rec, state="pending", updated_at=self.now))
            self.log("node_added", rec.node_id, incarnation_id=rec.incarnation_id,
                     binding=rec.binding, version=rec.version, parent=rec.parent)

    def step(self, step: Step) -> None:
        now = self.now
        if isinstance(step, StartAttempt):
            # node() and move(), inlined for the two steps every node takes.
            rec = self.changed_nodes.get(step.node_id) or self.nodes.get(step.node_id) or \
                self.node(step.node_id)
            if "running" not in NODE_TRANSITIONS[rec.state]:
                self.move(rec, "running")
            self.require_completed(step.node_id, step.requires_completed)
            attempts = list(rec.attempts)
            if attempts and attempts[-1].ended_at is None:
                last = attempts[-1]
                if last.fence >= self.fence:
                    raise InvalidTransitionError(
                        f"node {rec.node_id!r} attempt {last.number} already runs under fence "
                        f"{last.fence}; a new attempt needs a newer fence", node_id=rec.node_id)
                attempts[-1] = replace(last, ended_at=now, outcome="interrupted")
                self.log("attempt_interrupted", rec.node_id, attempt=last.number,
                         attempt_fence=last.fence)
            if attempts and any(a.attempt_id == step.attempt_id for a in attempts):
                raise InvalidTransitionError(
                    f"attempt {step.attempt_id} of node {rec.node_id!r} already exists",
                    node_id=rec.node_id)
            if step.admission_id and step.charges:
                self.charge(step.admission_id, step.charges, rec.node_id)
            number = len(attempts) + 1
            attempts.append(new_attempt(number, step.attempt_id, self.fence,
                                        self.req.worker_id, now, step.admission_id,
                                        step.input_digest))
            self.put(replace(rec, state="running", attempts=tuple(attempts), updated_at=now,
                             input_digest=step.input_digest or rec.input_digest))
            self.log("attempt_started", rec.node_id, attempt=number,
                     attempt_id=step.attempt_id, input_digest=step.input_digest)
        elif isinstance(step, SettleNode):
            rec = self.changed_nodes.get(step.node_id) or self.nodes.get(step.node_id) or \
                self.node(step.node_id)
            if step.state not in NODE_TRANSITIONS[rec.state]:
                self.move(rec, step.state)
            if step.state == "completed" and step.output_digest is None:
                raise InvalidTransitionError(
                    f"completing node {rec.node_id!r} needs an output digest",
                    node_id=rec.node_id)
            attempts = list(rec.attempts)
            if attempts and attempts[-1].ended_at is None:
                attempts[-1] = replace(attempts[-1], ended_at=now, outcome=step.state)
            self.put(replace(rec, state=step.state, attempts=tuple(attempts), updated_at=now,
                             output_digest=step.output_digest, error=step.error))
            data: dict[str, object] = {"state": step.state}
            if step.output_digest:
                data["output_digest"] = step.output_digest
            if step.error:
                data["error"] = step.error.model_dump(mode="json")
            self.log(f"node_{step.state}", rec.node_id, **data)
        elif isinstance(step, ClaimNode):
            rec = self.node(step.node_id)
            self.move(rec, "claimed")
            self.require_completed(step.node_id, step.requires_completed)
            if rec.state != "claimed":
                self.put(replace(rec, state="claimed", updated_at=now))
                self.log("node_claimed", rec.node_id)
        elif isinstance(step, PrepareNode):
            rec = self.node(step.node_id)
            self.move(rec, "prepared")
            if rec.state == "prepared" and rec.input_digest not in (None, step.input_digest):
                raise InvalidTransitionError(
                    f"node {rec.node_id!r} was prepared with other input", node_id=rec.node_id)
            self.put(replace(rec, state="prepared", updated_at=now,
                             input_digest=step.input_digest))
            self.log("node_prepared", rec.node_id, input_digest=step.input_digest)
        elif isinstance(step, Charge):
            self.charge(step.admission_id, step.charges, step.node_id)
        elif isinstance(step, ReopenNode):
            rec = self.node(step.node_id)
            if rec.state != "uncertain":
                raise InvalidTransitionError(
                    f"node {rec.node_id!r} is {rec.state}; only an uncertain node can be "
                    "reopened", node_id=rec.node_id)
            self.put(replace(rec, state="pending", updated_at=now, error=None))
            self.log("node_reopened", rec.node_id, reason=step.reason)
        elif isinstance(step, AddNodes):
            self.add_nodes(step.nodes, step.admission_id)
        elif isinstance(step, CommitRevision):
            self.commit_revision(step)
        elif isinstance(step, RecordAction):
            self.record_action(step.action)
        elif isinstance(step, SetStatus):
            if self.status in TERMINAL_TASK and step.status != self.status:
                raise InvalidTransitionError(
                    f"task {self.header.key!r} is {self.status}; it cannot become "
                    f"{step.status}")
            self.status = step.status
            self.error = step.error
            if step.release_lease:
                self.lease = None
            self.log("task_" + step.status, None,
                     **({"error": step.error.model_dump(mode="json")} if step.error else {}))
        elif isinstance(step, AppendJournal):
            # The caller's data as a dict of its own: any key, even "kind" or "node_id".
            self.entry(step.kind, step.node_id, dict(step.data))
        else:  # pragma: no cover - the Step union is closed
            raise InvalidTransitionError(f"unknown step {type(step).__name__}")

    def commit_revision(self, step: CommitRevision) -> None:
        if step.revision == self.revision and step.base_revision == self.revision - 1:
            if self.is_retransmission(step):
                return  # identical retransmission of the revision just committed
            raise InvalidTransitionError(
                f"revision {step.revision} is already committed with other content; a new "
                f"proposal must build on revision {self.revision}")
        if step.base_revision != self.revision or step.revision != self.revision + 1:
            raise InvalidTransitionError(
                f"revision {step.revision} must build on the current revision "
                f"{self.revision} (got base {step.base_revision})")
        self.charge(step.admission_id + ":rev", {"plan_revisions": 1}, None)
        for node_id in step.tombstone:
            rec = self.node(node_id)
            if rec.state != "pending" or rec.attempts:
                state = rec.state if rec.state != "pending" else "pending with attempts"
                raise InvalidTransitionError(
                    f"node {node_id!r} is {state}; only unclaimed pending nodes that never "
                    "ran may be replaced or removed", node_id=node_id)
            self.put(replace(rec, state="tombstoned", updated_at=self.now))
            self.log("node_tombstoned", node_id, revision=step.revision,
                     incarnation_id=rec.incarnation_id)
        self.add_nodes(step.add, step.admission_id, replace_tombstoned=True)
        self.revision = step.revision
        self.plan_digest = step.plan_digest
        self.log("revision_committed", None, revision=step.revision,
                 plan_digest=step.plan_digest)

    def is_retransmission(self, step: CommitRevision) -> bool:
        """Whether ``step`` is the revision just committed: same admission, same delta."""
        rev_admission = step.admission_id + ":rev"
        if rev_admission not in self.charged and rev_admission not in self.new_charges:
            return False
        if self.plan_digest is not None and step.plan_digest != self.plan_digest:
            return False  # the same delta, but another plan
        for rec in step.add:
            existing = self.changed_nodes.get(rec.node_id) or self.nodes.get(rec.node_id)
            if existing is None or existing.incarnation_id != rec.incarnation_id:
                return False
        replaced = {rec.node_id for rec in step.add}
        for node_id in step.tombstone:
            existing = self.changed_nodes.get(node_id) or self.nodes.get(node_id)
            if node_id not in replaced and (existing is None or existing.state != "tombstoned"):
                return False  # (a replaced node was checked above as its new incarnation)
        return True

    def record_action(self, action: ActionRecord) -> None:
        existing = self.changed_actions.get(action.action_id) or \
            self.actions.get(action.action_id)
        if existing is None:
            if action.state not in ("intent", "rejected"):
                raise InvalidTransitionError(
                    f"action {action.action_id} must start as an intent", node_id=action.node_id)
        else:
            if replace(action, updated_at=existing.updated_at) == existing:
                return  # an identical retransmission (the store stamps updated_at)
            if action.state not in ACTION_TRANSITIONS[existing.state]:
                raise InvalidTransitionError(
                    f"action {action.action_id} cannot go from {existing.state!r} to "
                    f"{action.state!r}", node_id=action.node_id,
                    details={"from": existing.state, "to": action.state})
            if (existing.request_digest, existing.origin) != (action.request_digest,
                                                              action.origin):
                raise InvalidTransitionError(
                    f"action {action.action_id}: request and origin evidence are append-only",
                    node_id=action.node_id)
        self.changed_actions[action.action_id] = replace(action, updated_at=self.now)
        self.log("action_" + action.state, action.node_id, action_id=action.action_id,
                 **({"outcome_digest": action.outcome_digest} if action.outcome_digest else {}),
                 **({"source": action.outcome_source} if action.outcome_source else {}))

    def finish(self) -> Delta:
        header = replace(
            self.header, seq=self.header.seq + 1,
            journal_seq=self.journal_seq + len(self.journal),
            counters=self.counters, status=self.status, error=self.error,
            revision=self.revision, plan_digest=self.plan_digest, lease=self.lease,
            updated_at=self.now)
        return Delta(header=header, nodes=self.changed_nodes, actions=self.changed_actions,
                     charges=self.new_charges, already_charged=self.already,
                     journal=self.journal)


def apply_commit(header: TaskHeader, nodes: dict[str, NodeRecord],
                 actions: dict[str, ActionRecord], charged: AbstractSet[str],
                 request: CommitRequest) -> Delta:
    """Validate and apply every step of ``request`` in order; all or nothing.

    ``nodes``/``actions``/``charged`` must hold at least what :func:`needs` names (a store
    that holds a whole task in memory may pass all of it: they are only read).
    Raises StaleFenceError, InvalidTransitionError or BudgetExhaustedError and changes
    nothing on failure.
    """
    check_fence(header, request.worker_id, request.fence)
    if header.status in TERMINAL_TASK and not all(
            isinstance(s, AppendJournal) for s in request.steps):
        raise InvalidTransitionError(
            f"task {header.key!r} is {header.status}; it accepts no more transitions")
    work = _Apply(header, nodes, actions, charged, request)
    for step in request.steps:
        work.step(step)
    if work.status == "pending" and not any(isinstance(s, SetStatus) for s in request.steps):
        work.status = "running"
    return work.finish()


# --- lease and cancel transitions --------------------------------------------------------

def acquire_lease(header: TaskHeader,
                  req: AcquireLeaseRequest) -> tuple[TaskHeader, JournalEntry]:
    """Grant a fenced lease: always a new, higher fence.

    The same worker re-acquires at once (a restarted worker); another worker must wait
    until the current lease expires. Terminal tasks cannot be leased.
    """
    if header.status in TERMINAL_TASK:
        raise InvalidTransitionError(
            f"task {header.key!r} is {header.status}; there is nothing to run")
    lease = header.lease
    if lease is not None and lease.owner != req.worker_id and lease.expires_at > req.now:
        raise LeaseHeldError(header.key, lease.owner, lease.expires_at)
    fence = header.fence + 1
    expires = lease_expiry(req)
    data: dict[str, object] = {"worker_id": req.worker_id}
    if lease is not None:
        data["previous_owner"] = lease.owner
        data["previous_fence"] = lease.fence
    entry = JournalEntry(seq=header.journal_seq + 1, at=req.now, kind="lease_acquired",
                         fence=fence, data=data)
    return replace(header, fence=fence, seq=header.seq + 1, updated_at=req.now,
                   journal_seq=header.journal_seq + 1,
                   lease=LeaseRecord(owner=req.worker_id, fence=fence, acquired_at=req.now,
                                     expires_at=expires)), entry


def acquire_with_steps(header: TaskHeader, nodes: dict[str, NodeRecord],
                       actions: dict[str, ActionRecord], charged: AbstractSet[str],
                       req: AcquireLeaseRequest) -> tuple[TaskHeader, list[JournalEntry],
                                                          Delta | None]:
    """:func:`acquire_lease`, then the request's ``steps`` (if any) under the new fence.

    Returns the final header, every journal entry to append (the grant's first), and the
    steps' :class:`Delta`. Steps are refused while the task has a cancel request.
    ``nodes``/``actions``/``charged`` must hold what ``needs(req.steps)`` names. Raises like
    either function and changes nothing then.
    """
    leased, entry = acquire_lease(header, req)
    if not req.steps:
        return leased, [entry], None
    if header.cancel is not None:
        # The steps were computed without seeing the request (it touches only its own
        # field): refuse them whole; the caller reads the task and applies the cancel.
        raise InvalidTransitionError(
            f"task {header.key!r} has a cancel request ({header.cancel.reason}); a first "
            "commit riding on the lease is refused: take the lease, then apply the cancel")
    delta = apply_commit(leased, nodes, actions, charged, CommitRequest(
        key=req.key, worker_id=req.worker_id, fence=leased.fence, now=req.now,
        steps=req.steps, blobs=req.blobs))
    return delta.header, [entry, *delta.journal], delta


def lease_expiry(req: AcquireLeaseRequest) -> datetime:
    """When the lease granted for ``req`` expires (its steps may already have released it,
    e.g. a first turn that finds the deadline passed and ends the task)."""
    return _plus(req.now, req.ttl_seconds)


def renew_lease(header: TaskHeader, req: RenewLeaseRequest) -> TaskHeader:
    check_fence(header, req.worker_id, req.fence)
    assert header.lease is not None
    return replace(header, lease=replace(header.lease,
                                         expires_at=_plus(req.now, req.ttl_seconds)))


def release_lease(header: TaskHeader, req: ReleaseLeaseRequest) -> TaskHeader:
    check_fence(header, req.worker_id, req.fence)
    return replace(header, lease=None, seq=header.seq + 1, updated_at=req.now)


def request_cancel(header: TaskHeader, req: CancelTaskRequest) -> TaskHeader | None:
    """The header with a cancel request recorded, or None when nothing changes.

    The first reason wins; cancel of a terminal task changes nothing.
    """
    if header.cancel is not None or header.status in TERMINAL_TASK:
        return None
    return replace(header, cancel=CancelRecord(reason=req.reason, requested_at=req.now))


def _plus(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


# --- creation ------------------------------------------------------------------------------

def creation_entry(request: CreateTaskRequest) -> JournalEntry:
    """Validate a create request's invariants and return its first journal entry."""
    header = request.header
    if header.seq != 0 or header.fence != 0 or header.lease is not None or \
            header.journal_seq != 1 or header.status != "pending":
        raise InvalidTransitionError(
            f"create of {header.key!r}: a new task starts pending with seq 0, fence 0, no "
            "lease and journal_seq 1")
    if identity_digest_of(request.identity) != header.identity_digest:
        raise InvalidTransitionError(
            f"create of {header.key!r}: identity_digest does not match the identity")
    return JournalEntry(seq=1, at=header.created_at, kind="task_created",
                        data={"nodes": len(request.nodes),
                              "identity_digest": header.identity_digest})


def identity_conflict(existing: TaskIdentity, new: TaskIdentity) -> None:
    """Raise TaskConflictError naming every field where ``new`` differs from ``existing``."""
    old = existing.model_dump(mode="json")
    fresh = new.model_dump(mode="json")
    differing = sorted(k for k in set(old) | set(fresh) if old.get(k) != fresh.get(k))
    raise TaskConflictError(existing.key, differing)
