"""Reading a response body under ``max_response_bytes``, exactly.

httpx's own decoding inflates each raw chunk whole before anyone can look at it: a few KiB
of gzip become megabytes in one decoded chunk, all held before the bound is checked. So
the body is read raw here and inflated on demand, never asking for more than one byte
past the limit: at most ``limit + 1`` decoded bytes are ever held, at most ``limit`` are
returned.

Decoded: ``gzip`` and ``deflate`` (zlib-wrapped or raw, as httpx tells them apart), stacked
in any order. Those are all the connector asks for (``Accept-Encoding: gzip, deflate``);
any other coding is passed through as it came, as httpx does with codings it does not
know, so its body is not JSON and reads as unreadable.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import httpx

from agentium_graph_http._errors import Reply

ACCEPT_ENCODING = "gzip, deflate"
# Compressed bytes handed to an inflater at a time: bounds what a stacked coding holds
# between its stages.
_BLOCK = 64 * 1024
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class _Stage(Protocol):
    def read(self, n: int) -> bytes:
        """Up to ``n`` (> 0) decoded bytes; ``b""`` when none can be made from what has
        arrived so far."""


class _Raw:
    """The raw bytes received and not yet decoded."""

    def __init__(self) -> None:
        self._data = b""
        self._at = 0

    def push(self, data: bytes) -> None:
        self._data = self._data[self._at:] + data
        self._at = 0

    def clear(self) -> None:
        self._data, self._at = b"", 0

    def read(self, n: int) -> bytes:
        out = self._data[self._at:self._at + n]
        self._at += len(out)
        return out


class _Inflater:
    """One zlib stream over ``upstream``, inflated no further than asked."""

    def __init__(self, coding: str, upstream: _Stage, request: httpx.Request) -> None:
        self._coding = coding
        self._z = zlib.decompressobj(_WBITS[coding])
        self._upstream = upstream
        self._request = request
        self._tail = b""
        self._started = False

    def read(self, n: int) -> bytes:
        while True:
            if not self._tail and not self._z.eof:
                self._tail = self._upstream.read(_BLOCK)
            fed = self._tail
            out = self._inflate(fed, n)
            self._tail = self._z.unconsumed_tail
            if out or not fed:
                return out

    def _inflate(self, data: bytes, n: int) -> bytes:
        try:
            out = self._z.decompress(data, n)
        except zlib.error as exc:
            if self._coding == "deflate" and not self._started:
                # Many servers send raw deflate under "deflate": retry the first bytes so.
                self._started = True
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._inflate(data, n)
            raise httpx.DecodingError(f"{self._coding}: {exc}", request=self._request) \
                from None
        self._started = self._started or bool(data)
        return out


def _decoder(response: httpx.Response, raw: _Raw) -> _Stage:
    stage: _Stage = raw
    codings = response.headers.get_list("content-encoding", split_commas=True)
    # The last coding listed was applied last, so it is undone first.
    for coding in reversed([c.strip().lower() for c in codings]):
        if coding in _WBITS:
            stage = _Inflater(coding, stage, response.request)
    return stage


async def read_reply(response: httpx.Response, limit: int) -> Reply:
    """Read at most ``limit`` decoded bytes of ``response``'s body (a gzip body counts as
    inflated); past that the body is ``truncated``, the rest is never read and the
    connection is closed by the caller."""
    try:
        held = response.content  # a transport that answered from memory has decoded it
    except httpx.ResponseNotRead:
        pass
    else:
        return _reply(response, held[:limit], len(held) > limit)
    raw = _Raw()
    body = _decoder(response, raw)
    data = bytearray()
    truncated = False
    chunks = response.aiter_raw()
    try:
        async for chunk in chunks:
            raw.push(chunk)
            # One byte past the limit is asked for only to learn that there is more.
            while piece := body.read(limit + 1 - len(data)):
                data += piece
                if len(data) > limit:
                    del data[limit:]
                    truncated = True
                    break
            if truncated:
                break
            raw.clear()  # drained: whatever is left follows the end of a compressed stream
    finally:
        close = getattr(chunks, "aclose", None)  # an async generator: finish it here
        if close is not None:
            await close()
    return _reply(response, bytes(data), truncated)


def _reply(response: httpx.Response, content: bytes, truncated: bool) -> Reply:
    return Reply(status=response.status_code, headers=response.headers, content=content,
                 truncated=truncated, charset=response.charset_encoding)
