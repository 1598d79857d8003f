"""Review 16: every ``await store.close()`` returns only once the file is closed.

A second close() that arrived while the first was still closing returned at once, with the
connection open and the last commits still only in the write-ahead log: a caller that then
copied, moved or deleted ``tasks.db`` (a backup after shutdown, a test's cleanup) worked on
a file that did not yet hold them.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlite_helpers import create_request

from agentium_graph.errors import StoreError
from agentium_graph_sqlite import SQLiteDurableTaskStore


async def test_a_second_close_waits_until_the_first_has_closed_the_file(
        db_path: Path) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    wal = db_path.with_name(db_path.name + "-wal")
    assert wal.exists()
    gate = threading.Event()
    busy = asyncio.ensure_future(store._on_worker(gate.wait))  # the worker is held here
    first = asyncio.create_task(store.close())
    second = asyncio.create_task(store.close())
    for _ in range(5):
        await asyncio.sleep(0)
    # The file cannot be closed yet (its worker is held), so neither close may be done.
    assert not first.done() and not second.done()
    gate.set()
    await second
    assert not wal.exists()  # closed: the last connection checkpointed and removed the log
    await first
    await busy
    await store.close()  # and a later close is still a no-op
    with pytest.raises(StoreError, match="is closed"):
        await store.get_header("k")


async def test_a_close_from_another_event_loop_waits_too(db_path: Path) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    wal = db_path.with_name(db_path.name + "-wal")
    gate = threading.Event()
    busy = asyncio.ensure_future(store._on_worker(gate.wait))
    first = asyncio.create_task(store.close())
    await asyncio.sleep(0)
    seen: list[bool] = []

    def other_loop() -> None:
        asyncio.run(store.close())
        seen.append(wal.exists())

    thread = threading.Thread(target=other_loop)
    thread.start()
    gate.set()
    await asyncio.to_thread(thread.join)
    assert seen == [False]
    await first
    await busy


async def test_an_operation_queued_behind_the_close_does_not_reopen_the_file(
        db_path: Path) -> None:
    # Another thread's operation can pass the closed check just before close() and queue
    # its call right behind the close's: that call reopened the file, and the connection
    # was left open after close() returned.
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    gate = threading.Event()
    busy = asyncio.ensure_future(store._on_worker(gate.wait))
    executor = store._worker()  # what the other thread's operation got before close()
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0)
    late = executor.submit(lambda: store._call("get_header", lambda conn: conn))
    gate.set()
    await closing
    with pytest.raises(StoreError, match="is closed"):
        await late
    assert store._conn is None
    await busy
