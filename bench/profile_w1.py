"""Profile W1 (a 100-node chain of no-op tools) on one store with cProfile.

Usage: python bench/profile_w1.py [--store memory|sqlite|sqlite-normal] [--runs 10]
       [--sort cumulative|tottime] [--limit 40]

Only the event-loop thread is profiled: SQLite work on the store's worker thread shows up
as time awaited in ``run_in_executor``. cProfile inflates cheap, frequent calls; confirm a
finding by timing the change (``bench/run.py``) before believing its size.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path


async def _profile(store_name: str, runs: int) -> tuple[cProfile.Profile, float]:
    from agentium_graph import ExecutionGraphRuntime
    from bench._graphs import ROOT_LIMITS, catalog, chain
    from bench._stores import open_store

    store = open_store(store_name, Path(tempfile.mkdtemp(prefix="agentium-profile-")), "p")
    runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
    try:
        await runtime.create("warmup", chain(3))
        await runtime.run("warmup")
        for i in range(runs):
            await runtime.create(f"p{i}", chain(100))
        profiler = cProfile.Profile()
        c0 = time.process_time()
        profiler.enable()
        for i in range(runs):
            await runtime.run(f"p{i}")
        profiler.disable()
        cpu = time.process_time() - c0
    finally:
        await store.close()
    return profiler, cpu


def main() -> None:
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    parser = argparse.ArgumentParser(prog="bench/profile_w1.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="memory")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"])
    parser.add_argument("--limit", type=int, default=40)
    args = parser.parse_args()
    profiler, cpu = asyncio.run(_profile(args.store, args.runs))
    print(f"W1 on {args.store}: {args.runs} runs x 100 nodes, "
          f"{cpu / (args.runs * 100) * 1000:.3f} ms CPU per node under the profiler")
    pstats.Stats(profiler).strip_dirs().sort_stats(args.sort).print_stats(args.limit)


if __name__ == "__main__":
    main()
