"""Review 19: files the SQLite store took for something they are not.

* Through a symlink, the -wal and -shm files were looked for next to the link, but SQLite
  keeps them next to the file it leads to: a reader on a read-only mount missed a log
  holding commits and read an older state (exit 0, a live task "not found"), and a link to
  a missing file whose log survived would have created an empty database over that log.
* A foreign database holding only views was taken for an empty file, and a worker wrote
  its tables into it.
* A header ``user_version`` newer than this code (meta still saying 2) was opened, and
  refused later as "upgraded while this process had it open".
* A database restored from a text dump (which carries neither the application id nor the
  user version) was called another application's, with advice to use a new file.
* A long-lived ``read_only=True`` store of a version 1 file failed every timeline read once
  a writer migrated the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlite_helpers import create_request, rewrite_as_version_1

from agentium_graph import StoreError, StoreSchemaError
from agentium_graph.store import ListTasksRequest, TimelineRequest
from agentium_graph_sqlite import SQLiteDurableTaskStore, _schema
from agentium_graph_sqlite._schema import APPLICATION_ID, SCHEMA_VERSION


def _files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def live_wal(tmp_path: Path) -> Iterator[Path]:
    """A task database whose last commit is only in its -wal (a writer still has it open,
    checkpointing nothing), in its own directory."""
    directory = tmp_path / "data"
    directory.mkdir()
    path = directory / "tasks.db"

    async def make() -> None:
        async with SQLiteDurableTaskStore(path) as store:
            await store.create_task(create_request("old"))

    asyncio.run(make())
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("INSERT INTO meta (name, value) VALUES ('note', 'only in the log')")
    assert (directory / "tasks.db-wal").stat().st_size > 0
    try:
        yield path
    finally:
        writer.close()


async def test_a_reader_through_a_symlink_sees_the_log_that_holds_commits(
        live_wal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(live_wal)
    # As on a read-only mount (the -shm cannot be created, so the file is read alone).
    monkeypatch.setattr(_schema, "read_only_filesystem", lambda path: True)
    for path in (live_wal, link):
        store = SQLiteDurableTaskStore(path, read_only=True)
        with pytest.raises(StoreError, match=r"write-ahead log .* holds commits") as info:
            await store.get_header("old")
        assert str(live_wal) + "-wal" in str(info.value)
        await store.close()


async def test_a_symlink_to_a_missing_file_whose_log_survived_creates_nothing(
        tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    (directory / "tasks.db-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\0" * 60)
    link = tmp_path / "link.db"
    link.symlink_to(directory / "tasks.db")
    before = _files(directory)
    store = SQLiteDurableTaskStore(link)
    with pytest.raises(StoreError, match=r"write-ahead log .* may hold committed tasks"):
        await store.get_header("k")
    await store.close()
    assert _files(directory) == before


async def test_a_database_of_views_only_is_another_applications(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE VIEW app_version AS SELECT '4.2' AS version")
    conn.commit()
    conn.close()
    before = _files(tmp_path)
    for options in ({}, {"read_only": True}, {"create": False}):
        store = SQLiteDurableTaskStore(path, **options)  # type: ignore[arg-type]
        with pytest.raises(StoreSchemaError, match=r"another application's .*app_version"):
            await store.create_task(create_request("k")) if not options else \
                await store.get_header("k")
        await store.close()
    assert _files(tmp_path) == before


async def test_a_newer_user_version_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("k"))
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    for options in ({}, {"read_only": True}):
        store = SQLiteDurableTaskStore(path, **options)  # type: ignore[arg-type]
        with pytest.raises(StoreSchemaError, match=f"schema version {SCHEMA_VERSION + 1}, "
                           "newer than") as info:
            await store.list_tasks(ListTasksRequest())
        assert "while this process had it open" not in str(info.value)
        await store.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


async def test_a_restore_from_a_text_dump_says_how_to_set_the_header_back(
        tmp_path: Path) -> None:
    original = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(original) as store:
        await store.create_task(create_request("k"))
    restored = tmp_path / "restored.db"
    source = sqlite3.connect(original)
    target = sqlite3.connect(restored)
    target.executescript("\n".join(source.iterdump()))
    source.close()
    target.close()
    store = SQLiteDurableTaskStore(restored)
    with pytest.raises(StoreSchemaError, match="restore from a text dump") as info:
        await store.get_header("k")
    await store.close()
    fix = info.value.details["fix"]
    assert fix == f"PRAGMA application_id = {APPLICATION_ID}; " \
                  f"PRAGMA user_version = {SCHEMA_VERSION}"
    conn = sqlite3.connect(restored)
    conn.executescript(fix)
    conn.close()
    async with SQLiteDurableTaskStore(restored) as store:  # what the message says works
        header = await store.get_header("k")
    assert header is not None and header.key == "k"


async def test_a_read_only_store_reads_on_after_a_writer_migrated_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    async with SQLiteDurableTaskStore(path) as store:
        await store.create_task(create_request("a", ["n0", "n1"]))
        entries = await store.read_timeline(TimelineRequest(key="a"))
    rewrite_as_version_1(path, {"a": entries})
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 0")  # as version 1 left it
    conn.close()
    reader = SQLiteDurableTaskStore(path, read_only=True)
    try:
        assert [e.seq for e in await reader.read_timeline(TimelineRequest(key="a"))] == \
            [e.seq for e in entries]
        async with SQLiteDurableTaskStore(path, create=False) as writer:
            await writer.get_header("a")  # opening it migrates 1 -> 2
        assert await reader.read_timeline(TimelineRequest(key="a")) == entries
    finally:
        await reader.close()
