"""Found by review 25 (a hostile user's paths). A file where a directory of the store path
must be was reported as a missing directory with 'mkdir -p' advice that fails, and a
symlink loop as a missing file; a CLI command on a locked file waited through a worker's
retries. Each test failed before."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import EXIT_STORE, cli
from agentium_graph.errors import StoreError
from tests._cli_helpers import one_line_error
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")


def test_a_file_on_the_path_is_named_not_a_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "x.db").write_bytes(b"")
    line = one_line_error(CliRunner().invoke(
        cli, ["--store", f"sqlite:///{tmp_path / 'x.db' / 'inner.db'}", "list"]),
        EXIT_STORE, "is a file, not a directory")
    assert "mkdir" not in line


async def test_the_store_names_the_file_standing_where_a_directory_must_be(
        tmp_path: Path) -> None:
    (tmp_path / "x.db").write_bytes(b"")
    with pytest.raises(StoreError) as info:
        async with sqlite.SQLiteDurableTaskStore(tmp_path / "x.db" / "a" / "b.db") as store:
            await store.get_header("k")
    assert "is a file, not a directory" in str(info.value) and "mkdir" not in str(info.value)
    assert (tmp_path / "x.db").read_bytes() == b""


def test_a_symlink_loop_is_not_reported_as_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    line = one_line_error(CliRunner().invoke(
        cli, ["--store", f"sqlite:///{tmp_path / 'loop1'}", "list"]), EXIT_STORE,
        "symbolic links")
    assert "no such file" not in line


def test_a_cli_command_on_a_locked_file_waits_one_busy_timeout(tmp_path: Path) -> None:
    # It waited through the store's backed-off retries (about 26 s) and then named store
    # options the CLI has no flag for.
    path = tmp_path / "lock.db"

    async def create() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            await ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store).create(
                "p1", program(chain_plan(1)))
    asyncio.run(create())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write transaction
    try:
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "cancel", "p1",
                                          "--reason", "r"])
        line = one_line_error(result, EXIT_STORE, "locked", "retry")
        assert "1 attempt(s)" in line
    finally:
        holder.execute("ROLLBACK")
        holder.close()
