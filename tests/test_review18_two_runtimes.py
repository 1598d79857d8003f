"""Review 18: two runtimes on two handles of one SQLite file race ``run`` (SPEC 3, 7).

Pins down what a consumer running two workers relies on (passes; found nothing to fix):
exactly one run executes each node of a task, a loser without ``wait`` gets
``LeaseHeldError`` naming the holder and when its lease expires, ``wait=True`` returns the
winner's result without executing anything, and a worker paused past its lease's expiry
is fenced out (``StaleFenceError``) by the one that took the task over, with every node
completed once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    LeaseHeldError,
    StaleFenceError,
    ToolBinding,
    tool_context,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore
from tests.conftest import INT_OUT, ManualClock, wait_until

WAIT = 10.0


class Work:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.paused = asyncio.Event()  # a fence-1 attempt of "hold" waits for it

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        ctx = tool_context()
        self.calls[(ctx.key, ctx.node_id, ctx.worker_id)] += 1
        if args.get("hold") and ctx.fence == 1:
            await self.paused.wait()
        for _ in range(3):
            await asyncio.sleep(0)
        return {"value": ctx.fence}


def chain(n: int, **args: Any) -> ExecutionGraphProgram:
    nodes = [{"id": f"n{i}", "binding": "w", "version": "1", "args": dict(args),
              **({"dependsOn": [f"n{i - 1}"]} if i else {})} for i in range(n)]
    return ExecutionGraphProgram(id="chain", version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes})


async def completions(rt: ExecutionGraphRuntime, key: str) -> Counter[str]:
    done: Counter[str] = Counter()
    cursor = None
    while True:
        page = await rt.timeline(key, cursor=cursor, limit=1000)
        done.update(e.node_id for e in page.events
                    if e.kind == "node_completed" and e.node_id is not None)
        if page.next_cursor is None:
            return done
        cursor = page.next_cursor


async def test_two_runtimes_racing_many_tasks_execute_each_node_once(tmp_path: Path) -> None:
    work = Work()
    catalog = HostCatalog([ToolBinding(id="w", version="1", execute=work.tool,
                                       recovery="pure", output_schema=INT_OUT)])
    path = tmp_path / "race.db"
    async with SQLiteDurableTaskStore(path) as s1, SQLiteDurableTaskStore(path) as s2:
        a = ExecutionGraphRuntime(catalog=catalog, store=s1, poll_interval=0.2)
        b = ExecutionGraphRuntime(catalog=catalog, store=s2, poll_interval=0.2)
        keys = [f"t{i}" for i in range(16)]
        for i, key in enumerate(keys):
            await (a if i % 2 else b).create(key, chain(3))

        async def run(rt: ExecutionGraphRuntime, key: str, worker: str, wait: bool) -> Any:
            try:
                return await rt.run(key, worker, wait=wait)
            except LeaseHeldError as exc:
                return exc

        before = a.clock()
        async with asyncio.timeout(60):
            outcome = await asyncio.gather(
                *(run(a, k, "wa", True) for k in keys),
                *(run(b, k, "wb", i % 2 == 0) for i, k in enumerate(keys)),
                *(a.create(k, chain(3)) for k in keys))  # re-deliveries meanwhile
        for i, key in enumerate(keys):
            mine, theirs = outcome[i], outcome[len(keys) + i]
            assert mine.status == "completed", mine
            if isinstance(theirs, LeaseHeldError):
                assert i % 2 == 1  # only a run without wait gives up
                assert theirs.holder == "wa" and theirs.expires_at > before
            else:
                assert theirs.status == "completed" and theirs.output == mine.output
            assert await completions(a, key) == {"n0": 1, "n1": 1, "n2": 1}
            ran = Counter({node: n for (k, node, _), n in work.calls.items() if k == key})
            assert ran == {"n0": 1, "n1": 1, "n2": 1}, (key, work.calls)
            view = await b.inspect(key)
            assert view.lease is None and view.verified


async def test_a_worker_paused_past_its_lease_is_fenced_out(tmp_path: Path) -> None:
    work = Work()
    catalog = HostCatalog([ToolBinding(id="w", version="1", execute=work.tool,
                                       recovery="pure", output_schema=INT_OUT)])
    clock = ManualClock()
    path = tmp_path / "pause.db"
    async with SQLiteDurableTaskStore(path) as s1, SQLiteDurableTaskStore(path) as s2:
        # The first worker renews rarely (a paused process): its lease expires on the
        # shared clock before it renews.
        first = ExecutionGraphRuntime(catalog=catalog, store=s1, clock=clock, lease_ttl=3,
                                      poll_interval=2.9)
        second = ExecutionGraphRuntime(catalog=catalog, store=s2, clock=clock, lease_ttl=3,
                                       poll_interval=0.1)
        await first.create("p", chain(2, hold=True))
        paused = asyncio.create_task(first.run("p", "w1"))
        await wait_until(lambda: work.calls[("p", "n0", "w1")] == 1, WAIT)
        with pytest.raises(LeaseHeldError) as held:
            await second.run("p", "w2")
        assert held.value.holder == "w1"
        assert held.value.expires_at == clock.now + timedelta(seconds=3)
        taking_over = asyncio.create_task(second.run("p", "w2", wait=True))
        clock.advance(10)  # w1's lease expires; w2's wait takes the task over
        async with asyncio.timeout(WAIT):
            result = await taking_over
        assert result.output == {"n0": {"value": 2}, "n1": {"value": 2}}
        work.paused.set()  # w1 resumes: its result is refused
        async with asyncio.timeout(WAIT):
            with pytest.raises(StaleFenceError):
                await paused
        assert await completions(second, "p") == {"n0": 1, "n1": 1}
        view = await first.inspect("p")
        assert view.status == "completed" and view.lease is None
        assert [a.fence for a in view.nodes["n0"].attempts] == [1, 2]
