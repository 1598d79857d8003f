"""Schema version 1 files (one journal row per entry) are migrated in place on open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import (
    acquire_request,
    commit_request,
    create_request,
    rewrite_as_version_1,
)

from agentium_graph.errors import StoreError
from agentium_graph.store import Charge, ClaimNode, JournalEntry, TimelineRequest
from agentium_graph_sqlite import SCHEMA_VERSION, SQLiteDurableTaskStore


async def _timeline(store: SQLiteDurableTaskStore, key: str) -> list[JournalEntry]:
    return await store.read_timeline(TimelineRequest(key=key, limit=1000))


async def test_a_version_1_file_is_migrated_and_keeps_its_whole_journal(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        for key in ("a", "b"):
            await store.create_task(create_request(key, ["n0", "n1"]))
            grant = await store.acquire_lease(acquire_request(key))
            await store.commit(commit_request(key, grant.fence, [
                ClaimNode(node_id="n0"), Charge(admission_id="adm", charges={"tool_calls": 1}),
                ClaimNode(node_id="n1")]))
        before = {key: await _timeline(store, key) for key in ("a", "b")}
    assert [e.seq for e in before["a"]] == [1, 2, 3, 4, 5]
    rewrite_as_version_1(path, before)

    async with SQLiteDurableTaskStore(path) as store:
        assert {key: await _timeline(store, key) for key in ("a", "b")} == before
        # Paging across the migrated rows is exact, one entry at a time.
        for after in range(5):
            page = await store.read_timeline(TimelineRequest(key="a", after_seq=after, limit=1))
            assert [e.seq for e in page] == [after + 1]
        grant = await store.acquire_lease(acquire_request("a", now=100))
        await store.commit(commit_request("a", grant.fence, [
            Charge(admission_id="adm-2", charges={"tool_calls": 1})]))
        after = await _timeline(store, "a")
        # Node rows written by version 1 code (no slack) are read and updated as usual.
        await store.commit(commit_request("a", grant.fence, [ClaimNode(node_id="n1")]))
        snapshot = await store.get_task("a")
        assert snapshot is not None and snapshot.nodes["n1"].state == "claimed"
    assert after[:5] == before["a"]
    assert [e.seq for e in after] == [1, 2, 3, 4, 5, 6, 7]
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert version == (str(SCHEMA_VERSION),)
    assert "journal_v1" not in tables and "journal_by_key" in tables


async def test_a_failed_migration_leaves_the_version_1_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("a"))
        entries = {"a": await _timeline(store, "a")}
    rewrite_as_version_1(path, entries)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE journal_v1 (x)")  # in the way of the rename: the step fails
    conn.commit()
    conn.close()
    store = SQLiteDurableTaskStore(path)
    try:
        with pytest.raises(StoreError) as info:
            await _timeline(store, "a")
        assert not isinstance(info.value, sqlite3.Error)
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        rows = conn.execute("SELECT seq FROM journal WHERE key = 'a'").fetchall()
    finally:
        conn.close()
    assert version == ("1",) and rows == [(1,)]  # rolled back as one transaction


async def test_static_plan_headers_stay_readable_by_versions_before_plan_digest(
        tmp_path: Path) -> None:
    # Headers gained plan_digest (set by plan revisions). A static task's header row leaves
    # it out, so a worker of the previous version (whose header model forbids unknown
    # fields) can still read tasks this version wrote: rolling back stays possible.
    from pydantic import ConfigDict, create_model

    from agentium_graph.store import CommitRevision, TaskHeader

    old_header = create_model(  # the previous version's header: no plan_digest, no extras
        "OldHeader", __config__=ConfigDict(frozen=True, extra="forbid"),
        **{n: (f.annotation, f) for n, f in TaskHeader.model_fields.items()
           if n != "plan_digest"})

    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("static"))
        grant = await store.acquire_lease(acquire_request("static"))
        await store.commit(commit_request("static", grant.fence, [ClaimNode(node_id="a")]))
        await store.create_task(create_request("planned"))
        grant = await store.acquire_lease(acquire_request("planned"))
        await store.commit(commit_request("planned", grant.fence, [CommitRevision(
            base_revision=1, revision=2, plan_digest="sha256:" + "1" * 64,
            admission_id="rev-2")]))
    conn = sqlite3.connect(path)
    rows = dict(conn.execute("SELECT key, header FROM tasks").fetchall())
    conn.close()
    assert "plan_digest" not in rows["static"]
    old_header.model_validate_json(rows["static"])  # what the previous version does
    assert TaskHeader.model_validate_json(rows["planned"]).plan_digest == "sha256:" + "1" * 64
