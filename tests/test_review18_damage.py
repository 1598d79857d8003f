"""Damaged stored data, property-based, on SQLite and MongoDB.

Real tasks in every state (``tests/_review18_damage_tasks.py``: completed, failed, canceled,
running under a stale lease, recovery_required with an uncertain action, planned) are built
once per store; each example copies them, damages one record at random (a byte flipped, the
text cut, a row or document deleted, a field given another type or an impossible value, a
digest changed, journal entries duplicated, reordered or renumbered) and then checks:

* ``runtime.inspect`` returns a view or raises a typed error (never anything else);
* the CLI's read commands (``list``, ``inspect``, ``timeline --all``, with ``--json``)
  write nothing, never print a traceback, fail with one ``error:`` line and a documented exit
  code, and ``list`` still lists every other task;
* ``runtime.run`` raises only typed errors, and when ``inspect`` saw the damage it runs no
  tool, dispatches and looks up nothing, and leaves the task's records as they were;
* ``cancel`` and ``resolve`` fail (if they do) with one ``error:`` line, no traceback.

Deterministic in CI (``derandomize=True``); ``HYPOTHESIS_PROFILE=deep`` runs 25 times more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from agentium_graph import AgentiumGraphError
from agentium_graph.cli import cli
from agentium_graph.store._protocol import DurableTaskStore
from tests._review18_damage_tasks import KEYS, build_tasks, runtime
from tests.conftest import Calls

sqlite_store = pytest.importorskip("agentium_graph_sqlite")

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
pytestmark = pytest.mark.timeout(7200 if DEEP else 300)
EXITS = {0, 1, 3, 4}  # docs/cli.md; 2 (usage) needs a bad argument, none is given here
SECONDS = 30  # a command or run that takes longer is stuck (a cursor that never moves)


def damage_settings(examples: int) -> settings:
    return settings(derandomize=not DEEP, deadline=None, database=None,
                    max_examples=examples * 25 if DEEP else examples,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def time_limit(what: str) -> Iterator[None]:
    """Fail instead of hanging (SIGALRM: the test runs in the main thread). The real-time
    timer is pytest-timeout's too: what is left of its time is set back afterwards, or a
    hang later in the test would have no bound."""
    def stuck(*_: object) -> None:
        raise AssertionError(f"{what} did not finish within {SECONDS} s")
    previous = signal.signal(signal.SIGALRM, stuck)
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL,
                             max(outer - (time.monotonic() - started), 0.001))


# --- mutations of one stored value --------------------------------------------------------

ODD_VALUES = st.sampled_from([None, -1, -(2**40), 2**63 + 5, 0, "", "x", "1", [], {}, True,
                              1.5, "sha256:" + "0" * 64, "zombie"])


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (the value itself excluded)."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for name, inner in items:
        out.append((*prefix, name))
        out.extend(json_paths(inner, (*prefix, name)))
    return out


def set_path(value: Any, path: tuple[Any, ...], new: Any) -> None:
    for name in path[:-1]:
        value = value[name]
    value[path[-1]] = new


@st.composite
def text_mutation(draw: st.DrawFn, text: str) -> str | None:
    """``text`` (JSON) damaged: a byte flipped, cut short, or one field replaced; None: the
    row or document is deleted."""
    how = draw(st.sampled_from(["flip", "cut", "field", "field", "field", "delete"]))
    if how == "delete":
        return None
    if how == "field":
        value = json.loads(text)
        paths = json_paths(value)
        if paths:
            set_path(value, draw(st.sampled_from(paths)), draw(ODD_VALUES))
            return json.dumps(value)
        how = "flip"
    at = draw(st.integers(0, max(len(text) - 1, 0)))
    if how == "cut":
        return text[:at]
    return text[:at] + draw(st.sampled_from('0 9"{}x-,:\\')) + text[at + 1:]


# --- the checks shared by both stores -----------------------------------------------------

def cli_call(args: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one CLI command; asserts the error contract."""
    with time_limit(" ".join(args)):
        result = CliRunner().invoke(cli, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: traceback ({result.exception!r})") from result.exception
    assert result.exit_code in EXITS, (args, result.exit_code, result.stderr)
    if result.exit_code:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stdout, result.stderr


def read_commands(store_args: list[str], key: str) -> None:
    code, out, _ = cli_call([*store_args, "list", "--json", "--limit", "100"])
    if code in (0, 4):
        page = json.loads(out)
        listed = {t["key"] for t in page["tasks"]} | {d["key"] for d in page.get("damaged", [])}
        assert listed >= set(KEYS) - {key}, listed  # list goes on past a damaged task
        assert code == (4 if page.get("damaged") else 0)
    for command in (["inspect", key], ["timeline", key, "--all"]):
        cli_call([*store_args, *command])
        cli_call([*store_args, *command, "--json"])
    cli_call([*store_args, "list"])


async def inspect_saw(store: DurableTaskStore, key: str) -> bool:
    """Whether ``inspect`` saw damage a run would build on (raised a typed error, or listed
    a problem). An output digest on a node that has not completed is listed too, but a run
    never reads it: the node runs, and its settlement replaces the digest."""
    try:
        view = await runtime(store, Calls()).inspect(key)
    except AgentiumGraphError:
        return True
    overwritten = tuple(f"node {n!r}: output" for n, v in view.nodes.items()
                        if v.state != "completed")
    return any(not p.startswith(overwritten) for p in view.problems)


async def run_once(store: DurableTaskStore, key: str) -> dict[str, int]:
    """``run(key)`` by a fresh worker; the tool calls, dispatches and lookups it made."""
    calls = Calls()
    with contextlib.suppress(AgentiumGraphError):
        async with asyncio.timeout(SECONDS):
            await runtime(store, calls).run(key, "w-after")
    return calls.by_node


def write_commands(store_args: list[str], key: str, action_ids: list[str]) -> None:
    cli_call([*store_args, "cancel", key, "--reason", "damaged?"])
    for action_id in action_ids[:1]:
        cli_call([*store_args, "resolve", key, action_id, "--absent", "--actor", "op"])


# --- SQLite --------------------------------------------------------------------------------

TABLES = {"tasks": ("header", "key"), "identities": ("identity", "key"),
          "nodes": ("record", "node_id"), "actions": ("record", "action_id"),
          "admissions": ("charges", "admission_id"), "journal": ("entries", "id")}
TASK_TABLES = ("identities", "nodes", "actions", "admissions")
Row = tuple[str, str, tuple[Any, ...], str]  # table, WHERE clause, its arguments, text


@pytest.fixture(scope="module")
def sqlite_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("damage") / "base.db"

    async def build() -> None:
        async with sqlite_store.SQLiteDurableTaskStore(path) as store:
            await build_tasks(store)
    asyncio.run(build())
    return path


def sqlite_rows(conn: sqlite3.Connection, key: str) -> list[Row]:
    """Every record of ``key``, and the blobs its nodes name."""
    rows: list[Row] = []
    for table, (column, ident) in TABLES.items():
        for row_id, text in conn.execute(
                f"SELECT {ident}, {column} FROM {table} WHERE key = ?", (key,)):
            rows.append((table, f"key = ? AND {ident} = ?", (key, row_id), text))
    digests = {json.loads(r[3]).get("output_digest") for r in rows if r[0] == "nodes"}
    rows += [("blobs", "digest = ?", (digest,), text) for digest, text in conn.execute(
        "SELECT digest, body FROM blobs") if digest in digests]
    return rows


def sqlite_dump(path: Path) -> list[Any]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [sorted(map(repr, conn.execute(f"SELECT * FROM {t}")))
                for t in (*TABLES, "blobs", "meta")]


def task_records(path: Path, key: str) -> list[Any]:
    """What a run must not change on top of damage: the task's records and status column
    (the header's lease, fence and journal may move: a run takes and gives back a lease)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = [sorted(map(repr, conn.execute(f"SELECT * FROM {t} WHERE key = ?", (key,))))
                for t in TASK_TABLES]
        rows.append(conn.execute("SELECT status FROM tasks WHERE key = ?", (key,)).fetchall())
        rows.append(sorted(conn.execute("SELECT * FROM blobs")))
    return rows


@st.composite
def sqlite_damage(draw: st.DrawFn, base: Path) -> tuple[str, Callable[[sqlite3.Connection],
                                                                      object]]:
    key = draw(st.sampled_from(KEYS))
    with contextlib.closing(sqlite3.connect(base)) as conn:
        rows = sqlite_rows(conn, key)
    table, where, args, text = draw(st.sampled_from(rows))
    column = TABLES[table][0] if table != "blobs" else "body"
    special = draw(st.integers(0, 9))
    note(f"damage: {table} WHERE {where} {args}, special {special}")
    if table == "tasks" and special == 0:
        status = draw(st.sampled_from(["completed", "running", "zombie", ""]))
        return key, lambda c: c.execute(f"UPDATE tasks SET status = ? WHERE {where}",
                                        (status, *args))
    if table == "journal" and special <= 2:
        shift = draw(st.sampled_from([-1, 1, 1000]))
        if special == 0:  # the row duplicated under another seq
            return key, lambda c: c.execute(
                "INSERT OR IGNORE INTO journal (key, seq, entries) SELECT key, seq + ?, "
                f"entries FROM journal WHERE {where}", (shift, *args))
        if special == 1:  # renumbered (the row's own seq)
            return key, lambda c: c.execute(
                f"UPDATE OR IGNORE journal SET seq = seq + ? WHERE {where}", (shift, *args))
        other = draw(st.sampled_from([r[2][1] for r in rows if r[0] == "journal"]))
        mine = args[1]
        return key, lambda c: c.execute(  # two rows' entries swapped
            "UPDATE journal SET entries = CASE id WHEN ? THEN (SELECT entries FROM journal "
            "WHERE id = ?) ELSE (SELECT entries FROM journal WHERE id = ?) END "
            "WHERE id IN (?, ?)", (mine, other, mine, mine, other))
    new = draw(text_mutation(text))
    note(f"was: {text}\nnow: {new}")
    if new is None:
        return key, lambda c: c.execute(f"DELETE FROM {table} WHERE {where}", args)
    return key, lambda c: c.execute(f"UPDATE {table} SET {column} = ? WHERE {where}",
                                    (new, *args))


def action_ids(path: Path, key: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [a for (a,) in conn.execute("SELECT action_id FROM actions WHERE key = ?",
                                           (key,))]


def _sqlite_example(base: Path, work: Path, damage: tuple[str, Callable[..., object]]) -> None:
    key, apply = damage
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    path = work / "t.db"
    shutil.copy(base, path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        apply(conn)
        conn.commit()
    before = sqlite_dump(path)

    async def reads() -> bool:
        async with sqlite_store.SQLiteDurableTaskStore(path, read_only=True) as store:
            return await inspect_saw(store, key)
    with time_limit("inspect"):
        saw = asyncio.run(reads())
    read_commands(["--store", f"sqlite:///{path}"], key)
    assert sqlite_dump(path) == before, "a read wrote"
    for name in ("run.db", "cli.db"):
        shutil.copy(path, work / name)

    async def run() -> dict[str, int]:
        async with sqlite_store.SQLiteDurableTaskStore(work / "run.db") as store:
            return await run_once(store, key)
    with time_limit("run"):
        calls = asyncio.run(run())
    if saw:
        assert calls == {}, f"run() called {calls} on top of damage inspect saw"
        assert task_records(work / "run.db", key) == task_records(path, key)
    write_commands(["--store", f"sqlite:///{work / 'cli.db'}"], key, action_ids(path, key))


def test_damaged_sqlite_records(sqlite_base: Path, tmp_path: Path) -> None:
    @damage_settings(80)
    @given(damage=sqlite_damage(sqlite_base))
    def check(damage: tuple[str, Callable[..., object]]) -> None:
        _sqlite_example(sqlite_base, tmp_path / "example", damage)
    check()


# --- MongoDB -------------------------------------------------------------------------------

mongodb = pytest.importorskip("agentium_graph_mongodb")
from agentium_graph_mongodb import pytest_plugin  # noqa: E402
from agentium_graph_mongodb.testing import open_store  # noqa: E402

mongodb_server = pytest_plugin.mongodb_server
mongodb_uri = pytest_plugin.mongodb_uri
COLLECTIONS = ("tasks", "journal", "blobs", "meta")


@pytest.fixture(scope="module")
def mongodb_base(mongodb_server: Any) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Every document of a store holding the tasks (copied into each example's database)."""
    from pymongo import MongoClient

    uri, name = mongodb_server.uri, f"agt_base_{uuid.uuid4().hex[:12]}"

    async def build() -> None:
        async with open_store(uri, name) as store:
            await build_tasks(store)
    asyncio.run(build())
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        yield {c: list(client[name][c].find()) for c in COLLECTIONS}
    finally:
        client.drop_database(name)
        client.close()


def mongo_targets(docs: dict[str, list[dict[str, Any]]], key: str) -> list[tuple[Any, ...]]:
    """(collection, _id, field path) of every value of ``key``'s documents."""
    [task] = [d for d in docs["tasks"] if d["_id"] == key]
    out: list[tuple[Any, ...]] = [("tasks", key, ("header", name)) for name in task["header"]]
    out += [("tasks", key, (name,)) for name in ("identity", "first_entry", "v", "writes")]
    for part in ("nodes", "actions", "admissions"):
        out += [("tasks", key, (part, name)) for name in task.get(part, {})]
    out += [("journal", d["_id"], (name,)) for d in docs["journal"] if d["k"] == key
            for name in ("e", "s", "k")]
    digests = {json.loads(t).get("output_digest") for t in task.get("nodes", {}).values()}
    out += [("blobs", d["_id"], ("body",)) for d in docs["blobs"] if d["_id"] in digests]
    return out


@st.composite
def mongo_damage(draw: st.DrawFn, docs: dict[str, list[dict[str, Any]]]
                 ) -> tuple[str, str, Any, tuple[str, ...], Any]:
    """(key, collection, _id, path, new value); new value ``...``: the field (a path of
    one: the document) is deleted; ``("dup", n)``: a journal document copied to seq + n."""
    key = draw(st.sampled_from(KEYS))
    collection, doc_id, path = draw(st.sampled_from(mongo_targets(docs, key)))
    note(f"damage: {collection} {doc_id!r} {path}")
    [doc] = [d for d in docs[collection] if d["_id"] == doc_id]
    value = doc
    for name in path:
        value = value[name]
    if collection == "journal" and draw(st.booleans()):
        return key, collection, doc_id, path, ("dup", draw(st.sampled_from([-1, 1, 1000])))
    if isinstance(value, str) and value[:1] in "{[":
        new = draw(text_mutation(value))
        return key, collection, doc_id, path, ... if new is None else new
    if draw(st.integers(0, 4)) == 0:
        return key, collection, doc_id, (path if collection == "tasks" else ()), ...
    return key, collection, doc_id, path, draw(ODD_VALUES.filter(  # BSON holds int64 only
        lambda v: not isinstance(v, int) or abs(v) < 2**63))


def _mongo_apply(db: Any, collection: str, doc_id: Any, path: tuple[str, ...],
                 new: Any) -> None:
    coll = db[collection]
    if isinstance(new, tuple) and new and new[0] == "dup":
        doc = coll.find_one({"_id": doc_id})
        doc["s"] += new[1]
        doc["_id"] = f"{doc['k']}:{doc['s']}"
        coll.replace_one({"_id": doc["_id"]}, doc, upsert=True)
    elif new is ... and not path:
        coll.delete_one({"_id": doc_id})
    elif new is ...:
        coll.update_one({"_id": doc_id}, {"$unset": {".".join(path): ""}})
    else:
        coll.update_one({"_id": doc_id}, {"$set": {".".join(path): new}})


def _mongo_state(db: Any, key: str) -> list[Any]:
    task = db["tasks"].find_one({"_id": key}) or {}
    return [{k: v for k, v in task.items() if k not in ("header", "writes")},
            (task.get("header") or {}).get("status"),
            sorted(map(repr, db["blobs"].find()))]


def _mongo_dump(db: Any) -> list[Any]:
    return [sorted(map(repr, db[c].find())) for c in COLLECTIONS]


def test_damaged_mongodb_documents(mongodb_server: Any,
                                   mongodb_base: dict[str, list[dict[str, Any]]]) -> None:
    from pymongo import MongoClient

    uri = mongodb_server.uri
    client: MongoClient[dict[str, Any]] = MongoClient(uri)

    @damage_settings(20)
    @given(damage=mongo_damage(mongodb_base))
    def check(damage: tuple[str, str, Any, tuple[str, ...], Any]) -> None:
        key, collection, doc_id, path, new = damage
        names = {n: f"agt_dmg_{uuid.uuid4().hex[:12]}" for n in ("read", "run", "cli")}
        try:
            for name in names.values():
                for c, docs in mongodb_base.items():
                    if docs:
                        client[name][c].insert_many([dict(d) for d in docs])
                _mongo_apply(client[name], collection, doc_id, path, new)
            db = client[names["read"]]
            before = _mongo_dump(db)

            async def reads() -> bool:
                async with open_store(uri, names["read"], read_only=True) as store:
                    return await inspect_saw(store, key)
            with time_limit("inspect"):
                saw = asyncio.run(reads())
            read_commands(["--store", uri, "--database", names["read"]], key)
            assert _mongo_dump(db) == before, "a read wrote"

            async def run() -> dict[str, int]:
                async with open_store(uri, names["run"]) as store:
                    return await run_once(store, key)
            with time_limit("run"):
                calls = asyncio.run(run())
            if saw:
                assert calls == {}, f"run() called {calls} on top of damage inspect saw"
                assert _mongo_state(client[names["run"]], key) == _mongo_state(db, key)
            task = client[names["cli"]]["tasks"].find_one({"_id": key}) or {}
            actions = task.get("actions")
            write_commands(["--store", uri, "--database", names["cli"]], key,
                           [str(a) for a in actions] if isinstance(actions, dict) else [])
        finally:
            for name in names.values():
                client.drop_database(name)
    try:
        check()
    finally:
        client.close()
