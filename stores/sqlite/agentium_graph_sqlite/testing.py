"""Factories for test harnesses, named as ``"agentium_graph_sqlite.testing:open_store"``.

A conformance harness (or a child process in a multi-process test) imports the factory by
that name and calls it with the database path to open the same data again.
"""

from __future__ import annotations

import os

from agentium_graph_sqlite._store import SQLiteDurableTaskStore

FACTORY = "agentium_graph_sqlite.testing:open_store"


def open_store(path: str | os.PathLike[str]) -> SQLiteDurableTaskStore:
    """A store on ``path`` with the default (full) durability; does no I/O until used."""
    return SQLiteDurableTaskStore(path)


__all__ = ["FACTORY", "open_store"]
