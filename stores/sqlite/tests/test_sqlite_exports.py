"""The public facade is exactly what __all__ names."""

from __future__ import annotations

import agentium_graph_sqlite
from agentium_graph_sqlite import testing


def test_exported_members() -> None:
    assert sorted(agentium_graph_sqlite.__all__) == [
        "SCHEMA_VERSION", "SQLiteDurableTaskStore", "SQLiteStoreStats", "__version__"]
    public = {n for n in dir(agentium_graph_sqlite) if not n.startswith("_")}
    assert public - {"testing"} == set(agentium_graph_sqlite.__all__) - {"__version__"}


def test_factory_name_resolves() -> None:
    module, _, name = testing.FACTORY.partition(":")
    assert module == testing.__name__ and getattr(testing, name) is testing.open_store
