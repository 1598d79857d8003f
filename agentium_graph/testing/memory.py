"""A harness for :class:`~agentium_graph.store.InMemoryDurableTaskStore`.

The memory store is neither durable nor shared between processes, so every handle this
harness opens is the one instance it owns: ``open()`` and ``reopen()`` return it with its
data, and the suite's durability and two-process tests skip for that capability reason.
Its ``factory`` builds a *fresh, empty* store (there is no way to reach the same data
from another process).
"""

from __future__ import annotations

from agentium_graph.store._memory import InMemoryDurableTaskStore
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.testing._harness import StoreHarness


def new_memory_store() -> InMemoryDurableTaskStore:
    """The harness factory: a new, empty in-memory store."""
    return InMemoryDurableTaskStore()


class MemoryHarness(StoreHarness):
    """Every handle is the same :class:`InMemoryDurableTaskStore` instance."""

    def __init__(self, store: InMemoryDurableTaskStore | None = None) -> None:
        super().__init__(name="memory", factory=f"{__name__}:new_memory_store")
        self.instance = store if store is not None else new_memory_store()

    async def connect(self) -> DurableTaskStore:
        return self.instance
