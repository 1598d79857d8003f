"""Fixtures for the MongoDB store tests: one server per session, one database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb.pytest_plugin import (  # noqa: F401 - fixtures and the header hook
    mongodb_database,
    mongodb_server,
    mongodb_uri,
    pytest_report_header,
)
from agentium_graph_mongodb.testing import open_store


@pytest.fixture
async def store(mongodb_uri: str,
                mongodb_database: str) -> AsyncIterator[MongoDBDurableTaskStore]:
    async with open_store(mongodb_uri, mongodb_database) as opened:
        yield opened
