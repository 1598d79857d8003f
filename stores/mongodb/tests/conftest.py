"""Fixtures for the MongoDB store tests: one server per session, one database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from agentium_graph_mongodb import MongoDBDurableTaskStore, pytest_plugin
from agentium_graph_mongodb.testing import open_store

# The shipped fixtures and the header hook (pytest finds them by name in this module).
mongodb_server = pytest_plugin.mongodb_server
mongodb_uri = pytest_plugin.mongodb_uri
mongodb_database = pytest_plugin.mongodb_database
pytest_report_header = pytest_plugin.pytest_report_header


@pytest.fixture
async def store(mongodb_uri: str,
                mongodb_database: str) -> AsyncIterator[MongoDBDurableTaskStore]:
    async with open_store(mongodb_uri, mongodb_database) as opened:
        yield opened


@pytest.fixture
async def raw_db(mongodb_uri: str,
                 mongodb_database: str) -> AsyncIterator[AsyncDatabase[dict[str, Any]]]:
    """The test's database through a plain client: to look at or tamper with documents."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri)
    try:
        yield client[mongodb_database]
    finally:
        await client.close()

