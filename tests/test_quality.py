"""The library stays ruff-clean and mypy --strict clean: part of the one test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [p for p in ("agentium_graph", "stores/sqlite/agentium_graph_sqlite",
                        "stores/mongodb/agentium_graph_mongodb",
                        "connectors/http/agentium_graph_http") if (ROOT / p).is_dir()]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_is_clean() -> None:
    proc = _run("ruff", "check", *PACKAGES, "tests", "acceptance")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean() -> None:
    proc = _run("mypy", *PACKAGES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
