"""Regressions from a review: one store used from several event loops and threads, "too
large" failures typed with bounded messages, huge error texts that must not make a task
document unwritable, racing first opens of a fresh database, and construction-time
validation."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from bson.raw_bson import RawBSONDocument
from mongodb_helpers import acquire_request, commit_request, create_request
from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    DocumentTooLarge,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from agentium_graph import ExecutionGraphProgram, ExecutionGraphRuntime, HostCatalog, ToolBinding
from agentium_graph._canonical import digest_text
from agentium_graph.errors import (
    ConfigurationError,
    ErrorInfo,
    NodeFailedError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
)
from agentium_graph.store import SettleNode, StartAttempt
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb import _store as store_module
from agentium_graph_mongodb._client import _redact
from agentium_graph_mongodb._errors import map_mongo_error
from agentium_graph_mongodb.testing import free_port, open_store

MiB = 1024 * 1024
MESSAGE_CAP = 2000  # every message built from a driver error stays under this


# --- 1. one store, many event loops ---------------------------------------------------------

async def _echo(args: dict[str, Any]) -> dict[str, Any]:
    return dict(args)


def _runtime(store: MongoDBDurableTaskStore) -> ExecutionGraphRuntime:
    catalog = HostCatalog([ToolBinding(id="echo", version="1", execute=_echo,
                                       recovery="pure")])
    return ExecutionGraphRuntime(catalog=catalog, store=store, require_durable=True)


def _program(nodes: int = 2) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": f"n{i}", "binding": "echo", "version": "1", "args": {"x": i}}
            for i in range(nodes)]})


@pytest.fixture
def created_clients(monkeypatch: pytest.MonkeyPatch) -> list[AsyncMongoClient[Any]]:
    """Every client the stores of a test create from a URI."""
    made: list[AsyncMongoClient[Any]] = []
    original = store_module._client_from_uri

    def spy(*args: Any, **kwargs: Any) -> AsyncMongoClient[Any]:
        client = original(*args, **kwargs)
        made.append(client)
        return client
    monkeypatch.setattr(store_module, "_client_from_uri", spy)
    return made


def test_the_sync_wrappers_use_a_new_event_loop_each_time(
        mongodb_uri: str, mongodb_database: str,
        created_clients: list[AsyncMongoClient[Any]]) -> None:
    store = open_store(mongodb_uri, mongodb_database)
    runtime = _runtime(store)
    runtime.create_sync("k", _program())
    result = runtime.run_sync("k", "w1")
    assert result.status == "completed" and result.output["n1"] == {"x": 1}
    assert runtime.inspect_sync("k").verified
    runtime.create_sync("c", _program())
    assert runtime.cancel_sync("c", reason="stop").status == "canceled"
    asyncio.run(store.close())  # from yet another loop: no error, nothing leaks
    assert len(created_clients) >= 2
    assert all(client._closed for client in created_clients)  # each closed on its own loop
    with pytest.raises(StoreError, match="is closed"):
        asyncio.run(store.get_header("k"))


def test_one_store_serves_several_threads_at_once(
        mongodb_uri: str, mongodb_database: str,
        created_clients: list[AsyncMongoClient[Any]]) -> None:
    store = open_store(mongodb_uri, mongodb_database)
    barrier = threading.Barrier(4)

    def work(i: int) -> str:
        async def main() -> str:
            runtime = _runtime(store)
            barrier.wait()  # all four threads start their loops before any I/O
            await runtime.create(f"k{i}", _program(3))
            return (await runtime.run(f"k{i}", f"w{i}")).status
        return asyncio.run(main())

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(work, range(4))) == ["completed"] * 4

    async def check() -> None:
        headers = [await store.get_header(f"k{i}") for i in range(4)]
        assert [h.status for h in headers if h is not None] == ["completed"] * 4
        await store.close()
    asyncio.run(check())
    assert created_clients and all(client._closed for client in created_clients)


def test_close_from_another_loop_while_the_first_one_still_runs(
        mongodb_uri: str, mongodb_database: str,
        created_clients: list[AsyncMongoClient[Any]]) -> None:
    store = open_store(mongodb_uri, mongodb_database)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(store.get_header("k")) is None
        asyncio.run(store.close())  # another loop: must neither raise nor touch the client
        with pytest.raises(StoreError, match="is closed"):
            loop.run_until_complete(store.get_header("k"))
        loop.run_until_complete(store.close())  # on the client's own loop: closes it
        assert all(client._closed for client in created_clients)
    finally:
        loop.close()


def test_a_given_client_is_refused_on_another_event_loop(mongodb_uri: str,
                                                         mongodb_database: str) -> None:
    loop = asyncio.new_event_loop()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri)
    store = MongoDBDurableTaskStore(client, database=mongodb_database)
    try:
        assert loop.run_until_complete(store.get_header("k")) is None
        with pytest.raises(ConfigurationError, match="URI") as info:
            asyncio.run(store.get_header("k"))
        assert "event loop" in str(info.value)
        asyncio.run(store.close())  # closing never raises (the caller owns the client)
    finally:
        loop.run_until_complete(client.close())
        loop.close()


# --- 2. "too large": typed, bounded, and a failing node can always be recorded ---------------

HUGE = "x" * (17 * MiB)


@pytest.mark.parametrize("error", [
    BulkWriteError({"writeErrors": [{"index": 0, "code": 10334, "errmsg": "too large",
                                     "op": {"_id": "d", "body": HUGE}}],
                    "writeConcernErrors": []}),
    ClientBulkWriteException({"error": None, "writeErrors": [
        {"idx": 0, "code": 10334, "errmsg": "too large",
         "op": {"insert": 0, "document": {"body": HUGE}}}], "writeConcernErrors": []}, False),
    OperationFailure("Resulting document after update is larger than 16777216 " + HUGE, 17419),
    OperationFailure("BSONObjectTooLarge " + HUGE, 10334),
    DocumentTooLarge("BSON document too large " + HUGE),
], ids=["bulk-10334", "client-bulk-10334", "op-17419", "op-10334", "client-side"])
def test_too_large_is_classified_and_its_message_bounded(error: Exception) -> None:
    mapped = map_mongo_error(error, "commit", "database 'x'")  # type: ignore[arg-type]
    assert type(mapped) is StoreError
    assert "16 MiB" in str(mapped) and len(str(mapped)) <= MESSAGE_CAP
    assert mapped.details.get("reason") == "document_too_large"


@pytest.mark.parametrize("error", [
    OperationFailure("bad value " + HUGE, 2),
    BulkWriteError({"writeErrors": [{"index": 0, "code": 2, "errmsg": HUGE}]}),
    OperationFailure("shutting down " + HUGE, 91),
])
def test_every_message_built_from_a_driver_error_is_bounded(error: Exception) -> None:
    mapped = map_mongo_error(error, "commit", "database 'x'")  # type: ignore[arg-type]
    assert len(str(mapped)) <= MESSAGE_CAP
    assert all(len(str(v)) <= MESSAGE_CAP for v in mapped.details.values())


async def test_a_blob_over_the_document_limit_is_a_typed_bounded_error(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    grant = await store.acquire_lease(acquire_request("k"))
    fence = grant.fence
    text = '"' + "x" * (17 * MiB) + '"'
    with pytest.raises(StoreError) as info:
        await store.commit(commit_request("k", fence, [
            StartAttempt(node_id="a", attempt_id="a1"),
            SettleNode(node_id="a", state="completed", output_digest=digest_text(text))],
            blobs={digest_text(text): text}))
    assert not isinstance(info.value, StoreUnavailableError)
    assert "16 MiB" in str(info.value) and len(str(info.value)) <= MESSAGE_CAP
    header = await store.get_header("k")
    assert header is not None and header.seq == grant.header.seq  # nothing was committed


def test_the_capabilities_give_a_blob_limit_below_the_document_limit() -> None:
    store = MongoDBDurableTaskStore("mongodb://localhost", database="x")
    limit = store.capabilities.max_blob_bytes
    assert isinstance(limit, int) and 15 * MiB <= limit < 16 * MiB


async def test_an_output_over_the_blob_limit_fails_its_node_once(
        store: MongoDBDurableTaskStore) -> None:
    calls = 0

    async def big(args: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {"blob": "x" * (17 * MiB)}
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([ToolBinding(
        id="big", version="1", execute=big, recovery="pure")]), store=store,
        require_durable=True)
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "b", "binding": "big", "version": "1", "args": {}}]}))
    for _ in range(2):  # the second run finds the task settled: the tool is not re-run
        with pytest.raises(NodeFailedError) as info:
            await runtime.run("k", "w1")
        assert len(str(info.value)) < 10_000
    view = await runtime.inspect("k")
    assert view.status == "failed" and view.nodes["b"].state == "failed"
    assert calls == 1


async def test_huge_error_texts_never_make_the_task_document_unwritable(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k", ["a", "b", "c", "d"]))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    message = "e" * (5 * MiB)
    for node in "abcd":  # 4 x 5 MiB inline would be far over 16 MiB
        await store.commit(commit_request("k", fence, [
            StartAttempt(node_id=node, attempt_id=f"{node}1"),
            SettleNode(node_id=node, state="failed",
                       error=ErrorInfo(code="tool_error", message=message, node_id=node,
                                       details={"blob": message}))]))
    snapshot = await store.get_task("k")
    assert snapshot is not None
    for node in "abcd":
        record = snapshot.nodes[node]
        assert record.state == "failed" and record.error is not None
        assert record.error.code == "tool_error" and record.error.node_id == node
        assert record.error.message.startswith("eeee")  # bounded here or by ErrorInfo itself
        assert len(record.error.message) < 100_000
        assert str(record.error.details["blob"]).startswith("eeee")
        assert "truncated" in str(record.error.details["blob"])
        assert len(str(record.error.details["blob"])) < 100_000
    small = ErrorInfo(code="tool_error", message="short", details={"n": 1})
    await store.create_task(create_request("s"))
    fence = (await store.acquire_lease(acquire_request("s"))).fence
    await store.commit(commit_request("s", fence, [
        StartAttempt(node_id="a", attempt_id="a1"),
        SettleNode(node_id="a", state="failed", error=small)]))
    snapshot = await store.get_task("s")
    assert snapshot is not None and snapshot.nodes["a"].error == small  # small ones exact


# --- 3. concurrent first use of a fresh database ---------------------------------------------

async def test_racing_first_opens_of_a_fresh_database(mongodb_uri: str,
                                                      mongodb_server: Any) -> None:
    for trial in range(20):
        name = f"agt_race_{free_port()}_{trial}"
        stores = [open_store(mongodb_uri, name) for _ in range(6)]
        try:
            found = await asyncio.gather(*[s.get_header("x") for s in stores],
                                         return_exceptions=True)
            assert found == [None] * 6, [repr(f)[:300] for f in found]
        finally:
            for s in stores:
                await s.close()
            mongodb_server.drop_database(name)


async def test_a_foreign_meta_document_is_still_refused(store: MongoDBDurableTaskStore,
                                                        raw_db: Any) -> None:
    await raw_db.meta.insert_one({"_id": "agentium-graph-mongodb", "name": "not ours"})
    with pytest.raises(StoreSchemaError, match="not an agentium-graph-mongodb document"):
        await store.get_header("x")


# --- 4. construction refuses bad arguments with ConfigurationError naming them ---------------

@pytest.mark.parametrize(("kwargs", "named"), [
    ({"socket_timeout_s": float("inf")}, "socket_timeout_s"),
    ({"connect_timeout_s": float("nan")}, "connect_timeout_s"),
    ({"server_selection_timeout_s": 1e300}, "server_selection_timeout_s"),
    ({"socket_timeout_s": "5"}, "socket_timeout_s"),
    ({"retry_max_wait_s": True}, "retry_max_wait_s"),
    ({"retries": "3"}, "retries"),
    ({"retries": 1.5}, "retries"),
    ({"retries": True}, "retries"),
    ({"cache_size": "5"}, "cache_size"),
    ({"cas_attempts": 2.0}, "cas_attempts"),
    ({"database": "d" * 64}, "database"),
    ({"database": "a*b"}, "database"),
    ({"database": "a:b"}, "database"),
    ({"database": "a|b"}, "database"),
    ({"database": "é" * 32}, "database"),  # 64 bytes in UTF-8
    ({"database": 5}, "database"),
    ({"write_concern": "majority"}, "write_concern"),
])
def test_bad_arguments_are_configuration_errors_naming_them(kwargs: dict[str, Any],
                                                            named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        MongoDBDurableTaskStore("mongodb://localhost", **kwargs)


def test_longest_valid_database_name_is_accepted() -> None:
    assert MongoDBDurableTaskStore("mongodb://localhost",
                                   database="d" * 63).database_name == "d" * 63


@pytest.mark.parametrize("uri", ["mongodb://[::1/", "mongodb://user:S3CRET@[::1/"])
def test_an_unparsable_uri_is_a_configuration_error(uri: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid MongoDB URI") as info:
        MongoDBDurableTaskStore(uri, database="x")
    assert "S3CRET" not in str(info.value) and "S3CRET" not in repr(info.value.details)


async def test_a_raw_bson_client_is_refused_at_construction(mongodb_uri: str) -> None:
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongodb_uri,
                                                     document_class=RawBSONDocument)
    try:
        with pytest.raises(ConfigurationError, match="document_class"):
            MongoDBDurableTaskStore(client, database="x")
    finally:
        await client.close()


# --- 5. redaction ------------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "shown"), [
    ("mongodb://user@h/", "mongodb://user@h/"),
    ("mongodb://user:pw@h/", "mongodb://user:***@h/"),
    ("mongodb://user:@h/", "mongodb://user:***@h/"),
    ("mongodb://h:27017/db?tls=true", "mongodb://h:27017/db"),
])
def test_redaction_shows_a_password_only_when_there_is_one(uri: str, shown: str) -> None:
    assert _redact(uri) == shown


# --- 6. failing fast -----------------------------------------------------------------------------

async def test_retries_zero_fails_after_one_attempt(
        mongodb_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a one-shot caller (the CLI) passes to report an unreachable server after one
    server-selection timeout instead of retrying."""
    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ServerSelectionTimeoutError("no servers")
    monkeypatch.setattr(AsyncCollection, "find_one", unreachable)  # a read only reads
    store = MongoDBDurableTaskStore(mongodb_uri, database="nowhere", retries=0)
    try:
        with pytest.raises(StoreUnavailableError) as info:
            await store.get_header("k")
    finally:
        await store.close()
    assert info.value.details["attempts"] == 1 and store.stats.transient_retries == 0
