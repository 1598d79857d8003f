"""The demo and the group's --store (found in stop 23): ``agentium-graph --store URI demo``
ran the demo on a temporary file and left URI untouched, so the ``inspect`` the user ran
next on URI found no task. An explicit group --store is the demo's store now; the
AGENTIUM_STORE variable and the group's default still are not (the demo never writes into
a store nobody named for it). The first, third and fourth tests failed before."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import EXIT_USAGE, cli
from agentium_graph.demo._demo import KEY as DEMO_KEY
from agentium_graph.demo.pipeline import build_catalog, build_program
from tests._cli_helpers import one_line_error

sqlite = pytest.importorskip("agentium_graph_sqlite")


def _with_demo_task(path: Path) -> str:
    """A SQLite file already holding the demo's task; returns its digest."""

    async def create() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            await ExecutionGraphRuntime(catalog=build_catalog(), store=store).create(
                DEMO_KEY, build_program())
    asyncio.run(create())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_group_store_given_on_the_command_line_is_the_demos(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    before = _with_demo_task(path)
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "demo"])
    # Refused because that store already holds the demo's task: the demo opened it.
    one_line_error(result, EXIT_USAGE, DEMO_KEY, "already exists")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_the_same_store_named_twice_is_one_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'd.db'}"
    _with_demo_task(tmp_path / "d.db")
    result = CliRunner().invoke(cli, ["--store", uri, "demo", "--store", uri])
    one_line_error(result, EXIT_USAGE, DEMO_KEY, "already exists")


def test_two_different_stores_are_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'a.db'}", "demo",
                                      "--store", f"sqlite:///{tmp_path / 'b.db'}"])
    one_line_error(result, EXIT_USAGE, "two stores", "name one")
    assert list(tmp_path.iterdir()) == []


def test_database_is_refused_not_ignored(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--database", "other", "demo"])
    one_line_error(result, EXIT_USAGE, "--database", "URI's path")


def test_agentium_store_in_the_environment_is_not_the_demos(tmp_path: Path) -> None:
    path = tmp_path / "env.db"
    before = _with_demo_task(path)
    result = CliRunner().invoke(cli, ["demo", "--delay", "0.05"],
                                env={"AGENTIUM_STORE": f"sqlite:///{path}"})
    assert result.exit_code == 0, result.output
    assert "no completed node re-ran: yes" in result.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
