"""Review 15: a model provider that swallows cancellation cannot hold a run open.

When the runtime must stop planning (task cancel, lost lease, deadline, the planner's
max_latency_ms) it cancels the provider's call. A provider that swallows the
``CancelledError`` (it keeps awaiting, or goes on streaming) used to hang ``run()`` in
stream mode. Now the runtime waits a bounded grace period, abandons the call (logged, naming
the provider), ignores whatever it sends afterwards, and the run ends as it would have had
the provider honored the cancel. Complete mode and agents (which already abandoned such a
call) are held to the same outcome.

Every run is awaited under ``asyncio.wait_for`` with a generous limit, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    DeadlineExceededError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    PlannerFailedError,
    StaleFenceError,
    StreamLimits,
    TaskCanceledError,
    TaskView,
    ToolBinding,
)
from agentium_graph.providers import (
    ModelRequest,
    ModelResponse,
    StreamEnd,
    StreamEvent,
    TextDelta,
    Usage,
)
from agentium_graph.runtime import _abandon
from tests.conftest import LosableLease

HANG_LIMIT = 30.0  # seconds: far beyond any grace period; reaching it means run() hung
USAGE = Usage(input_tokens=10, output_tokens=10)
LOGGER = "agentium_graph.runtime"


def frame(base: int, *node_ids: str) -> str:
    nodes = [{"id": n, "binding": "echo", "version": "1", "args": {}} for n in node_ids]
    plan = {"schemaVersion": 1, "revision": base + 1, "nodes": nodes}
    return json.dumps({"baseRevision": base, "plan": plan}) + "\n"


def catalog(ran: list[str]) -> HostCatalog:
    def echo(args: dict[str, Any]) -> dict[str, Any]:
        from agentium_graph import tool_context

        ran.append(tool_context().node_id)
        return {}

    return HostCatalog([ToolBinding(id="echo", version="1", execute=echo, recovery="pure")])


class HeldStream:
    """Streams the frame of revision 1 (node ``a``), then waits for ``release`` before it
    ends the stream.

    ``behavior``: ``"honors"`` lets a cancellation end it, as the contract says;
    ``"hangs"`` swallows every cancellation and keeps waiting (the breach under test);
    ``"sends"`` swallows it, sends a frame of revision 2 (node ``b``) that must be ignored,
    and then swallows the cancellation of its own cleanup too."""

    version = "1"

    def __init__(self, behavior: str) -> None:
        self.id = f"held-{behavior}"
        self.behavior = behavior
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = asyncio.Event()
        self.canceled = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("stream mode never calls complete()")

    async def _stubborn_wait(self) -> None:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.canceled += 1
                if self.behavior == "honors":
                    raise

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        try:
            yield TextDelta(text=frame(0, "a"))
            self.waiting.set()
            if self.behavior == "sends":
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.canceled += 1
                    yield TextDelta(text=frame(1, "a", "b"))  # after the cancel: ignored
            await self._stubborn_wait()
            yield StreamEnd(usage=USAGE, stop_reason="end")
        finally:
            if self.behavior == "sends":
                await self._stubborn_wait()
            self.finished.set()


def streamed(provider: Any, **kw: Any) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="streamed", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="Plan.", mode="stream", **kw))


# What each stop ends with when the provider honors the cancel: the exception run() raises
# and the task's status afterwards.
OUTCOMES: dict[str, tuple[type[Exception], str]] = {
    "cancel": (TaskCanceledError, "canceled"),
    "lease_lost": (StaleFenceError, "running"),  # recoverable: the next worker takes it over
    "deadline": (DeadlineExceededError, "failed"),
    "latency": (PlannerFailedError, "failed"),
}


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shorter grace keeps the matrix below fast; the tests after it use the default."""
    monkeypatch.setattr(_abandon, "GRACE", 0.2)


@pytest.mark.usefixtures("short_grace")
@pytest.mark.parametrize("behavior", ["honors", "hangs", "sends"])
@pytest.mark.parametrize("stop", sorted(OUTCOMES))
async def test_a_stopped_stream_ends_the_run_as_if_the_provider_honored_the_cancel(
        stop: str, behavior: str, caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    provider = HeldStream(behavior)
    store = LosableLease()
    limits = StreamLimits(max_latency_ms=300) if stop == "latency" else StreamLimits()
    program = streamed(provider, stream=limits)
    rt = ExecutionGraphRuntime(catalog=catalog(ran), store=store, poll_interval=0.05)
    deadline = timedelta(milliseconds=500) if stop == "deadline" else None
    await rt.create("k", program, deadline=deadline)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    running = asyncio.create_task(rt.run("k", "w1"))
    try:
        await asyncio.wait_for(provider.waiting.wait(), HANG_LIMIT)
        if stop == "cancel":
            await rt.cancel("k", reason="enough")
        elif stop == "lease_lost":
            store.lose = True
        error, status = OUTCOMES[stop]
        with pytest.raises(error):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        view = await rt.inspect("k")
        assert view.status == status
        assert view.revision <= 1 and "b" not in view.nodes  # the late frame was ignored
        assert provider.canceled >= 1
        abandoned = [r for r in caplog.records if r.name == LOGGER and
                     r.levelno == logging.WARNING and provider.id in r.getMessage()]
        assert bool(abandoned) == (behavior != "honors")

        # Released at last, the abandoned provider finishes its stream: nothing of it counts.
        provider.release.set()
        await asyncio.wait_for(provider.finished.wait(), HANG_LIMIT)
        after = await rt.inspect("k")
        assert after.revision == view.revision and "b" not in after.nodes
        assert after.status == status and after.journal_length == view.journal_length
        assert "b" not in ran
    finally:
        provider.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


class StubbornComplete:
    """``complete()`` (or a non-streamed agent's call) that swallows cancellation."""

    id, version = "stubborn-complete", "1"

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def _wait(self) -> None:
        self.waiting.set()
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the breach under test
                await self.release.wait()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await self._wait()
        return ModelResponse(text=frame(0, "a").split("\n")[0], usage=USAGE,
                             stop_reason="end")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        await self._wait()
        yield StreamEnd(usage=USAGE, stop_reason="end")


async def cancel_while_it_waits(rt: ExecutionGraphRuntime,
                                provider: StubbornComplete) -> TaskView:
    """Run task ``k``, cancel it once the provider waits, expect the run to end canceled;
    the task's view afterwards."""
    running = asyncio.create_task(rt.run("k"))
    try:
        await asyncio.wait_for(provider.waiting.wait(), HANG_LIMIT)
        await rt.cancel("k", reason="enough")
        with pytest.raises(TaskCanceledError):
            await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        return await rt.inspect("k")
    finally:
        provider.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_complete_mode_planner_that_swallows_cancel_ends_canceled() -> None:
    ran: list[str] = []
    provider = StubbornComplete()
    program = ExecutionGraphProgram(id="p", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="Plan."))
    rt = ExecutionGraphRuntime(catalog=catalog(ran), poll_interval=0.05)
    await rt.create("k", program)
    view = await cancel_while_it_waits(rt, provider)
    assert view.status == "canceled" and view.revision == 0 and not ran


async def test_a_streaming_agent_whose_provider_swallows_cancel_ends_canceled() -> None:
    provider = StubbornComplete()
    cat = HostCatalog([AgentBinding(id="ag", version="1", agent=Agent(
        provider, "You help.", stream=True))])
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "ag", "version": "1", "args": {"prompt": "go"}}]}
    rt = ExecutionGraphRuntime(catalog=cat, poll_interval=0.05)
    await rt.create("k", ExecutionGraphProgram(id="p", version="1", plan=plan))
    view = await cancel_while_it_waits(rt, provider)
    assert view.status == "canceled" and view.nodes["a"].state == "canceled"


class StubbornClose:
    """Its first stream sends a frame that is no plan, and its cleanup (``aclose()``, when
    the runtime closes the rejected stream) swallows cancellation; its second stream
    answers the continuation properly."""

    id, version = "stubborn-close", "1"

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("stream mode never calls complete()")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.calls > 1:
            yield TextDelta(text=frame(0, "a"))
            yield StreamEnd(usage=USAGE, stop_reason="end")
            return
        try:
            yield TextDelta(text="not a frame\n")
            yield StreamEnd(usage=USAGE, stop_reason="end")
        finally:
            while not self.release.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # the breach under test
                    await self.release.wait()


@pytest.mark.usefixtures("short_grace")
async def test_a_stream_whose_close_swallows_cancel_is_abandoned_and_planning_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    provider = StubbornClose()
    rt = ExecutionGraphRuntime(catalog=catalog(ran))
    await rt.create("k", streamed(provider))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    running = asyncio.create_task(rt.run("k"))
    try:
        result = await asyncio.wait_for(asyncio.shield(running), HANG_LIMIT)
        assert result.status == "completed" and ran == ["a"] and provider.calls == 2
        assert any(provider.id in r.getMessage() for r in caplog.records
                   if r.levelno == logging.WARNING)
    finally:
        provider.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
