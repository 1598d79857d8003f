"""A store that hands every protocol call to another one: the base of fault injection
(public as :class:`agentium_graph.testing.ForwardingStore`, which imports pytest; kept here
so that library code, the demo's create witness, can build on it without pytest)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import JournalEntry, TaskHeader, TaskIdentity, TaskSnapshot
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

T = TypeVar("T")


class ForwardingStore:
    """Forwards every :class:`~agentium_graph.DurableTaskStore` call to ``inner``.

    Subclass it and override the calls a test observes or breaks (count commits, fail the
    third renewal, kill the process after a lease grant), calling ``super()`` or ``inner``
    to reach the real store, or override :meth:`around` to act on every call; everything
    else goes through untouched. ``async with`` closes ``inner``. The capabilities are
    ``inner``'s.
    """

    def __init__(self, inner: DurableTaskStore) -> None:
        self.inner = inner

    async def around(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """Every forwarded call passes through here: ``op`` is the protocol method's name,
        ``call()`` makes it on ``inner``. Override it to act on every call at once (fail all
        calls of a worker that died, count reads); the default just makes the call."""
        return await call()

    @property
    def capabilities(self) -> StoreCapabilities:
        return self.inner.capabilities

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        return await self.around("create_task", lambda: self.inner.create_task(request))

    async def get_header(self, key: str) -> TaskHeader | None:
        return await self.around("get_header", lambda: self.inner.get_header(key))

    async def get_task(self, key: str) -> TaskSnapshot | None:
        return await self.around("get_task", lambda: self.inner.get_task(key))

    async def get_identity(self, key: str) -> TaskIdentity | None:
        return await self.around("get_identity", lambda: self.inner.get_identity(key))

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        return await self.around("list_tasks", lambda: self.inner.list_tasks(request))

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        return await self.around("acquire_lease", lambda: self.inner.acquire_lease(request))

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        return await self.around("renew_lease", lambda: self.inner.renew_lease(request))

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        return await self.around("release_lease", lambda: self.inner.release_lease(request))

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        return await self.around("request_cancel", lambda: self.inner.request_cancel(request))

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self.around("commit", lambda: self.inner.commit(request))

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        return await self.around("get_blobs", lambda: self.inner.get_blobs(digests))

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        return await self.around("read_timeline", lambda: self.inner.read_timeline(request))

    async def close(self) -> None:
        await self.around("close", self.inner.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
