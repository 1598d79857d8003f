"""The model provider contract, and the checks a consumer applies to what a provider returns."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from typing import Any, Protocol, runtime_checkable

from agentium_graph._canonical import NotJSONError, check_json
from agentium_graph.providers._errors import IncompleteStreamError, MalformedResponseError
from agentium_graph.providers._models import (
    ModelRequest,
    ModelResponse,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)

__all__ = ["ModelProvider", "assemble_stream", "check_response", "check_tool_calls"]


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
      the call consumed, as billed.
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


def _check_call(call: object, index: int) -> ToolCall:
    if not isinstance(call, ToolCall):
        raise _malformed("not_a_tool_call", f"tool call #{index} is a "
                         f"{type(call).__name__}, not a ToolCall", index=index)
    call_id: object = call.id
    name: object = call.name
    args: object = call.arguments
    if not isinstance(call_id, str) or not call_id:
        raise _malformed("empty_tool_call_id", f"tool call #{index} has no id", index=index)
    if not isinstance(name, str) or not name:
        raise _malformed("empty_tool_name", f"tool call {call_id!r} has no tool name",
                         index=index, tool_call_id=call_id)
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
    :class:`MalformedResponseError`.

    Checks the tool calls (:func:`check_tool_calls`) and that ``stop_reason="tool_calls"``
    comes with at least one call (reason ``tool_calls_missing``).
    """
    check_tool_calls(response.tool_calls)
    if response.stop_reason == "tool_calls" and not response.tool_calls:
        raise _malformed("tool_calls_missing", "stop_reason is 'tool_calls' but the response "
                         "has no tool calls")
    return response


async def assemble_stream(events: AsyncIterable[StreamEvent]) -> ModelResponse:
    """Accumulate a whole stream into the :class:`ModelResponse` it stands for.

    Text deltas are concatenated, tool calls kept in order, and usage and stop reason taken
    from :class:`StreamEnd`, at which reading stops. The result is checked with
    :func:`check_response`.

    Raises :class:`IncompleteStreamError` if the stream ends without ``StreamEnd`` and
    :class:`MalformedResponseError` for a non-event item or a malformed tool call (as soon as
    it arrives). Whatever happens, the stream is closed (``aclose()``) before this returns,
    so a provider's connection (and the caller's slot) is released. Errors raised by the
    stream itself, including cancellation, propagate unchanged.
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    ids: set[str] = set()
    count = 0
    try:
        async for event in events:
            count += 1
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCallDelta):
                call = _check_call(event.call, len(calls))
                if call.id in ids:
                    raise _duplicate(call, len(calls))
                ids.add(call.id)
                calls.append(call)
            elif isinstance(event, StreamEnd):
                return check_response(ModelResponse(
                    text="".join(text), tool_calls=tuple(calls), usage=event.usage,
                    stop_reason=event.stop_reason))
            else:
                raise _malformed("not_a_stream_event", f"stream item #{count} is a "
                                 f"{type(event).__name__}, not a stream event", index=count - 1)
        received = sum(len(t) for t in text)
        raise IncompleteStreamError(
            f"the model stream ended after {count} event(s) without a StreamEnd, so it is "
            "not a response; request it again",
            details={"events": count, "text_chars": received, "tool_calls": len(calls)})
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
