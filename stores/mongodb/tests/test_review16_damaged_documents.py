"""Sixteenth review: task documents edited by hand, or written by someone else, into the
store's ``tasks`` collection. Each case failed before its fix:

* a document whose ``_id`` is not a string (an int, an ObjectId) is not a task: it sorted
  before the string keys and failed the first page of ``list_tasks``, and the CLI's
  ``list`` then went on after ``str(_id)``, silently skipping real tasks;
* ``header.key`` edited away from the ``_id``: the header was believed, so ``list``
  reported a key that does not exist and paged from it (skipping or repeating tasks);
* a field of the wrong type that pydantic's lax mode coerced (``header.fence: "1"``)
  parsed, but the store's queries compare exact values: ``renew_lease`` never matched and
  reported "kept racing other writers" as a retryable StoreUnavailableError, forever;
* ``writes`` that is not a list: a raw ``TypeError`` from ``create_task`` (a string was
  read as a list of letters and every write then failed on the server);
* every damaged-record error said only "1 problem(s): TypeError": now it names the field
  and the task's key (``details["key"]``, ``details["problem"]``).
"""

from __future__ import annotations

from typing import Any

import pytest
from bson import ObjectId
from mongodb_helpers import acquire_request, at, create_request
from pymongo.asynchronous.database import AsyncDatabase

from agentium_graph._cli_list import list_rows
from agentium_graph.errors import StoreSchemaError
from agentium_graph.store import (
    CancelTaskRequest,
    ListTasksRequest,
    RenewLeaseRequest,
    TaskHeader,
    TimelineRequest,
)
from agentium_graph_mongodb import MongoDBDurableTaskStore

Raw = AsyncDatabase[dict[str, Any]]
KEYS = ["1-a", "4-b", "7-c", "x"]


async def test_documents_whose_id_is_not_a_string_are_not_listed(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    for key in KEYS:
        await store.create_task(create_request(key))
    await raw_db.tasks.insert_many([{"_id": 5, "note": "someone else's"},
                                    {"_id": ObjectId(), "note": "someone else's"}])
    assert [h.key for h in await store.list_tasks(ListTasksRequest())] == KEYS
    paged: list[str] = []
    after = None
    while page := await store.list_tasks(ListTasksRequest(after=after, limit=1)):
        paged.append(page[0].key)
        after = page[0].key
    assert paged == KEYS
    # What the CLI's ``list`` shows: every task, nothing invented.
    rows = await list_rows(store, status=None, after=None, want=10)
    assert [r.key for r in rows] == KEYS and all(isinstance(r, TaskHeader) for r in rows)


async def test_a_header_whose_key_is_not_the_documents_is_damaged(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    for key in KEYS:
        await store.create_task(create_request(key))
    await raw_db.tasks.update_one({"_id": "4-b"}, {"$set": {"header.key": "zz"}})
    with pytest.raises(StoreSchemaError) as info:
        await store.get_header("4-b")
    assert info.value.details["key"] == "4-b"
    assert "header.key" in str(info.value)
    with pytest.raises(StoreSchemaError) as info:
        await store.list_tasks(ListTasksRequest())
    assert info.value.details["key"] == "4-b"
    rows = await list_rows(store, status=None, after=None, want=10)
    assert [r.key for r in rows] == KEYS
    assert [type(r).__name__ for r in rows] == ["TaskHeader", "DamagedTask", "TaskHeader",
                                                 "TaskHeader"]


async def test_a_coerced_type_is_damage_not_a_race(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    await store.create_task(create_request("k"))
    grant = await store.acquire_lease(acquire_request("k"))
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"header.lease.fence": "1"}})
    store._cache.clear()  # as a fresh process would
    with pytest.raises(StoreSchemaError) as info:
        await store.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=grant.fence,
                                                  ttl_seconds=30, now=at(2)))
    assert "header.lease.fence" in str(info.value), str(info.value)
    assert info.value.details["key"] == "k"
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"header.lease.fence": 1,
                                                          "header.seq": "2"}})
    with pytest.raises(StoreSchemaError, match=r"header\.seq"):
        await store.get_header("k")


@pytest.mark.parametrize("writes", [5, "abc", [1, 2]])
async def test_writes_that_are_not_a_list_of_tokens_are_damaged(
        store: MongoDBDurableTaskStore, raw_db: Raw, writes: Any) -> None:
    await store.create_task(create_request("k"))
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"writes": writes}})
    store._cache.clear()
    before = await raw_db.tasks.find_one({"_id": "k"})
    for call in (lambda: store.create_task(create_request("k")),
                 lambda: store.acquire_lease(acquire_request("k"))):
        with pytest.raises(StoreSchemaError) as info:
            await call()
        assert "writes" in str(info.value) and info.value.details["key"] == "k"
    assert await raw_db.tasks.find_one({"_id": "k"}) == before


EDITS: list[tuple[dict[str, Any], str]] = [
    ({"$unset": {"header.seq": 1}}, "header.seq"),
    ({"$set": {"header.status": "weird"}}, "header.status"),
    ({"$set": {"header": "oops"}}, "header"),
    ({"$unset": {"header": 1}}, "header"),
    ({"$set": {"header.counters": None}}, "header.counters"),
    ({"$set": {"nodes.a": "{not json"}}, "nodes.a"),
    ({"$set": {"nodes.a": 5}}, "nodes.a"),
    ({"$set": {"nodes": [1, 2]}}, "nodes"),
    ({"$unset": {"first_entry": 1}}, "first_entry"),
    ({"$set": {"header.journal_seq": "x"}}, "header.journal_seq"),
    ({"$set": {"header.error": 7}}, "header.error"),
    # (review 40) Fields a parse would fill in with a default: a completed task read as
    # pending ran again, a used fence was granted again, a counter restarted from zero.
    ({"$unset": {"header.fence": 1}}, "header.fence"),
    ({"$unset": {"header.status": 1}}, "header.status"),
    ({"$unset": {"header.journal_seq": 1}}, "header.journal_seq"),
    ({"$unset": {"header.counters.tool_calls": 1}}, "header.counters.tool_calls"),
]


@pytest.mark.parametrize(("edit", "field"), EDITS, ids=[f for _, f in EDITS])
async def test_a_damaged_record_error_names_the_field_and_the_task(
        store: MongoDBDurableTaskStore, raw_db: Raw, edit: dict[str, Any],
        field: str) -> None:
    await store.create_task(create_request("k"))
    await raw_db.tasks.update_one({"_id": "k"}, edit)
    store._cache.clear()
    calls = [lambda: store.get_task("k"), lambda: store.acquire_lease(acquire_request("k")),
             lambda: store.request_cancel(CancelTaskRequest(key="k", reason="r", now=at(1))),
             lambda: store.read_timeline(TimelineRequest(key="k"))]
    failed = 0
    for call in calls:
        try:
            await call()
        except StoreSchemaError as exc:
            failed += 1
            assert field in str(exc), str(exc)
            assert exc.details["key"] == "k", exc.details
            assert field in exc.details["problem"]
    assert failed


async def test_a_node_record_without_its_state_is_damaged(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    # (review 40) It read as pending: a completed node ran again.
    import json

    await store.create_task(create_request("k"))
    doc = await raw_db.tasks.find_one({"_id": "k"})
    assert doc is not None
    record = json.loads(doc["nodes"]["a"])
    del record["state"]
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": {"nodes.a": json.dumps(record)}})
    store._cache.clear()
    with pytest.raises(StoreSchemaError) as info:
        await store.get_task("k")
    assert "nodes.a.state is missing" in str(info.value) and info.value.details["key"] == "k"
