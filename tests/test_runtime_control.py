"""Admission, budgets, cancellation, deadlines, leases and in-process recovery."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    DeadlineExceededError,
    DescriptorMismatchError,
    ExecutionGraphRuntime,
    HostCatalog,
    LeaseHeldError,
    PlanLimits,
    RootLimits,
    StaleFenceError,
    TaskCanceledError,
    ToolBinding,
    tool_context,
)
from agentium_graph.store import AcquireLeaseRequest, CommitRequest, StartAttempt
from tests.conftest import Calls, CountingStore, chain_plan, make_catalog, program, wait_until


def fan_plan(width: int) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": f"p{i}", "binding": "inc", "version": "1", "args": {"x": i}}
        for i in range(width)]}


async def test_capacity_one_admits_fifo_in_plan_order(calls: Calls) -> None:
    events: list[AdmissionEvent] = []
    active = 0
    peak = 0

    async def tracked(args: dict[str, Any]) -> dict[str, Any]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0)
        calls.hit()
        active -= 1
        return {"value": args["x"]}

    catalog = HostCatalog([ToolBinding(id="inc", version="1", execute=tracked,
                                       recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=1),
                               on_admission=events.append)
    await rt.create("fifo", program(fan_plan(4)))
    await rt.run("fifo")
    assert peak == 1
    assert calls.order == ["p0", "p1", "p2", "p3"]
    admitted = [e.node_id for e in events if e.kind == "admitted"]
    assert admitted == ["p0", "p1", "p2", "p3"]
    assert {e.node_id for e in events if e.kind == "queued"} == {"p1", "p2", "p3"}
    assert [e.kind for e in events].count("released") == 4
    assert all(e.active <= 1 and e.capacity == 1 for e in events)


async def test_plan_concurrency_and_root_capacity_both_bound_parallelism() -> None:
    active = 0
    peak = 0
    gate = asyncio.Event()

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if peak >= 3:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)
        active -= 1
        return {"value": 0}

    catalog = HostCatalog([ToolBinding(id="inc", version="1", execute=slow, recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=8))
    await rt.create("c", program(fan_plan(10), limits=PlanLimits(max_concurrency=3)))
    await rt.run("c")
    assert peak == 3


async def test_budget_exhaustion_leaves_node_pending_and_counters_at_limit(
        calls: Calls) -> None:
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), on_admission=events.append)
    await rt.create("b", program(chain_plan(4)), budgets=Budgets(tool_calls=2))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("b")
    assert info.value.counter == "tool_calls" and info.value.node_id == "n2"
    view = await rt.inspect("b")
    assert view.status == "pending" and view.lease is None
    assert [view.nodes[f"n{i}"].state for i in range(4)] == ["completed", "completed",
                                                             "pending", "pending"]
    assert view.counters["tool_calls"] == 2 and view.counters["work_attempts"] == 2
    assert [e.node_id for e in events if e.kind == "exhausted"] == ["n2"]
    # Running again neither dispatches nor charges: the budget is never replenished.
    with pytest.raises(BudgetExhaustedError):
        await rt.run("b", "w2")
    view = await rt.inspect("b")
    assert view.counters["tool_calls"] == 2 and calls.by_node == {"n0": 1, "n1": 1}


async def test_work_attempt_limit_is_enforced(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("w", program(fan_plan(5)), limits=RootLimits(max_work_attempts=3))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("w")
    assert info.value.counter == "work_attempts"
    view = await rt.inspect("w")
    assert view.counters["work_attempts"] == 3
    assert sorted(n for n, v in view.nodes.items() if v.state == "completed") == [
        "p0", "p1", "p2"]


async def test_cancel_reaches_a_running_async_tool(calls: Calls) -> None:
    started = asyncio.Event()
    saw_cancel: list[bool] = []

    async def forever(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            saw_cancel.append(tool_context().cancelled)
            raise
        return {}

    catalog = make_catalog(calls, [ToolBinding(id="forever", version="1", execute=forever,
                                               recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, poll_interval=0.05)
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 0}},
        {"id": "f", "binding": "forever", "version": "1", "dependsOn": ["a"]},
        {"id": "after", "binding": "inc", "version": "1", "args": {"x": 0},
         "dependsOn": ["f"]}]}
    await rt.create("c", program(plan))
    runner = asyncio.create_task(rt.run("c"))
    await asyncio.wait_for(started.wait(), 5)
    await rt.cancel("c", reason="user pressed stop")
    with pytest.raises(TaskCanceledError, match="user pressed stop"):
        await asyncio.wait_for(runner, 5)
    assert saw_cancel == [True]
    view = await rt.inspect("c")
    assert view.status == "canceled" and view.cancel is not None
    assert view.cancel.reason == "user pressed stop"
    assert {n: v.state for n, v in view.nodes.items()} == {
        "a": "completed", "f": "canceled", "after": "canceled"}
    with pytest.raises(TaskCanceledError):
        await rt.run("c")


async def test_cancel_from_another_process_is_observed_by_lease_polling(calls: Calls) -> None:
    """Two runtimes share one store: the second only writes the cancel request."""
    stop_seen = threading.Event()

    def cooperative(args: dict[str, Any]) -> dict[str, Any]:
        ctx = tool_context()
        if not ctx.wait_cancelled(timeout=10):
            raise AssertionError("cancellation never arrived")
        stop_seen.set()
        return {"stopped": True}

    catalog = make_catalog(calls, [ToolBinding(id="coop", version="1", execute=cooperative,
                                               recovery="pure")])
    owner = ExecutionGraphRuntime(catalog=catalog, poll_interval=0.05)
    other = ExecutionGraphRuntime(catalog=catalog, store=owner.store)
    await owner.create("x", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "coop", "binding": "coop", "version": "1"}]}))
    runner = asyncio.create_task(owner.run("x"))
    await wait_until(lambda: "x" in owner._active and bool(owner._active["x"].running))
    view = await other.cancel("x", reason="operator")
    assert view.cancel is not None and view.status == "running"
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(runner, 5)
    assert stop_seen.is_set()
    # The sync tool returned normally after seeing the cancel: its output is kept.
    view = await owner.inspect("x")
    assert view.status == "canceled" and view.nodes["coop"].state == "completed"


async def test_cancel_of_idle_task_cancels_pending_nodes_at_once(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("idle", program(chain_plan(3)))
    view = await rt.cancel("idle", reason="not needed")
    assert view.status == "canceled"
    assert all(n.state == "canceled" for n in view.nodes.values())
    assert calls.by_node == {}
    again = await rt.cancel("idle", reason="second reason")
    assert again.cancel is not None and again.cancel.reason == "not needed"


async def test_cancel_while_queued_rejects_waiters(calls: Calls) -> None:
    events: list[AdmissionEvent] = []
    release = asyncio.Event()

    async def hold(args: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return {"value": 0}

    catalog = HostCatalog([ToolBinding(id="inc", version="1", execute=hold, recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=1),
                               on_admission=events.append)
    await rt.create("q", program(fan_plan(3)))
    runner = asyncio.create_task(rt.run("q"))
    await wait_until(lambda: sum(e.kind == "queued" for e in events) == 2)
    await rt.cancel("q", reason="stop")
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(runner, 5)
    assert sorted(e.node_id or "" for e in events if e.kind == "rejected") == ["p1", "p2"]
    view = await rt.inspect("q")
    assert {n: v.state for n, v in view.nodes.items()} == {
        "p0": "canceled", "p1": "canceled", "p2": "canceled"}
    assert view.counters["work_attempts"] == 1


async def test_deadline_passed_before_run(calls: Calls) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), clock=lambda: now[0])
    await rt.create("d", program(chain_plan(2)), deadline=timedelta(minutes=5))
    view = await rt.inspect("d")
    assert view.deadline == now[0] + timedelta(minutes=5)
    now[0] += timedelta(minutes=6)
    with pytest.raises(DeadlineExceededError):
        await rt.run("d")
    view = await rt.inspect("d")
    assert view.status == "failed" and view.error is not None
    assert view.error.code == "deadline_exceeded" and calls.by_node == {}
    with pytest.raises(DeadlineExceededError):
        await rt.run("d")


async def test_deadline_while_waiting_on_a_running_tool(calls: Calls) -> None:
    events: list[AdmissionEvent] = []

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"value": 0}

    catalog = HostCatalog([ToolBinding(id="inc", version="1", execute=slow, recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=1),
                               on_admission=events.append)
    # Long enough that p0 is admitted first even on a loaded machine (then p1 waits).
    await rt.create("d", program(fan_plan(2)), deadline=timedelta(seconds=1))
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(rt.run("d"), 5)
    assert [e.node_id for e in events if e.kind == "rejected"] == ["p1"]
    view = await rt.inspect("d")
    assert view.status == "failed"
    assert {n: v.state for n, v in view.nodes.items()} == {"p0": "canceled", "p1": "canceled"}


async def test_create_rejects_naive_and_past_relative_deadlines(calls: Calls) -> None:
    from agentium_graph import ConfigurationError

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        await rt.create("d", program(chain_plan(1)), deadline=datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError, match="positive"):
        await rt.create("d", program(chain_plan(1)), deadline=timedelta(seconds=-1))


async def test_lease_held_by_another_worker_then_takeover_after_expiry(calls: Calls) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), clock=lambda: now[0],
                               lease_ttl=10)
    await rt.create("l", program(chain_plan(3)))
    grant = await rt.store.acquire_lease(AcquireLeaseRequest(
        key="l", worker_id="crashed", ttl_seconds=10, now=now[0]))
    # The crashed worker had started n0 before dying.
    snapshot = await rt.store.get_task("l")
    assert snapshot is not None
    await rt.store.commit(CommitRequest(
        key="l", worker_id="crashed", fence=grant.fence, now=now[0],
        steps=(StartAttempt(node_id="n0", attempt_id="att-crashed", admission_id="adm-1",
                            charges={"work_attempts": 1, "tool_calls": 1}),)))
    with pytest.raises(LeaseHeldError) as info:
        await rt.run("l", "w2")
    assert info.value.holder == "crashed" and info.value.expires_at == now[0] + timedelta(
        seconds=10)
    now[0] += timedelta(seconds=11)
    result = await rt.run("l", "w2")
    assert result.output["n2"] == {"value": 3}
    view = await rt.inspect("l")
    attempts = view.nodes["n0"].attempts
    assert [(a.fence, a.outcome) for a in attempts] == [(1, "interrupted"), (2, "completed")]
    assert view.counters["work_attempts"] == 4  # the interrupted attempt is never refunded
    # The crashed worker's late write is rejected and changes nothing.
    with pytest.raises(StaleFenceError):
        await rt.store.commit(CommitRequest(
            key="l", worker_id="crashed", fence=grant.fence, now=now[0],
            steps=(StartAttempt(node_id="n1", attempt_id="late"),)))
    assert (await rt.inspect("l")).journal_length == view.journal_length


async def test_same_worker_takes_over_its_own_lease_at_once(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("s", program(chain_plan(2)))
    first = await rt.store.acquire_lease(AcquireLeaseRequest(
        key="s", worker_id="w1", ttl_seconds=30, now=datetime.now(UTC)))
    result = await rt.run("s", "w1")
    assert result.status == "completed"
    view = await rt.inspect("s")
    assert all(a.fence == first.fence + 1 for n in view.nodes.values() for a in n.attempts)


async def test_run_wait_true_waits_for_the_lease(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), lease_ttl=0.3,
                               poll_interval=0.05)
    await rt.create("w", program(chain_plan(1)))
    await rt.store.acquire_lease(AcquireLeaseRequest(
        key="w", worker_id="gone", ttl_seconds=0.3, now=datetime.now(UTC)))
    result = await asyncio.wait_for(rt.run("w", "w2", wait=True), 5)
    assert result.status == "completed"


@pytest.mark.parametrize("ending", ["completed", "canceled"])
async def test_run_wait_true_answers_for_a_task_another_worker_ended(
        calls: Calls, ending: str) -> None:
    # w2 waits for w1's lease; w1 ends the task meanwhile. w2 gets what a run on an ended
    # task gets: the retained result, or the task's error.
    gate = asyncio.Event()
    running: list[int] = []

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        running.append(1)
        await gate.wait()
        return {"value": 7}

    catalog = make_catalog(calls, [ToolBinding(
        id="slow", version="1", execute=slow, recovery="pure",
        input_schema={"type": "object"}, output_schema={"type": "object"})])
    rt = ExecutionGraphRuntime(catalog=catalog, poll_interval=0.02)
    await rt.create("e", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "s", "binding": "slow", "version": "1", "args": {}}]}))
    first = asyncio.create_task(rt.run("e", "w1"))
    await wait_until(lambda: bool(running))
    other = ExecutionGraphRuntime(catalog=catalog, store=rt.store, poll_interval=0.02)
    waiting = asyncio.create_task(other.run("e", "w2", wait=True))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    if ending == "completed":
        gate.set()
        assert (await first).output == {"s": {"value": 7}}
        result = await asyncio.wait_for(waiting, 5)
        assert result.status == "completed" and result.output == {"s": {"value": 7}}
    else:
        await rt.cancel("e", reason="stop")
        with pytest.raises(TaskCanceledError):
            await first
        with pytest.raises(TaskCanceledError):
            await asyncio.wait_for(waiting, 5)


async def test_a_deadline_ends_a_wait_for_the_lease(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), poll_interval=0.05)
    await rt.create("d", program(chain_plan(1)), deadline=timedelta(seconds=1))
    await rt.store.acquire_lease(AcquireLeaseRequest(  # a dead worker's 30 s lease
        key="d", worker_id="gone", ttl_seconds=30, now=datetime.now(UTC)))
    # Waiting out the lease would take 30 s: wait_for's 20 s fail that with a TimeoutError.
    with pytest.raises(DeadlineExceededError, match="waiting for worker 'gone'"):
        await asyncio.wait_for(rt.run("d", "w2", wait=True), 20)
    assert calls.by_node == {}


async def test_changed_descriptor_fails_before_any_dispatch(calls: Calls,
                                                            store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("m", program(chain_plan(2)))

    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": 0}

    changed = HostCatalog([ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                                       input_schema={"type": "object"})])
    rt2 = ExecutionGraphRuntime(catalog=changed, store=store)
    with pytest.raises(DescriptorMismatchError, match="'inc' version '1'"):
        await rt2.run("m")
    assert calls.by_node == {} and store.commits == []
    assert (await rt2.inspect("m")).lease is None


async def test_timeline_pages_reconstruct_the_journal(calls: Calls) -> None:
    from agentium_graph import ConfigurationError

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", program(chain_plan(5)))
    await rt.run("t")
    full = await rt.timeline("t", limit=1000)
    assert full.next_cursor is None and len(full.events) == full.total
    seqs = [e.seq for e in full.events]
    assert seqs == list(range(1, full.total + 1))
    paged = []
    cursor = None
    while True:
        page = await rt.timeline("t", cursor=cursor, limit=3)
        paged.extend(page.events)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert paged == list(full.events)
    kinds = [e.kind for e in full.events]
    assert kinds[0] == "task_created" and kinds[1] == "lease_acquired"
    assert kinds[-1] == "task_completed"
    with pytest.raises(ConfigurationError, match="cursor"):
        await rt.timeline("t", cursor="garbage")
    await rt.create("other", program(chain_plan(5)))
    with pytest.raises(ConfigurationError, match="cursor"):
        await rt.timeline("other", cursor=(await rt.timeline("t", limit=2)).next_cursor)


async def test_admission_snapshot_reports_counters_and_queue(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("a", program(chain_plan(2)))
    snap = await rt.admission_snapshot("a")
    assert snap.counters["expanded_nodes"] == 2 and snap.active == 0 and snap.queued == 0
    await rt.run("a")
    snap = await rt.admission_snapshot("a")
    assert snap.counters["work_attempts"] == 2
    assert snap.limits["work_attempts"] == RootLimits().max_work_attempts
