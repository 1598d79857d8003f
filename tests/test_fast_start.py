"""The fast start (a task this runtime just created: first commit carries the lease) must
behave exactly like the ordinary start whenever anything happened since create, and the
SQLite store's worker thread must not outlive a store nobody closed.

Each of these failed once during review of the commits that introduced them.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

import pytest

from agentium_graph import AdmissionEvent, ExecutionGraphRuntime, TaskCanceledError
from agentium_graph.store import AcquireLeaseRequest, CancelTaskRequest, LeaseGrant
from tests.conftest import Calls, CountingStore, chain_plan, make_catalog, program
from tests.test_effects import PLAN as PAY_PLAN
from tests.test_effects import Destination, FakeConnector, runtime

# One sync tool node (``add`` in make_catalog is a plain function: not preemptible).
SYNC_PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "s", "binding": "add", "version": "1", "args": {"values": [1, 2]}}]}


async def test_a_cancel_recorded_before_the_first_run_never_dispatches_an_effect(
        store: CountingStore) -> None:
    """A cancel recorded between create() and run() (here straight into the store, as the
    CLI does) is seen before the first wave: the combined lease + first commit is refused
    while a cancel is pending, so no effect is dispatched on a canceled task."""
    dest = Destination()
    connector = FakeConnector(dest)
    rt = runtime(connector, store)
    await rt.create("pay", program(PAY_PLAN))
    await store.request_cancel(CancelTaskRequest(key="pay", reason="operator stop",
                                                 now=rt.clock()))
    with pytest.raises(TaskCanceledError):
        await rt.run("pay", "w1")
    assert connector.dispatched == []
    assert dest.accepted == {}


async def test_runtime_cancel_of_a_task_it_just_created_runs_no_tool(
        calls: Calls, store: CountingStore) -> None:
    """rt.cancel() on a task this runtime just created applies the cancel without running
    the first wave (the canceler's run must not start from create's remembered state)."""
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("c", program(SYNC_PLAN))
    view = await rt.cancel("c", reason="not needed")
    assert view.status == "canceled"
    assert calls.by_node == {}
    assert view.nodes["s"].state == "canceled"


async def test_a_task_canceled_before_its_first_run_is_charged_no_work(
        calls: Calls, store: CountingStore) -> None:
    """A task canceled before its first run shows no attempts, no charges and no
    attempt_started entry."""
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("c", program(chain_plan(3)))
    await store.request_cancel(CancelTaskRequest(key="c", reason="stop", now=rt.clock()))
    with pytest.raises(TaskCanceledError):
        await rt.run("c", "w1")
    view = await rt.inspect("c")
    assert view.counters["work_attempts"] == 0
    assert view.counters["tool_calls"] == 0
    assert all(not n.attempts for n in view.nodes.values())
    kinds = [e.kind for e in (await rt.timeline("c")).events]
    assert "attempt_started" not in kinds


async def test_a_refused_fast_start_leaves_no_admission_behind(calls: Calls,
                                                               store: CountingStore) -> None:
    """A refused fast start reports no admission events: it ran nothing, and the ordinary
    start that follows reports its own (here none: the task was already completed)."""
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store,
                               on_admission=events.append)
    await rt.create("chain", program(chain_plan(2)))
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await other.run("chain", "w2")
    result = await rt.run("chain", "w1")  # refused fast start, then the retained result
    assert result.output["n1"] == {"value": 2}
    admitted = [e.node_id for e in events if e.kind == "admitted"]
    released = [e.node_id for e in events if e.kind == "released"]
    assert admitted == released == []


def _sqlite_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("agentium-sqlite")}


async def test_an_unclosed_sqlite_store_does_not_leak_its_worker_thread(
        tmp_path: Path) -> None:
    """A store dropped without close() is collected and its worker thread ends (the thread
    holds only the job queue; a finalizer sends the stop signal)."""
    from agentium_graph_sqlite import SQLiteDurableTaskStore

    before = _sqlite_threads()
    for i in range(3):
        store = SQLiteDurableTaskStore(tmp_path / f"t{i}.db")
        assert await store.get_header("missing") is None
        del store
    gc.collect()
    leaked = _sqlite_threads() - before
    for thread in leaked:
        await asyncio.to_thread(thread.join, 10.0)
    assert not [t for t in leaked if t.is_alive()]


class _IgnoresSteps(CountingStore):
    """A store written against the older protocol: it takes the lease, drops the steps."""

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        return await super().acquire_lease(request.model_copy(update={"steps": (),
                                                                      "blobs": {}}))


async def test_a_store_that_ignores_first_commit_steps_still_records_every_attempt(
        calls: Calls) -> None:
    store = _IgnoresSteps()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("c", program(chain_plan(2)))
    result = await rt.run("c", "w1")
    assert result.output["n1"] == {"value": 2}
    view = await rt.inspect("c")
    assert all(len(n.attempts) == 1 for n in view.nodes.values())
    assert view.counters["work_attempts"] == 2


async def test_remembered_tasks_are_bounded_and_forgetting_one_only_costs_reads(
        calls: Calls, store: CountingStore) -> None:
    from agentium_graph.runtime import _runtime as runtime_module

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    limit = runtime_module._REMEMBERED_TASKS
    for i in range(limit + 5):
        await rt.create(f"t{i}", program(chain_plan(1)))
    assert len(rt._fresh) == limit and len(rt._identities) == limit
    assert rt._fresh_nodes == limit  # one node each
    store.reads.clear()
    result = await rt.run("t0", "w1")  # forgotten: read, then an ordinary start
    assert result.output["n0"] == {"value": 1}
    assert store.reads[:2] == ["get_header", "get_identity"]
    store.reads.clear()
    await rt.run(f"t{limit + 4}", "w1")  # remembered: no reads at all
    assert store.reads == []
    assert rt._fresh_nodes == limit - 1
