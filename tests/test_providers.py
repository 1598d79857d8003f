"""The model provider protocol, stream assembly and the scripted fake provider."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import BaseModel, ValidationError

import agentium_graph.providers as providers
from agentium_graph._canonical import digest
from agentium_graph.errors import AgentiumGraphError
from agentium_graph.providers import (
    IncompleteStreamError,
    MalformedResponseError,
    ModelMessage,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    PartialStream,
    ProviderError,
    ProviderTimeoutError,
    ScriptedProvider,
    ScriptedTurn,
    ScriptExhaustedError,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    TurnMatch,
    Usage,
    assemble_stream,
    check_response,
    check_tool_calls,
    read_call_log,
)
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
USAGE = Usage(input_tokens=10, output_tokens=5)
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def request(text: str = "add 1 and 2", **kw: Any) -> ModelRequest:
    return ModelRequest(model_messages=(ModelMessage(role="system", content="be brief"),
                                        ModelMessage(role="user", content=text)), **kw)


def call(id: str = "c1", name: str = "add", **arguments: Any) -> ToolCall:
    return ToolCall(id=id, name=name, arguments=arguments or {"a": 1})


def unchecked(id: str = "c1", name: str = "add", arguments: Any = None) -> ToolCall:
    return ToolCall.model_construct(id=id, name=name, arguments=arguments)


async def events_of(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


# --- the public surface --------------------------------------------------------------------

def test_all_is_pinned_and_resolves() -> None:
    assert sorted(providers.__all__) == sorted({
        "CallRecord", "IncompleteStreamError", "MalformedResponseError", "ModelMessage",
        "ModelProvider", "ModelRequest", "ModelResponse", "PartialStream", "ProviderError",
        "ProviderTimeoutError", "check_stream_event",
        "Role", "ScriptExhaustedError", "ScriptedProvider", "ScriptedTurn", "StopReason",
        "StreamEnd", "StreamEvent", "TextDelta", "ToolCall", "ToolCallDelta", "ToolSpec",
        "TurnMatch", "Usage", "assemble_stream", "check_response", "check_tool_calls",
        "read_call_log"})
    for name in providers.__all__:
        assert hasattr(providers, name), name


def test_errors_have_the_common_root_and_unique_codes() -> None:
    import agentium_graph.errors as errors

    taken = {getattr(errors, n).code for n in errors.__all__
             if isinstance(getattr(errors, n), type)
             and issubclass(getattr(errors, n), AgentiumGraphError)}
    ours = [IncompleteStreamError, MalformedResponseError, ProviderError, ScriptExhaustedError,
            ProviderTimeoutError]
    codes = [e.code for e in ours]
    assert all(issubclass(e, ProviderError) and issubclass(e, AgentiumGraphError) for e in ours)
    assert len(set(codes)) == len(codes) and not taken & set(codes)


def test_scripted_provider_fits_the_protocol() -> None:
    provider: ModelProvider = ScriptedProvider([])  # checked by mypy --strict
    assert (provider.id, provider.version) == ("scripted", "1")


# --- models --------------------------------------------------------------------------------

MODELS: list[BaseModel] = [
    call(), ToolSpec(name="add", input_schema=ADD_SCHEMA), ModelMessage(role="user", content="x"),
    USAGE, request(), ModelResponse(text="x", usage=USAGE, stop_reason="end"),
    TextDelta(text="x"), ToolCallDelta(call=call()), StreamEnd(usage=USAGE, stop_reason="end"),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_models_are_frozen_and_reject_extra_fields(model: BaseModel) -> None:
    field = next(iter(type(model).model_fields))
    with pytest.raises(ValidationError):
        setattr(model, field, getattr(model, field))
    with pytest.raises(ValidationError, match="extra"):
        type(model)(**model.model_dump(), surprise=1)


def test_models_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        cast(Any, Usage)(1, 2)


@pytest.mark.parametrize("kw", [
    {"input_tokens": -1, "output_tokens": 0},
    {"input_tokens": True, "output_tokens": 0},
    {"input_tokens": "3", "output_tokens": 0},
    {"input_tokens": 1.5, "output_tokens": 0},
])
def test_usage_takes_non_negative_integers_only(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Usage(**kw)


@pytest.mark.parametrize("kw", [
    {"role": "user", "content": "x", "tool_calls": (call(),)},
    {"role": "tool", "content": "3"},
    {"role": "assistant", "content": "x", "tool_call_id": "c1"},
    {"role": "robot", "content": "x"},
])
def test_message_role_rules(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelMessage(**kw)


def test_response_becomes_the_assistant_message() -> None:
    response = ModelResponse(text="calling", tool_calls=(call(),), usage=USAGE,
                             stop_reason="tool_calls")
    assert response.to_message() == ModelMessage(role="assistant", content="calling",
                                                 tool_calls=(call(),))
    assert USAGE.total_tokens == 15


# --- request digests ------------------------------------------------------------------------

def test_request_digest_is_pinned() -> None:
    # Journals store these digests: a change here breaks replay of every recorded response.
    form = {"model_messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "add 1 and 2"}]}
    assert request().digest() == digest(form) == (
        "sha256:11fb7f02fa3bcf95038ca6a47953c238086eb6ccdc4e967b3c75f73360322943")


def _conversation(arguments: dict[str, Any], metadata: dict[str, Any]) -> ModelRequest:
    return ModelRequest(
        model_messages=(
            ModelMessage(role="user", content="add"),
            ModelMessage(role="assistant", content="", tool_calls=(
                ToolCall(id="c1", name="add", arguments=arguments),)),
            ModelMessage(role="tool", content="3", tool_call_id="c1")),
        tools=(ToolSpec(name="add", description="adds", input_schema=ADD_SCHEMA),),
        max_output_tokens=100, metadata=metadata)


def test_request_digest_ignores_dict_order_and_is_stable() -> None:
    one = _conversation({"a": 1, "b": {"x": [1, 2], "y": None}}, {"node": "n1", "k": 2})
    two = _conversation({"b": {"y": None, "x": [1, 2]}, "a": 1}, {"k": 2, "node": "n1"})
    assert one.digest() == two.digest() == one.digest()
    assert one.digest().startswith("sha256:") and len(one.digest()) == 71
    assert one.digest() == ModelRequest.model_validate_json(one.model_dump_json()).digest()


@pytest.mark.parametrize("change", [
    {"arguments": {"a": 2}}, {"arguments": {"a": 1.0}}, {"metadata": {"node": "n2"}},
])
def test_request_digest_changes_with_content(change: dict[str, Any]) -> None:
    base: dict[str, Any] = {"arguments": {"a": 1}, "metadata": {"node": "n1"}}
    assert _conversation(**base).digest() != _conversation(**{**base, **change}).digest()


def test_explicit_defaults_do_not_change_the_digest() -> None:
    explicit = ModelRequest(model_messages=request().model_messages, tools=(),
                            max_output_tokens=None, metadata={})
    assert explicit.digest() == request().digest()
    assert request(max_output_tokens=10).digest() != request().digest()


@pytest.mark.parametrize("metadata", [{"x": {1, 2}}, {"x": float("nan")}, {"x": object()}])
def test_request_must_be_json(metadata: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="plain JSON"):
        request(metadata=metadata)


def test_request_needs_a_message() -> None:
    with pytest.raises(ValidationError):
        ModelRequest(model_messages=())


# --- checking responses ----------------------------------------------------------------------

@pytest.mark.parametrize(("calls", "reason"), [
    ((unchecked(id=""),), "empty_tool_call_id"),
    ((unchecked(name=""),), "empty_tool_name"),
    ((unchecked(arguments="{}"),), "arguments_not_object"),
    ((unchecked(arguments=["a"]),), "arguments_not_object"),
    ((unchecked(arguments={"a": float("inf")}),), "arguments_not_json"),
    ((unchecked(arguments={1: "a"}),), "arguments_not_json"),
    ((call("c1"), call("c1", a=2)), "duplicate_tool_call_id"),
    (("add",), "not_a_tool_call"),
])
def test_malformed_tool_calls_are_typed(calls: tuple[Any, ...], reason: str) -> None:
    with pytest.raises(MalformedResponseError) as info:
        check_tool_calls(calls)
    assert info.value.details["reason"] == reason
    assert info.value.code == "provider_response_malformed"


def test_well_formed_responses_pass() -> None:
    response = ModelResponse(text="t", tool_calls=(call("c1"), call("c2")), usage=USAGE,
                             stop_reason="tool_calls")
    assert check_response(response) is response


def test_tool_calls_stop_reason_needs_calls() -> None:
    with pytest.raises(MalformedResponseError) as info:
        check_response(ModelResponse(usage=USAGE, stop_reason="tool_calls"))
    assert info.value.details["reason"] == "tool_calls_missing"


# --- assembling streams ----------------------------------------------------------------------

async def test_assemble_stream_accumulates_a_complete_stream() -> None:
    response = await assemble_stream(events_of(
        TextDelta(text="Hel"), TextDelta(text="lo"), ToolCallDelta(call=call("c1")),
        ToolCallDelta(call=call("c2", a=5)), StreamEnd(usage=USAGE, stop_reason="tool_calls")))
    assert response == ModelResponse(text="Hello", tool_calls=(call("c1"), call("c2", a=5)),
                                     usage=USAGE, stop_reason="tool_calls")


async def test_stream_without_end_is_incomplete() -> None:
    with pytest.raises(IncompleteStreamError) as info:
        await assemble_stream(events_of(TextDelta(text="Hel"), ToolCallDelta(call=call())))
    assert info.value.code == "provider_stream_incomplete"
    assert info.value.details == {"events": 2, "text_chars": 3, "tool_calls": 1}
    with pytest.raises(IncompleteStreamError):
        await assemble_stream(events_of())


@pytest.mark.parametrize(("items", "reason"), [
    ((ToolCallDelta(call=call("c1")), ToolCallDelta(call=call("c1"))),
     "duplicate_tool_call_id"),
    ((ToolCallDelta(call=unchecked(arguments="x")),), "arguments_not_object"),
    ((ToolCallDelta(call=unchecked(name="")),), "empty_tool_name"),
    (("raw text",), "not_a_stream_event"),
    ((StreamEnd(usage=USAGE, stop_reason="tool_calls"),), "tool_calls_missing"),
])
async def test_malformed_streams_are_typed_and_closed(items: tuple[Any, ...],
                                                      reason: str) -> None:
    closed = False

    async def stream() -> AsyncGenerator[Any, None]:
        nonlocal closed
        try:
            for item in items:
                yield item
            yield StreamEnd(usage=USAGE, stop_reason="end")
            yield TextDelta(text="never read")
        finally:
            closed = True

    with pytest.raises(MalformedResponseError) as info:
        await assemble_stream(stream())
    assert info.value.details["reason"] == reason
    assert closed


async def test_assemble_stops_reading_at_stream_end_and_closes() -> None:
    read: list[str] = []

    async def stream() -> AsyncGenerator[StreamEvent, None]:
        yield StreamEnd(usage=USAGE, stop_reason="end")
        read.append("after end")
        yield TextDelta(text="trailing")

    assert (await assemble_stream(stream())).text == ""
    assert read == []


async def test_errors_from_the_stream_propagate() -> None:
    async def stream() -> AsyncGenerator[StreamEvent, None]:
        yield TextDelta(text="x")
        raise ConnectionResetError("dropped")

    with pytest.raises(ConnectionResetError):
        await assemble_stream(stream())


# --- the scripted provider: answers ----------------------------------------------------------

async def test_turns_are_served_in_order_by_complete() -> None:
    recorded = ModelResponse(text="recorded", usage=USAGE, stop_reason="max_tokens")
    provider = ScriptedProvider([
        "first",
        ScriptedTurn(tool_calls=(call("c1"),), usage=Usage(input_tokens=3, output_tokens=4)),
        recorded,
        {"text": "from data", "stop_reason": "end"},
    ])
    first = await provider.complete(request())
    assert (first.text, first.tool_calls, first.stop_reason) == ("first", (), "end")
    assert first.usage == Usage(input_tokens=5, output_tokens=2)  # the documented estimate
    second = await provider.complete(request())
    assert second == ModelResponse(tool_calls=(call("c1"),), stop_reason="tool_calls",
                                   usage=Usage(input_tokens=3, output_tokens=4))
    assert await provider.complete(request()) == recorded
    assert (await provider.complete(request())).text == "from data"
    assert provider.remaining == 0


async def test_stream_yields_text_chunks_then_tool_calls_then_end() -> None:
    turn = ScriptedTurn(text="Hello, world!", tool_calls=(call("c1"), call("c2")), usage=USAGE)
    provider = ScriptedProvider([turn], chunks=3)
    events = [e async for e in provider.stream(request())]
    assert events == [TextDelta(text="Hello"), TextDelta(text=", wor"), TextDelta(text="ld!"),
                      ToolCallDelta(call=call("c1")), ToolCallDelta(call=call("c2")),
                      StreamEnd(usage=USAGE, stop_reason="tool_calls")]
    same = await assemble_stream(ScriptedProvider([turn]).stream(request()))
    assert same == turn.response_for(request())
    assert provider.open_streams == 0


async def test_exhausted_script_raises_and_logs_the_call() -> None:
    provider = ScriptedProvider(["only"])
    await provider.complete(request())
    with pytest.raises(ScriptExhaustedError, match="no unused turn for call #2") as info:
        await provider.complete(request("again"))
    assert info.value.details["request_digest"] == request("again").digest()
    with pytest.raises(ScriptExhaustedError):
        await assemble_stream(provider.stream(request()))
    assert provider.call_count == 3
    assert [(r.method, r.turn) for r in provider.call_log] == [
        ("complete", 0), ("complete", None), ("stream", None)]


async def test_call_log_records_every_request() -> None:
    provider = ScriptedProvider(["a", "b"])
    assert provider.call_count == 0
    await provider.complete(request("one"))
    await assemble_stream(provider.stream(request("two")))
    assert provider.calls == [request("one"), request("two")]
    assert [r.request_digest for r in provider.call_log] == [request("one").digest(),
                                                             request("two").digest()]
    assert {r.pid for r in provider.call_log} == {os.getpid()}


async def test_stream_is_lazy_until_iterated() -> None:
    provider = ScriptedProvider(["a"])
    stream = provider.stream(request())
    assert provider.call_count == 0
    await stream.aclose()
    assert provider.call_count == 0 and provider.remaining == 1


async def test_turns_can_match_requests() -> None:
    provider = ScriptedProvider([
        {"text": "for n2", "match": {"metadata": {"node": "n2"}}},
        {"text": "second turn", "match": {"assistant_turns": 1}},
        {"text": "about cats", "match": {"contains": "cats"}},
        ScriptedTurn(text="long", when=lambda r: len(r.model_messages) > 5),
        "anything",
    ])
    later = ModelRequest(model_messages=(
        *request().model_messages, ModelMessage(role="assistant", content="hm")))
    assert (await provider.complete(request("dogs"))).text == "anything"
    assert (await provider.complete(later)).text == "second turn"
    assert (await provider.complete(request("cats"))).text == "about cats"
    assert (await provider.complete(request(metadata={"node": "n2", "x": 1}))).text == "for n2"
    with pytest.raises(ScriptExhaustedError):
        await provider.complete(request())
    assert [r.turn for r in provider.call_log] == [4, 1, 2, 0, None]
    assert TurnMatch(contains="x").accepts(request()) is False


def test_malformed_calls_can_be_scripted() -> None:
    turn = ScriptedTurn(tool_calls=(call("c1"),), raw_tool_calls=(
        {"id": "c1", "name": "add", "arguments": {"a": 1}},
        {"id": "c2", "name": "", "arguments": "not json"}))
    response = turn.response_for(request())
    assert [c.arguments for c in response.tool_calls] == [{"a": 1}, {"a": 1}, "not json"]
    with pytest.raises(MalformedResponseError, match="used twice"):
        check_response(response)


# --- the scripted provider: injected behavior ------------------------------------------------

async def test_delay_is_cancellable() -> None:
    provider = ScriptedProvider([ScriptedTurn(text="late", delay=3600)] * 2)
    task = asyncio.create_task(provider.complete(request()))
    await wait_until(lambda: provider.call_count == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stream = provider.stream(request())
    nxt = asyncio.create_task(anext(stream))
    await wait_until(lambda: provider.open_streams == 1)
    nxt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await nxt
    assert provider.open_streams == 0 and provider.remaining == 0


async def test_delays_use_the_injected_sleep() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    provider = ScriptedProvider([ScriptedTurn(text="abcdef", delay=2.5, chunk_delay=0.5),
                                 ScriptedTurn(delay=1)], chunks=3, sleep=sleep)
    events = [e async for e in provider.stream(request())]
    assert events[0] == TextDelta(text="ab")
    assert slept == [2.5, 0.5, 0.5, 0.5]  # before the first event, then between events
    await provider.complete(request())
    assert slept[-1] == 1


async def test_fail_is_raised_by_complete_and_stream() -> None:
    provider = ScriptedProvider([ScriptedTurn(fail=ConnectionError("down"))] * 2)
    with pytest.raises(ConnectionError, match="down"):
        await provider.complete(request())
    with pytest.raises(ConnectionError, match="down"):
        await assemble_stream(provider.stream(request()))
    assert provider.open_streams == 0


async def test_partial_stream_then_raise() -> None:
    turn = ScriptedTurn(text="Hello, world!", partial_stream_then_fail=PartialStream(events=2))
    provider = ScriptedProvider([turn, turn.model_copy(update={"fail": TimeoutError("t")}),
                                 turn])
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError, match="after 2 stream event"):
        async for event in provider.stream(request()):
            seen.append(event)
    assert seen == [TextDelta(text="Hello"), TextDelta(text=", wor")]
    with pytest.raises(TimeoutError):
        await assemble_stream(provider.stream(request()))
    with pytest.raises(ProviderError):
        await provider.complete(request())


async def test_partial_stream_that_ends_mid_frame_is_incomplete() -> None:
    cut = PartialStream(events=99, ending="eof")  # more than there are: StreamEnd never comes
    provider = ScriptedProvider([ScriptedTurn(text="abc", partial_stream_then_fail=cut)] * 2)
    events = [e async for e in provider.stream(request())]
    assert events == [TextDelta(text="a"), TextDelta(text="b"), TextDelta(text="c")]
    with pytest.raises(IncompleteStreamError):
        await provider.complete(request())


async def test_hanging_stream_can_be_closed_midway() -> None:
    cut = PartialStream(events=1, ending="hang")
    provider = ScriptedProvider([ScriptedTurn(text="abcdef", partial_stream_then_fail=cut),
                                 "next"])
    stream = provider.stream(request())
    assert await anext(stream) == TextDelta(text="ab")
    waiting = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)
    assert not waiting.done() and provider.open_streams == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    assert provider.open_streams == 0
    assert (await provider.complete(request())).text == "next"


async def test_aclose_midway_releases_the_stream() -> None:
    provider = ScriptedProvider([ScriptedTurn(text="abcdef", tool_calls=(call(),)), "next"])
    stream = provider.stream(request())
    assert await anext(stream) == TextDelta(text="ab")
    assert provider.open_streams == 1
    await stream.aclose()
    assert provider.open_streams == 0
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert (await assemble_stream(provider.stream(request()))).text == "next"
    assert provider.call_count == 2


@pytest.mark.parametrize("kw", [
    {"fail": ValueError("x"), "partial_stream_then_fail": {"ending": "eof"}},
    {"fail": {"type": "builtins:len"}},
    {"fail": {"type": "nocolon"}},
    {"delay": -1},
    {"delay": float("inf")},
])
def test_bad_turns_are_rejected(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ScriptedTurn(**kw)


# --- plain data and other processes ----------------------------------------------------------

SCRIPT: list[Any] = [
    ScriptedTurn(text="Let me add.", tool_calls=(call("c1", a=1),),
                 match=TurnMatch(assistant_turns=0)),
    ScriptedTurn(text="The sum is 3.", usage=USAGE, match=TurnMatch(assistant_turns=1)),
    ScriptedTurn(fail=ProviderError("quota"), delay=0.25),
    ScriptedTurn(text="abc", partial_stream_then_fail=PartialStream(events=1, ending="eof")),
]


def test_script_round_trips_through_json() -> None:
    provider = ScriptedProvider(SCRIPT, chunks=2, call_log_path="/tmp/log.jsonl")
    data = json.loads(json.dumps(provider.to_data()))
    again = ScriptedProvider.from_data(data)
    assert again.turns[:2] == provider.turns[:2] and again.turns[3] == provider.turns[3]
    fail = again.turns[2].fail
    assert isinstance(fail, ProviderError) and str(fail) == "quota"
    assert again.to_data() == data
    with pytest.raises(ValueError, match="predicate"):
        ScriptedProvider([ScriptedTurn(when=lambda r: True)]).to_data()


CHILD = """
import asyncio, json, sys
from agentium_graph.providers import *
provider = ScriptedProvider.from_data(json.loads(sys.argv[1]))
req = ModelRequest.model_validate_json(sys.argv[2])
async def main():
    first = await provider.complete(req)
    follow = ModelRequest(model_messages=(*req.model_messages, first.to_message(),
                                          ModelMessage(role="tool", content="3",
                                                       tool_call_id="c1")))
    second = await assemble_stream(provider.stream(follow))
    print(json.dumps([first.model_dump(mode="json"), second.model_dump(mode="json")]))
asyncio.run(main())
"""


async def test_a_child_process_rebuilds_the_same_provider(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    provider = ScriptedProvider(SCRIPT, call_log_path=log)
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CHILD, json.dumps(provider.to_data()),
                         request().model_dump_json()],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    child = [ModelResponse.model_validate(r) for r in json.loads(proc.stdout)]

    first = await provider.complete(request())
    follow = ModelRequest(model_messages=(
        *request().model_messages, first.to_message(),
        ModelMessage(role="tool", content="3", tool_call_id="c1")))
    assert child == [first, await provider.complete(follow)]

    records = read_call_log(log)
    assert [(r.method, r.turn) for r in records] == [
        ("complete", 0), ("stream", 1), ("complete", 0), ("complete", 1)]
    assert records[0].pid != os.getpid() == records[2].pid
    assert records[1].request_digest == follow.digest()
    assert read_call_log(tmp_path / "missing.jsonl") == []
