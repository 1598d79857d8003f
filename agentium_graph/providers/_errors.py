"""Errors of the model provider layer.

All derive from :class:`~agentium_graph.errors.AgentiumGraphError` and carry a stable
``code``::

    AgentiumGraphError
    └── ProviderError                 a model provider call failed
        ├── IncompleteStreamError     a stream ended (EOF) before its StreamEnd event
        ├── MalformedResponseError    a response or stream broke the provider contract
        │   └── ResponseTooLargeError a response is larger than the store keeps in one record
        ├── ProviderTimeoutError      a call did not finish within the caller's time limit
        └── ScriptExhaustedError      the scripted fake provider has no turn for a request
"""

from __future__ import annotations

from agentium_graph.errors import AgentiumGraphError

__all__ = [
    "IncompleteStreamError",
    "MalformedResponseError",
    "ProviderError",
    "ProviderTimeoutError",
    "ResponseTooLargeError",
    "ScriptExhaustedError",
]


class ProviderError(AgentiumGraphError):
    """A model provider call failed; the request may be retried as a fresh call."""

    code = "provider_error"


class IncompleteStreamError(ProviderError):
    """The stream stopped without a ``StreamEnd``: its text, tool calls and usage are unknown.

    Nothing from an incomplete stream may be treated as a model response. Request it again;
    a durable caller keeps the interrupted call's reservation charged as unknown usage.
    """

    code = "provider_stream_incomplete"


class MalformedResponseError(ProviderError):
    """The provider returned something the contract forbids (e.g. a tool call without a name).

    ``details["reason"]`` is a stable short code for what was wrong.
    """

    code = "provider_response_malformed"


class ResponseTooLargeError(MalformedResponseError):
    """A model response is larger, as JSON, than the store keeps in one record
    (``StoreCapabilities.max_blob_bytes``), so it cannot be journaled and replayed.
    ``details``: ``bytes``, ``limit``. The call's usage is charged; the request is not asked
    again (a re-run ends the same way without a provider call)."""

    code = "provider_response_too_large"


class ProviderTimeoutError(ProviderError):
    """A provider call did not finish within the time limit its caller set; the message
    names the setting to raise. ``details``: ``timeout_seconds``, ``limit`` (the setting),
    ``stream``."""

    code = "provider_timeout"


class ScriptExhaustedError(ProviderError):
    """The scripted fake provider has no remaining turn that accepts the request."""

    code = "provider_script_exhausted"
