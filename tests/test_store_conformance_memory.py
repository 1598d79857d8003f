"""The in-memory store passes the shipped store conformance suite.

A second run puts the memory store's rows in one JSON file under an exclusive file lock.
That makes it durable and shareable between processes, so the suite's durability and
two-process tests run here too and are proven able to pass (and to fail: they run real
child processes against real shared data). It is a test double, not a product store.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pytest

from agentium_graph.store import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    InMemoryDurableTaskStore,
    JournalEntry,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    StoreCapabilities,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    TimelineRequest,
)
from agentium_graph.store._memory import _Row
from agentium_graph.testing import (
    FactoryHarness,
    ForwardingStore,
    StoreConformanceSuite,
    StoreHarness,
    make_create_request,
)
from agentium_graph.testing.memory import MemoryHarness

T = TypeVar("T")


class TestMemoryStoreConformance(StoreConformanceSuite):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return MemoryHarness()


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a memory-store coroutine to completion without an event loop (it only yields)."""
    try:
        while True:
            coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class FileBackedMemoryStore:
    """The memory store's logic, its state in a JSON file; every operation holds a flock."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._capabilities = StoreCapabilities(durable=True, multi_process=True,
                                               name="memory-in-a-file")

    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    def _run(self, write: bool, call: Any) -> Any:
        import fcntl  # POSIX only, and only this double needs it

        with open(str(self._path) + ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            memory = InMemoryDurableTaskStore()
            if self._path.exists():
                data = json.loads(self._path.read_text())
                memory._rows = {k: _Row(**v) for k, v in data["rows"].items()}
                memory._blobs = data["blobs"]
            result = _drive(call(memory))
            if write:  # replace atomically: a reader never sees half a file
                tmp = self._path.with_suffix(".tmp")
                tmp.write_text(json.dumps({
                    "rows": {k: dataclasses.asdict(v) for k, v in memory._rows.items()},
                    "blobs": memory._blobs}))
                os.replace(tmp, self._path)
            return result

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        result: CreateTaskResult = self._run(True, lambda m: m.create_task(request))
        return result

    async def get_header(self, key: str) -> TaskHeader | None:
        result: TaskHeader | None = self._run(False, lambda m: m.get_header(key))
        return result

    async def get_task(self, key: str) -> TaskSnapshot | None:
        result: TaskSnapshot | None = self._run(False, lambda m: m.get_task(key))
        return result

    async def get_identity(self, key: str) -> TaskIdentity | None:
        result: TaskIdentity | None = self._run(False, lambda m: m.get_identity(key))
        return result

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        result: list[TaskHeader] = self._run(False, lambda m: m.list_tasks(request))
        return result

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        result: LeaseGrant = self._run(True, lambda m: m.acquire_lease(request))
        return result

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        result: LeaseStatus = self._run(True, lambda m: m.renew_lease(request))
        return result

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        result: TaskHeader = self._run(True, lambda m: m.release_lease(request))
        return result

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        result: TaskHeader = self._run(True, lambda m: m.request_cancel(request))
        return result

    async def commit(self, request: CommitRequest) -> CommitResult:
        result: CommitResult = self._run(True, lambda m: m.commit(request))
        return result

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        result: dict[str, str] = self._run(False, lambda m: m.get_blobs(digests))
        return result

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        result: list[JournalEntry] = self._run(False, lambda m: m.read_timeline(request))
        return result

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> FileBackedMemoryStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


class TestFileBackedMemoryStoreConformance(StoreConformanceSuite):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        return FactoryHarness(name="memory-in-a-file",
                              factory=f"{__name__}:FileBackedMemoryStore",
                              factory_kwargs={"path": str(tmp_path / "store.json")})


def forwarding_file_backed(path: str) -> ForwardingStore:
    """The file-backed double behind a :class:`ForwardingStore` that overrides nothing."""
    return ForwardingStore(FileBackedMemoryStore(path))


class TestForwardingStoreConformance(StoreConformanceSuite):
    """A ForwardingStore hands every protocol call through unchanged: the whole suite,
    durability and two-process tests included, passes through one."""

    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        return FactoryHarness(name="forwarding(memory-in-a-file)",
                              factory=f"{__name__}:forwarding_file_backed",
                              factory_kwargs={"path": str(tmp_path / "store.json")})


async def test_a_forwarding_store_sends_every_call_through_around() -> None:
    seen: list[str] = []

    class Recording(ForwardingStore):
        async def around(self, op: str, call: Any) -> Any:
            seen.append(op)
            return await call()

    async with Recording(InMemoryDurableTaskStore()) as store:
        assert store.capabilities == store.inner.capabilities
        request = make_create_request("k")
        await store.create_task(request)
        assert (await store.get_header("k")) is not None
        assert (await store.get_task("k")) is not None
        assert (await store.get_identity("k")) is not None
        await store.list_tasks(ListTasksRequest())
        await store.get_blobs([])
        await store.read_timeline(TimelineRequest(key="k"))
    assert seen == ["create_task", "get_header", "get_task", "get_identity", "list_tasks",
                    "get_blobs", "read_timeline", "close"]


def test_the_testing_facade_is_pinned() -> None:
    import agentium_graph.testing as testing

    assert sorted(testing.__all__) == sorted([
        "T0", "FactoryHarness", "FixedClock", "ForwardingStore", "PartialStream",
        "ScriptedProvider",
        "ScriptedTurn", "TurnMatch", "StoreConformanceSuite", "StoreHarness",
        "TaskState", "acquire", "action_record", "capture", "commit", "load_factory",
        "make_create_request", "make_identity", "node_record", "open_from_factory",
        "read_timeline", "require_durable", "require_multi_process"])
    assert all(hasattr(testing, name) for name in testing.__all__)
    # pytest collects the suite only through a store's subclass.
    assert not testing.StoreConformanceSuite.__name__.startswith("Test")


def test_harness_factories_are_checked() -> None:
    from datetime import timedelta

    from agentium_graph.testing import T0, FixedClock, load_factory

    with pytest.raises(ValueError, match="module:function"):
        load_factory("agentium_graph.testing.memory.new_memory_store")
    with pytest.raises(TypeError, match="not callable"):
        load_factory("agentium_graph.testing:T0")
    with pytest.raises(TypeError, match="must be JSON"):
        FactoryHarness(name="x", factory="m:f", factory_kwargs={"path": Path("/tmp")})
    clock = FixedClock()
    assert clock() == T0
    assert clock.advance(1.5) == T0 + timedelta(seconds=1.5) == clock()
