"""Behaviour of SQLiteDurableTaskStore through the store protocol."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from sqlite_helpers import acquire_request, at, commit_request, create_request

from agentium_graph._canonical import digest_text
from agentium_graph.errors import (
    BudgetExhaustedError,
    ErrorInfo,
    InvalidTransitionError,
    LeaseHeldError,
    StaleFenceError,
    StoreError,
    TaskConflictError,
    TaskNotFoundError,
)
from agentium_graph.store import (
    ActionRecord,
    AppendJournal,
    CancelTaskRequest,
    Charge,
    ClaimNode,
    ListTasksRequest,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SetStatus,
    SettleNode,
    StartAttempt,
    TimelineRequest,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore
from agentium_graph_sqlite._schema import Settings, StoreConnection, open_database


def _blob(text: str) -> tuple[str, str]:
    return digest_text(text), text


async def test_capabilities_and_no_io_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    store = SQLiteDurableTaskStore(path)
    assert store.capabilities.durable and store.capabilities.multi_process
    assert store.capabilities.name == "sqlite"
    assert not path.exists()
    assert await store.get_header("nope") is None
    assert path.exists()
    await store.close()


async def test_create_is_idempotent_and_conflicts_name_fields(
        store: SQLiteDurableTaskStore) -> None:
    first = await store.create_task(create_request("k"))
    again = await store.create_task(create_request("k"))
    assert first.created and not again.created
    assert again.header == first.header
    with pytest.raises(TaskConflictError) as info:
        await store.create_task(create_request("k", input_value=2))
    assert "input" in info.value.differing
    identity = await store.get_identity("k")
    assert identity is not None and identity.input == {"x": 1}
    assert store.stats.commits == 1


async def test_full_node_lifecycle_round_trips(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    grant = await store.acquire_lease(acquire_request("k"))
    assert grant.fence == 1
    out_digest, out_text = _blob('{"v":1}')
    result = await store.commit(commit_request("k", 1, [
        ClaimNode(node_id="a"),
        StartAttempt(node_id="a", attempt_id="att-a-1", admission_id="adm-a-1",
                     charges={"work_attempts": 1, "tool_calls": 1}),
    ]))
    assert result.charged == ("adm-a-1",)
    assert result.nodes["a"].state == "running"
    await store.commit(commit_request("k", 1, [
        SettleNode(node_id="a", state="completed", output_digest=out_digest),
        StartAttempt(node_id="b", attempt_id="att-b-1", requires_completed=("a",)),
    ], blobs={out_digest: out_text}, now=2.0))
    snapshot = await store.get_task("k")
    assert snapshot is not None
    assert snapshot.nodes["a"].state == "completed"
    assert snapshot.nodes["a"].attempts[0].fence == 1
    assert snapshot.nodes["b"].state == "running"
    assert snapshot.header.counters["work_attempts"] == 1
    assert await store.get_blobs([out_digest, "sha256:missing"]) == {out_digest: out_text}
    assert await store.get_blobs([]) == {}
    timeline = await store.read_timeline(TimelineRequest(key="k"))
    assert [e.seq for e in timeline] == list(range(1, snapshot.header.journal_seq + 1))
    assert timeline[0].kind == "task_created"
    assert timeline[1].kind == "lease_acquired"
    page = await store.read_timeline(TimelineRequest(key="k", after_seq=2, limit=2))
    assert [e.seq for e in page] == [3, 4]


async def test_stale_fence_changes_nothing(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    await store.acquire_lease(acquire_request("k", "w1"))
    await store.acquire_lease(acquire_request("k", "w2", now=20.0))  # w1's lease expired
    before = await store.get_task("k")
    commits = store.stats.commits
    for call in (
        store.commit(commit_request("k", 1, [ClaimNode(node_id="a")])),
        store.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=1,
                                            ttl_seconds=5, now=at(21))),
        store.release_lease(ReleaseLeaseRequest(key="k", worker_id="w1", fence=1,
                                                now=at(21))),
    ):
        with pytest.raises(StaleFenceError):
            await call
    assert await store.get_task("k") == before
    assert store.stats.commits == commits


async def test_failed_step_rolls_back_the_whole_commit(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    await store.acquire_lease(acquire_request("k"))
    before = await store.get_task("k")
    digest_, text = _blob('"x"')
    with pytest.raises(InvalidTransitionError):
        await store.commit(commit_request("k", 1, [
            ClaimNode(node_id="a"),
            SettleNode(node_id="b", state="completed"),  # no output digest: invalid
        ], blobs={digest_: text}))
    assert await store.get_task("k") == before
    assert await store.get_blobs([digest_]) == {}


async def test_admissions_charge_once_and_budgets_hold(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k", limits={"tool_calls": 2}))
    await store.acquire_lease(acquire_request("k"))
    first = await store.commit(commit_request("k", 1, [
        Charge(admission_id="x", charges={"tool_calls": 2})]))
    assert first.charged == ("x",)
    again = await store.commit(commit_request("k", 1, [
        Charge(admission_id="x", charges={"tool_calls": 2})]))
    assert again.charged == () and again.already_charged == ("x",)
    with pytest.raises(BudgetExhaustedError):
        await store.commit(commit_request("k", 1, [
            Charge(admission_id="y", charges={"tool_calls": 1})]))
    header = await store.get_header("k")
    assert header is not None and header.counters["tool_calls"] == 2


async def test_actions_are_stored_and_advanced(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    await store.acquire_lease(acquire_request("k"))
    intent = ActionRecord(action_id="act-1", node_id="a", state="intent", admission_id="adm-1",
                          origin={"binding": "t"}, request_digest="sha256:r",
                          result_ref="act-1", fence=1)
    await store.commit(commit_request("k", 1, [RecordAction(action=intent)]))
    await store.commit(commit_request("k", 1, [RecordAction(
        action=intent.model_copy(update={"state": "dispatching"}))]))
    snapshot = await store.get_task("k")
    assert snapshot is not None
    assert snapshot.actions["act-1"].state == "dispatching"
    with pytest.raises(InvalidTransitionError):
        await store.commit(commit_request("k", 1, [RecordAction(
            action=intent.model_copy(update={"state": "dispatching", "origin": {}}))]))


async def test_cancel_first_reason_wins_and_renew_observes_it(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with SQLiteDurableTaskStore(path) as owner, SQLiteDurableTaskStore(path) as other:
        await owner.create_task(create_request("k"))
        await owner.acquire_lease(acquire_request("k"))
        header = await other.request_cancel(CancelTaskRequest(key="k", reason="stop",
                                                              now=at(1)))
        assert header.cancel is not None and header.cancel.reason == "stop"
        again = await other.request_cancel(CancelTaskRequest(key="k", reason="other",
                                                             now=at(2)))
        assert again.cancel == header.cancel
        status = await owner.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=1,
                                                           ttl_seconds=10, now=at(3)))
        assert status.cancel is not None and status.cancel.reason == "stop"
        await owner.commit(commit_request("k", 1, [SetStatus(status="canceled")]))
        done = await other.request_cancel(CancelTaskRequest(key="k", reason="late", now=at(4)))
        assert done.status == "canceled"
        with pytest.raises(InvalidTransitionError):
            await owner.acquire_lease(acquire_request("k", now=5))
        # A terminal task still accepts journal-only commits.
        await owner.commit(commit_request("k", 1, [AppendJournal(kind="note")]))


async def test_unknown_keys_raise_task_not_found(store: SQLiteDurableTaskStore) -> None:
    for call in (
        store.acquire_lease(acquire_request("ghost")),
        store.commit(commit_request("ghost", 1, [ClaimNode(node_id="a")])),
        store.read_timeline(TimelineRequest(key="ghost")),
        store.request_cancel(CancelTaskRequest(key="ghost", reason="r", now=at(0))),
    ):
        with pytest.raises(TaskNotFoundError):
            await call
    assert await store.get_task("ghost") is None
    assert await store.get_identity("ghost") is None


async def test_list_tasks_filters_and_pages(store: SQLiteDurableTaskStore) -> None:
    for key in ("c", "a", "b", "d"):
        await store.create_task(create_request(key))
    await store.acquire_lease(acquire_request("b"))
    await store.commit(commit_request("b", 1, [SetStatus(status="completed",
                                                         release_lease=True)]))
    keys = [h.key for h in await store.list_tasks(ListTasksRequest())]
    assert keys == ["a", "b", "c", "d"]
    page = await store.list_tasks(ListTasksRequest(after="a", limit=2))
    assert [h.key for h in page] == ["b", "c"]
    pending = await store.list_tasks(ListTasksRequest(status="pending"))
    assert [h.key for h in pending] == ["a", "c", "d"]
    done = await store.list_tasks(ListTasksRequest(status="completed"))
    assert [h.key for h in done] == ["b"]


async def test_returned_records_are_fresh_copies(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    header = await store.get_header("k")
    assert header is not None
    header.counters["work_attempts"] = 99
    fresh = await store.get_header("k")
    assert fresh is not None and fresh.counters["work_attempts"] == 0


async def test_acknowledged_writes_survive_close_and_reopen(db_path: Path) -> None:
    digest_, text = _blob('{"kept":true}')
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k"))
        await store.acquire_lease(acquire_request("k"))
        await store.commit(commit_request("k", 1, [
            StartAttempt(node_id="a", attempt_id="att-1"),
            SettleNode(node_id="a", state="completed", output_digest=digest_),
        ], blobs={digest_: text}))
        before = await store.get_task("k")
        timeline = await store.read_timeline(TimelineRequest(key="k"))
    async with SQLiteDurableTaskStore(db_path) as reopened:
        assert await reopened.get_task("k") == before
        assert await reopened.read_timeline(TimelineRequest(key="k")) == timeline
        assert await reopened.get_blobs([digest_]) == {digest_: text}
        # The lease survives too: the same worker takes over under a newer fence.
        grant = await reopened.acquire_lease(acquire_request("k", now=2))
        assert grant.fence == 2


async def test_two_stores_on_one_file_contend_for_the_lease(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as one, SQLiteDurableTaskStore(db_path) as two:
        await one.create_task(create_request("k"))
        assert (await one.acquire_lease(acquire_request("k", "w1"))).fence == 1
        with pytest.raises(LeaseHeldError) as held:
            await two.acquire_lease(acquire_request("k", "w2", now=1))
        assert held.value.holder == "w1"
        assert (await two.acquire_lease(acquire_request("k", "w2", now=11))).fence == 2
        with pytest.raises(StaleFenceError):
            await one.commit(commit_request("k", 1, [ClaimNode(node_id="a")], now=12))
        await two.commit(commit_request("k", 2, [ClaimNode(node_id="a")], worker="w2",
                                        now=12))


async def test_concurrent_acquires_issue_unique_increasing_fences(db_path: Path) -> None:
    stores = [SQLiteDurableTaskStore(db_path) for _ in range(3)]
    try:
        await stores[0].create_task(create_request("k"))
        # Every lease expires at once (ttl tiny vs. the 1 s spacing of "now").
        calls = [s.acquire_lease(acquire_request("k", f"w{i}-{n}", now=n, ttl=0.5))
                 for n in range(10) for i, s in enumerate(stores)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        fences = [r.fence for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(e, LeaseHeldError) for e in errors)
        assert len(set(fences)) == len(fences)
        header = await stores[0].get_header("k")
        assert header is not None and header.fence == max(fences)
    finally:
        for s in stores:
            await s.close()


async def test_child_process_holds_the_lease_across_processes(db_path: Path) -> None:
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k"))
        code = (
            "import asyncio, sys\n"
            "from datetime import datetime\n"
            "from agentium_graph.store import AcquireLeaseRequest\n"
            "from agentium_graph.testing import load_factory\n"
            "async def main():\n"
            "    store = load_factory('agentium_graph_sqlite.testing:open_store')(sys.argv[1])\n"
            "    async with store:\n"
            "        grant = await store.acquire_lease(AcquireLeaseRequest(\n"
            "            key='k', worker_id='child', ttl_seconds=60,\n"
            "            now=datetime.fromisoformat(sys.argv[2])))\n"
            "        print(grant.fence)\n"
            "asyncio.run(main())\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, str(db_path), at(0).isoformat(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "1"
        with pytest.raises(LeaseHeldError) as held:
            await store.acquire_lease(acquire_request("k", "parent", now=1))
        assert held.value.holder == "child"


async def test_closed_store_refuses_work_and_close_is_idempotent(db_path: Path) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get_header("k")
    never_used = SQLiteDurableTaskStore(db_path)
    await never_used.close()


async def test_stats_count_commits_bytes_and_reads(store: SQLiteDurableTaskStore) -> None:
    await store.create_task(create_request("k"))
    await store.acquire_lease(acquire_request("k"))
    before = store.stats
    await store.commit(commit_request("k", 1, [ClaimNode(node_id="a")]))
    await store.get_header("k")
    spent = store.stats - before
    assert spent.commits == 1
    assert spent.bytes_written > 0
    assert spent.reads == 1
    await store.request_cancel(CancelTaskRequest(key="k", reason="r", now=at(2)))
    await store.request_cancel(CancelTaskRequest(key="k", reason="r", now=at(3)))
    assert (store.stats - before).commits == 2  # the repeated cancel wrote nothing


async def test_sqlite_calls_never_run_on_the_event_loop_thread(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    loop_thread = threading.get_ident()
    offending: list[str] = []

    class Checked(StoreConnection):
        def execute(self, *args: Any) -> Any:
            if threading.get_ident() == loop_thread:
                offending.append(str(args[0]))
            return super().execute(*args)

        def executemany(self, *args: Any) -> Any:
            if threading.get_ident() == loop_thread:
                offending.append(str(args[0]))
            return super().executemany(*args)

    real_connect: Any = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == loop_thread:
            offending.append("connect")
        return real_connect(*args, **{**kwargs, "factory": Checked})

    monkeypatch.setattr("agentium_graph_sqlite._schema.sqlite3.connect", connect)
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k"))
        await store.acquire_lease(acquire_request("k"))
        await store.commit(commit_request("k", 1, [ClaimNode(node_id="a")]))
        await store.get_task("k")
        await store.list_tasks(ListTasksRequest())
    assert offending == []


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1)])
async def test_synchronous_setting_reaches_the_connection(
        db_path: Path, synchronous: Literal["FULL", "NORMAL"], level: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def spying_open(settings: Settings) -> sqlite3.Connection:
        conn = open_database(settings)
        seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])
        seen.append(conn.execute("PRAGMA journal_mode").fetchone()[0])
        return conn

    monkeypatch.setattr("agentium_graph_sqlite._store.open_database", spying_open)
    async with SQLiteDurableTaskStore(db_path, synchronous=synchronous) as store:
        await store.create_task(create_request("k"))
    async with SQLiteDurableTaskStore(db_path, synchronous=synchronous) as store:
        assert await store.get_header("k") is not None
    assert seen == [level, "wal", level, "wal"]


async def test_a_forked_child_never_reuses_the_parents_thread_or_connection(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    parent_thread = store._executor
    monkeypatch.setattr("agentium_graph_sqlite._store.os.getpid", lambda: -1)  # "after fork"
    assert await store.get_header("k") is not None
    assert store._executor is not parent_thread
    assert [executor for executor, _ in store._inherited] == [parent_thread]
    await store.close()
    for executor, conn in store._inherited:  # in a real child these would be left alone
        assert conn is not None
        await executor.submit(conn.close)
        executor.stop()


async def test_an_operation_racing_close_gets_a_typed_error(db_path: Path) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    assert store._executor is not None
    await store._executor.submit(store._close_connection)
    store._executor.stop()  # what close() does while another call is between attempts
    with pytest.raises(StoreError, match="closed"):
        await store.get_header("k")
    await store.close()


async def test_closing_in_a_forked_child_leaves_the_parents_connection_alone(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteDurableTaskStore(db_path)
    await store.create_task(create_request("k"))
    parent_thread = store._executor
    assert parent_thread is not None
    with monkeypatch.context() as patch:
        patch.setattr("agentium_graph_sqlite._store.os.getpid", lambda: -1)
        await asyncio.wait_for(store.close(), timeout=5)  # must not wait on a missing thread
    assert store._conn is not None  # untouched, as the parent still owns it
    await parent_thread.submit(store._close_connection)
    parent_thread.stop()


# An existing node row is overwritten in place (same size thanks to its slack), never
# deleted and re-inserted.
_NODE_UPDATE = "UPDATE nodes SET record = ?, slack = zeroblob(?) WHERE key = ? AND node_id = ?"


async def test_a_commit_reads_only_the_rows_its_steps_need(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    statements: list[tuple[str, tuple[Any, ...]]] = []

    class Recording(StoreConnection):
        def execute(self, sql: str, params: Any = (), /) -> Any:
            statements.append((sql, tuple(params)))
            return super().execute(sql, params)

        def executemany(self, sql: str, rows: Any, /) -> Any:
            statements.append((sql, ()))
            return super().executemany(sql, rows)

    real_connect: Any = sqlite3.connect
    monkeypatch.setattr("agentium_graph_sqlite._schema.sqlite3.connect",
                        lambda *a, **k: real_connect(*a, **{**k, "factory": Recording}))
    def writes() -> list[str]:
        return [sql.split(" (")[0] for sql, _ in statements
                if sql.startswith(("INSERT", "UPDATE"))]

    nodes = [f"n{i}" for i in range(30)]
    async with SQLiteDurableTaskStore(db_path) as creator:
        await creator.create_task(create_request("k", nodes))
    # Another store: it knows nothing of the task yet, so it reads the rows it needs. (The
    # store that created the task would read only the header: test_sqlite_kept.py.)
    async with SQLiteDurableTaskStore(db_path) as store:
        await store.acquire_lease(acquire_request("k"))
        statements.clear()
        await store.commit(commit_request("k", 1, [
            StartAttempt(node_id="n7", attempt_id="att", admission_id="adm-7",
                         charges={"work_attempts": 1})]))
        reads = [(sql, params) for sql, params in statements if sql.startswith("SELECT")]
        assert reads[0] == ("SELECT header FROM tasks WHERE key = ?", ("k",))
        assert [p for sql, p in reads if "FROM nodes" in sql] == [("k", "n7")]
        assert [p for sql, p in reads if "FROM admissions" in sql] == [("k", "adm-7")]
        assert not any("identities" in sql or "journal" in sql for sql, _ in reads)
        assert writes() == [_NODE_UPDATE, "INSERT INTO admissions", "INSERT INTO journal",
                            "UPDATE tasks SET status = ?, header = ? WHERE key = ?"]
        statements.clear()
        digest_, text = _blob("1")
        await store.commit(commit_request("k", 1, [
            SettleNode(node_id="n7", state="completed", output_digest=digest_)],
            blobs={digest_: text}))
        # The status is unchanged, so its index entry is not rewritten.
        assert writes() == ["INSERT OR IGNORE INTO blobs", _NODE_UPDATE,
                            "INSERT INTO journal", "UPDATE tasks SET header = ? WHERE key = ?"]
        # n7 is the record this store just wrote, and the header row is still its own.
        assert [sql for sql, _ in statements if sql.startswith("SELECT")] == [
            "SELECT header FROM tasks WHERE key = ?"]


async def test_node_rows_keep_one_size_while_their_records_grow(db_path: Path) -> None:
    # Record + slack stay at NODE_SLOT bytes from pending through completed, so SQLite
    # overwrites each row in place; a record bigger than the slot simply has no slack.
    from agentium_graph_sqlite._ops import NODE_SLOT

    def sizes() -> dict[str, tuple[int, int]]:
        conn = sqlite3.connect(db_path)
        try:
            return {n: (r, s) for n, r, s in conn.execute(
                "SELECT node_id, length(CAST(record AS BLOB)), length(slack) FROM nodes")}
        finally:
            conn.close()

    async with SQLiteDurableTaskStore(db_path) as store:
        await store.create_task(create_request("k", ["n0", "n1"]))
        grant = await store.acquire_lease(acquire_request("k"))
        created = sizes()
        digest_, text = _blob("1")
        await store.commit(commit_request("k", grant.fence, [
            StartAttempt(node_id="n0", attempt_id="att", admission_id="adm",
                         charges={"work_attempts": 1})]))
        await store.commit(commit_request("k", grant.fence, [
            SettleNode(node_id="n0", state="completed", output_digest=digest_),
            StartAttempt(node_id="n1", attempt_id="att-n1")], blobs={digest_: text}))
        # A failure with a long message: the record outgrows the slot.
        await store.commit(commit_request("k", grant.fence, [SettleNode(
            node_id="n1", state="failed", error=ErrorInfo(code="x", message="é" * 600))]))
        settled = sizes()
        snapshot = await store.get_task("k")
    assert snapshot is not None and snapshot.nodes["n1"].error is not None
    assert snapshot.nodes["n1"].error.message == "é" * 600  # the slack is never read back
    assert all(r + s == NODE_SLOT for r, s in created.values())
    record, slack = settled["n0"]
    assert record > created["n0"][0] and record + slack == NODE_SLOT
    assert settled["n1"][0] > NODE_SLOT and settled["n1"][1] == 0


async def test_a_lease_renewal_runs_before_the_commits_queued_ahead_of_it() -> None:
    # (review 43) Forty tasks with CPU-bound sync tools queued so many commits on the
    # store's one thread that renewals answered after a 1.5 s lease had expired, and
    # another worker took the tasks over. An urgent job runs before every queued one.
    import threading

    from agentium_graph_sqlite._store import _Worker

    worker = _Worker("test-urgent")
    gate = threading.Event()
    order: list[str] = []
    try:
        first = worker.submit(lambda: gate.wait(10))  # holds the thread
        queued = [worker.submit(lambda i=i: order.append(f"commit-{i}")) for i in range(3)]
        renewal = worker.submit(lambda: order.append("renewal"), urgent=True)
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, renewal, *queued), 10)
        assert order == ["renewal", "commit-0", "commit-1", "commit-2"]
    finally:
        worker.stop()
