"""Conformance: several handles, durability across reopen, and two racing processes.

Durability tests run only when ``capabilities.durable`` is True and the two-process tests
only when ``capabilities.multi_process`` is True; otherwise they are *skipped* with that
reason, never counted as passing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentium_graph._canonical import digest_text
from agentium_graph.errors import LeaseHeldError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import JournalEntry
from agentium_graph.store._requests import (
    CancelTaskRequest,
    Charge,
    ClaimNode,
    ListTasksRequest,
    RecordAction,
    SetStatus,
    SettleNode,
    StartAttempt,
    StoreCapabilities,
)
from agentium_graph.testing._base import (
    KEY,
    W1,
    W2,
    SuiteBase,
    rejected,
    require_durable,
    require_multi_process,
)
from agentium_graph.testing._child import CHILD_CODE
from agentium_graph.testing._fixtures import (
    T0,
    acquire,
    action_record,
    capture,
    commit,
    read_timeline,
)
from agentium_graph.testing._harness import StoreHarness, open_from_factory

CHILD_TIMEOUT = 60.0


class HandleTests(SuiteBase):
    """Two handles on the same data (opened through the harness) see one store."""

    async def test_a_second_handle_sees_every_write_at_once(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        other = await harness.open()
        await self.create(store)
        assert await other.get_header(KEY) == await store.get_header(KEY)
        fence = await acquire(other, KEY, W1)
        await commit(other, KEY, W1, fence, ClaimNode(node_id="n0"))
        assert await capture(store, KEY) == await capture(other, KEY)
        await rejected(store, KEY, LeaseHeldError, acquire(store, KEY, W2))

    async def test_two_handles_race_for_one_lease(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        other = await harness.open()
        await self.create(store)
        results = await asyncio.gather(
            *(acquire(store if i % 2 else other, KEY, f"w{i}") for i in range(10)),
            return_exceptions=True)
        assert sum(isinstance(r, int) for r in results) == 1, results
        assert all(isinstance(r, int | LeaseHeldError) for r in results)


class LifecycleTests(SuiteBase):
    """Capabilities, construction without I/O, async context managers, idempotent close."""

    async def test_capabilities_are_declared(self, store: DurableTaskStore) -> None:
        capabilities = store.capabilities
        assert isinstance(capabilities, StoreCapabilities)
        assert capabilities.name
        assert store.capabilities == capabilities

    async def test_a_store_is_an_async_context_manager_with_idempotent_close(
            self, harness: StoreHarness) -> None:
        handle = await harness.open()
        async with handle as entered:
            assert await entered.get_header(KEY) is None
            await self.create(entered)
        await handle.close()  # closing twice is harmless (the harness closes it again)

    async def test_the_factory_builds_a_store_without_using_it(
            self, harness: StoreHarness) -> None:
        unused = await open_from_factory(harness.factory, harness.factory_kwargs)
        assert isinstance(unused.capabilities, StoreCapabilities)  # known before any I/O
        await unused.close()  # closing a store that never opened anything works,
        await unused.close()  # and closing twice is allowed


class DurabilityTests(SuiteBase):
    """Everything a durable store acknowledged is there after a reopen."""

    async def write_everything(self, store: DurableTaskStore) -> dict[str, str]:
        blobs = {digest_text(t): t for t in ('{"out":1}', '{"out":2}', '{"plan":3}')}
        texts = list(blobs.items())
        await self.create(store, "done", nodes=1, blobs=dict(texts[:1]))
        fence = await acquire(store, "done", W1)
        await commit(store, "done", W1, fence,
                     StartAttempt(node_id="n0", attempt_id="a", admission_id="adm-d",
                                  charges={"tool_calls": 1}),
                     SettleNode(node_id="n0", state="completed", output_digest=texts[0][0]),
                     SetStatus(status="completed", release_lease=True), blobs=dict(texts[1:2]))
        fence = await self.leased(store, KEY, ttl=60, limits={"tool_calls": 5},
                                  input={"deep": [1, {"x": "y"}]},
                                  deadline=T0 + timedelta(hours=2))
        await commit(store, KEY, W1, fence, StartAttempt(
            node_id="n0", attempt_id="a0", admission_id="adm-0", charges={"tool_calls": 2}),
            RecordAction(action=action_record("act", "n0", fence=fence)),
            blobs=dict(texts[2:]))
        await store.request_cancel(CancelTaskRequest(key=KEY, reason="stop", now=T0))
        return blobs

    async def test_acknowledged_writes_survive_reopen(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        require_durable(store)
        blobs = await self.write_everything(store)
        states = {key: await capture(store, key) for key in (KEY, "done")}
        listed = await store.list_tasks(ListTasksRequest())
        reopened = await harness.reopen()
        assert {key: await capture(reopened, key) for key in (KEY, "done")} == states
        assert await reopened.list_tasks(ListTasksRequest()) == listed
        assert await reopened.get_blobs(list(blobs)) == blobs
        # Leases, fences and admission ids survive too.
        header = states[KEY].snapshot
        assert header is not None
        fence = header.header.fence
        await rejected(reopened, KEY, LeaseHeldError, acquire(reopened, KEY, W2))
        result = await commit(reopened, KEY, W1, fence,
                              Charge(admission_id="adm-0", charges={"tool_calls": 2}))
        assert result.already_charged == ("adm-0",)
        assert await acquire(reopened, KEY, W1) == fence + 1

    async def test_every_acknowledged_commit_survives_repeated_reopens(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        require_durable(store)
        fence = await self.leased(store)
        current = store
        for i in range(3):
            await commit(current, KEY, W1, fence,
                         Charge(admission_id=f"adm-{i}", charges={"tool_calls": 1}))
            before = await capture(current, KEY)
            current = await harness.reopen()
            assert await capture(current, KEY) == before
            assert before.snapshot is not None
            assert before.snapshot.header.counters["tool_calls"] == i + 1


def _child_env() -> dict[str, str]:
    """The parent's import path, so a child can import whatever the harness names."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


async def run_children(harness: StoreHarness,
                       configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start one child per config, release them together, and return their reports."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with asyncio.timeout(CHILD_TIMEOUT):
            for config in configs:
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-c", CHILD_CODE, json.dumps(
                        {**config, "factory": harness.factory,
                         "factory_kwargs": harness.factory_kwargs}),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=_child_env()))
            for proc in procs:
                assert proc.stdout is not None
                line = await proc.stdout.readline()
                if line.strip() != b"ready":
                    _, err = await proc.communicate()
                    pytest.fail(f"a child of {harness!r} failed to open the store:\n"
                                f"{err.decode(errors='replace')}")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
                proc.stdin.close()
            outputs = await asyncio.gather(*(proc.communicate() for proc in procs))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    reports = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            pytest.fail(f"a child of {harness!r} exited {proc.returncode}:\n"
                        f"{err.decode(errors='replace')}")
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    return reports


def _check_grants(grants: list[dict[str, Any]], journal: list[JournalEntry],
                  final_fence: int) -> None:
    """Fences are unique and gap-free, and a takeover never happened before expiry."""
    ordered = sorted(grants, key=lambda g: int(g["fence"]))
    assert [g["fence"] for g in ordered] == list(range(1, final_fence + 1)), ordered
    for prev, nxt in itertools.pairwise(ordered):
        if prev["worker"] != nxt["worker"]:
            assert datetime.fromisoformat(nxt["now"]) >= datetime.fromisoformat(
                prev["expires_at"]), f"two holders at once: {prev} and {nxt}"
    leases = [e for e in journal if e.kind == "lease_acquired"]
    assert [(e.fence, e.data.get("worker_id")) for e in leases] == [
        (g["fence"], g["worker"]) for g in ordered]


class MultiProcessTests(SuiteBase):
    """Two OS processes open the store through the harness factory and race on one task."""

    async def test_the_factory_opens_the_same_data(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        require_multi_process(store)
        await self.create(store)
        other = await open_from_factory(harness.factory, harness.factory_kwargs)
        try:
            assert await capture(other, KEY) == await capture(store, KEY)
            assert other.capabilities == store.capabilities
        finally:
            await other.close()

    async def test_two_processes_race_for_the_lease(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        require_multi_process(store)
        await self.create(store)
        rounds = 10
        reports = await run_children(harness, [
            {"scenario": "lease_race", "key": KEY, "worker": worker, "ttl": 0.03,
             "rounds": rounds} for worker in (W1, W2)])
        grants = [g for r in reports for g in r["grants"]]
        header = await store.get_header(KEY)
        assert header is not None
        _check_grants(grants, await read_timeline(store, KEY), header.fence)
        assert len(grants) == header.fence == 2 * rounds
        assert sum(r["held"] for r in reports) > 0, "the children never contended"

    async def test_two_processes_race_fenced_charges(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        require_multi_process(store)
        limit = 4
        await self.create(store, limits={"tool_calls": limit})
        reports = await run_children(harness, [
            {"scenario": "charge_race", "key": KEY, "worker": worker, "ttl": 0.1,
             "rounds": 5, "counter": "tool_calls"} for worker in (W1, W2)])
        outcomes = [o for r in reports for o in r["outcomes"]]
        header = await store.get_header(KEY)
        assert header is not None
        journal = await read_timeline(store, KEY)
        _check_grants([g for r in reports for g in r["grants"]], journal, header.fence)
        kinds = Counter(o["outcome"] for o in outcomes)
        charged = [o["admission"] for o in outcomes if o["outcome"] == "charged"]
        # Every admission id is charged at most once across both processes, and the
        # persisted counter is exactly the number of charges: never above the limit.
        assert len(charged) == len(set(charged)), charged
        assert header.counters["tool_calls"] == len(charged) <= limit
        assert kinds["exhausted"] > 0 and len(charged) == limit, kinds
        assert kinds["stale"] > 0, f"no commit was ever fenced out: {kinds}"
        in_journal = [str(e.data.get("admission_id")) for e in journal
                      if e.kind == "admission_charged"]
        assert sorted(in_journal) == sorted(charged)
        # Every applied charge was made under the lease current at that point.
        current = 0
        for entry in journal:
            if entry.kind == "lease_acquired":
                assert entry.fence is not None
                current = entry.fence
            elif entry.kind == "admission_charged":
                assert entry.fence == current, f"a write under a superseded fence: {entry}"
