"""Fixes from the CLI review: bad text and cursors, read-only commands, damaged rows, the
demo on a used store, copy-pasteable paging hints, blank actors, paths and MongoDB URIs.
Each test failed before its fix."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentium_graph import ExecutionGraphRuntime
from agentium_graph._store_uri import parse_store_uri, redact
from agentium_graph.cli import EXIT_STORE, EXIT_USAGE, cli
from agentium_graph.demo._demo import KEY as DEMO_KEY
from agentium_graph.demo.pipeline import build_catalog, build_program
from agentium_graph.errors import ConfigurationError
from agentium_graph.runtime._args import encode_cursor
from tests._cli_helpers import one_line_error
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

SPACED = "order 1"


async def _populate(path: Path, keys: tuple[str, ...] = ("a", "b", "c", SPACED)) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for key in keys:
            await rt.create(key, program(chain_plan(2)))
        await rt.run(SPACED, worker_id="w1")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.db"
    asyncio.run(_populate(path))
    return path


def invoke(store: Path | str, *args: str) -> Result:
    uri = store if isinstance(store, str) else f"sqlite:///{store}"
    return CliRunner().invoke(cli, ["--store", uri, *args], env={"COLUMNS": "200"})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _schema_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute(
            "SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0])
    finally:
        conn.close()


# --- 2. text that is not UTF-8, cursors out of range ---------------------------------------

BAD = "x\udcff"  # what Python makes of the byte 0xff in a command-line argument


@pytest.mark.parametrize(("args", "name"), [
    (("inspect", BAD), "KEY"),
    (("timeline", BAD), "KEY"),
    (("list", "--after", BAD), "--after"),
    (("cancel", "a", "--reason", BAD), "--reason"),
    (("cancel", BAD, "--reason", "r"), "KEY"),
    (("resolve", "a", "act", "--absent", "--actor", BAD), "--actor"),
    (("resolve", BAD, "act", "--absent", "--actor", "me"), "KEY"),
])
def test_arguments_that_are_not_utf8_are_one_line_usage_errors(
        db: Path, args: tuple[str, ...], name: str) -> None:
    before = _sha(db)
    one_line_error(invoke(db, *args), EXIT_USAGE, name, "UTF-8")
    assert _sha(db) == before


def test_a_cursor_beyond_any_position_is_a_usage_error(db: Path) -> None:
    cursor = encode_cursor(SPACED, 10**20)
    one_line_error(invoke(db, "timeline", SPACED, "--cursor", cursor), EXIT_USAGE, "cursor")


# --- 3. list, inspect and timeline only read ------------------------------------------------

def _blank(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("DROP TABLE t")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("args", [("list",), ("inspect", "k"), ("timeline", "k"),
                                  ("cancel", "k", "--reason", "r")])
def test_a_blank_sqlite_file_is_not_a_task_database_and_stays_blank(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    path = tmp_path / "blank.db"
    _blank(path)
    before = _sha(path)
    one_line_error(invoke(path, *args), EXIT_STORE, "not an agentium-graph database")
    assert _sha(path) == before
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    conn.close()


def _as_version_1(path: Path) -> None:
    """Rewrite the file as schema version 1 left it (one journal row per entry)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    rows = conn.execute("SELECT key, entries FROM journal").fetchall()
    conn.execute("DROP TABLE journal")
    conn.execute("CREATE TABLE journal (key TEXT NOT NULL, seq INTEGER NOT NULL, "
                 "entry TEXT NOT NULL, PRIMARY KEY (key, seq)) WITHOUT ROWID")
    for key, text in rows:
        for entry in json.loads(text):
            conn.execute("INSERT INTO journal VALUES (?, ?, ?)",
                         (key, entry["seq"], json.dumps(entry)))
    conn.execute("CREATE TABLE nodes_v1 (key TEXT NOT NULL, node_id TEXT NOT NULL, "
                 "record TEXT NOT NULL, PRIMARY KEY (key, node_id)) WITHOUT ROWID")
    conn.execute("INSERT INTO nodes_v1 SELECT key, node_id, record FROM nodes")
    conn.execute("DROP TABLE nodes")
    conn.execute("ALTER TABLE nodes_v1 RENAME TO nodes")
    conn.execute("UPDATE meta SET value = '1' WHERE name = 'schema_version'")
    conn.execute("PRAGMA user_version = 0")  # version 1 set none
    conn.execute("COMMIT")
    conn.close()


def test_reading_commands_leave_an_older_schema_as_it_is(db: Path) -> None:
    expected = invoke(db, "timeline", SPACED, "--json", "--all")
    assert expected.exit_code == 0
    _as_version_1(db)
    before = _sha(db)
    for args in (("list",), ("inspect", SPACED), ("timeline", SPACED, "--all")):
        result = invoke(db, *args)
        assert result.exit_code == 0, result.output
    assert invoke(db, "timeline", SPACED, "--json", "--all").stdout == expected.stdout
    assert _schema_version(db) == "1" and _sha(db) == before
    # A writing command migrates it, as a worker does.
    assert invoke(db, "cancel", "a", "--reason", "r").exit_code == 0
    assert _schema_version(db) != "1"


# --- 4. a damaged row -----------------------------------------------------------------------

def test_a_damaged_row_is_named_in_a_one_line_store_error(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("UPDATE tasks SET header = '{x' WHERE key = 'b'")
    conn.commit()
    conn.close()
    line = one_line_error(invoke(db, "list"), EXIT_STORE, "'b'", "damaged", "backup")
    assert "upgrade" not in line
    assert invoke(db, "inspect", "a").exit_code == 0


# --- 5. the demo on a store that already has its task ---------------------------------------

def test_demo_refuses_a_store_that_already_has_its_task(tmp_path: Path) -> None:
    path = tmp_path / "d.db"

    async def first_run() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            rt = ExecutionGraphRuntime(catalog=build_catalog(), store=store)
            await rt.create(DEMO_KEY, build_program())
    asyncio.run(first_run())
    before = _sha(path)
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{path}"])
    one_line_error(result, EXIT_USAGE, DEMO_KEY, "already exists", "omit --store")
    assert _sha(path) == before


# --- 6. paging hints are copy-pasteable -----------------------------------------------------

def _hint(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("more: ")]
    assert len(line) == 1, result.stdout
    return shlex.split(line[0][len("more: "):])


def test_timeline_hint_quotes_the_key_and_keeps_the_options(db: Path) -> None:
    argv = _hint(invoke(db, "timeline", SPACED, "--limit", "2"))
    assert argv[:3] == ["agentium-graph", "--store", f"sqlite:///{db}"]
    assert argv[3:6] == ["timeline", SPACED, "--limit"]
    second = CliRunner().invoke(cli, argv[1:], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert "3 " in second.stdout and "task_created" not in second.stdout


def test_list_hint_keeps_status_limit_and_store(db: Path) -> None:
    argv = _hint(invoke(db, "list", "--status", "pending", "--limit", "1"))
    assert argv[:4] == ["agentium-graph", "--store", f"sqlite:///{db}", "list"]
    assert argv[argv.index("--status"):argv.index("--status") + 2] == ["--status", "pending"]
    assert argv[argv.index("--limit"):argv.index("--limit") + 2] == ["--limit", "1"]
    assert argv[-2:] == ["--after", "a"]
    second = CliRunner().invoke(cli, argv[1:], env={"COLUMNS": "200"})
    assert second.exit_code == 0 and " b " in second.stdout and " a " not in second.stdout


def test_hint_leaves_out_a_store_from_the_environment_and_never_shows_a_password(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["list", "--limit", "1"],
                                env={"AGENTIUM_STORE": f"sqlite:///{db}", "COLUMNS": "200"})
    argv = _hint(result)
    assert "--store" not in argv and argv[1:] == ["list", "--limit", "1", "--after", "a"]
    from agentium_graph import cli as cli_module
    assert cli_module._hint(  # the same redaction as every message
        cli_module.CliConfig(store_uri="mongodb://u:secret@h/db", store_given=True),
        ["list"]) == "agentium-graph --store 'mongodb://u:***@h/db' list"


# --- 7. a blank actor ------------------------------------------------------------------------

@pytest.mark.parametrize("actor", [" ", "\t\n"])
def test_resolve_refuses_a_blank_actor(db: Path, actor: str) -> None:
    before = _sha(db)
    result = invoke(db, "resolve", "a", "act", "--absent", "--actor", actor)
    assert result.exit_code == EXIT_USAGE and "--actor" in result.output
    assert _sha(db) == before


# --- 8. paths -------------------------------------------------------------------------------

def test_a_directory_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "somedir").mkdir()
    one_line_error(invoke(f"sqlite:///{tmp_path / 'somedir'}", "list"), EXIT_STORE,
                   "is a directory")
    one_line_error(invoke(f"sqlite:///{tmp_path / 'somedir'}/", "list"), EXIT_USAGE,
                   "names a directory")


@pytest.mark.parametrize("path", ["x\0.db", "x\udcff.db"])
def test_a_path_no_file_can_have_is_a_usage_error(tmp_path: Path, path: str) -> None:
    one_line_error(invoke(f"sqlite:///{tmp_path}/{path}", "list"), EXIT_USAGE)


# --- 9. MongoDB URIs ------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "fragment"), [
    ("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=abc", "serverSelectionTimeoutMS"),
    ("mongodb://127.0.0.1:1/?bogusOption=1", "bogusOption"),
])
def test_bad_mongodb_options_are_one_line_usage_errors(uri: str, fragment: str) -> None:
    pytest.importorskip("pymongo")
    line = one_line_error(invoke(uri, "list"), EXIT_USAGE, fragment)
    assert "Warning" not in line


def test_an_empty_user_name_is_not_shown_as_a_password() -> None:
    assert redact("mongodb://@h/") == "mongodb://@h/"
    with pytest.raises(ConfigurationError) as info:
        parse_store_uri("mongodb://@h/")
    assert "***" not in str(info.value) and "user name" in str(info.value)
    assert redact("mongodb://u:p@h/") == "mongodb://u:***@h/"
    assert redact("mongodb://:p@h/") == "mongodb://:***@h/"


def test_the_cli_opens_mongodb_to_fail_fast_but_workers_keep_their_retries() -> None:
    pytest.importorskip("pymongo")
    from agentium_graph._store_uri import open_store_uri

    cli_store = open_store_uri("mongodb://127.0.0.1:1/x", must_exist=True)
    worker_store = open_store_uri("mongodb://127.0.0.1:1/x")
    # One attempt for a command (an unreachable server is reported after one server
    # selection, about 5 s, not after three retries, about 21 s); the default for a worker.
    assert cli_store._retries == 0  # type: ignore[attr-defined]
    assert worker_store._retries == 3  # type: ignore[attr-defined]
