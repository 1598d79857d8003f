"""Work a run abandoned still counts against the limits it was admitted under (found by
review 26's concurrency run).

* A host that cancels ``run()`` while sync tools run (their threads cannot be stopped) and
  runs the task again: the new run started the plan's leaves beside the abandoned ones,
  past the plan's ``maxConcurrency`` (the root ``max_concurrent_work`` already held).
* A connector dispatch that swallows its cancellation: its root permit was released when
  the node settled or the run ended, while the call went on, so one more call ran at once
  than ``max_concurrent_work`` allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    RootLimits,
    ToolBinding,
    Unknown,
    tool_context,
)
from agentium_graph.runtime import _abandon
from tests.conftest import wait_until


class Gauge:
    """How many pieces of work run at once, and the most that ever did."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.started: list[str] = []

    def enter(self, name: str) -> None:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.started.append(name)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


async def test_a_rerun_keeps_the_plan_concurrency_beside_abandoned_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.05)
    gauge, release = Gauge(), threading.Event()

    def slow(args: dict[str, Any]) -> dict[str, Any]:
        gauge.enter(tool_context().node_id)
        try:
            release.wait(30)
            return {"v": 1}
        finally:
            gauge.leave()

    program = ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "maxConcurrency": 2,
        "nodes": [{"id": f"n{i}", "binding": "slow", "version": "1", "args": {}}
                  for i in range(3)]})
    runtime = ExecutionGraphRuntime(
        catalog=HostCatalog([ToolBinding(id="slow", version="1", execute=slow,
                                         recovery="pure")]),
        limits=RootLimits(max_concurrent_work=10))
    await runtime.create("k", program)
    first = asyncio.create_task(runtime.run("k"))
    await wait_until(lambda: gauge.active == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(runtime.run("k"))
    await asyncio.sleep(0.3)  # room to start leaves, if it (wrongly) would
    assert gauge.peak == 2 and gauge.active == 2  # the abandoned two hold the plan's places
    release.set()
    result = await asyncio.wait_for(second, 30)
    assert result.status == "completed" and gauge.peak == 2


class SwallowingConnector:
    """A dispatch that takes a while and ignores its cancellation (a contract breach the
    runtime bounds); lookups say it cannot tell while a dispatch is in flight."""

    id = "swallowing"
    version = "1"
    idempotent_destination = False

    def __init__(self, gauge: Gauge, done: asyncio.Event) -> None:
        self.gauge, self.done = gauge, done

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.gauge.enter("dispatch")
        try:
            while not self.done.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # swallowed
                    await self.done.wait()
            return ActionOutcome(output={"ok": True}, result_ref=request.result_ref)
        finally:
            self.gauge.leave()

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        return Unknown(reason="in flight")


async def test_an_abandoned_dispatch_keeps_its_root_permit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.05)
    gauge, done = Gauge(), asyncio.Event()

    async def pure(args: dict[str, Any]) -> dict[str, Any]:
        gauge.enter(tool_context().node_id)
        gauge.leave()
        return {"v": 1}

    connector = SwallowingConnector(gauge, done)
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="pay", version="1", connector=connector, destination="payments"),
        ToolBinding(id="pure", version="1", execute=pure, recovery="pure")]),
        limits=RootLimits(max_concurrent_work=1), effect_timeout=0.2)
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "eff", "binding": "pay", "version": "1", "args": {}},
            *({"id": f"n{i}", "binding": "pure", "version": "1", "args": {},
               "dependsOn": []} for i in range(2))]}))
    run = asyncio.create_task(runtime.run("k"))
    await wait_until(lambda: "dispatch" in gauge.started)
    # The dispatch times out (0.2 s) and is abandoned; its lookup cannot tell. Its permit
    # stays held while the call goes on: no pure node may start beside it.
    await asyncio.sleep(0.6)
    assert gauge.started == ["dispatch"] and gauge.peak == 1
    done.set()
    with pytest.raises(DurableRecoveryRequiredError):  # the action is uncertain
        await asyncio.wait_for(run, 30)
    assert gauge.peak == 1
