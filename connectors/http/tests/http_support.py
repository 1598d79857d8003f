"""Helpers shared by the HTTP connector tests."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agentium_graph import ActionRequest

_ids = itertools.count(1)


def make_request(key: str | None = None, *, args: dict[str, Any] | None = None,
                 destination: str = "/charges", result_ref: str | None = None) -> ActionRequest:
    action_id = key or f"act_{next(_ids):024x}"
    return ActionRequest(action_id=action_id, result_ref=result_ref or action_id,
                         binding_id="charge", binding_version="1",
                         args={"amount": 500, "currency": "eur"} if args is None else args,
                         destination=destination, caller={"user": "u1"})


@dataclass
class Seen:
    """One request a :func:`raw_server` read: its request line and header fields (names
    lower case, in order)."""

    line: str
    fields: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        return dict(self.fields).get(name)


@asynccontextmanager
async def raw_server(respond: Callable[[Seen], bytes]
                     ) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A real local HTTP/1.1 server that writes ``respond(request)`` (a whole response, as
    bytes) to each request and closes the connection; yields its URL and what it read."""
    seen: list[Seen] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = head.decode("latin-1").split("\r\n")
            request = Seen(lines[0], [(n.strip().lower(), v.strip()) for n, _, v in
                                      (line.partition(":") for line in lines[1:] if line)])
            seen.append(request)
            length = request.get("content-length")
            await reader.readexactly(int(length) if length else 0)
            writer.write(respond(request))
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()
        await server.wait_closed()
