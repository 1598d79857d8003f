"""Reading a response body under ``max_response_bytes``.

httpx's own decoding inflates each raw chunk whole before anyone can look at it: a few KiB
of gzip become megabytes in one decoded chunk, all held before the bound is checked. So
the body is read raw here and inflated on demand, never asking for more than one byte
past the limit: at most ``limit + 1`` decoded bytes are ever made, at most ``limit`` are
returned. What else is held is bounded but not by the limit: the raw chunk being read,
and for each coding its zlib state (about 40 KiB, mostly the 32 KiB window) and up to 64
KiB of input it has not inflated yet. At most five codings are decoded, like curl and
undici; more is a decoding error.

Decoded: ``gzip`` (``x-gzip`` too, RFC 9110) and ``deflate`` (zlib-wrapped or raw, told
apart by zlib's 2-byte header however the body is cut into chunks), stacked in any order.
Every gzip member is decoded, as gzip readers do; bytes after the last member, or after a
deflate stream, that do not start another member are ignored, as gzip, httpx and urllib3
do. A body that ends inside a compressed stream (a dropped connection on a body delimited
by the connection's end) is a decoding error, not a shorter body. Those codings are all
the connector asks for (``Accept-Encoding: gzip, deflate``). A body in any other coding
(``br``, ``zstd``, a name not known; ``identity`` is none) is not read at all: its reply
says ``undecoded``, so its bytes can never be taken for the body they encode, and its
status still speaks for itself.
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
_ALIASES = {"x-gzip": "gzip"}
_GZIP_MAGIC = b"\x1f\x8b"
# Each coding holds a zlib state and reads through the one before it; curl and undici
# refuse more than five too.
_MAX_CODINGS = 5


class _Stage(Protocol):
    def read(self, n: int) -> bytes:
        """Up to ``n`` (> 0) decoded bytes; ``b""`` when none can be made from what has
        arrived so far."""

    def check_ended(self) -> None:
        """Once the whole body has arrived and been read: raise ``httpx.DecodingError``
        if it ended inside a compressed stream."""


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

    def check_ended(self) -> None:
        pass  # raw bytes end wherever the body does


class _Inflater:
    """One coding over ``upstream``, inflated no further than asked.

    A gzip body may hold several members (RFC 1952 2.2), each a zlib stream of its own:
    they are decoded one after another. As gzip does, what follows a member is another
    member when it starts with the gzip magic, and trailing bytes to ignore otherwise;
    bytes after a deflate stream are ignored. Ignored bytes are not even inflated by the
    codings they came through (the body is still read to its end, as httpx does).
    """

    def __init__(self, coding: str, upstream: _Stage, request: httpx.Request) -> None:
        self._coding = coding
        self._upstream = upstream
        self._request = request
        self._z = zlib.decompressobj(_WBITS[coding])
        # Input the current stream has not taken; after its end, the bytes that follow it.
        self._tail = b""
        self._fed = False  # the current stream (gzip: member) has taken input
        self._done = False  # past the end: the rest is ignored
        # deflate: what zlib took before its 2-byte header could be checked, to feed again
        # as raw deflate if the check fails.
        self._head: bytes | None = b"" if coding == "deflate" else None

    def read(self, n: int) -> bytes:
        while not self._done:
            if self._z.eof:
                if len(self._tail) < (2 if self._coding == "gzip" else 1):
                    more = self._upstream.read(_BLOCK)
                    if not more:
                        return b""  # a clean end so far; another member may follow
                    self._tail += more
                    continue
                if self._coding != "gzip" or not self._tail.startswith(_GZIP_MAGIC):
                    self._done, self._tail = True, b""
                    break
                self._z, self._fed = zlib.decompressobj(_WBITS["gzip"]), False
            elif not self._tail:
                self._tail = self._upstream.read(_BLOCK)
            fed = self._tail
            out = self._inflate(fed, n)
            if out or not fed:
                return out
        return b""

    def _inflate(self, data: bytes, n: int) -> bytes:
        try:
            out = self._z.decompress(data, n)
        except zlib.error as exc:
            if self._head is not None:
                # Many servers send raw deflate under "deflate".
                data, self._head = self._head + data, None
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._inflate(data, n)
            raise httpx.DecodingError(f"{self._coding}: {exc}", request=self._request) \
                from None
        if self._head is not None and data:
            # Under 2 bytes in all, zlib takes each one without checking anything yet.
            self._head += data
            if len(self._head) >= 2:
                self._head = None
        self._tail = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
        self._fed = self._fed or bool(data)
        return out

    def check_ended(self) -> None:
        if self._done:
            return  # what came after the end, its codings' ends included, is ignored
        if self._fed and not self._z.eof:
            raise httpx.DecodingError(
                f"{self._coding}: the body ended inside the compressed data (cut short)",
                request=self._request)
        self._upstream.check_ended()


def _codings(response: httpx.Response) -> list[str]:
    """The codings listed in ``Content-Encoding``, in the order applied, lower case."""
    listed = response.headers.get_list("content-encoding", split_commas=True)
    return [c.strip().lower() for c in listed if c.strip()]


def _undecoded(codings: list[str]) -> str | None:
    """``codings`` as one value when one of them is not decoded here, else None."""
    if all(_ALIASES.get(c, c) in _WBITS or c == "identity" for c in codings):
        return None
    return ", ".join(codings)


def _decoder(response: httpx.Response, raw: _Raw) -> _Stage:
    names = _codings(response)
    codings = [c for c in (_ALIASES.get(name, name) for name in names) if c in _WBITS]
    if len(codings) > _MAX_CODINGS:
        raise httpx.DecodingError(
            f"the body is encoded {len(codings)} times over (Content-Encoding); at most "
            f"{_MAX_CODINGS} codings are decoded", request=response.request)
    stage: _Stage = raw
    # The last coding listed was applied last, so it is undone first.
    for coding in reversed(codings):
        stage = _Inflater(coding, stage, response.request)
    return stage


async def read_reply(response: httpx.Response, limit: int) -> Reply:
    """Read at most ``limit`` decoded bytes of ``response``'s body (a gzip body counts as
    inflated); past that the body is ``truncated``, the rest is never read and the
    connection is closed by the caller.

    Raises ``httpx.DecodingError`` for a body its codings cannot decode: broken, cut short,
    or stacked more than five deep. A body in a coding not decoded here is not read: the
    reply is ``undecoded``.
    """
    undecoded = _undecoded(_codings(response))
    if undecoded is not None:
        return Reply(status=response.status_code, headers=response.headers, content=b"",
                     undecoded=undecoded)
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
        if not truncated:
            body.check_ended()  # all of it arrived: a stream still open was cut short
    finally:
        close = getattr(chunks, "aclose", None)  # an async generator: finish it here
        if close is not None:
            await close()
    return _reply(response, bytes(data), truncated)


def _reply(response: httpx.Response, content: bytes, truncated: bool) -> Reply:
    return Reply(status=response.status_code, headers=response.headers, content=content,
                 truncated=truncated, charset=response.charset_encoding)
