"""The MongoDB store against the memory store: the differential machine of
agentium_graph.testing.differential (same random protocol calls, same results, same state),
each example in a fresh database; ``reopen`` closes every handle (and its cache) and opens
the database again. Few examples: the test server does about 1,000 operations a second."""

from __future__ import annotations

import uuid

from agentium_graph.testing import FactoryHarness, StoreHarness
from agentium_graph.testing.differential import run_differential
from agentium_graph_mongodb.testing import FACTORY, MongoServer


def test_mongodb_store_against_the_memory_store(mongodb_server: MongoServer) -> None:
    def harness() -> FactoryHarness:
        return FactoryHarness(name="mongodb", factory=FACTORY, factory_kwargs={
            "uri": mongodb_server.uri, "database": f"agt_prop_{uuid.uuid4().hex[:16]}"})

    def discard(used: StoreHarness) -> None:
        mongodb_server.drop_database(used.factory_kwargs["database"])
    run_differential(harness, max_examples=6, steps=60, discard=discard)
