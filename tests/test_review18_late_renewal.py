"""A lease renewal that fails after the run's own last commit released the lease changes
nothing. The lease keeper's renewal can be in flight while the loop commits the task's final
status (which releases the lease); the store then rejects the renewal (no lease: stale), and
the keeper took that for a lost lease and replaced the run's outcome: run() of a task that
had just completed (or failed with its node's error) raised StaleFenceError, "another worker
owns the task now", though nobody else did (seen with MongoDB under load, where a renewal
takes milliseconds)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    ToolBinding,
)
from agentium_graph.store import (
    CommitRequest,
    CommitResult,
    LeaseStatus,
    RenewLeaseRequest,
    SetStatus,
)


class LateRenewal(InMemoryDurableTaskStore):
    """Holds every renewal until the final status (releasing the lease) is committed."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.renewals = 0

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        self.renewals += 1
        await self.released.wait()
        return await super().renew_lease(request)

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(s, SetStatus) and s.release_lease for s in request.steps):
            self.released.set()
            await asyncio.sleep(0.01)  # the renewal fails while the loop resumes
        return result


def runtime(store: LateRenewal, fail: bool) -> ExecutionGraphRuntime:
    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.05)  # long enough for the keeper to start a renewal
        if fail:
            raise ValueError("boom")
        return {"ok": True}
    catalog = HostCatalog([ToolBinding(id="slow", version="1", execute=slow, recovery="pure")])
    return ExecutionGraphRuntime(catalog=catalog, store=store, poll_interval=0.01)


PROGRAM = ExecutionGraphProgram(id="p", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": "a", "binding": "slow", "version": "1", "args": {}}]})


async def test_a_completed_run_returns_its_result() -> None:
    store = LateRenewal()
    rt = runtime(store, fail=False)
    await rt.create("k", PROGRAM)
    result = await rt.run("k")
    assert result.status == "completed" and result.output == {"a": {"ok": True}}
    assert store.renewals >= 1  # a renewal was in flight across the final commit
    assert (await rt.inspect("k")).status == "completed"


async def test_a_failed_run_raises_its_nodes_error() -> None:
    store = LateRenewal()
    rt = runtime(store, fail=True)
    await rt.create("k", PROGRAM)
    with pytest.raises(NodeFailedError, match="boom"):
        await rt.run("k")
    assert store.renewals >= 1
    assert (await rt.inspect("k")).status == "failed"
