"""The *bare executor*: the least Python that can make the durable writes W1 and W3 make.

The floor lines (one SQLite commit, one fsync) say what the disk costs. They do not say what
a target's limit leaves for code, because a node's commit is not one tiny INSERT: "node k
completed + node k+1 started" writes the output blob, two node rows, an admission row, a
journal row and the task header, and it is made from Python, on a thread the event loop
hands the work to. This module measures exactly that with nothing else: no plan, no
validation, no records, no state machine, no leases, no budgets, no recovery. Each node:

- await an ``async`` no-op tool (the bench's tools are the same);
- canonical JSON and sha256 of its output, parsed back for the successor;
- build the rows as small dicts encoded with ``json``;
- hand one write transaction to a worker thread (``SimpleQueue`` in, the loop's
  ``call_soon_threadsafe`` back, as ``SQLiteDurableTaskStore`` does): ``BEGIN IMMEDIATE``,
  read the header, ``INSERT OR IGNORE`` the blob, ``UPDATE`` two node rows, ``INSERT`` an
  admission and a journal row, ``UPDATE`` the header (and its status index when the status
  changes), ``COMMIT``; a create inserts the task, its identity, its node rows, an admission
  and a journal row. Tables (the store's own DDL) and row sizes are the SQLite store's
  (constant-size node rows, an append-only journal); its checkpoint thread is left out.

``memory``: the same Python with the write transaction replaced by appending the rows to
dicts and lists on the loop's thread: what a node costs before any store or runtime.

A real runtime does strictly more per node, so a limit the bare executor misses on this
machine cannot be met here by any implementation that keeps one durable commit per node
(W3: seven per task: create, then the lease and one per node). Like every timing of the
bench, read it next to the floor lines of the same run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import queue
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode

Rows = dict[str, Any]
# Node rows keep a constant size while their record grows (zero-filled slack, as the SQLite
# store does), so an update rewrites one page instead of rebalancing the leaf.
_SLOT = 900
# Rows are padded to the sizes the SQLite store writes for these workloads (measured on a
# W3 task: identity 1.75 KB, header 0.65 KB, node records up to 0.75 KB, about 0.3 KB per
# journal entry), so the bare executor writes as many bytes and pages, not only as many rows.
_PAD = {"identity": 1650, "header": 500, "node": 550, "entry": 180}


async def _tool(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": args["x"] + 1}


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class _SQLite:
    """One connection used only by one worker thread; the loop hands it whole transactions."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        # The SQLite store's own tables and indexes, so the layout cannot drift from it.
        from agentium_graph_sqlite._schema import _DDL

        for statement in _DDL:
            self.conn.execute(statement)
        self.jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.commits = 0  # write transactions handed to the thread
        self.thread = threading.Thread(target=self._serve, name="bare-sqlite", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            loop, future, fn, rows = job
            try:
                fn(rows)
            except BaseException as exc:  # handed back to the awaiting coroutine
                loop.call_soon_threadsafe(future.set_exception, exc)
            else:
                loop.call_soon_threadsafe(future.set_result, None)

    async def write(self, fn: Callable[[Rows], None], rows: Rows) -> None:
        self.commits += 1
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.jobs.put((loop, future, fn, rows))
        await future

    def create(self, rows: Rows) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO tasks (key, status, header) VALUES (?, 'pending', ?)",
                  (rows["key"], rows["header"]))
        c.execute("INSERT INTO identities (key, identity) VALUES (?, ?)",
                  (rows["key"], rows["identity"]))
        c.execute("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, '{}')",
                  (rows["key"], "create"))
        c.executemany("INSERT INTO nodes (key, node_id, record, slack) "
                      "VALUES (?, ?, ?, zeroblob(?))",
                      [(*row, _SLOT - len(row[2])) for row in rows["nodes"]])
        c.execute("INSERT INTO journal (key, seq, entries) VALUES (?, ?, ?)", rows["journal"])
        c.execute("COMMIT")

    def commit(self, rows: Rows) -> None:
        c = self.conn
        key = rows["key"]
        c.execute("BEGIN IMMEDIATE")
        try:
            stored = c.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone()
            if json.loads(stored[0])["fence"] != rows["fence"]:
                raise RuntimeError(f"task {key}: stale fence")
            if rows["blob"] is not None:
                c.execute("INSERT OR IGNORE INTO blobs (digest, body) VALUES (?, ?)",
                          rows["blob"])
            for node_id, record in rows["nodes"]:
                c.execute("UPDATE nodes SET record = ?, slack = zeroblob(?) "
                          "WHERE key = ? AND node_id = ?",
                          (record, _SLOT - len(record), key, node_id))
            if rows["admission"] is not None:
                c.execute("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, ?)",
                          (key, rows["admission"], '{"tool_calls":1,"work_attempts":1}'))
            c.execute("INSERT INTO journal (key, seq, entries) VALUES (?, ?, ?)",
                      (key, rows["seq"], rows["entries"]))
            if rows["status"] is None:
                c.execute("UPDATE tasks SET header = ? WHERE key = ?", (rows["header"], key))
            else:  # a new status: its index entry moves too
                c.execute("UPDATE tasks SET status = ?, header = ? WHERE key = ?",
                          (rows["status"], rows["header"], key))
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        self.conn.close()


class _Memory:
    """The same rows kept in dicts on the loop's thread: no store, no isolation."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.nodes: dict[tuple[str, str], str] = {}
        self.journal: list[str] = []
        self.blobs: dict[str, str] = {}
        self.commits = 0

    async def write(self, fn: Callable[[Rows], None], rows: Rows) -> None:
        self.commits += 1
        fn(rows)

    def create(self, rows: Rows) -> None:
        self.headers[rows["key"]] = rows["header"]
        for key, node_id, record in rows["nodes"]:
            self.nodes[key, node_id] = record
        self.journal.append(rows["journal"][2])

    def commit(self, rows: Rows) -> None:
        key = rows["key"]
        if json.loads(self.headers[key])["fence"] != rows["fence"]:
            raise RuntimeError(f"task {key}: stale fence")
        if rows["blob"] is not None:
            self.blobs.setdefault(*rows["blob"])
        for node_id, record in rows["nodes"]:
            self.nodes[key, node_id] = record
        self.journal.append(rows["entries"])
        self.headers[key] = rows["header"]

    def close(self) -> None:
        return None


async def _create(store: _SQLite | _Memory, key: str, length: int) -> dict[str, Any]:
    """Create a chain task of ``length`` nodes; returns its header."""
    now = time.time()
    header: dict[str, Any] = {"key": key, "fence": 1, "seq": 0, "journal_seq": 1,
                              "status": "pending", "counters": {"work_attempts": 0},
                              "pad": "h" * _PAD["header"]}
    identity = _encode({"key": key, "nodes": [f"n{i}" for i in range(length)],
                        "pad": "i" * _PAD["identity"]})
    created = [{"seq": 1, "kind": "task_created", "at": now, "pad": "e" * _PAD["entry"]}]
    await store.write(store.create, {
        "key": key, "header": _encode(header), "identity": identity,
        "nodes": [(key, f"n{i}", _encode({"state": "pending", "pad": "n" * _PAD["node"]}))
                  for i in range(length)],
        "journal": (key, 1, _encode(created))})
    return header


async def _run(store: _SQLite | _Memory, key: str, length: int,
               header: dict[str, Any]) -> int:
    """Run the created chain ``key``; returns the last node's output value."""
    value: dict[str, Any] = {"x": 0}
    previous: tuple[str, str] | None = None  # (node id, output digest) to complete
    for i in range(length + 1):
        now = time.time()
        seq = header["journal_seq"]
        entries: list[dict[str, Any]] = []
        nodes: list[tuple[str, str]] = []
        blob: tuple[str, str] | None = None
        if previous is not None:
            node_id, digest = previous
            entries.append({"seq": seq + 1, "kind": "node_completed", "node_id": node_id,
                            "output_digest": digest, "at": now, "pad": "e" * _PAD["entry"]})
            nodes.append((node_id, _encode({"state": "completed", "output_digest": digest,
                                            "updated_at": now, "pad": "n" * _PAD["node"]})))
        admission = None
        if i < length:
            attempt = _sha(_encode(["att", key, i, 1]))
            admission = _sha(_encode(["adm", attempt, "work"]))
            entries.append({"seq": seq + len(entries) + 1, "kind": "attempt_started",
                            "node_id": f"n{i}", "attempt_id": attempt, "at": now,
                            "pad": "e" * _PAD["entry"]})
            nodes.append((f"n{i}", _encode({"state": "running", "attempts": [
                {"number": 1, "attempt_id": attempt, "fence": 1, "started_at": now}],
                "pad": "n" * _PAD["node"]})))
            header["counters"]["work_attempts"] += 1
        if previous is not None:
            output = _encode(value)
            blob = (previous[1], output)
        status = "running" if i < length else "completed"
        changed = None if status == header["status"] else status
        header.update(seq=header["seq"] + 1, journal_seq=seq + len(entries), status=status)
        await store.write(store.commit, {
            "key": key, "fence": 1, "blob": blob, "nodes": nodes, "admission": admission,
            "seq": seq + len(entries), "entries": _encode(entries),
            "header": _encode(header), "status": changed})
        if i == length:
            break
        result = await _tool({"x": value["x"] if "x" in value else value["value"]})
        text = _encode(result)
        value = json.loads(text)  # what the successor sees: the journaled copy
        previous = (f"n{i}", _sha(text))
    return int(value["value"])


def measure(kind: str, directory: Path, *, chains: int = 7, length: int = 100,
            tasks: int = 200, task_length: int = 5) -> dict[str, Any]:
    """W1 (``chains`` chains of ``length`` nodes: median ms per node) and W3 (``tasks``
    chains of ``task_length``, create + run each: tasks per second) on ``kind``:
    ``memory``, ``sqlite`` (``synchronous=FULL``) or ``sqlite-normal``."""
    directory.mkdir(parents=True, exist_ok=True)
    store: _SQLite | _Memory = _Memory() if kind == "memory" else _SQLite(
        directory / "bare.db", "NORMAL" if kind == "sqlite-normal" else "FULL")
    try:
        per_node, w3, commits = asyncio.run(_timed(store, chains, length, tasks, task_length))
    finally:
        store.close()
    return {"name": f"bare_executor_{kind.replace('-', '_')}", "store": kind,
            "w1_per_node_ms": round(statistics.median(per_node), 4),
            "w1_per_node_ms_min": round(min(per_node), 4),
            "w3_tasks_per_s": round(w3, 1),
            "w1_commits_per_node": round(commits[0] / (chains * length), 3),
            "w3_commits_per_task": round(commits[1] / tasks, 3),
            "detail": "the least Python making W1's and W3's durable writes: no runtime, "
                      "no validation, no records (bench/_bare.py)"}


async def _timed(store: _SQLite | _Memory, chains: int, length: int, tasks: int,
                 task_length: int) -> tuple[list[float], float, tuple[int, int]]:
    """W1's per-node times, W3's tasks per second, and the commits each made (W1's runs
    only, W3's creates and runs)."""
    for i in range(3):
        await _run(store, f"warmup-{i}", 5, await _create(store, f"warmup-{i}", 5))
    per_node: list[float] = []
    w1_commits = 0
    for c in range(chains):  # like W1: create apart, the run timed
        header = await _create(store, f"w1-{c}", length)
        before = store.commits
        t0 = time.perf_counter()
        last = await _run(store, f"w1-{c}", length, header)
        per_node.append((time.perf_counter() - t0) / length * 1000)
        if last != length:
            raise AssertionError(f"bare executor: chain ended at {last}, not {length}")
        w1_commits += store.commits - before
    before = store.commits
    t0 = time.perf_counter()
    for t in range(tasks):  # like W3: create + run, one task after another
        await _run(store, f"w3-{t}", task_length, await _create(store, f"w3-{t}", task_length))
    w3 = tasks / (time.perf_counter() - t0)
    return per_node, w3, (w1_commits, store.commits - before)
