from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from agentium_graph_http import HttpActionConnector
from agentium_graph_http.testing import IdempotentTestServer


@pytest.fixture
def server() -> Iterator[IdempotentTestServer]:
    with IdempotentTestServer() as srv:
        yield srv
    assert not srv.server_errors, srv.server_errors


@pytest.fixture
async def connect(server: IdempotentTestServer
                  ) -> AsyncIterator[Callable[..., HttpActionConnector]]:
    """Build connectors to ``server`` (no backoff, short timeouts) and close them afterwards."""
    made: list[HttpActionConnector] = []

    def factory(**options: Any) -> HttpActionConnector:
        options.setdefault("retry_wait_s", 0)
        options.setdefault("timeout_s", 5.0)
        connector = server.connector(**options)
        made.append(connector)
        return connector

    yield factory
    for connector in made:
        await connector.aclose()
