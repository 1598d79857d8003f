"""The benchmark graphs and their no-op tools.

Every tool is an async function that returns a small JSON object at once, so a workload's
wall time is the runtime's and the store's own overhead. Nodes pass data along with
``$ref`` (a chain node adds one to its predecessor's value), so argument resolution and
input validation are part of what is measured, and a finished graph has a known answer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    HostCatalog,
    PlanLimits,
    RootLimits,
    ToolBinding,
    tool_context,
)

NUM = {"type": "object", "properties": {"value": {"type": "integer"}},
       "required": ["value"]}
ANY_OBJECT = {"type": "object"}

# W2's concurrency: 16 leaf dispatches in flight (root permits) and 16 plan slots.
FANOUT_CONCURRENCY = 16
ROOT_LIMITS = RootLimits(max_concurrent_work=FANOUT_CONCURRENCY, max_expanded_nodes=10_000,
                         max_work_attempts=10_000)


class ToolLog:
    """An append-only log of tool starts shared by every process of a W4 run.

    ``fsync=True`` makes each line durable before the tool goes on (as the acceptance suite
    does); a process that is not going to be killed may skip it: a ``write()`` already
    survives the process, only a power loss could drop it.
    """

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self.first_start: float | None = None  # perf_counter of this process's first start

    def record(self) -> None:
        if self.first_start is None:
            self.first_start = time.perf_counter()
        ctx = tool_context()
        line = f"{ctx.node_id} {ctx.attempt} {ctx.fence} {os.getpid()}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def starts(self) -> dict[str, int]:
        """How many times each node's tool started, over every process."""
        counts: dict[str, int] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                node = line.split(" ", 1)[0]
                counts[node] = counts.get(node, 0) + 1
        return counts


def catalog(log: ToolLog | None = None) -> HostCatalog:
    """``step`` (value + 1), ``fan`` (value * 10 + i) and ``join`` (sum of values)."""
    hook: Callable[[], None] = log.record if log is not None else _nothing

    async def step(args: dict[str, Any]) -> dict[str, Any]:
        hook()
        return {"value": args["x"] + 1}

    async def fan(args: dict[str, Any]) -> dict[str, Any]:
        hook()
        return {"value": args["x"] * 10 + args["i"]}

    async def join(args: dict[str, Any]) -> dict[str, Any]:
        hook()
        return {"value": sum(args["xs"])}

    return HostCatalog([
        ToolBinding(id="step", version="1", execute=step, recovery="pure",
                    input_schema={"type": "object", "required": ["x"]}, output_schema=NUM),
        ToolBinding(id="fan", version="1", execute=fan, recovery="pure",
                    input_schema={"type": "object", "required": ["x", "i"]},
                    output_schema=NUM),
        ToolBinding(id="join", version="1", execute=join, recovery="pure",
                    input_schema={"type": "object", "required": ["xs"]}, output_schema=NUM),
    ])


def _nothing() -> None:
    return None


def _ref(node: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": ["value"]}}


def _limits(nodes: int, concurrency: int) -> PlanLimits:
    # The defaults (100 nodes, depth 32) are below what the workloads need.
    return PlanLimits(max_nodes=max(nodes, 100), max_depth=max(nodes + 1, 32),
                      max_bytes=max(128_000, nodes * 400), max_concurrency=concurrency)


def chain(length: int) -> ExecutionGraphProgram:
    """``n0 -> n1 -> ... -> n{length-1}``; node ``nI`` outputs ``I + 1``."""
    nodes: list[dict[str, Any]] = [{"id": "n0", "binding": "step", "version": "1",
                                    "args": {"x": 0}}]
    nodes += [{"id": f"n{i}", "binding": "step", "version": "1", "args": {"x": _ref(f"n{i-1}")}}
              for i in range(1, length)]
    return ExecutionGraphProgram(id=f"bench-chain-{length}", version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes},
                                 limits=_limits(length, 1))


def chain_answer(length: int) -> int:
    return length


def fanout(width: int) -> ExecutionGraphProgram:
    """``src`` -> ``f0..f{width-1}`` in parallel -> ``join`` (``width + 2`` nodes)."""
    nodes: list[dict[str, Any]] = [{"id": "src", "binding": "step", "version": "1",
                                    "args": {"x": 0}}]
    nodes += [{"id": f"f{i}", "binding": "fan", "version": "1",
               "args": {"x": _ref("src"), "i": i}} for i in range(width)]
    nodes.append({"id": "join", "binding": "join", "version": "1",
                  "args": {"xs": [_ref(f"f{i}") for i in range(width)]}})
    return ExecutionGraphProgram(id=f"bench-fanout-{width}", version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes},
                                 limits=_limits(width + 2, FANOUT_CONCURRENCY))


def fanout_answer(width: int) -> int:
    return sum(10 + i for i in range(width))
