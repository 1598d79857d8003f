"""The lease keeper of a running task: it renews for the full lease_ttl, and a transient
store failure of one renewal does not stop it. Time is a manual clock, so expiry is decided
by the test, never by the machine's speed."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    LeaseHeldError,
    StoreUnavailableError,
    ToolBinding,
)
from agentium_graph.store import LeaseStatus, RenewLeaseRequest
from tests.conftest import ManualClock, wait_until


class Renewals(InMemoryDurableTaskStore):
    """Counts lease renewals; the first ``failures`` of them raise a transient error."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.renewed: list[datetime] = []

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailableError("the store is briefly unreachable")
        status = await super().renew_lease(request)
        self.renewed.append(request.now)
        return status


def _setup(store: Renewals, clock: ManualClock) -> tuple[ExecutionGraphRuntime, asyncio.Event,
                                                   asyncio.Event]:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {}

    catalog = HostCatalog([ToolBinding(id="slow", version="1", execute=slow, recovery="pure")])
    rt = ExecutionGraphRuntime(catalog=catalog, store=store, clock=clock, lease_ttl=1.0,
                               poll_interval=0.02)
    return rt, started, release


PROGRAM = ExecutionGraphProgram(id="p", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": "a", "binding": "slow", "version": "1", "args": {}}]})


async def _renewed_at(store: Renewals, clock: ManualClock) -> None:
    """Wait for a renewal made at the clock's current time."""
    await wait_until(lambda: bool(store.renewed) and store.renewed[-1] == clock.now)


@pytest.mark.parametrize("failures", [0, 3], ids=["renewals", "after-transient-failures"])
async def test_a_running_task_keeps_its_lease_for_the_whole_ttl(failures: int) -> None:
    clock, store = ManualClock(), Renewals(failures)
    rt, started, release = _setup(store, clock)
    await rt.create("k", PROGRAM)
    run = asyncio.create_task(rt.run("k", worker_id="w1"))
    await asyncio.wait_for(started.wait(), 5)
    for _ in range(3):  # the node outlives the lease three times over; each renewal extends it
        clock.advance(0.9)
        await _renewed_at(store, clock)
    assert store.failures == 0  # the failed renewals happened, and renewing went on
    clock.advance(0.9)  # 0.9 s after the last renewal: within lease_ttl of it
    other = ExecutionGraphRuntime(catalog=rt.catalog, store=store, clock=clock, lease_ttl=1.0,
                                  poll_interval=0.5)
    with pytest.raises(LeaseHeldError):
        await other.run("k", worker_id="w2")
    release.set()
    assert (await asyncio.wait_for(run, 5)).output == {"a": {}}
