"""Agent review fixes: per-turn tool-call keys, pinned tool versions, the output-token
reservation, whole-response validation and a typed model-call timeout.

Each test failed on the code before the fix (except those marked as compatibility guards).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    DescriptorMismatchError,
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
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    assemble_stream,
    check_response,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult

OBJ: dict[str, Any] = {"type": "object"}
PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "ask", "binding": "ag", "version": "1", "args": {"prompt": "hi"}}]}
U1 = Usage(input_tokens=1, output_tokens=1)


def prog() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan=PLAN)


def turn_of(request: ModelRequest) -> int:
    return sum(m.role == "assistant" for m in request.model_messages)


class _Crash(BaseException):
    pass


# --- 1. tool-call ids reused across turns ----------------------------------------------

class PerResponseIds:
    """An adapter that numbers tool calls per response: ``call_0`` in every turn."""

    id, version = "per-response", "1"

    def __init__(self, tool: str = "add", args: tuple[dict[str, Any], ...] = (
            {"x": 1}, {"x": 100})) -> None:
        self.tool = tool
        self.args = args
        self.turns: list[int] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = turn_of(request)
        self.turns.append(turn)
        if turn < len(self.args):
            return ModelResponse(tool_calls=(ToolCall(id="call_0", name=self.tool,
                                                      arguments=self.args[turn]),),
                                 usage=U1, stop_reason="tool_calls")
        seen = [m.content for m in request.model_messages if m.role == "tool"]
        return ModelResponse(text=" | ".join(seen), usage=U1, stop_reason="end")

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        raise NotImplementedError
        yield  # pragma: no cover


def add_catalog(provider: Any, ran: list[dict[str, Any]]) -> HostCatalog:
    async def add(args: dict[str, Any]) -> dict[str, Any]:
        ran.append(args)
        return {"sum": args["x"] + 1}

    return HostCatalog([
        ToolBinding(id="add", version="1", execute=add, recovery="pure"),
        AgentBinding(id="ag", version="1", agent=Agent(provider, "go", tools=("add",),
                                                       max_output_tokens=10))])


async def test_a_tool_call_id_reused_in_a_later_turn_is_a_new_call_and_charged() -> None:
    ran: list[dict[str, Any]] = []
    rt = ExecutionGraphRuntime(catalog=add_catalog(PerResponseIds(), ran))
    await rt.create("k", prog(), budgets=Budgets(tool_calls=2))
    result = await rt.run("k")
    assert ran == [{"x": 1}, {"x": 100}]  # before: [{"x": 1}] (turn 0's result replayed)
    assert result.output["ask"]["text"] == '{"sum":2} | {"sum":101}'
    assert (await rt.admission_snapshot("k")).counters["tool_calls"] == 2
    results = [e.data for e in (await rt.timeline("k", limit=1000)).events
               if e.kind == "agent_tool_result"]
    # The first use of an id keeps it as its key (as tasks journaled earlier have it).
    assert [d["call_id"] for d in results] == ["call_0", "call_0#t1"]


async def test_a_tool_call_id_reused_in_a_later_turn_is_refused_by_the_budget() -> None:
    ran: list[dict[str, Any]] = []
    rt = ExecutionGraphRuntime(catalog=add_catalog(PerResponseIds(), ran))
    await rt.create("k", prog(), budgets=Budgets(tool_calls=1))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("k")
    assert info.value.counter == "tool_calls"
    assert ran == [{"x": 1}]


class CrashAfterToolResults(InMemoryDurableTaskStore):
    """Dies right after the ``n``-th agent tool result is journaled."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(s, AppendJournal) and s.kind == "agent_tool_result"
               for s in request.steps):
            self.left -= 1
            if self.left == 0:
                raise _Crash
        return result


async def test_recovery_replays_each_turns_result_of_a_reused_call_id() -> None:
    store = CrashAfterToolResults(2)
    ran: list[dict[str, Any]] = []
    first = PerResponseIds()
    rt = ExecutionGraphRuntime(catalog=add_catalog(first, ran), store=store)
    await rt.create("k", prog())
    with pytest.raises(_Crash):
        await rt.run("k", "w1")
    assert ran == [{"x": 1}, {"x": 100}] and first.turns == [0, 1]
    charged = (await rt.admission_snapshot("k")).counters
    second = PerResponseIds()
    again = ExecutionGraphRuntime(catalog=add_catalog(second, ran), store=store)
    result = await again.run("k", "w1")
    # Both journaled results replay at their own turns: no tool runs again, and only the
    # last (never recorded) model turn is asked.
    assert ran == [{"x": 1}, {"x": 100}] and second.turns == [2]
    assert result.output["ask"]["text"] == '{"sum":2} | {"sum":101}'
    after = (await again.admission_snapshot("k")).counters
    assert after["tool_calls"] == charged["tool_calls"] == 2
    assert after["model_calls"] == charged["model_calls"] + 1


class Ledger:
    """A payment destination behind an idempotent connector."""

    id, version, idempotent_destination = "ledger", "1", True

    def __init__(self) -> None:
        self.dispatched: list[ActionRequest] = []

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request)
        return ActionOutcome(output={"paid": request.args["amount"],
                                     "n": len(self.dispatched)},
                             result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome:
        raise AssertionError("no reconciliation expected")


def pay_catalog(provider: Any, conn: Ledger) -> HostCatalog:
    return HostCatalog([
        ToolBinding(id="pay", version="1", connector=conn, destination="ledger"),
        AgentBinding(id="ag", version="1", agent=Agent(provider, "go", tools=("pay",),
                                                       max_output_tokens=10))])


async def test_a_reused_call_id_of_a_connector_tool_is_a_distinct_action() -> None:
    conn = Ledger()
    provider = PerResponseIds("pay", ({"amount": 5}, {"amount": 5}))
    rt = ExecutionGraphRuntime(catalog=pay_catalog(provider, conn))
    await rt.create("k", prog())
    result = await rt.run("k")
    assert len(conn.dispatched) == 2  # before: 1 (the second call replayed the first)
    first, second = conn.dispatched
    assert first.action_id != second.action_id
    assert (first.caller["call"], second.caller["call"]) == ("call_0", "call_0#t1")
    assert result.output["ask"]["text"] == '{"n":1,"paid":5} | {"n":2,"paid":5}'
    view = await rt.inspect("k")
    assert sorted(a.state for a in view.actions) == ["confirmed", "confirmed"]


async def test_a_first_use_keeps_the_action_identity_of_earlier_versions() -> None:
    """Compatibility guard: an id's first use keys its records and action as before, so
    tasks journaled by the previous version still find them."""
    unique = PerResponseIds("pay", ({"amount": 5},))
    reused = PerResponseIds("pay", ({"amount": 5}, {"amount": 5}))
    ids = []
    for provider in (unique, reused):
        conn = Ledger()
        rt = ExecutionGraphRuntime(catalog=pay_catalog(provider, conn))
        await rt.create("same-key", prog())
        await rt.run("same-key")
        ids.append(conn.dispatched[0].action_id)
    assert ids[0] == ids[1]


def test_call_keys_are_unique_and_deterministic() -> None:
    from agentium_graph.runtime._agent import call_key

    used: set[str] = set()
    keys = [call_key(i, t, used) for t, i in [(0, "a"), (0, "a#t1"), (1, "a"), (1, "b"),
                                             (2, "a"), (2, "b")]]
    assert keys == ["a", "a#t1", "a#t1.2", "b", "a#t2", "b#t2"]
    assert len(set(keys)) == len(keys)


# --- 2. tool versions pinned at create ---------------------------------------------------

class HangsOnTurn:
    id, version = "hangs", "1"

    def __init__(self, hang: int | None) -> None:
        self.hang = hang
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = turn_of(request)
        self.requests.append(request)
        if turn == self.hang:
            await asyncio.sleep(3600)
        if turn == 0:
            return ModelResponse(tool_calls=(ToolCall(id="c0", name="inc",
                                                      arguments={"x": 1}),),
                                 usage=U1, stop_reason="tool_calls")
        return ModelResponse(text="done", usage=U1, stop_reason="end")

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        raise NotImplementedError
        yield  # pragma: no cover


V1_IN = {"type": "object", "properties": {"x": {"type": "integer"}}}
V2_IN = {"type": "object", "properties": {"x": {"type": "number"}}}


def inc_catalog(provider: Any, versions: tuple[str, ...], ran: list[str]) -> HostCatalog:
    def tool(version: str) -> ToolBinding:
        async def inc(args: dict[str, Any]) -> dict[str, Any]:
            ran.append(version)
            return {"v": args["x"] + 1}
        return ToolBinding(id="inc", version=version, execute=inc, recovery="pure",
                           input_schema=V1_IN if version == "1" else V2_IN)

    return HostCatalog([*(tool(v) for v in versions), AgentBinding(
        id="ag", version="1", agent=Agent(provider=provider, instructions="go",
                                          tools=("inc",), max_output_tokens=10))])


async def test_a_new_tool_version_in_the_catalog_keeps_a_recovering_agent_on_its_pin(
        ) -> None:
    store = InMemoryDurableTaskStore()
    ran: list[str] = []
    first = HangsOnTurn(hang=1)
    rt1 = ExecutionGraphRuntime(catalog=inc_catalog(first, ("1",), ran), store=store)
    await rt1.create("k", prog())
    task = asyncio.create_task(rt1.run("k", worker_id="w1"))
    while len(first.requests) < 2:  # noqa: ASYNC110 - turn 1 is hanging: "the crash"
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    before = (await rt1.admission_snapshot("k")).counters["model_calls"]
    assert before == 2 and ran == ["1"]

    second = HangsOnTurn(hang=None)
    rt2 = ExecutionGraphRuntime(catalog=inc_catalog(second, ("1", "2"), ran), store=store)
    result = await rt2.run("k", worker_id="w1")
    assert result.output["ask"]["text"] == "done"
    # Turn 0 replays (before: asked again and charged again); only turn 1 is asked, and
    # the agent is offered the pinned inc@1.
    assert [turn_of(r) for r in second.requests] == [1]
    assert second.requests[0].tools[0].input_schema == V1_IN
    assert (await rt2.admission_snapshot("k")).counters["model_calls"] == before + 1
    assert ran == ["1"]


async def test_a_new_task_uses_the_highest_tool_version_registered_at_create() -> None:
    """Guard: what a task pins for an agent's tool is the latest version at create."""
    ran: list[str] = []
    provider = HangsOnTurn(hang=None)
    rt = ExecutionGraphRuntime(catalog=inc_catalog(provider, ("1", "2"), ran))
    await rt.create("k", prog())
    await rt.run("k")
    assert provider.requests[0].tools[0].input_schema == V2_IN and ran == ["2"]


async def test_a_pinned_tool_version_missing_from_the_catalog_is_a_descriptor_mismatch(
        ) -> None:
    """Guard: the pinned version, not the latest, is what recovery needs."""
    store = InMemoryDurableTaskStore()
    ran: list[str] = []
    rt1 = ExecutionGraphRuntime(catalog=inc_catalog(HangsOnTurn(None), ("1",), ran),
                                store=store)
    await rt1.create("k", prog())
    rt2 = ExecutionGraphRuntime(catalog=inc_catalog(HangsOnTurn(None), ("2",), ran),
                                store=store)
    with pytest.raises(DescriptorMismatchError):
        await rt2.run("k")
    assert ran == []


# --- 3. the output-token budget with no max_output_tokens --------------------------------

class Verbose:
    id, version = "verbose", "1"
    calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        turn = turn_of(request)
        usage = Usage(input_tokens=1, output_tokens=500)
        if turn < 5:
            return ModelResponse(tool_calls=(ToolCall(id=f"c{turn}", name="noop",
                                                      arguments={}),),
                                 usage=usage, stop_reason="tool_calls")
        return ModelResponse(text="done", usage=usage, stop_reason="end")

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        raise NotImplementedError
        yield  # pragma: no cover


async def test_an_agent_without_max_output_tokens_stops_at_the_output_token_limit() -> None:
    async def noop(args: dict[str, Any]) -> dict[str, Any]:
        return {}

    provider = Verbose()
    cat = HostCatalog([ToolBinding(id="noop", version="1", execute=noop, recovery="pure"),
                       AgentBinding(id="ag", version="1",
                                    agent=Agent(provider, "go", tools=("noop",)))])
    rt = ExecutionGraphRuntime(catalog=cat)
    await rt.create("k", prog(), budgets=Budgets(output_tokens=100))
    with pytest.raises(BudgetExhaustedError) as info:
        await rt.run("k")
    # Before: 6 calls and a completed node (each reserved 0 tokens at the limit).
    assert info.value.counter == "output_tokens" and provider.calls == 1
    assert (await rt.admission_snapshot("k")).counters["output_tokens"] == 100


# --- 4. responses validated whole -------------------------------------------------------

def bad_responses() -> dict[str, Any]:
    call = ToolCall(id="c0", name="noop", arguments={})
    return {
        "negative_usage": ModelResponse.model_construct(
            text="", stop_reason="tool_calls", tool_calls=(call,),
            usage=Usage.model_construct(input_tokens=-7, output_tokens=1)),
        "float_usage": ModelResponse.model_construct(
            text="x", stop_reason="end", tool_calls=(),
            usage=Usage.model_construct(input_tokens=1.5, output_tokens=1)),
        "bool_usage": ModelResponse.model_construct(
            text="x", stop_reason="end", tool_calls=(),
            usage=Usage.model_construct(input_tokens=True, output_tokens=1)),
        "usage_none": ModelResponse.model_construct(text="x", stop_reason="end",
                                                    tool_calls=(), usage=None),
        "text_not_str": ModelResponse.model_construct(text=5, stop_reason="end",
                                                      tool_calls=(), usage=U1),
        "lone_surrogate_text": ModelResponse(text="a\ud800", stop_reason="end", usage=U1),
        "lone_surrogate_id": ModelResponse(stop_reason="tool_calls", usage=U1, tool_calls=(
            ToolCall(id="c\udc00", name="noop", arguments={}),)),
        "bad_stop_reason": ModelResponse.model_construct(text="x", stop_reason="later",
                                                         tool_calls=(), usage=U1),
        "none": None,
        "dict": {"text": "x", "usage": {"input_tokens": 1, "output_tokens": 1},
                 "stop_reason": "end"},
        "str": "done",
    }


class Returns:
    id, version = "returns", "1"

    def __init__(self, value: Any) -> None:
        self.value = value

    async def complete(self, request: ModelRequest) -> Any:
        return self.value

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        for event in self.value:
            yield event


def noop_catalog(provider: Any, *, stream: bool = False) -> HostCatalog:
    async def noop(args: dict[str, Any]) -> dict[str, Any]:
        return {}

    return HostCatalog([ToolBinding(id="noop", version="1", execute=noop, recovery="pure"),
                        AgentBinding(id="ag", version="1", agent=Agent(
                            provider, "go", tools=("noop",), max_output_tokens=10,
                            stream=stream))])


async def fails_malformed(provider: Any, *, stream: bool = False) -> NodeFailedError:
    rt = ExecutionGraphRuntime(catalog=noop_catalog(provider, stream=stream))
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError) as info:
        await rt.run("k")
    assert info.value.cause is not None
    assert info.value.cause.code == "provider_response_malformed", info.value.cause
    events = (await rt.timeline("k", limit=1000)).events
    assert not [e for e in events if e.kind == "model_response"]  # nothing journaled
    return info.value


@pytest.mark.parametrize("name", sorted(bad_responses()))
async def test_a_malformed_complete_response_is_a_typed_error_before_journaling(
        name: str) -> None:
    error = await fails_malformed(Returns(bad_responses()[name]))
    assert "malformed" in str(error)


@pytest.mark.parametrize("events", [
    [TextDelta(text="a"), StreamEnd.model_construct(usage=None, stop_reason="end")],
    [StreamEnd.model_construct(usage=Usage.model_construct(input_tokens=-1, output_tokens=0),
                               stop_reason="end")],
    [TextDelta.model_construct(text=7), StreamEnd(usage=U1, stop_reason="end")],
    [TextDelta(text="\udfff"), StreamEnd(usage=U1, stop_reason="end")],
    [ToolCallDelta(call=ToolCall(id="\ud800", name="noop", arguments={})),
     StreamEnd(usage=U1, stop_reason="tool_calls")],
], ids=["usage_none", "negative_usage", "text_not_str", "lone_surrogate_text",
        "lone_surrogate_id"])
async def test_a_malformed_stream_is_a_typed_error_before_journaling(
        events: list[Any]) -> None:
    await fails_malformed(Returns(events), stream=True)


def test_check_response_names_the_field() -> None:
    bad = bad_responses()
    with pytest.raises(MalformedResponseError) as info:
        check_response(bad["negative_usage"])
    assert info.value.details["field"] == "usage.input_tokens"
    with pytest.raises(MalformedResponseError) as info:
        check_response(bad["lone_surrogate_id"])
    assert info.value.details["field"] == "tool_calls[0].id"
    with pytest.raises(MalformedResponseError) as info:
        check_response(bad["none"])
    assert info.value.details["reason"] == "not_a_response"


def test_check_response_returns_a_valid_copy_of_a_constructed_response() -> None:
    built = ModelResponse.model_construct(text="x", stop_reason="tool_calls", usage=U1,
                                          tool_calls=[ToolCall(id="a", name="t",
                                                               arguments={})])
    checked = check_response(built)
    assert isinstance(checked.tool_calls, tuple)
    assert checked == ModelResponse(text="x", stop_reason="tool_calls", usage=U1,
                                    tool_calls=(ToolCall(id="a", name="t", arguments={}),))
    valid = ModelResponse(text="y", stop_reason="end", usage=U1)
    assert check_response(valid) is valid


async def test_assemble_stream_rejects_a_stream_end_without_usage() -> None:
    async def events() -> AsyncGenerator[Any, None]:
        yield TextDelta(text="a")
        yield StreamEnd.model_construct(usage=None, stop_reason="end")

    with pytest.raises(MalformedResponseError) as info:
        await assemble_stream(events())
    assert info.value.details["reason"] == "bad_usage"


# --- 5. a model call that times out -----------------------------------------------------

class Slow:
    id, version = "slow", "1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        await asyncio.sleep(3600)
        yield TextDelta(text="unreachable")


class OwnTimeout(Slow):
    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise TimeoutError("the transport gave up")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_model_call_timeout_names_the_limit_to_raise(stream: bool) -> None:
    rt = ExecutionGraphRuntime(catalog=noop_catalog(Slow(), stream=stream),
                               effect_timeout=0.05)
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError) as info:
        await rt.run("k")
    cause = info.value.cause
    assert cause is not None and cause.code == "provider_timeout"
    assert "effect_timeout" in cause.message and "0.05" in cause.message
    assert cause.details["limit"] == "ExecutionGraphRuntime(effect_timeout=...)"


async def test_a_providers_own_timeout_error_is_reported_as_it_is() -> None:
    """Guard: only the runtime's own limit is reported as ProviderTimeoutError."""
    rt = ExecutionGraphRuntime(catalog=noop_catalog(OwnTimeout()), effect_timeout=5)
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError) as info:
        await rt.run("k")
    # A provider failure (review 41: it was reported as a tool's, code tool_error), not the
    # runtime's limit.
    assert info.value.cause is not None and info.value.cause.code == "provider_error"
    assert "model provider raised TimeoutError: the transport gave up" in \
        info.value.cause.message
    assert "effect_timeout" not in info.value.cause.message


class Raises(Slow):
    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ConnectionError("upstream 503")


async def test_a_raising_provider_is_a_provider_error_naming_the_node() -> None:
    # (review 41) A provider's exception was reported as a tool's (code tool_error), with
    # no word on what to do.
    rt = ExecutionGraphRuntime(catalog=noop_catalog(Raises()))
    await rt.create("k", prog())
    with pytest.raises(NodeFailedError) as info:
        await rt.run("k")
    cause = info.value.cause
    assert cause is not None and cause.code == "provider_error"
    assert "model provider raised ConnectionError: upstream 503" in cause.message
    assert "retry transient errors" in cause.message
    assert cause.details["exception_type"] == "ConnectionError"
    assert (await rt.inspect("k")).verified
