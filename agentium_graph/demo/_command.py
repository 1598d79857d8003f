"""The ``demo`` click command (registered on the ``agentium-graph`` CLI group)."""

from __future__ import annotations

import asyncio
import math
import subprocess

import click
from rich.console import Console


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """click callback: NaN passes FloatRange (every comparison with it is false)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds; pass one between 0.05 "
                                 "and 5.0", ctx=ctx, param=param, param_hint="'--delay'")
    return value


@click.command("demo")
@click.option("--store", "uri", default=None,
              help="Store URI (default: a fresh SQLite file in a temporary directory, removed "
                   "when the demo ends).")
@click.option("--kill-after", type=click.IntRange(1, 6), default=3, show_default=True,
              help="SIGKILL the first worker once this many nodes completed.")
@click.option("--delay", type=click.FloatRange(0.05, 5.0), default=0.3, show_default=True,
              callback=_finite, help="Seconds each tool pretends to work.")
def demo_command(uri: str | None, kill_after: int, delay: float) -> None:
    """Run the order pipeline, SIGKILL its worker mid-graph, recover in a fresh process."""
    from agentium_graph.cli import _error_line
    from agentium_graph.demo._demo import Stopped, run_demo, stop_workers

    workers: list[subprocess.Popen[bytes]] = []
    try:
        code = asyncio.run(run_demo(uri, kill_after, delay, Console(width=120), workers))
    except Stopped as stopped:
        _error_line(f"error: the demo was stopped by {stopped}; its worker processes were "
                    "stopped too")
        code = 128 + stopped.signum
    finally:
        # run_demo stops its workers however it ends; this covers a second Ctrl-C that
        # interrupts that cleanup itself.
        stop_workers(workers)
    raise SystemExit(code)
