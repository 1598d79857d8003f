"""What the CLI tests check of a failed command, and a stand-in for the demo's worker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

Spawn = Callable[[str, float, Path, Path, str, list[subprocess.Popen[bytes]]],
                 subprocess.Popen[bytes]]


def one_line_error(result: Result, code: int, *fragments: str) -> str:
    """The command exited with ``code`` and wrote one ``error:`` line (holding every
    fragment) to stderr: no traceback, no usage block. Returns the line."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "Usage:" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def worker_running(code: str) -> Spawn:
    """A replacement for ``agentium_graph.demo._demo._spawn`` whose worker runs
    ``python -c code``, its output and stderr where the demo reads a worker's."""

    def spawn(uri: str, delay: float, call_log: Path, workdir: Path, name: str,
              workers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with open(workdir / f"{name}.out", "wb") as out, \
                open(workdir / f"{name}.err", "wb") as err:
            process = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=err)
        workers.append(process)
        return process

    return spawn
