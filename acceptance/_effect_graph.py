"""The effect acceptance graph: prep (pure) -> pay (HTTP connector) -> receipt (pure)."""

from __future__ import annotations

from typing import Any

from acceptance._graph import CallLog
from agentium_graph import ExecutionGraphProgram, HostCatalog, ToolBinding, tool_context
from agentium_graph_http import HttpActionConnector

AMOUNT = 1250


def program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="effects", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "prep", "binding": "prep", "version": "1", "args": {"amount": AMOUNT}},
            {"id": "pay", "binding": "pay", "version": "1",
             "args": {"amount": {"$ref": {"node": "prep", "path": ["amount"]}},
                      "currency": "EUR"}},
            {"id": "receipt", "binding": "receipt", "version": "1",
             "args": {"charge": {"$ref": {"node": "pay", "path": []}}}}]})


def catalog(log: CallLog, server_url: str, idempotent: bool) -> HostCatalog:
    connector = HttpActionConnector(server_url, id="payments-api", version="1",
                                    idempotent_destination=idempotent, timeout_s=5.0)

    async def prep(args: dict[str, Any]) -> dict[str, Any]:
        log.record("start")
        return {"amount": args["amount"]}

    async def receipt(args: dict[str, Any]) -> dict[str, Any]:
        log.record("start")
        assert tool_context().node_id == "receipt"
        request = args["charge"]["request"]
        return {"text": f"charged {request['amount']} {request['currency']}"}

    return HostCatalog([
        ToolBinding(id="prep", version="1", execute=prep, recovery="pure"),
        ToolBinding(id="pay", version="1", connector=connector,
                    destination=connector.destination,
                    input_schema={"type": "object", "required": ["amount", "currency"]},
                    output_schema={"type": "object", "required": ["id", "status", "request"]}),
        ToolBinding(id="receipt", version="1", execute=receipt, recovery="pure"),
    ])
