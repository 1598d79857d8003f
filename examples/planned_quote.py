"""A provider-free planner example: a scripted model proposes the plan, one correction.

The program has no static plan: its planner asks the model for one. The first proposal
names a binding the catalog does not have, so it is rejected with diagnostics; the model's
correction is accepted, committed as revision 1 and run. Both proposals stay in the journal.
The model is the deterministic ScriptedProvider from agentium_graph.providers, so this runs
anywhere without credentials.

Run: python examples/planned_quote.py
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
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, TurnMatch, Usage
from agentium_graph_sqlite import SQLiteDurableTaskStore

PRICES = {"A-1": 12.5, "B-7": 40.0}


async def lookup_price(args: dict[str, Any]) -> dict[str, Any]:
    return {"sku": args["sku"], "amount": PRICES[args["sku"]]}


def write_quote(args: dict[str, Any]) -> dict[str, Any]:
    total = args["unit_price"] * args["quantity"]
    return {"text": f"{args['quantity']} x {args['sku']} = {total:.2f} EUR"}


SKU = {"type": "object", "required": ["sku"], "properties": {"sku": {"enum": sorted(PRICES)}}}
catalog = HostCatalog([
    ToolBinding(id="lookup_price", version="1", execute=lookup_price, recovery="pure",
                description="The unit price of a product, by SKU.", input_schema=SKU),
    ToolBinding(id="write_quote", version="1", execute=write_quote, recovery="pure",
                description="Render a one-line quote.",
                input_schema={"type": "object", "required": ["sku", "unit_price", "quantity"]}),
])


def ref(node: str, *path: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


first_try = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "price", "binding": "price_lookup", "version": "1", "args": {"sku": "A-1"}}]}
corrected = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "price", "binding": "lookup_price", "version": "1",
     "args": {"sku": ref("$input", "sku")}},
    {"id": "quote", "binding": "write_quote", "version": "1",
     "args": {"sku": ref("$input", "sku"), "quantity": ref("$input", "quantity"),
              "unit_price": ref("price", "amount")}}]}
provider = ScriptedProvider([
    ScriptedTurn(text=json.dumps(first_try), usage=Usage(input_tokens=400, output_tokens=40),
                 match=TurnMatch(metadata={"proposal": 0})),
    ScriptedTurn(text=json.dumps(corrected), usage=Usage(input_tokens=520, output_tokens=90),
                 match=TurnMatch(metadata={"proposal": 1})),
])

program = ExecutionGraphProgram(id="quote", version="1", planner=PlannerConfig(
    provider=provider, host_instructions="Plan how to quote the requested order.",
    max_corrections=2, max_output_tokens=500))


async def main() -> str:
    with tempfile.TemporaryDirectory(prefix="agentium-planner-") as tmp:
        async with SQLiteDurableTaskStore(Path(tmp) / "tasks.db") as store:
            runtime = ExecutionGraphRuntime(catalog=catalog, store=store, require_durable=True)
            await runtime.create("quote:1", program, input={"sku": "A-1", "quantity": 4})
            result = await runtime.run("quote:1", worker_id="w1")
            text: str = result.output["quote"]["text"]
            print(text)
            page = await runtime.timeline("quote:1", limit=100)
            for event in page.events:
                if event.kind == "plan_proposal":
                    verdict = "accepted" if event.data["accepted"] else "rejected: " + "; ".join(
                        d["code"] for d in event.data["diagnostics"])
                    print(f"proposal {event.data['proposal']}: {verdict}")
            view = await runtime.inspect("quote:1")
            print(f"revision {view.revision}, model calls {view.counters['model_calls']}")
            return text


if __name__ == "__main__":
    asyncio.run(main())
