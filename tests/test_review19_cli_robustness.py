"""Nineteenth review: the CLI and the demo where the environment is not the usual one.

Two demos racing on one store, a narrow terminal, an unusable temporary directory, a closed
stderr, ``PYTHONIOENCODING=utf-16``, Ctrl-C while the CLI imports, ``--delay nan`` and an
option missing its value.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.text import Text

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.cli import EXIT_NOT_FOUND, EXIT_STORE, EXIT_USAGE, _table, cli
from agentium_graph.demo import _demo
from agentium_graph.demo._demo import KEY as DEMO_KEY
from agentium_graph.demo.pipeline import build_catalog, build_program
from tests._cli_helpers import one_line_error, worker_running
from tests.conftest import Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# --- 1. two demos on one store; a failing worker's traceback ---------------------------------

def test_only_the_demo_that_creates_its_task_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second demo creates the task between this demo's check and its create (two
    `demo --store X` started together): create is idempotent, so both went on to run it."""
    path = tmp_path / "d.db"
    asyncio.run(sqlite.SQLiteDurableTaskStore(path).close())  # an empty store
    checked = sqlite.SQLiteDurableTaskStore.get_header

    async def rival_creates_after_the_check(self: Any, key: str) -> Any:
        header = await checked(self, key)
        async with sqlite.SQLiteDurableTaskStore(path) as other:  # the other demo
            await ExecutionGraphRuntime(catalog=build_catalog(), store=other).create(
                DEMO_KEY, build_program())
        return header

    monkeypatch.setattr(sqlite.SQLiteDurableTaskStore, "get_header",
                        rival_creates_after_the_check)
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{path}", "--delay",
                                      "0.05"])
    one_line_error(result, EXIT_USAGE, DEMO_KEY, "already exists", "running now")
    assert "worker process" not in result.stdout  # it ran no worker


def test_a_failing_worker_is_named_by_its_exception_not_its_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_demo, "_spawn", worker_running(
        "def load():\n    raise RuntimeError('disk on fire')\nload()\n"))
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{tmp_path / 'd.db'}"])
    line = one_line_error(result, 1, "exited early", "RuntimeError: disk on fire")
    assert "Traceback" not in line and "load()" not in line and "File " not in line


# --- 2. narrow terminals ----------------------------------------------------------------------

LONG_KEY = "tenant-0042:invoice-run:" + "".join(f"{n:02d}" for n in range(40))


def _cells(stdout: str, column: str) -> str:
    """Every line of ``column``'s cells, joined: what a user copies out of the table. In a
    table: the text under the column's header, up to the next header; in records: the
    values of ``column  value`` lines and of the folded lines that follow them."""
    lines = stdout.splitlines()
    rule = next((n for n, line in enumerate(lines) if "───" in line), None)
    if rule is not None:
        header = lines[rule - 1]
        start = re.search(rf"(?<!\S){re.escape(column)}(?!\S)", header)
        assert start is not None, header
        after = re.search(r"\S", header[start.end():])
        end = start.end() + after.start() if after else None
        return "".join(line[start.start():end].strip() for line in lines[rule + 1:])
    labelled = [re.match(rf"{re.escape(column)}\s+", line) for line in lines]
    at = next(match.end() for match in labelled if match)
    parts: list[str] = []
    inside = False
    for line in lines:
        label, value = line[:at].strip(), line[at:].strip()
        if label == column:
            inside = True
            parts.append(value)
        elif inside and not label and value:
            parts.append(value)
        else:
            inside = False
    return "".join(parts)


@pytest.fixture
def long_keys(tmp_path: Path) -> Path:
    path = tmp_path / "t.db"

    async def populate() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            runtime = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
            for key in (DEMO_KEY, LONG_KEY):
                await runtime.create(key, program(chain_plan(2)))

    asyncio.run(populate())
    return path


@pytest.mark.parametrize("width", [40, 60, 80, 120, 250])
def test_list_never_drops_or_cuts_a_key(long_keys: Path, width: int) -> None:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{long_keys}", "list"],
                                env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert _cells(result.stdout, "key") == DEMO_KEY + LONG_KEY, result.stdout
    assert _cells(result.stdout, "status") == "pending" * 2, result.stdout
    assert max(map(len, result.stdout.splitlines())) <= width


@pytest.mark.parametrize("width", [30, 40, 60, 80, 100, 160])
def test_a_table_loses_no_character_of_an_id_at_any_width(width: int) -> None:
    ids = ["n", "order-review:ord-1042", "x" * 90]
    rows: list[list[Text | str]] = [
        [node, "completed", str(n), f"binding_{node}@1", "a few words " * n]
        for n, node in enumerate(ids)]
    out = io.StringIO()
    Console(file=out, width=width, highlight=False, soft_wrap=False).print(_table(
        "nodes", [("node", "id"), ("state", "fixed"), ("fence", "num"), ("binding", "id"),
                  ("data", "text")], rows))
    shown = out.getvalue()
    assert "…" not in shown
    assert _cells(shown, "node") == "".join(ids), shown
    assert _cells(shown, "binding") == "".join(f"binding_{n}@1" for n in ids), shown
    assert _cells(shown, "state") == "completed" * 3, shown
    assert max(map(len, shown.splitlines())) <= width
    assert len(shown.splitlines()) < 60  # no column squeezed to nothing, one line a char


def test_a_narrow_timeline_is_not_a_column_of_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.db"

    async def populate() -> None:
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            runtime = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
            await runtime.create(DEMO_KEY, program(chain_plan(2)))
            await runtime.run(DEMO_KEY, "w1")

    asyncio.run(populate())
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "timeline", DEMO_KEY,
                                      "--limit", "3"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    blank = sum(not line.strip() for line in result.stdout.splitlines())
    assert blank < 10, result.stdout
    assert "worker_id=w1" in result.stdout


# --- 3. an unusable temporary directory --------------------------------------------------------

def test_a_missing_temporary_directory_is_named(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-dir"
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    result = CliRunner().invoke(cli, ["demo"])
    one_line_error(result, 1, "temporary directory", str(missing), "not usable", "TMPDIR")


def test_no_usable_temporary_directory_is_not_an_output_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("TMPDIR", str(missing))

    def none_usable() -> str:  # what tempfile.gettempdir raises when no candidate works
        raise FileNotFoundError(2, f"No usable temporary directory found in [{str(missing)!r}]")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    result = CliRunner().invoke(cli, ["demo"])
    line = one_line_error(result, 1, "temporary directory", str(missing), "TMPDIR")
    assert "cannot write the output" not in line


# --- 4. stderr closed or full ------------------------------------------------------------------

@pytest.mark.parametrize(("args", "code"), [
    (["inspect", "nope"], EXIT_NOT_FOUND),
    (["--store", "sqlite:///no-such.db", "list"], EXIT_STORE),
    (["list", "--limit", "0"], EXIT_USAGE),
])
# `2>&-` straight to python leaves no stderr at all (sys.stderr is None: nothing to fail);
# through a wrapper (pyenv's shell shim, a supervisor) fd 2 is often some descriptor that
# cannot be written, which `2</dev/null` reproduces; a full disk is /dev/full.
@pytest.mark.parametrize("stderr", ["2</dev/null", "2>/dev/full"])
def test_the_exit_code_survives_an_unwritable_stderr(long_keys: Path, args: list[str],
                                                    code: int, stderr: str) -> None:
    if stderr.endswith("/dev/full") and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    store = [] if args[0] == "--store" else ["--store", f"sqlite:///{long_keys}"]
    argv = [sys.executable, "-m", "agentium_graph", *store, *args]
    command = " ".join(f"'{word}'" for word in argv) + f" {stderr}"
    done = subprocess.run(["sh", "-c", command], cwd=long_keys.parent, env=_env(),
                          stdout=subprocess.PIPE, timeout=60)
    assert done.returncode == code, done


# --- 5. PYTHONIOENCODING=utf-16 ----------------------------------------------------------------

def test_the_demo_runs_with_a_utf16_io_encoding(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentium_graph", "demo", "--delay", "0.05"], cwd=tmp_path,
        env=_env(PYTHONIOENCODING="utf-16", COLUMNS="120"), capture_output=True, timeout=120)
    stdout = done.stdout.decode("utf-16", errors="replace")
    stderr = done.stderr.decode("utf-16", errors="replace")
    assert done.returncode == 0, (stdout, stderr)
    assert "no completed node re-ran: yes" in stdout and "Traceback" not in stderr


def test_unreadable_worker_output_is_one_error_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    read = _demo._output

    def garbled(workdir: Path, name: str, stream: str) -> str:
        text = read(workdir, name, stream)
        return "\ufffd{\x00\"o\x00k" if (name, stream) == ("second", "out") else text

    monkeypatch.setattr(_demo, "_output", garbled)
    result = CliRunner().invoke(cli, ["demo", "--store", f"sqlite:///{tmp_path / 'd.db'}",
                                      "--delay", "0.05"])
    one_line_error(result, 1, "recovery worker", "not its JSON result")


# --- 6. Ctrl-C while the CLI imports ---------------------------------------------------------

_INTERRUPT_ON_IMPORT = textwrap.dedent("""
    import runpy, sys

    class Interrupt:  # Ctrl-C as the CLI imports its runtime (the first second or so)
        def find_spec(self, name, path=None, target=None):
            if name == "agentium_graph.runtime":
                raise KeyboardInterrupt
            return None

    sys.meta_path.insert(0, Interrupt())
    target = sys.argv.pop(1)
    sys.argv[0] = "agentium-graph"
    if target == "-m":
        runpy.run_module("agentium_graph", run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
""")


@pytest.mark.parametrize("entry", ["console-script", "-m"])
def test_ctrl_c_while_importing_is_aborted_not_a_traceback(tmp_path: Path,
                                                           entry: str) -> None:
    target = "-m"
    if entry == "console-script":
        script = Path(sysconfig.get_path("scripts")) / "agentium-graph"
        if not script.is_file():
            pytest.skip("the agentium-graph console script is not installed here")
        target = str(script)
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_ON_IMPORT, target, "list"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "Aborted!" and done.returncode == 1, done
    assert done.returncode != -signal.SIGINT



def test_ctrl_c_while_importing_with_stderr_unwritable_keeps_exit_code_1(
        tmp_path: Path) -> None:
    with open(os.devnull) as read_only:  # writes to it fail (EBADF)
        done = subprocess.run([sys.executable, "-c", _INTERRUPT_ON_IMPORT, "-m", "list"],
                              cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                              stderr=read_only, timeout=60)
    assert done.returncode == 1, done

# --- 7. --delay nan ----------------------------------------------------------------------------

@pytest.mark.parametrize("delay", ["nan", "NaN", "-nan", "inf", "-inf", "-1", "0"])
def test_a_delay_that_is_not_a_number_of_seconds_is_refused(
        delay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: object, **kwargs: object) -> int:
        raise AssertionError("the demo ran")

    monkeypatch.setattr(_demo, "run_demo", never)
    result = CliRunner().invoke(cli, ["demo", "--delay", delay])
    one_line_error(result, EXIT_USAGE, "'--delay'", "see 'cli demo --help'")


# --- 8. an option missing its value --------------------------------------------------------

@pytest.mark.parametrize(("args", "command"), [
    (["list", "--limit"], "cli list"),
    (["list", "--status"], "cli list"),
    (["timeline", "k", "--cursor"], "cli timeline"),
    (["list", "--json=yes"], "cli list"),
    (["cancel", "k", "--reason"], "cli cancel"),
    (["--store"], "cli"),
    (["--database"], "cli"),
])
def test_an_option_missing_its_value_names_the_help(tmp_path: Path, args: list[str],
                                                   command: str) -> None:
    result = CliRunner().invoke(cli, args, env={"AGENTIUM_STORE": f"sqlite:///{tmp_path}/x"})
    one_line_error(result, EXIT_USAGE, args[-1].split("=")[0], f"see '{command} --help'")


@pytest.mark.parametrize("args", [["inspect", "nope-\u2615"], ["list", "--status", "\u2615"]],
                         ids=["store-error", "usage-error"])
def test_an_error_line_on_an_ascii_stderr_escapes_what_it_cannot_encode(
        tmp_path: Path, args: list[str]) -> None:
    # (review 45) Tables and messages on stdout were escaped, but click wrote error lines as
    # UTF-8 bytes onto an ASCII stderr.
    db = tmp_path / "tasks.db"

    async def one_task() -> None:
        async with sqlite.SQLiteDurableTaskStore(db) as store:
            rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
            await rt.create("k", program(chain_plan(1)))

    asyncio.run(one_task())
    done = subprocess.run([sys.executable, "-m", "agentium_graph", "--store",
                           f"sqlite:///{db}", *args], env=_env(PYTHONIOENCODING="ascii"),
                          capture_output=True, timeout=60)
    assert done.returncode in (2, 3), done
    assert done.stderr.isascii() and b"\\u2615" in done.stderr, done.stderr


def test_output_cut_by_a_closed_pipe_is_not_lost_silently_when_unbuffered() -> None:
    # (review 45) Under PYTHONUNBUFFERED the text layer writes straight to the file and
    # drops what a short write leaves over: a reader closing early got half a JSON document
    # and the CLI exited 0. The CLI's own output setup gives stdout a buffered layer.
    script = ("import sys; from agentium_graph.cli import _tolerant_output\n"
              "_tolerant_output()\n"
              "print(type(sys.stdout.buffer).__name__, flush=True)\n"
              "sys.stdout.write('x' * 4_000_000); sys.stdout.flush()\n")
    child = subprocess.Popen([sys.executable, "-c", script], env=_env(PYTHONUNBUFFERED="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline() == b"BufferedWriter\n"
    child.stdout.read(10)
    child.stdout.close()  # the reader goes away with most of the output unwritten
    try:
        assert child.wait(timeout=60) != 0
        assert b"BrokenPipeError" in child.stderr.read()
    finally:
        child.stderr.close()
