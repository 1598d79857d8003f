"""Request builders and raw-database access shared by the MongoDB store tests."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from agentium_graph import HostCatalog, ToolBinding, tool_context
from agentium_graph._canonical import digest
from agentium_graph.store import (
    COUNTERS,
    AcquireLeaseRequest,
    CommitRequest,
    CreateTaskRequest,
    NodeRecord,
    Step,
    TaskHeader,
    TaskIdentity,
)

INT = {"type": "object", "properties": {"value": {"type": "integer"}},
       "required": ["value"]}
T0 = datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def create_request(key: str, nodes: Iterable[str] = ("a", "b"), *, input_value: Any = 1,
                   limits: dict[str, int | None] | None = None,
                   admission_id: str | None = None) -> CreateTaskRequest:
    node_ids = tuple(nodes)
    identity = TaskIdentity(
        key=key, catalog_digest="sha256:catalog", program={"id": "p", "version": "1"},
        plan={"nodes": list(node_ids), "args": {"$ref": {"node": "a.b", "path": ["$x"]}}},
        descriptors={}, input={"x": input_value}, input_digest=digest({"x": input_value}),
        policy_revision="1", grants=None, budgets={}, root_limits={}, plan_limits={},
        deadline=None)
    counters = dict.fromkeys(COUNTERS, 0)
    counters["expanded_nodes"] = len(node_ids)
    header = TaskHeader(
        key=key, task_id=f"task_{key}", identity_digest=digest(identity.model_dump(mode="json")),
        created_at=T0, updated_at=T0, counters=counters,
        limits=limits if limits is not None else {"work_attempts": 100, "tool_calls": 100},
        journal_seq=1)
    records = tuple(
        NodeRecord(node_id=n, incarnation_id=f"inc_{key}_{i}", kind="tool", binding="t",
                   version="1", revision=1, deps=(node_ids[i - 1],) if i else ())
        for i, n in enumerate(node_ids))
    return CreateTaskRequest(header=header, identity=identity, nodes=records,
                             admission_id=admission_id or f"adm_{key}_create")


def acquire_request(key: str, worker: str = "w1", now: float = 0.0,
                    ttl: float = 30.0) -> AcquireLeaseRequest:
    return AcquireLeaseRequest(key=key, worker_id=worker, ttl_seconds=ttl, now=at(now))


def commit_request(key: str, fence: int, steps: Iterable[Step], *, worker: str = "w1",
                   now: float = 1.0, blobs: dict[str, str] | None = None) -> CommitRequest:
    return CommitRequest(key=key, worker_id=worker, fence=fence, now=at(now),
                         steps=tuple(steps), blobs=blobs or {})


class Tools:
    """Pure tools that count their calls; ``slow`` can be held until released."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.hold_slow = False
        self.slow_started = asyncio.Event()
        self.release: asyncio.Event | None = None  # set() lets a held "slow" finish

    def catalog(self) -> HostCatalog:
        def double(args: dict[str, Any]) -> dict[str, int]:
            self.calls[tool_context().node_id] += 1
            return {"value": args["x"] * 2}

        async def slow(args: dict[str, Any]) -> dict[str, int]:
            self.calls[tool_context().node_id] += 1
            self.slow_started.set()
            if self.hold_slow:
                # Until released, or until the run is cancelled.
                await (self.release or asyncio.Event()).wait()
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
