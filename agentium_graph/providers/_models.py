"""The data a model provider receives and returns: frozen, keyword-only, extra fields forbidden.

Everything here is plain data so it can be journaled, digested and compared across
processes. Tool call ``arguments`` are typed as a dict but not checked any further at
construction: a provider adapter records what the model said, and the consumer decides
whether it is acceptable with :func:`~agentium_graph.providers.check_response`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from agentium_graph._canonical import NotJSONError, check_json, digest

__all__ = [
    "ModelMessage",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "StopReason",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]
StopReason = Literal["end", "tool_calls", "max_tokens"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ToolCall(BaseModel):
    """One tool call the model asked for. ``id`` is the model's id, echoed by the result."""

    model_config = _FROZEN

    id: str
    name: str
    arguments: dict[str, Any]


class ToolSpec(BaseModel):
    """A tool offered to the model: its name, what it does and a JSON Schema of its input."""

    model_config = _FROZEN

    name: str
    description: str = ""
    input_schema: dict[str, Any]


class ModelMessage(BaseModel):
    """One conversation message.

    ``tool_calls`` belong only to ``assistant`` messages; a ``tool`` message carries the
    result of one call and names it with ``tool_call_id`` (required there, forbidden elsewhere).
    """

    model_config = _FROZEN

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> ModelMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role!r} message cannot carry tool_calls; only "
                             "assistant messages do")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id is required on 'tool' messages and not allowed "
                             "on any other role")
        return self


class Usage(BaseModel):
    """Tokens a call consumed, as the provider reported them."""

    model_config = _FROZEN

    input_tokens: StrictInt = Field(ge=0)
    output_tokens: StrictInt = Field(ge=0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelRequest(BaseModel):
    """Everything one provider call is asked; its :meth:`digest` identifies the call.

    A durable caller records each complete response under the digest of the request that
    produced it, and on recovery replays the recorded response for an equal request instead
    of calling the provider. So a request must hold only request-bound data: no attempt
    numbers, fences, timestamps or random ids (in ``metadata`` either).
    """

    model_config = _FROZEN

    model_messages: tuple[ModelMessage, ...] = Field(min_length=1)
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    metadata: dict[str, Any] = {}

    @model_validator(mode="after")
    def _check_json(self) -> ModelRequest:
        # Checked once here so digest() can never fail on a constructed request.
        try:
            check_json(self._digest_data(), "request")
        except NotJSONError as exc:
            raise ValueError(f"a model request must be plain JSON data: {exc}") from None
        return self

    def _digest_data(self) -> dict[str, Any]:
        # Fields equal to their default are left out, so adding an optional field later
        # keeps every recorded digest valid.
        return self.model_dump(exclude_defaults=True)

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of this request (dict order is irrelevant)."""
        return digest(self._digest_data())


class ModelResponse(BaseModel):
    """A complete model response: text, requested tool calls, usage and why it stopped."""

    model_config = _FROZEN

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage
    stop_reason: StopReason

    def to_message(self) -> ModelMessage:
        """The assistant message that records this response in the next request."""
        return ModelMessage(role="assistant", content=self.text, tool_calls=self.tool_calls)


class TextDelta(BaseModel):
    """The next piece of the response text."""

    model_config = _FROZEN

    text: str


class ToolCallDelta(BaseModel):
    """One whole tool call."""

    model_config = _FROZEN

    call: ToolCall


class StreamEnd(BaseModel):
    """The last event of a complete stream: usage and the stop reason."""

    model_config = _FROZEN

    usage: Usage
    stop_reason: StopReason


StreamEvent = TextDelta | ToolCallDelta | StreamEnd
