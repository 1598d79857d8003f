"""The memory store keeps records as model objects, isolated like a database's rows.

Each test mutates a container that a caller holds (a request it passed in, or a result,
snapshot or record it got back) and checks the stored task did not change, or changes
the stored task and checks what the caller held did not. See the docstring of
``agentium_graph.store._memory`` for which containers the store copies and why.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from pydantic_core import PydanticSerializationError

from agentium_graph.errors import ErrorInfo
from agentium_graph.store import (
    AcquireLeaseRequest,
    AppendJournal,
    CancelTaskRequest,
    Charge,
    InMemoryDurableTaskStore,
    ListTasksRequest,
    RecordAction,
    ReleaseLeaseRequest,
    SetStatus,
    SettleNode,
    StartAttempt,
    TaskHeader,
)
from agentium_graph.testing import (
    T0,
    TaskState,
    acquire,
    action_record,
    capture,
    commit,
    make_create_request,
    read_timeline,
)

KEY = "task-1"
W = "worker-1"


async def leased(store: InMemoryDurableTaskStore) -> int:
    await store.create_task(make_create_request(KEY, deps="none"))
    return await acquire(store, KEY, W)


def scribble(header: TaskHeader) -> None:
    header.counters["tool_calls"] = 999
    header.counters["new"] = 1
    header.limits["tool_calls"] = 0
    if header.error is not None:
        header.error.details["scribbled"] = True


async def state(store: InMemoryDurableTaskStore) -> TaskState:
    """The stored task, deep-copied: a later mutation of what the store handed out must
    not be able to change this reference too."""
    return copy.deepcopy(await capture(store, KEY))


async def assert_unchanged(store: InMemoryDurableTaskStore, before: TaskState) -> None:
    assert await capture(store, KEY) == before


async def test_create_request_is_copied() -> None:
    store = InMemoryDurableTaskStore()
    request = make_create_request(KEY)
    result = await store.create_task(request)
    before = await state(store)
    scribble(request.header)
    scribble(result.header)
    assert request.identity.plan is not None
    request.identity.plan["nodes"].clear()
    again = await store.create_task(make_create_request(KEY))
    assert not again.created
    scribble(again.header)
    await assert_unchanged(store, before)


async def test_commit_result_header_is_not_the_stored_one() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    result = await commit(store, KEY, W, fence,
                          Charge(admission_id="a", charges={"tool_calls": 1}))
    before = await state(store)
    # ``counters`` is the commit's own new dict and ``limits`` the replaced header's:
    # the store must keep neither.
    scribble(result.header)
    await assert_unchanged(store, before)
    assert before.snapshot is not None
    assert before.snapshot.header.counters["tool_calls"] == 1


async def test_lease_results_are_not_the_stored_header() -> None:
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request(KEY, deps="none"))
    # A plain grant copies the stored header with ``model_copy``: it shares both dicts.
    grant = await store.acquire_lease(AcquireLeaseRequest(key=KEY, worker_id=W,
                                                          ttl_seconds=30, now=T0))
    before = await state(store)
    scribble(grant.header)
    await assert_unchanged(store, before)
    canceled = await store.request_cancel(CancelTaskRequest(key=KEY, reason="r", now=T0))
    before = await state(store)
    scribble(canceled)
    # A second cancel changes nothing and returns the stored header: a copy of it.
    scribble(await store.request_cancel(CancelTaskRequest(key=KEY, reason="r2", now=T0)))
    released = await store.release_lease(ReleaseLeaseRequest(key=KEY, worker_id=W,
                                                             fence=grant.fence, now=T0))
    after_release = await state(store)
    assert after_release.snapshot is not None and before.snapshot is not None
    assert after_release.snapshot.header.counters == before.snapshot.header.counters
    assert after_release.snapshot.header.limits == before.snapshot.header.limits
    scribble(released)
    await assert_unchanged(store, after_release)


async def test_first_commit_riding_on_the_lease_is_isolated() -> None:
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request(KEY, deps="none"))
    data = {"nested": {"x": [1]}}
    grant = await store.acquire_lease(AcquireLeaseRequest(
        key=KEY, worker_id=W, ttl_seconds=30, now=T0, snapshot=True,
        steps=(AppendJournal(kind="note", data=data),)))
    before = await state(store)
    assert grant.commit is not None and grant.snapshot is not None
    scribble(grant.header)
    scribble(grant.commit.header)
    scribble(grant.snapshot.header)
    grant.snapshot.nodes.clear()
    data["nested"]["x"].append(2)
    grant.commit.journal[-1].data["nested"]["x"].append(3)
    await assert_unchanged(store, before)


async def test_reads_hand_out_copies() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    await commit(store, KEY, W, fence, Charge(admission_id="a", charges={"tool_calls": 1}),
                 AppendJournal(kind="note", data={"nested": {"x": [1]}}))
    before = await state(store)
    header = await store.get_header(KEY)
    assert header is not None
    scribble(header)
    snapshot = await store.get_task(KEY)
    assert snapshot is not None
    scribble(snapshot.header)
    snapshot.nodes.clear()
    for listed in await store.list_tasks(ListTasksRequest()):
        scribble(listed)
    timeline = await read_timeline(store, KEY)
    timeline[-1].data["nested"]["x"].append(2)
    timeline[-1].data.clear()
    identity = await store.get_identity(KEY)
    assert identity is not None
    identity.program.clear()
    await assert_unchanged(store, before)


async def test_journal_data_is_copied_both_ways() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    data: dict[str, Any] = {"nested": {"x": [1]}, "pair": (1, 2)}
    step = AppendJournal(kind="note", node_id="n0", data=data)
    result = await commit(store, KEY, W, fence, step)
    before = await state(store)
    step.data["nested"]["x"].append(2)
    data["added"] = True
    result.journal[-1].data["nested"]["x"].append(3)
    result.journal[-1].data.clear()
    await assert_unchanged(store, before)
    # Stored like a database stores it: JSON values (the tuple reads back as a list).
    note = before.timeline[-1]
    assert (note.kind, note.data) == ("note", {"nested": {"x": [1]}, "pair": [1, 2]})


async def test_error_details_are_copied() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    node_error = ErrorInfo(code="boom", message="m", details={"k": [1]})
    task_error = ErrorInfo(code="task", message="m", details={"k": {"deep": 1}})
    result = await commit(store, KEY, W, fence,
                          StartAttempt(node_id="n0", attempt_id="a0"),
                          SettleNode(node_id="n0", state="failed", error=node_error),
                          SetStatus(status="failed", error=task_error))
    before = await state(store)
    node_error.details["k"].append(2)
    task_error.details["k"]["deep"] = 2
    failed = result.nodes["n0"].error
    assert failed is not None
    failed.details["k"].append(3)
    scribble(result.header)
    snapshot = await store.get_task(KEY)
    assert snapshot is not None and snapshot.header.error is not None
    stored_error = snapshot.nodes["n0"].error
    assert stored_error is not None
    stored_error.details.clear()
    scribble(snapshot.header)
    await assert_unchanged(store, before)
    assert before.snapshot is not None and before.snapshot.header.error is not None
    assert before.snapshot.header.error.details == {"k": {"deep": 1}}
    before_error = before.snapshot.nodes["n0"].error
    assert before_error is not None and before_error.details == {"k": [1]}


async def test_action_origin_and_resolution_are_copied() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    action = action_record("act-1", "n0", origin={"binding": "t", "args": {"x": [1]}})
    action = action.model_copy(update={"resolution": {"by": {"who": "op"}}})
    result = await commit(store, KEY, W, fence, RecordAction(action=action))
    before = await state(store)
    action.origin["args"]["x"].append(2)
    assert action.resolution is not None
    action.resolution["by"]["who"] = "mallory"
    result.actions["act-1"].origin.clear()
    snapshot = await store.get_task(KEY)
    assert snapshot is not None
    snapshot.actions["act-1"].origin["args"]["x"].clear()
    resolution = snapshot.actions["act-1"].resolution
    assert resolution is not None
    resolution.clear()
    await assert_unchanged(store, before)
    # Append-only evidence still compares equal after the round trip: a retransmission of
    # the same action is accepted as identical, not refused as a changed origin.
    same = action_record("act-1", "n0", origin={"binding": "t", "args": {"x": [1]}})
    same = same.model_copy(update={"resolution": {"by": {"who": "op"}}})
    again = await commit(store, KEY, W, fence, RecordAction(action=same))
    assert [e.kind for e in again.journal] == []


async def test_later_writes_do_not_change_what_a_caller_holds() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    first = await commit(store, KEY, W, fence, StartAttempt(node_id="n0", attempt_id="a0"),
                         Charge(admission_id="a", charges={"tool_calls": 1}))
    held = await store.get_task(KEY)
    assert held is not None
    held_dump = held.model_dump()
    first_dump = first.model_dump()
    await commit(store, KEY, W, fence, SettleNode(node_id="n0", state="completed",
                                                  output_digest="sha256:x"),
                 Charge(admission_id="b", charges={"tool_calls": 2}))
    assert held.model_dump() == held_dump
    assert first.model_dump() == first_dump
    assert held.header.counters["tool_calls"] == first.header.counters["tool_calls"] == 1


async def test_a_write_refused_while_copying_changes_nothing() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    before = await state(store)
    # AppendJournal refuses such data when built; model_construct skips that check, like a
    # caller's request that reaches the store unvalidated, so the store's own copy fails.
    unjournalable = AppendJournal.model_construct(kind="note", data={"not json": object()})
    with pytest.raises(PydanticSerializationError):
        await commit(store, KEY, W, fence, StartAttempt(node_id="n0", attempt_id="a0"),
                     unjournalable)
    await assert_unchanged(store, before)


async def test_concurrent_commits_are_atomic() -> None:
    store = InMemoryDurableTaskStore()
    fence = await leased(store)
    results = await asyncio.gather(*(
        commit(store, KEY, W, fence, Charge(admission_id=f"a{i}", charges={"tool_calls": 1}))
        for i in range(20)))
    header = await store.get_header(KEY)
    assert header is not None
    assert header.counters["tool_calls"] == 20
    assert sorted(r.header.counters["tool_calls"] for r in results) == list(range(1, 21))
    timeline = await read_timeline(store, KEY)
    assert [e.seq for e in timeline] == list(range(1, header.journal_seq + 1))
