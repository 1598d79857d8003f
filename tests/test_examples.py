"""Examples are run by a test so they never rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Its own subprocess timeouts bound it, not the suite's 120 s per test (a loaded machine).
pytestmark = pytest.mark.timeout(210)


@pytest.mark.parametrize("script, expect", [
    ("examples/quickstart.py", "sum of 100 EUR in four currencies: 16409.0"),
    ("examples/order_pipeline.py", "order ord-1042: partial_shipment"),
    ("examples/agent_research.py", "Water boils at 100 C and freezes at 0 C."),
    ("examples/planned_quote.py", "proposal 0: rejected: unknown_binding\nproposal 1: accepted"),
    ("examples/streamed_plan.py", "revision 1 committed\n  price started\nrevision 2 committed"),
])
def test_example_runs(script: str, expect: str, tmp_path: Path) -> None:
    # With the test-only packages unimportable, as after the README's first command (review
    # 51: three examples imported the scripted provider through agentium_graph.testing,
    # which needs pytest).
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TEST_PACKAGES, script], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout


_WITHOUT_TEST_PACKAGES = """
import runpy, sys
BLOCKED = ("pytest", "_pytest", "pytest_asyncio", "hypothesis", "secantusdb")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (test-only, blocked)")
        return None
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_demo_crashes_and_recovers_without_rerunning_completed_nodes(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    proc = subprocess.run([sys.executable, "-m", "agentium_graph", "demo", "--store", store,
                           "--delay", "0.1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SIGKILL sent to worker" in out
    assert "no completed node re-ran: yes; data verified: True" in out
    assert "reused" in out
    inspect = subprocess.run([sys.executable, "-m", "agentium_graph", "--store", store,
                              "inspect", "order-review:ord-1042", "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert inspect.returncode == 0, inspect.stderr
    assert '"status": "completed"' in inspect.stdout
