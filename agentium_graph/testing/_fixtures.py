"""Helpers for store tests: valid requests, a fixed clock, whole-task state captures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from agentium_graph._canonical import admission_id, digest, incarnation_id, task_id
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import (
    COUNTERS,
    ActionRecord,
    ActionState,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    Step,
    TimelineRequest,
)

#: The fixed instant the suite's clocks start at (timezone-aware UTC, with microseconds,
#: so a store that drops either fails the round-trip checks).
T0 = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


class FixedClock:
    """A clock that only moves when told to: ``clock()`` is the current instant."""

    def __init__(self, start: datetime = T0) -> None:
        if start.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware start")
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` and return the new instant."""
        self.now = self.now + timedelta(seconds=seconds)
        return self.now


def node_id(i: int) -> str:
    return f"n{i}"


def node_record(key: str, node: str, *, revision: int = 1, deps: tuple[str, ...] = (),
                binding: str = "conformance_tool", args: Any = None,
                parent: str | None = None) -> NodeRecord:
    """A fresh pending node incarnation with a deterministic incarnation id."""
    return NodeRecord(
        node_id=node,
        incarnation_id=incarnation_id(key, node, revision, binding, "1", digest(args)),
        kind="tool", binding=binding, version="1", revision=revision, parent=parent,
        deps=deps)


def make_identity(key: str, *, nodes: int = 3, input: Any = None,
                  program_version: str = "1", policy_revision: str = "policy-1",
                  grants: tuple[str, ...] | None = None,
                  deadline: datetime | None = None) -> TaskIdentity:
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": node_id(i), "binding": "conformance_tool", "version": "1", "args": {"i": i},
         "dependsOn": [node_id(i - 1)] if i else []} for i in range(nodes)]}
    return TaskIdentity(
        key=key, catalog_digest=digest({"catalog": "conformance"}),
        program={"id": "conformance", "version": program_version}, plan=plan,
        descriptors={"conformance_tool@1": {"kind": "tool", "id": "conformance_tool",
                                            "version": "1"}},
        input=input, input_digest=digest(input), policy_revision=policy_revision,
        grants=grants, budgets={"tool_calls": None}, root_limits={"max_expanded_nodes": 100},
        plan_limits={"max_nodes": 100}, deadline=deadline)


def make_create_request(key: str, *, nodes: int = 3,
                        limits: Mapping[str, int | None] | None = None,
                        deps: Literal["chain", "none"] = "chain", input: Any = None,
                        program_version: str = "1", policy_revision: str = "policy-1",
                        grants: tuple[str, ...] | None = None, now: datetime = T0,
                        deadline: datetime | None = None,
                        blobs: Mapping[str, str] | None = None) -> CreateTaskRequest:
    """A valid :class:`CreateTaskRequest` like the runtime's ``create()`` builds.

    ``nodes`` pending nodes ``n0..n{nodes-1}`` (a chain ``n0 -> n1 -> ...`` unless
    ``deps="none"``); every counter limit is unlimited unless given in ``limits``.
    Requests built with the same arguments have the same identity digest; changing
    ``input``, ``program_version``, ``policy_revision``, ``grants`` or ``deadline``
    changes it.
    """
    identity = make_identity(key, nodes=nodes, input=input, program_version=program_version,
                             policy_revision=policy_revision, grants=grants,
                             deadline=deadline)
    counters = dict.fromkeys(COUNTERS, 0)
    counters["expanded_nodes"] = nodes
    counters["plan_revisions"] = 1
    all_limits: dict[str, int | None] = dict.fromkeys(COUNTERS, None)
    all_limits.update(limits or {})
    header = TaskHeader(
        key=key, task_id=task_id(key), identity_digest=digest(identity.model_dump(mode="json")),
        created_at=now, updated_at=now, counters=counters, limits=all_limits, journal_seq=1,
        deadline=deadline)
    records = tuple(
        node_record(key, node_id(i),
                    deps=(node_id(i - 1),) if deps == "chain" and i else ())
        for i in range(nodes))
    return CreateTaskRequest(header=header, identity=identity, nodes=records,
                             admission_id=admission_id(header.task_id, "create"),
                             blobs=dict(blobs or {}))


def action_record(action_id: str, node: str, state: ActionState = "intent", *,
                  fence: int = 1, admission: str | None = None,
                  origin: Mapping[str, Any] | None = None, request_digest: str | None = None,
                  outcome_digest: str | None = None,
                  outcome_source: str | None = None) -> ActionRecord:
    """A ledger entry for :class:`~agentium_graph.store.RecordAction` steps."""
    return ActionRecord(
        action_id=action_id, node_id=node, state=state,
        admission_id=admission or f"adm-{action_id}",
        origin=dict(origin or {"binding": "conformance_tool", "version": "1"}),
        request_digest=request_digest or digest({"action": action_id}),
        result_ref=action_id, fence=fence, outcome_digest=outcome_digest,
        outcome_source=outcome_source)


async def acquire(store: DurableTaskStore, key: str, worker: str = "w1", *,
                  now: datetime = T0, ttl: float = 30.0) -> int:
    """Acquire the lease and return its fence."""
    grant = await store.acquire_lease(AcquireLeaseRequest(key=key, worker_id=worker,
                                                          ttl_seconds=ttl, now=now))
    return grant.fence


async def commit(store: DurableTaskStore, key: str, worker: str, fence: int, *steps: Step,
                 now: datetime = T0, blobs: Mapping[str, str] | None = None) -> CommitResult:
    """Commit ``steps`` under ``(worker, fence)``."""
    return await store.commit(CommitRequest(key=key, worker_id=worker, fence=fence, now=now,
                                            steps=steps, blobs=dict(blobs or {})))


async def read_timeline(store: DurableTaskStore, key: str, *,
                        page: int = 1000) -> list[JournalEntry]:
    """The whole journal of ``key``, paged with ``after_seq``/``limit``."""
    out: list[JournalEntry] = []
    while True:
        batch = await store.read_timeline(TimelineRequest(
            key=key, after_seq=out[-1].seq if out else 0, limit=page))
        out.extend(batch)
        if len(batch) < page:
            return out


@dataclass(frozen=True)
class TaskState:
    """Everything a store holds about one task: snapshot, identity and whole journal."""

    snapshot: TaskSnapshot | None
    identity: TaskIdentity | None
    timeline: tuple[JournalEntry, ...]


async def capture(store: DurableTaskStore, key: str) -> TaskState:
    """Read a task's whole state, to compare before and after an operation.

    The result holds deep copies of what the store handed out: a store whose reads leak
    its own stored objects cannot make an earlier capture change along with its state.
    """
    snapshot = await store.get_task(key)
    identity = await store.get_identity(key)
    timeline = tuple(await read_timeline(store, key)) if snapshot is not None else ()
    snapshot = None if snapshot is None else snapshot.model_copy(deep=True)
    identity = None if identity is None else identity.model_copy(deep=True)
    timeline = tuple(entry.model_copy(deep=True) for entry in timeline)
    return TaskState(snapshot=snapshot, identity=identity, timeline=timeline)
