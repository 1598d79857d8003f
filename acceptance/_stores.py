"""How a child process opens the store under test, named by a JSON-able spec."""

from __future__ import annotations

import importlib
from typing import Any

from agentium_graph import DurableTaskStore


def open_store(spec: dict[str, Any]) -> DurableTaskStore:
    """``spec = {"factory": "module:function", "kwargs": {...}}``."""
    module_name, _, func_name = spec["factory"].partition(":")
    factory = getattr(importlib.import_module(module_name), func_name)
    store: DurableTaskStore = factory(**spec.get("kwargs", {}))
    return store


def sqlite_store(path: str) -> DurableTaskStore:
    from agentium_graph_sqlite import SQLiteDurableTaskStore

    return SQLiteDurableTaskStore(path)


def mongodb_store(uri: str, database: str) -> DurableTaskStore:
    """The MongoDB store on ``database`` at ``uri`` (each case uses a database of its own)."""
    from agentium_graph_mongodb import MongoDBDurableTaskStore

    return MongoDBDurableTaskStore(uri, database=database, server_selection_timeout_s=10.0)
