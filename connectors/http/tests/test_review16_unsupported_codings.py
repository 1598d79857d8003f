"""A body in a content coding the connector does not decode is never read as the receipt.

Only gzip and deflate are decoded (and asked for). A coding it does not decode (br, zstd,
compress, or a name it does not know) was skipped: the bytes were parsed as they came, so
a ``br`` body that happened to parse was taken as the outcome, ``br, gzip`` was gunzipped
and taken although the result was still brotli, and ``gzip, br`` gunzipped brotli bytes
into a DecodingError reported as "failed unexpectedly", transient, so an idempotent
destination was sent the create again and again. Now such a 2xx is a
``HttpResponseError`` naming the coding (the server answered, so it may have taken effect;
never retried), a lookup's 2xx is ``Unknown`` and a 404 is still ``Absent()``: the status
settles it. A body that fails to decode says so. Real local server.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

import pytest
from http_support import Seen, make_request, raw_server

from agentium_graph import Absent, Unknown
from agentium_graph_http import (
    HttpActionConnector,
    HttpNetworkError,
    HttpRejectedError,
    HttpResponseError,
    HttpTransientError,
)

JSON = b'{"id":"ch_1","amount":500}'


def _answer(status: int, coding: str, body: bytes) -> Callable[[Seen], bytes]:
    """Every request is answered with ``status``, ``Content-Encoding: coding`` and ``body``."""
    head = b"HTTP/1.1 %d X\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n" % (
        status, coding.encode(), len(body))
    return lambda request: head + body


UNDECODED = [("br", JSON), ("zstd", JSON), ("compress", JSON), ("x-unknown", JSON),
             ("br, gzip", gzip.compress(JSON)), ("gzip, br", gzip.compress(JSON)),
             ("gzip, zstd", b"\x28\xb5\x2f\xfd not really zstd")]


@pytest.mark.parametrize(("coding", "body"), UNDECODED, ids=[c for c, _ in UNDECODED])
async def test_a_2xx_in_a_coding_not_decoded_is_an_unreadable_receipt(coding: str,
                                                                      body: bytes) -> None:
    async with (raw_server(_answer(201, coding, body)) as (url, requests),
                HttpActionConnector(url, timeout_s=5, retry_wait_s=0,
                                    dispatch_attempts=3) as connector):
        with pytest.raises(HttpResponseError) as info:
            await connector.dispatch(make_request())
        posts = len(requests)
        lookup = await connector.resolve_result("act_1")
    error = info.value
    assert not isinstance(error, HttpTransientError)
    assert posts == 1  # an answer, not a failure to retry: the server would answer alike
    assert error.may_have_taken_effect and error.status == 201
    assert error.details["content_encoding"] == coding
    assert coding in str(error) and "gzip, deflate" in str(error)
    assert isinstance(lookup, Unknown), lookup
    assert coding in lookup.reason


@pytest.mark.parametrize("coding", ["br", "gzip, br", "zstd"])
async def test_the_status_of_an_answer_in_a_coding_not_decoded_still_settles_it(
        coding: str) -> None:
    async with (raw_server(_answer(404, coding, b"\x0b\x02\x80not found\x03")) as (url, _),
                HttpActionConnector(url, timeout_s=5, dispatch_attempts=1) as connector):
        assert await connector.resolve_result("act_1") == Absent()
        with pytest.raises(HttpRejectedError) as info:
            await connector.dispatch(make_request())
    assert info.value.status == 404 and not info.value.may_have_taken_effect
    assert "\ufffd" not in (info.value.body_excerpt or "")  # no mojibake of br bytes


async def test_identity_is_no_coding() -> None:
    async with (raw_server(_answer(200, "identity", JSON)) as (url, _),
                HttpActionConnector(url, timeout_s=5) as connector):
        output = (await connector.dispatch(make_request())).output
    assert output == {"id": "ch_1", "amount": 500}


async def test_a_body_that_fails_to_decode_says_so() -> None:
    async with (raw_server(_answer(201, "gzip", b"\x1f\x8b\x08\x00 broken gzip")) as (url, _),
                HttpActionConnector(url, timeout_s=5, dispatch_attempts=1) as connector):
        with pytest.raises(HttpNetworkError) as info:
            await connector.dispatch(make_request())
        lookup = await connector.resolve_result("act_1")
    message = str(info.value)
    # Before: "failed unexpectedly (DecodingError)", with no word of the body or the coding.
    assert "could not be decoded" in message and "gzip" in message, message
    assert info.value.may_have_taken_effect
    assert isinstance(lookup, Unknown) and "could not be decoded" in lookup.reason
