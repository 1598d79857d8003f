"""Content codings are decoded as a gzip reader would, however the body is cut into chunks.

Every gzip member is decoded (bytes after the last one that are not a member are ignored, as
httpx and urllib3 do); raw deflate is told from zlib-wrapped deflate even when it arrives a
byte at a time; a compressed body cut short is a decoding failure, not a shorter body; and
at most five codings are decoded, like curl and undici. Bodies are streamed, never handed
over whole, so the connector's own reader decodes them.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import zlib
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
from http_support import make_request

from agentium_graph_http import HttpActionConnector, HttpNetworkError
from agentium_graph_http._read import read_reply

BASE = "http://payments.test"
BODY = b'{"amount":1234,"pad":"' + b"ab" * 3000 + b'"}'
OUTPUT = {"amount": 1234, "pad": "ab" * 3000}


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def _members(data: bytes, *cuts: int) -> bytes:
    """``data`` gzipped as one member per piece between ``cuts``."""
    bounds = [0, *cuts, len(data)]
    return b"".join(gzip.compress(data[a:b]) for a, b in itertools.pairwise(bounds))


def _streamed(payload: bytes, coding: str, pieces: Sequence[int] | int | None
              ) -> httpx.MockTransport:
    """Answer with ``payload`` as raw chunks: of ``pieces`` bytes each (an int), of these
    sizes and then the rest (a list), or whole (None)."""
    async def body() -> AsyncIterator[bytes]:
        sizes = [pieces] * len(payload) if isinstance(pieces, int) else list(pieces or [])
        at = 0
        for size in sizes:
            if at >= len(payload):
                return
            yield payload[at:at + size]
            at += size
        if at < len(payload):
            yield payload[at:]

    return httpx.MockTransport(lambda request: httpx.Response(
        200, content=body(), headers={"Content-Encoding": coding}))


async def _read(payload: bytes, coding: str, pieces: Sequence[int] | int | None = None,
                limit: int = 1 << 20) -> bytes:
    async with httpx.AsyncClient(transport=_streamed(payload, coding, pieces)) as client:
        response = await client.send(client.build_request("GET", BASE), stream=True)
        try:
            reply = await read_reply(response, limit)
        finally:
            await response.aclose()
    assert not reply.truncated
    return reply.content


async def _dispatch_fails(transport: httpx.AsyncBaseTransport) -> HttpNetworkError:
    async with HttpActionConnector(BASE, transport=transport,
                                   dispatch_attempts=1) as connector:
        with pytest.raises(HttpNetworkError) as info:
            await connector.dispatch(make_request())
    # A body that could not be decoded came after the server accepted the request.
    assert info.value.may_have_taken_effect
    assert isinstance(info.value.__cause__, httpx.DecodingError)
    return info.value


PIECES = [pytest.param(None, id="whole"), pytest.param(1, id="1B"),
          pytest.param(7, id="7B")]


# 1. A gzip body of several members was cut to its first member.

@pytest.mark.parametrize("pieces", PIECES)
async def test_every_gzip_member_is_decoded(pieces: int | None) -> None:
    assert await _read(gzip.compress(b"12") + gzip.compress(b"34"), "gzip", pieces) == b"1234"
    payload = _members(BODY, 10, 11, 5000)
    transport = _streamed(payload, "gzip", pieces)
    async with HttpActionConnector(BASE, transport=transport,
                                   dispatch_attempts=1) as connector:
        assert (await connector.dispatch(make_request())).output == OUTPUT


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("trailer", [b"GARBAGE", b"\0" * 8, b"\x1f", b"\x1f\x00\x1f\x8b",
                                     b"\x8b\x1f\x8b"],
                         ids=["text", "zeros", "half-magic", "magic-later", "magic-late"])
async def test_bytes_after_the_last_member_that_do_not_start_a_member_are_ignored(
        trailer: bytes, pieces: int | None) -> None:
    payload = _members(BODY, 100) + trailer
    assert await _read(payload, "gzip", pieces) == BODY
    assert await _read(zlib.compress(BODY) + trailer, "deflate", pieces) == BODY
    assert await _read(_raw_deflate(BODY) + trailer, "deflate", pieces) == BODY


def _bad_crc(data: bytes) -> bytes:
    broken = bytearray(gzip.compress(data))
    broken[-5] ^= 0xFF
    return bytes(broken)


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("later", [_bad_crc(b"34"), _bad_crc(b""), b"\x1f\x8b\x07" + b"\0" * 20],
                         ids=["crc", "empty-member-crc", "method"])
async def test_a_later_member_that_is_broken_is_a_decoding_failure(
        later: bytes, pieces: int | None) -> None:
    # It starts with the gzip magic, so it is a member, not trailing bytes: ignoring it
    # would silently drop its data.
    with pytest.raises(httpx.DecodingError):
        await _read(gzip.compress(b"12") + later, "gzip", pieces)


# 2. Raw deflate failed when the first byte came alone: zlib had not yet seen its header.

@pytest.mark.parametrize("pieces", [pytest.param([1], id="1B-then-rest"),
                                    pytest.param(1, id="1B"),
                                    pytest.param([1, 1, 1], id="3x1B-then-rest")])
async def test_raw_deflate_is_told_apart_when_its_first_byte_comes_alone(
        pieces: Sequence[int] | int) -> None:
    assert await _read(_raw_deflate(BODY), "deflate", pieces) == BODY
    assert await _read(zlib.compress(BODY), "deflate", pieces) == BODY
    transport = _streamed(_raw_deflate(BODY), "deflate", pieces)
    async with HttpActionConnector(BASE, transport=transport,
                                   dispatch_attempts=1) as connector:
        assert (await connector.dispatch(make_request())).output == OUTPUT


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("inner", ["zlib", "raw"])
async def test_stacked_codings_decode_a_byte_at_a_time(inner: str, pieces: int | None) -> None:
    deflate = zlib.compress if inner == "zlib" else _raw_deflate
    # Listed in the order applied: "deflate, gzip" was deflated, then gzipped.
    assert await _read(gzip.compress(deflate(BODY)), "deflate, gzip", pieces) == BODY
    assert await _read(deflate(gzip.compress(BODY)), "gzip, deflate", pieces) == BODY
    assert await _read(deflate(_members(BODY, 3)), "gzip, deflate", pieces) == BODY


# 3. A compressed body cut short was taken as a complete, shorter body.

CUT = [pytest.param(gzip.compress(BODY)[:-8], "gzip", id="gzip-no-trailer"),
       pytest.param(gzip.compress(BODY)[:-1], "gzip", id="gzip-trailer-cut"),
       pytest.param(gzip.compress(BODY)[:30], "gzip", id="gzip-mid-data"),
       pytest.param(gzip.compress(BODY)[:5], "gzip", id="gzip-mid-header"),
       pytest.param(_members(BODY, 50)[:-4], "gzip", id="gzip-second-member-cut"),
       pytest.param(gzip.compress(BODY) + gzip.compress(b"cut")[:10], "gzip",
                    id="gzip-second-member-header"),
       pytest.param(gzip.compress(BODY) + b"\x1f\x8b", "gzip", id="gzip-second-member-magic"),
       pytest.param(zlib.compress(BODY)[:-4], "deflate", id="zlib-no-checksum"),
       pytest.param(_raw_deflate(BODY)[:-2], "deflate", id="raw-deflate"),
       pytest.param(_raw_deflate(BODY)[:1], "deflate", id="raw-deflate-1B"),
       pytest.param(zlib.compress(gzip.compress(BODY))[:-12], "gzip, deflate",
                    id="stacked")]


@pytest.mark.parametrize("pieces", [pytest.param(None, id="whole"), pytest.param(1, id="1B")])
@pytest.mark.parametrize(("payload", "coding"), CUT)
async def test_a_compressed_body_cut_short_is_a_decoding_failure(
        payload: bytes, coding: str, pieces: int | None) -> None:
    with pytest.raises(httpx.DecodingError, match="cut short"):
        await _read(payload, coding, pieces)
    await _dispatch_fails(_streamed(payload, coding, pieces))


async def test_a_close_delimited_body_cut_short_is_a_decoding_failure() -> None:
    # HTTP/1.0 without Content-Length: the end of the connection ends the body, so a dropped
    # connection looks like a complete body; only the gzip trailer can tell.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = [line for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:")]
        await reader.readexactly(int(length[0].split(b":")[1]) if length else 0)
        writer.write(b"HTTP/1.0 201 Created\r\nContent-Encoding: gzip\r\n\r\n"
                     + gzip.compress(BODY)[:-9])
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with HttpActionConnector(f"http://127.0.0.1:{port}", dispatch_attempts=1,
                                       timeout_s=5) as connector:
            with pytest.raises(HttpNetworkError) as info:
                await connector.dispatch(make_request(destination=connector.destination))
    finally:
        server.close()
        await server.wait_closed()
    assert info.value.may_have_taken_effect
    assert isinstance(info.value.__cause__, httpx.DecodingError)


# 4. Codings were stacked without a cap: hundreds held megabytes, a thousand overflowed.

async def test_at_most_five_codings_are_decoded() -> None:
    payload = BODY
    for _ in range(5):
        payload = gzip.compress(payload)
    assert await _read(payload, "gzip, GZIP, gzip, gzip ,gzip", 3) == BODY
    too_many = gzip.compress(payload)
    with pytest.raises(httpx.DecodingError, match="at most 5"):
        await _read(too_many, ", ".join(["gzip"] * 6))
    await _dispatch_fails(_streamed(too_many, ", ".join(["gzip"] * 6), None))
    # A thousand cost no more than six: refused before any decoder is made.
    await _dispatch_fails(_streamed(too_many, ", ".join(["gzip"] * 1000), None))


async def test_codings_that_are_not_decoded_do_not_count() -> None:
    payload = BODY
    for _ in range(5):
        payload = gzip.compress(payload)
    assert await _read(payload, "identity, gzip, gzip, identity, gzip, gzip, gzip") == BODY


# Edges of the header and the body.

@pytest.mark.parametrize("coding", ["gzip", "deflate", "gzip, deflate", "x-gzip"])
async def test_an_empty_body_with_a_coding_is_empty(coding: str) -> None:
    assert await _read(b"", coding) == b""


@pytest.mark.parametrize("coding", ["GZIP", "  GZip ", "x-gzip", "X-GZIP ", "gzip,identity"])
async def test_gzip_names_are_read_as_http_reads_them(coding: str) -> None:
    assert await _read(gzip.compress(BODY), coding, 7) == BODY


async def test_stacked_names_in_any_case_and_spacing() -> None:
    payload = zlib.compress(gzip.compress(BODY))
    assert await _read(payload, " GZIP ,DEFLATE  ", 1) == BODY
    assert await _read(payload, "Gzip,\tDeflate", None) == BODY


async def test_the_limit_still_holds_across_members() -> None:
    async with httpx.AsyncClient(transport=_streamed(_members(BODY, 10, 20), "gzip", 5)
                                 ) as client:
        response = await client.send(client.build_request("GET", BASE), stream=True)
        try:
            reply = await read_reply(response, 15)
        finally:
            await response.aclose()
    assert reply.truncated and reply.content == BODY[:15]
