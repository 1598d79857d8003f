"""Review 43: a sync tool waiting for a thread of the loop's default executor when its task
stopped.

The executor is shared by every task of the process (asyncio's holds min(32, cpus + 4)
threads). A node admitted before the deadline but still queued for a thread when it passed
was called afterwards anyway, with its cancellation already set, and the stop waited for it:
``run()`` returned seconds after the deadline and the tool's output was committed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    DeadlineExceededError,
    ExecutionGraphRuntime,
    HostCatalog,
    RootLimits,
    ToolBinding,
)
from tests.conftest import INT_OUT, program


async def test_a_node_stopped_while_queued_for_a_thread_never_calls_its_tool() -> None:
    started: list[str] = []
    lock = threading.Lock()

    def slow(args: dict[str, Any]) -> dict[str, Any]:
        with lock:
            started.append(args["name"])
        time.sleep(0.4)
        return {"value": 1}

    catalog = HostCatalog([ToolBinding(id="slow", version="1", execute=slow, recovery="pure",
                                       input_schema={"type": "object"},
                                       output_schema=INT_OUT)])
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=1)  # one thread: the second node queues for it
    loop.set_default_executor(pool)
    try:
        rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=2))
        await rt.create("k", program({"schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "a", "binding": "slow", "version": "1", "args": {"name": "a"}},
            {"id": "b", "binding": "slow", "version": "1", "args": {"name": "b"}}]}),
            deadline=timedelta(seconds=0.15))
        with pytest.raises(DeadlineExceededError):
            await asyncio.wait_for(rt.run("k"), 30)
        await asyncio.sleep(0.6)  # the queued job has had its thread by now
        assert len(started) == 1  # the node that got the thread; the other never started
        view = await rt.inspect("k")
        [ran] = started  # the stop waits for a sync tool that runs, and keeps its result
        other = "b" if ran == "a" else "a"
        assert (view.nodes[ran].state, view.nodes[other].state) == ("completed", "canceled")
    finally:
        pool.shutdown(wait=True)
