"""Streamed planning interrupted at random store writes and recovered by fresh runtimes, on
MongoDB: the property of tests/test_review18_prop_planner.py (the plan of revision r is its
target, tombstones and counters follow it, continuations start from the current revision,
nothing completed re-runs, nothing is refunded), each example in a fresh database. Few
examples: the test server does about 1,000 operations a second."""

from __future__ import annotations

import asyncio
import tempfile
import uuid

from hypothesis import given

from agentium_graph import DurableTaskStore
from agentium_graph_mongodb.testing import MongoServer, open_store
from tests._review18_prop_planner_model import Script, scripts
from tests.test_review18_prop_planner import (
    Driver,
    check_plan_follows_targets,
    fault_lists,
    prop_settings,
)
from tests.test_review18_prop_runtime import Fault, Stores


class MongoStores(Stores):
    """Handles on one fresh database (a new client per worker, as a new process opens)."""

    def __init__(self, uri: str, directory: str) -> None:
        super().__init__("mongodb", directory)
        self.uri, self.database = uri, f"agt_plan_{uuid.uuid4().hex[:16]}"

    def open(self) -> DurableTaskStore:
        store = open_store(self.uri, self.database)
        self.handles.append(store)
        return store


def test_interrupted_streamed_planning_recovers_on_mongodb(mongodb_server: MongoServer) -> None:
    @prop_settings(10)
    @given(script=scripts(allow_hang=False), faults=fault_lists())
    def check(script: Script, faults: list[Fault]) -> None:
        async def main() -> None:
            with tempfile.TemporaryDirectory() as directory:
                stores = MongoStores(mongodb_server.uri, directory)
                try:
                    out = await Driver(script, stores, faults).drive()
                finally:
                    await stores.close()
                    mongodb_server.drop_database(stores.database)
            check_plan_follows_targets(script, out)
            if out.output is not None:
                assert out.view.status == "completed"

        asyncio.run(main())

    check()
