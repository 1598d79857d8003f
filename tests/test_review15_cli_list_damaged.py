"""``agentium-graph list`` lists past a task whose stored header is damaged.

One damaged header row used to fail the whole listing (exit 4), hiding every healthy task.
Now the damaged task is a row of its own (status ``damaged`` and a short reason; ``damaged``
in ``--json``), the listing goes on after its key, and the command still exits 4 with one
``error:`` line saying to ``inspect`` the task and restore it from a backup.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentium_graph import ExecutionGraphRuntime, InMemoryDurableTaskStore
from agentium_graph._cli_list import DamagedTask, list_rows
from agentium_graph.cli import EXIT_STORE, cli
from agentium_graph.errors import DataIntegrityError, StoreSchemaError
from agentium_graph.store import ListTasksRequest, TaskHeader
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

KEYS = ("a", "b", "c", "d", "e")
DONE = ("a", "d")  # completed; the others stay pending


async def _populate(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for key in KEYS:
            await rt.create(key, program(chain_plan(1)))
        for key in DONE:
            await rt.run(key, worker_id="w")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.db"
    asyncio.run(_populate(path))
    return path


def damage(path: Path, *keys: str, text: str = "{broken") -> None:
    with sqlite3.connect(path) as conn:
        for key in keys:
            assert conn.execute("UPDATE tasks SET header = ? WHERE key = ?",
                                (text, key)).rowcount == 1
    conn.close()


def invoke(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", f"sqlite:///{db}", *args],
                              env={"COLUMNS": "200"})


def listed(db: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    result = invoke(db, "list", *args, "--json")
    assert "Traceback" not in result.output
    return result, json.loads(result.stdout)


def error_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def table_rows(result: Result) -> dict[str, str]:
    """The table's rows as key -> status (first two cells of each row)."""
    rows = {}
    for line in result.stdout.splitlines():
        cells = line.split()
        if len(cells) >= 2 and cells[0] in KEYS:
            rows[cells[0]] = cells[1]
    return rows


def test_one_damaged_row_is_listed_as_damaged_and_the_healthy_ones_too(db: Path) -> None:
    damage(db, "b")
    table = invoke(db, "list")
    assert table.exit_code == EXIT_STORE, table.output
    assert "Traceback" not in table.output
    assert table_rows(table) == {"a": "completed", "b": "damaged", "c": "pending",
                                 "d": "completed", "e": "pending"}
    assert "not valid JSON" in table.stdout
    line = error_line(table)
    assert "'b'" in line and "inspect b" in line and "backup" in line

    result, data = listed(db)
    assert result.exit_code == EXIT_STORE
    assert [t["key"] for t in data["tasks"]] == ["a", "c", "d", "e"]
    assert data["next_after"] is None
    [bad] = data["damaged"]
    assert bad["key"] == "b" and bad["status"] == "damaged" and bad["reason"]
    assert bad["error"]["code"] == "store_schema" and bad["error"]["details"]["key"] == "b"
    DamagedTask.model_validate(bad)


def test_damaged_rows_in_a_row_and_the_last_row(db: Path) -> None:
    damage(db, "b", "c", "e")
    result, data = listed(db)
    assert result.exit_code == EXIT_STORE
    assert [t["key"] for t in data["tasks"]] == ["a", "d"]
    assert [d["key"] for d in data["damaged"]] == ["b", "c", "e"]
    assert "3 tasks are damaged" in error_line(result)

    table = invoke(db, "list")
    assert table.exit_code == EXIT_STORE
    assert table_rows(table) == {"a": "completed", "b": "damaged", "c": "damaged",
                                 "d": "completed", "e": "damaged"}


def test_every_row_damaged(db: Path) -> None:
    damage(db, *KEYS)
    result, data = listed(db)
    assert result.exit_code == EXIT_STORE
    assert data["tasks"] == [] and [d["key"] for d in data["damaged"]] == list(KEYS)


def test_status_filter_keeps_to_the_rows_of_that_status(db: Path) -> None:
    damage(db, "c")  # the row's status column still says pending
    result, data = listed(db, "--status", "pending")
    assert result.exit_code == EXIT_STORE
    assert [t["key"] for t in data["tasks"]] == ["b", "e"]
    assert [d["key"] for d in data["damaged"]] == ["c"]
    result, data = listed(db, "--status", "completed")
    assert result.exit_code == 0, result.output
    assert [t["key"] for t in data["tasks"]] == ["a", "d"] and "damaged" not in data


def test_pages_count_damaged_rows_and_continue_after_them(db: Path) -> None:
    damage(db, "b", "c")
    result, first = listed(db, "--limit", "2")
    assert [t["key"] for t in first["tasks"]] == ["a"]
    assert [d["key"] for d in first["damaged"]] == ["b"]
    assert first["next_after"] == "b"
    assert "--after b" in invoke(db, "list", "--limit", "2").stdout
    result, second = listed(db, "--limit", "2", "--after", "b")
    assert [t["key"] for t in second["tasks"]] == ["d"]
    assert [d["key"] for d in second["damaged"]] == ["c"]
    assert second["next_after"] == "d"
    result, third = listed(db, "--limit", "2", "--after", "d")
    assert result.exit_code == 0 and [t["key"] for t in third["tasks"]] == ["e"]
    assert third["next_after"] is None and "damaged" not in third


def test_a_header_of_the_wrong_shape_is_damaged_too(db: Path) -> None:
    damage(db, "d", text='{"key": "d"}')
    result, data = listed(db)
    assert result.exit_code == EXIT_STORE
    assert [d["key"] for d in data["damaged"]] == ["d"]
    assert len(data["tasks"]) == 4


def test_a_healthy_database_lists_as_before(db: Path) -> None:
    result, data = listed(db)
    assert result.exit_code == 0 and set(data) == {"tasks", "next_after"}
    assert invoke(db, "list").stderr == ""


# --- the paging loop against a store that misbehaves --------------------------------------

class _Store:
    """``list_tasks`` over ``rows`` (key -> header, or None for a damaged one), raising
    ``error(key)`` for the first damaged row of a page, like the SQLite store does."""

    def __init__(self, rows: dict[str, TaskHeader | None], error: Any) -> None:
        self.rows = dict(sorted(rows.items()))
        self.error = error
        self.calls = 0

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        self.calls += 1
        assert self.calls < 10_000, "listing loops"
        out: list[TaskHeader] = []
        for key, header in self.rows.items():
            if request.after is not None and key <= request.after:
                continue
            if len(out) == request.limit:
                break
            if header is None:
                raise self.error(key)
            out.append(header)
        return out


async def _template() -> TaskHeader:
    store = InMemoryDurableTaskStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
    await rt.create("t", program(chain_plan(1)))
    header = await store.get_header("t")
    assert header is not None
    return header


def _rows(n: int, damaged: set[int]) -> dict[str, TaskHeader | None]:
    header = asyncio.run(_template())
    return {f"k{i:04d}": None if i in damaged else header.model_copy(update={"key": f"k{i:04d}"})
            for i in range(n)}


def _keyed(key: str) -> StoreSchemaError:
    return StoreSchemaError(f"the header of task {key!r} is damaged", details={"key": key})


def _collect(store: _Store, want: int, after: str | None = None) -> list[str]:
    rows = asyncio.run(list_rows(store, status=None, after=after, want=want))  # type: ignore[arg-type]
    return [("!" if isinstance(r, DamagedTask) else "") + r.key for r in rows]


def test_the_paging_loop_recovers_every_row_and_stays_cheap() -> None:
    damaged = {0, 1, 500, 997, 998, 999, 1000, 1499}
    store = _Store(_rows(1500, damaged), _keyed)
    got = _collect(store, 1000)
    assert got == [("!" if i in damaged else "") + f"k{i:04d}" for i in range(1000)]
    assert store.calls < 200
    rest = _collect(store, 1000, after=got[-1].lstrip("!"))
    assert rest == [("!" if i in damaged else "") + f"k{i:04d}" for i in range(1000, 1500)]


def test_a_data_integrity_error_with_a_key_is_a_damaged_row_too() -> None:
    store = _Store(_rows(3, {1}), lambda key: DataIntegrityError("bad", details={"key": key}))
    assert _collect(store, 10) == ["k0000", "!k0001", "k0002"]


@pytest.mark.parametrize("error", [
    lambda key: StoreSchemaError("no key in this error"),
    lambda key: StoreSchemaError("a key that is no row", details={"key": 7}),
    lambda key: StoreSchemaError("a key before the cursor", details={"key": ""}),
])
def test_an_error_that_names_no_row_after_the_cursor_fails_as_before(error: Any) -> None:
    store = _Store(_rows(3, {1}), error)
    with pytest.raises(StoreSchemaError) as raised:
        _collect(store, 10)
    assert raised.value is not None and store.calls < 10


def test_an_error_without_a_key_fails_the_cli_as_before(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '999' WHERE name = 'schema_version'")
    conn.close()
    result = invoke(db, "list")
    assert result.exit_code == EXIT_STORE and result.stdout == ""
    assert "Traceback" not in result.output
    error_line(result)


# --- MongoDB: the header parse names the task in its error's details -----------------------

mongodb = pytest.importorskip("agentium_graph_mongodb")
from agentium_graph_mongodb import pytest_plugin  # noqa: E402

mongodb_server = pytest_plugin.mongodb_server
mongodb_uri = pytest_plugin.mongodb_uri
mongodb_database = pytest_plugin.mongodb_database


def test_mongodb_lists_past_a_damaged_task_document(mongodb_uri: str,
                                                    mongodb_database: str) -> None:
    from pymongo import MongoClient

    from agentium_graph_mongodb.testing import open_store

    async def populate() -> None:
        async with open_store(mongodb_uri, mongodb_database) as store:
            rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
            for key in KEYS:
                await rt.create(key, program(chain_plan(1)))

    asyncio.run(populate())
    client: MongoClient[dict[str, Any]] = MongoClient(mongodb_uri)
    try:
        tasks = client[mongodb_database]["tasks"]
        assert tasks.update_one({"_id": "b"}, {"$set": {"header.fence": "x"}}).matched_count
        assert tasks.update_one({"_id": "e"}, {"$set": {"header.counters": "x"}}).matched_count
    finally:
        client.close()
    result = CliRunner().invoke(cli, ["--store", mongodb_uri, "--database", mongodb_database,
                                      "list", "--json"])
    assert result.exit_code == EXIT_STORE, result.output
    data = json.loads(result.stdout)
    assert [t["key"] for t in data["tasks"]] == ["a", "c", "d"]
    assert [d["key"] for d in data["damaged"]] == ["b", "e"]
    assert "inspect" in error_line(result)
