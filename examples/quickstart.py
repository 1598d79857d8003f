"""Quickstart: a 10-node pure-tool DAG created, run, inspected and re-run on SQLite.

Run: python examples/quickstart.py [path/to/tasks.db]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    ToolBinding,
    tool_context,
)
from agentium_graph_sqlite import SQLiteDurableTaskStore

NUMBER = {"type": "object", "properties": {"value": {"type": "number"}},
          "required": ["value"]}


async def fetch_rate(args: dict[str, Any]) -> dict[str, Any]:
    rates = {"EUR": 1.0, "USD": 1.08, "GBP": 0.86, "JPY": 161.2, "CHF": 0.95}
    return {"value": rates[args["currency"]]}


def convert(args: dict[str, Any]) -> dict[str, Any]:
    # Sync tools run in a worker thread; tool_context() tells them where they are.
    ctx = tool_context()
    assert ctx.node_id.startswith("to_")
    return {"value": round(args["amount"] * args["rate"], 2)}


async def total(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": round(sum(args["values"]), 2)}


catalog = HostCatalog([
    ToolBinding(id="fetch_rate", version="1", execute=fetch_rate, recovery="pure",
                input_schema={"type": "object", "required": ["currency"],
                              "properties": {"currency": {"enum": ["EUR", "USD", "GBP",
                                                                   "JPY", "CHF"]}}},
                output_schema=NUMBER),
    ToolBinding(id="convert", version="1", execute=convert, recovery="pure",
                input_schema={"type": "object", "required": ["amount", "rate"]},
                output_schema=NUMBER),
    ToolBinding(id="total", version="1", execute=total, recovery="pure",
                input_schema={"type": "object", "required": ["values"]},
                output_schema=NUMBER),
])

CURRENCIES = ["USD", "GBP", "JPY", "CHF"]


def ref(node: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": ["value"]}}


nodes: list[dict[str, Any]] = []
for c in CURRENCIES:
    nodes.append({"id": f"rate_{c}", "binding": "fetch_rate", "version": "1",
                  "args": {"currency": c}})
    nodes.append({"id": f"to_{c}", "binding": "convert", "version": "1",
                  "args": {"amount": 100, "rate": ref(f"rate_{c}")}})
nodes.append({"id": "eur_check", "binding": "fetch_rate", "version": "1",
              "args": {"currency": "EUR"}})
nodes.append({"id": "sum", "binding": "total", "version": "1",
              "args": {"values": [ref(f"to_{c}") for c in CURRENCIES]},
              "dependsOn": ["eur_check"]})

program = ExecutionGraphProgram(id="fx-report", version="1",
                                plan={"schemaVersion": 1, "revision": 1, "nodes": nodes})


async def main(path: Path) -> dict[str, Any]:
    async with SQLiteDurableTaskStore(path) as store:
        runtime = ExecutionGraphRuntime(catalog=catalog, store=store, require_durable=True)
        view = await runtime.create("fx-report:2026-11-30", program)
        print(f"created {view.key}: {len(view.nodes)} nodes, status {view.status}")
        result = await runtime.run("fx-report:2026-11-30", worker_id="worker-1")
        print("sum of 100 EUR in four currencies:", result.output["sum"]["value"])
        view = await runtime.inspect("fx-report:2026-11-30")
        print(f"status {view.status}, verified {view.verified}, counters {view.counters}")
        again = await runtime.run("fx-report:2026-11-30", worker_id="worker-2")
        assert again.output == result.output  # retained output, nothing dispatched
        return result.output


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:  # a throwaway database, removed at the end
        with tempfile.TemporaryDirectory(prefix="agentium-quickstart-") as tmp:
            asyncio.run(main(Path(tmp) / "tasks.db"))
