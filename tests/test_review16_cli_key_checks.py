"""Review 16: every command holds a KEY to the same rule, the runtime's (``check_key``).

``timeline ''`` was a usage error (exit 2: the runtime checks the key) while ``inspect ''``
and ``cancel ''`` answered "no task with key ''" (exit 3), and a 100 000-character KEY came
back whole in that one error line; ``runtime.inspect('')`` and ``runtime.cancel('')`` raise
ConfigurationError. A key no task can have is now a usage error for every command.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import EXIT_NOT_FOUND, EXIT_USAGE, cli
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")


async def _create(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        await rt.create("k" * 200, program(chain_plan(1)))


@pytest.mark.parametrize("key", ["", "x" * 201, "y" * 100_000])
@pytest.mark.parametrize("command", [("inspect",), ("inspect", "--json"), ("timeline",),
                                     ("cancel", "--reason", "r"),
                                     ("resolve", "act_1", "--absent", "--actor", "me")])
def test_a_key_no_task_can_have_is_a_usage_error_everywhere(
        tmp_path: Path, command: tuple[str, ...], key: str) -> None:
    path = tmp_path / "tasks.db"
    asyncio.run(_create(path))
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", command[0], key,
                                      *command[1:]])
    assert result.exit_code == EXIT_USAGE, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "at most 200" in lines[0] and len(lines[0]) < 300


def test_the_longest_key_still_works_and_an_unknown_one_is_still_exit_3(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    asyncio.run(_create(path))
    store = ["--store", f"sqlite:///{path}"]
    assert CliRunner().invoke(cli, [*store, "inspect", "k" * 200]).exit_code == 0
    assert CliRunner().invoke(cli, [*store, "inspect", "nope"]).exit_code == EXIT_NOT_FOUND
