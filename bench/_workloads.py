"""W1-W3: one workload on one store, run inside its own child process.

Each child warms up (imports, schema creation, first-use caches) on a small task first, so
the numbers are steady-state costs of ``runtime.run`` (and, for W3, ``create`` too).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from agentium_graph import ExecutionGraphProgram, ExecutionGraphRuntime, TaskResult
from bench._graphs import (
    FANOUT_CONCURRENCY,
    ROOT_LIMITS,
    catalog,
    chain,
    chain_answer,
    fanout,
    fanout_answer,
)
from bench._stores import (
    DURABLE,
    Probe,
    Sample,
    discard,
    durable_commits,
    open_store,
    round_trips,
)

WORKER = "bench-worker"
CHAIN_LENGTH = 100
FANOUT_WIDTH = 100
W3_CHAIN = 5


def _runtime(store_name: str, directory: Path, tag: str) -> tuple[ExecutionGraphRuntime,
                                                                   Probe]:
    store = open_store(store_name, directory, tag)
    probe = Probe(store)
    runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS,
                                    require_durable=store_name in DURABLE)
    return runtime, probe


async def _warm_up(runtime: ExecutionGraphRuntime) -> None:
    for i, program in enumerate((chain(3), fanout(3))):
        await runtime.create(f"warmup-{i}", program)
        await runtime.run(f"warmup-{i}", worker_id=WORKER)


def _per(value: int | float | None, count: int) -> float | None:
    return None if value is None else round(value / count, 3)


def _costs(delta: dict[str, Any], store_name: str, count: int) -> dict[str, Any]:
    """Durable commits, round trips and bytes of one measured span, per ``count`` units."""
    commits = durable_commits(delta, store_name)
    stats: dict[str, int] = delta["stats"]
    return {
        "durable_commits": commits,
        "durable_commits_per_node": _per(commits, count),
        "write_calls": delta["calls"],
        "round_trips_per_node": _per(round_trips(delta), count),
        "store_reads_per_node": _per(stats.get("reads"), count),
        "store_bytes_per_node": _per(stats.get("bytes_written"), count),
        "write_syscall_bytes_per_node": None if store_name == "memory"
        else _per(delta["wchar"], count),
        "file_growth_bytes_per_node": _per(delta["file_bytes"], count),
    }


async def _timed_runs(runtime: ExecutionGraphRuntime, probe: Probe, store_name: str,
                      prefix: str, program: ExecutionGraphProgram, nodes: int, repeats: int,
                      check: tuple[str, int]) -> dict[str, Any]:
    walls: list[float] = []
    cpus: list[float] = []
    creates: list[float] = []
    delta: dict[str, Any] = {}
    for rep in range(repeats):
        key = f"{prefix}-{rep}"
        t0 = time.perf_counter()
        await runtime.create(key, program)
        creates.append(time.perf_counter() - t0)
        before: Sample = probe.sample()
        c0, t0 = time.process_time(), time.perf_counter()
        result: TaskResult = await runtime.run(key, worker_id=WORKER)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        delta = probe.sample().minus(before)
        node, answer = check
        if result.output[node]["value"] != answer:
            raise AssertionError(f"{key}: {node} = {result.output[node]!r}, want {answer}")
    wall = statistics.median(walls)
    return {
        "nodes": nodes, "repeats": repeats,
        "wall_s": round(wall, 5), "wall_s_min": round(min(walls), 5),
        "cpu_s": round(statistics.median(cpus), 5),
        "per_node_ms": round(wall / nodes * 1000, 4),
        "per_node_ms_min": round(min(walls) / nodes * 1000, 4),
        "create_s": round(statistics.median(creates), 5),
        **_costs(delta, store_name, nodes),
    }


async def w1(store_name: str, directory: Path, repeats: int, tag: str) -> dict[str, Any]:
    """A chain of 100 pure nodes: ``runtime.run`` wall time per node."""
    runtime, probe = _runtime(store_name, directory, tag)
    try:
        await _warm_up(runtime)
        out = await _timed_runs(runtime, probe, store_name, "w1", chain(CHAIN_LENGTH),
                                CHAIN_LENGTH, repeats,
                                (f"n{CHAIN_LENGTH - 1}", chain_answer(CHAIN_LENGTH)))
    finally:
        await runtime.store.close()
        discard(store_name, tag)
    return {**out, "config": {"chain": CHAIN_LENGTH}}


async def w2(store_name: str, directory: Path, repeats: int, tag: str) -> dict[str, Any]:
    """src -> 100 parallel nodes -> join: wall time of ``runtime.run``."""
    runtime, probe = _runtime(store_name, directory, tag)
    try:
        await _warm_up(runtime)
        out = await _timed_runs(runtime, probe, store_name, "w2", fanout(FANOUT_WIDTH),
                                FANOUT_WIDTH + 2, repeats, ("join", fanout_answer(FANOUT_WIDTH)))
    finally:
        await runtime.store.close()
        discard(store_name, tag)
    return {**out, "config": {"width": FANOUT_WIDTH,
                              "max_concurrent_work": ROOT_LIMITS.max_concurrent_work,
                              "max_concurrency": FANOUT_CONCURRENCY}}


async def w3(store_name: str, directory: Path, tasks: int, tag: str) -> dict[str, Any]:
    """``tasks`` tasks of a 5-node chain, one after another: create + run each."""
    runtime, probe = _runtime(store_name, directory, tag)
    program = chain(W3_CHAIN)
    answer = chain_answer(W3_CHAIN)
    try:
        await _warm_up(runtime)
        before = probe.sample()
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(tasks):
            key = f"w3-{i}"
            await runtime.create(key, program)
            result = await runtime.run(key, worker_id=WORKER)
            if result.output[f"n{W3_CHAIN - 1}"]["value"] != answer:
                raise AssertionError(f"{key}: wrong output {result.output!r}")
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        delta = probe.sample().minus(before)
    finally:
        await runtime.store.close()
        discard(store_name, tag)
    nodes = tasks * W3_CHAIN
    costs = _costs(delta, store_name, nodes)
    commits = costs["durable_commits"]
    return {
        "nodes": nodes, "tasks": tasks, "repeats": 1,
        "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
        "tasks_per_s": round(tasks / wall, 1),
        "per_task_ms": round(wall / tasks * 1000, 3),
        "per_node_ms": round(wall / nodes * 1000, 4),
        "durable_commits_per_task": None if commits is None else round(commits / tasks, 2),
        "store_reads_per_task": None if "reads" not in delta["stats"]
        else round(delta["stats"]["reads"] / tasks, 2),
        **costs,
        "config": {"chain": W3_CHAIN, "measured": "create + run per task, sequential"},
    }
