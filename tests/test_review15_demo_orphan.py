"""Fifteenth review: a demo that dies (SIGKILL) while its worker runs leaves no orphan. The
worker used to keep running, detached, until its graph ended. Failed before its fix."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("agentium_graph_sqlite")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads process states from /proc")

ROOT = Path(__file__).resolve().parent.parent


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces
    return fields[0], int(fields[1])


def _running(pid: int) -> bool:
    # An exited worker whose new parent does not reap it stays a zombie: it no longer runs.
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def test_a_killed_demo_leaves_no_worker_running(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        # Slow tools: the first worker is still mid-graph for many seconds.
        [sys.executable, "-m", "agentium_graph", "demo", "--delay", "5", "--store",
         f"sqlite:///{tmp_path / 'orphan.db'}"], cwd=ROOT, env=env, text=True,
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
        stat = _stat(worker)
        assert stat is not None and stat[1] == demo.pid, "not the demo's own worker"
        demo.kill()
        demo.wait(timeout=30)
        # The worker may still be importing (it watches its stdin pipe after that): on a
        # loaded machine that takes seconds. A passing run ends as soon as it is gone.
        deadline = time.monotonic() + 30
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(worker), "the worker outlived its killed demo"
    finally:
        for pid in (demo.pid, worker):
            if pid and _running(pid):
                os.kill(pid, signal.SIGKILL)
        demo.communicate(timeout=30)
