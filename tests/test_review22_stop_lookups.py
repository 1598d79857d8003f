"""Found by review 22. A run that stopped for good (a cancel, a passed deadline) before it
reached an effect a crashed worker left ``dispatching`` made it ``uncertain`` without asking
the connector, although recovery always looks such an effect up first: a charge the
destination could report was never recorded, and the task waited for an operator. The stop
now looks it up (bounded, never a dispatch) before it closes the node. And every cancel ran
the task under one worker id per key, in every process, so two processes canceling at once
took the lease from each other (a store hands a live lease to the id holding it) and one
``cancel()`` raised StaleFenceError. Each test failed before."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    DeadlineExceededError,
    DurableRecoveryRequiredError,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
)
from agentium_graph.store import CancelTaskRequest
from agentium_graph.store._forwarding import ForwardingStore
from tests.conftest import program
from tests.test_effects import PLAN, Crash, CrashOnReceipt, Destination, FakeConnector, runtime
from tests.test_review21_cancel import TOOL_PLAN, Clock, tool_catalog


async def _crashed(store: CrashOnReceipt, clock: Clock, dest: Destination, *,
                   accepted: bool, deadline: timedelta | None = None) -> None:
    """Task 'p' with its charge left dispatching by a worker that died (the destination
    accepted it or not); its lease has expired."""
    first = FakeConnector(dest, dispatch_mode="ok" if accepted else "hang")
    await runtime(first, store, clock=clock).create("p", program(PLAN), deadline=deadline)
    run = runtime(first, store, clock=clock).run("p", worker_id="w1")
    if accepted:
        with pytest.raises(Crash):  # after the destination accepted, before the receipt
            await run
    else:  # the host gives up on run() while the dispatch hangs: nothing was accepted
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run, 0.5)
    assert [a.state for a in (await store.get_task("p")).actions.values()] == ["dispatching"]
    clock.now += timedelta(minutes=5)


async def test_a_cancel_records_the_receipt_a_lookup_finds() -> None:
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    await _crashed(store, clock, dest, accepted=True)
    conn = FakeConnector(dest)
    view = await runtime(conn, store, clock=clock).cancel("p", reason="stop")
    assert view.status == "canceled"
    assert view.nodes["charge"].state == "completed"  # the charge happened: it says so
    (action,) = view.actions
    assert action.state == "confirmed" and action.outcome_source == "reconcile"
    assert conn.resolved == [action.action_id] and conn.dispatched == []
    assert dest.accept_count == 1


async def test_a_passed_deadline_records_the_receipt_a_lookup_finds() -> None:
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    await _crashed(store, clock, dest, accepted=True, deadline=timedelta(minutes=1))
    conn = FakeConnector(dest)
    rt = runtime(conn, store, clock=clock)
    with pytest.raises(DeadlineExceededError):
        await rt.run("p", worker_id="w2")
    view = await rt.inspect("p")
    assert view.status == "failed" and view.nodes["charge"].state == "completed"
    assert [a.state for a in view.actions] == ["confirmed"] and conn.dispatched == []


async def test_a_cancel_rejects_an_action_a_lookup_proves_absent() -> None:
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    await _crashed(store, clock, dest, accepted=False)
    conn = FakeConnector(dest)
    view = await runtime(conn, store, clock=clock).cancel("p", reason="stop")
    assert view.status == "canceled" and view.nodes["charge"].state == "canceled"
    (action,) = view.actions
    assert action.state == "rejected" and action.reason is not None
    assert "proved absent" in action.reason and "canceled" in action.reason
    assert conn.dispatched == [] and dest.accept_count == 0  # never sent again


async def test_a_lookup_that_cannot_tell_leaves_the_task_for_an_operator() -> None:
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    await _crashed(store, clock, dest, accepted=True)
    conn = FakeConnector(dest, lookups=["unknown"] * 5)
    rt = runtime(conn, store, clock=clock, lookup_attempts=2)
    with pytest.raises(DurableRecoveryRequiredError):
        await _cancel_then_run(rt)
    view = await rt.inspect("p")
    assert view.status == "recovery_required" and view.nodes["charge"].state == "uncertain"
    (action,) = view.actions
    assert action.state == "uncertain" and action.reason is not None
    assert "lookup service down" in action.reason and len(conn.resolved) == 2
    assert conn.dispatched == []


async def _cancel_then_run(rt: ExecutionGraphRuntime) -> None:
    """Record a cancel through the store (as the CLI does), then run: the run applies it."""
    await rt.store.request_cancel(CancelTaskRequest(key="p", reason="stop", now=rt.clock()))
    await rt.run("p", worker_id="w2")


class Gate(ForwardingStore):
    """Holds the first call of one operation until released."""

    def __init__(self, inner: InMemoryDurableTaskStore, op: str) -> None:
        super().__init__(inner)
        self.op, self.reached, self.release = op, asyncio.Event(), asyncio.Event()

    async def around(self, op: str, call: Any) -> Any:
        if op == self.op and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return await call()


@pytest.mark.parametrize("catalog_of_a", ["1", "2"])
async def test_two_cancels_at_once_never_fence_each_other_out(catalog_of_a: str) -> None:
    # A (whose catalog may no longer run the task: version "2") is about to take the lease
    # while C's cancel run holds it and is about to commit.
    shared = InMemoryDurableTaskStore()
    await ExecutionGraphRuntime(catalog=tool_catalog("1"), store=shared).create(
        "k", program(TOOL_PLAN))
    a_store, c_store = Gate(shared, "acquire_lease"), Gate(shared, "commit")
    a = ExecutionGraphRuntime(catalog=tool_catalog(catalog_of_a), store=a_store)
    c = ExecutionGraphRuntime(catalog=tool_catalog("1"), store=c_store)
    a_cancel = asyncio.create_task(a.cancel("k", reason="a"))
    await a_store.reached.wait()
    c_cancel = asyncio.create_task(c.cancel("k", reason="c"))
    await c_store.reached.wait()
    header = await shared.get_header("k")
    assert header is not None and header.lease is not None
    holder = header.lease.owner
    a_store.release.set()
    await a_cancel  # refused the live lease: C applies the cancel
    c_store.release.set()
    view = await c_cancel  # raised StaleFenceError before
    assert view.status == "canceled" and view.cancel is not None
    assert view.cancel.reason == "a"  # the first reason recorded wins
    header = await shared.get_header("k")
    assert header is not None and header.fence == 1  # one lease, never taken over
    assert holder.startswith("canceler:k:")

