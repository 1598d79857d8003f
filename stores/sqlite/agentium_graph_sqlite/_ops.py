"""The store's operations as plain functions on one connection, run on the worker thread.

Each mutating operation is one ``BEGIN IMMEDIATE`` transaction: it reads the header row and
only the rows :func:`~agentium_graph.store.needs` names, lets the shared state machine decide,
and writes blobs first (insert-if-absent), then changed rows, journal rows and the header.
Holding the write lock across that read-modify-write is what keeps fencing exact across
connections and processes. The transition rules themselves live in
:mod:`agentium_graph.store._transitions`; nothing here re-implements them.

A store also keeps what it last wrote of a task (:class:`Kept`): the header row's text and
the records behind it. The next transaction still reads the header row, and uses the kept
records only if that row's text is exactly what this store wrote; anything another
connection or process did in between changes it (every node or admission write also rewrites
the header with a higher ``seq``, and a cancel request rewrites its own field), and then the
task is read from its rows as usual.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from agentium_graph.errors import StoreSchemaError, TaskNotFoundError
from agentium_graph.store._records import (
    ActionRecord,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    missing_persisted,
    record_json,
    replace,
    stored_header_json,
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
from agentium_graph_sqlite._errors import BadRecord, not_utf8_column
from agentium_graph_sqlite._schema import (
    FileReplacedError,
    check_not_upgraded,
    check_same_file,
    empty_wal_if_replaced,
)

T = TypeVar("T")
R = TypeVar("R")
_ENTRIES = TypeAdapter(list[JournalEntry])  # a journal row: one commit's entries
# A node row's record plus slack: above a completed single-attempt record (~750 bytes) and
# below SQLite's largest in-page payload for 4 KiB pages (~1000 bytes, beyond which a row
# spills to overflow pages). Bigger records (many attempts, long errors) just grow.
NODE_SLOT = 900
_CHUNK = 500  # bound on "?" placeholders per IN (...) list
# SQLite integers are signed 64-bit; a position past this is past every journal entry.
MAX_SEQ = 2**63 - 1
M = TypeVar("M", bound=BaseModel)


def _charges_encoder() -> Callable[[dict[str, int]], str]:
    """``json.JSONEncoder(sort_keys=True).encode``: the same text. ``encode`` builds a new C
    encoder on every call, which costs more than encoding a charges dict; this builds the
    C encoder once, with exactly the arguments ``encode`` passes it (ASCII escapes, ``": "``
    and ``", "``, sorted keys, NaN allowed), and calls it directly."""
    plain = json.JSONEncoder(sort_keys=True)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the encoder's own (pure Python) path
        return plain.encode
    encode = make(None, plain.default, json.encoder.encode_basestring_ascii, None,
                  plain.key_separator, plain.item_separator, True, False, True)

    def text(charges: dict[str, int]) -> str:
        return "".join(encode(charges, 0))
    return text


# An admission row's charges, as ``json.dumps(charges, sort_keys=True)`` writes them.
_charges_text: Final = _charges_encoder()


def _entries_json(entries: list[JournalEntry]) -> str:
    """``_ENTRIES.dump_json(entries).decode()``, calling its serializer directly (as
    :func:`~agentium_graph.store._records.record_json` does, for the same reason)."""
    return _ENTRIES.serializer.to_json(entries).decode()


class Writer:
    """Collects one transaction's writes so they can be counted (bytes) and batched."""

    __slots__ = ("bytes", "conn", "kept")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.bytes = 0
        # What to remember once the transaction has committed (see :class:`Kept`).
        self.kept: tuple[Kept, str, _Task] | None = None

    def many(self, sql: str, rows: Sequence[tuple[str | int, ...]], *,
             text_columns: slice | int = slice(1, None)) -> None:
        """Execute ``sql`` for every row. Payload bytes are counted over ``text_columns``:
        by default every column after the key; an int ``n`` means the first ``n``."""
        if not rows:
            return
        part = slice(0, text_columns) if isinstance(text_columns, int) else text_columns
        for row in rows:
            for v in row[part]:
                if isinstance(v, str):
                    self.bytes += len(v) if v.isascii() else len(v.encode())
        if len(rows) == 1:
            self.conn.execute(sql, rows[0])
        else:
            self.conn.executemany(sql, rows)

    def header(self, header: TaskHeader, previous: TaskHeader) -> str:
        """Write ``header`` (the task's row exists); returns the row's new text."""
        text = stored_header_json(header)
        self.bytes += len(text) if text.isascii() else len(text.encode())
        # Naming status in SET rewrites its index entry even when unchanged: a page per commit.
        if header.status == previous.status:
            self.conn.execute("UPDATE tasks SET header = ? WHERE key = ?", (text, header.key))
        else:
            self.conn.execute("UPDATE tasks SET status = ?, header = ? WHERE key = ?",
                              (header.status, text, header.key))
        return text

    def blobs(self, blobs: dict[str, str]) -> None:
        self.many("INSERT OR IGNORE INTO blobs (digest, body) VALUES (?, ?)",
                  list(blobs.items()))

    def journal(self, key: str, entries: Sequence[JournalEntry]) -> None:
        """One row for all of a commit's entries, keyed by the last entry's seq."""
        if entries:
            self.many("INSERT INTO journal (key, seq, entries) VALUES (?, ?, ?)",
                      [(key, entries[-1].seq, _entries_json(list(entries)))])


class _Task:
    """What a store knows of one task as of the header row text ``text``.

    ``header`` is private: nothing handed to a caller shares a mutable container (its
    ``counters`` and ``limits`` dicts, an error's ``details``) with it. ``nodes`` holds node
    records that have no mutable parts (shared with callers, like any frozen value), or None
    for a row that exists but whose record is not kept. ``charged``: admission ids known to
    exist. With ``all_nodes`` / ``all_charged`` every row of the task is in there, so an id
    that is not is known to be absent.
    """

    __slots__ = ("all_charged", "all_nodes", "charged", "header", "nodes", "text")

    def __init__(self, text: str, header: TaskHeader, nodes: dict[str, NodeRecord | None],
                 charged: set[str], *, all_nodes: bool, all_charged: bool) -> None:
        self.text = text
        self.header = header
        self.nodes = nodes
        self.charged = charged
        self.all_nodes = all_nodes
        self.all_charged = all_charged


class Kept:
    """Per store: the tasks it wrote last (least recently used dropped first), bounded by
    task count and by node records in all. Used only on the store's worker thread.

    A transaction *takes* its task's entry and puts a new one back only after its COMMIT
    succeeded, so a failed or rolled-back transaction simply forgets the task."""

    __slots__ = ("_nodes", "_tasks", "max_nodes", "max_tasks")

    def __init__(self, max_tasks: int = 64, max_nodes: int = 10_000) -> None:
        self._tasks: dict[str, _Task] = {}
        self._nodes = 0
        self.max_tasks = max_tasks
        self.max_nodes = max_nodes

    def take(self, key: str) -> _Task | None:
        task = self._tasks.pop(key, None)
        if task is not None:
            self._nodes -= len(task.nodes)
        return task

    def put(self, key: str, task: _Task) -> None:
        self.take(key)
        if len(task.nodes) > self.max_nodes:
            return
        self._tasks[key] = task
        self._nodes += len(task.nodes)
        while len(self._tasks) > self.max_tasks or self._nodes > self.max_nodes:
            self.take(next(iter(self._tasks)))

    def clear(self) -> None:
        self._tasks.clear()
        self._nodes = 0

    def __len__(self) -> int:
        return len(self._tasks)


def _private(header: TaskHeader, text: str) -> TaskHeader:
    """A header equal to ``header`` (whose JSON is ``text``) sharing no mutable container."""
    if header.error is not None:  # ErrorInfo.details is a dict: a fresh parse owns its own
        return TaskHeader.model_validate_json(text)
    return replace(header, counters=dict(header.counters), limits=dict(header.limits))


def _shareable(rec: NodeRecord) -> NodeRecord | None:
    """``rec`` when it holds nothing mutable (no error details, tuples as declared)."""
    if rec.error is None and type(rec.attempts) is tuple and type(rec.deps) is tuple:
        return rec
    return None


def _remember(w: Writer, kept: Kept, text: str, header: TaskHeader, task: _Task | None,
              nodes: Mapping[str, NodeRecord], charged: Iterable[str]) -> None:
    """After COMMIT, remember the header written as ``text`` and ``nodes`` (records now in
    their rows: loaded or written), on top of what was known of the task before."""
    if task is None:
        task = _Task(text, header, {}, set(), all_nodes=False, all_charged=False)
    task.text = text
    task.header = _private(header, text)
    for node_id, rec in nodes.items():
        task.nodes[node_id] = _shareable(rec)
    task.charged.update(charged)
    w.kept = (kept, header.key, task)


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
        check_not_upgraded(conn)
        check_same_file(conn)
        writer = Writer(conn)
        result, wrote = body(writer)
        conn.execute("COMMIT" if wrote else "ROLLBACK")
    except FileReplacedError:
        _rollback(conn)
        empty_wal_if_replaced(conn)  # now, not at close: anyone may open the path meanwhile
        raise
    except BaseException:
        _rollback(conn)
        raise
    if writer.kept is not None:
        kept, key, task = writer.kept
        kept.put(key, task)
    return Outcome(result, wrote, writer.bytes if wrote else 0)


def read_txn(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run several reads against one consistent snapshot."""
    conn.execute("BEGIN")
    try:
        check_not_upgraded(conn)
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


def _parse(model: type[M], text: str | bytes, what: str, key: str, sql: str) -> M:
    """``model`` parsed from a stored row; a row that does not parse is a :class:`BadRecord`
    naming it (``what``) and how to look at it (``sql``)."""
    try:
        rec = model.model_validate_json(text)
    except ValidationError as exc:
        raise BadRecord(exc, what, key, sql) from exc
    gap = missing_persisted(rec)
    if gap is not None:  # it would read as its default: a used fence as 0, completed as pending
        raise BadRecord(None, what, key, sql, problem=f"{gap} is missing, which every store "
                        "writes")
    return rec


def _q(value: str) -> str:
    """``value`` as an SQL string literal, for the hint showing how to look at a row."""
    return "'" + value.replace("'", "''") + "'"


def _misfiled(what: str, key: str, sql: str, field: str, stored: str, row: str) -> BadRecord:
    """A record that parses but names another row than the one holding it."""
    return BadRecord(None, what, key, sql, problem=f"{field} is {stored[:100]!r}, not the "
                     f"row's {row[:100]!r}")


def parse_header(text: str | bytes, key: str) -> TaskHeader:
    what, sql = f"the header of task {key!r}", f"SELECT header FROM tasks WHERE key = {_q(key)}"
    header = _parse(TaskHeader, text, what, key, sql)
    if header.key != key:  # every read and write of the task would be about another key
        raise _misfiled(what, key, sql, "header.key", header.key, key)
    return header


def _parse_node(text: str, key: str, node_id: str) -> NodeRecord:
    what = f"the record of node {node_id!r} of task {key!r}"
    sql = f"SELECT record FROM nodes WHERE key = {_q(key)} AND node_id = {_q(node_id)}"
    rec = _parse(NodeRecord, text, what, key, sql)
    if rec.node_id != node_id:
        raise _misfiled(what, key, sql, "node_id", rec.node_id, node_id)
    return rec


def _parse_action(text: str, key: str, action_id: str) -> ActionRecord:
    what = f"the record of action {action_id!r} of task {key!r}"
    sql = (f"SELECT record FROM actions WHERE key = {_q(key)} AND action_id = "
           f"{_q(action_id)}")
    rec = _parse(ActionRecord, text, what, key, sql)
    if rec.action_id != action_id:
        raise _misfiled(what, key, sql, "action_id", rec.action_id, action_id)
    return rec


def _parse_identity(text: str, key: str) -> TaskIdentity:
    return _parse(TaskIdentity, text, f"the identity of task {key!r}", key,
                  f"SELECT identity FROM identities WHERE key = {_q(key)}")


def _parse_entries(text: str, key: str, seq: int, column: str) -> list[JournalEntry]:
    try:
        if column == "entry":  # a schema version 1 row: one entry
            return [JournalEntry.model_validate_json(text)]
        return _ENTRIES.validate_json(text)
    except ValidationError as exc:
        raise BadRecord(exc, f"the journal row of task {key!r} ending at seq {seq}", key,
                        f"SELECT {column} FROM journal WHERE key = {_q(key)} AND seq = {seq}"
                        ) from exc


def _header(conn: sqlite3.Connection, key: str) -> TaskHeader | None:
    row = conn.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone()
    return None if row is None else parse_header(row[0], key)


def _current(conn: sqlite3.Connection, kept: Kept,
             key: str) -> tuple[TaskHeader, _Task | None]:
    """The task's header and, when the row is exactly what this store last wrote, what it
    knows of the task (taken out of ``kept``: the caller puts back what it commits)."""
    row = conn.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone()
    task = kept.take(key)
    if row is None:
        raise TaskNotFoundError(key)
    if task is not None and task.text == row[0]:
        return task.header, task
    return parse_header(row[0], key), None


# --- mutating operations -------------------------------------------------------------------

def create_task(conn: sqlite3.Connection, request: CreateTaskRequest,
                kept: Kept) -> Outcome[CreateTaskResult]:
    def body(w: Writer) -> tuple[CreateTaskResult, bool]:
        key = request.header.key
        existing = _header(conn, key)
        if existing is not None:
            if existing.identity_digest != request.header.identity_digest:
                row = conn.execute("SELECT identity FROM identities WHERE key = ?",
                                   (key,)).fetchone()
                identity_conflict(_parse_identity(row[0], key), request.identity)
            return CreateTaskResult(created=False, header=existing), False
        entry = creation_entry(request)
        w.blobs(request.blobs)
        header_text = stored_header_json(request.header)
        w.many("INSERT INTO tasks (key, status, header) VALUES (?, ?, ?)",
               [(key, request.header.status, header_text)])
        w.many("INSERT INTO identities (key, identity) VALUES (?, ?)",
               [(key, request.identity.model_dump_json())])
        nodes = {n.node_id: n for n in request.nodes}
        _upsert(w, _NODES, key, {}, {i: record_json(n) for i, n in nodes.items()})
        w.many("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, ?)",
               [(key, request.admission_id, "{}")])
        w.journal(key, [entry])
        # Every row of the task was written just now: what is not kept does not exist.
        task = _Task(header_text, request.header, {}, set(), all_nodes=True, all_charged=True)
        _remember(w, kept, header_text, request.header, task, nodes, (request.admission_id,))
        return CreateTaskResult(created=True,
                                header=TaskHeader.model_validate_json(header_text)), True
    return write_txn(conn, body)


def acquire(conn: sqlite3.Connection, request: AcquireLeaseRequest,
            kept: Kept) -> Outcome[LeaseGrant]:
    def body(w: Writer) -> tuple[LeaseGrant, bool]:
        key = request.key
        current, task = _current(conn, kept, key)
        nodes, actions, charged = _load(conn, key, needs(request.steps), task)
        header, journal, delta = acquire_with_steps(current, nodes, actions, charged, request)
        if delta is not None:
            _write_delta(w, key, delta, request.blobs, nodes, actions)
            nodes.update(delta.nodes)
            charged.update(delta.charges)
        w.journal(key, journal)
        text = w.header(header, current)
        # Read inside the write transaction: exactly the state the new fence starts from.
        snapshot = _snapshot(conn, header) if request.snapshot else None
        if snapshot is not None:  # every node row of the task, read just now
            nodes = snapshot.nodes
            task = _Task(text, header, {}, set() if task is None else task.charged,
                         all_nodes=True, all_charged=task is not None and task.all_charged)
        _remember(w, kept, text, header, task, nodes, charged)
        return LeaseGrant(fence=header.fence, expires_at=lease_expiry(request),
                          header=header, snapshot=snapshot,
                          commit=None if delta is None else delta.result()), True
    return write_txn(conn, body)


def renew(conn: sqlite3.Connection, request: RenewLeaseRequest,
          kept: Kept) -> Outcome[LeaseStatus]:
    def body(w: Writer) -> tuple[LeaseStatus, bool]:
        current, task = _current(conn, kept, request.key)
        header = renew_lease(current, request)
        _remember(w, kept, w.header(header, current), header, task, {}, ())
        assert header.lease is not None
        return LeaseStatus(fence=header.fence, expires_at=header.lease.expires_at,
                           cancel=header.cancel), True
    return write_txn(conn, body)


def release(conn: sqlite3.Connection, request: ReleaseLeaseRequest,
            kept: Kept) -> Outcome[TaskHeader]:
    def body(w: Writer) -> tuple[TaskHeader, bool]:
        current, task = _current(conn, kept, request.key)
        header = release_lease(current, request)
        _remember(w, kept, w.header(header, current), header, task, {}, ())
        return header, True
    return write_txn(conn, body)


def cancel(conn: sqlite3.Connection, request: CancelTaskRequest,
           kept: Kept) -> Outcome[TaskHeader]:
    def body(w: Writer) -> tuple[TaskHeader, bool]:
        current, task = _current(conn, kept, request.key)
        header = request_cancel(current, request)
        if header is None:
            # ``current`` may be the kept header: it goes to the caller, so the task's
            # entry (already taken out) is not put back.
            return current, False
        _remember(w, kept, w.header(header, current), header, task, {}, ())
        return header, True
    return write_txn(conn, body)


def commit(conn: sqlite3.Connection, request: CommitRequest,
           kept: Kept) -> Outcome[CommitResult]:
    def body(w: Writer) -> tuple[CommitResult, bool]:
        key = request.key
        header, task = _current(conn, kept, key)
        nodes, actions, charged = _load(conn, key, needs(request.steps), task)
        delta = apply_commit(header, nodes, actions, charged, request)
        _write_delta(w, key, delta, request.blobs, nodes, actions)
        w.journal(key, delta.journal)
        text = w.header(delta.header, header)
        nodes.update(delta.nodes)
        charged.update(delta.charges)
        _remember(w, kept, text, delta.header, task, nodes, charged)
        return delta.result(), True
    return write_txn(conn, body)


def _load(conn: sqlite3.Connection, key: str, need: Needs, task: _Task | None,
          ) -> tuple[dict[str, NodeRecord], dict[str, ActionRecord], set[str]]:
    """The node and action records and charged admission ids a transition needs: from
    ``task`` (what this store knows, valid for the header just read) where it can tell,
    else from the rows."""
    node_ids: Iterable[str] = need.node_ids
    admission_ids: Iterable[str] = need.admission_ids
    nodes: dict[str, NodeRecord] = {}
    charged: set[str] = set()
    if task is not None:
        known, all_nodes, missing = task.nodes, task.all_nodes, []
        for node_id in node_ids:
            rec = known.get(node_id)
            if rec is not None:
                nodes[node_id] = rec
            elif not all_nodes or node_id in known:  # unknown, or a row not kept
                missing.append(node_id)
        node_ids = missing
        charged = task.charged.intersection(need.admission_ids)
        admission_ids = () if task.all_charged else need.admission_ids - charged
    if node_ids:
        nodes.update((i, _parse_node(text, key, i)) for i, text in _rows_in(
            conn, "nodes", "node_id", "record", key, node_ids).items())
    actions = {i: _parse_action(text, key, i) for i, text in _rows_in(
        conn, "actions", "action_id", "record", key, need.action_ids).items()} \
        if need.action_ids else {}
    if admission_ids:
        charged.update(_rows_in(conn, "admissions", "admission_id", "charges", key,
                                admission_ids))
    return nodes, actions, charged


def _write_delta(w: Writer, key: str, delta: Delta, blobs: dict[str, str],
                 nodes: dict[str, NodeRecord], actions: dict[str, ActionRecord]) -> None:
    """Blobs first (insert-if-absent), then every changed row; journal and header follow.

    Rows that exist (``nodes``/``actions``: what the transition loaded) are UPDATEd in
    place: ``INSERT OR REPLACE`` deletes and re-inserts, and the delete can leave a page
    underfull and rebalance its siblings, about three page writes per node transition."""
    w.blobs(blobs)
    _upsert(w, _NODES, key, nodes, {i: record_json(n) for i, n in delta.nodes.items()})
    if delta.actions:
        _upsert(w, _ACTIONS, key, actions,
                {i: record_json(a) for i, a in delta.actions.items()})
    if delta.charges:
        w.many("INSERT INTO admissions (key, admission_id, charges) VALUES (?, ?, ?)",
               [(key, i, _charges_text(c)) for i, c in delta.charges.items()])


@dataclass(frozen=True, slots=True)
class _Table:
    """A record table's statements (constant texts: sqlite3 caches them prepared)."""

    update: str
    insert: str
    slot: int  # with slot > 0 each row gets zero-filled slack up to ``slot`` bytes


def _table(table: str, column: str, slot: int = 0) -> _Table:
    if slot:
        return _Table(f"UPDATE {table} SET record = ?, slack = zeroblob(?) "
                      f"WHERE key = ? AND {column} = ?",
                      f"INSERT INTO {table} (key, {column}, record, slack) "
                      "VALUES (?, ?, ?, zeroblob(?))", slot)
    return _Table(f"UPDATE {table} SET record = ? WHERE key = ? AND {column} = ?",
                  f"INSERT INTO {table} (key, {column}, record) VALUES (?, ?, ?)", 0)


_NODES: Final = _table("nodes", "node_id", NODE_SLOT)
_ACTIONS: Final = _table("actions", "action_id")


def _upsert(w: Writer, table: _Table, key: str, existing: Mapping[str, object],
            texts: dict[str, str]) -> None:
    """UPDATE the rows in ``existing``, INSERT the others (with slack if the table has it)."""
    updates: list[tuple[str | int, ...]] = []
    inserts: list[tuple[str | int, ...]] = []
    slot = table.slot
    for i, t in texts.items():
        if slot:
            slack = max(0, slot - (len(t) if t.isascii() else len(t.encode())))
            if i in existing:
                updates.append((t, slack, key, i))
            else:
                inserts.append((key, i, t, slack))
        elif i in existing:
            updates.append((t, key, i))
        else:
            inserts.append((key, i, t))
    w.many(table.update, updates, text_columns=1)
    w.many(table.insert, inserts)


# --- reads -------------------------------------------------------------------------------

def get_header(conn: sqlite3.Connection, key: str) -> TaskHeader | None:
    return _header(conn, key)


def get_identity(conn: sqlite3.Connection, key: str) -> TaskIdentity | None:
    row = conn.execute("SELECT identity FROM identities WHERE key = ?", (key,)).fetchone()
    return None if row is None else _parse_identity(row[0], key)


def get_task(conn: sqlite3.Connection, key: str) -> TaskSnapshot | None:
    def body(c: sqlite3.Connection) -> TaskSnapshot | None:
        header = _header(c, key)
        if header is None:
            return None
        return _snapshot(c, header)
    return read_txn(conn, body)


def _snapshot(conn: sqlite3.Connection, header: TaskHeader) -> TaskSnapshot:
    """``header`` with every node and action record of its task (in the caller's txn)."""
    key = header.key
    nodes = {i: _parse_node(t, key, i) for i, t in conn.execute(
        "SELECT node_id, record FROM nodes WHERE key = ?", (header.key,))}
    actions = {i: _parse_action(t, key, i) for i, t in conn.execute(
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
    sql = f"SELECT key, status, {{}} FROM tasks {clause}ORDER BY key LIMIT ?"
    try:
        rows = conn.execute(sql.format("header"), (*args, request.limit)).fetchall()
    except sqlite3.OperationalError as exc:
        if not_utf8_column(exc) is None:
            raise
        # A header that is not UTF-8 (damage) fails the fetch, naming no task; read the
        # headers as bytes so its parse names it (and `list` can go on past it).
        rows = conn.execute(sql.format("CAST(header AS BLOB)"),
                            (*args, request.limit)).fetchall()
    return [_listed_header(key, status, header) for key, status, header in rows]


def _listed_header(key: str, status: object, text: str | bytes) -> TaskHeader:
    """A listed task's header. Its ``status`` column is what ``list --status`` filters on:
    one that differs from the header's (edited by hand) would list the task under a status
    it does not have."""
    header = parse_header(text, key)
    if status != header.status:
        sql = f"SELECT status, header FROM tasks WHERE key = {_q(key)}"
        raise BadRecord(None, f"the status column of task {key!r}", key, sql,
                        problem=f"the status column says {str(status)[:40]!r} but the "
                        f"header says {header.status!r}")
    return header


def get_blobs(conn: sqlite3.Connection, digests: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in _chunks(sorted(set(digests))):
        marks = ",".join("?" * len(part))
        out.update(conn.execute(
            f"SELECT digest, body FROM blobs WHERE digest IN ({marks})",
            tuple(part)).fetchall())
    return out


def read_timeline(conn: sqlite3.Connection, request: TimelineRequest, *,
                  version: int = 2) -> list[JournalEntry]:
    """A page of the journal. ``version=1`` reads a schema version 1 file as it is (one
    row per entry, column ``entry``): what a read-only store does instead of migrating."""
    key = request.key
    after = min(request.after_seq, MAX_SEQ)  # past every entry: an empty page

    def body(c: sqlite3.Connection) -> list[JournalEntry]:
        # A version 1 file a writer migrated since this reader opened it has the new
        # journal (the migration updates meta in the same transaction).
        row = c.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() \
            if version == 1 else None
        column = "entry" if row is not None and str(row[0]) == "1" else "entries"
        # A row holds one commit's entries and is keyed by its last seq, so ``limit`` rows
        # past ``after_seq`` hold at least ``limit`` entries past it.
        header = c.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone()
        if header is None:
            raise TaskNotFoundError(key)
        committed = parse_header(header[0], key).journal_seq
        rows = c.execute(f"SELECT seq, {column} FROM journal WHERE key = ? AND seq > ? "
                         "ORDER BY seq LIMIT ?", (key, after, request.limit)).fetchall()
        out: list[JournalEntry] = []
        for seq, text in rows:
            out.extend(e for e in _parse_entries(text, key, seq, column=column)
                       if after < e.seq <= committed)
        out = out[:request.limit]
        expected = range(after + 1, after + 1 + min(request.limit, max(committed - after, 0)))
        if [e.seq for e in out] != list(expected):
            raise _journal_damaged(key, committed, after, expected, out)
        return out
    return read_txn(conn, body)


def _journal_damaged(key: str, committed: int, after: int, expected: range,
                     got: list[JournalEntry]) -> StoreSchemaError:
    """The error for a page of the journal that is not the entries after ``after`` up to
    the header's ``journal_seq`` (``committed``), one per seq in order: rows deleted,
    duplicated, reordered or edited (a commit writes its entries and the header at once)."""
    seqs = [e.seq for e in got]
    missing = sorted(set(expected) - set(seqs))[:10]
    problem = f"entries {missing} are missing" if missing else \
        f"its entries are out of order or repeated (seqs {seqs[:10]})"
    return StoreSchemaError(
        f"SQLite store: the journal of task {key!r} is damaged after seq {after}: {problem} "
        f"(its header says the journal has {committed} entries); restore the file from a "
        f"backup, or inspect the rows (SELECT seq, entries FROM journal WHERE key = {_q(key)} "
        "ORDER BY seq)", details={"key": key, "journal_seq": committed, "after_seq": after,
                                  "missing": missing, "problem": f"journal: {problem}"})
