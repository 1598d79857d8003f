"""Conformance: creating tasks, reading them, fresh copies, blobs and listing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from agentium_graph._canonical import digest_text
from agentium_graph.errors import InvalidTransitionError, TaskConflictError, TaskNotFoundError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import TaskStatus
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    Charge,
    ClaimNode,
    CommitRequest,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SetStatus,
    TimelineRequest,
)
from agentium_graph.testing._base import KEY, W1, SuiteBase, rejected
from agentium_graph.testing._fixtures import (
    T0,
    acquire,
    capture,
    commit,
    make_create_request,
    read_timeline,
)


class TaskTests(SuiteBase):
    """create_task, get_header/get_task/get_identity, get_blobs and list_tasks."""

    async def test_create_stores_exactly_what_was_requested(self, store: DurableTaskStore) -> None:
        request = make_create_request(KEY, nodes=3, input={"text": "ünïcode ✓", "n": [1.5]},
                                      deadline=T0 + timedelta(days=1, microseconds=7),
                                      grants=("a", "b"), limits={"tool_calls": 7})
        result = await store.create_task(request)
        assert result.created is True
        assert result.header == request.header
        assert await store.get_header(KEY) == request.header
        assert await store.get_identity(KEY) == request.identity
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        assert snapshot.header == request.header
        assert snapshot.nodes == {n.node_id: n for n in request.nodes}
        assert snapshot.actions == {}
        timeline = await read_timeline(store, KEY)
        assert [(e.seq, e.kind) for e in timeline] == [(1, "task_created")]
        assert timeline[0].at == T0

    async def test_create_is_idempotent_for_an_identical_identity(
            self, store: DurableTaskStore) -> None:
        first = make_create_request(KEY, input={"a": 1})
        await store.create_task(first)
        before = await capture(store, KEY)
        # A re-delivery later in time carries the same identity: nothing changes.
        again = make_create_request(KEY, input={"a": 1}, now=T0 + timedelta(hours=1))
        result = await store.create_task(again)
        assert result.created is False
        assert result.header == first.header
        assert await capture(store, KEY) == before

    async def test_create_conflict_names_every_differing_field(
            self, store: DurableTaskStore) -> None:
        await store.create_task(make_create_request(KEY, input={"a": 1}))
        other = make_create_request(KEY, input={"a": 2}, policy_revision="policy-2")
        error = await rejected(store, KEY, TaskConflictError,
                               store.create_task(other))
        assert error.key == KEY
        assert {"input", "input_digest", "policy_revision"} <= set(error.differing)
        assert "catalog_digest" not in error.differing
        assert "program" not in error.differing

    async def test_create_rejects_an_identity_digest_that_does_not_match(
            self, store: DurableTaskStore) -> None:
        request = make_create_request(KEY)
        bad = request.model_copy(update={"header": request.header.model_copy(
            update={"identity_digest": digest_text("something else")})})
        with pytest.raises(InvalidTransitionError):
            await store.create_task(bad)
        assert await store.get_header(KEY) is None

    async def test_create_rejects_a_header_that_is_not_initial(
            self, store: DurableTaskStore) -> None:
        request = make_create_request(KEY)
        for update in ({"fence": 3}, {"seq": 2}, {"journal_seq": 0}, {"status": "running"}):
            bad = request.model_copy(update={"header": request.header.model_copy(
                update=update)})
            with pytest.raises(InvalidTransitionError):
                await store.create_task(bad)
        assert await store.get_header(KEY) is None
        assert (await store.create_task(request)).created is True

    async def test_reads_of_unknown_keys_return_none(self, store: DurableTaskStore) -> None:
        await self.create(store, "known")
        assert await store.get_header("unknown") is None
        assert await store.get_task("unknown") is None
        assert await store.get_identity("unknown") is None
        assert [h.key for h in await store.list_tasks(ListTasksRequest())] == ["known"]

    async def test_writes_to_unknown_keys_raise_task_not_found(
            self, store: DurableTaskStore) -> None:
        key = "unknown"
        operations: list[Callable[[], Awaitable[object]]] = [
            lambda: store.acquire_lease(AcquireLeaseRequest(key=key, worker_id=W1,
                                                            ttl_seconds=1, now=T0)),
            lambda: store.renew_lease(RenewLeaseRequest(key=key, worker_id=W1, fence=1,
                                                        ttl_seconds=1, now=T0)),
            lambda: store.release_lease(ReleaseLeaseRequest(key=key, worker_id=W1, fence=1,
                                                            now=T0)),
            lambda: store.request_cancel(CancelTaskRequest(key=key, reason="r", now=T0)),
            lambda: store.commit(CommitRequest(key=key, worker_id=W1, fence=1, now=T0,
                                               steps=(ClaimNode(node_id="n0"),))),
            lambda: store.read_timeline(TimelineRequest(key=key)),
        ]
        for operation in operations:
            with pytest.raises(TaskNotFoundError) as info:
                await operation()
            assert info.value.key == key
        assert await store.get_header(key) is None

    async def test_returned_records_are_fresh_copies(self, store: DurableTaskStore) -> None:
        request = make_create_request(KEY, input={"items": [1, 2]})
        await store.create_task(request)
        fence = await acquire(store, KEY, W1)
        result = await commit(store, KEY, W1, fence,
                              Charge(admission_id="adm-1", charges={"tool_calls": 1}))
        before = await capture(store, KEY)
        # Mutate everything handed out, including the request objects themselves.
        request.identity.program["id"] = "mutated"
        assert isinstance(request.identity.input, dict)
        request.identity.input["items"].append(3)
        result.header.counters["tool_calls"] = 99
        header = await store.get_header(KEY)
        assert header is not None
        header.counters["tool_calls"] = 99
        header.limits["tool_calls"] = 0
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        snapshot.nodes.pop("n0")
        snapshot.header.counters.clear()
        identity = await store.get_identity(KEY)
        assert identity is not None and identity.plan is not None
        identity.plan["nodes"].clear()
        identity.descriptors.clear()
        timeline = await read_timeline(store, KEY)
        timeline[-1].data.clear()
        timeline.clear()
        listed = await store.list_tasks(ListTasksRequest())
        listed[0].counters.clear()
        assert await capture(store, KEY) == before

    async def test_a_created_task_keeps_no_object_of_its_request(
            self, store: DurableTaskStore) -> None:
        # Checked before any other write replaces the stored header: a store that kept
        # the request's own header (or the header it returned) would show the change.
        request = make_create_request(KEY, limits={"tool_calls": 5})
        result = await store.create_task(request)
        before = await capture(store, KEY)
        request.header.counters["tool_calls"] = 99
        request.header.limits["tool_calls"] = 0
        result.header.counters["model_calls"] = 98
        result.header.limits.clear()
        assert await capture(store, KEY) == before
        again = await store.create_task(make_create_request(KEY, limits={"tool_calls": 5}))
        assert not again.created
        again.header.counters.clear()
        assert await capture(store, KEY) == before

    async def test_blobs_are_insert_if_absent(self, store: DurableTaskStore) -> None:
        first, second = '{"output":1}', '{"output":2}'
        d1, d2 = digest_text(first), digest_text(second)
        await store.create_task(make_create_request(KEY, blobs={d1: first}))
        fence = await acquire(store, KEY, W1)
        # The same digest again with other text must not overwrite the first write.
        await commit(store, KEY, W1, fence, Charge(admission_id="a", charges={}),
                     blobs={d2: second, d1: "overwritten?"})
        unknown = digest_text("never written")
        got = await store.get_blobs([d1, d2, unknown])
        assert got == {d1: first, d2: second}
        assert await store.get_blobs([]) == {}
        got[d1] = "mutated"
        assert await store.get_blobs([d1]) == {d1: first}

    async def test_list_tasks_pages_in_key_order(self, store: DurableTaskStore) -> None:
        keys = ["k-05", "k-01", "k-07", "k-03", "k-02", "k-06", "k-04"]
        for key in keys:
            await self.create(store, key)
        for limit in (1, 2, 3, 7, 100):
            seen: list[str] = []
            after: str | None = None
            while True:
                page = await store.list_tasks(ListTasksRequest(after=after, limit=limit))
                assert len(page) <= limit
                seen.extend(h.key for h in page)
                if len(page) < limit:
                    break
                after = page[-1].key
            assert seen == sorted(keys), f"limit={limit}"
        tail = await store.list_tasks(ListTasksRequest(after="k-05"))
        assert [h.key for h in tail] == ["k-06", "k-07"]
        assert await store.list_tasks(ListTasksRequest(after="k-07")) == []

    async def test_list_tasks_filters_by_status(self, store: DurableTaskStore) -> None:
        for key in ("a", "b", "c", "d", "e"):
            await self.create(store, key)
        for key in ("b", "d", "e"):  # the first commit moves a task to running
            fence = await acquire(store, key, W1)
            await commit(store, key, W1, fence, ClaimNode(node_id="n0"))
        header = await store.get_header("e")
        assert header is not None
        await commit(store, "e", W1, header.fence, SetStatus(status="completed"))

        async def keys(status: TaskStatus | None, limit: int) -> list[str]:
            out: list[str] = []
            after: str | None = None
            while True:
                page = await store.list_tasks(ListTasksRequest(
                    status=status, after=after, limit=limit))
                assert all(status is None or h.status == status for h in page)
                out.extend(h.key for h in page)
                if len(page) < limit:
                    return out
                after = page[-1].key

        for limit in (1, 2, 100):
            assert await keys("pending", limit) == ["a", "c"]
            assert await keys("running", limit) == ["b", "d"]
            assert await keys("completed", limit) == ["e"]
            assert await keys("failed", limit) == []
            assert await keys(None, limit) == ["a", "b", "c", "d", "e"]
