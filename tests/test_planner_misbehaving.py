"""Planner providers that misbehave: a cancellation the provider raises itself, and streams
that end without sealing while reporting usage far beyond their reservation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentium_graph import (
    BudgetExhaustedError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    PlannerFailedError,
    StreamLimits,
    ToolBinding,
)
from agentium_graph.providers import ModelRequest, ModelResponse, StreamEnd, TextDelta, Usage

FRAME = json.dumps({"baseRevision": 0, "plan": {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "echo", "version": "1", "args": {}}]}}) + "\n"


def catalog(ran: list[str]) -> HostCatalog:
    def echo(args: dict[str, Any]) -> dict[str, Any]:
        ran.append("a")
        return {}

    return HostCatalog([ToolBinding(id="echo", version="1", execute=echo, recovery="pure")])


class CancelsItself:
    """A provider whose own inner work was canceled (not by the runtime)."""

    id, version = "cancels", "1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise asyncio.CancelledError()

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        yield TextDelta(text=FRAME)
        raise asyncio.CancelledError()


@pytest.mark.parametrize("mode", ["complete", "stream"])
async def test_a_cancellation_the_planner_raises_fails_the_task(mode: str) -> None:
    ran: list[str] = []
    program = ExecutionGraphProgram(id="pp", version="1", planner=PlannerConfig(
        provider=CancelsItself(), host_instructions="plan", mode=mode))
    rt = ExecutionGraphRuntime(catalog=catalog(ran), programs=[program])
    await rt.create("k", program)
    with pytest.raises(PlannerFailedError, match="raised CancelledError"):
        await rt.run("k")
    view = await rt.inspect("k")
    assert view.status == "failed"  # not 'completed' with no (or part of a) plan
    assert view.planner is not None and view.planner.state == "failed"
    with pytest.raises(PlannerFailedError):  # and a later run says so again
        await rt.run("k")


class CutOff:
    """Streams a valid frame, then stops for max_tokens reporting a huge usage."""

    id, version = "cutoff", "1"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("stream mode never calls complete()")

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        yield TextDelta(text=FRAME)
        yield StreamEnd(usage=Usage(input_tokens=1_000_000, output_tokens=1_000_000),
                        stop_reason="max_tokens")


async def test_usage_of_a_stream_that_ends_without_sealing_is_charged_up_to_the_limits(
        ) -> None:
    provider = CutOff()
    program = ExecutionGraphProgram(id="pp", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="plan", mode="stream", max_output_tokens=100,
        max_corrections=2))
    rt = ExecutionGraphRuntime(catalog=catalog([]), programs=[program])
    await rt.create("k", program, budgets=Budgets(input_tokens=50_000, output_tokens=50_000))
    # The first call's usage fills both budgets, so the continuation is refused up front.
    with pytest.raises(BudgetExhaustedError, match="input_tokens"):
        await rt.run("k")
    assert provider.calls == 1
    counters = (await rt.admission_snapshot("k")).counters
    # Each call spent a million of each; the limits cap what is charged, never exceeded.
    assert counters["input_tokens"] == 50_000 and counters["output_tokens"] == 50_000
    ended = [e for e in (await rt.timeline("k", limit=1000)).events
             if e.kind == "planner_interrupted"]
    assert ended and all(e.data["usage"]["output_tokens"] == 1_000_000 for e in ended)
    over = sum(e.data.get("usage_over_limit", {}).get("output_tokens", 0) for e in ended)
    assert over > 0  # what the limits could not take is journaled, not dropped


class Malformed:
    """Streams a frame, then an event whose fields break the event's own types."""

    id, version = "malformed", "1"

    def __init__(self, bad: Any) -> None:
        self.bad = bad

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("stream mode never calls complete()")

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        yield TextDelta(text=FRAME)
        yield self.bad


@pytest.mark.parametrize("bad", [
    StreamEnd.model_construct(usage=None, stop_reason="end"),
    StreamEnd.model_construct(usage=Usage.model_construct(input_tokens=-5, output_tokens=1),
                              stop_reason="end"),
    TextDelta.model_construct(text=42),
], ids=["no-usage", "negative-usage", "text-not-a-string"])
async def test_a_malformed_stream_event_fails_the_planner_with_a_typed_error(bad: Any) -> None:
    program = ExecutionGraphProgram(id="pp", version="1", planner=PlannerConfig(
        provider=Malformed(bad), host_instructions="plan", mode="stream"))
    rt = ExecutionGraphRuntime(catalog=catalog([]), programs=[program])
    await rt.create("k", program)
    with pytest.raises(PlannerFailedError, match="MalformedResponseError"):
        await rt.run("k")
    counters = (await rt.admission_snapshot("k")).counters
    assert counters["input_tokens"] >= 0 and counters["output_tokens"] >= 0


class Slow:
    id, version = "slow", "1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(30)
        raise AssertionError("the runtime's limit ends the call first")

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        raise AssertionError("complete mode never streams")
        yield


async def test_a_planner_call_that_takes_too_long_names_the_setting_to_raise() -> None:
    program = ExecutionGraphProgram(id="pp", version="1", planner=PlannerConfig(
        provider=Slow(), host_instructions="plan", stream=StreamLimits(max_latency_ms=50)))
    rt = ExecutionGraphRuntime(catalog=catalog([]), programs=[program])
    await rt.create("k", program)
    with pytest.raises(PlannerFailedError, match=r"within 0\.05 s.*max_latency_ms"):
        await asyncio.wait_for(rt.run("k"), 10)
