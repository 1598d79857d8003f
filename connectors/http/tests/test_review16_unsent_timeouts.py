"""A request that timed out before it was sent says it was never sent.

The whole request is bounded by ``asyncio.timeout(timeout_s)`` and httpx's own connect
timeout is ``timeout_s`` too, started a little later, so the asyncio one fired first: a
connection that never came up (a blackholed host, a TLS handshake the server never
answers) was reported as ``may_have_taken_effect=True``, "the server may have applied
it", although nothing had been sent. Which phase was reached now comes from httpcore's
trace events. Real local sockets; no timing is asserted.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import pytest
from http_support import make_request

from agentium_graph import Unknown
from agentium_graph_http import HttpActionConnector, HttpTimeoutError


@asynccontextmanager
async def _silent_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """Reads each request head (recorded) and never answers."""
    heads: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        heads.append(await reader.readuntil(b"\r\n\r\n"))

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heads
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for writer in writers),
                             return_exceptions=True)
        await server.wait_closed()


@contextmanager
def _full_backlog() -> Iterator[int]:
    """A port whose listener never accepts and whose accept queue is full, so the kernel
    drops further SYNs: a connect there hangs, like one to a blackholed host."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket()
            fillers.append(filler)
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_connection_that_never_comes_up_was_never_sent() -> None:
    with _full_backlog() as port:
        async with HttpActionConnector(f"http://127.0.0.1:{port}", timeout_s=0.5,
                                       idempotent_destination=False) as connector:
            with pytest.raises(HttpTimeoutError) as info:
                await connector.dispatch(make_request())
            lookup = await connector.resolve_result("act_1")
    # Before: True, "the server may have applied it".
    assert info.value.may_have_taken_effect is False, str(info.value)
    assert "never sent" in str(info.value)
    assert isinstance(lookup, Unknown) and "never sent" in lookup.reason


@pytest.mark.parametrize("client", ["owned", "shared"])
async def test_a_request_sent_and_never_answered_may_have_taken_effect(client: str) -> None:
    async with _silent_server() as (port, heads):
        shared = httpx.AsyncClient() if client == "shared" else None
        try:
            async with HttpActionConnector(f"http://127.0.0.1:{port}", timeout_s=0.5,
                                           client=shared,
                                           idempotent_destination=False) as connector:
                with pytest.raises(HttpTimeoutError) as info:
                    await connector.dispatch(make_request())
        finally:
            if shared is not None:
                await shared.aclose()
    assert len(heads) == 1
    assert info.value.may_have_taken_effect is True
    assert "may have applied it" in str(info.value)
