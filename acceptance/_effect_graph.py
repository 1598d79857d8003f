"""The effect acceptance graph: prep (pure) -> pay (HTTP connector) -> receipt (pure)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

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


class HoldFirstPost(httpx.AsyncBaseTransport):
    """A transport that freezes its whole process before the first POST goes out.

    It writes ``held`` and then blocks the event loop (no lease renewal, no other task)
    until ``go`` exists, as a long GC pause or a frozen VM would. Then the request goes out
    at once, late, under the fence the worker had when it froze: sent blocking, so no task
    of the waking runtime can cancel it first (as if it sat in the socket's buffer).
    """

    def __init__(self, held: Path, go: Path) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.held, self.go, self.done = held, go, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or self.done:
            return await self.inner.handle_async_request(request)
        self.done = True
        body = await request.aread()
        # Written whole, then renamed: a reader polling for it never sees it empty.
        ready = self.held.with_name(self.held.name + ".tmp")
        ready.write_text(str(request.headers.get("Agentium-Fence")))
        os.replace(ready, self.held)
        while not self.go.exists():
            time.sleep(0.02)  # noqa: ASYNC251 - blocking on purpose: the process is frozen
        with httpx.Client(timeout=5.0) as client:  # blocking too: see the class doc
            late = client.send(client.build_request(  # noqa: ASYNC212
                request.method, request.url, headers=request.headers, content=body))
        return httpx.Response(late.status_code, headers=late.headers, content=late.content)

    async def aclose(self) -> None:
        await self.inner.aclose()


def catalog(log: CallLog, server_url: str, idempotent: bool,
            hold_first_post: str | None = None) -> HostCatalog:
    transport = None if hold_first_post is None else \
        HoldFirstPost(Path(hold_first_post + ".held"), Path(hold_first_post + ".go"))
    connector = HttpActionConnector(server_url, id="payments-api", version="1",
                                    idempotent_destination=idempotent, timeout_s=5.0,
                                    transport=transport)

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
