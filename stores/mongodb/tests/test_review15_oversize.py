"""Fifteenth review: a commit that would grow the task document over MongoDB's 16 MiB limit
is the same typed "too large" error on every server. mongod refuses it with 10334
(BSONObjectTooLarge); SecantusDB's findAndModify answers a generic InternalError (code 1,
"internal server error"), which the store used to report as an unexplained failure. The
first test failed before the fix on SecantusDB."""

from __future__ import annotations

from typing import Any

import pytest
from mongodb_helpers import acquire_request, commit_request, create_request
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure

from agentium_graph.errors import ErrorInfo, StoreError, StoreUnavailableError
from agentium_graph.store import SettleNode, StartAttempt, Step
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb._doc import TaskDoc

MiB = 1024 * 1024
LIMIT = 16 * MiB


def _failures(nodes: list[str], message: str) -> list[Step]:
    steps: list[Step] = []
    for node in nodes:
        steps += [StartAttempt(node_id=node, attempt_id=f"{node}-1"),
                  SettleNode(node_id=node, state="failed",
                             error=ErrorInfo(code="tool_error", message=message, node_id=node))]
    return steps


async def test_a_commit_that_grows_the_task_document_over_the_limit_is_too_large(
        store: MongoDBDurableTaskStore) -> None:
    # A task document just under the create limit, then 500 failed nodes: each keeps a
    # bounded (4 KiB) error inline, together well over the 1 MiB left to grow.
    nodes = [f"n{i}" for i in range(500)]
    await store.create_task(create_request("k", nodes, input_value="x" * (14 * MiB + MiB // 2),
                                           limits={"work_attempts": 10_000}))
    grant = await store.acquire_lease(acquire_request("k"))
    with pytest.raises(StoreError) as info:
        await store.commit(commit_request("k", grant.fence, _failures(nodes, "e" * 8192)))
    error = info.value
    assert not isinstance(error, StoreUnavailableError)  # not retried: it cannot pass
    assert error.details["reason"] == "document_too_large", str(error)
    assert error.details["limit_bytes"] == LIMIT
    assert "16 MiB" in str(error) and error.details["op"] == "commit"
    header = await store.get_header("k")
    assert header is not None and header.seq == grant.header.seq  # nothing was committed
    # The task stays usable: a commit that fits still goes through.
    await store.commit(commit_request("k", grant.fence, _failures(nodes[:1], "short")))


async def test_a_generic_internal_error_on_a_small_document_stays_generic(
        store: MongoDBDurableTaskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await store.create_task(create_request("k", ["a"]))
    fence = (await store.acquire_lease(acquire_request("k"))).fence

    async def internal(*args: Any, **kwargs: Any) -> Any:
        raise OperationFailure("internal server error", 1,
                               {"ok": 0.0, "errmsg": "internal server error", "code": 1,
                                "codeName": "InternalError"})
    monkeypatch.setattr(AsyncCollection, "find_one_and_update", internal)
    with pytest.raises(StoreError) as info:
        await store.commit(commit_request("k", fence, _failures(["a"], "boom")))
    assert info.value.details.get("reason") is None, str(info.value)
    assert info.value.details["server_code"] == 1
    assert "too large" not in str(info.value)


async def test_the_growth_measure_matches_the_server(
        store: MongoDBDurableTaskStore,
        raw_db: AsyncDatabase[dict[str, Any]]) -> None:
    await store.create_task(create_request("k", ["a", "b"]))
    raw = await raw_db.tasks.find_one({"_id": "k"})
    assert raw is not None
    doc = TaskDoc.from_raw(raw)
    sets: dict[str, Any] = {"nodes.a": "y" * 5000, "nodes.new": "z" * 300,
                            "header.seq": 12345678901, "header.error": "e" * 100}

    async def size() -> int:
        cursor = await raw_db.tasks.aggregate([
            {"$match": {"_id": "k"}}, {"$project": {"size": {"$bsonSize": "$$ROOT"}}}])
        return int((await cursor.to_list(1))[0]["size"])
    before = await size()
    await raw_db.tasks.update_one({"_id": "k"}, {"$set": sets})
    assert await size() - before == doc.growth(sets)
