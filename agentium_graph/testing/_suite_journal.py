"""Conformance: the journal (timeline) is append-only, gap-free and pages exactly."""

from __future__ import annotations

from datetime import timedelta

from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import JournalEntry
from agentium_graph.store._requests import (
    AppendJournal,
    CancelTaskRequest,
    Charge,
    SettleNode,
    StartAttempt,
    TimelineRequest,
)
from agentium_graph.testing._base import KEY, W1, W2, SuiteBase
from agentium_graph.testing._fixtures import T0, acquire, commit, read_timeline


class JournalTests(SuiteBase):
    """read_timeline: strictly increasing seq from 1, stable content, exact paging."""

    async def busy_task(self, store: DurableTaskStore, key: str = KEY) -> list[JournalEntry]:
        """A task with a journal of a few dozen entries from every kind of write."""
        fence = await self.leased(store, key, nodes=4, deps="none", ttl=5)
        written: list[JournalEntry] = []
        for i in range(4):
            node = f"n{i}"
            result = await commit(
                store, key, W1, fence,
                StartAttempt(node_id=node, attempt_id=f"a{i}", admission_id=f"adm-{i}",
                             charges={"work_attempts": 1}),
                AppendJournal(kind="note", node_id=node, data={"i": i, "nested": {"x": [i]}}),
                now=T0 + timedelta(seconds=i))
            written.extend(result.journal)
        await store.request_cancel(CancelTaskRequest(key=key, reason="r", now=T0))
        fence = await acquire(store, key, W2, now=T0 + timedelta(seconds=10))
        result = await commit(store, key, W2, fence, Charge(admission_id="late", charges={}),
                              SettleNode(node_id="n3", state="canceled"),
                              now=T0 + timedelta(seconds=11))
        written.extend(result.journal)
        return written

    async def test_seq_is_strictly_increasing_without_gaps(
            self, store: DurableTaskStore) -> None:
        written = await self.busy_task(store)
        timeline = await read_timeline(store, KEY)
        assert [e.seq for e in timeline] == list(range(1, len(timeline) + 1))
        header = await store.get_header(KEY)
        assert header is not None and header.journal_seq == timeline[-1].seq
        # What commits returned is exactly what the journal holds, in the same order.
        by_seq = {e.seq: e for e in timeline}
        assert [by_seq[e.seq] for e in written] == written
        assert [e.kind for e in timeline].count("lease_acquired") == 2
        assert all(e.at.tzinfo is not None for e in timeline)

    async def test_entries_keep_their_data(self, store: DurableTaskStore) -> None:
        await self.busy_task(store)
        notes = [e for e in await read_timeline(store, KEY) if e.kind == "note"]
        assert [(e.node_id, e.data, e.fence) for e in notes] == [
            (f"n{i}", {"i": i, "nested": {"x": [i]}}, 1) for i in range(4)]
        assert [e.at for e in notes] == [T0 + timedelta(seconds=i) for i in range(4)]

    async def test_appended_data_may_use_any_key(self, store: DurableTaskStore) -> None:
        # The data of an appended entry is the caller's: keys that name an entry's own
        # fields ("kind", "node_id", "seq", ...) are data like any other.
        fence = await self.leased(store, KEY, nodes=1, deps="none")
        data = {"kind": "mine", "node_id": "elsewhere", "seq": -1, "fence": 0, "data": [1]}
        result = await commit(store, KEY, W1, fence,
                              AppendJournal(kind="note", node_id="n0", data=data))
        (entry,) = [e for e in result.journal if e.kind == "note"]
        assert (entry.node_id, entry.data, entry.fence) == ("n0", data, fence)
        (stored,) = [e for e in await read_timeline(store, KEY) if e.kind == "note"]
        assert stored == entry

    async def test_paging_reconstructs_the_journal_exactly(
            self, store: DurableTaskStore) -> None:
        await self.busy_task(store)
        whole = await store.read_timeline(TimelineRequest(key=KEY, limit=1000))
        assert len(whole) > 10
        for limit in (1, 2, 3, 7, len(whole), len(whole) + 1):
            paged: list[JournalEntry] = []
            while True:
                page = await store.read_timeline(TimelineRequest(
                    key=KEY, after_seq=paged[-1].seq if paged else 0, limit=limit))
                assert len(page) <= limit
                paged.extend(page)
                if len(page) < limit:
                    break
            assert paged == whole, f"limit={limit}"
        middle = whole[4].seq
        assert await store.read_timeline(TimelineRequest(key=KEY, after_seq=middle,
                                                         limit=3)) == whole[5:8]
        assert await store.read_timeline(TimelineRequest(
            key=KEY, after_seq=whole[-1].seq)) == []
        assert await store.read_timeline(TimelineRequest(
            key=KEY, after_seq=whole[-1].seq + 50)) == []

    async def test_timelines_of_two_tasks_are_independent(
            self, store: DurableTaskStore) -> None:
        await self.busy_task(store, "task-a")
        await self.create(store, "task-b")
        b = await read_timeline(store, "task-b")
        assert [(e.seq, e.kind) for e in b] == [(1, "task_created")]
        a = await read_timeline(store, "task-a")
        assert [e.seq for e in a] == list(range(1, len(a) + 1))
