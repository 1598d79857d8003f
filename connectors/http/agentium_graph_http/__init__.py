"""agentium-graph-http: a durable action connector for idempotent HTTP APIs.

``HttpActionConnector`` sends each action with an ``Idempotency-Key`` header (the action
id) and reconciles after a crash by looking that key up. ``agentium_graph_http.testing``
ships ``IdempotentTestServer``, a real local server with fault switches, for tests.

The public API is exactly ``__all__``; everything in a ``_private`` module may change.
"""

from agentium_graph_http._config import HttpConnectorConfig
from agentium_graph_http._connector import HttpActionConnector
from agentium_graph_http._errors import (
    HttpConnectorError,
    HttpNetworkError,
    HttpRejectedError,
    HttpResponseError,
    HttpResponseTooLargeError,
    HttpServerError,
    HttpTimeoutError,
    HttpTransientError,
)

__version__ = "0.1.0"

__all__ = [
    "HttpActionConnector",
    "HttpConnectorConfig",
    "HttpConnectorError",
    "HttpNetworkError",
    "HttpRejectedError",
    "HttpResponseError",
    "HttpResponseTooLargeError",
    "HttpServerError",
    "HttpTimeoutError",
    "HttpTransientError",
    "__version__",
]
