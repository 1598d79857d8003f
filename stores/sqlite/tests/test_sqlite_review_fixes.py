"""Fixes from the SQLite store review: empty files, bad text, read-only opens, damaged rows,
and path validation. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlite_helpers import (
    acquire_request,
    at,
    commit_request,
    create_request,
    rewrite_as_version_1,
)

import agentium_graph_sqlite
from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreSchemaError,
    TaskNotFoundError,
)
from agentium_graph.store import (
    CancelTaskRequest,
    Charge,
    ClaimNode,
    ListTasksRequest,
    TimelineRequest,
)
from agentium_graph_sqlite import SCHEMA_VERSION, SQLiteDurableTaskStore


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.iterdir())
            if p.name.startswith(path.name) and p.is_file()}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _populate(path: Path, keys: tuple[str, ...] = ("k",)) -> None:
    async with SQLiteDurableTaskStore(path) as store:
        for key in keys:
            await store.create_task(create_request(key, ["n0", "n1"]))
            grant = await store.acquire_lease(acquire_request(key))
            await store.commit(commit_request(key, grant.fence, [
                ClaimNode(node_id="n0"), Charge(admission_id="adm", charges={"tool_calls": 1})]))


def _schema_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute(
            "SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0])
    finally:
        conn.close()


# --- 1. a new or 0-byte file is a new database --------------------------------------------

async def test_a_zero_byte_file_is_a_new_database(tmp_path: Path) -> None:
    path = tmp_path / "touched.db"
    path.touch()  # or a crash between the file's creation and its first write
    async with SQLiteDurableTaskStore(path) as store:
        assert await store.get_header("k") is None
        await store.create_task(create_request("k"))
    async with SQLiteDurableTaskStore(path) as store:
        assert (await store.get_header("k")) is not None
    assert _schema_version(path) == str(SCHEMA_VERSION)


async def test_two_stores_opening_a_fresh_path_at_once_both_succeed(tmp_path: Path) -> None:
    for round_ in range(12):  # the race used to fail in about 4 of 5 rounds
        path = tmp_path / f"fresh-{round_}.db"
        a, b = SQLiteDurableTaskStore(path), SQLiteDurableTaskStore(path)
        try:
            results = await asyncio.gather(a.get_header("k"), b.get_header("k"),
                                           return_exceptions=True)
        finally:
            await a.close()
            await b.close()
        assert results == [None, None], results
        assert _schema_version(path) == str(SCHEMA_VERSION)


_OPENER = textwrap.dedent("""
    import asyncio, pathlib, sys, time
    from agentium_graph_sqlite import SQLiteDurableTaskStore
    from agentium_graph.store import ListTasksRequest
    path, go, ready = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    async def main():
        async with SQLiteDurableTaskStore(path) as store:
            print(len(await store.list_tasks(ListTasksRequest())))
    asyncio.run(main())
""")


def test_processes_creating_one_file_at_once_all_succeed(tmp_path: Path) -> None:
    # The store package's directory on the path, whatever the children's site setup.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(agentium_graph_sqlite.__file__).parent.parent),
         os.environ.get("PYTHONPATH", "")])}
    for round_ in range(2):
        path, go = tmp_path / f"p{round_}.db", tmp_path / f"go{round_}"
        readies = [tmp_path / f"ready{round_}-{i}" for i in range(3)]
        procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(path), str(go),
                                   str(ready)], stdout=subprocess.PIPE, env=env,
                                  stderr=subprocess.PIPE, text=True) for ready in readies]
        try:
            while not all(r.exists() for r in readies):  # every process is about to open
                if any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.005)
            go.touch()
            outputs = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0 and out.strip() == "0", err
        assert _schema_version(path) == str(SCHEMA_VERSION)


# --- 2. text that is not UTF-8, integers out of range --------------------------------------

_BAD = "x\udcff"  # what a shell argument with the byte 0xff decodes to


@pytest.mark.parametrize("op", ["get_header", "get_task", "get_identity", "list_after",
                                "timeline", "cancel_key", "cancel_reason", "acquire_worker"])
async def test_text_that_is_not_utf8_is_a_typed_error_naming_the_field(
        tmp_path: Path, op: str) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    before = _files(path)
    calls: dict[str, tuple[str, Any]] = {
        "get_header": ("key", lambda s: s.get_header(_BAD)),
        "get_task": ("key", lambda s: s.get_task(_BAD)),
        "get_identity": ("key", lambda s: s.get_identity(_BAD)),
        "list_after": ("after", lambda s: s.list_tasks(ListTasksRequest(after=_BAD))),
        "timeline": ("key", lambda s: s.read_timeline(TimelineRequest(key=_BAD))),
        "cancel_key": ("key", lambda s: s.request_cancel(
            CancelTaskRequest(key=_BAD, reason="r", now=at(5)))),
        "cancel_reason": ("reason", lambda s: s.request_cancel(
            CancelTaskRequest(key="k", reason="stop " + _BAD, now=at(5)))),
        "acquire_worker": ("worker_id", lambda s: s.acquire_lease(
            acquire_request("k", worker=_BAD, now=100))),
    }
    field, call = calls[op]
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(ConfigurationError) as info:
            await call(store)
        header = await store.get_header("k")
    message = str(info.value)
    assert field in message and "UTF-8" in message, message
    assert header is not None and header.cancel is None and header.fence == 1
    assert _files(path) == before


async def test_a_timeline_position_beyond_any_seq_reads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    async with SQLiteDurableTaskStore(path) as store:
        assert await store.read_timeline(TimelineRequest(key="k", after_seq=10**20)) == []
        with pytest.raises(TaskNotFoundError):
            await store.read_timeline(TimelineRequest(key="nope", after_seq=10**20))


# --- 3. read-only opens ---------------------------------------------------------------------

async def test_read_only_store_reads_and_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path, ("a", "b"))
    before = _digest(path)
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        assert [h.key for h in await store.list_tasks(ListTasksRequest())] == ["a", "b"]
        snapshot = await store.get_task("a")
        assert snapshot is not None and snapshot.nodes["n0"].state == "claimed"
        assert await store.get_identity("a") is not None
        header = await store.get_header("a")
        assert header is not None
        assert [e.seq for e in await store.read_timeline(TimelineRequest(key="a"))] == list(
            range(1, header.journal_seq + 1))
        with pytest.raises(StoreError, match="read-only") as info:
            await store.request_cancel(CancelTaskRequest(key="a", reason="r", now=at(5)))
        assert "read_only" in str(info.value)
        with pytest.raises(StoreError, match="read-only"):
            await store.create_task(create_request("c"))
        assert store.stats.commits == 0
    assert _digest(path) == before
    async with SQLiteDurableTaskStore(path) as store:
        header = await store.get_header("a")
        assert header is not None and header.cancel is None
        assert await store.get_header("c") is None


def _blank_sqlite_file(path: Path) -> None:
    """A valid SQLite file without a single table (what `sqlite3 x.db .databases` leaves)."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("DROP TABLE t")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("blank", [True, False])
async def test_read_only_refuses_a_blank_or_empty_file_and_leaves_it_alone(
        tmp_path: Path, blank: bool) -> None:
    path = tmp_path / "blank.db"
    if blank:
        _blank_sqlite_file(path)
        assert path.stat().st_size > 0
    else:
        path.touch()
    before = _files(path)
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        with pytest.raises(StoreSchemaError, match="not an agentium-graph database"):
            await store.list_tasks(ListTasksRequest())
    assert _files(path) == before


async def test_read_only_does_not_create_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        with pytest.raises(StoreError, match="does not exist"):
            await store.get_header("k")
    assert not os.listdir(tmp_path)


async def test_read_only_opens_a_file_that_is_read_only(tmp_path: Path) -> None:
    """A file marked read-only (mode 0o444) is read, and left unchanged. The mode bits do
    not restrict root (this suite runs as root in CI), and SQLite opens a write-protected
    file read-only even without ``mode=ro``, so this cannot show that the store's connection
    is read-only: test_sqlite_read_only_as_root.py does, whatever the uid."""
    path = tmp_path / "tasks.db"
    await _populate(path)
    path.chmod(0o444)
    before = _digest(path)
    try:
        async with SQLiteDurableTaskStore(path, read_only=True) as store:
            assert (await store.get_header("k")) is not None
        assert _digest(path) == before and path.stat().st_mode & 0o777 == 0o444
    finally:
        path.chmod(0o644)


async def test_read_only_reads_a_version_1_file_without_migrating_it(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path, ("a",))
    async with SQLiteDurableTaskStore(path) as store:
        entries = await store.read_timeline(TimelineRequest(key="a", limit=1000))
    rewrite_as_version_1(path, {"a": entries})
    before = _digest(path)
    async with SQLiteDurableTaskStore(path, read_only=True) as store:
        assert await store.read_timeline(TimelineRequest(key="a", limit=1000)) == entries
        page = await store.read_timeline(TimelineRequest(key="a", after_seq=1, limit=1))
        assert [e.seq for e in page] == [2]
        with pytest.raises(TaskNotFoundError):
            await store.read_timeline(TimelineRequest(key="zz"))
        snapshot = await store.get_task("a")
        assert snapshot is not None and snapshot.nodes["n0"].state == "claimed"
    assert _schema_version(path) == "1" and _digest(path) == before
    async with SQLiteDurableTaskStore(path) as store:  # a writer still migrates it
        assert await store.read_timeline(TimelineRequest(key="a", limit=1000)) == entries
    assert _schema_version(path) == str(SCHEMA_VERSION)


async def test_create_false_refuses_what_is_not_already_a_task_database(
        tmp_path: Path) -> None:
    blank = tmp_path / "blank.db"
    blank.touch()
    async with SQLiteDurableTaskStore(blank, create=False) as store:
        with pytest.raises(StoreSchemaError, match="not an agentium-graph database"):
            await store.get_header("k")
    assert blank.read_bytes() == b""
    async with SQLiteDurableTaskStore(tmp_path / "absent.db", create=False) as store:
        with pytest.raises(StoreError, match="does not exist"):
            await store.get_header("k")
    assert not (tmp_path / "absent.db").exists()
    ours = tmp_path / "ours.db"
    await _populate(ours)
    async with SQLiteDurableTaskStore(ours, create=False) as store:
        await store.request_cancel(CancelTaskRequest(key="k", reason="r", now=at(5)))


def test_read_only_and_create_are_shown_and_validated(tmp_path: Path) -> None:
    store = SQLiteDurableTaskStore(tmp_path / "t.db", read_only=True)
    assert store.read_only and "read_only=True" in repr(store)
    with pytest.raises(ConfigurationError):
        SQLiteDurableTaskStore(tmp_path / "t.db", read_only="yes")  # type: ignore[arg-type]


# --- 4. a damaged row is named as damage ----------------------------------------------------

def _tamper(path: Path, sql: str, *args: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


async def test_a_row_that_is_not_json_is_named_as_damage(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path, tuple(f"t{i:03}" for i in range(8)))
    _tamper(path, "UPDATE tasks SET header = '{x' WHERE key = 't005'")
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreSchemaError) as info:
            await store.list_tasks(ListTasksRequest())
        assert (await store.get_header("t004")) is not None  # the others stay readable
        with pytest.raises(StoreSchemaError) as single:
            await store.get_header("t005")
    for error in (info.value, single.value):
        message = str(error)
        assert "'t005'" in message and "damaged" in message and "backup" in message
        assert "upgrade" not in message
        assert error.details["key"] == "t005"


async def test_a_record_with_unknown_fields_may_be_from_a_newer_version(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    _tamper(path, "UPDATE tasks SET header = json_set(header, '$.shiny_new_field', 1)")
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreSchemaError) as info:
            await store.list_tasks(ListTasksRequest())
    message = str(info.value)
    assert "'k'" in message and "newer" in message and "upgrade" in message
    assert "shiny_new_field" in message


@pytest.mark.parametrize(("sql", "fragments"), [
    ("UPDATE nodes SET record = '[]' WHERE node_id = 'n1'", ("'k'", "node 'n1'")),
    ("UPDATE journal SET entries = 'nope'", ("'k'", "journal")),
    ("UPDATE identities SET identity = '{\"key\": 1}'", ("'k'", "identity")),
])
async def test_damaged_node_journal_and_identity_rows_are_named(
        tmp_path: Path, sql: str, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    _tamper(path, sql)
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreSchemaError) as info:
            if "journal" in sql:
                await store.read_timeline(TimelineRequest(key="k"))
            elif "identities" in sql:
                await store.get_identity("k")
            else:
                await store.get_task("k")
    message = str(info.value)
    for fragment in (*fragments, "damaged"):
        assert fragment in message, message


# --- 8. paths -------------------------------------------------------------------------------

@pytest.mark.parametrize(("bad", "fragment"), [
    ("tasks\0.db", "NUL"), ("data/", "names a directory"), ("data/tasks\udcff.db", "UTF-8"),
])
def test_bad_paths_are_refused_at_construction(tmp_path: Path, bad: str,
                                               fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        SQLiteDurableTaskStore(str(tmp_path) + "/" + bad)
    assert list(tmp_path.iterdir()) == []


async def test_read_only_filesystem_is_named(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tasks.db"
    await _populate(path)
    real = os.statvfs
    monkeypatch.setattr("agentium_graph_sqlite._schema.os.statvfs",
                        lambda p: SimpleNamespace(f_flag=real(p).f_flag | os.ST_RDONLY))
    before = _files(path)
    async with SQLiteDurableTaskStore(path) as store:
        with pytest.raises(StoreError) as info:
            await store.get_header("k")
    async with SQLiteDurableTaskStore(tmp_path / "new.db") as new:
        with pytest.raises(StoreError) as created:
            await new.get_header("k")
    for error in (info.value, created.value):
        assert "read-only filesystem" in str(error) and "chmod" not in str(error)
    assert _files(path) == before and not (tmp_path / "new.db").exists()


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(source dir, the same dir bind-mounted read-only); skipped where mounting is denied."""
    source, mounted = tmp_path / "src", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or subprocess.run(
            ["mount", "--bind", "-o", "ro", str(source), str(mounted)],
            capture_output=True).returncode != 0:
        pytest.skip("needs a read-only bind mount (root on Linux)")
    try:
        yield source, mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


async def test_a_real_read_only_mount_is_named_and_still_readable(
        read_only_mount: tuple[Path, Path]) -> None:
    source, mounted = read_only_mount
    await _populate(source / "tasks.db")
    async with SQLiteDurableTaskStore(mounted / "tasks.db") as store:
        with pytest.raises(StoreError, match="read-only filesystem"):
            await store.get_header("k")
    async with SQLiteDurableTaskStore(mounted / "tasks.db", read_only=True) as reader:
        assert await reader.get_header("k") is not None
        assert len(await reader.read_timeline(TimelineRequest(key="k"))) > 1


async def test_dangling_symlink_names_the_targets_directory(tmp_path: Path) -> None:
    link = tmp_path / "tasks.db"
    link.symlink_to(tmp_path / "gone" / "real.db")
    async with SQLiteDurableTaskStore(link) as store:
        with pytest.raises(StoreError) as info:
            await store.get_header("k")
    assert str(tmp_path / "gone") in str(info.value)
    assert "symlink" in str(info.value)
