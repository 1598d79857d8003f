"""Review 16: a stored row whose text is not UTF-8 (bytes damaged on disk, or a row edited
by a tool that wrote raw bytes) is a typed, bounded "damaged row" error.

sqlite3 raised ``OperationalError: Could not decode to UTF-8 column 'header' with text
'...'`` while fetching it, which the store reported as a generic StoreError quoting the
garbage and saying "the task was not changed by this operation", and which named no task:
``list`` then failed as a whole instead of listing the damaged task as damaged.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph.errors import StoreSchemaError
from agentium_graph.store import ListTasksRequest, TimelineRequest
from agentium_graph_sqlite import SQLiteDurableTaskStore

NOT_UTF8 = b'{"key": "\xff\xfe damaged'


def _damage(path: Path, sql: str, key: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        assert conn.execute(sql, (NOT_UTF8, key)).rowcount == 1
    conn.close()


async def _populate(path: Path) -> None:
    async with SQLiteDurableTaskStore(path) as store:
        for key in ("a", "b", "c"):
            await store.create_task(create_request(key))


def _is_damage(error: StoreSchemaError) -> None:
    message = str(error)
    assert "not valid UTF-8" in message or "not valid JSON" in message, message
    assert "backup" in message
    assert "not changed by this operation" not in message
    assert "\ufffd" not in message and "\\xff" not in message  # the garbage is not quoted


async def test_a_header_that_is_not_utf8_names_its_task_and_spares_the_others(
        db_path: Path) -> None:
    await _populate(db_path)
    _damage(db_path, "UPDATE tasks SET header = CAST(? AS TEXT) WHERE key = ?", "b")
    async with SQLiteDurableTaskStore(db_path, read_only=True) as store:
        with pytest.raises(StoreSchemaError) as listed:
            await store.list_tasks(ListTasksRequest(limit=10))
        assert listed.value.details["key"] == "b"  # what lets `list` go on past it
        _is_damage(listed.value)
        assert [h.key for h in await store.list_tasks(ListTasksRequest(after="b"))] == ["c"]
        with pytest.raises(StoreSchemaError) as read:
            await store.get_header("b")
        _is_damage(read.value)
        assert (await store.get_header("a")) is not None


@pytest.mark.parametrize(("sql", "op"), [
    ("UPDATE nodes SET record = CAST(? AS TEXT) WHERE key = ? AND node_id = 'a'", "get_task"),
    ("UPDATE journal SET entries = CAST(? AS TEXT) WHERE key = ?", "read_timeline"),
    ("UPDATE identities SET identity = CAST(? AS TEXT) WHERE key = ?", "get_identity"),
])
async def test_other_rows_that_are_not_utf8_are_damage_errors(db_path: Path, sql: str,
                                                              op: str) -> None:
    await _populate(db_path)
    _damage(db_path, sql, "b")
    async with SQLiteDurableTaskStore(db_path) as store:
        with pytest.raises(StoreSchemaError) as info:
            if op == "get_task":
                await store.get_task("b")
            elif op == "read_timeline":
                await store.read_timeline(TimelineRequest(key="b"))
            else:
                await store.get_identity("b")
        _is_damage(info.value)
        assert (await store.get_task("a")) is not None
