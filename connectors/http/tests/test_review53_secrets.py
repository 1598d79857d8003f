"""Review 53: secrets that still got out of the HTTP connector.

* A server echoing a header value percent-encoded or in another letter case was not
  redacted (only the exact text was).
* The transport's own exception, chained as the cause, kept the unredacted text (a status
  line echoing the token): a host's ``logger.exception`` printed it.
* ``base_url`` errors quoted the URL with its query (an API key) or with a password that
  held '/' (which hid the '@' from urlsplit).
"""

from __future__ import annotations

import traceback
from urllib.parse import quote

import pytest
from http_support import Seen, make_request, raw_server

from agentium_graph import ConfigurationError
from agentium_graph_http import HttpActionConnector, HttpConnectorError
from agentium_graph_http._errors import redact

TOKEN = "sk_live_AbC/dEf+GhI=9"


@pytest.mark.parametrize("form", [quote(TOKEN, safe=""), TOKEN.lower(), TOKEN.upper()],
                         ids=["percent-encoded", "lower", "upper"])
def test_a_secret_in_another_form_is_redacted(form: str) -> None:
    assert redact(f"bad token {form} here", [TOKEN]) == "bad token [redacted] here"


async def test_the_chained_transport_error_is_redacted_too() -> None:
    def bad_status(request: Seen) -> bytes:
        return f"HTTP/1.1 5x0 Bearer {TOKEN}\r\n\r\n".encode()

    async with raw_server(bad_status) as (url, _), HttpActionConnector(
            url, headers={"Authorization": f"Bearer {TOKEN}"},
            idempotent_destination=False, timeout_s=5) as connector:
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request("act_1"))
    printed = "".join(traceback.format_exception(info.value))
    assert info.value.__cause__ is not None  # the cause is kept, for debugging
    assert TOKEN not in printed and "sk_live" not in printed


@pytest.mark.parametrize("url", ["http://127.0.0.1/x?k=apikey-0123456789XYZ",
                                 f"http://user:{TOKEN}@127.0.0.1/x"],
                         ids=["query", "password-with-slash"])
def test_a_bad_base_url_is_not_quoted_with_its_secrets(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(url, idempotent_destination=False)
    assert "apikey-0123456789XYZ" not in str(info.value) and "sk_live" not in str(info.value)
