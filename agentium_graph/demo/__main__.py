"""Worker process of the demo: ``python -m agentium_graph.demo --store URI --key K ...``."""

from __future__ import annotations

import asyncio
import json

import click

from agentium_graph.demo._demo import exit_when_parent_dies, worker_main


@click.command()
@click.option("--store", "uri", required=True)
@click.option("--key", required=True)
@click.option("--worker", required=True)
@click.option("--delay", type=float, default=0.0)
@click.option("--call-log", default=None)
@click.option("--exit-with-parent", is_flag=True,
              help="Exit as soon as stdin reaches EOF (a pipe the parent demo holds open).")
def main(uri: str, key: str, worker: str, delay: float, call_log: str | None,
         exit_with_parent: bool) -> None:
    if exit_with_parent:
        exit_when_parent_dies()
    result = asyncio.run(worker_main(uri, key, worker, delay, call_log))
    click.echo(json.dumps(result))


if __name__ == "__main__":
    main()
