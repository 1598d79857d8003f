"""Review 16: the CLI's own output failing to be written (a full disk) is one ``error:`` line.

``agentium-graph list --json > out.json`` on a full filesystem died with a traceback (the
OSError from writing stdout), where every other failure is one line on stderr. A closed
pipe (``| head``) stays quiet, as click makes it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import EXIT_ERROR
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


async def _create(path: Path, count: int) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for index in range(count):
            await rt.create(f"k{index}", program(chain_plan(1)))


@pytest.mark.parametrize("args", [("list",), ("list", "--json"), ("inspect", "k1"),
                                  ("timeline", "k1", "--json")])
def test_a_full_disk_under_stdout_is_one_error_line(tmp_path: Path,
                                                     args: tuple[str, ...]) -> None:
    path = tmp_path / "tasks.db"
    asyncio.run(_create(path, 3))
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "agentium_graph", "--store", f"sqlite:///{path}", *args],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == EXIT_ERROR, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "No space left on device" in lines[0]
    assert "output" in lines[0]
