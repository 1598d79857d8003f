"""``run()`` holds its arguments to the same rules as the rest of the API.

``wait="no"`` was taken as true (and waited for the lease), and a worker id of any length
was journaled as the lease owner with every grant. Both are now ConfigurationErrors raised
before anything is read or written.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import ConfigurationError, ExecutionGraphRuntime, InMemoryDurableTaskStore
from bench._graphs import ROOT_LIMITS, catalog, chain


async def _runtime() -> ExecutionGraphRuntime:
    runtime = ExecutionGraphRuntime(catalog=catalog(), store=InMemoryDurableTaskStore(),
                                    limits=ROOT_LIMITS)
    await runtime.create("k", chain(2))
    return runtime


@pytest.mark.parametrize("wait", ["no", 1, 0, None, 1.0])
async def test_wait_must_be_a_bool(wait: Any) -> None:
    runtime = await _runtime()
    with pytest.raises(ConfigurationError, match="wait"):
        await runtime.run("k", wait=wait)
    view = await runtime.inspect("k")
    assert view.status == "pending" and view.fence == 0 and view.journal_length == 1
    assert (await runtime.run("k", wait=False)).status == "completed"


@pytest.mark.parametrize("worker_id", ["w" * 201, "x" * 100_000, "   "])
async def test_a_worker_id_is_bounded_like_a_task_key(worker_id: str) -> None:
    runtime = await _runtime()
    with pytest.raises(ConfigurationError, match="worker_id"):
        await runtime.run("k", worker_id)
    assert (await runtime.inspect("k")).journal_length == 1
    assert (await runtime.run("k", "w" * 200)).status == "completed"
