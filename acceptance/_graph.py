"""The acceptance graph and its tools. Every tool invocation is appended (fsynced) to a log
file shared by all processes of a case, so the test can count executions across kills."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    HostCatalog,
    PlanLimits,
    ToolBinding,
    tool_context,
)

FAN = 4
NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}


def plan() -> dict[str, Any]:
    """a -> b -> (c0..c3 in parallel) -> d (join) -> e."""
    ref = lambda n: {"$ref": {"node": n, "path": ["value"]}}  # noqa: E731
    nodes: list[dict[str, Any]] = [
        {"id": "a", "binding": "step", "version": "1", "args": {"x": 1}},
        {"id": "b", "binding": "step", "version": "1", "args": {"x": ref("a")}},
    ]
    nodes += [{"id": f"c{i}", "binding": "fan", "version": "1",
               "args": {"x": ref("b"), "i": i}} for i in range(FAN)]
    nodes.append({"id": "d", "binding": "join", "version": "1",
                  "args": {"xs": [ref(f"c{i}") for i in range(FAN)]}})
    nodes.append({"id": "e", "binding": "step", "version": "1", "args": {"x": ref("d")}})
    return {"schemaVersion": 1, "revision": 1, "nodes": nodes}


# a=2, b=3, c_i=3*10+i, d=sum(c)=126, e=127
EXPECTED = {"a": 2, "b": 3, **{f"c{i}": 30 + i for i in range(FAN)}, "d": 126, "e": 127}


def program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="acceptance", version="1", plan=plan(),
                                 limits=PlanLimits(max_concurrency=FAN))


class CallLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, event: str) -> None:
        ctx = tool_context()
        line = json.dumps({"event": event, "node": ctx.node_id, "attempt": ctx.attempt,
                           "fence": ctx.fence, "pid": os.getpid()}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]


def catalog(log: CallLog, kill_in_tool: str | None = None,
            kill_when_fan_running: int = 0, slow: dict[str, float] | None = None) -> HostCatalog:
    """Tools that log each start and finish. The kill switches are test-side: a tool kills
    its own process, exactly as a crashing host would."""
    running: set[str] = set()
    all_running = asyncio.Event()

    def maybe_die(node: str) -> None:
        if kill_in_tool == node:
            os.kill(os.getpid(), signal.SIGKILL)

    async def step(args: dict[str, Any]) -> dict[str, Any]:
        node = tool_context().node_id
        log.record("start")
        maybe_die(node)
        if slow and node in slow:
            await asyncio.sleep(slow[node])
        log.record("finish")
        return {"value": args["x"] + 1}

    async def fan(args: dict[str, Any]) -> dict[str, Any]:
        node = tool_context().node_id
        log.record("start")
        maybe_die(node)
        if kill_when_fan_running:
            running.add(node)
            if len(running) >= kill_when_fan_running:
                all_running.set()
                os.kill(os.getpid(), signal.SIGKILL)
            await asyncio.wait_for(all_running.wait(), 10)
        if slow and node in slow:
            await asyncio.sleep(slow[node])
        log.record("finish")
        return {"value": args["x"] * 10 + args["i"]}

    async def join(args: dict[str, Any]) -> dict[str, Any]:
        node = tool_context().node_id
        log.record("start")
        maybe_die(node)
        log.record("finish")
        return {"value": sum(args["xs"])}

    return HostCatalog([
        ToolBinding(id="step", version="1", execute=step, recovery="pure",
                    input_schema={"type": "object", "required": ["x"]}, output_schema=NUM),
        ToolBinding(id="fan", version="1", execute=fan, recovery="pure",
                    input_schema={"type": "object", "required": ["x", "i"]}, output_schema=NUM),
        ToolBinding(id="join", version="1", execute=join, recovery="pure",
                    input_schema={"type": "object", "required": ["xs"]}, output_schema=NUM),
    ])
