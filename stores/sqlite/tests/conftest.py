"""Fixtures for the SQLite store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentium_graph_sqlite import SQLiteDurableTaskStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tasks.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteDurableTaskStore]:
    async with SQLiteDurableTaskStore(db_path) as opened:
        yield opened
