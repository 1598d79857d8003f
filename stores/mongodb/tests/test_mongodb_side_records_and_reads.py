"""Regressions from a second review: a compare-and-set retried after a transient failure
must never commit a task that points at side records (blobs, journal entries) the server
lost; reads only read (a user with MongoDB's ``read`` role can inspect tasks, a mistyped
database name is never created); malformed URI options are refused; a new task document
that leaves no room for its records is refused at create."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from mongodb_helpers import acquire_request, commit_request, create_request
from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import AutoReconnect
from pymongo.monitoring import (
    CommandFailedEvent,
    CommandListener,
    CommandStartedEvent,
    CommandSucceededEvent,
)

from agentium_graph._canonical import digest_text
from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
)
from agentium_graph.store import (
    ListTasksRequest,
    SettleNode,
    StartAttempt,
    TimelineRequest,
)
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb.testing import free_port, open_store

MiB = 1024 * 1024
Raw = Any  # AsyncDatabase[dict[str, Any]] of the test's database (the raw_db fixture)
WRITES = {"insert", "update", "delete", "findAndModify", "createIndexes", "create",
          "bulkWrite", "drop", "dropDatabase"}


async def _started(store: MongoDBDurableTaskStore) -> tuple[int, int]:
    """A task "k" with node "a" started under a lease: (fence, committed journal_seq)."""
    await store.create_task(create_request("k", ["a", "b"]))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    result = await store.commit(commit_request("k", fence, [
        StartAttempt(node_id="a", attempt_id="1")]))
    return fence, result.header.journal_seq


def _settle(fence: int, output: str) -> Any:
    return commit_request("k", fence, [
        SettleNode(node_id="a", state="completed", output_digest=digest_text(output)),
        StartAttempt(node_id="b", attempt_id="2", requires_completed=("a",))],
        blobs={digest_text(output): output})


async def _assert_intact(store: MongoDBDurableTaskStore, output: str) -> None:
    """Everything the committed task points at is there."""
    snapshot = await store.get_task("k")
    assert snapshot is not None and snapshot.nodes["a"].output_digest == digest_text(output)
    assert await store.get_blobs([digest_text(output)]) == {digest_text(output): output}
    header = snapshot.header
    entries = await store.read_timeline(TimelineRequest(key="k", limit=1000))
    assert [e.seq for e in entries] == list(range(1, header.journal_seq + 1))


# --- 1. side records lost in a crash between their insert and the compare-and-set -------------

async def test_a_cas_retried_after_a_failure_first_inserts_its_side_records_again(
        store: MongoDBDurableTaskStore, raw_db: Raw, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server acknowledges the blob and journal inserts, then crashes and comes back
    without them (j=False, a rollback, a server ignoring j): the compare-and-set's first
    attempt fails on the broken connection. Retrying it alone would commit a task whose
    output blob and journal entries are gone."""
    fence, committed = await _started(store)
    real = AsyncCollection.find_one_and_update
    armed = [True]

    async def crash_before_cas(self: AsyncCollection[Any], query: Any, *args: Any,
                               **kwargs: Any) -> Any:
        if armed[0] and self.name == "tasks" and "header.seq" in query:
            armed[0] = False
            await raw_db.blobs.delete_many({})
            await raw_db.journal.delete_many({"k": "k", "s": {"$gt": committed}})
            raise AutoReconnect("connection reset: the server restarted")
        return await real(self, query, *args, **kwargs)
    monkeypatch.setattr(AsyncCollection, "find_one_and_update", crash_before_cas)
    before = store.stats
    await store.commit(_settle(fence, '{"value":1}'))
    assert not armed[0] and (store.stats - before).transient_retries >= 1
    await _assert_intact(store, '{"value":1}')


async def test_a_failure_during_the_side_inserts_redoes_them_all(
        store: MongoDBDurableTaskStore, raw_db: Raw, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal insert is acknowledged, then the server restarts (losing it) while the
    concurrent blob insert fails and is retried: the journal entries must be inserted again
    before the compare-and-set, not only the insert that failed."""
    fence, committed = await _started(store)
    real = AsyncCollection.insert_many
    armed = [True]
    journal_acked = asyncio.Event()

    async def crash_in_side_inserts(self: AsyncCollection[Any], docs: Any, *args: Any,
                                    **kwargs: Any) -> Any:
        result = await real(self, docs, *args, **kwargs)
        if self.name == "journal":
            journal_acked.set()
        elif armed[0] and self.name == "blobs":
            armed[0] = False
            await asyncio.wait_for(journal_acked.wait(), timeout=10)
            await raw_db.journal.delete_many({"k": "k", "s": {"$gt": committed}})
            raise AutoReconnect("connection reset: the server restarted")
        return result
    monkeypatch.setattr(AsyncCollection, "insert_many", crash_in_side_inserts)
    await store.commit(_settle(fence, '{"value":2}'))
    assert not armed[0]
    await _assert_intact(store, '{"value":2}')


async def test_a_create_retried_after_a_failure_inserts_its_blobs_again(
        store: MongoDBDurableTaskStore, raw_db: Raw, monkeypatch: pytest.MonkeyPatch) -> None:
    real = AsyncCollection.insert_one
    armed = [True]

    async def crash_before_insert(self: AsyncCollection[Any], doc: Any, *args: Any,
                                  **kwargs: Any) -> Any:
        if armed[0] and self.name == "tasks":
            armed[0] = False
            await raw_db.blobs.delete_many({})
            raise AutoReconnect("connection reset: the server restarted")
        return await real(self, doc, *args, **kwargs)
    monkeypatch.setattr(AsyncCollection, "insert_one", crash_before_insert)
    text = '{"plan":1}'
    request = create_request("k").model_copy(update={"blobs": {digest_text(text): text}})
    assert (await store.create_task(request)).created
    assert not armed[0]
    assert await store.get_blobs([digest_text(text)]) == {digest_text(text): text}


async def test_a_cas_that_keeps_failing_is_bounded_and_typed(
        mongodb_uri: str, mongodb_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database, retries=2,
                          retry_max_wait_s=0.001) as store:
        fence, _ = await _started(store)
        real = AsyncCollection.find_one_and_update

        async def always_failing(self: AsyncCollection[Any], query: Any, *args: Any,
                                 **kwargs: Any) -> Any:
            if self.name == "tasks" and "header.seq" in query:
                raise AutoReconnect("connection reset")
            return await real(self, query, *args, **kwargs)
        monkeypatch.setattr(AsyncCollection, "find_one_and_update", always_failing)
        with pytest.raises(StoreUnavailableError) as info:
            await store.commit(_settle(fence, '{"value":3}'))
        assert "stays recoverable" in str(info.value)
        monkeypatch.undo()
        await store.commit(_settle(fence, '{"value":3}'))  # recovers once the server does
        await _assert_intact(store, '{"value":3}')


async def test_missing_journal_entries_are_not_blamed_on_hands_alone(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    await _started(store)
    await raw_db.journal.delete_one({"k": "k", "s": 2})
    with pytest.raises(StoreSchemaError) as info:
        await store.read_timeline(TimelineRequest(key="k"))
    assert "lost acknowledged writes" in str(info.value)
    assert info.value.details["missing"] == [2]


def test_a_store_owned_client_leaves_retries_to_the_store(mongodb_uri: str) -> None:
    store = MongoDBDurableTaskStore(mongodb_uri)
    assert store._spare is not None and store._spare.options.retry_writes is False
    given = MongoDBDurableTaskStore(f"{mongodb_uri}&retryWrites=true")
    assert given._spare is not None and given._spare.options.retry_writes is True


# --- 2. and 3. reads only read -------------------------------------------------------------

class _Commands(CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass


@pytest.fixture
async def watched(mongodb_uri: str) -> AsyncIterator[tuple[AsyncMongoClient[Any], _Commands]]:
    commands = _Commands()
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongodb_uri, event_listeners=[commands])
    try:
        yield client, commands
    finally:
        await client.close()


async def _read_everything(store: MongoDBDurableTaskStore, key: str = "k") -> None:
    assert await store.get_header(key) is not None
    assert await store.get_task(key) is not None
    assert await store.get_identity(key) is not None
    assert [h.key for h in await store.list_tasks(ListTasksRequest())] == [key]
    assert await store.read_timeline(TimelineRequest(key=key))
    await store.get_blobs(["sha256:none"])


@pytest.mark.parametrize("read_only", [False, True], ids=["writing-store", "read-only"])
async def test_reads_send_no_write_command(
        store: MongoDBDurableTaskStore, mongodb_database: str, read_only: bool,
        watched: tuple[AsyncMongoClient[Any], _Commands]) -> None:
    """So a user with only MongoDB's read role can list, inspect and read timelines."""
    await _started(store)
    client, commands = watched
    reader = MongoDBDurableTaskStore(client, database=mongodb_database, read_only=read_only)
    await _read_everything(reader)
    assert commands.names and not set(commands.names) & WRITES, commands.names


async def _databases(uri: str) -> list[str]:
    client: AsyncMongoClient[Any] = AsyncMongoClient(uri)
    try:
        return await client.list_database_names()
    finally:
        await client.close()


async def test_reads_of_a_fresh_database_create_nothing(mongodb_uri: str,
                                                        mongodb_server: Any) -> None:
    name = f"agt_fresh_{free_port()}"
    try:
        async with open_store(mongodb_uri, name) as store:
            assert await store.get_header("k") is None
            assert await store.list_tasks(ListTasksRequest()) == []
            assert name not in await _databases(mongodb_uri)
            await store.create_task(create_request("k"))  # the first write creates it
            assert name in await _databases(mongodb_uri)
            assert await store.get_header("k") is not None
    finally:
        mongodb_server.drop_database(name)


@pytest.mark.parametrize("options", [{"read_only": True}, {"create": False}],
                         ids=["read_only", "create-False"])
async def test_a_database_without_a_store_is_refused_and_left_uncreated(
        mongodb_uri: str, mongodb_server: Any, options: dict[str, bool]) -> None:
    name = f"agt_typo_{free_port()}"
    try:
        async with open_store(mongodb_uri, name, **options) as store:
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: store.get_header("k"), lambda: store.list_tasks(ListTasksRequest()),
                lambda: store.read_timeline(TimelineRequest(key="k"))]
            if not options.get("read_only"):
                calls += [lambda: store.create_task(create_request("k")),
                          lambda: store.acquire_lease(acquire_request("k"))]
            for call in calls:
                with pytest.raises(StoreError) as info:
                    await call()
                assert info.value.details["reason"] == "no_store"
                assert "check the database name" in str(info.value) and name in str(info.value)
        assert name not in await _databases(mongodb_uri)
    finally:
        mongodb_server.drop_database(name)


async def test_a_read_only_store_reads_and_refuses_every_write_without_io(
        store: MongoDBDurableTaskStore, mongodb_uri: str, mongodb_database: str) -> None:
    fence, _ = await _started(store)
    async with open_store(mongodb_uri, mongodb_database, read_only=True) as reader:
        assert reader.read_only and "read_only=True" in repr(reader)
        await _read_everything(reader)
        before = reader.stats
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: reader.create_task(create_request("other")),
            lambda: reader.acquire_lease(acquire_request("k", worker="w2")),
            lambda: reader.commit(_settle(fence, "{}"))]
        for call in calls:
            with pytest.raises(StoreError, match="opened read-only"):
                await call()
        assert (reader.stats - before).round_trips == 0
    async with open_store(mongodb_uri, mongodb_database, create=False) as writer:
        await writer.commit(_settle(fence, '{"value":4}'))  # an existing store: writes


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_read_only_and_create_must_be_booleans(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="read_only and create"):
        MongoDBDurableTaskStore("mongodb://localhost", read_only=value)


# --- 4. malformed URI options ----------------------------------------------------------------

@pytest.mark.parametrize("query", ["serverSelectionTimeoutMS=abc", "serverSelectionTimeoutMS=5s",
                                   "connectTimeoutMS=soon", "serverSelectionTimoutMS=100"])
def test_a_malformed_or_unknown_uri_option_is_refused_at_construction(query: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MongoDBDurableTaskStore(f"mongodb://127.0.0.1:1/?directConnection=true&{query}")
    assert info.value.details["argument"] == "uri_or_client"
    assert query.partition("=")[0].lower() in str(info.value).lower()


# --- 5. a new task document must leave room for its records -----------------------------------

async def test_a_create_that_leaves_no_room_to_progress_is_refused(
        store: MongoDBDurableTaskStore, raw_db: Raw) -> None:
    text = '{"x":1}'
    request = create_request("big", input_value="x" * (15 * MiB + MiB // 2)).model_copy(
        update={"blobs": {digest_text(text): text}})
    with pytest.raises(StoreError) as info:
        await store.create_task(request)
    details = info.value.details
    assert details["reason"] == "document_too_large" and details["key"] == "big"
    assert details["size_bytes"] > details["limit_bytes"] == 15 * MiB
    assert "keep them smaller" in str(info.value)
    assert await raw_db.tasks.count_documents({}) == 0
    assert await raw_db.blobs.count_documents({}) == 0


async def test_a_large_create_under_the_limit_can_still_progress(
        store: MongoDBDurableTaskStore) -> None:
    await store.create_task(create_request("k", ["a", "b"], input_value="x" * (14 * MiB)))
    fence = (await store.acquire_lease(acquire_request("k"))).fence
    await store.commit(commit_request("k", fence, [StartAttempt(node_id="a", attempt_id="1")]))
    await store.commit(_settle(fence, '{"value":5}'))


@pytest.mark.parametrize("read_only", [True, False], ids=["list-inspect-timeline", "cancel"])
async def test_the_clis_store_of_a_mistyped_database_creates_nothing(
        mongodb_uri: str, mongodb_server: Any, read_only: bool) -> None:
    # How the CLI opens a store (agentium_graph._store_uri): read_only for its reading
    # commands, must_exist (create=False) for cancel and resolve.
    from agentium_graph._store_uri import open_store_uri

    name = f"agt_cli_typo_{free_port()}"
    try:
        store = open_store_uri(mongodb_uri, database=name, must_exist=True,
                               read_only=read_only)
        try:
            with pytest.raises(StoreError) as info:
                await store.list_tasks(ListTasksRequest())
            assert info.value.details["reason"] == "no_store"
            if not read_only:
                with pytest.raises(StoreError):
                    await store.create_task(create_request("k"))
        finally:
            await store.close()
        assert name not in await _databases(mongodb_uri)
    finally:
        mongodb_server.drop_database(name)
