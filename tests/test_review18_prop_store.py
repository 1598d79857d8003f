"""Regressions the differential store machine found in the memory store (each shrunk to a
small explicit test)."""

from __future__ import annotations

from agentium_graph.store import AcquireLeaseRequest, InMemoryDurableTaskStore
from agentium_graph.testing import T0, make_create_request


async def test_an_acquire_without_steps_writes_no_blobs() -> None:
    """Blobs ride on an acquire's first commit: without steps there is none, and the
    durable stores write nothing (SQLite and MongoDB); the memory store wrote them."""
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request("k"))
    digest = "sha256:" + "b" * 64
    grant = await store.acquire_lease(AcquireLeaseRequest(
        key="k", worker_id="w1", ttl_seconds=5.0, now=T0, blobs={digest: '{"v":1}'}))
    assert grant.commit is None
    assert await store.get_blobs([digest]) == {}
