"""Behaviour of MongoDBDurableTaskStore beyond the conformance suite: the document layout,
special node ids, cancel vs. the owner's writes, the cache, orphans and lost replies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from mongodb_helpers import acquire_request, at, commit_request, create_request
from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import AutoReconnect

from agentium_graph._canonical import digest_text
from agentium_graph.errors import StaleFenceError, StoreError
from agentium_graph.store import (
    CancelTaskRequest,
    Charge,
    ClaimNode,
    JournalEntry,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SettleNode,
    StartAttempt,
    TimelineRequest,
)
from agentium_graph.testing import action_record, read_timeline
from agentium_graph_mongodb import SCHEMA_VERSION, MongoDBDurableTaskStore
from agentium_graph_mongodb.testing import open_store

Raw = AsyncDatabase[dict[str, Any]]


def _blob(text: str) -> tuple[str, str]:
    return digest_text(text), text


async def test_capabilities_and_no_io_at_construction() -> None:
    # Nothing listens on port 1: construction must not notice.
    store = MongoDBDurableTaskStore("mongodb://user:s3cret@127.0.0.1:1/?directConnection=true",
                                    database="later")
    assert store.capabilities.durable and store.capabilities.multi_process
    assert store.capabilities.name == "mongodb"
    assert store.stats.round_trips == 0
    assert "s3cret" not in repr(store) and "127.0.0.1:1" in repr(store)
    await store.close()


async def test_the_document_layout(store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    """Pins docs/design/mongodb-layout.md: a change here is a schema change."""
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    out = _blob('{"value":1}')
    await store.commit(commit_request("k", fence, [
        StartAttempt(node_id="a", attempt_id="a1", admission_id="adm-a",
                     charges={"tool_calls": 1}),
        SettleNode(node_id="a", state="completed", output_digest=out[0])],
        blobs=dict([out])))
    task = await raw_db.tasks.find_one({"_id": "k"})
    assert task is not None
    assert set(task) == {"_id", "v", "header", "identity", "first_entry", "nodes", "actions",
                         "admissions", "writes"}
    assert task["v"] == SCHEMA_VERSION
    header = task["header"]
    assert header["seq"] == 2 and header["fence"] == fence and header["journal_seq"] > 2
    assert header["status"] == "running" and header["cancel"] is None
    assert header["lease"]["owner"] == "w1" and isinstance(header["lease"]["expires_at"], str)
    assert header["counters"]["tool_calls"] == 1
    assert json.loads(task["nodes"]["a"])["output_digest"] == out[0]
    assert set(task["admissions"]) == {"adm_k_create", "adm-a"}
    assert json.loads(task["first_entry"])["kind"] == "task_created"
    journal = await raw_db.journal.find({"k": "k"}).sort("s", 1).to_list(None)
    assert [d["_id"] for d in journal] == [f"k:{s}" for s in range(2, header["journal_seq"] + 1)]
    assert all(d["v"] == SCHEMA_VERSION for d in journal)
    blob = await raw_db.blobs.find_one({"_id": out[0]})
    assert blob == {"_id": out[0], "v": SCHEMA_VERSION, "body": out[1]}
    meta = await raw_db.meta.find_one({"_id": "agentium-graph-mongodb"})
    assert meta is not None and meta["v"] == SCHEMA_VERSION
    indexes = await raw_db.journal.index_information()
    assert indexes["by_task_seq"]["unique"] is True
    assert "by_status" in await raw_db.tasks.index_information()


async def test_node_action_and_admission_ids_with_dots_and_dollars(
        store: MongoDBDurableTaskStore, raw_db: Raw, mongodb_uri: str) -> None:
    weird = ["a.b", "$x", "c.$d.e", "%2E", "", "f%", "$"]
    await store.create_task(create_request("k.$", weird, admission_id="adm.$create"))
    fence = (await store.acquire_lease(acquire_request("k.$"))).fence
    steps: list[Any] = []
    for i, node in enumerate(weird):
        steps.append(StartAttempt(node_id=node, attempt_id=f"x{i}", admission_id=f"adm.${i}",
                                  charges={"tool.$calls": 1}))
    steps.append(RecordAction(action=action_record("act.$1", "a.b", fence=fence)))
    await store.commit(commit_request("k.$", fence, steps))
    again = await store.commit(commit_request("k.$", fence, [
        Charge(admission_id="adm.$3", charges={"tool.$calls": 1}),
        SettleNode(node_id="$", state="failed")]))
    assert again.already_charged == ("adm.$3",)
    snapshot = await store.get_task("k.$")
    assert snapshot is not None
    assert set(snapshot.nodes) == set(weird)
    assert all(snapshot.nodes[n].state == "running" for n in weird if n != "$")
    assert snapshot.nodes["$"].state == "failed"
    assert set(snapshot.actions) == {"act.$1"}
    assert snapshot.header.counters["tool.$calls"] == len(weird)
    raw = await raw_db.tasks.find_one({"_id": "k.$"})
    assert raw is not None
    assert all("." not in f and not f.startswith("$") for f in raw["nodes"])
    assert "a%2Eb" in raw["nodes"] and "%" in raw["nodes"] and "f%25" in raw["nodes"]
    # A fresh store (no cache) reads the same thing.
    async with open_store(mongodb_uri, raw_db.name) as other:
        assert await other.get_task("k.$") == snapshot
        assert (await other.get_identity("k.$")) == create_request(
            "k.$", weird, admission_id="adm.$create").identity




async def test_cancel_never_conflicts_with_the_owners_commits(
        store: MongoDBDurableTaskStore, mongodb_uri: str, mongodb_database: str) -> None:
    await store.create_task(create_request("k", ["a", "b"]))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
    async with open_store(mongodb_uri, mongodb_database) as operator:
        before = store.stats
        # The owner's cached copy predates the cancel; its compare-and-set still applies
        # at once (no miss, no re-read) and leaves the cancel request in place.
        canceled = await operator.request_cancel(CancelTaskRequest(key="k", reason="stop",
                                                                   now=at(2)))
        assert canceled.cancel is not None and canceled.cancel.reason == "stop"
        result = await store.commit(commit_request("k", fence, [
            StartAttempt(node_id="a", attempt_id="a1")]))
        delta = store.stats - before
        assert delta.cas_misses == 0 and delta.reads == 0
        assert result.header.cancel is not None and result.header.cancel.reason == "stop"
        # Interleave many commits with cancel requests and renewals from another handle.
        steps = [Charge(admission_id=f"c{i}", charges={"tool_calls": 1}) for i in range(12)]
        outcomes = await asyncio.gather(
            *(store.commit(commit_request("k", fence, [s], now=3 + i))
              for i, s in enumerate(steps)),
            *(operator.request_cancel(CancelTaskRequest(key="k", reason=f"later {i}",
                                                        now=at(3)))
              for i in range(6)),
            *(operator.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=fence,
                                                     ttl_seconds=60, now=at(4)))
              for _ in range(3)))
        assert not [o for o in outcomes if isinstance(o, BaseException)]
        assert (store.stats - before).cas_misses == 0
    header = await store.get_header("k")
    assert header is not None and header.cancel is not None
    assert header.cancel.reason == "stop"  # the first request wins, never overwritten
    assert header.counters["tool_calls"] == 12
    assert header.lease is not None and header.lease.expires_at == at(64)
    status = await store.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=fence,
                                                       ttl_seconds=60, now=at(5)))
    assert status.cancel is not None and status.cancel.reason == "stop"


async def test_a_warm_commit_is_one_compare_and_set_plus_its_side_inserts(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k", ["a", "b"]))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    before = store.stats
    await store.commit(commit_request("k", fence, [StartAttempt(node_id="a", attempt_id="1")]))
    start = store.stats - before
    assert start.reads == 0 and start.cas_misses == 0 and start.cache_hits == 1
    assert start.round_trips == 2  # journal insert + compare-and-set
    out = _blob('{"v":1}')
    before = store.stats
    await store.commit(commit_request("k", fence, [
        SettleNode(node_id="a", state="completed", output_digest=out[0]),
        StartAttempt(node_id="b", attempt_id="2", requires_completed=("a",))],
        blobs=dict([out])))
    settle = store.stats - before
    # Blob and journal inserts: two concurrent inserts (never one client bulkWrite, whose
    # j=True a server may not honour), then the compare-and-set.
    assert settle.reads == 0 and settle.round_trips == 3
    snapshot = await store.get_task("k")
    assert snapshot is not None and snapshot.nodes["a"].output_digest == out[0]
    assert await store.get_blobs([out[0]]) == dict([out])


async def test_concurrent_commits_of_one_store_serialize_without_misses(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    before = store.stats
    await asyncio.gather(*(store.commit(commit_request(
        "k", fence, [Charge(admission_id=f"c{i}", charges={"tool_calls": 1})]))
        for i in range(20)))
    assert (store.stats - before).cas_misses == 0
    header = await store.get_header("k")
    assert header is not None and header.counters["tool_calls"] == 20
    timeline = await read_timeline(store, "k")
    assert [e.seq for e in timeline] == list(range(1, header.journal_seq + 1))


async def test_two_stores_racing_one_fence_apply_each_commit_once(
        store: MongoDBDurableTaskStore, mongodb_uri: str, mongodb_database: str,
        raw_db: Raw) -> None:
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    async with open_store(mongodb_uri, mongodb_database) as other:
        await other.get_header("k")
        results = await asyncio.gather(*(
            (store if i % 2 else other).commit(commit_request(
                "k", fence, [Charge(admission_id=f"c{i}", charges={"tool_calls": 1}),
                             Charge(admission_id="shared", charges={"model_calls": 1})]))
            for i in range(16)))
        misses = store.stats.cas_misses + other.stats.cas_misses
    assert misses > 0, "the stores never raced"
    assert sum("shared" in r.charged for r in results) == 1
    header = await store.get_header("k")
    assert header is not None
    assert header.counters["tool_calls"] == 16 and header.counters["model_calls"] == 1
    timeline = await read_timeline(store, "k")
    assert [e.seq for e in timeline] == list(range(1, header.journal_seq + 1))
    charged = [e.data["admission_id"] for e in timeline if e.kind == "admission_charged"]
    assert sorted(charged) == sorted([f"c{i}" for i in range(16)] + ["shared"])
    # Losers removed their entries; whatever is left above journal_seq is invisible.
    assert await raw_db.journal.count_documents({"k": "k"}) >= header.journal_seq - 1


async def test_a_stale_cached_copy_is_corrected_before_deciding(
        store: MongoDBDurableTaskStore, mongodb_uri: str, mongodb_database: str) -> None:
    await store.create_task(create_request("k"))
    first = (await store.acquire_lease(acquire_request("k"))).fence
    await store.commit(commit_request("k", first, [ClaimNode(node_id="a")]))
    async with open_store(mongodb_uri, mongodb_database) as restarted:
        # The same worker restarts elsewhere and takes over under a newer fence.
        second = (await restarted.acquire_lease(acquire_request("k", now=2))).fence
        # The first store's copy still says `first` is current: it must not refuse
        # the newer fence from that copy, and must refuse the old one after reading.
        result = await store.commit(commit_request("k", second, [
            StartAttempt(node_id="a", attempt_id="a1")], now=3))
        assert result.header.fence == second
        before = await read_timeline(store, "k")
        with pytest.raises(StaleFenceError):
            await store.commit(commit_request("k", first, [ClaimNode(node_id="b")], now=4))
        assert await read_timeline(store, "k") == before


async def test_orphans_of_a_crashed_writer_are_claimed_and_replaced(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    header = await store.get_header("k")
    assert header is not None
    # A writer died after inserting its journal entries but before its compare-and-set.
    ghost = JournalEntry(seq=header.journal_seq + 1, at=at(9), kind="ghost")
    await raw_db.journal.insert_one({"_id": f"k:{ghost.seq}", "k": "k", "s": ghost.seq,
                                     "v": SCHEMA_VERSION, "t": "dead-writer",
                                     "e": ghost.model_dump_json()})
    assert [e.kind for e in await read_timeline(store, "k")][-1] != "ghost"  # invisible
    before = store.stats
    out = _blob('{"orphaned":false}')
    result = await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")],
                                               blobs=dict([out])))
    assert (store.stats - before).orphans_reclaimed == 1
    assert await store.get_blobs([out[0]]) == dict([out])
    assert result.header.seq == header.seq + 2  # the claim moved seq once more
    timeline = await read_timeline(store, "k")
    assert [e.kind for e in timeline if e.kind == "ghost"] == []
    assert timeline[-1] == result.journal[-1]
    assert [e.seq for e in timeline] == list(range(1, result.header.journal_seq + 1))


class _LoseReplies:
    """Wraps a collection: the first ``n`` find_one_and_update calls apply, then the reply
    is lost (the driver raises AutoReconnect, as on a connection reset)."""

    def __init__(self, inner: AsyncCollection[dict[str, Any]], n: int) -> None:
        self.inner = inner
        self.left = n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.inner.find_one_and_update(*args, **kwargs)
        if self.left > 0:
            self.left -= 1
            raise AutoReconnect("connection reset after the write (simulated)")
        return result

    async def insert_one(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.inner.insert_one(*args, **kwargs)
        if self.left > 0:
            self.left -= 1
            raise AutoReconnect("connection reset after the write (simulated)")
        return result


async def test_a_lost_reply_is_recognized_not_applied_twice(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    session = await store._ready()
    session.tasks = _LoseReplies(session.tasks, 1)  # type: ignore[assignment]
    before = store.stats
    result = await store.commit(commit_request("k", fence, [
        StartAttempt(node_id="a", attempt_id="a1", admission_id="adm-a",
                     charges={"tool_calls": 1})]))
    delta = store.stats - before
    assert delta.transient_retries == 1 and delta.cas_misses == 1
    assert result.charged == ("adm-a",)
    snapshot = await store.get_task("k")
    assert snapshot is not None
    assert len(snapshot.nodes["a"].attempts) == 1
    assert snapshot.header.counters["tool_calls"] == 1
    assert snapshot.header == result.header
    kinds = [e.kind for e in await read_timeline(store, "k")]
    assert kinds.count("attempt_started") == 1 and kinds.count("admission_charged") == 1


async def test_a_create_whose_reply_was_lost_still_reports_created(
        store: MongoDBDurableTaskStore) -> None:
    session = await store._ready()
    session.tasks = _LoseReplies(session.tasks, 1)  # type: ignore[assignment]
    result = await store.create_task(create_request("k"))
    assert result.created is True
    again = await store.create_task(create_request("k"))
    assert again.created is False and again.header == result.header


async def test_release_then_renew_is_stale_and_timeline_reads_are_bounded(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    released = await store.release_lease(ReleaseLeaseRequest(key="k", worker_id="w1",
                                                             fence=fence, now=at(1)))
    assert released.lease is None
    with pytest.raises(StaleFenceError):
        await store.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=fence,
                                                  ttl_seconds=5, now=at(2)))
    page = await store.read_timeline(TimelineRequest(key="k", after_seq=0, limit=1))
    assert [e.kind for e in page] == ["task_created"]
    page = await store.read_timeline(TimelineRequest(key="k", after_seq=1, limit=5))
    assert [(e.seq, e.kind) for e in page] == [(2, "lease_acquired")]


async def test_a_client_passed_in_stays_open(mongodb_uri: str,
                                             mongodb_database: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri)
    try:
        async with MongoDBDurableTaskStore(client, database=mongodb_database) as store:
            await store.create_task(create_request("k"))
        with pytest.raises(StoreError, match="closed"):
            await store.get_header("k")
        await store.close()  # idempotent
        assert await client[mongodb_database].tasks.count_documents({}) == 1
    finally:
        await client.close()


class _SwallowsCancel:
    """A collection whose find_one swallows a cancellation, as pymongo's async network
    layer sometimes does, and returns as if nothing happened."""

    def __init__(self, inner: AsyncCollection[dict[str, Any]]) -> None:
        self.inner = inner
        self.entered = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return None
        raise AssertionError("unreachable")


async def test_a_cancellation_swallowed_by_the_driver_is_delivered(
        store: MongoDBDurableTaskStore) -> None:
    session = await store._ready()
    fake = _SwallowsCancel(session.tasks)
    session.tasks = fake  # type: ignore[assignment]
    call = asyncio.create_task(store.get_header("k"))
    await asyncio.wait_for(fake.entered.wait(), timeout=10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


def test_static_plan_headers_stay_readable_by_versions_before_plan_digest() -> None:
    # Headers gained plan_digest (set by plan revisions); a static task's stored header
    # leaves it out, so the previous version (whose header model forbids unknown fields)
    # can still read what this version wrote.
    from agentium_graph_mongodb._codec import header_doc, header_from_doc

    header = create_request("static").header
    assert header.plan_digest is None
    doc = header_doc(header)
    assert "plan_digest" not in doc
    assert header_from_doc(doc, "test", "static") == header
    planned = header.model_copy(update={"plan_digest": "sha256:" + "2" * 64})
    assert header_from_doc(header_doc(planned), "test", "static").plan_digest == planned.plan_digest
