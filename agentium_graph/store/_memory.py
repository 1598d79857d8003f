"""The in-memory store: the reference implementation and test fixture (not durable).

Records are kept as JSON text and parsed on every read, so it behaves like a database:
callers always get fresh copies and can never mutate stored state in place. Each
operation runs without awaiting between its read and its write, which makes it atomic
under any number of concurrent asyncio callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from agentium_graph.errors import TaskNotFoundError
from agentium_graph.store._records import (
    ActionRecord,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    StoreCapabilities,
    TimelineRequest,
)
from agentium_graph.store._transitions import (
    Delta,
    Needs,
    acquire_with_steps,
    apply_commit,
    creation_entry,
    identity_conflict,
    lease_expiry,
    needs,
    release_lease,
    renew_lease,
    request_cancel,
)


@dataclass
class _Row:
    header: str
    identity: str
    nodes: dict[str, str] = field(default_factory=dict)
    actions: dict[str, str] = field(default_factory=dict)
    admissions: dict[str, str] = field(default_factory=dict)
    journal: list[str] = field(default_factory=list)


class InMemoryDurableTaskStore:
    """A process-local store. ``capabilities.durable`` is False: it cannot survive a crash."""

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._blobs: dict[str, str] = {}
        self._capabilities = StoreCapabilities(durable=False, multi_process=False,
                                               name="memory")

    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    def _row(self, key: str) -> _Row:
        row = self._rows.get(key)
        if row is None:
            raise TaskNotFoundError(key)
        return row

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        await asyncio.sleep(0)
        key = request.header.key
        row = self._rows.get(key)
        if row is not None:
            existing = TaskHeader.model_validate_json(row.header)
            if existing.identity_digest != request.header.identity_digest:
                identity_conflict(TaskIdentity.model_validate_json(row.identity),
                                  request.identity)
            return CreateTaskResult(created=False, header=existing)
        entry = creation_entry(request)
        for digest_, text in request.blobs.items():
            self._blobs.setdefault(digest_, text)
        row = _Row(header=request.header.model_dump_json(),
                   identity=request.identity.model_dump_json())
        for node in request.nodes:
            row.nodes[node.node_id] = node.model_dump_json()
        row.admissions[request.admission_id] = "{}"
        row.journal.append(entry.model_dump_json())
        self._rows[key] = row
        return CreateTaskResult(created=True, header=TaskHeader.model_validate_json(row.header))

    async def get_header(self, key: str) -> TaskHeader | None:
        await asyncio.sleep(0)
        row = self._rows.get(key)
        return None if row is None else TaskHeader.model_validate_json(row.header)

    async def get_task(self, key: str) -> TaskSnapshot | None:
        await asyncio.sleep(0)
        row = self._rows.get(key)
        return None if row is None else self._snapshot(row)

    @staticmethod
    def _snapshot(row: _Row) -> TaskSnapshot:
        return TaskSnapshot(
            header=TaskHeader.model_validate_json(row.header),
            nodes={k: NodeRecord.model_validate_json(v) for k, v in row.nodes.items()},
            actions={k: ActionRecord.model_validate_json(v) for k, v in row.actions.items()})

    async def get_identity(self, key: str) -> TaskIdentity | None:
        await asyncio.sleep(0)
        row = self._rows.get(key)
        return None if row is None else TaskIdentity.model_validate_json(row.identity)

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        await asyncio.sleep(0)
        out: list[TaskHeader] = []
        for key in sorted(self._rows):
            if request.after is not None and key <= request.after:
                continue
            header = TaskHeader.model_validate_json(self._rows[key].header)
            if request.status is None or header.status == request.status:
                out.append(header)
                if len(out) >= request.limit:
                    break
        return out

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        await asyncio.sleep(0)
        row = self._row(request.key)
        nodes, actions, charged = self._loaded(row, needs(request.steps))
        header, journal, delta = acquire_with_steps(
            TaskHeader.model_validate_json(row.header), nodes, actions, charged, request)
        self._persist(row, header, journal, delta, request.blobs)
        snapshot = self._snapshot(row) if request.snapshot else None
        return LeaseGrant(fence=header.fence, expires_at=lease_expiry(request), header=header,
                          snapshot=snapshot, commit=None if delta is None else delta.result())

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        await asyncio.sleep(0)
        row = self._row(request.key)
        header = renew_lease(TaskHeader.model_validate_json(row.header), request)
        row.header = header.model_dump_json()
        assert header.lease is not None
        return LeaseStatus(fence=header.fence, expires_at=header.lease.expires_at,
                           cancel=header.cancel)

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        await asyncio.sleep(0)
        row = self._row(request.key)
        header = release_lease(TaskHeader.model_validate_json(row.header), request)
        row.header = header.model_dump_json()
        return header

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        await asyncio.sleep(0)
        row = self._row(request.key)
        current = TaskHeader.model_validate_json(row.header)
        header = request_cancel(current, request)
        if header is None:
            return current
        row.header = header.model_dump_json()
        return header

    async def commit(self, request: CommitRequest) -> CommitResult:
        await asyncio.sleep(0)
        row = self._row(request.key)
        nodes, actions, charged = self._loaded(row, needs(request.steps))
        delta = apply_commit(TaskHeader.model_validate_json(row.header), nodes, actions,
                             charged, request)
        self._persist(row, delta.header, delta.journal, delta, request.blobs)
        return delta.result()

    @staticmethod
    def _loaded(row: _Row, need: Needs) -> tuple[dict[str, NodeRecord],
                                                 dict[str, ActionRecord], set[str]]:
        nodes = {i: NodeRecord.model_validate_json(row.nodes[i])
                 for i in need.node_ids if i in row.nodes}
        actions = {i: ActionRecord.model_validate_json(row.actions[i])
                   for i in need.action_ids if i in row.actions}
        return nodes, actions, {i for i in need.admission_ids if i in row.admissions}

    def _persist(self, row: _Row, header: TaskHeader, journal: list[JournalEntry],
                 delta: Delta | None, blobs: dict[str, str]) -> None:
        # Callers never await between loading and this write: atomic for asyncio callers.
        for digest_, text in blobs.items():
            self._blobs.setdefault(digest_, text)
        if delta is not None:
            for node_id, node in delta.nodes.items():
                row.nodes[node_id] = node.model_dump_json()
            for action_id, action in delta.actions.items():
                row.actions[action_id] = action.model_dump_json()
            for admission, amounts in delta.charges.items():
                row.admissions[admission] = str(amounts)
        row.journal.extend(e.model_dump_json() for e in journal)
        row.header = header.model_dump_json()

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        await asyncio.sleep(0)
        return {d: self._blobs[d] for d in digests if d in self._blobs}

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        await asyncio.sleep(0)
        row = self._row(request.key)
        # Journal seq n is at index n-1; entries are appended in seq order.
        window = row.journal[request.after_seq:request.after_seq + request.limit]
        return [JournalEntry.model_validate_json(e) for e in window]

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InMemoryDurableTaskStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
