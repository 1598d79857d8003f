"""W4: a 100-node chain SIGKILLed after ~50 completions, then recovered.

The driver (its own child of ``run.py``) creates the task, starts a worker process, polls
the store with ``get_task`` and SIGKILLs the worker once at least ``KILL_AFTER`` nodes are
completed. It does that twice, with two tasks: the first is recovered by a fresh process
(timed from spawn to exit, and inside that process), the second by the driver itself
(open the store + ``runtime.run``, no interpreter start). Every tool start is appended to
a log; a node that was completed at the kill and started again is a re-run.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentium_graph import ExecutionGraphRuntime
from bench._graphs import ROOT_LIMITS, ToolLog, catalog, chain, chain_answer
from bench._stores import DURABLE, Probe, discard, open_store
from bench._workloads import _costs

LENGTH = 100
KILL_AFTER = 50
WORKER = "w4-worker"  # the recovering process restarts the same worker: no lease wait
POLL_S = 0.002
RUN_PY = Path(__file__).with_name("run.py")


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB.

    Linux's ``ru_maxrss`` survives ``execve``: a child spawned by a large parent reports at
    least the parent's size. ``VmHWM`` belongs to the process's own address space, so it is
    preferred where it exists.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def child(spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(RUN_PY), "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def last_json(out: bytes) -> dict[str, Any]:
    for line in reversed(out.decode().splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    raise RuntimeError(f"child printed no JSON: {out.decode()[-2000:]}")


# --- child roles ------------------------------------------------------------------------
async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the task until the driver kills this process."""
    store = open_store(spec["store"], Path(spec["dir"]), spec["tag"])
    log = ToolLog(Path(spec["log"]), fsync=True)
    runtime = ExecutionGraphRuntime(catalog=catalog(log), store=store, limits=ROOT_LIMITS)
    try:
        await runtime.run(spec["key"], worker_id=WORKER)
    finally:
        await store.close()
    return {"finished": True}  # the driver treats this as a failed kill


async def recover(spec: dict[str, Any]) -> dict[str, Any]:
    """Recover the task in this (fresh) process."""
    log = ToolLog(Path(spec["log"]), fsync=False)
    host_catalog = catalog(log)
    return await _resume(spec, host_catalog, log)


async def _resume(spec: dict[str, Any], host_catalog: Any, log: ToolLog) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = open_store(spec["store"], Path(spec["dir"]), spec["tag"])
    probe = Probe(store)
    before = probe.sample()
    runtime = ExecutionGraphRuntime(catalog=host_catalog, store=store, limits=ROOT_LIMITS)
    try:
        result = await runtime.run(spec["key"], worker_id=WORKER)
        elapsed = time.perf_counter() - t0
        delta = probe.sample().minus(before)
    finally:
        await store.close()
    value = result.output[f"n{LENGTH - 1}"]["value"]
    return {
        "resume_s": round(elapsed, 4),
        "to_first_dispatch_s": None if log.first_start is None
        else round(log.first_start - t0, 4),
        "output_ok": value == chain_answer(LENGTH),
        "delta": delta,
        "peak_rss_mb": peak_rss_mb(),
    }


# --- the driver ---------------------------------------------------------------------------
async def _crash(spec: dict[str, Any]) -> dict[str, Any]:
    """Create the task, start a worker, SIGKILL it after KILL_AFTER completions."""
    store = open_store(spec["store"], Path(spec["dir"]), spec["tag"])
    try:
        runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
        await runtime.create(spec["key"], chain(LENGTH))
        proc = child({**spec, "role": "w4-worker"})
        polled = 0
        while True:
            snapshot = await store.get_task(spec["key"])
            assert snapshot is not None
            done = sum(1 for n in snapshot.nodes.values() if n.state == "completed")
            polled += 1
            if done >= KILL_AFTER:
                os.kill(proc.pid, signal.SIGKILL)
                break
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise RuntimeError(f"worker exited before the kill: {err.decode()[-2000:]}")
            await asyncio.sleep(POLL_S)
        proc.communicate()
        after = await store.get_task(spec["key"])
        assert after is not None
    finally:
        await store.close()
    completed = sorted(n for n, r in after.nodes.items() if r.state == "completed")
    running = sorted(n for n, r in after.nodes.items() if r.state == "running")
    return {"seen_at_kill": done, "completed": completed, "running": running,
            "returncode": proc.returncode, "polls": polled}


def _reruns(log: ToolLog, crash: dict[str, Any]) -> dict[str, Any]:
    starts = log.starts()
    completed: list[str] = crash["completed"]
    return {
        "completed_at_kill": len(completed),
        "completed_nodes_rerun": sum(1 for n in completed if starts.get(n, 0) > 1),
        "interrupted_nodes": crash["running"],
        "interrupted_nodes_rerun": sum(1 for n in crash["running"] if starts.get(n, 0) > 1),
        "max_starts_of_a_node": max(starts.values()) if starts else 0,
        "nodes_never_started": sum(1 for i in range(LENGTH) if f"n{i}" not in starts),
    }


async def w4(store_name: str, directory: Path, tag: str) -> dict[str, Any]:
    if store_name not in DURABLE:
        return {"nodes": LENGTH, "skipped": f"the {store_name} store is not durable: a killed "
                "process loses it, so there is nothing to recover"}
    base = {"store": store_name, "dir": str(directory)}
    try:
        return await _w4(store_name, directory, base, tag)
    finally:
        discard(store_name, f"{tag}a")
        discard(store_name, f"{tag}b")


async def _w4(store_name: str, directory: Path, base: dict[str, Any],
              tag: str) -> dict[str, Any]:
    # (a) recovered by a fresh process.
    spec_a = {**base, "tag": f"{tag}a", "key": "w4-a", "log": str(directory / "w4a.log")}
    crash_a = await _crash(spec_a)
    t0 = time.perf_counter()
    proc = child({**spec_a, "role": "w4-recover"})
    out, err = proc.communicate()
    fresh_wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"recovery process failed: {err.decode()[-2000:]}")
    fresh = last_json(out)
    check_a = _reruns(ToolLog(Path(spec_a["log"]), fsync=False), crash_a)
    # (b) recovered in this process: open the store + runtime.run.
    spec_b = {**base, "tag": f"{tag}b", "key": "w4-b", "log": str(directory / "w4b.log")}
    crash_b = await _crash(spec_b)
    log_b = ToolLog(Path(spec_b["log"]), fsync=False)
    host_catalog = catalog(log_b)
    inproc = await _resume(spec_b, host_catalog, log_b)
    check_b = _reruns(log_b, crash_b)
    resumed = LENGTH - check_b["completed_at_kill"]
    return {
        "nodes": LENGTH,
        "kill_after": KILL_AFTER,
        "completed_at_kill": [check_a["completed_at_kill"], check_b["completed_at_kill"]],
        "completed_nodes_rerun": check_a["completed_nodes_rerun"]
        + check_b["completed_nodes_rerun"],
        "interrupted_nodes_rerun": check_a["interrupted_nodes_rerun"]
        + check_b["interrupted_nodes_rerun"],
        "max_starts_of_a_node": max(check_a["max_starts_of_a_node"],
                                    check_b["max_starts_of_a_node"]),
        "output_ok": bool(fresh["output_ok"] and inproc["output_ok"]),
        "fresh_process_recovery_s": round(fresh_wall, 4),
        "fresh_process_in_process_s": fresh["resume_s"],
        "fresh_process_to_first_dispatch_s": fresh["to_first_dispatch_s"],
        "fresh_process_peak_rss_mb": fresh["peak_rss_mb"],
        "in_process_resume_s": inproc["resume_s"],
        "in_process_to_first_dispatch_s": inproc["to_first_dispatch_s"],
        "resumed_nodes": resumed,
        "resume_per_node_ms": round(inproc["resume_s"] / resumed * 1000, 4),
        **_costs(inproc["delta"], store_name, resumed),
        "details": {"a": {**check_a, "polls": crash_a["polls"]},
                    "b": {**check_b, "polls": crash_b["polls"]}},
        "config": {"worker_tool_log": "fsync per start", "recovery_tool_log": "write, no fsync",
                   "per_node_costs": "of the in-process resume, per resumed node"},
    }
