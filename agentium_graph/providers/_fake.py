"""A deterministic, scripted model provider for tests and examples.

:class:`ScriptedProvider` answers each call with the next turn of a script. A turn says what
the model "returns" (text, tool calls, usage) and, optionally, how the call misbehaves: a
cancellable delay, a raised exception, or a stream that breaks off part-way. The provider
keeps a call log, so a test can assert how many real provider calls happened (for example,
zero for responses a recovered run replayed from its journal).

The script is plain data (:meth:`ScriptedProvider.to_data` / :meth:`ScriptedProvider.from_data`,
JSON), so a child process can rebuild the same provider; with ``call_log_path`` every process
appends its calls to one JSON-lines file that the parent reads back with
:func:`read_call_log`.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from agentium_graph._canonical import canonical_json, check_json
from agentium_graph.providers._errors import (
    IncompleteStreamError,
    ProviderError,
    ScriptExhaustedError,
)
from agentium_graph.providers._models import (
    ModelRequest,
    ModelResponse,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "CallRecord",
    "PartialStream",
    "ScriptedProvider",
    "ScriptedTurn",
    "TurnMatch",
    "read_call_log",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Sleep = Callable[[float], Awaitable[None]]


class PartialStream(BaseModel):
    """A stream that breaks off after ``events`` events, before its ``StreamEnd``.

    ``ending``: ``"raise"`` raises the turn's ``fail`` exception (a :class:`ProviderError`
    if none is given); ``"eof"`` just stops, so the stream "ends mid-frame" and a consumer
    sees :class:`IncompleteStreamError`; ``"hang"`` waits until canceled or closed (a
    process can be killed mid-stream). ``complete()`` on such a turn raises (``"raise"``),
    raises :class:`IncompleteStreamError` (``"eof"``) or hangs (``"hang"``).
    """

    model_config = _FROZEN

    events: int = Field(default=1, ge=0)
    ending: Literal["raise", "eof", "hang"] = "raise"


class TurnMatch(BaseModel):
    """Plain-data conditions a request must meet to be answered by a turn (all must hold).

    * ``contains``: a substring of some message's content (e.g. a node's input).
    * ``assistant_turns``: how many assistant messages the request already holds, i.e. the
      position of the call in an agent's loop (0 for the first call).
    * ``metadata``: items that must all appear in ``request.metadata``.
    """

    model_config = _FROZEN

    contains: str | None = None
    assistant_turns: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] = {}

    def accepts(self, request: ModelRequest) -> bool:
        if self.contains is not None and not any(
                self.contains in m.content for m in request.model_messages):
            return False
        if self.assistant_turns is not None and self.assistant_turns != sum(
                m.role == "assistant" for m in request.model_messages):
            return False
        return all(key in request.metadata and request.metadata[key] == value
                   for key, value in self.metadata.items())


def _exception_to_data(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    args = list(exc.args)
    check_json(args, "fail.args")
    return {"type": f"{cls.__module__}:{cls.__qualname__}", "args": args}


def _exception_from_data(data: Mapping[str, Any]) -> BaseException:
    module, _, qualname = str(data.get("type", "")).partition(":")
    if not module or not qualname:
        raise ValueError("fail must be an exception or {'type': 'module:Class', 'args': [...]}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ValueError(f"fail type {data['type']!r} is not an exception class")
    return obj(*data.get("args", ()))


class ScriptedTurn(BaseModel):
    """One scripted provider call.

    What the call returns: ``text``, ``tool_calls``, ``usage`` (default: a deterministic
    estimate, about four characters a token) and ``stop_reason`` (default ``"tool_calls"``
    when there are tool calls, else ``"end"``). ``raw_tool_calls`` are emitted after
    ``tool_calls`` *without validation* (e.g. ``{"id": "c1", "name": "", "arguments": "x"}``),
    to test how a consumer treats a malformed response.

    How it misbehaves: ``delay`` seconds pass (cancellable) before anything is returned or
    streamed; ``chunk_delay`` seconds pass between stream events; ``fail`` is raised instead
    of answering; ``partial_stream_then_fail`` breaks the stream off part-way.

    Which requests it answers: a turn with ``match`` and/or ``when`` (a predicate, not plain
    data, so a script using it cannot be sent to another process) answers only requests
    that satisfy both; a turn with neither answers any request.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    raw_tool_calls: tuple[dict[str, Any], ...] = ()
    usage: Usage | None = None
    stop_reason: StopReason | None = None
    delay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    chunk_delay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    fail: BaseException | None = None
    partial_stream_then_fail: PartialStream | None = None
    match: TurnMatch | None = None
    when: Callable[[ModelRequest], bool] | None = Field(default=None, exclude=True)

    @field_validator("fail", mode="before")
    @classmethod
    def _load_fail(cls, value: Any) -> Any:
        return _exception_from_data(value) if isinstance(value, Mapping) else value

    @field_serializer("fail", when_used="json")
    def _dump_fail(self, value: BaseException | None) -> dict[str, Any] | None:
        return None if value is None else _exception_to_data(value)

    @model_validator(mode="after")
    def _check_consistent(self) -> ScriptedTurn:
        cut = self.partial_stream_then_fail
        if self.fail is not None and cut is not None and cut.ending != "raise":
            raise ValueError(f"fail is only raised by partial_stream_then_fail.ending='raise', "
                             f"not {cut.ending!r}; drop one of them")
        return self

    @classmethod
    def of(cls, turn: ScriptedTurn | ModelResponse | Mapping[str, Any] | str) -> ScriptedTurn:
        """A turn from a turn, a response to return as-is, turn data, or just the text."""
        if isinstance(turn, ScriptedTurn):
            return turn
        if isinstance(turn, ModelResponse):
            return cls(text=turn.text, tool_calls=turn.tool_calls, usage=turn.usage,
                       stop_reason=turn.stop_reason)
        if isinstance(turn, str):
            return cls(text=turn)
        return cls.model_validate(turn)

    def accepts(self, request: ModelRequest) -> bool:
        if self.match is not None and not self.match.accepts(request):
            return False
        return self.when is None or bool(self.when(request))

    def response_for(self, request: ModelRequest) -> ModelResponse:
        """The response this turn gives to ``request`` (the same every time)."""
        raw = tuple(_unchecked_call(c) for c in self.raw_tool_calls)
        calls = self.tool_calls + raw
        usage = self.usage or _estimate_usage(request, self.text, len(calls))
        stop: StopReason = self.stop_reason or ("tool_calls" if calls else "end")
        return ModelResponse(text=self.text, tool_calls=calls, usage=usage, stop_reason=stop)

    def to_data(self) -> dict[str, Any]:
        """This turn as JSON data (raises ``ValueError`` if it has a ``when`` predicate)."""
        if self.when is not None:
            raise ValueError("a turn with a 'when' predicate is not plain data; use 'match'")
        data: dict[str, Any] = self.model_dump(mode="json", exclude_defaults=True)
        if self.fail is None:
            data.pop("fail", None)  # a field serializer defeats exclude_defaults
        return data


def _unchecked_call(data: Mapping[str, Any]) -> ToolCall:
    # Bypasses validation on purpose: the fake must be able to emit what a broken
    # provider would.
    arguments: Any = data.get("arguments")
    return ToolCall.model_construct(id=data.get("id", ""), name=data.get("name", ""),
                                    arguments=arguments)


def _estimate_usage(request: ModelRequest, text: str, calls: int) -> Usage:
    chars = sum(len(m.content) for m in request.model_messages)
    return Usage(input_tokens=max(1, math.ceil(chars / 4)),
                 output_tokens=math.ceil(len(text) / 4) + 8 * calls)


def _split(text: str, chunks: int) -> list[str]:
    if not text:
        return []
    size = math.ceil(len(text) / chunks)
    return [text[i:i + size] for i in range(0, len(text), size)]


class CallRecord(BaseModel):
    """One provider call: how it was made, which turn answered it (``None``: none did)."""

    model_config = _FROZEN

    method: Literal["complete", "stream"]
    turn: int | None
    request_digest: str
    pid: int


def read_call_log(path: str | os.PathLike[str]) -> list[CallRecord]:
    """The calls every process logged to ``path`` (empty if there were none yet)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [CallRecord.model_validate_json(line) for line in lines if line.strip()]


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


class ScriptedProvider:
    """A deterministic fake :class:`~agentium_graph.providers.ModelProvider`.

    ``script`` is a sequence of turns (:class:`ScriptedTurn`, a :class:`ModelResponse` to
    return as-is, turn data, or plain text). Each call -- ``complete()``, or the first
    ``__anext__`` of a ``stream()`` -- consumes the first unused turn that accepts the
    request, and is logged in :attr:`calls` / :attr:`call_log` before anything else happens;
    a call consumes its turn even if it then fails or is canceled (script a retry as another
    turn). With no turn left for a request the call raises :class:`ScriptExhaustedError`.

    A stream yields the text in ``chunks`` pieces, then each tool call, then ``StreamEnd``.
    ``sleep`` (default :func:`asyncio.sleep`) is awaited for delays; inject your own to control
    time. A rebuilt provider (``from_data``) starts with the whole script unused.

    Example -- an agent that calls one tool, then answers::

        provider = ScriptedProvider([
            ScriptedTurn(tool_calls=(ToolCall(id="c1", name="add", arguments={"a": 1}),)),
            ScriptedTurn(text="The sum is 3.", usage=Usage(input_tokens=20, output_tokens=5)),
        ])
        ...                                   # run the graph
        assert provider.call_count == 2       # after recovery: still 2, responses replayed
    """

    id: str = "scripted"
    version: str = "1"

    def __init__(self, script: Iterable[ScriptedTurn | ModelResponse | Mapping[str, Any] | str],
                 *, chunks: int = 3, call_log_path: str | os.PathLike[str] | None = None,
                 sleep: Sleep | None = None) -> None:
        if chunks < 1:
            raise ValueError("chunks must be at least 1")
        self.turns: tuple[ScriptedTurn, ...] = tuple(ScriptedTurn.of(t) for t in script)
        self.calls: list[ModelRequest] = []
        self.call_log: list[CallRecord] = []
        self._chunks = chunks
        self._log_path = None if call_log_path is None else Path(call_log_path)
        self._sleep: Sleep = sleep or asyncio.sleep
        self._used: set[int] = set()
        self._open_streams = 0

    @property
    def call_count(self) -> int:
        """How many provider calls were made (served or not)."""
        return len(self.calls)

    @property
    def remaining(self) -> int:
        """How many turns are still unused."""
        return len(self.turns) - len(self._used)

    @property
    def open_streams(self) -> int:
        """Streams started and not yet finished or closed (a leak check for consumers)."""
        return self._open_streams

    def to_data(self) -> dict[str, Any]:
        """The script and options as JSON data, for :meth:`from_data` in another process."""
        data: dict[str, Any] = {"turns": [t.to_data() for t in self.turns],
                                "chunks": self._chunks}
        if self._log_path is not None:
            data["call_log_path"] = str(self._log_path)
        canonical_json(data)  # fails early if anything is not JSON
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, sleep: Sleep | None = None
                  ) -> ScriptedProvider:
        """A fresh provider with the script and options of :meth:`to_data`."""
        return cls(data["turns"], chunks=data.get("chunks", 3),
                   call_log_path=data.get("call_log_path"), sleep=sleep)

    def _take(self, request: ModelRequest, method: Literal["complete", "stream"]
              ) -> ScriptedTurn:
        chosen = next((i for i, turn in enumerate(self.turns)
                       if i not in self._used and turn.accepts(request)), None)
        record = CallRecord(method=method, turn=chosen, request_digest=request.digest(),
                            pid=os.getpid())
        self.calls.append(request)
        self.call_log.append(record)
        if self._log_path is not None:
            with self._log_path.open("a", encoding="utf-8") as log:
                log.write(record.model_dump_json() + "\n")
        if chosen is None:
            raise ScriptExhaustedError(
                f"the scripted provider has no unused turn for call #{len(self.calls)} "
                f"({method}, request {record.request_digest}); {self.remaining} of "
                f"{len(self.turns)} turn(s) left. Add a turn to the script, or fix its "
                "match conditions",
                details={"call": len(self.calls), "request_digest": record.request_digest,
                         "remaining": self.remaining})
        self._used.add(chosen)
        return self.turns[chosen]

    async def _pause(self, seconds: float) -> None:
        if seconds > 0:
            await self._sleep(seconds)

    async def _break_off(self, turn: ScriptedTurn, cut: PartialStream, emitted: int) -> None:
        if cut.ending == "hang":
            await _forever()
        elif cut.ending == "raise":
            raise turn.fail or ProviderError(
                f"scripted provider failure after {emitted} stream event(s)",
                details={"events": emitted})

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The turn's response, after its delay; or its injected failure."""
        turn = self._take(request, "complete")
        await self._pause(turn.delay)
        cut = turn.partial_stream_then_fail
        if cut is not None:
            await self._break_off(turn, cut, 0)
            raise IncompleteStreamError("scripted response body ended early",
                                        details={"events": 0})
        if turn.fail is not None:
            raise turn.fail
        return turn.response_for(request)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        """The turn's response as events, after its delay; or its injected failure."""
        turn = self._take(request, "stream")
        self._open_streams += 1
        try:
            await self._pause(turn.delay)
            cut = turn.partial_stream_then_fail
            if turn.fail is not None and cut is None:
                raise turn.fail
            events = self.events_for(turn, request)
            if cut is not None:
                events = events[:-1][:cut.events]  # never the StreamEnd
            for n, event in enumerate(events):
                if n:
                    await self._pause(turn.chunk_delay)
                yield event
            if cut is not None:
                await self._break_off(turn, cut, len(events))
        finally:
            self._open_streams -= 1

    def events_for(self, turn: ScriptedTurn, request: ModelRequest) -> list[StreamEvent]:
        """Every event of ``turn``'s complete stream for ``request``."""
        response = turn.response_for(request)
        events: list[StreamEvent] = [TextDelta(text=t) for t in _split(response.text,
                                                                        self._chunks)]
        events.extend(ToolCallDelta(call=c) for c in response.tool_calls)
        events.append(StreamEnd(usage=response.usage, stop_reason=response.stop_reason))
        return events
