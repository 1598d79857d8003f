"""MongoDB store, found by review 26's chaos run (the stalled-call case is in
test_review19_mongodb_stalls.py):

* A journal document in a task's next slot under another ``_id`` (hand-made, or restored
  from elsewhere) made every commit of the task report "lost the compare-and-set race 20
  times in a row", a transient-looking StoreUnavailableError, for good.
* ``?compressors=zlibb`` (or a compressor whose module is not installed) was accepted with
  only pymongo's warning, and the client went on without compression.
* ``mongodb+srv://`` with an IP address passed construction and failed on the first call
  with a permanent StoreError (CLI exit 4, not the usage error 2 of every other bad URI).
"""

from __future__ import annotations

from typing import Any

import pytest
from mongodb_helpers import acquire_request, commit_request, create_request
from pymongo.asynchronous.database import AsyncDatabase

from agentium_graph.errors import ConfigurationError, StoreSchemaError
from agentium_graph.store import Charge
from agentium_graph_mongodb import MongoDBDurableTaskStore


async def test_a_foreign_document_in_the_next_journal_slot_is_named(
        store: MongoDBDurableTaskStore, raw_db: AsyncDatabase[dict[str, Any]]) -> None:
    await store.create_task(create_request("k"))
    grant = await store.acquire_lease(acquire_request("k"))
    header = await store.get_header("k")
    assert header is not None
    nxt = header.journal_seq + 1
    await raw_db.journal.insert_one({"_id": f"handmade-{nxt}", "k": "k", "s": nxt, "v": 1,
                                     "t": "x", "e": "{}"})
    with pytest.raises(StoreSchemaError) as info:
        await store.commit(commit_request("k", grant.fence, [
            Charge(admission_id="c1", charges={"tool_calls": 1})]))
    assert f"journal entry {nxt} is held by a document with _id 'handmade-{nxt}'" in \
        str(info.value)
    assert info.value.details == {"key": "k", "seq": nxt, "reason": "journal_slot_taken"}
    assert store.stats.cas_misses == 0
    after = await store.get_header("k")
    assert after is not None and after.counters.get("tool_calls", 0) == 0  # nothing charged


@pytest.mark.parametrize("uri", [
    "mongodb://127.0.0.1:1/?compressors=zlibb",
    "mongodb://127.0.0.1:1/?compressors=zlib,snapy",
])
def test_a_compressor_pymongo_would_drop_is_refused(uri: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MongoDBDurableTaskStore(uri, database="db")
    assert "'compressors'" in str(info.value)


def test_a_known_compressor_is_accepted() -> None:
    MongoDBDurableTaskStore("mongodb://127.0.0.1:1/?compressors=zlib", database="db")


@pytest.mark.parametrize("uri", ["mongodb+srv://10.1.2.3/db", "mongodb+srv://u:p@[::1]/db"])
def test_an_srv_uri_with_an_ip_address_is_refused_at_construction(uri: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MongoDBDurableTaskStore(uri)
    assert "not an IP address" in str(info.value)
    assert ":p@" not in str(info.value)  # the password stays out of the message
