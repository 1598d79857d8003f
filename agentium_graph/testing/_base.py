"""The base every group of conformance tests builds on: fixtures and shared checks."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable
from datetime import datetime
from typing import Any, TypeVar

import pytest
import pytest_asyncio

from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._requests import CreateTaskRequest, Step
from agentium_graph.testing._fixtures import (
    T0,
    acquire,
    capture,
    commit,
    make_create_request,
)
from agentium_graph.testing._harness import StoreHarness

E = TypeVar("E", bound=BaseException)

KEY = "task-1"
W1 = "worker-1"
W2 = "worker-2"


def require_durable(store: DurableTaskStore) -> None:
    """Skip (for this capability reason only) unless the store claims durability."""
    if not store.capabilities.durable:
        pytest.skip("store is not durable")


def require_multi_process(store: DurableTaskStore) -> None:
    """Skip (for this capability reason only) unless the store claims multi-process use."""
    if not store.capabilities.multi_process:
        pytest.skip("store is not multi-process")


async def rejected(store: DurableTaskStore, key: str, error: type[E],
                   operation: Awaitable[Any]) -> E:
    """Await ``operation`` (not started yet), expect ``error``, and check that the task's
    whole state -- snapshot, identity and journal -- is unchanged."""
    try:
        before = await capture(store, key)
    except BaseException:
        if inspect.iscoroutine(operation):
            operation.close()
        raise
    with pytest.raises(error) as info:
        await operation
    after = await capture(store, key)
    assert after.snapshot == before.snapshot, f"rejected ({error.__name__}) but changed the task"
    assert after.identity == before.identity, f"rejected ({error.__name__}) but changed identity"
    assert after.timeline == before.timeline, f"rejected ({error.__name__}) but wrote journal"
    return info.value


class SuiteBase:
    """Fixtures of the suite. A store's test class overrides only ``harness``."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError(
            "override the `harness` fixture in your StoreConformanceSuite subclass: return a "
            "StoreHarness (e.g. FactoryHarness) whose data starts empty for every test")

    @pytest_asyncio.fixture
    async def store(self, harness: StoreHarness) -> AsyncIterator[DurableTaskStore]:
        store = await harness.open()
        try:
            yield store
        finally:
            await harness.close()

    # shared set-ups ------------------------------------------------------------------
    async def create(self, store: DurableTaskStore, key: str = KEY,
                     **kwargs: Any) -> CreateTaskRequest:
        request = make_create_request(key, **kwargs)
        result = await store.create_task(request)
        assert result.created, f"task {key!r} already existed: the harness data must start empty"
        return request

    async def leased(self, store: DurableTaskStore, key: str = KEY, worker: str = W1, *,
                     now: datetime = T0, ttl: float = 30.0, **kwargs: Any) -> int:
        """Create ``key`` and lease it to ``worker``; return the fence."""
        await self.create(store, key, **kwargs)
        return await acquire(store, key, worker, now=now, ttl=ttl)

    async def apply(self, store: DurableTaskStore, fence: int, *steps: Step,
                    key: str = KEY, worker: str = W1, now: datetime = T0) -> None:
        await commit(store, key, worker, fence, *steps, now=now)
