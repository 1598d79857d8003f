"""Review 16: a provider call that is abandoned still holds its root permit.

One root slot covers one provider request (SPEC 10). A call that swallows the cancellation
of its time limit is abandoned after a grace so that it cannot hold its node open, but it
goes on running: releasing its permit then let another call start beside it, so
``max_concurrent_work`` no longer bounded the calls really in flight. The permit is now
released when the abandoned call really ends; a run that stops meanwhile does not wait for
it (a stopping run queues no new work).

Every run is awaited under ``asyncio.wait_for`` with a generous limit, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    Agent,
    AgentBinding,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    RootLimits,
)
from agentium_graph.providers import ModelRequest, ModelResponse, StreamEvent, Usage
from agentium_graph.runtime import _abandon

HANG_LIMIT = 30.0  # seconds: far beyond the grace; reaching it means run() hung


class InFlight:
    """Counts the provider calls running at once, across providers."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    @contextlib.asynccontextmanager
    async def one(self) -> AsyncIterator[None]:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            yield
        finally:
            self.now -= 1


class Provider:
    """Answers at once, or (``stubborn``) ignores every cancellation until released."""

    version = "1"

    def __init__(self, name: str, flight: InFlight, *, stubborn: bool) -> None:
        self.id = name
        self.flight = flight
        self.stubborn = stubborn
        self.calls = 0
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        async with self.flight.one():
            if self.stubborn:
                self.waiting.set()
                while not self.release.is_set():
                    with contextlib.suppress(asyncio.CancelledError):  # the breach under test
                        await self.release.wait()
                self.finished.set()
            return ModelResponse(text="done", usage=Usage(input_tokens=1, output_tokens=1),
                                 stop_reason="end")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        raise AssertionError("complete mode only")
        yield  # pragma: no cover


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.1)


async def test_an_abandoned_provider_call_keeps_its_root_slot() -> None:
    flight = InFlight()
    stuck = Provider("stuck", flight, stubborn=True)
    quick = Provider("quick", flight, stubborn=False)
    events: list[AdmissionEvent] = []
    catalog = HostCatalog([
        AgentBinding(id="slow", version="1", agent=Agent(stuck, "Answer.")),
        AgentBinding(id="fast", version="1", agent=Agent(quick, "Answer."))])
    rt = ExecutionGraphRuntime(catalog=catalog, limits=RootLimits(max_concurrent_work=1),
                               effect_timeout=0.3, poll_interval=0.05,
                               on_admission=events.append)
    plan: dict[str, Any] = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "slow", "version": "1", "args": {"prompt": "go"}},
        {"id": "b", "binding": "fast", "version": "1", "args": {"prompt": "go"}}]}
    await rt.create("k", ExecutionGraphProgram(id="p", version="1", plan=plan))
    running = asyncio.create_task(rt.run("k"))
    try:
        # a's call times out, is abandoned (it swallows the cancel) and fails its node; b's
        # call, queued behind it for the one slot, must not start beside it.
        with pytest.raises(NodeFailedError, match="did not finish within"):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert stuck.waiting.is_set() and not stuck.finished.is_set()
        assert flight.most == 1, "a second provider call ran beside the abandoned one"
        assert quick.calls == 0
        view = await rt.inspect("k")
        assert view.status == "failed"
        assert (view.nodes["a"].state, view.nodes["b"].state) == ("failed", "canceled")

        # The abandoned call ends at last: its permit is released only now.
        stuck.release.set()
        await asyncio.wait_for(stuck.finished.wait(), HANG_LIMIT)
        await asyncio.sleep(0.05)
        released = [e for e in events if e.kind == "released" and e.node_id == "a"]
        assert released and released[-1].active == 0
        assert all(e.active <= 1 for e in events)
        assert (await rt.inspect("k")).journal_length == view.journal_length
    finally:
        stuck.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
