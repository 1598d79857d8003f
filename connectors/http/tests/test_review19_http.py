"""Review 19: promises of the HTTP connector's docs that real servers could break.

* A ``Content-Type`` charset whose codec cannot decode with ``errors="replace"``
  (``undefined`` always raises, ``idna`` refuses the handler) made ``resolve_result`` raise
  and ``dispatch`` raise a bare ``UnicodeError``; the body is now read as UTF-8.
* With retries (``idempotent_destination=True``), a lost receipt followed by a ``429`` or a
  connect failure raised the last attempt's error, ``may_have_taken_effect=False`` and "the
  server did not apply it", although the first attempt was applied.
* A static header's secret echoed JSON-escaped (``/`` as ``\\/``) was not redacted.
* A ``transport=`` keeps connections its own way: used from successive loops, a connection
  it kept alive on a closed loop failed every other dispatch; the connector now warns once
  and the docs say how to build a transport that keeps none.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httpx
import pytest
from http_support import Seen, make_request, raw_server

from agentium_graph import ActionOutcome, Unknown
from agentium_graph_http import (
    HttpActionConnector,
    HttpConnectorError,
    HttpRejectedError,
    HttpServerError,
    HttpTransientError,
)
from agentium_graph_http.testing import IdempotentTestServer

Connect = Callable[..., HttpActionConnector]


def _reply(status: int, body: bytes, content_type: str) -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize("charset", ["undefined", "idna"])
async def test_a_charset_no_codec_can_replace_in_is_read_as_utf8(charset: str) -> None:
    body = "busy, try later \u00e9".encode()
    async with raw_server(lambda _: _reply(503, body, f"text/plain; charset={charset}")
                          ) as (url, _), HttpActionConnector(url, idempotent_destination=False,
                                   timeout_s=5) as connector:
        lookup = await connector.resolve_result("act_1")
        assert isinstance(lookup, Unknown)
        assert "busy, try later" in lookup.reason
        with pytest.raises(HttpServerError) as info:
            await connector.dispatch(make_request("act_1"))
    assert info.value.status == 503
    assert info.value.may_have_taken_effect
    assert info.value.body_excerpt is not None and "busy" in info.value.body_excerpt


async def test_a_lost_receipt_then_a_429_still_may_have_taken_effect(
        server: IdempotentTestServer, connect: Connect) -> None:
    connector = connect(idempotent_destination=True, dispatch_attempts=2)
    server.drop_response_after_accept(1)
    server.on_accept = lambda key: server.fail_posts_before_accept(1, status=429)
    request = make_request()
    with pytest.raises(HttpTransientError) as info:
        await connector.dispatch(request)
    error = info.value
    assert server.accepted_for(request.action_id) == 1
    assert error.may_have_taken_effect and error.details["may_have_taken_effect"]
    assert error.details["applied_attempt"] == 1
    assert error.details["last_attempt_code"] == "http_server_error"
    assert error.status == 429
    assert "attempt 1 may have been applied" in str(error)
    assert "did not apply" not in str(error)
    assert isinstance(await connector.resolve_result(request.action_id), ActionOutcome)


@pytest.mark.parametrize("status", [400, 422])
async def test_a_lost_receipt_then_a_rejection_still_may_have_taken_effect(
        server: IdempotentTestServer, connect: Connect, status: int) -> None:
    # (review 37) A final 4xx on the retry kept may_have_taken_effect=False: "provably not
    # applied", although the first attempt was. The error keeps its type (the request is
    # refused) and says the earlier attempt may have been applied.
    connector = connect(idempotent_destination=True, dispatch_attempts=2)
    server.drop_response_after_accept(1)
    server.on_accept = lambda key: server.fail_posts_before_accept(1, status=status)
    request = make_request()
    with pytest.raises(HttpRejectedError) as info:
        await connector.dispatch(request)
    error = info.value
    assert server.accepted_for(request.action_id) == 1 and error.status == status
    assert error.may_have_taken_effect and error.details["may_have_taken_effect"]
    assert error.details["applied_attempt"] == 1
    assert "attempt 1 may have been applied" in str(error)


async def test_a_lost_receipt_then_a_connect_failure_still_may_have_taken_effect() -> None:
    seen: list[bytes] = []
    listening: list[asyncio.Server] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        seen.append(await reader.readexactly(length))
        listening[0].close()  # the server goes away: the retry cannot connect
        writer.close()  # and this request's answer is lost

    listening.append(await asyncio.start_server(answer, "127.0.0.1", 0))
    url = f"http://127.0.0.1:{listening[0].sockets[0].getsockname()[1]}"
    async with HttpActionConnector(url, idempotent_destination=True, dispatch_attempts=2,
                                   retry_wait_s=0.05, timeout_s=5) as connector:
        with pytest.raises(HttpTransientError) as info:
            await connector.dispatch(make_request("act_1"))
    assert len(seen) == 1
    assert info.value.may_have_taken_effect
    assert "never sent" not in str(info.value)
    assert info.value.details["applied_attempt"] == 1
    assert info.value.details["last_attempt_code"] == "http_network"


@pytest.mark.parametrize("escape", [lambda s: s.replace("/", "\\/"), lambda s: s],
                         ids=["slash-escaped", "plain"])
async def test_a_secret_echoed_json_escaped_is_redacted(
        escape: Callable[[str], str]) -> None:
    token = "sk_live/Zm9vYmFy\"YmF6cXV4"

    def echo(request: Seen) -> bytes:
        text = json.dumps({"error": "bad auth", "got": request.get("authorization")})
        return _reply(401, escape(text).encode(), "application/json")

    async with raw_server(echo) as (url, _), HttpActionConnector(
            url, headers={"Authorization": f"Bearer {token}"},
            idempotent_destination=False) as connector:
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request("act_1"))
        lookup = await connector.resolve_result("act_1")
    excerpt = info.value.details["body_excerpt"]
    assert "[redacted]" in excerpt and "Zm9vYmFy" not in excerpt
    assert isinstance(lookup, Unknown) and "Zm9vYmFy" not in lookup.reason


def test_a_transport_used_from_successive_loops_warns_once(
        server: IdempotentTestServer, caplog: pytest.LogCaptureFixture) -> None:
    connector = HttpActionConnector(
        server.url, transport=httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_keepalive_connections=0)),
        idempotent_destination=False, timeout_s=5)
    with caplog.at_level(logging.WARNING, logger="agentium_graph.connectors.http"):
        for _ in range(3):
            outcome = asyncio.run(connector.dispatch(make_request()))
            assert isinstance(outcome, ActionOutcome)
    asyncio.run(connector.aclose())
    warnings = [r for r in caplog.records if "another event loop" in r.getMessage()]
    assert len(warnings) == 1
    assert "max_keepalive_connections=0" in warnings[0].getMessage()
    # Built as the warning says, every dispatch is answered (none lost to a stale connection).
    assert server.accepted_count == 3
