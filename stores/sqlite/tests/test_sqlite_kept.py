"""What a store keeps of the tasks it wrote (``_ops.Kept``): never stale, never shared.

A store reuses the header and records of its own last write only while the task's header
row is byte-for-byte what it wrote. Every test here has another connection (a second store
or a child process) change the task between two writes of the first store, or a caller
mutate what it was handed, and would fail if the kept state were used regardless.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlite_helpers import acquire_request, at, commit_request, create_request

from agentium_graph._canonical import digest_text
from agentium_graph.errors import ErrorInfo, InvalidTransitionError, StaleFenceError, StoreError
from agentium_graph.store import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    Charge,
    NodeRecord,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SettleNode,
    StartAttempt,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore
from agentium_graph_sqlite._ops import Kept, _Task
from agentium_graph_sqlite._schema import StoreConnection

_HEADER_READ = "SELECT header FROM tasks WHERE key = ?"


def _blob(text: str) -> tuple[str, str]:
    return digest_text(text), text


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the stores opened in the test execute, in order."""
    seen: list[str] = []

    class Recording(StoreConnection):  # what the store's own factory makes, and more
        def execute(self, sql: str, params: Any = (), /) -> Any:
            seen.append(sql)
            return super().execute(sql, params)

        def executemany(self, sql: str, rows: Any, /) -> Any:
            seen.append(sql)
            return super().executemany(sql, rows)

    real_connect: Any = sqlite3.connect
    monkeypatch.setattr("agentium_graph_sqlite._schema.sqlite3.connect",
                        lambda *a, **k: real_connect(*a, **{**k, "factory": Recording}))
    return seen


def _reads(statements: list[str]) -> list[str]:
    return [sql for sql in statements if sql.startswith("SELECT")]


async def _stored(db_path: Path, key: str = "k") -> Any:
    """The task as a store that never wrote it reads it."""
    async with SQLiteDurableTaskStore(db_path) as fresh:
        return await fresh.get_task(key)


async def test_a_store_reads_only_the_header_of_a_task_it_wrote(
        db_path: Path, statements: list[str]) -> None:
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k", ["a", "b"]))
        grant = await store.acquire_lease(acquire_request("k"))
        statements.clear()
        digest_, text = _blob("1")
        await store.commit(commit_request("k", grant.fence, [
            StartAttempt(node_id="a", attempt_id="att-a", admission_id="adm-a",
                         charges={"work_attempts": 1})]))
        await store.commit(commit_request("k", grant.fence, [
            SettleNode(node_id="a", state="completed", output_digest=digest_),
            StartAttempt(node_id="b", attempt_id="att-b", admission_id="adm-b",
                         charges={"work_attempts": 1}, requires_completed=("a",))],
            blobs={digest_: text}))
        # Neither node rows nor admission ids are read: the store wrote all of them.
        assert _reads(statements) == [_HEADER_READ, _HEADER_READ]
        # A charge it already made is still recognized without reading it back.
        again = await store.commit(commit_request("k", grant.fence, [
            Charge(admission_id="adm-a", charges={"work_attempts": 1})]))
        assert again.already_charged == ("adm-a",)
        assert _reads(statements) == [_HEADER_READ] * 3
        mine = await store.get_task("k")
    assert mine == await _stored(db_path)


async def test_a_commit_by_another_store_in_between_is_seen(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as one, SQLiteDurableTaskStore(db_path) as two:
        await one.create_task(create_request("k", ["a", "b"]))
        await one.acquire_lease(acquire_request("k"))
        await one.commit(commit_request("k", 1, [StartAttempt(node_id="a", attempt_id="a1")]))
        # The same worker restarted elsewhere: a newer fence, and it completes ``a``.
        grant = await two.acquire_lease(acquire_request("k", now=2))
        digest_, text = _blob("1")
        await two.commit(commit_request("k", grant.fence, [
            SettleNode(node_id="a", state="completed", output_digest=digest_)],
            blobs={digest_: text}, now=3))
        # ``one`` still holds fence 1 and its own last write of the task: it must be fenced
        # off, not apply the commit to the state it wrote.
        with pytest.raises(StaleFenceError):
            await one.commit(commit_request("k", 1, [
                SettleNode(node_id="a", state="failed",
                           error=ErrorInfo(code="x", message="late"))], now=4))
        # Taking the lease again, it starts from what ``two`` wrote (``a`` completed).
        again = await one.acquire_lease(AcquireLeaseRequest(
            key="k", worker_id="w1", ttl_seconds=10, now=at(5), steps=(
                StartAttempt(node_id="b", attempt_id="b1", requires_completed=("a",)),)))
        assert again.fence == grant.fence + 1
        assert again.commit is not None and again.commit.nodes["b"].state == "running"
        snapshot = await one.get_task("k")
    assert snapshot is not None and snapshot.nodes["a"].state == "completed"
    assert snapshot.nodes["a"].attempts[0].outcome == "completed"
    assert snapshot == await _stored(db_path)


async def test_a_cancel_request_from_another_store_is_never_overwritten(
        db_path: Path) -> None:
    # A cancel request does not move ``seq``: only the header's text tells it happened.
    async with SQLiteDurableTaskStore(db_path) as one, SQLiteDurableTaskStore(db_path) as two:
        await one.create_task(create_request("k", ["a", "b"]))
        await one.acquire_lease(acquire_request("k"))
        await one.commit(commit_request("k", 1, [StartAttempt(node_id="a", attempt_id="a1")]))
        await two.request_cancel(CancelTaskRequest(key="k", reason="operator", now=at(2)))
        result = await one.commit(commit_request("k", 1, [
            SettleNode(node_id="a", state="canceled")], now=3))
        assert result.header.cancel is not None
        status = await one.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=1,
                                                         ttl_seconds=10, now=at(4)))
        assert status.cancel is not None and status.cancel.reason == "operator"
    stored = await _stored(db_path)
    assert stored.header.cancel is not None and stored.header.cancel.reason == "operator"


async def test_a_commit_by_another_process_in_between_is_seen(db_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from datetime import datetime\n"
        "from agentium_graph.store import AcquireLeaseRequest, CommitRequest, SettleNode\n"
        "from agentium_graph.store import StartAttempt\n"
        "from agentium_graph.testing import load_factory\n"
        "async def main():\n"
        "    now = datetime.fromisoformat(sys.argv[2])\n"
        "    store = load_factory('agentium_graph_sqlite.testing:open_store')(sys.argv[1])\n"
        "    async with store:\n"
        "        grant = await store.acquire_lease(AcquireLeaseRequest(\n"
        "            key='k', worker_id='w1', ttl_seconds=60, now=now))\n"
        "        await store.commit(CommitRequest(key='k', worker_id='w1',\n"
        "            fence=grant.fence, now=now, steps=(\n"
        "                SettleNode(node_id='a', state='completed', output_digest='sha256:x'),\n"
        "                StartAttempt(node_id='b', attempt_id='b-child',\n"
        "                             requires_completed=('a',)))))\n"
        "        print(grant.fence)\n"
        "asyncio.run(main())\n")
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k", ["a", "b"]))
        await store.acquire_lease(acquire_request("k"))
        await store.commit(commit_request("k", 1, [StartAttempt(node_id="a", attempt_id="a1")]))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, str(db_path), at(2).isoformat(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        child_fence = int(out.decode())
        with pytest.raises(StaleFenceError):
            await store.commit(commit_request("k", 1, [
                SettleNode(node_id="a", state="completed", output_digest="sha256:y")], now=3))
        grant = await store.acquire_lease(acquire_request("k", now=4))
        assert grant.fence == child_fence + 1
        # ``b`` runs under the child's attempt: a new one interrupts it (needs the row).
        result = await store.commit(commit_request("k", grant.fence, [
            StartAttempt(node_id="b", attempt_id="b-parent")], now=5))
        attempts = result.nodes["b"].attempts
        assert [(a.attempt_id, a.outcome) for a in attempts] == [
            ("b-child", "interrupted"), ("b-parent", None)]
    stored = await _stored(db_path)
    assert stored.nodes["a"].output_digest == "sha256:x"
    assert stored.nodes["b"].attempts == attempts


async def test_returned_records_share_nothing_mutable_with_the_store(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as store:
        created = await store.create_task(create_request("k", ["a", "b"]))
        created.header.counters["tool_calls"] = 1000
        created.header.limits["tool_calls"] = 0
        grant = await store.acquire_lease(acquire_request("k"))
        grant.header.counters["tool_calls"] = 1000
        grant.header.limits["tool_calls"] = 0
        first = await store.commit(commit_request("k", 1, [
            StartAttempt(node_id="a", attempt_id="a1", admission_id="adm-a",
                         charges={"tool_calls": 1})]))
        first.header.counters["tool_calls"] = 1000
        first.header.limits["tool_calls"] = 0
        # An uncertain node keeps its error through a new attempt: the error's details are
        # a dict, so a record holding it is never kept.
        settled = await store.commit(commit_request("k", 1, [SettleNode(
            node_id="a", state="uncertain",
            error=ErrorInfo(code="lost", message="?", details={"n": 1}))]))
        error = settled.nodes["a"].error
        assert error is not None
        error.details["n"] = 2
        renewed = await store.renew_lease(RenewLeaseRequest(
            key="k", worker_id="w1", fence=1, ttl_seconds=10, now=at(2)))
        assert renewed.fence == 1
        result = await store.commit(commit_request("k", 1, [
            StartAttempt(node_id="a", attempt_id="a2", admission_id="adm-a2",
                         charges={"tool_calls": 1})], now=3))
        assert result.header.counters["tool_calls"] == 2
        assert result.header.limits["tool_calls"] == 10
        node = result.nodes["a"]
        assert node.error is not None and node.error.details == {"n": 1}
        cancel = await store.request_cancel(CancelTaskRequest(key="k", reason="r", now=at(4)))
        cancel.counters["tool_calls"] = 1000
        repeat = await store.request_cancel(CancelTaskRequest(key="k", reason="s", now=at(4)))
        repeat.counters["tool_calls"] = 1000  # the no-op returns the current header
        result = await store.commit(commit_request("k", 1, [
            Charge(admission_id="adm-c", charges={"tool_calls": 1})], now=4))
        assert result.header.counters["tool_calls"] == 3
        assert result.header.limits["tool_calls"] == 10
        released = await store.release_lease(ReleaseLeaseRequest(
            key="k", worker_id="w1", fence=1, now=at(5)))
        released.limits["tool_calls"] = 0
        mine = await store.get_task("k")
    stored = await _stored(db_path)
    assert mine == stored
    assert stored.header.counters["tool_calls"] == 3
    assert stored.header.limits["tool_calls"] == 10


@pytest.mark.parametrize("failing", ["UPDATE tasks", "COMMIT"])
async def test_a_commit_that_failed_after_writing_is_forgotten(
        db_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    fail = {"on": False}

    class Failing(StoreConnection):
        def execute(self, sql: str, params: Any = (), /) -> Any:
            if fail["on"] and sql.startswith(failing):
                fail["on"] = False
                raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql, params)

    real_connect: Any = sqlite3.connect
    monkeypatch.setattr("agentium_graph_sqlite._schema.sqlite3.connect",
                        lambda *a, **k: real_connect(*a, **{**k, "factory": Failing}))
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k", ["a", "b"]))
        await store.acquire_lease(acquire_request("k"))
        start = commit_request("k", 1, [StartAttempt(node_id="a", attempt_id="a1",
                                                     admission_id="adm-a",
                                                     charges={"work_attempts": 1})])
        fail["on"] = True  # rows are written, then the header or the COMMIT fails
        with pytest.raises(StoreError):
            await store.commit(start)
        # Rolled back: the same commit applies once, as if the first had never happened.
        result = await store.commit(start)
        assert result.charged == ("adm-a",)
        assert [a.attempt_id for a in result.nodes["a"].attempts] == ["a1"]
        with pytest.raises(InvalidTransitionError):  # and now it did happen
            await store.commit(start)
        mine = await store.get_task("k")
    assert mine == await _stored(db_path)


async def test_a_snapshot_lets_the_store_skip_node_reads(
        db_path: Path, statements: list[str]) -> None:
    async with SQLiteDurableTaskStore(db_path) as creator:
        await creator.create_task(create_request("k", ["a", "b"]))
    async with SQLiteDurableTaskStore(db_path) as store:
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key="k", worker_id="w1", ttl_seconds=10, now=at(0), snapshot=True))
        statements.clear()
        await store.commit(commit_request("k", grant.fence, [
            StartAttempt(node_id="a", attempt_id="a1")]))
        assert _reads(statements) == [_HEADER_READ]


def test_kept_tasks_are_bounded() -> None:
    def task(nodes: int) -> _Task:
        records: dict[str, NodeRecord | None] = dict.fromkeys(
            (f"n{i}" for i in range(nodes)), None)
        return _Task("{}", None, records, set(), all_nodes=True,  # type: ignore[arg-type]
                     all_charged=True)

    kept = Kept(max_tasks=2, max_nodes=10)
    kept.put("a", task(3))
    kept.put("b", task(3))
    kept.put("c", task(3))  # over max_tasks: the least recently put goes
    assert len(kept) == 2 and kept.take("a") is None
    kept.put("b", task(3))  # b is now the most recent
    kept.put("d", task(6))  # 3 + 3 + 6 nodes > 10: c goes
    assert kept.take("c") is None and kept.take("b") is not None
    kept.put("big", task(11))  # bigger than the whole bound: not kept at all
    assert kept.take("big") is None and kept.take("d") is not None
    assert len(kept) == 0
