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

ROOT = Path(__file__).resolve().parent.parent


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
    summary = lines[-1]
    assert summary["kind"] == "summary"
    assert summary["pass"] + summary["fail"] + summary["not_run"] == 7
