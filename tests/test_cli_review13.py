"""Fixes from the thirteenth CLI review: stored text cannot drive the terminal, output on a
stdout that is not UTF-8, the last page of ``list --limit 1000``, the demo's temporary
directory and worker processes, usage errors on one line. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentium_graph import ExecutionGraphRuntime, ToolBinding
from agentium_graph.cli import EXIT_USAGE, CliConfig, _hint, cli
from agentium_graph.demo._demo import KEY as DEMO_KEY
from agentium_graph.demo.pipeline import build_catalog, build_program
from tests._cli_helpers import one_line_error, worker_running
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

ROOT = Path(__file__).resolve().parent.parent
# What a terminal acts on: C0 controls (the table's own newlines aside), DEL, C1 controls.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")
EVIL_ERROR = ("tool said \x1b[31mRED\x1b[0m \x1b]8;;http://evil/\x07click\x1b]8;;\x07 "
              "\x1b[2K\x1b[1Afake line\rOVER\x9b2J\x7f")
EVIL_REASON = "because \x1b[2J\x1b[Hcleared \u202eesrever\x1b[31m"
LETTERS = "café-ünïcødé-☕"


def invoke(store: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", f"sqlite:///{store}", *args],
                              env={"COLUMNS": "250"})


# --- 1. stored text cannot drive the terminal -----------------------------------------------

def _boom(args: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError(args["msg"])


async def _evil(path: Path) -> None:
    boom = ToolBinding(id="boom", version="1", execute=_boom, recovery="pure",
                       input_schema={"type": "object"}, output_schema={"type": "object"})
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls(), [boom]), store=store)
        await rt.create("failing", program({"schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "a", "binding": "boom", "version": "1", "args": {"msg": EVIL_ERROR}}]}))
        with pytest.raises(Exception, match="tool said"):
            await rt.run("failing", worker_id="w")
        await rt.create(LETTERS, program(chain_plan(1)))
        await rt.cancel(LETTERS, reason=EVIL_REASON)


@pytest.fixture
def evil(tmp_path: Path) -> Path:
    path = tmp_path / "evil.db"
    asyncio.run(_evil(path))
    return path


def _shown_escaped(output: str, *fragments: str) -> None:
    assert not RAW_CONTROL.findall(output), RAW_CONTROL.findall(output)
    for fragment in fragments:
        assert fragment in output, output


@pytest.mark.parametrize("args, fragments", [
    (("list",), [r"because \x1b[2J\x1b[Hcleared \u202eesrever\x1b[31m", LETTERS]),
    (("inspect", "failing"),
     [r"tool said \x1b[31mRED\x1b[0m \x1b]8;;http://evil/\x07click\x1b]8;;\x07",
      r"\x1b[2K\x1b[1Afake line\rOVER\x9b2J\x7f"]),
    (("inspect", LETTERS), [f"task {LETTERS}", r"because \x1b[2J\x1b[Hcleared"]),
    (("timeline", LETTERS), [f"timeline of {LETTERS}", r"cleared \u202e"]),
])
def test_tables_show_control_characters_of_stored_text_as_escapes(
        evil: Path, args: tuple[str, ...], fragments: list[str]) -> None:
    result = invoke(evil, *args)
    assert result.exit_code == 0, result.output
    _shown_escaped(result.stdout, *fragments)


def test_json_keeps_stored_text_exact_and_escaped(evil: Path) -> None:
    result = invoke(evil, "inspect", "failing", "--json")
    assert result.exit_code == 0, result.output
    # DEL and C1 controls too (json.dumps escapes only C0) as \u escapes: the same text.
    assert not RAW_CONTROL.search(result.stdout), RAW_CONTROL.findall(result.stdout)
    assert EVIL_ERROR in json.loads(result.stdout)["error"]["message"]
    listed = invoke(evil, "list", "--json")
    assert not RAW_CONTROL.search(listed.stdout), RAW_CONTROL.findall(listed.stdout)
    assert [t["cancel"] and t["cancel"]["reason"] for t in json.loads(listed.stdout)["tasks"]
            ] == [EVIL_REASON, None]


def test_paging_hint_quotes_a_key_with_control_characters_for_the_shell() -> None:
    key = "k\x1b[2J'\\ é\u202e\x9b"
    hint = _hint(CliConfig(store_uri="sqlite:///x.db"), ["list", "--after", key])
    assert not RAW_CONTROL.search(hint), hint
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("needs bash to check the quoting")
    words = subprocess.run([bash, "-c", f"printf '%s\\0' {hint}"], capture_output=True,
                           check=True).stdout.split(b"\0")[:-1]
    assert words == [w.encode() for w in ["agentium-graph", "list", "--after", key]]


# --- 2. a stdout that is not UTF-8 ----------------------------------------------------------

async def _unicode(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for key in (LETTERS, "plain"):
            await rt.create(key, program(chain_plan(1)))
        await rt.run(LETTERS, worker_id="wörker-☕")


@pytest.fixture(scope="module")
def unicode_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("enc") / "u.db"
    asyncio.run(_unicode(path))
    return path


def _run_cli(encoding: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "200"}
    env.pop("AGENTIUM_STORE", None)
    return subprocess.run([sys.executable, "-m", "agentium_graph", *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("encoding", ["cp1252", "latin-1", "ascii"])
def test_json_stays_valid_json_on_a_stdout_that_is_not_utf8(
        unicode_db: Path, encoding: str) -> None:
    proc = _run_cli(encoding, "--store", f"sqlite:///{unicode_db}", "inspect", LETTERS, "--json")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    document = json.loads(proc.stdout.decode(encoding))
    assert document["key"] == LETTERS and document["status"] == "completed"


@pytest.mark.parametrize("encoding", ["cp1252", "latin-1", "ascii"])
def test_tables_degrade_on_a_stdout_that_is_not_utf8(unicode_db: Path, encoding: str) -> None:
    for args in (["inspect", LETTERS], ["list", "--limit", "1"]):
        proc = _run_cli(encoding, "--store", f"sqlite:///{unicode_db}", *args)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        assert b"Traceback" not in proc.stderr
        text = proc.stdout.decode(encoding)
        assert "\\u2615" in text  # shown escaped, not dropped
    more = [line for line in text.splitlines() if line.startswith("more: ")]
    assert len(more) == 1, text


# --- 3. list --limit 1000 ----------------------------------------------------------------------

async def _thousand(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path, synchronous="NORMAL") as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        for i in range(1000):
            await rt.create(f"t{i:04d}", program(chain_plan(1)))


async def _one_more(path: Path) -> None:
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
        await rt.create("t1000", program(chain_plan(1)))
        await rt.run("t1000", worker_id="w")


def _page(path: Path, *args: str) -> tuple[int, str | None]:
    result = invoke(path, "list", "--limit", "1000", *args, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    return len(document["tasks"]), document["next_after"]


def test_list_limit_1000_reports_a_next_page_only_when_one_exists(tmp_path: Path) -> None:
    path = tmp_path / "thousand.db"
    asyncio.run(_thousand(path))
    assert _page(path) == (1000, None)
    human = invoke(path, "list", "--limit", "1000")
    assert human.exit_code == 0 and "more:" not in human.stdout
    asyncio.run(_one_more(path))
    assert _page(path) == (1000, "t0999")
    assert _page(path, "--after", "t0999") == (1, None)
    # The probe for the next row keeps the status filter: t1000 is completed.
    assert _page(path, "--status", "pending") == (1000, None)


# --- 4. and 5. the demo's temporary directory and worker processes ---------------------------

@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_a_refused_demo_leaves_no_temporary_directory(tmp_path: Path, temp_root: Path) -> None:
    path = tmp_path / "used.db"

    async def first_run() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            rt = ExecutionGraphRuntime(catalog=build_catalog(), store=store)
            await rt.create(DEMO_KEY, build_program())
    asyncio.run(first_run())
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{path}"])
    one_line_error(result, EXIT_USAGE, "already exists")
    assert list(temp_root.iterdir()) == []
    assert path.exists()


def test_the_demo_removes_its_temporary_directory_and_keeps_a_given_store(
        tmp_path: Path, temp_root: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--delay", "0.05"])
    assert result.exit_code == 0, result.output
    assert "no completed node re-ran: yes" in result.stdout
    assert "agentium-graph demo --store" in result.stdout  # how to keep a run to inspect
    assert list(temp_root.iterdir()) == []
    given = tmp_path / "kept.db"
    result = CliRunner().invoke(cli, ["demo", "--delay", "0.05", "--store",
                                      f"sqlite:///{given}"])
    assert result.exit_code == 0, result.output
    assert list(temp_root.iterdir()) == []
    assert invoke(given, "inspect", DEMO_KEY).exit_code == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def demo_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A demo process (slow tools) and the pid of the worker it has just started."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "agentium_graph", "demo", "--delay", "2", "--store",
         f"sqlite:///{tmp_path / 'sig.db'}"], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    worker = 0
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            found = re.search(r"1\. worker process (\d+) runs", line)
            if found:
                worker = int(found[1])
                break
        assert worker, "the demo never started its worker"
        yield demo, worker
    finally:
        for pid in (demo.pid, worker):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        demo.communicate(timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_demo_stops_and_reaps_its_worker(
        demo_process: tuple[subprocess.Popen[str], int], signum: int, tmp_path: Path) -> None:
    demo, worker = demo_process
    demo.send_signal(signum)
    output, _ = demo.communicate(timeout=60)
    assert demo.returncode != 0, output
    # The demo killed and reaped it: no such process, not even a zombie.
    assert not _alive(worker), output
    assert "Traceback" not in output, output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("agentium-demo-")] == []
    if signum != signal.SIGINT:
        assert demo.returncode == 128 + signum, output
        assert f"error: the demo was stopped by {signal.Signals(signum).name}" in output


# --- 6. usage errors are one line -------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["list", "--limit", "0"], ["'--limit'", "0 is not in the range"]),
    (["list", "--bogus"], ["--bogus", "list --help'"]),
    (["--bogus", "list"], ["--bogus", "see 'cli --help'"]),
    (["list", "--status", "nope"], ["'--status'", "nope"]),
    (["cancel", "k", "--reason", "  "], ["'--reason'", "must not be empty"]),
    (["cancel", "k"], ["--reason"]),
    (["inspect"], ["KEY"]),
    (["nosuch"], ["nosuch"]),
    (["resolve", "k", "act_1", "--actor", "me"], ["exactly one of --absent or --output"]),
    (["timeline", "k", "--limit", "abc"], ["'--limit'", "abc"]),
])
def test_usage_errors_are_one_error_line(tmp_path: Path, args: list[str],
                                         fragments: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'none.db'}", *args])
    one_line_error(result, EXIT_USAGE, *fragments)


def test_help_is_still_help() -> None:
    result = CliRunner().invoke(cli, ["list", "--help"])
    assert result.exit_code == 0 and "Usage:" in result.stdout
    bare = CliRunner().invoke(cli, [])
    assert "Commands:" in bare.output


def test_a_demo_whose_worker_fails_is_one_error_line_with_the_workers_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentium_graph.demo import _demo

    monkeypatch.setattr(_demo, "_spawn", worker_running(
        "import sys; sys.stderr.write('worker boom'); sys.exit(3)"))
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{tmp_path / 'd.db'}"])
    one_line_error(result, 1, "worker exited early", "worker boom")
