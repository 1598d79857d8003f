"""The SQLite store against the memory store: the differential machine of
agentium_graph.testing.differential (same random protocol calls, same results, same state),
each example on a fresh file; ``reopen`` closes every handle and opens the file again."""

from __future__ import annotations

import itertools
from pathlib import Path

from agentium_graph.testing import FactoryHarness
from agentium_graph.testing.differential import run_differential


def test_sqlite_store_against_the_memory_store(tmp_path: Path) -> None:
    numbers = itertools.count()

    def harness() -> FactoryHarness:
        return FactoryHarness(name="sqlite", factory="agentium_graph_sqlite.testing:open_store",
                              factory_kwargs={"path": str(tmp_path / f"{next(numbers)}.db")})
    run_differential(harness, max_examples=20, steps=80)
