"""Review 16: one task's long cancel reason no longer floods ``list``.

A reason is free text of any length (``runtime.cancel(key, reason=traceback.format_exc())``):
the list's cancel cell folded all of it, so one 5000-character reason made the table 44
lines at 200 columns (237 in a terminal of 80), burying every other task. The
cell now shows the first 80 characters and ``…``, like the damaged-row reason;
``inspect`` and ``--json`` keep the whole reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import cli
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

REASON = "Traceback (most recent call last):\n" + "  File 'x.py', line 1\n" * 230


async def _create(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for key in ("a", "b", "c"):
            await rt.create(key, program(chain_plan(1)))
        await rt.cancel("b", reason=REASON)


def test_a_long_cancel_reason_is_one_short_cell(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    asyncio.run(_create(path))
    store = ["--store", f"sqlite:///{path}"]
    listed = CliRunner().invoke(cli, [*store, "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    rows = [line for line in listed.stdout.splitlines() if line.strip()]
    assert len(rows) <= 8, listed.stdout  # title, header, rule and the three tasks
    assert "Traceback (most recent call last):\\n" in listed.stdout
    assert "…" in listed.stdout
    as_json = CliRunner().invoke(cli, [*store, "list", "--json"])
    tasks = {t["key"]: t for t in json.loads(as_json.stdout)["tasks"]}
    assert tasks["b"]["cancel"]["reason"] == REASON
