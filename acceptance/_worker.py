"""A worker process for acceptance cases: ``python -m acceptance._worker '<json config>'``.

Kill points are injected from the outside of the library: a store wrapper that SIGKILLs
its own process right before or after a chosen store call (journal boundary), or a tool
that kills its process. The library has no test-only branches.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from acceptance._graph import CallLog, catalog, program
from acceptance._stores import open_store
from agentium_graph import AgentiumGraphError, DurableTaskStore, ExecutionGraphRuntime
from agentium_graph.store import (
    AcquireLeaseRequest,
    AppendJournal,
    CommitRequest,
    CommitResult,
    CommitRevision,
    LeaseGrant,
    LeaseStatus,
    RenewLeaseRequest,
    SettleNode,
    StartAttempt,
)
from agentium_graph.testing import ForwardingStore


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillSwitch(ForwardingStore):
    """Wraps a store; SIGKILLs the process at one journal boundary.

    ``point``: before_lease | after_lease | before_start_commit | after_start_commit |
    before_completion_commit | after_completion_commit | during_renewal | after_renewal |
    after_model_response | after_repeat_guard | after_planner_response |
    after_plan_commit | none.
    ``node``: which node's start/completion commit triggers it.
    """

    def __init__(self, inner: DurableTaskStore, point: str, node: str | None) -> None:
        super().__init__(inner)
        self.point = point
        self.node = node

    def _matches(self, request: CommitRequest, kind: type[Any]) -> bool:
        return any(isinstance(s, kind) and s.node_id == self.node and
                   (not isinstance(s, SettleNode) or s.state == "completed")
                   for s in request.steps)

    def _journals(self, request: CommitRequest, kind: str) -> bool:
        return any(isinstance(s, AppendJournal) and s.kind == kind and
                   (self.node is None or s.node_id == self.node) for s in request.steps)

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.point == "before_start_commit" and self._matches(request, StartAttempt):
            die()
        if self.point == "before_completion_commit" and self._matches(request, SettleNode):
            die()
        result = await self.inner.commit(request)
        if self.point == "after_start_commit" and self._matches(request, StartAttempt):
            die()
        if self.point == "after_completion_commit" and self._matches(request, SettleNode):
            die()
        if self.point == "after_model_response" and self._journals(request, "model_response"):
            die()
        if self.point == "after_repeat_guard" and self._journals(request, "repeat_guard"):
            die()
        if self.point == "after_planner_response" and \
                self._journals(request, "planner_response"):
            die()
        if self.point == "after_plan_commit" and \
                any(isinstance(s, CommitRevision) for s in request.steps):
            die()
        return result

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        if self.point == "before_lease":
            die()
        grant = await self.inner.acquire_lease(request)
        if self.point == "after_lease":
            die()
        return grant

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        if self.point == "during_renewal":
            die()
        status = await self.inner.renew_lease(request)
        if self.point == "after_renewal":  # the renewal is written, its answer not seen
            die()
        return status


async def main(config: dict[str, Any]) -> dict[str, Any]:
    store: DurableTaskStore = KillSwitch(open_store(config["store"]),
                                         config.get("kill_at", "none"), config.get("node"))
    log = CallLog(Path(config["log"]))
    graph = config.get("graph", "pure")
    if graph == "effect":
        from acceptance import _effect_graph

        cat = _effect_graph.catalog(log, config["server_url"], config.get("idempotent", False),
                                   config.get("hold_first_post"))
        prog = _effect_graph.program()
    elif graph == "planner":
        from acceptance import _planner_graph

        cat = catalog(log)
        prog = _planner_graph.program(config)
    elif graph == "agent":
        from acceptance import _agent_graph

        cat = _agent_graph.catalog(log, config)
        prog = _agent_graph.program()
    else:
        cat = catalog(log, kill_in_tool=config.get("kill_in_tool"),
                      kill_when_fan_running=config.get("kill_when_fan_running", 0),
                      slow=config.get("slow"))
        prog = program()
    runtime = ExecutionGraphRuntime(
        catalog=cat, store=store, require_durable=True, lease_ttl=config.get("lease_ttl", 5.0),
        poll_interval=config.get("poll_interval", 0.05), lookup_timeout=2.0,
        programs=[prog] if prog.planner is not None else ())
    try:
        if config.get("create", False):
            await runtime.create(config["key"], prog, limits=config.get("limits"))
            if config.get("create_only", False):
                return {"ok": True, "created": True}
        result = await runtime.run(config["key"], config["worker"],
                                   wait=config.get("wait", False))
        return {"ok": True, "output": result.output}
    except AgentiumGraphError as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc),
                "details": exc.details}
    finally:
        await store.close()


if __name__ == "__main__":
    outcome = asyncio.run(main(json.loads(sys.argv[1])))
    print(json.dumps(outcome))
