"""The public facade is exactly what __all__ names, and the factory name resolves."""

from __future__ import annotations

import agentium_graph_mongodb
from agentium_graph.testing import load_factory
from agentium_graph_mongodb import testing


def test_exported_members() -> None:
    assert sorted(agentium_graph_mongodb.__all__) == [
        "MongoDBDurableTaskStore", "MongoDBStoreStats", "SCHEMA_VERSION", "__version__"]
    public = {n for n in dir(agentium_graph_mongodb) if not n.startswith("_")}
    assert public - {"testing", "pytest_plugin"} == set(agentium_graph_mongodb.__all__) - {
        "__version__"}


def test_factory_name_resolves() -> None:
    assert load_factory(testing.FACTORY) is testing.open_store


def test_the_acceptance_factory_builds_a_store_without_io() -> None:
    from acceptance._stores import mongodb_store

    store = mongodb_store("mongodb://127.0.0.1:1/?directConnection=true", "acceptance")
    assert isinstance(store, agentium_graph_mongodb.MongoDBDurableTaskStore)
    assert store.capabilities.name == "mongodb"
