"""Sixteenth review: text that is not valid Unicode (a lone surrogate, which is what Python
makes of an invalid byte in a command-line argument: ``agentium-graph inspect $'\\xff'``)
reached bson or pydantic's JSON encoder and escaped as a raw ``UnicodeEncodeError`` or
``PydanticSerializationError`` from every operation. It is a typed ConfigurationError now
(as in the SQLite store), naming the operation, and the task is unchanged. Every case
failed before the fix."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mongodb_helpers import acquire_request, at, commit_request, create_request

from agentium_graph.errors import ConfigurationError
from agentium_graph.store import (
    AppendJournal,
    CancelTaskRequest,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TimelineRequest,
)
from agentium_graph_mongodb import MongoDBDurableTaskStore

BAD = "\udcff"  # what Python decodes the byte 0xff of an argument to
BLOB = "sha256:" + "0" * 64

Call = Callable[[MongoDBDurableTaskStore, int], Awaitable[Any]]
CALLS: dict[str, Call] = {
    "get_header": lambda s, f: s.get_header(BAD),
    "get_task": lambda s, f: s.get_task(BAD),
    "get_identity": lambda s, f: s.get_identity(BAD),
    "read_timeline": lambda s, f: s.read_timeline(TimelineRequest(key=BAD)),
    "list_tasks": lambda s, f: s.list_tasks(ListTasksRequest(after=BAD)),
    "get_blobs": lambda s, f: s.get_blobs([BAD]),
    "acquire_lease": lambda s, f: s.acquire_lease(acquire_request("k", worker=BAD, now=100)),
    "request_cancel": lambda s, f: s.request_cancel(
        CancelTaskRequest(key="k", reason=BAD, now=at(2))),
    "commit": lambda s, f: s.commit(commit_request(
        "k", f, [AppendJournal(kind="note")], now=2, blobs={BLOB: BAD})),
    "renew_lease": lambda s, f: s.renew_lease(RenewLeaseRequest(
        key=BAD, worker_id="w1", fence=f, ttl_seconds=30, now=at(2))),
    "release_lease": lambda s, f: s.release_lease(ReleaseLeaseRequest(
        key=BAD, worker_id="w1", fence=f, now=at(2))),
}


@pytest.mark.parametrize("op", sorted(CALLS))
async def test_text_that_is_not_unicode_is_a_configuration_error(
        store: MongoDBDurableTaskStore, op: str) -> None:
    await store.create_task(create_request("k"))
    grant = await store.acquire_lease(acquire_request("k"))
    before = await store.get_task("k")
    with pytest.raises(ConfigurationError) as info:
        await CALLS[op](store, grant.fence)
    assert info.value.details["op"] == op
    assert "not valid Unicode" in str(info.value) and "surrogate" in str(info.value)
    # Nothing changed, and the store goes on working.
    assert await store.get_task("k") == before
    assert await store.get_blobs([BLOB]) == {}
    result = await store.commit(commit_request("k", grant.fence, [AppendJournal(kind="n")],
                                               now=3))
    assert result.header.journal_seq == grant.header.journal_seq + 1
