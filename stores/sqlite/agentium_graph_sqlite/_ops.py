"""The store's operations as plain functions on one connection, run on the worker thread.

Each mutating operation is one ``BEGIN IMMEDIATE`` transaction: it reads the header row and
only the rows :func:`~agentium_graph.store.needs` names, lets the shared state machine decide,
and writes blobs first (insert-if-absent), then changed rows, journal rows and the header.
Holding the write lock across that read-modify-write is what keeps fencing exact across
connections and processes. The transition rules themselves live in
:mod:`agentium_graph.store._transitions`; nothing here re-implements them.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import TypeAdapter

from agentium_graph.errors import TaskNotFoundError
from agentium_graph.store._records import (
    ActionRecord,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TimelineRequest,
)
from agentium_graph.store._transitions import (
    Delta,
    Needs,
    acquire_with_steps,
    apply_commit,
    creation_entry,
    identity_conflict,
    lease_expiry,
    needs,
    release_lease,
    renew_lease,
    request_cancel,
)

T = TypeVar("T")
R = TypeVar("R")
_ENTRIES = TypeAdapter(list[JournalEntry])  # a journal row: one commit's entries
# A node row's record plus slack: above a completed single-attempt record (~750 bytes) and
# below SQLite's largest in-page payload for 4 KiB pages (~1000 bytes, beyond which a row
# spills to overflow pages). Bigger records (many attempts, long errors) just grow.
NODE_SLOT = 900
_CHUNK = 500  # bound on "?" placeholders per IN (...) list


class Writer:
    """Collects one transaction's writes so they can be counted (bytes) and batched."""

    __slots__ = ("bytes", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.bytes = 0

    def many(self, sql: str, rows: Sequence[tuple[str | int, ...]], *,
             text_columns: slice | int = slice(1, None)) -> None:
        """Execute ``sql`` for every row. Payload bytes are counted over ``text_columns``:
        by default every column after the key; an int ``n`` means the first ``n``."""
        if not rows:
            return
        part = slice(0, text_columns) if isinstance(text_columns, int) else text_columns
        for row in rows:
            self.bytes += sum(len(v.encode()) for v in row[part] if isinstance(v, str))
        if len(rows) == 1:
            self.conn.execute(sql, rows[0])
        else:
            self.conn.executemany(sql, rows)

    def header(self, header: TaskHeader, previous: TaskHeader) -> None:
        text = header.model_dump_json()
        self.bytes += len(text.encode())
        # Naming status in SET rewrites its index entry even when unchanged: a page per commit.
        if header.status == previous.status:
            self.conn.execute("UPDATE tasks SET header = ? WHERE key = ?", (text, header.key))
        else:
            self.conn.execute("UPDATE tasks SET status = ?, header = ? WHERE key = ?",
                              (header.status, text, header.key))

    def blobs(self, blobs: dict[str, str]) -> None:
        self.many("INSERT OR IGNORE INTO blobs (digest, body) VALUES (?, ?)",
                  list(blobs.items()))

    def journal(self, key: str, entries: Sequence[JournalEntry]) -> None:
        """One row for all of a commit's entries, keyed by the last entry's seq."""
        if entries:
            self.many("INSERT INTO journal (key, seq, entries) VALUES (?, ?, ?)",
                      [(key, entries[-1].seq, _ENTRIES.dump_json(list(entries)).decode())])


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    """What a write transaction returns: its result and whether (and how much) it wrote."""

    result: R
    wrote: bool
    bytes: int


def write_txn(conn: sqlite3.Connection,
              body: Callable[[Writer], tuple[T, bool]]) -> Outcome[T]:
    """Run ``body`` inside ``BEGIN IMMEDIATE``; commit if it wrote, else roll back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        writer = Writer(conn)
        result, wrote = body(writer)
        conn.execute("COMMIT" if wrote else "ROLLBACK")
    except BaseException:
        _rollback(conn)
        raise
    return Outcome(result, wrote, writer.bytes if wrote else 0)


def read_txn(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run several reads against one consistent snapshot."""
    conn.execute("BEGIN")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return result


def _rollback(conn: sqlite3.Connection) -> None:
    # The original error matters more; SQLite rolls back a failed transaction anyway.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


def _rows_in(conn: sqlite3.Connection, table: str, column: str, value: str, key: str,
             ids: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    wanted = sorted(ids)
    for part in _chunks(wanted):
        marks = ",".join("?" * len(part))
        sql = (f"SELECT {column}, {value} FROM {table} "
               f"WHERE key = ? AND {column} IN ({marks})")
        out.update(conn.execute(sql, (key, *part)).fetchall())
    return out


def _header(conn: sqlite3.Connection, key: str) -> TaskHeader | None:
    row = conn.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone()
    return None if row is None else TaskHeader.model_validate_json(row[0])


def _existing_header(conn: sqlite3.Connection, key: str) -> TaskHeader:
    header = _header(conn, key)
    if header is None:
        raise TaskNotFoundError(key)
    return header


# --- mutating operations -------------------------------------------------------------------

def create_task(conn: sqlite3.Connection,
                request: CreateTaskRequest) -> Outcome[CreateTaskResult]:
    def body(w: Writer) -> tuple[CreateTaskResult, bool]:
        key = request.header.key
        existing = _header(conn, key)
        if existing is not None:
            if existing.identity_digest != request.header.identity_digest:
                row = conn.execute("SELECT identity FROM identities WHERE key = ?",
                                   (key,)).fetchone()
                identity_conflict(TaskIdentity.model_validate_json(row[0]), request.identity)
            return CreateTaskResult(created=False, header=existing), False
        entry = creation_entry(request)
        w.blobs(request.blobs)
        header_text = request.header.model_dump_json()
        w.many("INSERT INTO tasks (key, status, header) VALUES (?, ?, ?)",
               [(key, request.header.status, header_text)])
        w.many("INSERT INTO identities (key, identity) VALUES (?, ?)",
               [(key, request.identity.model_dump_json())])
        _upsert(w, "nodes", "node_id", key, {},
                {n.node_id: n.model_dump_json() for n in request.nodes}, slot=NODE_SLOT)
        w.many("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, ?)",
               [(key, request.admission_id, "{}")])
        w.journal(key, [entry])
        return CreateTaskResult(created=True,
                                header=TaskHeader.model_validate_json(header_text)), True
    return write_txn(conn, body)


def acquire(conn: sqlite3.Connection, request: AcquireLeaseRequest) -> Outcome[LeaseGrant]:
    def body(w: Writer) -> tuple[LeaseGrant, bool]:
        key = request.key
        current = _existing_header(conn, key)
        nodes, actions, charged = _load(conn, key, needs(request.steps))
        header, journal, delta = acquire_with_steps(current, nodes, actions, charged, request)
        if delta is not None:
            _write_delta(w, key, delta, request.blobs, nodes, actions)
        w.journal(key, journal)
        w.header(header, current)
        # Read inside the write transaction: exactly the state the new fence starts from.
        snapshot = _snapshot(conn, header) if request.snapshot else None
        return LeaseGrant(fence=header.fence, expires_at=lease_expiry(request),
                          header=header, snapshot=snapshot,
                          commit=None if delta is None else delta.result()), True
    return write_txn(conn, body)


def renew(conn: sqlite3.Connection, request: RenewLeaseRequest) -> Outcome[LeaseStatus]:
    def body(w: Writer) -> tuple[LeaseStatus, bool]:
        current = _existing_header(conn, request.key)
        header = renew_lease(current, request)
        w.header(header, current)
        assert header.lease is not None
        return LeaseStatus(fence=header.fence, expires_at=header.lease.expires_at,
                           cancel=header.cancel), True
    return write_txn(conn, body)


def release(conn: sqlite3.Connection, request: ReleaseLeaseRequest) -> Outcome[TaskHeader]:
    def body(w: Writer) -> tuple[TaskHeader, bool]:
        current = _existing_header(conn, request.key)
        header = release_lease(current, request)
        w.header(header, current)
        return header, True
    return write_txn(conn, body)


def cancel(conn: sqlite3.Connection, request: CancelTaskRequest) -> Outcome[TaskHeader]:
    def body(w: Writer) -> tuple[TaskHeader, bool]:
        current = _existing_header(conn, request.key)
        header = request_cancel(current, request)
        if header is None:
            return current, False
        w.header(header, current)
        return header, True
    return write_txn(conn, body)


def commit(conn: sqlite3.Connection, request: CommitRequest) -> Outcome[CommitResult]:
    def body(w: Writer) -> tuple[CommitResult, bool]:
        key = request.key
        header = _existing_header(conn, key)
        nodes, actions, charged = _load(conn, key, needs(request.steps))
        delta = apply_commit(header, nodes, actions, charged, request)
        _write_delta(w, key, delta, request.blobs, nodes, actions)
        w.journal(key, delta.journal)
        w.header(delta.header, header)
        return delta.result(), True
    return write_txn(conn, body)


def _load(conn: sqlite3.Connection, key: str,
          need: Needs) -> tuple[dict[str, NodeRecord], dict[str, ActionRecord], set[str]]:
    """The node and action records and charged admission ids a transition needs."""
    nodes = {i: NodeRecord.model_validate_json(text) for i, text in _rows_in(
        conn, "nodes", "node_id", "record", key, need.node_ids).items()}
    actions = {i: ActionRecord.model_validate_json(text) for i, text in _rows_in(
        conn, "actions", "action_id", "record", key, need.action_ids).items()}
    charged = set(_rows_in(conn, "admissions", "admission_id", "charges", key,
                           need.admission_ids))
    return nodes, actions, charged


def _write_delta(w: Writer, key: str, delta: Delta, blobs: dict[str, str],
                 nodes: dict[str, NodeRecord], actions: dict[str, ActionRecord]) -> None:
    """Blobs first (insert-if-absent), then every changed row; journal and header follow.

    Rows that exist (``nodes``/``actions``: what the transition loaded) are UPDATEd in
    place: ``INSERT OR REPLACE`` deletes and re-inserts, and the delete can leave a page
    underfull and rebalance its siblings, about three page writes per node transition."""
    w.blobs(blobs)
    _upsert(w, "nodes", "node_id", key, nodes,
            {i: n.model_dump_json() for i, n in delta.nodes.items()}, slot=NODE_SLOT)
    _upsert(w, "actions", "action_id", key, actions,
            {i: a.model_dump_json() for i, a in delta.actions.items()})
    w.many("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, ?)",
           [(key, i, json.dumps(c, sort_keys=True)) for i, c in delta.charges.items()])


def _upsert(w: Writer, table: str, column: str, key: str, existing: Mapping[str, object],
            texts: dict[str, str], *, slot: int = 0) -> None:
    """UPDATE the rows in ``existing``, INSERT the others. With ``slot``, each row gets
    zero-filled slack up to ``slot`` bytes (the table has a ``slack`` column)."""
    def pad(text: str) -> tuple[int, ...]:
        return (_slack(text, slot),) if slot else ()

    set_slack, slack_column, slack_value = \
        (", slack = zeroblob(?)", ", slack", ", zeroblob(?)") if slot else ("", "", "")
    w.many(f"UPDATE {table} SET record = ?{set_slack} WHERE key = ? AND {column} = ?",
           [(t, *pad(t), key, i) for i, t in texts.items() if i in existing], text_columns=1)
    w.many(f"INSERT INTO {table} (key, {column}, record{slack_column}) VALUES "
           f"(?, ?, ?{slack_value})",
           [(key, i, t, *pad(t)) for i, t in texts.items() if i not in existing])


def _slack(text: str, slot: int) -> int:
    size = len(text) if text.isascii() else len(text.encode())
    return max(0, slot - size)


# --- reads -------------------------------------------------------------------------------

def get_header(conn: sqlite3.Connection, key: str) -> TaskHeader | None:
    return _header(conn, key)


def get_identity(conn: sqlite3.Connection, key: str) -> TaskIdentity | None:
    row = conn.execute("SELECT identity FROM identities WHERE key = ?", (key,)).fetchone()
    return None if row is None else TaskIdentity.model_validate_json(row[0])


def get_task(conn: sqlite3.Connection, key: str) -> TaskSnapshot | None:
    def body(c: sqlite3.Connection) -> TaskSnapshot | None:
        header = _header(c, key)
        if header is None:
            return None
        return _snapshot(c, header)
    return read_txn(conn, body)


def _snapshot(conn: sqlite3.Connection, header: TaskHeader) -> TaskSnapshot:
    """``header`` with every node and action record of its task (in the caller's txn)."""
    nodes = {i: NodeRecord.model_validate_json(t) for i, t in conn.execute(
        "SELECT node_id, record FROM nodes WHERE key = ?", (header.key,))}
    actions = {i: ActionRecord.model_validate_json(t) for i, t in conn.execute(
        "SELECT action_id, record FROM actions WHERE key = ?", (header.key,))}
    return TaskSnapshot(header=header, nodes=nodes, actions=actions)


def list_tasks(conn: sqlite3.Connection, request: ListTasksRequest) -> list[TaskHeader]:
    where: list[str] = []
    args: list[str | int] = []
    if request.status is not None:
        where.append("status = ?")
        args.append(request.status)
    if request.after is not None:
        where.append("key > ?")
        args.append(request.after)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    rows = conn.execute(f"SELECT header FROM tasks {clause}ORDER BY key LIMIT ?",
                        (*args, request.limit))
    return [TaskHeader.model_validate_json(r[0]) for r in rows]


def get_blobs(conn: sqlite3.Connection, digests: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in _chunks(sorted(set(digests))):
        marks = ",".join("?" * len(part))
        out.update(conn.execute(
            f"SELECT digest, body FROM blobs WHERE digest IN ({marks})",
            tuple(part)).fetchall())
    return out


def read_timeline(conn: sqlite3.Connection, request: TimelineRequest) -> list[JournalEntry]:
    def body(c: sqlite3.Connection) -> list[JournalEntry]:
        # A row holds one commit's entries and is keyed by its last seq, so ``limit`` rows
        # past ``after_seq`` hold at least ``limit`` entries past it.
        rows = c.execute("SELECT entries FROM journal WHERE key = ? AND seq > ? ORDER BY seq "
                         "LIMIT ?", (request.key, request.after_seq, request.limit)).fetchall()
        if not rows and c.execute("SELECT 1 FROM tasks WHERE key = ?",
                                  (request.key,)).fetchone() is None:
            raise TaskNotFoundError(request.key)
        out: list[JournalEntry] = []
        for (text,) in rows:
            out.extend(e for e in _ENTRIES.validate_json(text) if e.seq > request.after_seq)
        return out[:request.limit]
    return read_txn(conn, body)
