"""WAL checkpoints run on the store's background checkpointer, never inside a commit.

The write connection's auto-checkpoint is only a backstop (8000 pages), so a WAL file that
stays small proves the checkpointer copied the WAL into the database file *and* the WAL
started over (an unbounded WAL, or one left to the backstop, grows past the bound checked
here). A failing checkpointer only logs; commits and data are unaffected.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from sqlite_helpers import create_request

from agentium_graph.store import ListTasksRequest
from agentium_graph_sqlite import SQLiteDurableTaskStore, _checkpoint
from agentium_graph_sqlite._schema import WAL_BACKSTOP_PAGES, Settings, open_database

_FRAME = 4096 + 24  # one WAL frame: a 4 KiB page and its header


def _wal(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + "-wal")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def _until(ready: Callable[[], bool], what: str) -> None:
    """Wait for something a background thread does (generous; not a timing assertion)."""
    for _ in range(3000):
        if ready():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting until {what}")


def _thread(store: SQLiteDurableTaskStore) -> threading.Thread:
    checkpointer = store._checkpointer
    assert checkpointer is not None and checkpointer.thread is not None
    return checkpointer.thread


async def _write_until_started(store: SQLiteDurableTaskStore, prefix: str) -> int:
    """Create tasks (at least one) until the store's checkpointer thread runs; how many."""
    n = 0
    while n == 0 or store._checkpointer is None or store._checkpointer.thread is None:
        await store.create_task(create_request(f"{prefix}{n}"))
        n += 1
        assert n < 10_000
    return n


async def _all_keys(db_path: Path) -> list[str]:
    keys: list[str] = []
    async with SQLiteDurableTaskStore(db_path) as fresh:
        after: str | None = None
        while page := await fresh.list_tasks(ListTasksRequest(after=after, limit=1000)):
            keys += [h.key for h in page]
            after = page[-1].key
    return keys


async def test_the_wal_starts_over_long_before_the_backstop(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pass about every 30 creates; the WAL may miss several rewinds and still pass. With no
    # checkpointer (or one whose passes never let the WAL start over) it would grow to the
    # 8000-page backstop: 600 creates write well over 2000 pages.
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 200)
    bound = 2000 * _FRAME
    largest = 0
    async with SQLiteDurableTaskStore(db_path, synchronous="NORMAL") as store:
        for i in range(600):
            await store.create_task(create_request(f"k{i:04d}"))
            largest = max(largest, _size(_wal(db_path)))
            # A signal the thread has not taken up yet is waited for: on a loaded machine the
            # thread may not be scheduled for many commits, which says nothing about whether
            # its passes let the WAL start over (what this test is about).
            checkpointer = store._checkpointer
            if checkpointer is not None:
                wake = checkpointer._shared.wake
                await _until(lambda w=wake: not w.is_set(), "the checkpointer took up a signal")
        assert store.stats.commits == 600
        assert _thread(store).is_alive()
    assert 0 < largest < bound
    assert WAL_BACKSTOP_PAGES > 2000
    assert _size(db_path) > 100 * 4096  # the pages reached the database file
    assert not _wal(db_path).exists()  # the last connection's close still removes the WAL
    assert await _all_keys(db_path) == [f"k{i:04d}" for i in range(600)]


def _failing_in(where: str) -> tuple[list[str], Callable[[sqlite3.Connection], Any]]:
    """A checkpoint that raises on the named thread ('background' or the worker's
    'finishing' step) and works elsewhere; also the threads it raised on."""
    real = _checkpoint.checkpoint
    raised: list[str] = []

    def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
        name = threading.current_thread().name
        background = name == _checkpoint.THREAD_NAME
        if background == (where == "background"):
            raised.append(name)
            raise sqlite3.OperationalError("disk I/O error")
        return real(conn)

    return raised, checkpoint


@pytest.mark.parametrize("where", ["background", "finishing"])
async def test_a_failing_checkpoint_never_fails_a_commit(
        db_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        where: str) -> None:
    caplog.set_level(logging.WARNING, logger="agentium_graph.sqlite")
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    raised, failing = _failing_in(where)
    monkeypatch.setattr(_checkpoint, "checkpoint", failing)
    written: list[str] = []
    async with SQLiteDurableTaskStore(db_path, synchronous="NORMAL") as store:
        for _ in range(3000):  # until the failure happened at least twice
            if len(raised) >= 2:
                break
            key = f"k{len(written):04d}"
            await store.create_task(create_request(key))
            written.append(key)
            await asyncio.sleep(0)
        await _until(lambda: len(raised) >= 2, "the checkpoint failed twice")
        assert store.stats.commits == len(written)
        for key in written[::7]:
            header = await store.get_header(key)
            assert header is not None and header.task_id == f"task_{key}"
    assert set(raised) == {_checkpoint.THREAD_NAME if where == "background"
                           else "agentium-sqlite"}
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentium_graph.sqlite"]
    assert warnings and all("disk I/O error" in w and "commits are unaffected" in w
                            for w in warnings)
    assert await _all_keys(db_path) == written


async def test_a_reader_holding_the_wal_blocks_no_commit(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    passes: list[tuple[int, int, int]] = []
    real = _checkpoint.checkpoint

    def recorded(conn: sqlite3.Connection) -> tuple[int, int, int]:
        result = real(conn)
        if threading.current_thread().name == _checkpoint.THREAD_NAME:
            passes.append(result)
        return result

    monkeypatch.setattr(_checkpoint, "checkpoint", recorded)
    async with SQLiteDurableTaskStore(db_path, synchronous="NORMAL") as store:
        await store.create_task(create_request("first"))
        reader = sqlite3.connect(db_path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM tasks").fetchone() == (1,)
            for i in range(300):  # no checkpoint can pass the reader's snapshot
                await store.create_task(create_request(f"k{i:03d}"))
            assert _thread(store).is_alive()
            ran = lambda: [p for p in passes if p[1] >= 0]  # noqa: E731
            await _until(lambda: bool(ran()), "a background pass ran")
            # Passive passes: none that ran waited for the reader (busy) or got past its
            # snapshot, and no commit met a lock. (A pass may also not start at all, reported
            # as (1, -1, -1), when it meets another connection's lock for a moment under
            # load: that is not waiting for the reader.)
            assert all(busy == 0 and done < frames for busy, frames, done in ran()), passes
            assert all(p == (1, -1, -1) for p in passes if p[1] < 0), passes
            assert store.stats.busy_retries == 0
            assert reader.execute("SELECT count(*) FROM tasks").fetchone() == (1,)
        finally:
            reader.close()
        await store.create_task(create_request("last"))
    assert len(await _all_keys(db_path)) == 302


async def test_close_ends_the_checkpointer_and_closing_again_is_a_no_op(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    store = SQLiteDurableTaskStore(db_path)
    await _write_until_started(store, "k")
    checkpointer = store._checkpointer
    assert checkpointer is not None
    thread = _thread(store)
    await _until(lambda: checkpointer._shared.conn is not None, "its connection is open")
    await store.close()
    assert not thread.is_alive()
    assert checkpointer._shared.conn is None
    assert store._checkpointer is None
    assert not any(t.name == _checkpoint.THREAD_NAME and t.is_alive() and t is thread
                   for t in threading.enumerate())
    await store.close()  # a no-op
    checkpointer.close()  # also a no-op


async def test_a_store_dropped_without_close_ends_its_checkpointer(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)

    async def use_and_drop() -> threading.Thread:
        store = SQLiteDurableTaskStore(db_path)
        await _write_until_started(store, "k")
        return _thread(store)

    thread = await use_and_drop()
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()


async def test_a_forked_child_starts_its_own_checkpointer(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    store = SQLiteDurableTaskStore(db_path)
    await _write_until_started(store, "parent")
    parents = store._checkpointer
    assert parents is not None
    parent_thread = _thread(store)
    monkeypatch.setattr("agentium_graph_sqlite._store.os.getpid", lambda: -1)  # "after fork"
    await _write_until_started(store, "child")
    assert store._checkpointer is not parents
    assert store._inherited_checkpointers == [parents]
    child_thread = _thread(store)
    await store.close()
    assert not child_thread.is_alive()
    assert parent_thread.is_alive()  # in a real child it would not exist; never touched
    parents.close()
    for executor, conn in store._inherited:
        assert conn is not None
        await executor.submit(conn.close)
        executor.stop()


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1)])
async def test_both_connections_keep_the_store_settings(
        db_path: Path, monkeypatch: pytest.MonkeyPatch,
        synchronous: Literal["FULL", "NORMAL"], level: int) -> None:
    seen: dict[str, object] = {}
    real_connect = _checkpoint._connect

    def connect(settings: Settings) -> sqlite3.Connection:
        conn = real_connect(settings)
        seen["checkpointer synchronous"] = conn.execute("PRAGMA synchronous").fetchone()[0]
        return conn

    def spying_open(settings: Settings) -> sqlite3.Connection:
        conn = open_database(settings)
        seen["writer autocheckpoint"] = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        return conn

    monkeypatch.setattr(_checkpoint, "_connect", connect)
    monkeypatch.setattr("agentium_graph_sqlite._store.open_database", spying_open)
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    async with SQLiteDurableTaskStore(db_path, synchronous=synchronous) as store:
        await _write_until_started(store, "k")
        await _until(lambda: "checkpointer synchronous" in seen, "the checkpointer connected")
    assert seen == {"writer autocheckpoint": WAL_BACKSTOP_PAGES,
                    "checkpointer synchronous": level}


async def test_a_persistently_failing_checkpointer_gives_up_after_a_few_tries(
        db_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentium_graph.sqlite")
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    raised, failing = _failing_in("background")
    monkeypatch.setattr(_checkpoint, "checkpoint", failing)
    async with SQLiteDurableTaskStore(db_path, synchronous="NORMAL") as store:
        await _write_until_started(store, "a")
        thread = _thread(store)
        for i in range(2000):  # many more signals than tries
            if not thread.is_alive():
                break
            await store.create_task(create_request(f"b{i:04d}"))
            await asyncio.sleep(0)
        await _until(lambda: not thread.is_alive(), "the checkpointer gave up")
        assert len(raised) == _checkpoint.MAX_FAILURES
        await store.create_task(create_request("after"))  # commits go on
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentium_graph.sqlite"]
    assert len(warnings) == _checkpoint.MAX_FAILURES + 1
    assert "stop after 5 failures in a row" in warnings[-1]
    assert "after" in await _all_keys(db_path)


async def test_the_checkpointer_never_opens_a_file_that_replaced_the_database(
        db_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The checkpointer's connection opens the path later than the store's: if the path now
    # names another file (moved in by a restore, say), it must not open it.
    caplog.set_level(logging.WARNING, logger="agentium_graph.sqlite")
    monkeypatch.setattr(_checkpoint, "THRESHOLD_PAGES", 20)
    connects: list[str] = []
    real_connect = sqlite3.connect

    def spy(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        if threading.current_thread().name == _checkpoint.THREAD_NAME:
            connects.append(str(args[0]))
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(_checkpoint.sqlite3, "connect", spy)
    real_identity = _checkpoint.file_identity

    def moved(settings: Settings) -> tuple[int, int] | None:
        # What the store opened is the real file; the path seen later names another one.
        if threading.current_thread().name == _checkpoint.THREAD_NAME:
            return (-1, -1)
        return real_identity(settings)

    monkeypatch.setattr(_checkpoint, "file_identity", moved)
    async with SQLiteDurableTaskStore(db_path, synchronous="NORMAL") as store:
        await _write_until_started(store, "k")
        thread = _thread(store)
        await _until(lambda: not thread.is_alive(), "the checkpointer stopped")
        await store.create_task(create_request("after"))
    assert connects == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentium_graph.sqlite"]
    assert len(warnings) == 1 and "no longer the database file" in warnings[0]
    assert "after" in await _all_keys(db_path)
