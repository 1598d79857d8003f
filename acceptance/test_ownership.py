"""Ownership races with real processes: one executor, stale pauses, expiry takeover."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from typing import Any

from acceptance._graph import EXPECTED
from acceptance.conftest import Case
from agentium_graph import DurableTaskStore
from agentium_graph.store import JournalEntry, TimelineRequest


async def timeline(store: DurableTaskStore, key: str) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    while page := await store.read_timeline(TimelineRequest(
            key=key, after_seq=entries[-1].seq if entries else 0, limit=500)):
        entries.extend(page)
    return entries


async def completions(store: DurableTaskStore, key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in await timeline(store, key):
        if entry.kind == "node_completed" and entry.node_id:
            counts[entry.node_id] = counts.get(entry.node_id, 0) + 1
    return counts


def pause_and_take_over(case: Case, **slow_worker: Any) -> dict[str, Any]:
    """Start a worker that creates the task, SIGSTOP it once b started, let a fresh worker
    wait out its lease and finish the task, SIGCONT it: what the paused worker returned,
    which must be its StaleFenceError (fence 1, the store's 2)."""
    lease_ttl = slow_worker["lease_ttl"]
    paused = case.start(create=True, worker="slow", **slow_worker)
    wait_for(lambda: case.starts("b") == 1)
    stop_outside_a_write(paused, case)
    try:
        # The fresh worker waits until the paused worker's lease expires, then takes over.
        code, out, err = case.run(worker="fresh", wait=True, lease_ttl=lease_ttl)
        assert code == 0 and out is not None and out["ok"], (out, err)
        assert {n: v["value"] for n, v in out["output"].items()} == EXPECTED
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    stdout, _ = paused.communicate(timeout=60)
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    assert result["ok"] is False and result["error"] == "StaleFenceError"
    assert result["details"]["fence"] == 1 and result["details"]["current"] == 2
    return result


def wait_for(predicate: object, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def stop_outside_a_write(worker: subprocess.Popen[str], case: Case) -> None:
    """SIGSTOP ``worker``, but not inside a SQLite write transaction (a lease renewal every
    0.2 s): a process stopped there keeps the file's write lock, and no other worker can
    write until it runs again. That is SQLite, not a lease that outlives its owner, so the
    pause is retaken a moment later (this happened in 1.6 % of random stops)."""
    path = case.spec["kwargs"].get("path") if "sqlite" in case.spec["factory"] else None
    for _ in range(200):
        os.kill(worker.pid, signal.SIGSTOP)
        if path is None:
            return
        probe = sqlite3.connect(path, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:  # locked: the worker is inside a write
            os.kill(worker.pid, signal.SIGCONT)
            time.sleep(0.01)
        finally:
            probe.close()
    raise AssertionError("the worker was inside a write each time it was paused")


async def test_concurrent_runs_on_a_fresh_task(case: Case, store_of: DurableTaskStore) -> None:
    code, out, err = case.run(create=True, create_only=True)
    assert code == 0 and out == {"ok": True, "created": True}, err
    # Both start at once; b's 4 s keep the winner's lease held long enough that the other
    # meets it even when a loaded machine starts its process seconds late (with 0.5 s the
    # late one could find the task completed and return its result, running nothing).
    procs = [case.start(worker=w, slow={"b": 4.0}) for w in ("x", "y")]
    parsed = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        parsed.append(json.loads(stdout.strip().splitlines()[-1]))
    winners = [p for p in parsed if p["ok"]]
    assert len(winners) == 1, parsed
    assert [p["error"] for p in parsed if not p["ok"]] == ["LeaseHeldError"]
    assert all(case.starts(n) == 1 for n in EXPECTED)
    assert set((await completions(store_of, case.key)).values()) == {1}


async def test_paused_worker_is_fenced_out_after_takeover(case: Case,
                                                          store_of: DurableTaskStore) -> None:
    pause_and_take_over(case, slow={"b": 3.0}, lease_ttl=1.0, poll_interval=0.2)
    counts = await completions(store_of, case.key)
    assert counts == dict.fromkeys(EXPECTED, 1)  # no duplicate completion
    snap = await store_of.get_task(case.key)
    assert snap is not None and snap.header.status == "completed"
    fences = [a.fence for a in snap.nodes["b"].attempts]
    assert fences == [1, 2] and snap.nodes["b"].attempts[0].outcome == "interrupted"


async def test_a_paused_workers_late_completion_is_refused(case: Case,
                                                          store_of: DurableTaskStore) -> None:
    """(Review 54) Above, the paused worker's first write after SIGCONT is a renewal. Here
    its tool is due before its next renewal, so the write refused is b's completion, made
    after the fresh worker completed b: it must not land."""
    pause_and_take_over(case, slow={"b": 1.0}, lease_ttl=3.0, poll_interval=2.5)
    # The stale tool finished (its completion was what it tried to write), yet b has one
    # completion, the fresh worker's.
    finishes = [e for e in case.log.entries() if e["node"] == "b" and e["event"] == "finish"]
    assert len(finishes) == 2
    assert await completions(store_of, case.key) == dict.fromkeys(EXPECTED, 1)
    snap = await store_of.get_task(case.key)
    assert snap is not None and [a.fence for a in snap.nodes["b"].attempts] == [1, 2]
    taken = False
    for entry in await timeline(store_of, case.key):  # nothing under fence 1 after takeover
        taken = taken or (entry.kind == "lease_acquired" and entry.fence == 2)
        assert not taken or entry.fence in (2, None), entry
    assert taken
