"""A lookup is only evidence when it asks the lookup endpoint about the key that was sent.

``Absent()`` comes from a 404, so a lookup URL that lost its key (or its path) turns any
404 into false proof of absence, after which the runtime dispatches again. httpx removes
``.`` and ``..`` path segments, so a key ``..`` looked up at ``/charges/{key}`` was asked
at ``/``; a template with a dot segment after ``{key}`` dropped the key for every lookup;
and a ``base_url`` ending in an empty query or fragment (``https://api.example.com?``)
passed the "no query or fragment" check and moved every path into it. Real servers: the
test server and a raw one that records the request line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from http_support import make_request, raw_server

from agentium_graph import Absent, ConfigurationError, Unknown
from agentium_graph_http import HttpActionConnector, HttpConnectorError
from agentium_graph_http.testing import IdempotentTestServer

Connect = Callable[..., HttpActionConnector]


@pytest.mark.parametrize("key", ["..", "."])
async def test_a_key_that_is_a_dot_segment_is_never_sent_nor_looked_up(
        server: IdempotentTestServer, connect: Connect, key: str) -> None:
    connector = connect(idempotent_destination=False)
    with pytest.raises(HttpConnectorError) as info:
        await connector.dispatch(make_request(key))
    assert not info.value.may_have_taken_effect
    assert "nothing was sent" in str(info.value)
    assert server.post_count == 0
    # Before: GET /charges/.. went to GET /, whose 404 read as proof of absence.
    lookup = await connector.resolve_result(key)
    assert isinstance(lookup, Unknown), lookup
    assert server.lookup_count == 0


async def test_a_key_with_dots_inside_is_still_a_key(server: IdempotentTestServer,
                                                     connect: Connect) -> None:
    connector = connect(idempotent_destination=False)
    for key in ["...", "a..", "..a", ".a."]:
        outcome = await connector.dispatch(make_request(key))
        assert await connector.resolve_result(key) == outcome
        assert server.accepted_for(key) == 1


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize("options", [
    {"base_url": "{root}?"}, {"base_url": "{root}#"}, {"base_url": "{root}/v1/?"},
    {"lookup_path_template": "/charges/{key}/../status"},
    {"lookup_path_template": "/charges/{key}/./"},
    {"lookup_path_template": "/charges/%2e%2e/{key}"},
    {"base_url": "{root}/v1/.."},
    {"create_path": "/v1/../charges"},
], ids=["empty-query", "empty-fragment", "empty-query-after-path", "dotdot-after-key",
        "dot-after-key", "encoded-dotdot", "base-dotdot", "create-dotdot"])
async def test_urls_whose_path_would_change_on_the_way_are_refused(
        options: dict[str, str]) -> None:
    async with raw_server(lambda request: NOT_FOUND) as (root, seen):
        config: dict[str, Any] = {"base_url": root, **options}
        config["base_url"] = config["base_url"].replace("{root}", root)
        try:
            connector = HttpActionConnector(**config, timeout_s=5)
        except ConfigurationError:
            return  # refused up front: nothing can be sent or looked up in the wrong place
        # Before: accepted, and the lookup asked somewhere else (GET / or GET /charges/
        # status), whose 404 was taken as proof that the key was never accepted.
        async with connector:
            lookup = await connector.resolve_result("act_1")
        pytest.fail(f"accepted; the lookup asked {[r.line for r in seen]} and answered "
                    f"{lookup!r}")


def test_a_dot_segment_spelled_out_in_a_name_is_still_a_name() -> None:
    connector = HttpActionConnector("http://api.test/v1.2", create_path="/charges.json",
                                    lookup_path_template="/charges/{key}.json")
    assert connector.config.lookup_url("k") == "http://api.test/v1.2/charges/k.json"


async def test_a_key_that_makes_a_dot_segment_with_the_template_is_refused(
        server: IdempotentTestServer) -> None:
    async with HttpActionConnector(server.url, lookup_path_template="/charges/.{key}",
                                   timeout_s=5) as connector:
        # "/charges/.{key}" with the key "." is "/charges/..": the lookup would ask "/".
        assert isinstance(await connector.resolve_result("."), Unknown)
        with pytest.raises(HttpConnectorError, match="nothing was sent"):
            await connector.dispatch(make_request("."))
        # Any other key still makes a segment of its own ("/charges/.x") and is asked.
        assert await connector.resolve_result("x") == Absent()
    assert server.post_count == 0
    assert server.lookup_count == 1
