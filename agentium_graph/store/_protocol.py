"""The store protocol every durable (and the in-memory) task store implements.

Stores prove they fit with a typed assignment under ``mypy --strict`` and prove they behave
with :mod:`agentium_graph.testing`. The protocol is ``runtime_checkable`` too, so
``isinstance(store, DurableTaskStore)`` works (it checks the members exist, nothing more).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, runtime_checkable

from agentium_graph.store._records import (
    JournalEntry,
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


@runtime_checkable
class DurableTaskStore(Protocol):
    """Async persistence for tasks: one method per kind of state transition.

    Contract (checked by the conformance suite):

    * Constructing a store does no I/O; the first operation creates what it needs.
    * ``create_task`` is idempotent for an identical identity digest and raises
      ``TaskConflictError`` otherwise.
    * ``acquire_lease`` always issues a strictly higher fence; the same worker re-acquires
      at once, another worker gets ``LeaseHeldError`` until the lease expires.
    * Every fenced call (``renew_lease``, ``release_lease``, ``commit``) with a stale
      ``(worker_id, fence)`` raises ``StaleFenceError`` and changes nothing.
    * ``commit`` applies its steps through
      :func:`agentium_graph.store.apply_commit` and persists the whole delta atomically,
      blobs first (insert-if-absent). Admission ids are charged at most once, ever.
    * ``request_cancel`` touches only the cancel request, never conflicting with the owner.
    * Returned records are fresh copies; mutating them changes nothing stored.
    """

    @property
    def capabilities(self) -> StoreCapabilities: ...

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult: ...

    async def get_header(self, key: str) -> TaskHeader | None: ...

    async def get_task(self, key: str) -> TaskSnapshot | None: ...

    async def get_identity(self, key: str) -> TaskIdentity | None: ...

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]: ...

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant: ...

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus: ...

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader: ...

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader: ...

    async def commit(self, request: CommitRequest) -> CommitResult: ...

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]: ...

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> DurableTaskStore: ...

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None: ...
