"""End to end: ExecutionGraphRuntime on a SQLite file with require_durable=True."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    ToolBinding,
    tool_context,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore

INT = {"type": "object", "properties": {"value": {"type": "integer"}},
       "required": ["value"]}


def _ref(node: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": ["value"]}}


PLAN: dict[str, Any] = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "src", "binding": "double", "version": "1", "args": {"x": 3}},
    {"id": "left", "binding": "double", "version": "1", "args": {"x": _ref("src")}},
    {"id": "right", "binding": "slow", "version": "1", "args": {"x": _ref("src")}},
    {"id": "join", "binding": "add", "version": "1",
     "args": {"values": [_ref("left"), _ref("right")]}},
]}


class Tools:
    """Pure tools that count their calls; ``slow`` can be held until released."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.hold_slow = False
        self.slow_started = asyncio.Event()

    def catalog(self) -> HostCatalog:
        def double(args: dict[str, Any]) -> dict[str, int]:
            self.calls[tool_context().node_id] += 1
            return {"value": args["x"] * 2}

        async def slow(args: dict[str, Any]) -> dict[str, int]:
            self.calls[tool_context().node_id] += 1
            self.slow_started.set()
            if self.hold_slow:
                await asyncio.Event().wait()  # until the run is cancelled (a "crash")
            return {"value": args["x"] + 1}

        def add(args: dict[str, Any]) -> dict[str, int]:
            self.calls[tool_context().node_id] += 1
            return {"value": sum(args["values"])}

        number_in = {"type": "object", "properties": {"x": {"type": "integer"}},
                     "required": ["x"]}
        return HostCatalog([
            ToolBinding(id="double", version="1", execute=double, recovery="pure",
                        input_schema=number_in, output_schema=INT, run_in_thread=False),
            ToolBinding(id="slow", version="1", execute=slow, recovery="pure",
                        input_schema=number_in, output_schema=INT),
            ToolBinding(id="add", version="1", execute=add, recovery="pure",
                        output_schema=INT, run_in_thread=False),
        ])


def _program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="fan", version="1", plan=PLAN)


async def test_small_graph_runs_durably_and_is_reused_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    tools = Tools()
    async with SQLiteDurableTaskStore(path) as store:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True)
        await runtime.create("job-1", _program(), input={"n": 1})
        result = await runtime.run("job-1", worker_id="w1")
        assert result.status == "completed"
        assert result.output["join"] == {"value": 12 + 7}
        assert store.stats.commits > 0
    assert dict(tools.calls) == {"src": 1, "left": 1, "right": 1, "join": 1}

    # A new process would do exactly this: a fresh store and runtime on the same file.
    async with SQLiteDurableTaskStore(path) as reopened:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=reopened,
                                        require_durable=True)
        view = await runtime.inspect("job-1")
        assert view.status == "completed" and view.verified
        assert all(n.state == "completed" for n in view.nodes.values())
        assert view.nodes["join"].output == {"value": 19}
        commits = reopened.stats.commits
        again = await runtime.run("job-1", worker_id="w2")
        assert again.output == result.output
        assert reopened.stats.commits == commits  # retained output: nothing written
        page = await runtime.timeline("job-1", limit=3)
        assert [e.seq for e in page.events] == [1, 2, 3]
        assert page.next_cursor is not None
    assert dict(tools.calls) == {"src": 1, "left": 1, "right": 1, "join": 1}


async def test_interrupted_run_recovers_from_the_file_without_rerunning_completed_nodes(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    tools = Tools()
    tools.hold_slow = True
    store = SQLiteDurableTaskStore(path)
    runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                    require_durable=True)
    await runtime.create("job-2", _program())
    run = asyncio.create_task(runtime.run("job-2", worker_id="w1"))
    await asyncio.wait_for(tools.slow_started.wait(), timeout=10)
    run.cancel()  # the worker dies while "right" runs
    await asyncio.gather(run, return_exceptions=True)
    await store.close()

    tools.hold_slow = False
    async with SQLiteDurableTaskStore(path) as fresh:
        recovered = ExecutionGraphRuntime(catalog=tools.catalog(), store=fresh,
                                          require_durable=True)
        result = await recovered.run("job-2", worker_id="w1")
        assert result.output["join"] == {"value": 19}
        view = await recovered.inspect("job-2")
    assert tools.calls["src"] == 1
    assert tools.calls["right"] == 2  # interrupted once, re-run once
    assert tools.calls["join"] == 1
    fences = [a.fence for a in view.nodes["right"].attempts]
    assert fences == sorted(fences) and fences[-1] > fences[0]
    assert view.verified
