"""Driver failures: busy retries, and proof that no raw sqlite3 exception escapes."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlite_helpers import acquire_request, at, commit_request, create_request

from agentium_graph.errors import StoreError, StoreSchemaError, StoreUnavailableError
from agentium_graph.store import (
    CancelTaskRequest,
    ClaimNode,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TimelineRequest,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore
from agentium_graph_sqlite._errors import map_sqlite_error
from agentium_graph_sqlite._schema import Settings, open_database


async def test_busy_lock_exhausts_bounded_retries_then_recovers(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path, busy_timeout_s=0.05, busy_retries=2,
                                      retry_max_wait_s=0.01) as store:
        await store.create_task(create_request("k"))
        blocker = sqlite3.connect(db_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # hold the write lock from another connection
        try:
            with pytest.raises(StoreUnavailableError) as info:
                await store.acquire_lease(acquire_request("k"))
            assert type(info.value) is StoreUnavailableError
            message = str(info.value)
            assert "3 attempt(s)" in message and "busy_timeout_s" in message
            assert "recoverable" in message
            assert info.value.details["attempts"] == 3
            assert store.stats.busy_retries == 2
            # WAL readers are not blocked by the writer, and nothing was written.
            header = await store.get_header("k")
            assert header is not None and header.fence == 0 and header.lease is None
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        grant = await store.acquire_lease(acquire_request("k"))
        assert grant.fence == 1


def _error(cls: type[Exception], code: int | None, name: str) -> Exception:
    exc = cls(f"simulated {name}")
    if code is not None:
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        exc.sqlite_errorname = name  # type: ignore[attr-defined]
    return exc


DRIVER_ERRORS = [
    _error(sqlite3.OperationalError, 5, "SQLITE_BUSY"),
    _error(sqlite3.OperationalError, 262, "SQLITE_LOCKED_SHAREDCACHE"),
    _error(sqlite3.DatabaseError, 11, "SQLITE_CORRUPT"),
    _error(sqlite3.DatabaseError, 26, "SQLITE_NOTADB"),
    _error(sqlite3.OperationalError, 8, "SQLITE_READONLY"),
    _error(sqlite3.OperationalError, 10, "SQLITE_IOERR"),
    _error(sqlite3.OperationalError, 13, "SQLITE_FULL"),
    _error(sqlite3.OperationalError, 14, "SQLITE_CANTOPEN"),
    _error(sqlite3.IntegrityError, 19, "SQLITE_CONSTRAINT"),
    _error(sqlite3.ProgrammingError, None, ""),
    _error(sqlite3.InterfaceError, None, ""),
    _error(sqlite3.InternalError, None, ""),
    _error(sqlite3.DataError, None, ""),
    _error(sqlite3.NotSupportedError, None, ""),
    _error(sqlite3.Warning, None, ""),
    _error(sqlite3.Error, None, ""),
]


class _Exploding:
    """A connection whose every statement fails with one driver error (ROLLBACK too)."""

    def __init__(self, real: sqlite3.Connection, error: Exception) -> None:
        self.real = real
        self.error = error

    @property
    def in_transaction(self) -> bool:
        return True

    def execute(self, *args: Any) -> Any:
        raise self.error

    def executemany(self, *args: Any) -> Any:
        raise self.error

    def close(self) -> None:
        self.real.close()


def _calls(store: SQLiteDurableTaskStore) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "create_task": lambda: store.create_task(create_request("k2")),
        "get_header": lambda: store.get_header("k"),
        "get_task": lambda: store.get_task("k"),
        "get_identity": lambda: store.get_identity("k"),
        "list_tasks": lambda: store.list_tasks(ListTasksRequest()),
        "acquire_lease": lambda: store.acquire_lease(acquire_request("k")),
        "renew_lease": lambda: store.renew_lease(RenewLeaseRequest(
            key="k", worker_id="w1", fence=1, ttl_seconds=5, now=at(1))),
        "release_lease": lambda: store.release_lease(ReleaseLeaseRequest(
            key="k", worker_id="w1", fence=1, now=at(1))),
        "request_cancel": lambda: store.request_cancel(CancelTaskRequest(
            key="k", reason="r", now=at(1))),
        "commit": lambda: store.commit(commit_request("k", 1, [ClaimNode(node_id="a")])),
        "get_blobs": lambda: store.get_blobs(["sha256:x"]),
        "read_timeline": lambda: store.read_timeline(TimelineRequest(key="k")),
    }


@pytest.mark.parametrize("error", DRIVER_ERRORS, ids=lambda e: f"{type(e).__name__}-"
                         f"{getattr(e, 'sqlite_errorname', '')}")
async def test_no_raw_sqlite3_exception_escapes(db_path: Path, error: Exception,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    async with SQLiteDurableTaskStore(db_path) as seed:
        await seed.create_task(create_request("k"))
        await seed.acquire_lease(acquire_request("k"))

    def exploding_open(settings: Settings) -> Any:
        return _Exploding(open_database(settings), error)

    monkeypatch.setattr("agentium_graph_sqlite._store.open_database", exploding_open)
    store = SQLiteDurableTaskStore(db_path, busy_retries=1, retry_max_wait_s=0.001)
    try:
        for name, call in _calls(store).items():
            with pytest.raises(StoreError) as info:
                await call()
            raised = info.value
            assert not isinstance(raised, sqlite3.Error | sqlite3.Warning), name
            assert str(db_path) in str(raised), name
            assert raised.details["op"] == name or "attempts" in raised.details, name
    finally:
        await store.close()


async def test_failure_to_connect_is_mapped(db_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> sqlite3.Connection:
        raise _error(sqlite3.OperationalError, 14, "SQLITE_CANTOPEN")

    monkeypatch.setattr("agentium_graph_sqlite._schema.sqlite3.connect", refuse)
    async with SQLiteDurableTaskStore(db_path) as store:
        with pytest.raises(StoreError, match="cannot open the file") as info:
            await store.get_header("k")
    assert not isinstance(info.value, sqlite3.Error)


@pytest.mark.parametrize(("code", "kind", "hint"), [
    (5, StoreUnavailableError, "lock"),
    (6, StoreUnavailableError, "lock"),
    (26, StoreSchemaError, "not a SQLite database"),
    (11, StoreError, "corrupt"),
    (8, StoreError, "read-only"),
    (13, StoreError, "disk is full"),
    (10, StoreError, "I/O error"),
    (1, StoreError, "not changed"),
])
def test_error_codes_map_to_typed_errors_that_say_what_to_do(
        code: int, kind: type[StoreError], hint: str) -> None:
    mapped = map_sqlite_error(_error(sqlite3.OperationalError, code, "X"),  # type: ignore[arg-type]
                              Path("/data/tasks.db"), "commit")
    assert isinstance(mapped, kind)
    assert hint in str(mapped)
    assert mapped.details["path"] == "/data/tasks.db"
