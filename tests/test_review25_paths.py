"""Found by review 25 (a hostile user's paths). A file where a directory of the store path
must be was reported as a missing directory with 'mkdir -p' advice that fails, and a
symlink loop as a missing file. Each test failed before."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph.cli import EXIT_STORE, cli
from agentium_graph.errors import StoreError
from tests._cli_helpers import one_line_error

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
