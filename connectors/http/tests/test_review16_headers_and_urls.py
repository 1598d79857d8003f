"""What the connector puts on the wire is what its config says, or the config is refused.

The idempotency key went into a dict beside the headers the connector sets per request, so
``idempotency_header="Content-Type"`` (or ``Accept``) was overwritten: every create went
out with no key at all, and retries of an "idempotent" destination could not be deduped.
Static headers could set the message framing (``Transfer-Encoding: chunked`` beside the
connector's ``Content-Length``, the shape of a smuggled request; lookups then announced a
chunked body they never sent) or make a header hop-by-hop (``Connection: Idempotency-Key``
lets a proxy strip the key). And a base URL or path httpx cannot send (a control
character, a space in the host, a port out of range) was accepted and failed every
request later, although invalid options are ConfigurationErrors at construction. Real
local server: it records each request's header block.
"""

from __future__ import annotations

from typing import Any

import pytest
from http_support import Seen, make_request, raw_server

from agentium_graph import ConfigurationError
from agentium_graph_http import HttpActionConnector


def _answer(request: Seen) -> bytes:
    """201 ``{}`` to a post, 404 to anything else."""
    if request.line.startswith("POST"):
        return b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize("name", ["Content-Type", "content-type", "Accept", "ACCEPT",
                                  "Content-Length", "Accept-Encoding", "Host",
                                  "Transfer-Encoding", "Connection", "Content-Encoding",
                                  "Idempotency-Key", "X-Request-Key"])
async def test_the_key_is_on_the_wire_in_the_configured_header(name: str) -> None:
    async with raw_server(_answer) as (url, seen):
        try:
            connector = HttpActionConnector(url, idempotency_header=name, timeout_s=5,
                                            dispatch_attempts=1)
        except ConfigurationError as exc:
            assert "idempotency_header" in str(exc)
            return
        request = make_request()
        async with connector:
            await connector.dispatch(request)
    # Before: Content-Type and Accept were overwritten by the connector's own values and
    # the create went out without any key.
    values = [value for field, value in seen[0].fields if field == name.lower()]
    assert values == [request.action_id], seen[0]


@pytest.mark.parametrize("name", ["Transfer-Encoding", "transfer-encoding", "Connection",
                                  "Keep-Alive", "TE", "Trailer", "Upgrade",
                                  "Proxy-Connection", "Content-Encoding"])
def test_static_headers_cannot_set_framing_or_hop_by_hop_fields(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        HttpActionConnector("http://api.test", headers={name: "chunked"})


@pytest.mark.parametrize("name", ["Accept", "accept", "ACCEPT"])
async def test_a_static_accept_is_refused_not_replaced_or_sent_twice(name: str) -> None:
    # Before: "Accept" was silently replaced by the connector's application/json, and
    # "accept" went out as a second Accept field beside it, on creates and lookups.
    with pytest.raises(ConfigurationError, match="Accept"):
        HttpActionConnector("http://api.test", headers={name: "text/html"})
    async with raw_server(_answer) as (url, seen):
        connector = HttpActionConnector(url, timeout_s=5, dispatch_attempts=1)
        async with connector:
            await connector.dispatch(make_request())
    assert [v for f, v in seen[0].fields if f == "accept"] == ["application/json"]


async def test_a_static_transfer_encoding_framed_requests_twice() -> None:
    # What the refusal above prevents, on the wire.
    async with raw_server(_answer) as (url, seen):
        try:
            connector = HttpActionConnector(url, headers={"Transfer-Encoding": "chunked"},
                                            timeout_s=5, dispatch_attempts=1)
        except ConfigurationError:
            return
        async with connector:
            await connector.dispatch(make_request())
            await connector.resolve_result("act_1")
    post, lookup = (dict(request.fields) for request in seen)
    assert not ("content-length" in post and "transfer-encoding" in post), post
    assert "transfer-encoding" not in lookup, lookup


@pytest.mark.parametrize("options", [
    {"base_url": "http://api.test\r\nX-Injected: 1"}, {"base_url": "http://api.test\x00"},
    {"base_url": "http://api\t.test"}, {"base_url": "http://api .test"},
    {"base_url": " http://api.test"}, {"base_url": "http://api.test:99999"},
    {"base_url": "http://api.test:port"}, {"base_url": "http://api.test:-1"},
    {"base_url": "http://api.test/v 1"},
    {"create_path": "/charges\r\nX-Injected: 1"}, {"create_path": "/char ges"},
    {"create_path": "/charges\x7f"},
    {"lookup_path_template": "/charges/{key}\r\nX-Injected: 1"},
    {"lookup_path_template": "/c h/{key}"},
], ids=lambda options: repr(next(iter(options.values()))))
def test_urls_httpx_cannot_send_are_refused_at_construction(options: dict[str, str]) -> None:
    config: dict[str, Any] = {"base_url": "http://api.test", **options}
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(**config)
    assert next(iter(options)) in str(info.value)


@pytest.mark.parametrize("base_url", ["http://api.test", "https://api.test:8443/v1/",
                                      "http://[::1]:8080", "http://127.0.0.1:0",
                                      "https://bücher.example/api", "HTTPS://API.TEST"])
def test_ordinary_urls_are_still_accepted(base_url: str) -> None:
    HttpActionConnector(base_url, create_path="/v2/charges",
                        lookup_path_template="/v2/charges/{key}/result")
