"""Driver failures: the mapping table, bounded retries, and proof that no raw pymongo or
bson exception ever leaves the store."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from bson.errors import InvalidBSON, InvalidDocument
from mongodb_helpers import acquire_request, at, commit_request, create_request
from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ClientBulkWriteException,
    CollectionInvalid,
    ConnectionFailure,
    CursorNotFound,
    DocumentTooLarge,
    DuplicateKeyError,
    EncryptionError,
    ExecutionTimeout,
    InvalidName,
    InvalidOperation,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ProtocolError,
    PyMongoError,
    ServerSelectionTimeoutError,
    WaitQueueTimeoutError,
    WriteConcernError,
    WTimeoutError,
)
from pymongo.errors import ConfigurationError as DriverConfigurationError

from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreUnavailableError,
)
from agentium_graph.store import (
    CancelTaskRequest,
    ClaimNode,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TimelineRequest,
)
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb._errors import TransientStoreError, map_mongo_error
from agentium_graph_mongodb.testing import open_store

TRANSIENT: list[BaseException] = [
    AutoReconnect("connection reset"),
    NetworkTimeout("timed out"),
    NotPrimaryError("not primary", {"code": 10107}),
    ServerSelectionTimeoutError("no servers"),
    ConnectionFailure("refused"),
    WaitQueueTimeoutError("pool exhausted"),
    *(OperationFailure("transient", code) for code in (6, 7, 89, 91, 189, 262, 9001, 10107,
                                                       11600, 11602, 13435, 13436)),
    WriteConcernError("shutdown", 91),
    WTimeoutError("waiting for replication timed out", 64),
    ExecutionTimeout("time limit", 50),
    OperationFailure("labelled", 999, {"errorLabels": ["RetryableWriteError"]}),
    BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 91}]}),
    ClientBulkWriteException({"error": AutoReconnect("reset"), "writeErrors": [],
                              "writeConcernErrors": []}, False),
    ClientBulkWriteException({"writeErrors": [], "writeConcernErrors": [{"code": 189}]},
                             False),
]
PERMANENT: list[BaseException] = [
    OperationFailure("auth failed", 18),
    OperationFailure("unauthorized", 13),
    OperationFailure("bad value", 2),
    WriteConcernError("unsatisfiable", 100),
    DocumentTooLarge("too large"),
    InvalidDocument("cannot encode"),
    InvalidBSON("corrupt"),
    InvalidOperation("client closed"),
    DuplicateKeyError("E11000", 11000),
    BulkWriteError({"writeErrors": [{"index": 0, "code": 10334}]}),
    BulkWriteError({"writeErrors": [{"index": 0, "code": 11000}],
                    "writeConcernErrors": [{"code": 100}]}),
    ClientBulkWriteException({"writeErrors": [{"idx": 0, "code": 10334}],
                              "writeConcernErrors": []}, False),
    ClientBulkWriteException({"error": OperationFailure("auth", 18), "writeErrors": [],
                              "writeConcernErrors": []}, False),
    CursorNotFound("cursor gone", 43),
    ProtocolError("bad reply"),
    DriverConfigurationError("bad option"),
    InvalidName("bad name"),
    EncryptionError(ValueError("no key")),
    CollectionInvalid("invalid"),
    PyMongoError("anything else"),
    OverflowError("MongoDB can only handle up to 8-byte ints"),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: f"{type(e).__name__}"
                         f"-{getattr(e, 'code', '')}")
def test_transient_errors_are_retryable(error: PyMongoError) -> None:
    mapped = map_mongo_error(error, "commit", "database 'x'")
    assert isinstance(mapped, TransientStoreError)
    assert mapped.details["op"] == "commit" and mapped.details["driver_error"]


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: f"{type(e).__name__}"
                         f"-{getattr(e, 'code', '')}")
def test_permanent_errors_are_store_errors_that_are_not_retried(error: PyMongoError) -> None:
    mapped = map_mongo_error(error, "commit", "database 'x'")
    assert isinstance(mapped, StoreError)
    assert not isinstance(mapped, StoreUnavailableError)


@pytest.mark.parametrize(("error", "hint"), [
    (OperationFailure("auth failed", 18), "check the user name, password"),
    (OperationFailure("unauthorized", 13), "may read and write this database"),
    (DocumentTooLarge("too large"), "too large for one MongoDB document"),
    (InvalidOperation("closed"), "create a new MongoDBDurableTaskStore"),
    (WriteConcernError("unsatisfiable", 100), "write concern the deployment supports"),
    (OverflowError("8-byte ints"), "64-bit"),
    (ServerSelectionTimeoutError("x"), "no server was reachable"),
    (OperationFailure("bad value", 2), "recoverable"),
    (ClientBulkWriteException({"error": OperationFailure("auth", 18), "writeErrors": [],
                               "writeConcernErrors": []}, False), "check the user name"),
])
def test_messages_say_what_to_do(error: PyMongoError, hint: str) -> None:
    assert hint in str(map_mongo_error(error, "commit", "database 'x'"))


# --- no raw driver exception escapes any operation ---------------------------------------------

_METHODS = ("find_one", "find_one_and_update", "insert_one", "insert_many", "update_one",
            "replace_one", "delete_many", "create_index")


def _calls(store: MongoDBDurableTaskStore) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "create_task": lambda: store.create_task(create_request("k2")),
        "get_header": lambda: store.get_header("k"),
        "get_task": lambda: store.get_task("k"),
        "get_identity": lambda: store.get_identity("k"),
        "list_tasks": lambda: store.list_tasks(ListTasksRequest()),
        "acquire_lease": lambda: store.acquire_lease(acquire_request("k", "w2", now=100)),
        "renew_lease": lambda: store.renew_lease(RenewLeaseRequest(
            key="k", worker_id="w1", fence=1, ttl_seconds=5, now=at(1))),
        "release_lease": lambda: store.release_lease(ReleaseLeaseRequest(
            key="k", worker_id="w1", fence=1, now=at(1))),
        "request_cancel": lambda: store.request_cancel(CancelTaskRequest(
            key="k", reason="r", now=at(1))),
        "commit": lambda: store.commit(commit_request("k", 1, [ClaimNode(node_id="a")],
                                                      blobs={"sha256:x": "{}"})),
        "get_blobs": lambda: store.get_blobs(["sha256:x"]),
        "read_timeline": lambda: store.read_timeline(TimelineRequest(key="k")),
    }


def _explode(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    async def raiser(*args: Any, **kwargs: Any) -> Any:
        raise error

    for name in _METHODS:
        monkeypatch.setattr(AsyncCollection, name, raiser)
    monkeypatch.setattr(AsyncCursor, "to_list", raiser)
    monkeypatch.setattr(AsyncDatabase, "command", raiser)
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", raiser)


@pytest.mark.parametrize("opened", [False, True], ids=["at-open", "after-open"])
@pytest.mark.parametrize("error", TRANSIENT[:6] + TRANSIENT[-1:] + PERMANENT,
                         ids=lambda e: f"{type(e).__name__}-{getattr(e, 'code', '')}")
async def test_no_raw_driver_exception_escapes(mongodb_uri: str, mongodb_database: str,
                                               error: BaseException, opened: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database) as seed:
        await seed.create_task(create_request("k"))
        await seed.acquire_lease(acquire_request("k"))
    store = open_store(mongodb_uri, mongodb_database, retries=1, retry_max_wait_s=0.001)
    try:
        if opened:
            await store.get_header("k")  # indexes and schema check done before the faults
        _explode(monkeypatch, error)
        for name, call in _calls(store).items():
            with pytest.raises(StoreError) as info:
                await call()
            raised = info.value
            assert not isinstance(raised, PyMongoError | InvalidDocument | InvalidBSON), name
            assert raised.__cause__ is error or raised.__cause__.__cause__ is error, name
            assert raised.details["op"] == name or raised.details["op"].startswith("open"), name
            if any(error is e for e in TRANSIENT):
                assert type(raised) is StoreUnavailableError, name
                assert "attempt(s)" in str(raised), name
            else:
                assert not isinstance(raised, StoreUnavailableError), name
    finally:
        monkeypatch.undo()
        await store.close()


# --- real failures, quickly typed -----------------------------------------------------------------

async def test_unreachable_server_is_unavailable_quickly() -> None:
    # Port 1 (tcpmux) is closed here: a free port's number could be taken by then.
    store = MongoDBDurableTaskStore("mongodb://127.0.0.1:1/?directConnection=true",
                                    database="nowhere", server_selection_timeout_s=0.2,
                                    retries=1, retry_max_wait_s=0.01)
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailableError) as info:
            await store.get_header("k")
    finally:
        await store.close()
    # Not pymongo's 30 s default server selection (twice): the store's 0.2 s was used.
    assert time.monotonic() - started < 15
    assert type(info.value) is StoreUnavailableError
    message = str(info.value)
    assert "2 attempt(s)" in message and "running and reachable" in message
    assert info.value.details["attempts"] == 2
    assert store.stats.transient_retries == 1


async def test_bad_credentials_say_to_check_them(mongodb_uri: str,
                                                 mongodb_database: str) -> None:
    parts = urlsplit(mongodb_uri)
    hosts = parts.netloc.rpartition("@")[2]
    bad = urlunsplit(parts._replace(netloc=f"nobody:wrong-password@{hosts}"))
    store = MongoDBDurableTaskStore(bad, database=mongodb_database, retries=1,
                                    server_selection_timeout_s=5)
    started = time.monotonic()
    try:
        with pytest.raises(StoreError) as info:
            await store.get_header("k")
    finally:
        await store.close()
    # A refused login is final: not retried until a selection timeout or the retries run out.
    assert time.monotonic() - started < 15
    assert not isinstance(info.value, StoreUnavailableError)
    assert "check the user name, password" in str(info.value)
    assert "wrong-password" not in str(info.value)


@pytest.mark.parametrize("uri", ["notmongo://h", "mongodb://h:99999/", "mongodb://"])
def test_invalid_uris_are_configuration_errors(uri: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid MongoDB URI"):
        MongoDBDurableTaskStore(uri)


@pytest.mark.parametrize("kwargs", [
    {"database": ""}, {"database": "a.b"}, {"database": "a b"}, {"retries": -1},
    {"cas_attempts": 0}, {"server_selection_timeout_s": 0}, {"cache_size": -1},
])
def test_bad_options_are_configuration_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        MongoDBDurableTaskStore("mongodb://localhost", **kwargs)


def test_unacknowledged_write_concern_and_foreign_clients_are_refused() -> None:
    from pymongo import WriteConcern

    with pytest.raises(ConfigurationError, match="acknowledged"):
        MongoDBDurableTaskStore("mongodb://localhost", write_concern=WriteConcern(w=0))
    with pytest.raises(ConfigurationError, match="AsyncMongoClient"):
        MongoDBDurableTaskStore(object())  # type: ignore[arg-type]
