"""The demo's order pipeline, run in one process on SQLite (no crash): see
``agentium_graph/demo/pipeline.py`` for the catalog and plan, and
``python -m agentium_graph demo`` for the crash-and-recover version.

Run: python examples/order_pipeline.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from agentium_graph import ExecutionGraphRuntime
from agentium_graph.demo import build_catalog, build_program
from agentium_graph_sqlite import SQLiteDurableTaskStore


async def main() -> str:
    with tempfile.TemporaryDirectory(prefix="agentium-orders-") as tmp:
        async with SQLiteDurableTaskStore(Path(tmp) / "orders.db") as store:
            runtime = ExecutionGraphRuntime(catalog=build_catalog(), store=store,
                                            require_durable=True)
            await runtime.create("order-review:ord-1042", build_program("ord-1042"))
            result = await runtime.run("order-review:ord-1042", worker_id="w1")
            text: str = result.output["invoice"]["text"]
            print(text)
            return text


if __name__ == "__main__":
    asyncio.run(main())
