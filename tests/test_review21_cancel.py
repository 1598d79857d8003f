"""Cancel of a task nobody runs, where the run that applies it cannot happen (review 21).

``runtime.cancel`` applies a cancel to an idle task by running it under a canceler's worker
id. For a key of more than 191 characters that id broke the 200-character limit, and a
runtime whose catalog no longer registers what the task pinned could not run it: both left
the task ``pending`` with the cancel only recorded. An action attested absent by an operator
stayed ``intent`` forever once the task was then canceled.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    DurableRecoveryRequiredError,
    ExecutionGraphRuntime,
    HostCatalog,
    ResolutionConflictError,
    TaskCanceledError,
    ToolBinding,
)
from agentium_graph.errors import ErrorInfo
from agentium_graph.runtime._resolve import cancel_stopped, canceler_id
from agentium_graph.store import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    SetStatus,
)
from tests.conftest import CountingStore, program
from tests.test_effects import PLAN, Crash, CrashOnReceipt, Destination, FakeConnector, runtime


async def echo(args: dict[str, Any]) -> dict[str, Any]:
    return {"n": args["n"]}


def tool_catalog(version: str) -> HostCatalog:
    return HostCatalog([ToolBinding(id="t", version=version, execute=echo, recovery="pure")])


TOOL_PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "t", "version": "1", "args": {"n": 1}},
    {"id": "b", "binding": "t", "version": "1",
     "args": {"n": {"$ref": {"node": "a", "path": ["n"]}}}}]}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_canceler_id_fits_a_worker_id_for_every_key_length() -> None:
    short = canceler_id("order-1")
    assert short.startswith("canceler:order-1:") and len(short) == len("canceler:order-1:") + 8
    assert canceler_id("k" * 182).startswith("canceler:" + "k" * 182 + ":")
    for key in ("k" * 183, "k" * 200, "k" * 10_000):
        long = canceler_id(key)
        assert len(long) <= 200 and long.startswith("canceler:sha256:"), key
    assert canceler_id("k" * 200).split(":")[2] != canceler_id("k" * 199 + "j").split(":")[2]
    # A new id for every cancel: two cancels never share a lease (stop 23).
    assert canceler_id("order-1") != canceler_id("order-1")


@pytest.mark.parametrize("length", [191, 192, 200])
async def test_an_idle_task_with_a_long_key_is_canceled_at_once(length: int) -> None:
    key = "k" * length
    rt = ExecutionGraphRuntime(catalog=tool_catalog("1"), store=CountingStore())
    await rt.create(key, program(TOOL_PLAN))
    view = await rt.cancel(key, reason="not needed")
    assert view.status == "canceled"
    assert {n: rec.state for n, rec in view.nodes.items()} == {"a": "canceled",
                                                               "b": "canceled"}
    with pytest.raises(TaskCanceledError):
        await rt.run(key, worker_id="w1")


async def test_a_task_this_catalog_cannot_run_is_canceled_without_running() -> None:
    store = CountingStore()
    await ExecutionGraphRuntime(catalog=tool_catalog("1"), store=store).create(
        "k", program(TOOL_PLAN))
    deployed = ExecutionGraphRuntime(catalog=tool_catalog("2"), store=store)  # t 1 -> 2
    view = await deployed.cancel("k", reason="obsolete after the deploy")
    assert view.status == "canceled" and view.error is not None
    assert view.error.details["reason"] == "obsolete after the deploy"
    assert {rec.state for rec in view.nodes.values()} == {"canceled"}
    assert view.counters.get("tool_calls", 0) == 0  # nothing ran
    assert view.lease is None  # the canceler gave its lease back


async def crashed_then_uncertain(dest: Destination, store: CrashOnReceipt, *,
                                 absent: bool) -> tuple[ExecutionGraphRuntime, str]:
    """A charge whose receipt a crash lost, which the next run could not look up: the task
    is recovery_required. ``absent``: the destination lost the charge meanwhile."""
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    if absent:
        dest.accepted.clear()
    rt = runtime(FakeConnector(dest, lookups=["unknown"] * 3), store)
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    return rt, conn.dispatched[0].action_id


async def test_cancel_recorded_then_absent_then_run_closes_the_intent() -> None:
    dest = Destination()
    store = CrashOnReceipt()
    rt, action_id = await crashed_then_uncertain(dest, store, absent=True)
    # A cancel recorded by someone else (the store only, as the CLI would while a worker
    # still held the lease), then an operator attests the effect absent.
    await store.request_cancel(CancelTaskRequest(key="p", reason="stop",
                                                 now=datetime.now(UTC)))
    view = await rt.resolve_action("p", action_id, Absent(), actor="ops")
    assert view.status == "pending" and view.actions[0].state == "intent"
    later = FakeConnector(dest)
    with pytest.raises(TaskCanceledError):
        await runtime(later, store).run("p")
    view = await rt.inspect("p")
    assert later.dispatched == [] and dest.accept_count == 1  # the crashed run's only
    assert view.status == "canceled" and view.nodes["charge"].state == "canceled"
    assert [(a.state, a.dispatches) for a in view.actions] == [("rejected", 1)]
    assert view.pending_actions == ()
    assert "not dispatched" in (view.actions[0].reason or "")


async def test_absent_then_cancel_from_a_catalog_without_the_binding() -> None:
    store = CrashOnReceipt()
    rt, action_id = await crashed_then_uncertain(Destination(), store, absent=False)
    await rt.resolve_action("p", action_id, Absent(), actor="ops")
    other = ExecutionGraphRuntime(catalog=tool_catalog("1"), store=store)  # no "pay"
    view = await other.cancel("p", reason="retired")
    assert view.status == "canceled"
    assert [a.state for a in view.actions] == ["rejected"] and view.pending_actions == ()


async def crashed_mid_dispatch() -> tuple[Destination, Clock, CrashOnReceipt, FakeConnector]:
    """A charge the destination accepted whose receipt a crash lost, the crashed worker's
    lease expired since: the action is left ``dispatching``."""
    dest = Destination()
    clock = Clock()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store, clock=clock).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store, clock=clock).run("p", worker_id="w1")
    clock.now += timedelta(minutes=5)
    return dest, clock, store, conn


async def test_an_interrupted_dispatch_is_never_hidden_by_a_cancel_without_running() -> None:
    _dest, clock, store, conn = await crashed_mid_dispatch()
    other = ExecutionGraphRuntime(catalog=tool_catalog("1"), store=store, clock=clock)
    view = await other.cancel("p", reason="retired")
    # The charge may have happened (it did): the task waits for an operator instead.
    action_id = conn.dispatched[0].action_id
    assert view.status == "recovery_required"
    assert [(a.action_id, a.state) for a in view.actions] == [(action_id, "uncertain")]
    assert view.nodes["charge"].state == "uncertain"
    view = await other.cancel("p", reason="retired")  # canceling again ends it
    assert view.status == "canceled" and view.error is not None
    assert view.error.details["uncertain_actions"] == [action_id]
    assert [a.state for a in view.actions] == ["uncertain"]  # the evidence stays


async def test_a_dispatch_carries_its_fence_and_number() -> None:
    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p", worker_id="w1")
    dest.accepted.clear()  # provably absent: dispatched again by the next worker
    fresh = FakeConnector(dest)
    await runtime(fresh, store).run("p", worker_id="w1")
    [first], [second] = conn.dispatched, fresh.dispatched
    assert (first.dispatch, second.dispatch) == (1, 2)
    assert first.fence is not None and second.fence is not None
    assert second.fence > first.fence  # a destination can refuse the older one after this
    assert first.action_id == second.action_id


async def test_leave_lookups_leaves_a_crash_left_dispatch_to_a_run() -> None:
    """What the CLI uses for a budget-stopped task (review 26): with an action a crash left
    dispatching, the cancel is not applied without a connector; it is left to a run, whose
    stop looks the action up first and finds the receipt."""
    dest, clock, store, _conn = await crashed_mid_dispatch()
    # As a later run's budget stop leaves it (the action still dispatching): pending, with
    # the budget error, and its lease let go.
    grant = await store.acquire_lease(AcquireLeaseRequest(key="p", worker_id="w9",
                                                          ttl_seconds=5, now=clock()))
    await store.commit(CommitRequest(key="p", worker_id="w9", fence=grant.fence, now=clock(),
                                     steps=(SetStatus(status="pending", release_lease=True,
                                                      error=ErrorInfo(
                                                          code="budget_exhausted",
                                                          message="out of tool_calls")),)))
    await store.request_cancel(CancelTaskRequest(key="p", reason="stop", now=clock()))
    applied = await cancel_stopped(store, "p", lease_ttl=5.0, clock=clock, idle=True,
                                   leave_lookups=True)
    snap = await store.get_task("p")
    assert snap is not None and applied is False
    assert snap.header.status == "pending" and snap.header.lease is None  # given back
    assert [a.state for a in snap.actions.values()] == ["dispatching"]
    with pytest.raises(TaskCanceledError):
        await runtime(FakeConnector(dest), store, clock=clock).run("p", worker_id="w2")
    snap = await store.get_task("p")
    assert snap is not None and snap.header.status == "canceled"
    assert [a.state for a in snap.actions.values()] == ["confirmed"]  # looked up, recorded
    assert dest.accept_count == 1


async def test_resolving_a_dispatching_action_says_only_uncertain_ones_can_be() -> None:
    # (review 37) It said "a second resolution is rejected" although nothing had been
    # resolved: the action a crash left dispatching is looked up by the next run.
    _dest, clock, store, conn = await crashed_mid_dispatch()
    rt = runtime(conn, store, clock=clock)
    with pytest.raises(ResolutionConflictError) as info:
        await rt.resolve_action("p", conn.dispatched[0].action_id, Absent(), actor="oncall")
    message = str(info.value)
    assert "is dispatching, not uncertain" in message and "second resolution" not in message
    assert "a run looks a dispatching action up through its connector first" in message
    assert [a.state for a in (await rt.inspect("p")).actions] == ["dispatching"]
