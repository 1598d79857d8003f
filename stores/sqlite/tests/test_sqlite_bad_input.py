"""Bad files and arguments: typed errors that say what to do, and no damage to the file."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreSchemaError,
)
from agentium_graph.store import ListTasksRequest
from agentium_graph_sqlite import SCHEMA_VERSION, SQLiteDurableTaskStore


def _files(path: Path) -> dict[str, bytes]:
    """The bytes of the database and of any -wal/-shm/-journal file next to it."""
    return {p.name: p.read_bytes() for p in sorted(path.parent.iterdir())
            if p.name.startswith(path.name)}


async def _open_fails(path: Path) -> StoreError:
    store = SQLiteDurableTaskStore(path)
    try:
        with pytest.raises(StoreError) as info:
            await store.list_tasks(ListTasksRequest())
        assert not isinstance(info.value, sqlite3.Error)
        return info.value
    finally:
        await store.close()


async def _ours(path: Path) -> None:
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("k"))


async def test_missing_directory_names_the_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    error = await _open_fails(missing / "tasks.db")
    assert str(missing) in str(error)
    assert "mkdir" in str(error)
    assert not (tmp_path / "no").exists()


async def test_path_that_is_a_directory(tmp_path: Path) -> None:
    error = await _open_fails(tmp_path)
    assert "not a regular file" in str(error)


async def test_non_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = _files(path)
    error = await _open_fails(path)
    assert isinstance(error, StoreSchemaError)
    assert "not a SQLite database" in str(error)
    assert _files(path) == before


async def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("CREATE TABLE meta (k TEXT, v TEXT)")  # a lookalike table name
    conn.executemany("INSERT INTO users (name) VALUES (?)", [("ann",), ("bob",)])
    conn.commit()
    conn.close()
    before = _files(path)
    error = await _open_fails(path)
    assert isinstance(error, StoreSchemaError)
    assert "another application" in str(error) and "users" in str(error)
    assert _files(path) == before


async def test_empty_foreign_database_with_an_application_id_is_refused(
        tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.commit()
    conn.close()
    before = _files(path)
    assert isinstance(await _open_fails(path), StoreSchemaError)
    assert _files(path) == before


async def test_newer_schema_version_asks_for_an_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _ours(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'",
                  (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.execute("PRAGMA journal_mode = DELETE")  # fold the WAL in: one file to compare
    conn.close()
    before = _files(path)
    error = await _open_fails(path)
    assert isinstance(error, StoreSchemaError)
    assert "upgrade agentium-graph-sqlite" in str(error)
    assert error.details["schema_version"] == SCHEMA_VERSION + 1
    assert _files(path) == before


async def test_corrupt_database_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _ours(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    data = bytearray(path.read_bytes())
    data[100:2000] = b"\xde\xad\xbe\xef" * 475  # smash the schema page after the header
    path.write_bytes(bytes(data))
    before = _files(path)
    error = await _open_fails(path)
    assert "corrupt" in str(error) or "not a SQLite database" in str(error)
    assert _files(path) == before


async def test_read_only_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _ours(path)
    before = _files(path)
    mode = path.stat().st_mode
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    try:
        error = await _open_fails(path)
    finally:
        path.chmod(mode)
    assert "read-only" in str(error) and "chmod" in str(error)
    assert _files(path) == before


async def test_unparsable_stored_record_is_a_schema_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _ours(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tasks SET header = '{\"not\": \"a header\"}'")
    conn.commit()
    conn.close()
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreSchemaError, match="cannot parse"):
            await store.get_header("k")


async def test_a_second_store_on_a_fresh_file_sees_our_schema(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _ours(path)
    await _ours(tmp_path / "tasks.db")  # reopening ours is fine and idempotent
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert {"meta", "tasks", "nodes", "journal", "blobs"} <= names


@pytest.mark.parametrize("bad", [":memory:", "", "sqlite:///tmp/x.db", "file:x.db?mode=rw"])
def test_paths_that_are_not_files_are_configuration_errors(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteDurableTaskStore(bad)


@pytest.mark.parametrize("kwargs", [
    {"synchronous": "OFF"}, {"busy_timeout_s": 0}, {"busy_retries": -1},
    {"retry_max_wait_s": 0},
    # These used to be accepted and fail at the first operation (inf: "an integer SQLite
    # cannot store"), or raise a raw TypeError ("3").
    {"busy_timeout_s": float("inf")}, {"busy_timeout_s": float("nan")},
    {"busy_timeout_s": "5"}, {"retry_max_wait_s": float("inf")}, {"busy_retries": "3"},
    {"busy_retries": 1.5}, {"busy_retries": True}])
def test_bad_options_are_configuration_errors(kwargs: dict[str, object],
                                              tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteDurableTaskStore(tmp_path / "x.db", **kwargs)  # type: ignore[arg-type]


def test_normal_synchronous_is_accepted(tmp_path: Path) -> None:
    store = SQLiteDurableTaskStore(tmp_path / "x.db", synchronous="NORMAL")
    assert store.synchronous == "NORMAL"
    assert SQLiteDurableTaskStore(tmp_path / "y.db").synchronous == "FULL"


@pytest.fixture
def _restore_cwd() -> Iterator[None]:
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


@pytest.mark.usefixtures("_restore_cwd")
async def test_relative_path_is_fixed_at_construction(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    os.chdir(tmp_path / "a")
    store = SQLiteDurableTaskStore("tasks.db")
    os.chdir(tmp_path / "b")
    async with store:
        await store.create_task(create_request("k"))
    assert (tmp_path / "a" / "tasks.db").exists()
    assert not (tmp_path / "b" / "tasks.db").exists()


async def test_a_write_ahead_log_without_its_database_is_refused_and_kept(
        tmp_path: Path) -> None:
    # The database file was moved or lost but its log was not: SQLite would create an
    # empty database there and discard the log, with whatever commits it held.
    path = tmp_path / "t.db"
    store = SQLiteDurableTaskStore(path)
    await store.create_task(create_request("k"))
    log = path.with_name("t.db-wal")
    assert log.stat().st_size > 0
    kept = log.read_bytes()
    shutil.copy(log, tmp_path / "saved")
    await store.close()  # the last close checkpoints and removes the log
    path.unlink()
    shutil.copy(tmp_path / "saved", log)
    for read_only in (False, True):
        error = await _open_fails_with(path, read_only=read_only)
        assert str(log) in str(error) if not read_only else "does not exist" in str(error)
    assert not path.exists() and log.read_bytes() == kept


async def test_a_symlink_loop_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for read_only in (False, True):
        error = await _open_fails_with(tmp_path / "a", read_only=read_only)
        assert str(tmp_path / "a") in str(error)
        assert ("links loop" if read_only else "symbolic links") in str(error)


async def test_a_path_this_user_may_not_look_at_is_a_store_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As a user without search permission on a directory of the path (root has it always,
    # so the denial is simulated where the store first looks at the file).
    path = tmp_path / "secret" / "t.db"

    def denied(self: Path, *args: object, **kwargs: object) -> os.stat_result:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_symlink", denied)
    for read_only in (False, True):
        error = await _open_fails_with(path, read_only=read_only)
        assert "Permission denied" in str(error) and "permissions" in str(error)


async def _open_fails_with(path: Path, *, read_only: bool) -> StoreError:
    store = SQLiteDurableTaskStore(path, read_only=read_only)
    try:
        with pytest.raises(StoreError) as info:
            await store.list_tasks(ListTasksRequest())
        assert not isinstance(info.value, sqlite3.Error | OSError)
        return info.value
    finally:
        await store.close()
