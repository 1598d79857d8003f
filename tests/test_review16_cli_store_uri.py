"""Review 16: store URIs a hostile or hurried user writes, through the parser and the CLI."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph import ExecutionGraphRuntime
from agentium_graph._store_uri import open_store_uri, parse_store_uri, redact
from agentium_graph.cli import EXIT_STORE, EXIT_USAGE, cli
from agentium_graph.errors import ConfigurationError
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")


@pytest.mark.parametrize("uri", ["mongodb://[::1/db", "mongodb://h]/db",
                                 "mongodb+srv://[zz]/db"])
def test_a_broken_ipv6_host_is_a_configuration_error_not_a_traceback(uri: str) -> None:
    # urlsplit raised a bare ValueError ("Invalid IPv6 URL"): the CLI printed a traceback.
    with pytest.raises(ConfigurationError, match="accepted forms"):
        parse_store_uri(uri)
    result = CliRunner().invoke(cli, ["--store", uri, "list"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: invalid store URI")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("query", ["?synchronous=normal", "?mode=ro", "?", "?timeout=5"])
def test_a_sqlite_uri_with_a_query_string_is_refused_not_made_a_file_name(
        tmp_path: Path, query: str) -> None:
    # The query string was taken as part of the file name: a store (the demo's) created
    # 'tasks.db?synchronous=normal' next to the intended file, still at synchronous=FULL.
    uri = f"sqlite:///{tmp_path}/tasks.db{query}"
    with pytest.raises(ConfigurationError, match="takes no options") as info:
        open_store_uri(uri)
    assert "tasks.db" in str(info.value)
    assert list(tmp_path.iterdir()) == []
    result = CliRunner().invoke(cli, ["--store", uri, "list"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "takes no options" in result.stderr


@pytest.mark.parametrize("name", ["host:1@run.db", "a:b@c/d:e@f.db"])
def test_a_sqlite_path_holding_colon_and_at_is_shown_as_it_is(tmp_path: Path,
                                                              name: str) -> None:
    # redact() read "host:1@" as user:password@ and showed 'sqlite:///host:***@run.db': the
    # `more:` line to paste and every message named another file.
    uri = f"sqlite:///{name}"
    assert redact(uri) == uri
    path = tmp_path / "host:1@run.db"
    asyncio.run(_create(path, 3))
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "list", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert f"sqlite:///{path}" in result.stdout.splitlines()[-1]
    assert "***" not in result.stdout
    # A URI with a password is still redacted, for every scheme that can carry one.
    assert redact("mongodb://u:secret@h/db") == "mongodb://u:***@h/db"
    assert redact("sqlite://u:secret@h/x.db") == "sqlite://u:***@h/x.db"


async def _create(path: Path, count: int) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for index in range(count):
            await rt.create(f"k{index}", program(chain_plan(1)))


def test_list_goes_on_past_a_header_that_is_not_utf8(tmp_path: Path) -> None:
    # sqlite3 failed the whole fetch on it ("Could not decode to UTF-8 column 'header' with
    # text '<garbage>'"), naming no task: `list` printed that and listed nothing.
    path = tmp_path / "tasks.db"
    asyncio.run(_create(path, 3))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE tasks SET header = CAST(? AS TEXT) WHERE key = 'k1'",
                     (b'{"key": "\xff\xfe',))
    conn.close()
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "list", "--json"])
    assert result.exit_code == EXIT_STORE, result.output
    listed = json.loads(result.stdout)
    assert [t["key"] for t in listed["tasks"]] == ["k0", "k2"]
    assert [d["key"] for d in listed["damaged"]] == ["k1"]
    assert len(result.stderr.splitlines()) == 1
    assert "\ufffd" not in result.stderr
    inspected = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "inspect", "k1"])
    assert inspected.exit_code == EXIT_STORE, inspected.output
    assert "not valid UTF-8" in inspected.stderr and "backup" in inspected.stderr
    assert "\ufffd" not in inspected.stderr
