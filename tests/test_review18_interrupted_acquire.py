"""A run() whose lease acquisition landed but did not come back leaves the lease held.

Found by tests/test_review18_prop_runtime.py (the 'cancel' and 'unavailable_after' faults on
a run's first write): when the store applied ``acquire_lease`` but the caller saw an error
(``run()`` canceled while the acquisition was in flight, or a connection that dropped the
answer), ``run()`` ended without releasing the lease it may hold, so every other worker got
``LeaseHeldError`` until ``lease_ttl`` passed (15 s by default), although nothing was running
the task. A failure later in the run releases the lease (``_release_quietly``); a failed
acquisition now does too: run() gives back a lease the unanswered acquisition left it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    StoreUnavailableError,
    ToolBinding,
)
from agentium_graph.store import AcquireLeaseRequest, LeaseGrant


class LostGrant(InMemoryDurableTaskStore):
    """Applies the next lease acquisition, then fails it: ``how`` is ``unavailable`` (the
    answer was lost) or ``cancel`` (the caller's task is canceled while it is in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.how: str | None = None

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        grant = await super().acquire_lease(request)
        how, self.how = self.how, None
        if how == "unavailable":
            raise StoreUnavailableError("injected: the answer of an acquisition that landed "
                                        "was lost")
        if how == "cancel":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)  # the cancel arrives while the call is in flight
        return grant


def _setup() -> tuple[LostGrant, HostCatalog, ExecutionGraphProgram]:
    async def one(args: dict[str, Any]) -> dict[str, Any]:
        return {"v": 1}

    catalog = HostCatalog([ToolBinding(id="one", version="1", execute=one, recovery="pure")])
    program = ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "a", "binding": "one", "version": "1"}]})
    return LostGrant(), catalog, program


async def _interrupted_run(rt: ExecutionGraphRuntime, key: str) -> BaseException | None:
    task = asyncio.create_task(rt.run(key, "w1"))
    await asyncio.wait([task])
    return None if task.cancelled() else task.exception()


@pytest.mark.parametrize("how", ["unavailable", "cancel"])
@pytest.mark.parametrize("start", ["first-run-of-its-creator", "another-runtime"])
async def test_a_failed_lease_acquisition_leaves_no_lease_behind(how: str, start: str) -> None:
    store, catalog, program = _setup()
    creator = ExecutionGraphRuntime(catalog=catalog, store=store)
    await creator.create("k", program)
    # The creator's first run takes the lease with its first commit (one write); any other
    # runtime reads the task and takes the lease on its own first.
    runner = creator if start == "first-run-of-its-creator" else \
        ExecutionGraphRuntime(catalog=catalog, store=store)
    store.how = how
    error = await _interrupted_run(runner, "k")
    assert error is None if how == "cancel" else isinstance(error, StoreUnavailableError)
    view = await creator.inspect("k")
    assert view.lease is None, f"run() ended, yet {view.lease.owner!r} holds the lease"
    other = ExecutionGraphRuntime(catalog=catalog, store=store)
    result = await asyncio.wait_for(other.run("k", "w2"), 5)  # at once: no LeaseHeldError
    assert result.output == {"a": {"v": 1}}
