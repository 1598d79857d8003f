"""A file a newer agentium-graph-sqlite migrates while this store has it open is refused
from the next transaction on, with nothing written.

The schema is checked (and an older one migrated) only when a store opens the file. A
process that kept the file open across a newer version's migration (a rolling upgrade)
went on writing this version's rows into the newer schema. Every schema now records its
version in the file header (``user_version``), and every write transaction (and every
consistent read of several rows) checks it first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph import StoreSchemaError
from agentium_graph_sqlite import SCHEMA_VERSION, SQLiteDurableTaskStore


def _migrate_as_a_newer_version(db_path: Path) -> None:
    """What a later version's migration does (in another process): under the write lock,
    its schema change, its version in meta and in the header."""
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'",
                      (str(SCHEMA_VERSION + 1),))
        other.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        other.execute("COMMIT")
    finally:
        other.close()


def _user_version(db_path: Path) -> int:
    conn = sqlite3.connect(db_path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


async def test_a_new_file_records_its_schema_version_in_the_header(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k1"))
    assert _user_version(db_path) == SCHEMA_VERSION


async def test_a_file_upgraded_while_open_is_refused_and_left_unchanged(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k1"))
        before = await store.get_header("k1")
        _migrate_as_a_newer_version(db_path)
        with pytest.raises(StoreSchemaError, match="upgraded to store schema version") as err:
            await store.create_task(create_request("k2"))
        assert err.value.details["schema_version"] == SCHEMA_VERSION + 1
        with pytest.raises(StoreSchemaError, match="upgrade agentium-graph-sqlite"):
            await store.get_task("k1")  # a consistent read of several rows
    raw = sqlite3.connect(db_path)
    try:
        assert [r[0] for r in raw.execute("SELECT key FROM tasks")] == ["k1"]
    finally:
        raw.close()
    # A store opened afresh refuses the file as before (its meta says the newer version).
    with pytest.raises(StoreSchemaError, match="newer than this agentium-graph-sqlite"):
        async with SQLiteDurableTaskStore(db_path) as again:
            await again.get_header("k1")
    assert before is not None and before.key == "k1"
