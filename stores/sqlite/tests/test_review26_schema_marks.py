"""A file whose two schema marks disagree, or whose tables are gone under our header.

* The meta table said schema version 1 while the file header's ``user_version`` said 2
  (only a hand edit makes that): the store ran the 1 -> 2 migration on a version 2 file and
  failed with a raw ``duplicate column name: slack``.
* The header carried our application id and schema version but every table was dropped:
  it was called "another application's SQLite database".

Each is a ``StoreSchemaError`` now that says what the file is, and the file is unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph import StoreSchemaError
from agentium_graph_sqlite import SQLiteDurableTaskStore


def _made(path: Path) -> None:
    async def go() -> None:
        async with SQLiteDurableTaskStore(path) as store:
            await store.create_task(create_request("k1"))
    asyncio.run(go())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _open_error(path: Path, **options: object) -> StoreSchemaError:
    async def go() -> None:
        async with SQLiteDurableTaskStore(path, **options) as store:  # type: ignore[arg-type]
            await store.get_header("k1")
    with pytest.raises(StoreSchemaError) as info:
        asyncio.run(go())
    return info.value


@pytest.mark.parametrize(("edit", "meta", "header"), [
    ("UPDATE meta SET value = '1' WHERE name = 'schema_version'", "'1'", "2"),
    ("PRAGMA user_version = 1", "'2'", "1"),
])
@pytest.mark.parametrize("read_only", [False, True])
def test_disagreeing_schema_versions_are_refused(tmp_path: Path, edit: str, meta: str,
                                                 header: str, read_only: bool) -> None:
    path = tmp_path / "s.db"
    _made(path)
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute(edit)
    conn.close()
    before = _digest(path)
    error = _open_error(path, read_only=read_only)
    assert "disagrees about the store schema version" in str(error)
    assert f"meta table: {meta}, file header user_version: {header}" in str(error)
    assert "left unchanged" in str(error)
    assert _digest(path) == before


def test_a_newer_meta_version_is_still_reported_as_newer(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _made(path)
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("UPDATE meta SET value = '3' WHERE name = 'schema_version'")
    conn.close()
    assert "newer than this agentium-graph-sqlite supports" in str(_open_error(path))


def test_our_header_without_our_tables_is_called_emptied(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _made(path)
    with sqlite3.connect(path, isolation_level=None) as conn:
        for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            conn.execute(f"DROP TABLE {name}")
    conn.close()
    before = _digest(path)
    error = str(_open_error(path))
    assert "application id and schema version 2" in error
    assert "meta table is gone" in error and "another application" not in error
    assert _digest(path) == before
