"""Bad input: a database of a newer schema, foreign or unparsable documents, a journal
missing committed entries. Each is a typed StoreError that says what to do, and the
store writes nothing while refusing."""

from __future__ import annotations

from typing import Any

import pytest
from mongodb_helpers import acquire_request, commit_request, create_request
from pymongo.asynchronous.database import AsyncDatabase

from agentium_graph.errors import StoreSchemaError
from agentium_graph.store import ClaimNode, TimelineRequest
from agentium_graph_mongodb import SCHEMA_VERSION, MongoDBDurableTaskStore
from agentium_graph_mongodb.testing import open_store

Raw = AsyncDatabase[dict[str, Any]]


async def _seeded(store: MongoDBDurableTaskStore) -> int:
    await store.create_task(create_request("k"))
    return (await store.acquire_lease(acquire_request("k"))).fence


async def test_a_database_of_a_newer_schema_is_refused_untouched(
        raw_db: Raw, mongodb_uri: str, mongodb_database: str) -> None:
    await raw_db.meta.insert_one({"_id": "agentium-graph-mongodb", "v": SCHEMA_VERSION + 1})
    async with open_store(mongodb_uri, mongodb_database) as store:
        for call in (lambda: store.get_header("k"),
                     lambda: store.create_task(create_request("k"))):
            with pytest.raises(StoreSchemaError) as info:
                await call()
            assert "upgrade agentium-graph-mongodb" in str(info.value)
            assert info.value.details["schema_version"] == SCHEMA_VERSION + 1
    assert await raw_db.tasks.count_documents({}) == 0
    assert "tasks" not in await raw_db.list_collection_names()


async def test_a_meta_document_of_another_application_is_refused_untouched(
        raw_db: Raw, mongodb_uri: str, mongodb_database: str) -> None:
    # (review 40) Only the schema version was checked: a database stamped by another
    # application with a version this store knows was written into.
    await raw_db.meta.insert_one({"_id": "agentium-graph-mongodb", "v": SCHEMA_VERSION,
                                  "application": "other"})
    async with open_store(mongodb_uri, mongodb_database) as store:
        with pytest.raises(StoreSchemaError) as info:
            await store.create_task(create_request("k"))
        assert "another application" in str(info.value)
        assert info.value.details["application"] == "'other'"
    assert await raw_db.tasks.count_documents({}) == 0


@pytest.mark.parametrize("collection", ["tasks", "journal", "blobs"])
async def test_a_document_of_a_newer_schema_is_refused(
        store: MongoDBDurableTaskStore, raw_db: Raw, collection: str, mongodb_uri: str,
        mongodb_database: str) -> None:
    fence = await _seeded(store)
    blob = ("sha256:" + "0" * 64, '{"x":1}')
    await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")],
                                      blobs=dict([blob])))
    await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
    await raw_db[collection].update_many({}, {"$set": {"v": SCHEMA_VERSION + 1}})
    reads = {"tasks": lambda: store.get_header("k"),
             "journal": lambda: store.read_timeline(TimelineRequest(key="k")),
             "blobs": lambda: store.get_blobs([blob[0]])}
    with pytest.raises(StoreSchemaError, match="newer than this agentium-graph-mongodb"):
        await reads[collection]()
    if collection == "tasks":  # a writer refuses too (its cached copy does not hide it)
        before = await raw_db.tasks.find_one({"_id": "k"})
        entries = await raw_db.journal.count_documents({})
        with pytest.raises(StoreSchemaError):
            await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
        async with open_store(mongodb_uri, mongodb_database) as fresh:
            with pytest.raises(StoreSchemaError):
                await fresh.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
        assert await raw_db.tasks.find_one({"_id": "k"}) == before
        assert await raw_db.journal.count_documents({}) == entries


async def test_a_foreign_document_is_not_ours(store: MongoDBDurableTaskStore,
                                              raw_db: Raw) -> None:
    await store.get_header("warm-up")  # the store stamps the database first
    await raw_db.tasks.insert_one({"_id": "k", "name": "someone else's"})
    with pytest.raises(StoreSchemaError, match="not an agentium-graph-mongodb document"):
        await store.get_header("k")


async def test_an_unparsable_record_is_a_schema_error(store: MongoDBDurableTaskStore,
                                                      raw_db: Raw) -> None:
    fence = await _seeded(store)
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"nodes.a": "{not json"}})
    with pytest.raises(StoreSchemaError, match="cannot be parsed") as info:
        await store.get_task("k")
    assert "edited by hand" in str(info.value)
    store._cache.clear()  # as a fresh process would
    with pytest.raises(StoreSchemaError):
        await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"header.counters": "oops"}})
    with pytest.raises(StoreSchemaError):
        await store.get_header("k")


async def test_a_journal_missing_committed_entries_is_reported(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    fence = await _seeded(store)
    await store.commit(commit_request("k", fence, [ClaimNode(node_id="a")]))
    await raw_db.journal.delete_one({"_id": "k:2"})
    with pytest.raises(StoreSchemaError, match=r"missing committed entries \[2\]"):
        await store.read_timeline(TimelineRequest(key="k"))
    first = await store.read_timeline(TimelineRequest(key="k", limit=1))
    assert [e.kind for e in first] == ["task_created"]
