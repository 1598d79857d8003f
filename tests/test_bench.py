"""The benchmark runs end to end (a smoke run) and its count-based results hold.

Timings are never asserted here (they live in docs/performance.md); what is checked is that
every workload reports on every store, and the results that are counts, not durations:
commits per pure node and completed nodes re-run after a SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Its own subprocess timeouts bound it, not the suite's 120 s per test (a loaded machine).
pytestmark = pytest.mark.timeout(330)


def test_quick_bench_reports_every_workload_and_its_counts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--stores", "memory,sqlite",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = {line["kind"] for line in lines}
    assert {"env", "floor", "result", "target", "summary"} <= kinds
    results = {(r["workload"], r["store"]): r for r in lines if r["kind"] == "result"}
    assert set(results) == {(w, s) for w in ("W1", "W2", "W3", "W4")
                            for s in ("memory", "sqlite")}
    w1 = results[("W1", "sqlite")]
    assert w1["durable_commits_per_node"] <= 1.05  # one commit per node, the lease rides along
    w3 = results[("W3", "sqlite")]
    assert w3["durable_commits_per_task"] == 7 and w3["store_reads_per_task"] == 0
    w4 = results[("W4", "sqlite")]
    assert w4["completed_nodes_rerun"] == 0 and w4["output_ok"] is True
    assert w4["max_starts_of_a_node"] <= 2
    # The bare executor (the least Python making the same durable writes) reports next to the
    # floor, makes as many commits as the runtime, and is shown on the W1 and W3 targets.
    bare = {line["store"]: line for line in lines
            if line["kind"] == "floor" and line["name"].startswith("bare_executor")}
    assert set(bare) == {"memory", "sqlite"}
    assert bare["sqlite"]["w3_commits_per_task"] == w3["durable_commits_per_task"]
    assert bare["sqlite"]["w1_commits_per_node"] == w1["durable_commits_per_node"]
    targets = {t["target"]: t for t in lines if t["kind"] == "target"}
    assert targets["W1 sqlite per-node overhead"]["bare_executor"] == \
        bare["sqlite"]["w1_per_node_ms"]
    assert targets["W3 sqlite throughput"]["bare_executor"] == bare["sqlite"]["w3_tasks_per_s"]
    assert targets["W1 memory per-node overhead"]["bare_executor"] == \
        bare["memory"]["w1_per_node_ms"]
    assert "bare_executor" not in targets["W2 sqlite fan-out + join wall time"]
    summary = lines[-1]
    assert summary["kind"] == "summary"
    assert summary["pass"] + summary["fail"] + summary["not_run"] == 7
