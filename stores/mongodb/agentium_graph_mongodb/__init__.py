"""agentium-graph-mongodb: the durable task store on MongoDB (pymongo's AsyncMongoClient).

The public API is exactly ``__all__``; everything in a ``_private`` module may change.
"""

from agentium_graph_mongodb._codec import SCHEMA_VERSION
from agentium_graph_mongodb._store import MongoDBDurableTaskStore, MongoDBStoreStats

__version__ = "0.1.0"

__all__ = ["SCHEMA_VERSION", "MongoDBDurableTaskStore", "MongoDBStoreStats", "__version__"]
