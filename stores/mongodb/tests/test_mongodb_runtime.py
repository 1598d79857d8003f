"""End to end: ExecutionGraphRuntime on MongoDB with require_durable=True, including
recovery after an interrupted run, a cancel from another store handle, and hand-tampered
documents that inspect() must report instead of using."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mongodb_helpers import Tools
from pymongo.asynchronous.database import AsyncDatabase

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    TaskCanceledError,
)
from agentium_graph._canonical import digest_text
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb.testing import open_store

Raw = AsyncDatabase[dict[str, Any]]


def _ref(node: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": ["value"]}}


# Node ids with dots go through the whole runtime too (plans allow no "$" in ids).
PLAN: dict[str, Any] = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "src", "binding": "double", "version": "1", "args": {"x": 3}},
    {"id": "left.v1", "binding": "double", "version": "1", "args": {"x": _ref("src")}},
    {"id": "right.v2", "binding": "slow", "version": "1", "args": {"x": _ref("src")}},
    {"id": "join", "binding": "add", "version": "1",
     "args": {"values": [_ref("left.v1"), _ref("right.v2")]}},
]}


def _program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="fan", version="1", plan=PLAN)


async def test_a_graph_runs_durably_and_is_reused_by_a_fresh_store(
        mongodb_uri: str, mongodb_database: str) -> None:
    tools = Tools()
    async with open_store(mongodb_uri, mongodb_database) as store:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True)
        await runtime.create("job-1", _program(), input={"n": 1})
        result = await runtime.run("job-1", worker_id="w1")
        assert result.status == "completed"
        assert result.output["join"] == {"value": 12 + 7}
        assert store.stats.cas_misses == 0
    assert dict(tools.calls) == {"src": 1, "left.v1": 1, "right.v2": 1, "join": 1}

    async with open_store(mongodb_uri, mongodb_database) as reopened:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=reopened,
                                        require_durable=True)
        view = await runtime.inspect("job-1")
        assert view.status == "completed" and view.verified, view.problems
        assert view.nodes["right.v2"].output == {"value": 7}
        writes = reopened.stats.writes
        again = await runtime.run("job-1", worker_id="w2")
        assert again.output == result.output
        assert reopened.stats.writes == writes  # retained output: nothing written
        page = await runtime.timeline("job-1", limit=3)
        assert [e.seq for e in page.events] == [1, 2, 3]
    assert dict(tools.calls) == {"src": 1, "left.v1": 1, "right.v2": 1, "join": 1}


async def _completed(store: MongoDBDurableTaskStore, key: str, node: str) -> bool:
    snapshot = await store.get_task(key)
    return snapshot is not None and snapshot.nodes[node].state == "completed"


async def test_an_interrupted_run_recovers_without_rerunning_completed_nodes(
        mongodb_uri: str, mongodb_database: str) -> None:
    tools = Tools()
    tools.hold_slow = True
    store = open_store(mongodb_uri, mongodb_database)
    runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                    require_durable=True)
    await runtime.create("job-2", _program())
    run = asyncio.create_task(runtime.run("job-2", worker_id="w1"))
    await asyncio.wait_for(tools.slow_started.wait(), timeout=10)
    async with asyncio.timeout(10):  # "left.v1" runs beside it: let its completion land
        while not await _completed(store, "job-2", "left.v1"):
            pass
    run.cancel()  # the worker dies while "right.v2" runs
    await asyncio.gather(run, return_exceptions=True)
    await store.close()

    tools.hold_slow = False
    async with open_store(mongodb_uri, mongodb_database) as fresh:
        recovered = ExecutionGraphRuntime(catalog=tools.catalog(), store=fresh,
                                          require_durable=True)
        result = await recovered.run("job-2", worker_id="w1")
        assert result.output["join"] == {"value": 19}
        view = await recovered.inspect("job-2")
    assert tools.calls["src"] == 1 and tools.calls["left.v1"] == 1
    assert tools.calls["right.v2"] == 2  # interrupted once, re-run once
    assert tools.calls["join"] == 1
    fences = [a.fence for a in view.nodes["right.v2"].attempts]
    assert fences == sorted(fences) and fences[-1] > fences[0]
    assert view.verified


async def test_a_cancel_from_another_handle_stops_the_run(
        mongodb_uri: str, mongodb_database: str) -> None:
    tools = Tools()
    tools.hold_slow = True
    async with open_store(mongodb_uri, mongodb_database) as store, \
            open_store(mongodb_uri, mongodb_database) as operator_store:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True, poll_interval=0.05)
        operator = ExecutionGraphRuntime(catalog=tools.catalog(), store=operator_store)
        await runtime.create("job-3", _program())
        run = asyncio.create_task(runtime.run("job-3", worker_id="w1"))
        await asyncio.wait_for(tools.slow_started.wait(), timeout=10)
        await operator.cancel("job-3", reason="operator says stop")
        outcome = await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)
        assert isinstance(outcome[0], TaskCanceledError), outcome
        view = await operator.inspect("job-3")
    assert view.status == "canceled" and view.verified
    assert view.nodes["src"].state == "completed"


async def test_tampered_documents_are_reported_by_inspect(
        mongodb_uri: str, mongodb_database: str, raw_db: Raw) -> None:
    tools = Tools()
    async with open_store(mongodb_uri, mongodb_database) as store:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True)
        await runtime.create("job-4", _program())
        await runtime.run("job-4", worker_id="w1")
        clean = await runtime.inspect("job-4")
        assert clean.verified and clean.problems == ()

        # 1. Someone edits an output blob by hand.
        left_digest = clean.nodes["left.v1"].output_digest
        assert left_digest is not None
        await raw_db.blobs.update_one({"_id": left_digest},
                                      {"$set": {"body": '{"value":999}'}})
        view = await runtime.inspect("job-4")
        assert not view.verified
        assert any("left.v1" in p and "does not match its digest" in p for p in view.problems)

        # 2. Someone points a node at another output digest.
        task = await raw_db.tasks.find_one({"_id": "job-4"})
        assert task is not None
        record = json.loads(task["nodes"]["right%2Ev2"])
        record["output_digest"] = digest_text('{"value":1}')
        await raw_db.tasks.update_one({"_id": "job-4"},
                                      {"$set": {"nodes.right%2Ev2": json.dumps(record)}})
        view = await runtime.inspect("job-4")
        assert any("right.v2" in p and "missing" in p for p in view.problems), view.problems

        # 3. Someone edits the pinned identity.
        identity = json.loads(task["identity"])
        identity["input"] = {"forged": True}
        await raw_db.tasks.update_one({"_id": "job-4"},
                                      {"$set": {"identity": json.dumps(identity)}})
        view = await runtime.inspect("job-4")
        assert not view.verified
        assert any("identity" in p for p in view.problems), view.problems
