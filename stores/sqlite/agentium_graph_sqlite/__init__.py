"""agentium-graph-sqlite: the embedded durable task store (one SQLite file, WAL).

The public API is exactly ``__all__``; everything in a ``_private`` module may change.
"""

from agentium_graph_sqlite._schema import SCHEMA_VERSION
from agentium_graph_sqlite._store import SQLiteDurableTaskStore, SQLiteStoreStats

__version__ = "0.1.0"

__all__ = ["SCHEMA_VERSION", "SQLiteDurableTaskStore", "SQLiteStoreStats", "__version__"]
