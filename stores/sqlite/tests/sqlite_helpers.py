"""Request builders and file rewrites shared by the SQLite store tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agentium_graph._canonical import digest
from agentium_graph.store import (
    COUNTERS,
    AcquireLeaseRequest,
    CommitRequest,
    CreateTaskRequest,
    JournalEntry,
    NodeRecord,
    Step,
    TaskHeader,
    TaskIdentity,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def create_request(key: str, nodes: Iterable[str] = ("a", "b"), *, input_value: int = 1,
                   limits: dict[str, int | None] | None = None) -> CreateTaskRequest:
    node_ids = tuple(nodes)
    identity = TaskIdentity(
        key=key, catalog_digest="sha256:catalog", program={"id": "p", "version": "1"},
        plan={"nodes": list(node_ids)}, descriptors={}, input={"x": input_value},
        input_digest=digest({"x": input_value}), policy_revision="1", grants=None,
        budgets={}, root_limits={}, plan_limits={}, deadline=None)
    counters = dict.fromkeys(COUNTERS, 0)
    counters["expanded_nodes"] = len(node_ids)
    header = TaskHeader(
        key=key, task_id=f"task_{key}", identity_digest=digest(identity.model_dump(mode="json")),
        created_at=T0, updated_at=T0, counters=counters,
        limits=limits if limits is not None else {"work_attempts": 10, "tool_calls": 10},
        journal_seq=1)
    records = tuple(
        NodeRecord(node_id=n, incarnation_id=f"inc_{key}_{n}", kind="tool", binding="t",
                   version="1", revision=1, deps=(node_ids[i - 1],) if i else ())
        for i, n in enumerate(node_ids))
    return CreateTaskRequest(header=header, identity=identity, nodes=records,
                             admission_id=f"adm_{key}_create")


def acquire_request(key: str, worker: str = "w1", now: float = 0.0,
                    ttl: float = 10.0) -> AcquireLeaseRequest:
    return AcquireLeaseRequest(key=key, worker_id=worker, ttl_seconds=ttl, now=at(now))


def commit_request(key: str, fence: int, steps: Iterable[Step], *, worker: str = "w1",
                   now: float = 1.0, blobs: dict[str, str] | None = None) -> CommitRequest:
    return CommitRequest(key=key, worker_id=worker, fence=fence, now=at(now),
                         steps=tuple(steps), blobs=blobs or {})


# Schema version 1's nodes and journal tables.
_V1_NODES = ("CREATE TABLE nodes (key TEXT NOT NULL, node_id TEXT NOT NULL, "
             "record TEXT NOT NULL, PRIMARY KEY (key, node_id)) WITHOUT ROWID")
_V1_JOURNAL = ("CREATE TABLE journal (key TEXT NOT NULL, seq INTEGER NOT NULL, "
               "entry TEXT NOT NULL, PRIMARY KEY (key, seq)) WITHOUT ROWID")


def rewrite_as_version_1(path: Path, entries: dict[str, list[JournalEntry]]) -> None:
    """What a version 1 store left behind: the same data, one journal row per entry."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("DROP TABLE journal")
    conn.execute(_V1_JOURNAL)
    conn.executemany("INSERT INTO journal (key, seq, entry) VALUES (?, ?, ?)",
                     [(key, e.seq, e.model_dump_json()) for key, es in entries.items()
                      for e in es])
    conn.execute(_V1_NODES.replace("nodes", "nodes_v1", 1))
    conn.execute("INSERT INTO nodes_v1 SELECT key, node_id, record FROM nodes")
    conn.execute("DROP TABLE nodes")
    conn.execute("ALTER TABLE nodes_v1 RENAME TO nodes")
    conn.execute("UPDATE meta SET value = '1' WHERE name = 'schema_version'")
    conn.execute("PRAGMA user_version = 0")  # version 1 set none
    conn.execute("COMMIT")
    conn.close()
