"""Review 38: the database file moved, deleted or replaced while a store had it open.

SQLite goes on writing to the file it holds open, which nobody can open any more: the
store acknowledged commits no later process would see, and closing left its write-ahead
log next to the path, where the next opener applied it to the file found there (another
application's database moved onto the path was overwritten with task tables).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph import StoreError, StoreSchemaError
from agentium_graph_sqlite import SQLiteDurableTaskStore


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _other_application(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER, amount INTEGER)")
    conn.execute("INSERT INTO invoices VALUES (1, 100)")
    conn.commit()
    conn.close()


async def test_a_database_moved_onto_the_path_is_neither_written_nor_damaged(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    other = tmp_path / "invoices.db"
    _other_application(other)
    theirs = _digest(other)
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("t1", ["n0"]))
        os.replace(other, path)  # an operator's mistake
        with pytest.raises(StoreError) as info:
            await store.create_task(create_request("t2", ["n0"]))
        assert info.value.details["reason"] == "file_replaced"
        assert "nothing was written" in str(info.value)
        # (review 42) The other application opens its file while the store is still open:
        # the store's log was emptied at the refused write, so it is not applied to it.
        mine = sqlite3.connect(path)
        try:
            assert mine.execute("SELECT * FROM invoices").fetchall() == [(1, 100)]
        finally:
            mine.close()
    assert _digest(path) == theirs  # closing did not touch the file now at the path
    wal = tmp_path / "tasks.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # the old log cannot be applied
    with pytest.raises(StoreSchemaError, match="another application"):
        async with SQLiteDurableTaskStore(path) as again:
            await again.get_header("t1")
    check = sqlite3.connect(path)
    try:
        assert check.execute("SELECT * FROM invoices").fetchall() == [(1, 100)]
    finally:
        check.close()


async def test_a_deleted_database_file_refuses_writes_instead_of_losing_them(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("t1", ["n0"]))
        path.unlink()
        with pytest.raises(StoreError) as info:
            await store.create_task(create_request("t2", ["n0"]))
        assert info.value.details["reason"] == "file_replaced"


def test_a_short_read_says_a_file_was_removed_while_in_use(tmp_path: Path) -> None:
    # (review 38) A -wal deleted under an open database made the next opener fail with
    # "an I/O error; check the disk", pointing at hardware that was fine.
    from agentium_graph_sqlite._errors import map_sqlite_error

    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = 522  # type: ignore[attr-defined]  # SQLITE_IOERR_SHORT_READ
    exc.sqlite_errorname = "SQLITE_IOERR_SHORT_READ"  # type: ignore[attr-defined]
    message = str(map_sqlite_error(exc, tmp_path / "tasks.db", "get_task"))
    assert "truncated or removed while in use" in message and "check the disk" not in message
