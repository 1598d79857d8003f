"""Model providers: the protocol a model backend implements, and a scripted fake.

A provider answers a :class:`ModelRequest` with a whole :class:`ModelResponse`
(``complete``) or a stream of :data:`StreamEvent` values ending in :class:`StreamEnd`
(``stream``); see :class:`ModelProvider` for the contract. Consumers check what comes back
with :func:`check_response` or :func:`assemble_stream`. :class:`ScriptedProvider` is a
deterministic fake for tests and examples.
"""

from agentium_graph.providers._errors import (
    IncompleteStreamError,
    MalformedResponseError,
    ProviderError,
    ProviderTimeoutError,
    ScriptExhaustedError,
)
from agentium_graph.providers._fake import (
    CallRecord,
    PartialStream,
    ScriptedProvider,
    ScriptedTurn,
    TurnMatch,
    read_call_log,
)
from agentium_graph.providers._models import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    Role,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from agentium_graph.providers._protocol import (
    ModelProvider,
    assemble_stream,
    check_response,
    check_stream_event,
    check_tool_calls,
)

__all__ = [
    "CallRecord",
    "IncompleteStreamError",
    "MalformedResponseError",
    "ModelMessage",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "PartialStream",
    "ProviderError",
    "ProviderTimeoutError",
    "Role",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "ScriptedTurn",
    "StopReason",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "TurnMatch",
    "Usage",
    "assemble_stream",
    "check_response",
    "check_stream_event",
    "check_tool_calls",
    "read_call_log",
]
