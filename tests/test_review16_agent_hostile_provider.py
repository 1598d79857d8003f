"""Review 16: an agent node against a hostile or buggy model provider.

Bugs fixed here (each test failed before its fix):

* token usage beyond what every store keeps (int64) was accepted, so counters and the
  journaled usage could hold numbers a store (MongoDB: int64) refuses to write;
* a stream that is no async iterator (no ``__aiter__``, or an ``__anext__`` that returns
  no awaitable) failed the node with a bare ``TypeError`` (code ``tool_error``) instead
  of ``MalformedResponseError`` (reason ``not_a_stream``).

The rest guard what already held: budgets hit mid-conversation are never exceeded nor
refunded, and a crash + replay does not charge recorded calls again.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    ToolBinding,
)
from agentium_graph.providers import (
    MalformedResponseError,
    ModelRequest,
    ModelResponse,
    ScriptedProvider,
    ScriptedTurn,
    StreamEnd,
    ToolCall,
    Usage,
    assemble_stream,
    check_response,
    check_stream_event,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult

INT64 = 2**63 - 1
OBJ: dict[str, Any] = {"type": "object"}
PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "ag", "version": "1", "args": {"prompt": "go"}}]}
ADD = ToolBinding(id="add", version="1", execute=lambda args: {"sum": 3}, recovery="pure",
                  input_schema=OBJ, output_schema=OBJ)
U1 = Usage(input_tokens=1, output_tokens=1)


def prog() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan=PLAN)


def catalog(provider: Any, *, stream: bool = False, **agent: Any) -> HostCatalog:
    return HostCatalog([ADD, AgentBinding(id="ag", version="1", agent=Agent(
        provider, "You help.", tools=["add"], stream=stream, **agent))])


def call(n: int) -> ScriptedTurn:
    return ScriptedTurn(tool_calls=(ToolCall(id=f"c{n}", name="add", arguments={}),),
                        usage=U1)


async def failed_node(rt: ExecutionGraphRuntime) -> Any:
    with pytest.raises(NodeFailedError):
        await rt.run("k")
    view = await rt.inspect("k")
    error = view.nodes["a"].error
    assert view.status == "failed" and error is not None
    return error


# --- 1. usage beyond int64 -------------------------------------------------------------------

@pytest.mark.parametrize("field", ["input_tokens", "output_tokens"])
def test_usage_beyond_int64_is_malformed(field: str) -> None:
    usage = Usage(**{"input_tokens": 1, "output_tokens": 1, field: INT64 + 1})
    with pytest.raises(MalformedResponseError) as info:
        check_response(ModelResponse(text="x", usage=usage, stop_reason="end"))
    assert info.value.details["reason"] == "bad_usage"
    assert info.value.details["field"] == f"usage.{field}"
    with pytest.raises(MalformedResponseError):
        check_stream_event(StreamEnd(usage=usage, stop_reason="end"))
    ok = Usage(input_tokens=INT64, output_tokens=INT64)
    check_response(ModelResponse(text="x", usage=ok, stop_reason="end"))


async def test_an_agent_given_usage_beyond_int64_fails_typed_with_nothing_journaled() -> None:
    huge = ScriptedTurn(text="x", usage=Usage(input_tokens=10**30, output_tokens=10**30))
    store = InMemoryDurableTaskStore()
    rt = ExecutionGraphRuntime(catalog=catalog(ScriptedProvider([huge])), store=store)
    await rt.create("k", prog())
    error = await failed_node(rt)
    assert error.code == "provider_response_malformed"
    assert error.details["reason"] == "bad_usage"
    view = await rt.inspect("k")
    assert all(v <= INT64 for v in view.counters.values())
    assert view.counters["model_calls"] == 1


async def test_unlimited_token_counters_never_pass_int64() -> None:
    big = Usage(input_tokens=2**62 + 1, output_tokens=2**62 + 1)
    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c", name="add", arguments={}),), usage=big),
        ScriptedTurn(text="done", usage=big)])
    rt = ExecutionGraphRuntime(catalog=catalog(provider))
    await rt.create("k", prog())
    await rt.run("k")
    view = await rt.inspect("k")
    assert view.status == "completed"
    assert view.counters["input_tokens"] == INT64
    assert view.counters["output_tokens"] == INT64


# --- 2. a stream that is no async iterator ---------------------------------------------------

class _NoAiter:
    async def __anext__(self) -> Any:
        return StreamEnd(usage=U1, stop_reason="end")


class _SyncAnext:
    def __aiter__(self) -> _SyncAnext:
        return self

    def __anext__(self) -> Any:
        return StreamEnd(usage=U1, stop_reason="end")


class OddStream:
    id, version = "odd", "1"

    def __init__(self, make: Any) -> None:
        self.make = make

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("streams only")

    def stream(self, request: ModelRequest) -> Any:
        return self.make()


@pytest.mark.parametrize("make", [_NoAiter, _SyncAnext])
async def test_a_stream_that_is_no_async_iterator_is_malformed(make: Any) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(OddStream(make), stream=True))
    await rt.create("k", prog())
    error = await failed_node(rt)
    assert error.code == "provider_response_malformed"
    assert error.details["reason"] == "not_a_stream"


async def test_assemble_stream_refuses_an_anext_without_awaitable() -> None:
    with pytest.raises(MalformedResponseError) as info:
        await assemble_stream(_SyncAnext())
    assert info.value.details["reason"] == "not_a_stream"


# --- 3. guards: budgets mid-conversation, crash + replay ---------------------------------------

async def test_model_calls_budget_hit_mid_conversation_is_never_exceeded() -> None:
    provider = ScriptedProvider([call(1), call(2), call(3), "done"])
    rt = ExecutionGraphRuntime(catalog=catalog(provider, max_turns=8))
    await rt.create("k", prog(), budgets=Budgets(model_calls=2))
    for _ in range(2):  # a second run charges nothing more
        with pytest.raises(BudgetExhaustedError):
            await rt.run("k")
    view = await rt.inspect("k")
    assert view.counters["model_calls"] == 2 and provider.call_count == 2
    assert view.status == "pending"


async def test_output_tokens_over_the_reservation_are_clamped_not_refunded() -> None:
    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c", name="add", arguments={}),),
                     usage=Usage(input_tokens=1, output_tokens=500)), "done"])
    rt = ExecutionGraphRuntime(catalog=catalog(provider, max_output_tokens=10))
    await rt.create("k", prog(), budgets=Budgets(output_tokens=100))
    with pytest.raises(BudgetExhaustedError):
        await rt.run("k")
    view = await rt.inspect("k")
    assert view.counters["output_tokens"] == 100 and provider.call_count == 1


class _Crash(BaseException):
    pass


class CrashAfterSecondResponse(InMemoryDurableTaskStore):
    armed = True
    seen = 0

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if self.armed and any(isinstance(s, AppendJournal) and s.kind == "model_response"
                              for s in request.steps):
            self.seen += 1
            if self.seen == 2:
                self.armed = False
                raise _Crash
        return result


@pytest.mark.parametrize("stream", [False, True])
async def test_a_crash_and_replay_does_not_charge_recorded_calls_again(stream: bool) -> None:
    script = [call(1), call(2), ScriptedTurn(text="done", usage=U1)]
    store = CrashAfterSecondResponse()
    first = ScriptedProvider(script)
    rt = ExecutionGraphRuntime(catalog=catalog(first, stream=stream), store=store)
    await rt.create("k", prog())
    with pytest.raises(_Crash):
        await rt.run("k", "w1")
    before = dict((await rt.inspect("k")).counters)
    assert before["model_calls"] == 2 and first.call_count == 2
    second = ScriptedProvider(script[2:])
    again = ExecutionGraphRuntime(catalog=catalog(second, stream=stream), store=store)
    await again.run("k", "w1")
    view = await again.inspect("k")
    assert view.status == "completed" and second.call_count == 1
    assert view.counters["model_calls"] == before["model_calls"] + 1
    assert view.counters["tool_calls"] == 2
