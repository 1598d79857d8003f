"""``max_response_bytes`` is exact: no more decoded bytes are held or returned, whatever the
body's coding and however it is cut into chunks; and config flags take real bools only."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from http_support import make_request
from pydantic import ValidationError

from agentium_graph import ActionOutcome, ConfigurationError, Unknown
from agentium_graph_http import (
    HttpActionConnector,
    HttpConnectorConfig,
    HttpNetworkError,
    HttpResponseTooLargeError,
)

BASE = "http://payments.test"
LIMIT = 4096


def _json(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes."""
    body = b'{"x":"' + b"a" * (size - 8) + b'"}'
    assert len(body) == size
    return body


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODERS: dict[str, Any] = {
    "identity": lambda b: b,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw deflate": _raw_deflate,
    "gzip, deflate": lambda b: zlib.compress(gzip.compress(b)),
}


def _header(coding: str) -> dict[str, str]:
    return {"Content-Encoding": "deflate" if coding == "raw deflate" else coding}


def _streamed(status: int, payload: bytes, headers: dict[str, str],
              piece: int | None) -> httpx.MockTransport:
    """Answer with ``payload`` as raw (still encoded) chunks of ``piece`` bytes."""
    async def body() -> AsyncIterator[bytes]:
        step = piece or len(payload)
        for at in range(0, len(payload), step):
            yield payload[at:at + step]

    return httpx.MockTransport(lambda request: httpx.Response(status, content=body(),
                                                              headers=headers))


@pytest.mark.parametrize("piece", [7, 1000, None], ids=["7B", "1000B", "whole"])
@pytest.mark.parametrize("coding", sorted(ENCODERS))
@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1, LIMIT + 900])
async def test_the_limit_is_exact_at_every_chunk_boundary(size: int, coding: str,
                                                         piece: int | None) -> None:
    body = _json(size)
    transport = _streamed(200, ENCODERS[coding](body), _header(coding), piece)
    async with HttpActionConnector(BASE, transport=transport, max_response_bytes=LIMIT,
                                   dispatch_attempts=1) as connector:
        if size <= LIMIT:
            assert (await connector.dispatch(make_request())).output == {"x": "a" * (size - 8)}
            lookup = await connector.resolve_result("act_any")
            assert isinstance(lookup, ActionOutcome)
            assert lookup.output == {"x": "a" * (size - 8)}
        else:
            with pytest.raises(HttpResponseTooLargeError):
                await connector.dispatch(make_request())
            lookup = await connector.resolve_result("act_any")
            assert isinstance(lookup, Unknown) and "max_response_bytes=4096" in lookup.reason


@pytest.mark.parametrize("coding", ["gzip", "deflate", "gzip, deflate"])
async def test_a_compressed_body_is_never_inflated_past_the_limit(coding: str) -> None:
    # 16 MiB inflated from a few KiB sent in one chunk: httpx's own decoding inflates a
    # whole chunk at once, so all of it was held before the limit was looked at.
    payload = ENCODERS[coding](_json(16 * 1024 * 1024))
    assert len(payload) < 64 * 1024
    transport = _streamed(200, payload, _header(coding), None)
    async with HttpActionConnector(BASE, transport=transport, max_response_bytes=LIMIT,
                                   dispatch_attempts=1) as connector:
        tracemalloc.start()
        try:
            with pytest.raises(HttpResponseTooLargeError):
                await connector.dispatch(make_request())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1024 * 1024, f"{peak} bytes held at the peak"


async def test_the_too_large_error_says_the_limit_and_what_to_change() -> None:
    transport = _streamed(201, gzip.compress(_json(LIMIT + 1)), {"Content-Encoding": "gzip"},
                          None)
    async with HttpActionConnector(BASE, transport=transport,
                                   max_response_bytes=LIMIT) as connector:
        with pytest.raises(HttpResponseTooLargeError) as info:
            await connector.dispatch(make_request())
        lookup = await connector.resolve_result("act_any")
    message = str(info.value)
    assert "max_response_bytes=4096" in message
    assert "raise max_response_bytes" in message
    assert info.value.details["max_response_bytes"] == LIMIT
    assert isinstance(lookup, Unknown)
    assert "max_response_bytes=4096" in lookup.reason
    assert "raise max_response_bytes" in lookup.reason


async def test_only_codings_read_under_the_limit_are_asked_for() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding"))
        return httpx.Response(200, json={"ok": True})

    async with HttpActionConnector(BASE, transport=httpx.MockTransport(handler)) as connector:
        await connector.dispatch(make_request())
        await connector.resolve_result("act_any")
    assert seen == ["gzip, deflate", "gzip, deflate"]


async def test_a_broken_compressed_body_is_still_a_decoding_failure() -> None:
    transport = _streamed(200, b"\x1f\x8b not gzip at all", {"Content-Encoding": "gzip"},
                          None)
    async with HttpActionConnector(BASE, transport=transport,
                                   dispatch_attempts=1) as connector:
        with pytest.raises(HttpNetworkError) as info:
            await connector.dispatch(make_request())
    # As when httpx decoded it: the body was cut off after the server accepted.
    assert info.value.may_have_taken_effect
    assert isinstance(info.value.__cause__, httpx.DecodingError)


@pytest.mark.parametrize("value", [1, 0, "false", "true", 1.0])
def test_idempotent_destination_takes_a_real_bool_only(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(BASE, idempotent_destination=value)
    message = str(info.value)
    assert "idempotent_destination: must be a bool (True or False), not " \
        f"{type(value).__name__}" in message, message
    with pytest.raises(ValidationError, match="idempotent_destination"):
        HttpConnectorConfig(base_url=BASE, idempotent_destination=value)


@pytest.mark.parametrize("value", [True, False])
def test_idempotent_destination_takes_bools(value: bool) -> None:
    connector = HttpActionConnector(BASE, idempotent_destination=value)
    assert connector.idempotent_destination is value
    assert HttpActionConnector.from_config(connector.config).config == connector.config
