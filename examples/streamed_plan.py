"""A provider-free streamed planner: revisions arrive as frames while the plan already runs.

The planner's provider streams two frames. The first plans the price lookup (revision 1),
which starts at once; while it runs, the second frame (revision 2) keeps it and adds the
quote that uses its result. The model is the deterministic ScriptedProvider from
agentium_graph.providers (text streamed in small pieces with a pause between them), so this
runs anywhere without credentials.

Run: python examples/streamed_plan.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    StreamLimits,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, Usage
from agentium_graph_sqlite import SQLiteDurableTaskStore

PRICES = {"A-1": 12.5, "B-7": 40.0}


async def lookup_price(args: dict[str, Any]) -> dict[str, Any]:
    return {"sku": args["sku"], "amount": PRICES[args["sku"]]}


def write_quote(args: dict[str, Any]) -> dict[str, Any]:
    total = args["unit_price"] * args["quantity"]
    return {"text": f"{args['quantity']} x {args['sku']} = {total:.2f} EUR"}


catalog = HostCatalog([
    ToolBinding(id="lookup_price", version="1", execute=lookup_price, recovery="pure",
                description="The unit price of a product, by SKU.",
                input_schema={"type": "object", "required": ["sku"]}),
    ToolBinding(id="write_quote", version="1", execute=write_quote, recovery="pure",
                description="Render a one-line quote.",
                input_schema={"type": "object", "required": ["sku", "unit_price", "quantity"]}),
])


def ref(node: str, *path: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


price = {"id": "price", "binding": "lookup_price", "version": "1",
         "args": {"sku": ref("$input", "sku")}}
quote = {"id": "quote", "binding": "write_quote", "version": "1",
         "args": {"sku": ref("$input", "sku"), "quantity": ref("$input", "quantity"),
                  "unit_price": ref("price", "amount")}}


def frame(base: int, *nodes: dict[str, Any]) -> str:
    plan = {"schemaVersion": 1, "revision": base + 1, "nodes": list(nodes)}
    return json.dumps({"baseRevision": base, "plan": plan}) + "\n"


provider = ScriptedProvider([ScriptedTurn(
    text=frame(0, price) + frame(1, price, quote),
    usage=Usage(input_tokens=480, output_tokens=120), chunk_delay=0.05)], chunks=20)

program = ExecutionGraphProgram(id="streamed-quote", version="1", planner=PlannerConfig(
    provider=provider, host_instructions="Plan how to quote the requested order.",
    max_output_tokens=500, mode="stream", stream=StreamLimits(max_frames=8)))


async def main() -> str:
    with tempfile.TemporaryDirectory(prefix="agentium-stream-") as tmp:
        async with SQLiteDurableTaskStore(Path(tmp) / "tasks.db") as store:
            runtime = ExecutionGraphRuntime(catalog=catalog, store=store, require_durable=True)
            await runtime.create("quote:2", program, input={"sku": "B-7", "quantity": 3})
            result = await runtime.run("quote:2", worker_id="w1")
            text: str = result.output["quote"]["text"]
            print(text)
            page = await runtime.timeline("quote:2", limit=100)
            for event in page.events:
                if event.kind == "revision_committed":
                    print(f"revision {event.data['revision']} committed")
                elif event.kind == "attempt_started":
                    print(f"  {event.node_id} started")
                elif event.kind == "planner_sealed":
                    print("planning sealed")
            view = await runtime.inspect("quote:2")
            assert view.planner is not None
            print(f"planner {view.planner.state}: {view.planner.proposals} frames, "
                  f"revision {view.revision}")
            return text


if __name__ == "__main__":
    asyncio.run(main())
