from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    HostCatalog,
    InMemoryDurableTaskStore,
    StaleFenceError,
    ToolBinding,
)
from agentium_graph.store import (
    AcquireLeaseRequest,
    CommitRequest,
    CommitResult,
    LeaseGrant,
    LeaseStatus,
    RenewLeaseRequest,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
)

INT_OUT = {"type": "object", "properties": {"value": {"type": "integer"}},
           "required": ["value"], "additionalProperties": False}


class CountingStore(InMemoryDurableTaskStore):
    """The memory store, counting commits (durable writes of node transitions).

    A lease acquisition that carries a first commit's steps counts as that commit too
    (and in ``acquires``); ``reads`` names every read call in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[CommitRequest] = []
        self.acquires: list[AcquireLeaseRequest] = []
        self.reads: list[str] = []

    async def commit(self, request: CommitRequest) -> CommitResult:
        self.commits.append(request)
        return await super().commit(request)

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        self.acquires.append(request)
        grant = await super().acquire_lease(request)
        if request.steps:
            self.commits.append(CommitRequest(
                key=request.key, worker_id=request.worker_id, fence=grant.fence,
                now=request.now, steps=request.steps, blobs=request.blobs))
        return grant

    async def get_header(self, key: str) -> TaskHeader | None:
        self.reads.append("get_header")
        return await super().get_header(key)

    async def get_task(self, key: str) -> TaskSnapshot | None:
        self.reads.append("get_task")
        return await super().get_task(key)

    async def get_identity(self, key: str) -> TaskIdentity | None:
        self.reads.append("get_identity")
        return await super().get_identity(key)


class Calls:
    """Records tool invocations by node id."""

    def __init__(self) -> None:
        self.by_node: dict[str, int] = {}
        self.order: list[str] = []

    def hit(self) -> None:
        from agentium_graph import tool_context

        node = tool_context().node_id
        self.by_node[node] = self.by_node.get(node, 0) + 1
        self.order.append(node)


def chain_plan(n: int, binding: str = "inc") -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "n0", "binding": binding, "version": "1",
                                    "args": {"x": 0}}]
    for i in range(1, n):
        nodes.append({"id": f"n{i}", "binding": binding, "version": "1",
                      "args": {"x": {"$ref": {"node": f"n{i - 1}", "path": ["value"]}}}})
    return {"schemaVersion": 1, "revision": 1, "nodes": nodes}


def make_catalog(calls: Calls, extra: list[ToolBinding] | None = None) -> HostCatalog:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": args["x"] + 1}

    def add(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": sum(args["values"])}

    return HostCatalog([
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                    input_schema={"type": "object", "properties": {"x": {"type": "integer"}},
                                  "required": ["x"]},
                    output_schema=INT_OUT),
        ToolBinding(id="add", version="1", execute=add, recovery="pure",
                    input_schema={"type": "object",
                                  "properties": {"values": {"type": "array",
                                                            "items": {"type": "integer"}}},
                                  "required": ["values"]},
                    output_schema=INT_OUT),
        *(extra or []),
    ])


def program(plan: dict[str, Any], **kw: Any) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="test-program", version="1", plan=plan, **kw)


async def wait_until(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    """Await a condition without fixed sleeps: yield to the loop until true or time out."""
    async with asyncio.timeout(limit):
        while not predicate():  # noqa: ASYNC110 - the condition has no event to await
            await asyncio.sleep(0.005)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


class LosableLease(InMemoryDurableTaskStore):
    """Renews leases until ``lose`` is set; then every renewal finds another fence."""

    def __init__(self) -> None:
        super().__init__()
        self.lose = False

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        if self.lose:
            raise StaleFenceError(request.key, request.fence, request.fence + 1)
        return await super().renew_lease(request)


class ManualClock:
    """A runtime clock the test moves by hand: lease expiry and deadlines are decided by
    the test, never by how fast the machine is."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
