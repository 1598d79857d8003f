"""What the MongoDB store keeps per event loop (its client, session and cache there), and
how a client it replaced after a stalled call is closed: once the operations still running
on it ended, bounded, and at the latest when the store closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from agentium_graph_mongodb._doc import DocCache
from agentium_graph_mongodb._ops import Session

# How long close() lets operations on a replaced client end before closing it anyway.
RETIRE_WAIT_S = 6.0
CLOSING: set[asyncio.Future[None]] = set()  # stuck clients being closed, kept referenced


async def close_when_idle(client: AsyncMongoClient[dict[str, Any]], used: Session | None,
                          deadline_s: float | None) -> None:
    """Close a replaced client once the operations running on it ended, waiting at most
    twice a call's bound (each of their calls ends within one); at once if cancelled (the
    store closing, its loop ending)."""
    try:
        if used is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * (deadline_s or 30.0)):
                    await used.idle.wait()
    finally:
        await _close_quietly(client)


async def _close_quietly(client: AsyncMongoClient[dict[str, Any]]) -> None:
    """Close a client whose pool may be stuck, giving up after a few seconds."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5.0):
            await client.close()


class Discard(Exception):
    """Thrown into a loop guard whose loop is gone: end it without closing anything."""


@dataclass(eq=False, slots=True)
class LoopState:
    """What the store keeps per event loop: the client, session and cache used there."""

    loop: asyncio.AbstractEventLoop
    client: AsyncMongoClient[dict[str, Any]]
    owned: bool
    cache: DocCache
    deadline_s: float | None  # a whole driver call's bound (None: the client sets none)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: Session | None = None
    guard: AsyncGenerator[None, None] | None = None
    closed: bool = False
    retiring: set[asyncio.Future[None]] = field(default_factory=set)  # replaced, closing

    async def shutdown(self) -> None:
        """Close an owned client; on this state's loop only. Never raises."""
        if self.closed:
            return
        self.closed = True
        self.cache.clear()
        if self.retiring:  # clients replaced after a stall: give their operations a
            # moment to end, then close them anyway
            _, waiting = await asyncio.wait(set(self.retiring), timeout=RETIRE_WAIT_S)
            for closing in waiting:
                closing.cancel()
            if waiting:
                await asyncio.wait(waiting, timeout=RETIRE_WAIT_S)
        if self.owned:
            with contextlib.suppress(PyMongoError, OSError, RuntimeError):
                await self.client.close()

    async def close_here(self) -> None:
        """Close from this state's own loop (ending its guard too)."""
        if self.guard is not None:
            with contextlib.suppress(RuntimeError):  # the guard is closing already
                await self.guard.aclose()
        await self.shutdown()

    def discard(self) -> None:
        """Forget a state whose loop was closed without shutting down its async
        generators: nothing can run there any more (its connections go with the loop)."""
        self.closed = True
        self.cache.clear()
        guard, self.guard = self.guard, None
        if guard is not None:
            # End the guard now, synchronously, so it is never finalized on a dead loop.
            with contextlib.suppress(StopAsyncIteration, StopIteration, RuntimeError):
                guard.athrow(Discard()).send(None)
