"""The bench driver: floors, then each workload x store in its own child process, then
one pass/fail line per target. Every line on stdout is one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _floor

RUN_PY = Path(__file__).with_name("run.py")
WORKLOADS = ("W1", "W2", "W3", "W4")
DEFAULT_STORES = "memory,sqlite,sqlite-normal"


@dataclass(frozen=True)
class Target:
    label: str
    workload: str
    store: str
    field: str
    op: str  # "<=", "<", ">=" or "=="
    limit: float
    unit: str


TARGETS = (
    Target("W1 sqlite per-node overhead", "W1", "sqlite", "per_node_ms", "<=", 0.6, "ms"),
    Target("W1 sqlite durable commits per pure node", "W1", "sqlite",
           "durable_commits_per_node", "<=", 2, "commits"),
    Target("W2 sqlite fan-out + join wall time", "W2", "sqlite", "wall_s", "<=", 0.1, "s"),
    Target("W3 sqlite throughput", "W3", "sqlite", "tasks_per_s", ">=", 300, "tasks/s"),
    Target("W4 sqlite completed nodes re-run", "W4", "sqlite", "completed_nodes_rerun", "==",
           0, "nodes"),
    Target("W4 sqlite in-process resume", "W4", "sqlite", "in_process_resume_s", "<", 0.3,
           "s"),
    Target("W1 memory per-node overhead", "W1", "memory", "per_node_ms", "<=", 0.15, "ms"),
    Target("W1 mongodb round trips per pure node", "W1", "mongodb", "round_trips_per_node",
           "<=", 2, "round trips"),
)
# The bare executor (bench/_bare.py) runs on these stores; its number for a target's field.
BARE_STORES = ("memory", "sqlite", "sqlite-normal")
BARE_FIELDS = {("W1", "per_node_ms"): "w1_per_node_ms", ("W3", "tasks_per_s"): "w3_tasks_per_s"}
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
}


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__)
    parser.add_argument("--stores", default=DEFAULT_STORES,
                        help="comma-separated: memory, sqlite (synchronous=FULL), "
                             "sqlite-normal, mongodb (needs AGENTIUM_MONGODB_URI); mongodb is "
                             f"added when available (default: {DEFAULT_STORES})")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated subset of W1,W2,W3,W4")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions and W3 tasks: a smoke run, not a measurement")
    parser.add_argument("--repeats", type=int, default=None,
                        help="measured runs of W1/W2 per store (median reported; default 7, "
                             "quick 2)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where databases and the floor files go (default: a new temp "
                             "dir, removed afterwards); its disk is the one measured")
    parser.add_argument("--start-mongodb", action="store_true",
                        help="without AGENTIUM_MONGODB_URI, start a throwaway MongoDB-compatible "
                             "server the way the MongoDB store's tests do (mongod on PATH, else "
                             "SecantusDB) and add the mongodb store")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.child is not None:
        return _child(json.loads(args.child))
    from bench._stores import mongodb_available

    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if args.start_mongodb and "mongodb" not in stores:
        stores.append("mongodb")
    if "mongodb" not in stores and mongodb_available() is None and \
            args.stores == DEFAULT_STORES:
        stores.append("mongodb")
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    repeats = args.repeats or (2 if args.quick else 7)
    tasks = 50 if args.quick else 200
    directory: Path = args.dir or Path(tempfile.mkdtemp(prefix="agentium-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    server: Any = None
    try:
        if args.start_mongodb and mongodb_available() is not None:
            server = _start_mongodb(directory)
        return _drive(directory, stores, workloads, repeats, tasks, args.quick)
    finally:
        if server is not None:
            server.stop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


def _start_mongodb(directory: Path) -> Any:
    from agentium_graph_mongodb.testing import choose_server, start_server
    from bench._stores import MONGODB_URI_ENV

    choice = choose_server()
    if choice.kind == "none":
        raise SystemExit(f"--start-mongodb: {choice.detail}")
    workdir = directory / "mongodb-server"
    workdir.mkdir(parents=True, exist_ok=True)
    server = start_server(choice, workdir)
    os.environ[MONGODB_URI_ENV] = server.uri  # children inherit it
    emit({"kind": "env", "mongodb_server": choice.kind, "detail": choice.detail})
    return server


def _drive(directory: Path, stores: list[str], workloads: list[str], repeats: int,
           tasks: int, quick: bool) -> int:
    from bench._stores import mongodb_available

    emit({"kind": "env", "nproc": os.cpu_count(), "cpu": _cpu_model(),
          "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
          "platform": platform.platform(), "loadavg": _loadavg(), "dir": str(directory),
          "stores": stores, "quick": quick, "repeats": repeats, "w3_tasks": tasks,
          "mongodb": mongodb_available() or "available"})
    floor_lines = _floor.floors(directory, 50 if quick else 200)
    for line in floor_lines:
        emit(line)
    floor_ms = floor_lines[0]["median_ms"]
    bare: dict[str, dict[str, Any]] = {}
    for store in stores:
        if store in BARE_STORES and ("W1" in workloads or "W3" in workloads):
            line = _run_child({"role": "bare", "store": store,
                               "dir": str(directory / f"bare-{store}"), "quick": quick})
            bare[store] = {"kind": "floor", **line}
            emit(bare[store])
    results: dict[tuple[str, str], dict[str, Any]] = {}
    run_id = f"{os.getpid():x}{int(time.time()) % 100_000:x}"
    for workload in workloads:
        for store in stores:
            line = _run_child({"role": "workload", "workload": workload, "store": store,
                               "dir": str(directory / f"{workload.lower()}-{store}"),
                               "repeats": repeats, "tasks": tasks,
                               "tag": f"{run_id}_{workload.lower()}"})
            line = {"kind": "result", "workload": workload, "store": store, **line}
            if store == "sqlite" and line.get("durable_commits_per_node") is not None and \
                    "per_node_ms" in line:
                bound = line["durable_commits_per_node"] * floor_ms
                line["floor_ms_per_node"] = round(bound, 4)
                line["per_node_ms_above_floor"] = round(line["per_node_ms"] - bound, 4)
            results[(workload, store)] = line
            emit(line)
    emit({"kind": "env", "loadavg_end": _loadavg()})
    return _summarize(results, bare)


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    Path(spec["dir"]).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(RUN_PY), "--child", json.dumps(spec)],
                          capture_output=True, check=False)
    took = round(time.perf_counter() - t0, 2)
    lines = [x for x in proc.stdout.decode().splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"child exited {proc.returncode}",
                "stderr": proc.stderr.decode()[-3000:], "child_s": took}
    parsed: dict[str, Any] = json.loads(lines[-1])
    return {**parsed, "child_s": took}


def _child(spec: dict[str, Any]) -> int:
    from bench import _recovery, _workloads

    role = spec["role"]
    if role == "bare":
        from bench import _bare

        sizes = {"chains": 2, "tasks": 50} if spec["quick"] else {}
        print(json.dumps(_bare.measure(spec["store"], Path(spec["dir"]), **sizes)),
              flush=True)
        return 0
    if role == "w4-worker":
        out = asyncio.run(_recovery.worker(spec))
    elif role == "w4-recover":
        out = asyncio.run(_recovery.recover(spec))
    else:
        workload, store, directory = spec["workload"], spec["store"], Path(spec["dir"])
        tag = spec["tag"]
        if workload == "W1":
            out = asyncio.run(_workloads.w1(store, directory, spec["repeats"], tag))
        elif workload == "W2":
            out = asyncio.run(_workloads.w2(store, directory, spec["repeats"], tag))
        elif workload == "W3":
            out = asyncio.run(_workloads.w3(store, directory, spec["tasks"], tag))
        else:
            out = asyncio.run(_recovery.w4(store, directory, tag))
        out["peak_rss_mb"] = _recovery.peak_rss_mb()
    print(json.dumps(out), flush=True)
    return 0


def _summarize(results: dict[tuple[str, str], dict[str, Any]],
               bare: dict[str, dict[str, Any]]) -> int:
    counts = {"pass": 0, "fail": 0, "not_run": 0}
    for target in TARGETS:
        line = results.get((target.workload, target.store))
        value = None if line is None else line.get(target.field)
        if line is None and target.store == "mongodb":
            continue  # optional store, not benchmarked here
        verdict: bool | None = None if value is None else OPS[target.op](value, target.limit)
        counts["not_run" if verdict is None else "pass" if verdict else "fail"] += 1
        out: dict[str, Any] = {
            "kind": "target", "target": target.label, "workload": target.workload,
            "store": target.store, "limit": f"{target.op} {target.limit:g} {target.unit}",
            "measured": value, "pass": verdict}
        reference = BARE_FIELDS.get((target.workload, target.field))
        if reference is not None and target.store in bare and \
                bare[target.store].get(reference) is not None:
            # What the bare executor (bench/_bare.py) measured in this run: no
            # implementation that makes the same durable writes can do better here.
            out["bare_executor"] = bare[target.store][reference]
            out["bare_executor_pass"] = OPS[target.op](out["bare_executor"], target.limit)
        if line is None:
            out["note"] = "not run (choose it with --stores/--workloads)"
        elif verdict is None:
            out["note"] = line.get("error") or line.get("skipped") or "not measured"
        emit(out)
    emit({"kind": "summary", **counts})
    return 0
