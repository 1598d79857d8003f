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


def _store_of(ctx: click.Context, uri: str | None) -> str | None:
    """The demo's store: its own --store, else the group's when typed on the command line
    (AGENTIUM_STORE and the group's default are not used: the demo never writes into a
    store nobody named for it). Two different stores named at once are a usage error."""
    from agentium_graph.cli import CliConfig

    config = ctx.find_object(CliConfig)
    if config is None:
        return uri
    if config.database is not None:
        raise click.UsageError("demo takes a MongoDB database from its store URI's path "
                               "(mongodb://host/DATABASE); leave out --database", ctx=ctx)
    if not config.store_given:
        return uri
    if uri is not None and uri != config.store_uri:
        raise click.UsageError("two stores named: --store before 'demo' and --store after "
                               "it differ; name one", ctx=ctx)
    return config.store_uri


@click.command("demo")
@click.option("--store", "uri", default=None,
              help="Store URI (default: the group's --store when given on the command line, "
                   "else a fresh SQLite file in a temporary directory, removed when the demo "
                   "ends).")
@click.option("--kill-after", type=click.IntRange(1, 6), default=3, show_default=True,
              help="SIGKILL the first worker once this many nodes completed.")
@click.option("--delay", type=click.FloatRange(0.05, 5.0), default=0.3, show_default=True,
              callback=_finite, help="Seconds each tool pretends to work.")
@click.pass_context
def demo_command(ctx: click.Context, uri: str | None, kill_after: int, delay: float) -> None:
    """Run the order pipeline, SIGKILL its worker mid-graph, recover in a fresh process."""
    from agentium_graph.cli import _error_line
    from agentium_graph.demo._demo import Stopped, run_demo, stop_workers

    uri = _store_of(ctx, uri)

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
