"""A ``read_only=True`` store's connection is itself read-only (``mode=ro``), whoever runs it.

File permissions cannot show this: ``chmod 0o444`` does not restrict root (this suite runs
as root in CI), and SQLite opens a write-protected file read-only anyway, even without
``mode=ro``. So these tests look at the connection itself and at what closing it leaves on
disk, which depend on the open mode and not on the process's uid.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
from sqlite_helpers import acquire_request, commit_request, create_request

from agentium_graph.errors import StoreError
from agentium_graph.store import Charge, ClaimNode, ListTasksRequest
from agentium_graph_sqlite import SQLiteDurableTaskStore


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _populate(path: Path) -> None:
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("k", ["n0", "n1"]))
        grant = await store.acquire_lease(acquire_request("k"))
        await store.commit(commit_request("k", grant.fence, [
            ClaimNode(node_id="n0"), Charge(admission_id="adm", charges={"tool_calls": 1})]))


@pytest.mark.parametrize("sql", [
    "CREATE TABLE probe (x)",
    "DELETE FROM journal",
    "UPDATE meta SET value = value",
])
async def test_a_read_only_stores_own_connection_refuses_writes(tmp_path: Path,
                                                                sql: str) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    before = _digest(path)
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        assert await store.get_header("k") is not None  # the connection is open now

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(sql)

        # Every public mutating call is refused before it reaches the connection; this
        # reaches it on purpose, the way a bug in the store's own code would.
        with pytest.raises(StoreError, match=r"readonly|read-only") as info:
            await store._submit("probe", write)
        assert info.value.details["sqlite_error"] == "SQLITE_READONLY"
        assert await store.get_header("k") is not None
    assert _digest(path) == before


async def test_a_read_only_store_leaves_a_crashed_writers_wal_alone(tmp_path: Path) -> None:
    """A writer died with commits only in its -wal file. A read-only store reads them, and
    closing it changes nothing: a read-write connection closing last would checkpoint the
    log into the database file and delete the -wal file."""
    path = tmp_path / "tasks.db"
    await _populate(path)
    script = textwrap.dedent(f"""
        import os, sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("INSERT INTO meta (name, value) VALUES ('probe', 'in the wal only')")
        os._exit(0)  # no close, no checkpoint: the commits stay in the -wal file
    """)
    writer = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    assert await asyncio.wait_for(writer.wait(), 30) == 0
    wal = path.with_name(path.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0
    db_before, wal_before = _digest(path), _digest(wal)

    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        assert [h.key for h in await store.list_tasks(ListTasksRequest())] == ["k"]
        assert await store.get_task("k") is not None

    assert wal.exists() and _digest(wal) == wal_before
    assert _digest(path) == db_before
    check = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)
    try:  # the dead writer's commit is still there, read from the log
        assert check.execute("SELECT value FROM meta WHERE name = 'probe'").fetchone() == \
            ("in the wal only",)
    finally:
        check.close()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _directory_not_writable(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """As a user who may read the database but not write its directory (root may write
    everywhere, so ``os.access`` answers as for such a user)."""
    from agentium_graph_sqlite import _schema

    real = _schema.os.access

    def access(path: object, mode: int, *args: object, **kwargs: object) -> bool:
        if Path(str(path)) == directory and mode & _schema.os.W_OK:
            return False
        return real(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(_schema.os, "access", access)


async def test_a_database_in_a_directory_this_user_may_not_write_is_read_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An idle service's database (no -wal, no -shm): SQLite would need to create the -shm
    # a WAL reader uses, which the directory does not allow. It is read as immutable.
    path = tmp_path / "tasks.db"
    await _populate(path)
    assert _names(tmp_path) == ["tasks.db"]
    before = _digest(path)
    _directory_not_writable(monkeypatch, tmp_path)
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        headers = await store.list_tasks(ListTasksRequest())
        assert [h.key for h in headers] == ["k"]
    assert _names(tmp_path) == ["tasks.db"]  # nothing created
    assert _digest(path) == before


async def test_commits_only_in_the_log_of_such_a_directory_are_refused_clearly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The log holds commits the file does not: an immutable read would not see them.
    source = tmp_path / "src"
    source.mkdir()
    writer = SQLiteDurableTaskStore(source / "tasks.db")
    await writer.create_task(create_request("k", ["n0"]))
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("tasks.db", "tasks.db-wal"):  # as a crashed writer leaves them
        (copy / name).write_bytes((source / name).read_bytes())
    await writer.close()
    _directory_not_writable(monkeypatch, copy)
    async with SQLiteDurableTaskStore(copy / "tasks.db", read_only=True) as store:
        with pytest.raises(StoreError, match="is not writable by this user and its "
                                             "write-ahead log"):
            await store.list_tasks(ListTasksRequest())
    assert _names(copy) == ["tasks.db", "tasks.db-wal"]


async def test_reading_a_write_protected_file_leaves_no_side_files(tmp_path: Path) -> None:
    """(Review 38) SQLite gives the -shm and -wal it creates the database file's mode: a read
    of a file marked read-only left read-only side files, and once the file was writable
    again no writer (not root) could open them. Such a file is read without them, as on a
    read-only mount."""
    path = tmp_path / "tasks.db"
    await _populate(path)
    before = _digest(path)
    path.chmod(0o444)
    try:
        async with SQLiteDurableTaskStore(path, read_only=True) as store:
            assert (await store.get_task("k")) is not None
    finally:
        path.chmod(0o644)
    assert _names(tmp_path) == ["tasks.db"] and _digest(path) == before
    async with SQLiteDurableTaskStore(path) as store:  # writable again: writes work
        await store.create_task(create_request("k2", ["n0"]))


def test_a_write_refused_by_read_only_side_files_names_them(tmp_path: Path) -> None:
    from agentium_graph_sqlite._errors import map_sqlite_error

    path = tmp_path / "tasks.db"
    path.write_bytes(b"")
    shm = tmp_path / "tasks.db-shm"
    shm.write_bytes(b"")
    shm.chmod(0o444)
    exc = sqlite3.OperationalError("attempt to write a readonly database")
    exc.sqlite_errorcode = 8  # type: ignore[attr-defined]  # SQLITE_READONLY
    exc.sqlite_errorname = "SQLITE_READONLY"  # type: ignore[attr-defined]
    error = map_sqlite_error(exc, path, "commit")
    assert error.details["side_files"] == [str(shm)]
    assert "chmod u+w" in str(error) and str(shm) in str(error)
    assert "or remove them while no process has the database open" in str(error)
