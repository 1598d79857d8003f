"""Agent nodes: tool-calling loop, journaled responses replayed without provider calls."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    NodeFailedError,
    RepeatBinding,
    RootLimits,
    ToolBinding,
)
from agentium_graph.providers import (
    PartialStream,
    ScriptedProvider,
    ScriptedTurn,
    ToolCall,
    TurnMatch,
    Usage,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult
from tests.conftest import Calls, CountingStore, program

NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}


def script() -> list[ScriptedTurn]:
    return [
        ScriptedTurn(tool_calls=(ToolCall(id="call-1", name="inc", arguments={"x": 41}),),
                     usage=Usage(input_tokens=30, output_tokens=8),
                     match=TurnMatch(assistant_turns=0)),
        ScriptedTurn(text="The answer is 42.", usage=Usage(input_tokens=50, output_tokens=6),
                     match=TurnMatch(assistant_turns=1)),
    ]


def catalog(calls: Calls, provider: ScriptedProvider, *, stream: bool = False,
            tools: tuple[str, ...] = ("inc",)) -> HostCatalog:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": args["x"] + 1}

    return HostCatalog([
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                    input_schema={"type": "object", "required": ["x"],
                                  "properties": {"x": {"type": "integer"}}},
                    output_schema=NUM),
        AgentBinding(id="solver", version="1",
                     agent=Agent(provider=provider, instructions="Use tools to answer.",
                                 tools=tools, max_output_tokens=64, stream=stream),
                     input_schema={"type": "object", "required": ["prompt"]}),
    ])


PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "ask", "binding": "solver", "version": "1",
     "args": {"prompt": "What is 41 + 1?"}}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_agent_calls_a_tool_then_answers(calls: Calls, stream: bool) -> None:
    provider = ScriptedProvider(script())
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider, stream=stream))
    await rt.create("a", program(PLAN))
    result = await rt.run("a")
    assert result.output["ask"] == {"text": "The answer is 42.", "usage": {
        "input_tokens": 80, "output_tokens": 14, "model_calls": 2}}
    assert provider.call_count == 2 and calls.by_node == {"ask": 1}
    view = await rt.inspect("a")
    assert view.counters["model_calls"] == 2 and view.counters["tool_calls"] == 1
    assert view.counters["work_attempts"] == 3
    # Reservation (64 output tokens per call) is charged before dispatch, never refunded.
    assert view.counters["output_tokens"] == 128
    tool_msg = provider.calls[1].model_messages[-1]
    assert tool_msg.role == "tool" and tool_msg.tool_call_id == "call-1"
    assert tool_msg.content == '{"value":42}'


class CrashAfterFirstResponse(CountingStore):
    """Dies right after the first model response is journaled, before its tool runs."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if self.armed and any(isinstance(s, AppendJournal) and s.kind == "model_response"
                              for s in request.steps):
            self.armed = False
            raise _Crash
        return result


class _Crash(BaseException):
    pass


async def test_recovery_replays_recorded_responses_without_provider_calls(
        calls: Calls) -> None:
    store = CrashAfterFirstResponse()
    first = ScriptedProvider(script())
    rt = ExecutionGraphRuntime(catalog=catalog(calls, first), store=store)
    await rt.create("r", program(PLAN))
    with pytest.raises(_Crash):
        await rt.run("r", "w1")
    assert first.call_count == 1 and calls.by_node == {}
    before = await store.get_task("r")
    assert before is not None
    charged = before.header.counters["model_calls"]
    second = ScriptedProvider(script())
    fresh = ExecutionGraphRuntime(catalog=catalog(calls, second), store=store)
    result = await fresh.run("r", "w1")
    assert result.output["ask"]["text"] == "The answer is 42."
    # The first response replays from the journal; only the second call reaches the model.
    assert second.call_count == 1
    assert second.calls[0].model_messages[-1].tool_call_id == "call-1"
    view = await fresh.inspect("r")
    assert view.counters["model_calls"] == charged + 1


async def test_model_call_budget_is_enforced_before_dispatch(calls: Calls) -> None:
    provider = ScriptedProvider(script())
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider), on_admission=events.append)
    await rt.create("b", program(PLAN), budgets=Budgets(model_calls=1))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("b")
    assert info.value.counter == "model_calls" and info.value.node_id == "ask"
    view = await rt.inspect("b")
    assert view.counters["model_calls"] == 1 and provider.call_count == 1
    (exhausted,) = [e for e in events if e.kind == "exhausted"]
    assert exhausted.node_id == "ask" and exhausted.counter == "model_calls"


async def test_unknown_tool_from_the_model_fails_the_node_by_name(calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(
        tool_calls=(ToolCall(id="c", name="rm_rf", arguments={}),))])
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider))
    await rt.create("u", program(PLAN))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("u")
    assert info.value.node_id == "ask" and "rm_rf" in str(info.value)
    assert (await rt.inspect("u")).nodes["ask"].error is not None


async def test_invalid_tool_arguments_fail_typed(calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(
        tool_calls=(ToolCall(id="c", name="inc", arguments={"x": "forty"}),))])
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider))
    await rt.create("v", program(PLAN))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("v")
    assert "call c" in str(info.value) and info.value.node_id == "ask"
    assert calls.by_node == {}


async def test_stream_that_ends_mid_frame_is_asked_again_then_fails(calls: Calls) -> None:
    broken = ScriptedTurn(text="partial answer", partial_stream_then_fail=PartialStream(
        events=1, ending="eof"))
    provider = ScriptedProvider([broken, broken])
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider, stream=True))
    await rt.create("s", program(PLAN))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("s")
    assert provider.call_count == 2 and provider.open_streams == 0
    assert info.value.cause is not None
    view = await rt.inspect("s")
    assert view.counters["model_calls"] == 2  # interrupted reservations stay charged


async def test_capacity_one_completes_graph_repeat_agent_tool_nesting(calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(
        tool_calls=(ToolCall(id="k", name="inc", arguments={"x": 1}),),
        match=TurnMatch(assistant_turns=0)),
        ScriptedTurn(text="done", match=TurnMatch(assistant_turns=1))] * 2)
    base = catalog(calls, provider)
    inner = ExecutionGraphProgram(id="inner", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "ask", "binding": "solver", "version": "1", "args": {"prompt": "go"}}]})
    loop_prog = ExecutionGraphProgram(id="loop", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "g", "binding": "wrap", "version": "1"}]})
    cat = HostCatalog([*base,
                       GraphBinding(id="wrap", version="1", program=inner),
                       RepeatBinding(id="loop", version="1", program=loop_prog,
                                     max_iterations=2, condition=lambda s: True)])
    rt = ExecutionGraphRuntime(catalog=cat, limits=RootLimits(max_concurrent_work=1))
    await rt.create("nest", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "outer", "binding": "loop", "version": "1"}]}))
    result = await rt.run("nest")
    assert result.output["outer"]["iterations"] == 2
    assert result.output["outer"]["last"]["g"]["ask"]["text"] == "done"
    assert provider.call_count == 4 and calls.by_node == {"outer/0/g/ask": 1,
                                                          "outer/1/g/ask": 1}


async def test_malformed_tool_calls_fail_the_node_typed(calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(raw_tool_calls=(
        {"id": "c", "name": "inc", "arguments": "not-an-object"},))])
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider))
    await rt.create("m", program(PLAN))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("m")
    assert info.value.node_id == "ask"
    assert info.value.cause is not None
    assert info.value.cause.code == "provider_response_malformed"
    assert calls.by_node == {}


async def test_tools_outside_the_task_grants_are_refused(calls: Calls) -> None:
    provider = ScriptedProvider(script())
    rt = ExecutionGraphRuntime(catalog=catalog(calls, provider))
    from agentium_graph import PlanValidationError

    with pytest.raises(PlanValidationError) as info:
        await rt.create("g", program(PLAN), grants=["solver"])  # the agent's tool is missing
    assert [d.code for d in info.value.diagnostics] == ["binding_not_granted"]
    # Named at the agent node that reaches it (review 26: it was reported at '$').
    [diag] = info.value.diagnostics
    agent_node = next(i for i, n in enumerate(PLAN["nodes"]) if n["binding"] == "solver")
    assert diag.path == f"$.nodes[{agent_node}].binding"
    assert diag.node_id == PLAN["nodes"][agent_node]["id"]
