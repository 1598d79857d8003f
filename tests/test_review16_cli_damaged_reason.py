"""Review 16: ``list`` shows why a damaged task header cannot be read.

The MongoDB store's damage errors (``StoreSchemaError``) name the damaged field in
``details["problem"]`` (``header.seq is missing or not an integer``) and the task in
``details["key"]``, but carry no pydantic error as their cause, so ``list`` showed only
"header cannot be read (store_schema)". The row's reason (the table's ``problem`` cell,
the ``--json`` damaged entry's ``reason`` and the ``error:`` line) is now that problem, cut
to 80 characters, control characters escaped in the table like every other cell. An error
without a problem (the SQLite store's carry their pydantic error instead) reads as before.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import agentium_graph.cli as cli_module
from agentium_graph import ExecutionGraphRuntime, InMemoryDurableTaskStore
from agentium_graph._cli_render import CLIP_CHARS
from agentium_graph.cli import EXIT_STORE, cli
from agentium_graph.errors import StoreSchemaError
from agentium_graph.store import DurableTaskStore, ListTasksRequest, TaskHeader
from tests.conftest import Calls, chain_plan, make_catalog, program

KEYS = ("a", "b", "c")


class DamagedStore(InMemoryDurableTaskStore):
    """Fails a page holding ``key`` as the MongoDB store does: details, no cause."""

    def __init__(self, key: str, details: dict[str, Any]) -> None:
        super().__init__()
        self.damaged_key = key
        self.details = details

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        headers = await super().list_tasks(request)
        if any(h.key == self.damaged_key for h in headers):
            raise StoreSchemaError(f"MongoDB store: task document {self.damaged_key!r} "
                                   "cannot be parsed", details=self.details)
        return headers


async def _create_tasks(store: DurableTaskStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
    for key in KEYS:
        await rt.create(key, program(chain_plan(1)))


def _store(monkeypatch: pytest.MonkeyPatch, **details: Any) -> DamagedStore:
    store = DamagedStore("b", {"key": "b", **details})
    asyncio.run(_create_tasks(store))
    monkeypatch.setattr(cli_module, "open_store_uri", lambda *a, **k: store)
    return store


def _list(*args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", "sqlite:///unused.db", "list", *args],
                              env={"COLUMNS": "200"})


def _damaged_json() -> dict[str, Any]:
    result = _list("--json")
    assert result.exit_code == EXIT_STORE, result.output
    data = json.loads(result.stdout)
    assert [t["key"] for t in data["tasks"]] == ["a", "c"]
    [entry] = data["damaged"]
    assert entry["key"] == "b"
    return dict(entry)


def _row(result: Result, key: str) -> str:
    [line] = [line for line in result.stdout.splitlines() if line.split()[:1] == [key]]
    return line


def test_the_stores_problem_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = "header.seq is missing or not an integer"
    _store(monkeypatch, where="task document 'b'", problem=problem)
    table = _list()
    assert table.exit_code == EXIT_STORE, table.output
    assert problem in _row(table, "b") and "(store_schema)" not in table.stdout
    [line] = table.stderr.splitlines()
    assert line.startswith("error: ") and problem in line
    entry = _damaged_json()
    assert entry["reason"] == problem
    assert entry["error"]["details"]["problem"] == problem


def test_control_characters_in_the_problem_are_escaped_in_the_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    problem = "header.key is 'z\x1b[2J\u202ez\nx', not the document's _id 'b'"
    _store(monkeypatch, problem=problem)
    table = _list()
    assert table.exit_code == EXIT_STORE
    for raw in ("\x1b", "\u202e"):
        assert raw not in table.output
    assert "z\\x1b[2J\\u202ez\\nx" in _row(table, "b")
    assert "\\x1b[2J" in table.stderr
    assert _damaged_json()["reason"] == problem  # JSON keeps the exact text (escaped)


def test_a_long_problem_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = "header.status: " + "x" * 5000
    _store(monkeypatch, problem=problem)
    table = _list()
    assert table.exit_code == EXIT_STORE
    assert len([line for line in table.stdout.splitlines() if line.strip()]) <= 6
    assert "header.status: xxx" in _row(table, "b") and "…" in table.stdout
    reason = _damaged_json()["reason"]
    assert len(reason) == CLIP_CHARS and reason.startswith("header.status: x")
    assert reason.endswith("…")


@pytest.mark.parametrize("details", [{}, {"problem": ""}, {"problem": 5},
                                     {"problem": None}])
def test_without_a_problem_the_reason_is_as_before(monkeypatch: pytest.MonkeyPatch,
                                                   details: dict[str, Any]) -> None:
    _store(monkeypatch, **details)
    assert _damaged_json()["reason"] == "header cannot be read (store_schema)"


def test_a_sqlite_damage_error_names_its_field_through_its_cause(tmp_path: Path) -> None:
    sqlite = pytest.importorskip("agentium_graph_sqlite")
    path = tmp_path / "tasks.db"

    async def populate() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            await _create_tasks(store)

    asyncio.run(populate())
    with sqlite3.connect(path) as conn:
        [(header,)] = conn.execute("SELECT header FROM tasks WHERE key = 'b'")
        damaged = json.loads(header) | {"fence": "x"}
        conn.execute("UPDATE tasks SET header = ? WHERE key = 'b'", (json.dumps(damaged),))
    conn.close()
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "list", "--json"])
    assert result.exit_code == EXIT_STORE, result.output
    [entry] = json.loads(result.stdout)["damaged"]
    assert entry["reason"].startswith("header.fence: "), entry


# --- the MongoDB store, end to end ---------------------------------------------------------

try:
    from agentium_graph_mongodb import pytest_plugin
except ImportError:  # pragma: no cover - the package is installed for the full suite
    pytest_plugin = None  # type: ignore[assignment]
else:
    mongodb_server = pytest_plugin.mongodb_server
    mongodb_uri = pytest_plugin.mongodb_uri
    mongodb_database = pytest_plugin.mongodb_database


@pytest.mark.skipif(pytest_plugin is None, reason="agentium-graph-mongodb is not installed")
@pytest.mark.parametrize(("field", "value", "problem"), [
    ("header.key", "zz", "header.key is 'zz', not the document's _id 'b'"),
    ("header.error", "{not json", "header.error: Expecting property name"),
    ("header.seq", "x", "header.seq: Input should be a valid integer"),  # read before too
])
def test_a_mongodb_damage_names_its_field(mongodb_uri: str, mongodb_database: str,
                                          field: str, value: Any, problem: str) -> None:
    from pymongo import MongoClient

    from agentium_graph_mongodb.testing import open_store

    async def populate() -> None:
        async with open_store(mongodb_uri, mongodb_database) as store:
            await _create_tasks(store)

    asyncio.run(populate())
    client: MongoClient[dict[str, Any]] = MongoClient(mongodb_uri)
    try:
        tasks = client[mongodb_database]["tasks"]
        assert tasks.update_one({"_id": "b"}, {"$set": {field: value}}).matched_count == 1
    finally:
        client.close()
    store = ["--store", mongodb_uri, "--database", mongodb_database]
    table = CliRunner().invoke(cli, [*store, "list"], env={"COLUMNS": "200"})
    assert table.exit_code == EXIT_STORE, table.output
    assert problem in _row(table, "b"), table.stdout
    result = CliRunner().invoke(cli, [*store, "list", "--json"])
    assert result.exit_code == EXIT_STORE, result.output
    data = json.loads(result.stdout)
    assert [t["key"] for t in data["tasks"]] == ["a", "c"]
    [entry] = data["damaged"]
    assert entry["key"] == "b" and entry["reason"].startswith(problem)
    assert entry["error"]["details"]["problem"].startswith(problem)
