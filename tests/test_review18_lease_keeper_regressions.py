"""Regressions of the lease keeper found by the runtime property tests
(tests/test_review18_prop_runtime.py): renewals that fail with a StoreError or an unexpected
error, a renewal refused after the final commit, and what a write under a released lease
says."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    Budgets,
    DurableTaskStore,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    StaleFenceError,
    StoreError,
    ToolBinding,
)
from agentium_graph.store import (
    CommitRequest,
    CommitResult,
    LeaseStatus,
    RenewLeaseRequest,
    SetStatus,
)
from tests.conftest import ManualClock, wait_until

KEY = "prop-task"


class FailingRenewals(InMemoryDurableTaskStore):
    """The memory store whose first lease renewal raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error
        self.renewed: list[datetime] = []

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        status = await super().renew_lease(request)
        self.renewed.append(request.now)
        return status


def _slow_task(store: DurableTaskStore, clock: Any) -> tuple[ExecutionGraphRuntime,
                                                             asyncio.Event, asyncio.Event]:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"done": True}

    cat = HostCatalog([ToolBinding(id="slow", version="1", execute=slow, recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=cat, store=store, clock=clock, lease_ttl=1.0,
                               poll_interval=0.01)
    return rt, started, release


SLOW_PROGRAM = ExecutionGraphProgram(id="slow-one", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": "a", "binding": "slow", "version": "1", "args": {}}]})


async def test_a_renewal_failing_with_a_store_error_does_not_end_the_lease_keeper() -> None:
    # A StoreError of one renewal (a driver failure that is not 'unavailable') killed the
    # lease keeper: nothing renewed the lease for the rest of the run (another worker could
    # take the task over while this one still ran it), and the run that then completed the
    # task raised the renewal's StoreError instead of returning its result.
    clock = ManualClock()
    store = FailingRenewals(StoreError("injected: disk I/O error"))
    rt, started, release = _slow_task(store, clock)
    await rt.create("k", SLOW_PROGRAM)
    run = asyncio.create_task(rt.run("k", worker_id="w1"))
    await asyncio.wait_for(started.wait(), 5)
    for _ in range(3):  # the node outlives the lease three times over: renewing went on
        clock.advance(0.9)
        await wait_until(lambda: bool(store.renewed) and store.renewed[-1] == clock.now)
    assert store.error is None
    release.set()
    result = await asyncio.wait_for(run, 5)
    assert result.status == "completed" and result.output == {"a": {"done": True}}


async def test_a_renewal_failing_with_an_unexpected_error_stops_the_run() -> None:
    # Any other error of a renewal (a store bug, a task that vanished) means the lease can
    # no longer be kept: the run stops with that error, as when the lease is lost, instead
    # of going on unleased and reporting the error only once the work is done.
    clock = ManualClock()
    store = FailingRenewals(RuntimeError("injected: a bug in the store"))
    rt, started, _release = _slow_task(store, clock)
    await rt.create("k", SLOW_PROGRAM)
    run = asyncio.create_task(rt.run("k", worker_id="w1"))
    await asyncio.wait_for(started.wait(), 5)
    clock.advance(0.5)
    done, _ = await asyncio.wait([run], timeout=5)
    assert done, "the run went on without its lease"
    with pytest.raises(RuntimeError, match="a bug in the store"):
        await run
    view = await rt.inspect("k")
    assert view.status == "running" and view.nodes["a"].state == "running"
    assert view.lease is None  # released: a new run may start at once


class SlowFinalAnswer(InMemoryDurableTaskStore):
    """The answer to the commit that ends the task (and releases its lease) arrives only
    after a lease renewal sent meanwhile was refused: the renewal reached the store after
    that commit, as two requests in flight on two connections may."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(s, SetStatus) for s in request.steps):
            await wait_until(lambda: self.refused > 0)
        return result

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        try:
            return await super().renew_lease(request)
        except StaleFenceError:
            self.refused += 1
            raise


async def test_a_renewal_refused_after_the_final_commit_does_not_change_the_outcome() -> None:
    # The lease keeper met StaleFenceError from a renewal that reached the store after the
    # run's last commit had ended the task and released the lease, and replaced the run's
    # stop with a lost lease: run() raised StaleFenceError for a task it had completed (or,
    # after a budget stop, instead of BudgetExhaustedError). A stop is decided once: a
    # lease lost after the last commit changes nothing of what that commit recorded.
    async def one(args: dict[str, Any]) -> dict[str, Any]:
        return {"v": 1}

    cat = HostCatalog([ToolBinding(id="one", version="1", execute=one, recovery="pure")])
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "one", "version": "1"},
        {"id": "b", "binding": "one", "version": "1", "dependsOn": ["a"]}]}
    store = SlowFinalAnswer()
    rt = ExecutionGraphRuntime(catalog=cat, store=store, poll_interval=0.005)
    await rt.create("done", ExecutionGraphProgram(id="two", version="1", plan=plan))
    result = await asyncio.wait_for(rt.run("done", "w1"), 5)
    assert result.status == "completed" and store.refused
    store.refused = 0
    await rt.create("broke", ExecutionGraphProgram(id="two", version="1", plan=plan),
                    budgets=Budgets(tool_calls=1))
    with pytest.raises(BudgetExhaustedError):
        await asyncio.wait_for(rt.run("broke", "w1"), 5)
    assert store.refused
    assert (await rt.inspect("broke")).status == "pending"


async def test_a_write_under_a_released_lease_says_the_lease_was_released() -> None:
    # StaleFenceError said "fence 1 is current, so another worker owns the task now" for a
    # write under fence 1 after that very lease was released: no other worker was involved.
    store = InMemoryDurableTaskStore()
    rt = ExecutionGraphRuntime(catalog=HostCatalog([ToolBinding(
        id="one", version="1", execute=lambda args: {}, recovery="pure")]), store=store)
    await rt.create("k", ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "a", "binding": "one", "version": "1"}]}))
    await rt.run("k", "w1")
    with pytest.raises(StaleFenceError) as info:
        await store.renew_lease(RenewLeaseRequest(key="k", worker_id="w1", fence=1,
                                                  ttl_seconds=5.0, now=datetime.now(UTC)))
    assert "was released" in str(info.value) and "another worker" not in str(info.value)
    assert info.value.details == {"key": "k", "fence": 1, "current": 1}
