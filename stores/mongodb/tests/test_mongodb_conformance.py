"""The MongoDB store passes the shipped store conformance suite, durability and
two-process tests included (children open the same database through the factory)."""

from __future__ import annotations

import pytest

from agentium_graph.testing import FactoryHarness, StoreConformanceSuite, StoreHarness
from agentium_graph_mongodb.testing import FACTORY


class TestMongoDBStoreConformance(StoreConformanceSuite):
    @pytest.fixture
    def harness(self, mongodb_uri: str, mongodb_database: str) -> StoreHarness:
        return FactoryHarness(name="mongodb", factory=FACTORY,
                              factory_kwargs={"uri": mongodb_uri,
                                              "database": mongodb_database})
