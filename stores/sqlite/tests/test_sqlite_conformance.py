"""The SQLite store passes the shipped store conformance suite, durability and
two-process tests included (children open the same file through the factory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentium_graph.testing import FactoryHarness, StoreConformanceSuite, StoreHarness


class TestSQLiteStoreConformance(StoreConformanceSuite):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        return FactoryHarness(name="sqlite", factory="agentium_graph_sqlite.testing:open_store",
                              factory_kwargs={"path": str(tmp_path / "tasks.db")})

