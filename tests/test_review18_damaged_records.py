"""Damage the stores could see but let through (found by tests/test_review18_damage.py and
the exploration behind it). Each case damages one record of a real task, as a disk or a
hand edit would, and checks what reads, runs and the CLI then do."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentium_graph import (
    AgentiumGraphError,
    DataIntegrityError,
    DurableRecoveryRequiredError,
    ErrorInfo,
    InMemoryDurableTaskStore,
    PlanValidationError,
    StoreSchemaError,
)
from agentium_graph.cli import cli as cli_group
from agentium_graph.runtime._terminal import error_from_info
from agentium_graph.store import TimelineRequest
from tests._review18_damage_tasks import build_tasks, runtime
from tests.conftest import Calls
from tests.test_review18_damage import time_limit

sqlite_store = pytest.importorskip("agentium_graph_sqlite")
SQLite = sqlite_store.SQLiteDurableTaskStore


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("damaged") / "base.db"

    async def build() -> None:
        async with SQLite(path) as store:
            await build_tasks(store)
    asyncio.run(build())
    return path


def damaged(base: Path, tmp_path: Path, *sql: tuple[str, tuple[Any, ...]]) -> Path:
    path = tmp_path / "t.db"
    path.write_bytes(base.read_bytes())
    with sqlite3.connect(path) as conn:
        for statement, args in sql:
            assert conn.execute(statement, args).rowcount == 1, statement
    return path


def edit(table: str, column: str, where: str, args: tuple[Any, ...],
         change: Callable[[Any], None], base: Path) -> tuple[str, tuple[Any, ...]]:
    """An UPDATE setting ``column`` of one row to its JSON changed by ``change``."""
    with sqlite3.connect(base) as conn:
        [(text,)] = conn.execute(f"SELECT {column} FROM {table} WHERE {where}", args)
    value = json.loads(text)
    change(value)
    return f"UPDATE {table} SET {column} = ? WHERE {where}", (json.dumps(value), *args)


def invoke(path: Path, *args: str) -> tuple[int, str, str]:
    with time_limit(" ".join(args)):
        result = CliRunner().invoke(cli_group, ["--store", f"sqlite:///{path}", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    return result.exit_code, result.stdout, result.stderr


async def run(path: Path, key: str) -> tuple[BaseException | None, dict[str, int]]:
    calls = Calls()
    async with SQLite(path) as store:
        try:
            await runtime(store, calls).run(key, "w-after")
        except Exception as exc:
            return exc, calls.by_node
    return None, calls.by_node


async def problems(path: Path, key: str) -> tuple[str, ...]:
    async with SQLite(path, read_only=True) as store:
        return (await runtime(store, Calls()).inspect(key)).problems


# --- the journal ----------------------------------------------------------------------------

def test_timeline_all_of_a_journal_missing_its_last_entries_ends(base: Path,
                                                                 tmp_path: Path) -> None:
    # Hung before: the page after the last stored entry was empty, so its next_cursor was
    # the cursor it was asked with, and --all asked again forever.
    path = damaged(base, tmp_path, ("DELETE FROM journal WHERE id = (SELECT MAX(id) FROM "
                                    "journal WHERE key = 'done')", ()))
    code, _, err = invoke(path, "timeline", "done", "--all")
    assert code == 4
    assert err.startswith("error: SQLite store: the journal of task 'done' is damaged")
    assert "restore the file from a backup" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("damage", ["swap", "renumber", "gap"])
def test_a_journal_page_out_of_order_or_with_a_gap_is_named(base: Path, tmp_path: Path,
                                                            damage: str) -> None:
    with sqlite3.connect(base) as conn:
        ids = [i for (i,) in conn.execute("SELECT id FROM journal WHERE key = 'planned' "
                                          "ORDER BY id")]
    sql = {"swap": ("UPDATE journal SET entries = (SELECT entries FROM journal WHERE id = ?) "
                    "WHERE id = ?", (ids[0], ids[-1])),
           "renumber": ("UPDATE journal SET entries = replace(entries, '\"seq\":2,', "
                        "'\"seq\":9,') WHERE id = ?", (ids[1],)),
           "gap": ("DELETE FROM journal WHERE id = ?", (ids[2],))}[damage]
    path = damaged(base, tmp_path, sql)

    async def read() -> None:
        async with SQLite(path, read_only=True) as store:
            await store.read_timeline(TimelineRequest(key="planned", limit=1000))
    with pytest.raises(StoreSchemaError) as info:
        asyncio.run(read())  # returned the page as it was before
    assert info.value.details["key"] == "planned"
    assert info.value.details["problem"].startswith("journal: ")


async def test_a_timeline_cursor_that_cannot_move_is_data_integrity_error() -> None:
    # Any store: a header whose journal_seq is past the journal's end made every page after
    # the last entry return that page's own cursor again.
    store = InMemoryDurableTaskStore()
    await build_tasks(store)
    task = store._tasks["done"]  # what a damaged store would hold
    task.header = task.header.model_copy(update={"journal_seq": task.header.journal_seq + 5})
    rt = runtime(store, Calls())
    page = await rt.timeline("done", limit=1000)
    assert page.next_cursor is not None
    with pytest.raises(DataIntegrityError, match="journal has no entry after seq"):
        await rt.timeline("done", cursor=page.next_cursor)


# --- records filed under another key ----------------------------------------------------------

def test_a_header_naming_another_key_is_damage(base: Path, tmp_path: Path) -> None:
    # Was read as task 'other': inspect verified it, run raised errors about 'other', and
    # resolve failed as a usage error.
    path = damaged(base, tmp_path, edit("tasks", "header", "key = ?", ("stale",),
                                        lambda h: h.update(key="other"), base))
    with pytest.raises(StoreSchemaError, match=r"header\.key is 'other', not the row's 'stale'"):
        asyncio.run(problems(path, "stale"))
    code, out, err = invoke(path, "list", "--json")
    assert code == 4 and [d["key"] for d in json.loads(out)["damaged"]] == ["stale"]
    assert "header.key is 'other'" in json.loads(out)["damaged"][0]["reason"]
    assert err.startswith("error: task 'stale' is damaged")


def test_a_node_record_naming_another_node_is_damage(base: Path, tmp_path: Path) -> None:
    # Before: inspect verified it, and run failed the task (n1 "has no output" from n0).
    path = damaged(base, tmp_path, edit(
        "nodes", "record", "key = ? AND node_id = ?", ("stale", "n0"),
        lambda r: r.update(node_id="zz"), base))
    with pytest.raises(StoreSchemaError, match="node_id is 'zz', not the row's 'n0'"):
        asyncio.run(problems(path, "stale"))
    error, calls = asyncio.run(run(path, "stale"))
    assert isinstance(error, StoreSchemaError) and calls == {}


def test_an_action_record_naming_another_action_is_damage(base: Path, tmp_path: Path) -> None:
    with sqlite3.connect(base) as conn:
        [(action_id,)] = conn.execute("SELECT action_id FROM actions WHERE key = 'rr'")
    path = damaged(base, tmp_path, edit(
        "actions", "record", "key = ? AND action_id = ?", ("rr", action_id),
        lambda r: r.update(action_id="act_other"), base))
    with pytest.raises(StoreSchemaError, match="action_id is 'act_other'"):
        asyncio.run(problems(path, "rr"))
    code, _, err = invoke(path, "resolve", "rr", action_id, "--absent", "--actor", "op")
    assert code == 4 and err.startswith("error: SQLite store")


# --- what a run must not build on ----------------------------------------------------------

def test_a_missing_node_row_stops_the_run_typed(base: Path, tmp_path: Path) -> None:
    # Was a bare KeyError('n0') from the run loop (a traceback for the host).
    path = damaged(base, tmp_path, ("DELETE FROM nodes WHERE key = 'stale' AND "
                                    "node_id = 'n0'", ()))
    assert asyncio.run(problems(path, "stale")) == (
        "node 'n0' of the plan has no stored record",)
    error, calls = asyncio.run(run(path, "stale"))
    assert isinstance(error, DataIntegrityError), error
    assert "node 'n0' of the plan has no stored record" in str(error) and calls == {}


def test_a_completed_node_without_an_output_digest_fails_nothing(base: Path,
                                                                 tmp_path: Path) -> None:
    # Before: inspect verified it, and run failed n1 ("node 'n0' has no output"), ending a
    # recoverable task failed on top of the damage.
    path = damaged(base, tmp_path, edit(
        "nodes", "record", "key = ? AND node_id = ?", ("stale", "n0"),
        lambda r: r.update(output_digest=None), base))
    assert "node 'n0': completed without an output digest" in asyncio.run(
        problems(path, "stale"))
    error, calls = asyncio.run(run(path, "stale"))
    assert isinstance(error, DataIntegrityError) and calls == {}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT status FROM tasks WHERE key = 'stale'").fetchone() == (
            "running",)


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_run_follows_only_the_identity_its_digest_names(base: Path, tmp_path: Path,
                                                          damage: str) -> None:
    # Before: run read the identity without checking it, so a plan edited in the store ran
    # (n2 with x = 1000) and a missing identity said "no task with key 'stale'".
    def change(identity: Any) -> None:
        identity["plan"]["nodes"][2]["args"] = {"x": 1000}
    sql = edit("identities", "identity", "key = ?", ("stale",), change, base) \
        if damage == "changed" else ("DELETE FROM identities WHERE key = 'stale'", ())
    path = damaged(base, tmp_path, sql)
    assert asyncio.run(problems(path, "stale"))  # inspect saw it before too
    error, calls = asyncio.run(run(path, "stale"))
    assert isinstance(error, DataIntegrityError), error
    assert f"identity record (plan, descriptors, input) {'is missing' if damage == 'missing' else 'does not match'}" in str(error)  # noqa: E501
    assert calls == {}


IMPOSSIBLE: dict[str, tuple[str, Callable[[Any], None], str, str]] = {
    "negative fence": ("tasks", lambda h: h.update(fence=-1), "stale",
                       "header: fence is -1, below 0"),
    "negative counter": ("tasks", lambda h: h["counters"].update(tool_calls=-4), "stale",
                         "counter tool_calls=-4 is below 0"),
    "lease of another fence": ("tasks", lambda h: h["lease"].update(fence=9), "stale",
                               "header: the lease's fence 9 is not the task's fence 2"),
    "attempt under a fence never granted": (
        "nodes", lambda r: r["attempts"][0].update(fence=77), "stale",
        "node 'n0': attempt #1 ran under fence 77, which the task (fence 2) never granted"),
    "action under a fence never granted": (
        "actions", lambda a: a.update(fence=50), "rr", "recorded under fence 50"),
    "action of no node": ("actions", lambda a: a.update(node_id="ghost"), "rr",
                          "its node 'ghost' has no record"),
}


@pytest.mark.parametrize("name", sorted(IMPOSSIBLE))
def test_impossible_values_are_problems_and_runs_refuse_them(base: Path, tmp_path: Path,
                                                             name: str) -> None:
    # Before: inspect said verified=True, and run of 'stale' ran n1 and n2 on top.
    table, change, key, problem = IMPOSSIBLE[name]
    with sqlite3.connect(base) as conn:
        if table == "tasks":
            where, args = "key = ?", (key,)
        elif table == "nodes":
            where, args = "key = ? AND node_id = ?", (key, "n0")
        else:
            [(action_id,)] = conn.execute("SELECT action_id FROM actions WHERE key = ?", (key,))
            where, args = "key = ? AND action_id = ?", (key, action_id)
    column = {"tasks": "header", "nodes": "record", "actions": "record"}[table]
    path = damaged(base, tmp_path, edit(table, column, where, args, change, base))
    found = asyncio.run(problems(path, key))
    assert any(problem in p for p in found), found
    code, out, _ = invoke(path, "inspect", key, "--json")
    assert code == 0 and json.loads(out)["verified"] is False
    if name != "lease of another fence":  # an expired lease: the next one replaces it
        error, calls = asyncio.run(run(path, key))
        # rr is recovery_required: run() refuses it before reading its records.
        assert isinstance(error, AgentiumGraphError if key == "rr" else DataIntegrityError)
        assert calls == {}, calls


def test_an_intact_store_has_no_problems(base: Path) -> None:
    for key in ("canceled", "done", "failed", "planned", "rr", "stale"):
        assert asyncio.run(problems(base, key)) == (), key


# --- free-form error details ---------------------------------------------------------------

def test_a_recovery_required_header_with_damaged_action_ids_is_still_typed(
        base: Path, tmp_path: Path) -> None:
    # Was TypeError("'NoneType' object is not iterable") out of run() (found by the
    # property test's deep profile).
    path = damaged(base, tmp_path, edit("tasks", "header", "key = ?", ("rr",),
                                        lambda h: h["error"]["details"].update(action_ids=None),
                                        base))
    error, calls = asyncio.run(run(path, "rr"))
    assert isinstance(error, DurableRecoveryRequiredError) and calls == {}


def test_damaged_planner_diagnostics_still_make_a_typed_error() -> None:
    for diagnostics in (None, 3, ["x"], [{"path": 1}]):
        info = ErrorInfo(code=PlanValidationError.code, message="rejected",
                         details={"diagnostics": diagnostics})
        assert isinstance(error_from_info("t", info), AgentiumGraphError)


def test_a_negative_journal_seq_is_damage_not_a_bad_cursor(base: Path, tmp_path: Path) -> None:
    # Was "invalid timeline cursor ... points past the end of the journal (-1 entries)", a
    # usage error (exit 2) for a command given no cursor (found on MongoDB by the property
    # test's deep profile; the same on every store).
    path = damaged(base, tmp_path, edit("tasks", "header", "key = ?", ("done",),
                                        lambda h: h.update(journal_seq=-1), base))
    code, _, err = invoke(path, "timeline", "done")
    assert code == 4 and "journal holds -1 entries" in err


def test_a_status_column_that_differs_from_the_header_is_damage(base: Path,
                                                                tmp_path: Path) -> None:
    # Review 19: `list --status` filters on the column, so a column edited apart from the
    # header listed the task under a status it does not have (and hid it from its own).
    with sqlite3.connect(base) as conn:
        [(status,)] = conn.execute("SELECT status FROM tasks WHERE key = 'stale'")
    other = "completed" if status != "completed" else "failed"
    path = damaged(base, tmp_path, ("UPDATE tasks SET status = ? WHERE key = 'stale'",
                                    (other,)))
    for args in (["list", "--json"], ["list", "--status", other, "--json"]):
        code, out, err = invoke(path, *args)
        listing = json.loads(out)
        assert code == 4, args
        assert [d["key"] for d in listing["damaged"]] == ["stale"], args
        assert f"the status column says '{other}' but the header says '{status}'" in \
            listing["damaged"][0]["reason"]
        assert "stale" not in [t["key"] for t in listing["tasks"]]
        assert err.startswith("error: task 'stale' is damaged"), err
    code, out, _ = invoke(path, "list", "--status", status, "--json")
    assert "stale" not in [t["key"] for t in json.loads(out)["tasks"]]
