"""The model provider contract, and the checks a consumer applies to what a provider returns."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from agentium_graph._canonical import INT64_MAX, NotJSONError, check_json
from agentium_graph.providers._errors import IncompleteStreamError, MalformedResponseError
from agentium_graph.providers._models import (
    ModelRequest,
    ModelResponse,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = ["ModelProvider", "assemble_stream", "call_complete", "check_response",
           "check_stream_event", "check_tool_calls", "close_stream", "open_stream",
           "shape_problem"]

# The most tokens one usage field may report: what every store keeps as a number (int64,
# like every counter limit). More is no real call's usage, and neither its journal entry
# nor the counters it is charged to could be stored.
MAX_TOKENS = INT64_MAX


@runtime_checkable
class ModelProvider(Protocol):
    """A language model behind two calls: :meth:`complete` and :meth:`stream`.

    Providers prove they fit with a typed assignment under ``mypy --strict``
    (``provider: ModelProvider = MyProvider()``); ``isinstance`` also works (members only).

    Contract:

    * ``id`` and ``version`` name the provider and its behavior; bump ``version`` when what it
      would answer for the same request changes (model, prompt template, parameters).
    * One call of ``complete`` or one iteration of ``stream`` is one provider invocation:
      transport retries inside it are the provider's own business and stay invisible.
    * Usage must be reported: ``ModelResponse.usage`` and ``StreamEnd.usage`` carry the tokens
      the call consumed, as billed (non-negative integers).
    * Text, tool names and ids are strings that encode as UTF-8 (no lone surrogates).
      Responses and events are real, valid instances: one built with ``model_construct``
      that breaks a field's rule is malformed.
    * Tool calls carry a non-empty ``id`` (unique within the response), a non-empty ``name``
      and a JSON object of ``arguments``. A consumer checks this with :func:`check_response`.
    * A stream is complete only when :class:`StreamEnd` arrives, and ``StreamEnd`` is its last
      event. A stream that stops before it (EOF, dropped connection) is incomplete: none of
      it is a response (see :func:`assemble_stream`).
    * Providers honor cancellation: canceling the awaiting task, or closing a stream early
      with ``aclose()``, stops the work promptly and releases its connection. Never swallow
      :class:`asyncio.CancelledError`.
    * Errors are raised, not returned. Transient failures may be raised as
      :class:`~agentium_graph.providers.ProviderError` or as the transport's own exception.
    """

    @property
    def id(self) -> str:
        """A stable name for the provider (e.g. ``"openai"``, ``"scripted"``)."""
        ...

    @property
    def version(self) -> str:
        """The version of the provider's behavior; part of what a recorded response means."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the whole response."""
        ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """Send ``request`` and yield :data:`StreamEvent` values, ending with ``StreamEnd``.

        An async generator: the consumer may stop early with ``aclose()``, which must release
        everything the call holds. Nothing is sent before the first ``__anext__``.
        """
        ...


def _malformed(reason: str, message: str, **details: Any) -> MalformedResponseError:
    return MalformedResponseError(
        f"the model provider returned a malformed response: {message}; this is a provider "
        "(or model) fault, so retry the call or fix the provider adapter",
        details={"reason": reason, **details})


def _not_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_text(value: object, field: str, **details: Any) -> str:
    """``value`` if it is a string that encodes as UTF-8 (reasons ``text_not_string``,
    ``text_not_utf8``, naming ``field``)."""
    if not isinstance(value, str):
        raise _malformed("text_not_string", f"{field} is a {type(value).__name__}, not a "
                         "string", field=field, **details)
    if _not_utf8(value):
        raise _malformed("text_not_utf8", f"{field} holds a lone surrogate, so it cannot be "
                         "encoded as UTF-8", field=field, **details)
    return value


def _check_usage(usage: object, field: str) -> Usage:
    """``usage`` if it is a :class:`Usage` of non-negative integers of at most
    :data:`MAX_TOKENS` (reason ``bad_usage``)."""
    if not isinstance(usage, Usage):
        raise _malformed("bad_usage", f"{field} is a {type(usage).__name__}, not a Usage",
                         field=field)
    for name in ("input_tokens", "output_tokens"):
        value: object = getattr(usage, name, None)
        if type(value) is not int or value < 0:
            raise _malformed("bad_usage", f"{field}.{name} is {value!r}, not a non-negative "
                             "integer", field=f"{field}.{name}")
        if value > MAX_TOKENS:
            raise _malformed("bad_usage", f"{field}.{name} is {value}, more than the "
                             f"{MAX_TOKENS} (2**63 - 1) tokens a store can record",
                             field=f"{field}.{name}")
    return usage


def _check_stop_reason(value: object, field: str) -> None:
    if value not in ("end", "tool_calls", "max_tokens"):
        raise _malformed("bad_stop_reason", f"{field} is {value!r}, not one of 'end', "
                         "'tool_calls', 'max_tokens'", field=field)


def _check_call(call: object, index: int) -> ToolCall:
    if not isinstance(call, ToolCall):
        raise _malformed("not_a_tool_call", f"tool call #{index} is a "
                         f"{type(call).__name__}, not a ToolCall", index=index)
    call_id: object = getattr(call, "id", None)
    name: object = getattr(call, "name", None)
    args: object = getattr(call, "arguments", None)
    if not isinstance(call_id, str) or not call_id:
        raise _malformed("empty_tool_call_id", f"tool call #{index} has no id", index=index)
    if _not_utf8(call_id):
        raise _malformed("text_not_utf8", f"the id of tool call #{index} holds a lone "
                         "surrogate, so it cannot be encoded as UTF-8",
                         field=f"tool_calls[{index}].id", index=index)
    if not isinstance(name, str) or not name:
        raise _malformed("empty_tool_name", f"tool call {call_id!r} has no tool name",
                         index=index, tool_call_id=call_id)
    _check_text(name, f"tool_calls[{index}].name", index=index, tool_call_id=call_id)
    if not isinstance(args, dict):
        raise _malformed("arguments_not_object", f"tool call {call_id!r} ({name}) has "
                         f"arguments of type {type(args).__name__}, not a JSON object",
                         index=index, tool_call_id=call_id, tool_name=name)
    try:
        check_json(args, "arguments")
    except NotJSONError as exc:
        raise _malformed("arguments_not_json", f"tool call {call_id!r} ({name}) has arguments "
                         f"that are not JSON data ({exc})", index=index, tool_call_id=call_id,
                         tool_name=name) from None
    return call


def _duplicate(call: ToolCall, index: int) -> MalformedResponseError:
    return _malformed("duplicate_tool_call_id", f"tool call id {call.id!r} is used twice in "
                      "one response", index=index, tool_call_id=call.id, tool_name=call.name)


def check_tool_calls(calls: Sequence[object]) -> tuple[ToolCall, ...]:
    """Return ``calls`` if each is well formed and their ids are unique.

    Raises :class:`MalformedResponseError` (``details["reason"]`` one of
    ``not_a_tool_call``, ``empty_tool_call_id``, ``empty_tool_name``,
    ``arguments_not_object``, ``arguments_not_json``, ``duplicate_tool_call_id``) otherwise.
    """
    seen: set[str] = set()
    checked: list[ToolCall] = []
    for index, raw in enumerate(calls):
        call = _check_call(raw, index)
        if call.id in seen:
            raise _duplicate(call, index)
        seen.add(call.id)
        checked.append(call)
    return tuple(checked)


def check_response(response: ModelResponse) -> ModelResponse:
    """Return ``response`` if it keeps the provider contract; else raise
    :class:`MalformedResponseError` naming what is wrong (``details["reason"]``, and
    ``details["field"]`` where one field is).

    The whole response is checked, not trusted because of its type (an adapter may build
    one with ``model_construct``, which validates nothing): that it is a
    :class:`ModelResponse` (reason ``not_a_response``), its text (``text_not_string``,
    ``text_not_utf8``), its usage (``bad_usage``: non-negative integers), its stop reason
    (``bad_stop_reason``), its tool calls (:func:`check_tool_calls`; ``tool_calls`` must be
    a sequence, reason ``tool_calls_not_sequence``), that ``stop_reason="tool_calls"``
    comes with at least one call (``tool_calls_missing``), and finally that the model
    validates as a whole (``invalid_response``). A response equal to its validated form is
    returned as it is; otherwise (e.g. tool calls given as a list) the validated copy is.
    """
    if not isinstance(response, ModelResponse):
        raise _malformed("not_a_response", f"the provider returned a "
                         f"{type(response).__name__}, not a ModelResponse")
    text: object = getattr(response, "text", None)
    _check_text(text, "text")
    usage = _check_usage(getattr(response, "usage", None), "usage")
    stop_reason: object = getattr(response, "stop_reason", None)
    _check_stop_reason(stop_reason, "stop_reason")
    raw_calls: object = getattr(response, "tool_calls", None)
    if not isinstance(raw_calls, tuple | list):
        raise _malformed("tool_calls_not_sequence", f"tool_calls is a "
                         f"{type(raw_calls).__name__}, not a sequence of ToolCall",
                         field="tool_calls")
    calls = check_tool_calls(raw_calls)
    if stop_reason == "tool_calls" and not calls:
        raise _malformed("tool_calls_missing", "stop_reason is 'tool_calls' but the response "
                         "has no tool calls")
    validated = _validated(ModelResponse, {
        "text": text, "stop_reason": stop_reason,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        "tool_calls": tuple({"id": c.id, "name": c.name, "arguments": c.arguments}
                            for c in calls)})
    return response if validated == response else validated


def _validated(model: type[Any], data: dict[str, Any]) -> Any:
    """``model`` validated from ``data`` (strictly), or :class:`MalformedResponseError`
    naming the first field that fails."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "$"
        raise _malformed("invalid_response", f"{field}: {first['msg']}",
                         field=field) from None


def check_stream_event(event: object, index: int = 0) -> StreamEvent:
    """Return ``event`` if it is a well-formed stream event; else raise
    :class:`MalformedResponseError`: not an event (``not_a_stream_event``), a
    :class:`TextDelta` whose text is not a UTF-8 encodable string, a
    :class:`ToolCallDelta` whose call is malformed (as in :func:`check_tool_calls`; its
    ``index`` is the call's position), or a :class:`StreamEnd` whose usage or stop reason
    is (``bad_usage``, ``bad_stop_reason``). ``index`` is the event's position in the
    stream (for the message)."""
    if isinstance(event, TextDelta):
        _check_text(getattr(event, "text", None), "text", index=index)
    elif isinstance(event, ToolCallDelta):
        _check_call(getattr(event, "call", None), index)
    elif isinstance(event, StreamEnd):
        _check_usage(getattr(event, "usage", None), "usage")
        _check_stop_reason(getattr(event, "stop_reason", None), "stop_reason")
    else:
        raise _malformed("not_a_stream_event", f"stream item #{index + 1} is a "
                         f"{type(event).__name__}, not a stream event", index=index)
    return event


async def assemble_stream(events: AsyncIterable[StreamEvent]) -> ModelResponse:
    """Accumulate a whole stream into the :class:`ModelResponse` it stands for.

    Text deltas are concatenated, tool calls kept in order, and usage and stop reason taken
    from :class:`StreamEnd`, at which reading stops. The result is checked with
    :func:`check_response`.

    Raises :class:`IncompleteStreamError` if the stream ends without ``StreamEnd`` and
    :class:`MalformedResponseError` for a non-event item or a malformed event (a tool call,
    text that is not a UTF-8 string, a ``StreamEnd`` without valid usage; as soon as it
    arrives, see :func:`check_stream_event`). Whatever happens, the stream is closed
    (``aclose()``) before this returns, so a provider's connection (and the caller's slot)
    is released. Errors raised by the
    stream itself, including cancellation, propagate unchanged.
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    ids: set[str] = set()
    count = 0
    try:
        iterator = aiter(events)
        while True:
            # Stepped by hand: an __anext__ that returns no awaitable is the provider's
            # fault (a MalformedResponseError), not a bare TypeError of 'async for'.
            step: object = iterator.__anext__()
            if not inspect.isawaitable(step):
                raise _malformed("not_a_stream", f"the stream's __anext__() returned a "
                                 f"{type(step).__name__}, not an awaitable; make stream() an "
                                 "async generator that yields each StreamEvent")
            try:
                event = await step
            except StopAsyncIteration:
                break
            count += 1
            if isinstance(event, ToolCallDelta):
                call = _check_call(event.call, len(calls))
                if call.id in ids:
                    raise _duplicate(call, len(calls))
                ids.add(call.id)
                calls.append(call)
                continue
            check_stream_event(event, count - 1)
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, StreamEnd):
                usage = event.usage
                return check_response(_validated(ModelResponse, {
                    "text": "".join(text), "stop_reason": event.stop_reason,
                    "usage": {"input_tokens": usage.input_tokens,
                              "output_tokens": usage.output_tokens},
                    "tool_calls": tuple({"id": c.id, "name": c.name, "arguments": c.arguments}
                                        for c in calls)}))
        received = sum(len(t) for t in text)
        raise IncompleteStreamError(
            f"the model stream ended after {count} event(s) without a StreamEnd, so it is "
            "not a response; request it again",
            details={"events": count, "text_chars": received, "tool_calls": len(calls)})
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def shape_problem(provider: Any, *, stream: bool) -> str | None:
    """Why ``provider`` cannot serve the call its caller will make (``stream()`` when
    ``stream``, else ``complete()``), as far as its declaration tells; None when it may.

    ``complete`` must be a coroutine function; ``stream`` must not be one (an ``async def``
    without ``yield`` returns a coroutine, not a stream) nor a plain generator function."""
    name = type(provider).__name__
    if isinstance(provider, type):
        # Its methods are plain functions of the class, so the checks below would pass and
        # every call would then fail for want of ``self``.
        return (f"provider {provider.__name__} is a class; pass an instance of it "
                f"({provider.__name__}(...)), a ModelProvider with async complete() and "
                "stream()")
    method = "stream" if stream else "complete"
    fn = getattr(provider, method, None)
    if not callable(fn):
        return (f"provider {name} has no {method}() method; a ModelProvider has async "
                "complete() and stream()")
    if stream:
        if inspect.iscoroutinefunction(fn):
            return (f"provider {name}: stream() is an 'async def' without 'yield', so it "
                    "returns a coroutine, not a stream; make it an async generator (yield "
                    "each StreamEvent)")
        if inspect.isgeneratorfunction(fn):
            return (f"provider {name}: stream() is a plain generator; make it an async "
                    "generator ('async def stream(...)' that yields each StreamEvent)")
        return None
    if not _is_coroutine_function(fn):
        return (f"provider {name}: complete() is not a coroutine function; declare it "
                "'async def complete(request)' as ModelProvider requires")
    return None


def _is_coroutine_function(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    # A callable object with an async __call__ (not a function, method or class).
    return not inspect.isroutine(fn) and not isinstance(fn, type) and \
        inspect.iscoroutinefunction(type(fn).__call__)


async def call_complete(provider: Any, request: ModelRequest) -> ModelResponse:
    """``provider.complete(request)``, awaited and checked whole (:func:`check_response`);
    a ``complete`` that returns no awaitable is a :class:`MalformedResponseError`."""
    result = provider.complete(request)
    if not inspect.isawaitable(result):
        raise _malformed("not_awaitable", f"complete() returned a {type(result).__name__}, "
                         "not an awaitable; declare it 'async def complete(request)'")
    return check_response(await result)


def open_stream(provider: Any, request: ModelRequest) -> AsyncIterator[StreamEvent]:
    """``provider.stream(request)``, checked to be an async iterator, with ``__aiter__``
    and ``__anext__`` (reason ``not_a_stream``). Close it with :func:`close_stream`."""
    stream = provider.stream(request)
    if callable(getattr(type(stream), "__anext__", None)) and \
            callable(getattr(type(stream), "__aiter__", None)):
        return stream  # type: ignore[no-any-return]
    if inspect.iscoroutine(stream):
        stream.close()  # never awaited: closed, so it is not reported as leaked
    elif inspect.isgenerator(stream):
        stream.close()
    raise _malformed("not_a_stream", f"stream() returned a {type(stream).__name__}, not an "
                     "async iterator; make it an async generator that yields each StreamEvent")


async def close_stream(stream: AsyncIterator[StreamEvent]) -> None:
    """Close ``stream`` with its ``aclose()`` (an async iterator without one is left as
    it is: there is nothing to release)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
