"""Differential, stateful test of the store protocol (agentium_graph.testing.differential):
the memory store against a second memory store whose ``reopen`` rebuilds it from its rows
as JSON text (the form tests/test_store_conformance_memory.py shares between processes).
The SQLite and MongoDB variants run the same machine (stores/*/tests/test_review18_*).
Below it, the regressions the machine found in the memory store, each shrunk to a test."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import pytest

from agentium_graph.errors import ConfigurationError, ErrorInfo
from agentium_graph.store import (
    AcquireLeaseRequest,
    AppendJournal,
    CancelTaskRequest,
    Charge,
    CommitRequest,
    DurableTaskStore,
    InMemoryDurableTaskStore,
    ListTasksRequest,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SetStatus,
    SettleNode,
    TimelineRequest,
)
from agentium_graph.testing import (
    T0,
    StoreHarness,
    action_record,
    capture,
    make_create_request,
)
from agentium_graph.testing.differential import run_differential


class RowsHarness(StoreHarness):
    """A memory store that ``reopen`` rebuilds from its rows and blobs (a restart)."""

    def __init__(self) -> None:
        super().__init__(name="memory-rows", factory="agentium_graph.testing.memory:"
                         "new_memory_store")
        self.instance = InMemoryDurableTaskStore()

    async def connect(self) -> DurableTaskStore:
        return self.instance

    async def reopen(self) -> DurableTaskStore:
        old = self.instance
        await self.close()
        self.instance = InMemoryDurableTaskStore()
        self.instance._rows = old._rows
        self.instance._blobs = dict(old._blobs)
        return await self.open()


def test_memory_store_against_itself_through_rows() -> None:
    run_differential(RowsHarness, max_examples=40, steps=80)


async def test_an_acquire_without_steps_writes_no_blobs() -> None:
    """Blobs ride on an acquire's first commit: without steps there is none, and the
    durable stores write nothing (SQLite and MongoDB); the memory store wrote them."""
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request("k"))
    digest = "sha256:" + "b" * 64
    grant = await store.acquire_lease(AcquireLeaseRequest(
        key="k", worker_id="w1", ttl_seconds=5.0, now=T0, blobs={digest: '{"v":1}'}))
    assert grant.commit is None
    assert await store.get_blobs([digest]) == {}


async def test_non_finite_floats_are_stored_as_a_database_keeps_them() -> None:
    """NaN and infinities in an error's details or an action's origin come back as null
    from every durable store (JSON text); the memory store, which copies such values "as if
    written to a database and read back", kept the floats."""
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request("k"))
    grant = await store.acquire_lease(AcquireLeaseRequest(key="k", worker_id="w1",
                                                          ttl_seconds=5.0, now=T0))
    error = ErrorInfo(code="boom", message="m",
                      details={"nan": math.nan, "inf": [math.inf, -math.inf, 1.5]})
    action = action_record("act", "n0").model_copy(update={"origin": {"ratio": math.nan}})
    await store.commit(CommitRequest(key="k", worker_id="w1", fence=grant.fence, now=T0, steps=(
        SettleNode(node_id="n0", state="failed", error=error), RecordAction(action=action),
        SetStatus(status="failed", error=error))))
    snapshot = await store.get_task("k")
    assert snapshot is not None and snapshot.header.error is not None
    stored = {"nan": None, "inf": [None, None, 1.5]}
    assert snapshot.header.error.details == stored
    assert snapshot.nodes["n0"].error is not None
    assert snapshot.nodes["n0"].error.details == stored
    assert snapshot.actions["act"].origin == {"ratio": None}


BAD = "\udcff"  # what Python decodes the byte 0xff of a command-line argument to
BLOB = "sha256:" + "0" * 64
SurrogateCall = Callable[[InMemoryDurableTaskStore, int], Awaitable[object]]
SURROGATE_CALLS: dict[str, SurrogateCall] = {
    "create_task": lambda s, f: s.create_task(
        make_create_request("k2").model_copy(update={"admission_id": BAD})),
    "create_task blobs": lambda s, f: s.create_task(make_create_request("k3", blobs={BLOB: BAD})),
    "get_header": lambda s, f: s.get_header(BAD),
    "get_task": lambda s, f: s.get_task(BAD),
    "get_identity": lambda s, f: s.get_identity(BAD),
    "list_tasks": lambda s, f: s.list_tasks(ListTasksRequest(after=BAD)),
    "read_timeline": lambda s, f: s.read_timeline(TimelineRequest(key=BAD)),
    "get_blobs": lambda s, f: s.get_blobs([BAD]),
    "acquire_lease": lambda s, f: s.acquire_lease(AcquireLeaseRequest(
        key="k", worker_id=BAD, ttl_seconds=5.0, now=T0)),
    "renew_lease": lambda s, f: s.renew_lease(RenewLeaseRequest(
        key="k", worker_id=BAD, fence=f, ttl_seconds=5.0, now=T0)),
    "release_lease": lambda s, f: s.release_lease(ReleaseLeaseRequest(
        key=BAD, worker_id="w1", fence=f, now=T0)),
    "request_cancel": lambda s, f: s.request_cancel(CancelTaskRequest(
        key="k", reason=BAD, now=T0)),
    "commit journal": lambda s, f: s.commit(CommitRequest(
        key="k", worker_id="w1", fence=f, now=T0, steps=(AppendJournal(kind=BAD),))),
    "commit charge": lambda s, f: s.commit(CommitRequest(
        key="k", worker_id="w1", fence=f, now=T0,
        steps=(Charge(admission_id="a", charges={BAD: 1}),))),
    "commit blobs": lambda s, f: s.commit(CommitRequest(
        key="k", worker_id="w1", fence=f, now=T0, steps=(), blobs={BLOB: BAD})),
    "commit action": lambda s, f: s.commit(CommitRequest(
        key="k", worker_id="w1", fence=f, now=T0, steps=(RecordAction(
            action=action_record("act", "n0", origin={"binding": BAD})),))),
}


@pytest.mark.parametrize("op", sorted(SURROGATE_CALLS))
async def test_text_that_is_not_unicode_is_a_configuration_error(op: str) -> None:
    """Text no store can encode (a lone surrogate) is a ConfigurationError from SQLite and
    MongoDB, and changes nothing; the memory store raised a bare PydanticSerializationError
    from some writes and stored it from others (a cancel reason, blob texts, a create's
    admission id), so the test double accepted tasks no durable store would hold."""
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request("k"))
    grant = await store.acquire_lease(AcquireLeaseRequest(key="k", worker_id="w1",
                                                          ttl_seconds=5.0, now=T0))
    before = await capture(store, "k")
    with pytest.raises(ConfigurationError) as info:
        await SURROGATE_CALLS[op](store, grant.fence)
    assert "not valid Unicode" in str(info.value)
    assert await capture(store, "k") == before
    assert await store.get_blobs([BLOB]) == {}
    assert [h.key for h in await store.list_tasks(ListTasksRequest())] == ["k"]
