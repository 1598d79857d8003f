"""Review 40 (found on MongoDB, true of every store): a stored record with a field removed
by hand was read with that field's default. A header without ``status`` read as pending (a
completed task ran again), one without ``fence`` as 0 (a used fence was granted again), a
node without ``state`` as pending (a completed node ran again), a counter removed as 0 (a
budget counting from zero). Every store writes these fields, so a record lacking one is
damage, refused with the field named and nothing written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import acquire_request, create_request

from agentium_graph.errors import StoreSchemaError
from agentium_graph.store import TaskHeader
from agentium_graph_sqlite import SQLiteDurableTaskStore


def _edit(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(("sql", "field"), [
    ("UPDATE tasks SET header = json_remove(header, '$.status')", "status"),
    ("UPDATE tasks SET header = json_remove(header, '$.fence')", "fence"),
    ("UPDATE tasks SET header = json_remove(header, '$.journal_seq')", "journal_seq"),
    ("UPDATE tasks SET header = json_remove(header, '$.counters.tool_calls')",
     "counters.tool_calls"),
    ("UPDATE nodes SET record = json_remove(record, '$.state') WHERE node_id = 'a'",
     "state"),
    ("UPDATE nodes SET record = json_remove(record, '$.attempts') WHERE node_id = 'a'",
     "attempts"),
], ids=["status", "fence", "journal_seq", "counter", "node-state", "node-attempts"])
async def test_a_record_missing_a_field_every_store_writes_is_damaged(
        tmp_path: Path, sql: str, field: str) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("k"))
    _edit(path, sql)
    conn = sqlite3.connect(path)
    before = conn.execute("SELECT header FROM tasks").fetchall()
    conn.close()
    async with SQLiteDurableTaskStore(path) as store:
        calls = [lambda: store.get_task("k")]
        if sql.startswith("UPDATE tasks"):  # the lease is taken on the header alone
            calls.append(lambda: store.acquire_lease(acquire_request("k")))
        for call in calls:
            with pytest.raises(StoreSchemaError) as info:
                await call()
            assert f"{field} is missing" in str(info.value) and "backup" in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT header FROM tasks").fetchall() == before  # nothing written
    conn.close()


def test_a_create_request_must_start_every_counter() -> None:
    request = create_request("k")
    header = request.header.model_dump()
    del header["counters"]["model_calls"]
    with pytest.raises(ValueError, match=r"header\.counters must hold every counter"):
        type(request)(**{**request.model_dump(), "header": TaskHeader(**header)})


@pytest.mark.parametrize(("sql", "field"), [
    ("UPDATE nodes SET record = json_remove(record, '$.attempts[0].outcome') "
     "WHERE node_id = 'a'", "attempts[0].outcome"),
], ids=["attempt-outcome"])
async def test_an_attempt_missing_a_field_is_damage_too(tmp_path: Path, sql: str,
                                                       field: str) -> None:
    # (review 47) Attempt records were not checked: a removed outcome read as None.
    from sqlite_helpers import commit_request

    from agentium_graph.store import StartAttempt

    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("k"))
        grant = await store.acquire_lease(acquire_request("k"))
        await store.commit(commit_request("k", grant.fence, [StartAttempt(
            node_id="a", attempt_id="a1", admission_id="adm-a",
            charges={"work_attempts": 1})]))
    _edit(path, sql)
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreSchemaError, match=r"attempts\[0\]\.outcome is missing"):
            await store.get_task("k")
