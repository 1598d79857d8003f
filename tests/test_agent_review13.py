"""Agent review 13: the provider an agent conversation began with, cancellation seen by an
agent's sync tools, responses larger than the store keeps, providers that swallow
cancellation, and wrongly shaped providers.

Each test failed on the code before its fix (except those marked as compatibility guards).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Generator
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    ConfigurationError,
    DescriptorMismatchError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    PlannerConfig,
    StoreError,
    TaskCanceledError,
    ToolBinding,
    tool_context,
)
from agentium_graph.providers import (
    ModelRequest,
    ModelResponse,
    ScriptedProvider,
    ScriptedTurn,
    StreamEnd,
    TextDelta,
    ToolCall,
    Usage,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult
from agentium_graph.store._requests import StoreCapabilities

OBJ: dict[str, Any] = {"type": "object"}
PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "ag", "version": "1", "args": {"prompt": "go"}}]}
U1 = Usage(input_tokens=1, output_tokens=1)


def prog() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan=PLAN)


def catalog(provider: Any, *tools: ToolBinding, stream: bool = False) -> HostCatalog:
    return HostCatalog([*tools, AgentBinding(id="ag", version="1", agent=Agent(
        provider, "You help.", tools=[t.id for t in tools], stream=stream))])


class _Crash(BaseException):
    pass


# --- 1. the provider a conversation began with ---------------------------------------------

class Renamed(ScriptedProvider):
    id = "other-model"
    version = "99"


ADD = ToolBinding(id="add", version="1", execute=lambda args: {"sum": 3}, recovery="pure",
                  input_schema=OBJ, output_schema=OBJ)


def first_script() -> list[ScriptedTurn]:
    return [ScriptedTurn(tool_calls=(ToolCall(id="c1", name="add", arguments={}),)),
            ScriptedTurn(text="three")]


class CrashAfterTool(InMemoryDurableTaskStore):
    """Dies right after the agent's first tool result is journaled (mid-conversation)."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if self.armed and any(isinstance(s, AppendJournal) and s.kind == "agent_tool_result"
                              for s in request.steps):
            self.armed = False
            raise _Crash
        return result


class StripProvider(CrashAfterTool):
    """Journals model responses as versions before this fix did: without their provider."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        steps = [s.model_copy(update={"data": {k: v for k, v in s.data.items()
                                               if k != "provider"}})
                 if isinstance(s, AppendJournal) and s.kind == "model_response" else s
                 for s in request.steps]
        return await super().commit(request.model_copy(update={"steps": tuple(steps)}))


async def crash_mid_conversation(store: InMemoryDurableTaskStore) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(ScriptedProvider(first_script()), ADD),
                               store=store)
    await rt.create("k", prog())
    with pytest.raises(_Crash):
        await rt.run("k", "w1")


async def test_a_swapped_provider_stops_recovery_and_the_original_recovers_it() -> None:
    store = CrashAfterTool()
    await crash_mid_conversation(store)
    other = Renamed(["a different model's answer"])
    rt = ExecutionGraphRuntime(catalog=catalog(other, ADD), store=store)
    with pytest.raises(DescriptorMismatchError) as info:
        await rt.run("k", "w1")
    assert info.value.details["pinned_provider"] == {"id": "scripted", "version": "1"}
    assert other.call_count == 0
    view = await rt.inspect("k")
    assert view.status == "pending" and view.nodes["a"].state == "running"
    # Restoring the provider the conversation began with recovers the task.
    again = ExecutionGraphRuntime(catalog=catalog(ScriptedProvider(first_script()[1:]), ADD),
                                  store=store)
    result = await again.run("k", "w1")
    assert result.output["a"]["text"] == "three"


async def test_a_conversation_journaled_without_its_provider_still_recovers() -> None:
    """Compatibility guard: responses journaled before they named their provider (tasks of
    earlier versions) are accepted as they were."""
    store = StripProvider()
    await crash_mid_conversation(store)
    rt = ExecutionGraphRuntime(catalog=catalog(Renamed(["done"]), ADD), store=store)
    result = await rt.run("k", "w1")
    assert result.output["a"]["text"] == "done"


class NoVersion:
    id = "x"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError


class EmptyId(NoVersion):
    id = ""
    version = "1"


@pytest.mark.parametrize("provider", [NoVersion(), EmptyId()])
def test_an_agent_needs_a_provider_id_and_version(provider: Any) -> None:
    with pytest.raises(ConfigurationError, match="non-empty string"):
        Agent(provider, "x")


# --- 2. an agent's sync tool sees the cancellation -----------------------------------------

async def test_a_sync_tool_called_by_an_agent_sees_the_task_cancel() -> None:
    started, finished = threading.Event(), threading.Event()
    seen: list[bool] = []

    def slow(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        seen.append(tool_context().wait_cancelled(20))
        finished.set()
        return {}

    tool = ToolBinding(id="slow", version="1", execute=slow, recovery="pure",
                       input_schema=OBJ, output_schema=OBJ)
    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c", name="slow", arguments={}),)), "ok"])
    rt = ExecutionGraphRuntime(catalog=catalog(provider, tool), poll_interval=0.05)
    await rt.create("k", prog())
    run = asyncio.create_task(rt.run("k"))
    assert await asyncio.to_thread(started.wait, 20)
    await rt.cancel("k", reason="stop")
    with pytest.raises(TaskCanceledError):
        await run
    assert await asyncio.to_thread(finished.wait, 30)
    assert seen == [True]


# --- 3. a response larger than the store keeps ---------------------------------------------

LIMIT = 10_000


class Limited(InMemoryDurableTaskStore):
    """Refuses blobs over LIMIT bytes, as MongoDB refuses an over-size document."""

    def __init__(self) -> None:
        super().__init__()
        self._capabilities = StoreCapabilities(durable=False, multi_process=False,
                                               name="limited", max_blob_bytes=LIMIT)

    async def commit(self, request: CommitRequest) -> CommitResult:
        for blob, text in request.blobs.items():
            if len(text.encode()) > LIMIT:
                raise StoreError(f"blob {blob} is over {LIMIT} bytes")
        return await super().commit(request)


class Big:
    id, version = "big", "1"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(text="x" * (LIMIT + 1), stop_reason="end",
                             usage=Usage(input_tokens=1, output_tokens=5_000))


async def test_a_response_over_the_stores_blob_limit_fails_the_node_once_charged() -> None:
    provider = Big()
    rt = ExecutionGraphRuntime(catalog=catalog(provider), store=Limited())
    await rt.create("k", prog())
    for _ in range(2):
        with pytest.raises(NodeFailedError):
            await rt.run("k")
    view = await rt.inspect("k")
    error = view.nodes["a"].error
    assert view.status == "failed" and error is not None
    assert error.code == "provider_response_too_large"
    assert error.details["limit"] == LIMIT and error.details["bytes"] > LIMIT
    assert provider.calls == 1
    assert view.counters["output_tokens"] == 5_000 and view.counters["model_calls"] == 1


class CrashAfterRefusal(Limited):
    """Dies right after the refusal is journaled, before the node's failure is."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if self.armed and any(isinstance(s, AppendJournal) and "too_large" in s.data
                              for s in request.steps):
            raise _Crash
        return result


async def test_a_refused_response_is_not_asked_again_after_a_crash() -> None:
    provider = Big()
    store = CrashAfterRefusal()
    rt = ExecutionGraphRuntime(catalog=catalog(provider), store=store)
    await rt.create("k", prog())
    with pytest.raises(_Crash):
        await rt.run("k", "w1")
    store.armed = False
    again = ExecutionGraphRuntime(catalog=catalog(provider), store=store)
    with pytest.raises(NodeFailedError, match="not asked again"):
        await again.run("k", "w1")
    assert provider.calls == 1


# --- 4. a provider that swallows cancellation ----------------------------------------------

class Stubborn:
    id, version = "stubborn", "1"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.entered.set()
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the breach under test
                await self.release.wait()
        raise RuntimeError("released")


async def test_a_provider_swallowing_cancellation_cannot_hold_a_canceled_task() -> None:
    provider = Stubborn()
    rt = ExecutionGraphRuntime(catalog=catalog(provider), poll_interval=0.05)
    await rt.create("k", prog())
    run = asyncio.create_task(rt.run("k"))
    try:
        await provider.entered.wait()
        await rt.cancel("k", reason="stop")
        done, _ = await asyncio.wait({run}, timeout=60)
        assert run in done
        with pytest.raises(TaskCanceledError):
            run.result()
        assert (await rt.inspect("k")).status == "canceled"
    finally:
        provider.release.set()
        await asyncio.sleep(0)


async def test_a_provider_swallowing_cancellation_still_times_out() -> None:
    provider = Stubborn()
    rt = ExecutionGraphRuntime(catalog=catalog(provider), effect_timeout=0.2)
    await rt.create("k", prog())
    run = asyncio.create_task(rt.run("k"))
    try:
        done, _ = await asyncio.wait({run}, timeout=60)
        assert run in done
        with pytest.raises(NodeFailedError):
            run.result()
        error = (await rt.inspect("k")).nodes["a"].error
        assert error is not None and error.code == "provider_timeout"
    finally:
        provider.release.set()
        await asyncio.sleep(0)


# --- 5. wrongly shaped providers -------------------------------------------------------------

END = StreamEnd(usage=U1, stop_reason="end")


class SyncComplete:
    id, version = "sync", "1"

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError


class CoroStream:
    id, version = "coro", "1"

    async def stream(self, request: ModelRequest) -> list[Any]:
        raise AssertionError


class SyncGenStream:
    id, version = "gen", "1"

    def stream(self, request: ModelRequest) -> Generator[Any, None, None]:
        yield END


@pytest.mark.parametrize(("provider", "stream"), [(SyncComplete(), False),
                                                  (CoroStream(), True),
                                                  (SyncGenStream(), True)])
def test_a_wrongly_shaped_provider_is_refused_at_construction(provider: Any,
                                                              stream: bool) -> None:
    with pytest.raises(ConfigurationError, match=r"stream\(\)|complete\(\)"):
        Agent(provider, "x", stream=stream)
    with pytest.raises(ConfigurationError, match=r"stream\(\)|complete\(\)"):
        PlannerConfig(provider, "x", mode="stream" if stream else "complete")


class ListStream:
    id, version = "list", "1"

    def stream(self, request: ModelRequest) -> list[Any]:
        return [TextDelta(text="hi"), END]


class NoAclose:
    id, version = "no-aclose", "1"

    def stream(self, request: ModelRequest) -> Any:
        items = [TextDelta(text="hi"), END]

        class It:
            def __aiter__(self) -> It:
                return self

            async def __anext__(self) -> Any:
                if not items:
                    raise StopAsyncIteration
                return items.pop(0)
        return It()


async def test_a_stream_that_is_no_async_iterator_is_a_typed_error() -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(ListStream(), stream=True))
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError):
        await rt.run("k")
    error = (await rt.inspect("k")).nodes["a"].error
    assert error is not None and error.code == "provider_response_malformed"
    assert error.details["reason"] == "not_a_stream"


async def test_a_stream_without_aclose_is_read() -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(NoAclose(), stream=True))
    await rt.create("k", prog())
    result = await rt.run("k")
    assert result.output["a"]["text"] == "hi"



# --- the last turn's tool calls ------------------------------------------------------------

@pytest.mark.parametrize("max_turns", [1, 2])
async def test_tools_asked_for_on_the_last_turn_are_not_called(max_turns: int) -> None:
    # Their results could reach no model; a tool may be an effect a budget pays for.
    called: list[int] = []

    def add(args: dict[str, Any]) -> dict[str, Any]:
        called.append(1)
        return {"sum": 3}

    tool = ToolBinding(id="add", version="1", execute=add, recovery="pure",
                       input_schema=OBJ, output_schema=OBJ)
    asks = [ScriptedTurn(tool_calls=(ToolCall(id=f"c{i}", name="add", arguments={}),))
            for i in range(max_turns)]
    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool, AgentBinding(
        id="ag", version="1", agent=Agent(ScriptedProvider(asks), "You help.", tools=["add"],
                                          max_turns=max_turns))]))
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError, match=r"asked for tools \['add'\], which were not "
                                              "called") as caught:
        await rt.run("k")
    assert caught.value.node_id == "a"
    assert len(called) == max_turns - 1  # every turn's tools but the last one's
    view = await rt.inspect("k")
    assert view.nodes["a"].state == "failed"
    assert view.counters["tool_calls"] == max_turns - 1
