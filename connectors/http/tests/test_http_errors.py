"""Error mapping, configuration and the public surface, without a server where none is needed."""

from __future__ import annotations

import gzip
import inspect
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from http_support import make_request

import agentium_graph_http
from agentium_graph import Absent, AgentiumGraphError, ConfigurationError, Unknown
from agentium_graph_http import (
    HttpActionConnector,
    HttpConnectorConfig,
    HttpConnectorError,
    HttpNetworkError,
    HttpRejectedError,
    HttpResponseError,
    HttpResponseTooLargeError,
    HttpServerError,
    HttpTimeoutError,
    HttpTransientError,
)

BASE = "http://payments.test"


def _raising(exc: Exception) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.MockTransport(handler)


def _answering(status: int, content: bytes = b"{}",
               headers: dict[str, str] | None = None) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=content,
                                                              headers=headers))


_REQ = httpx.Request("POST", BASE)
TRANSPORT_FAILURES: list[tuple[Exception, type[HttpConnectorError], bool]] = [
    (httpx.ConnectError("refused", request=_REQ), HttpNetworkError, False),
    (httpx.ConnectTimeout("slow connect", request=_REQ), HttpTimeoutError, False),
    (httpx.PoolTimeout("pool", request=_REQ), HttpTimeoutError, False),
    (httpx.ReadTimeout("slow read", request=_REQ), HttpTimeoutError, True),
    (httpx.WriteTimeout("slow write", request=_REQ), HttpTimeoutError, True),
    (httpx.ReadError("reset", request=_REQ), HttpNetworkError, True),
    (httpx.WriteError("broken pipe", request=_REQ), HttpNetworkError, True),
    (httpx.RemoteProtocolError("disconnected", request=_REQ), HttpNetworkError, True),
    (httpx.ProxyError("proxy", request=_REQ), HttpNetworkError, False),
    (httpx.UnsupportedProtocol("gopher", request=_REQ), HttpNetworkError, False),
    (httpx.LocalProtocolError("bad header", request=_REQ), HttpConnectorError, False),
    (httpx.DecodingError("bad gzip", request=_REQ), HttpNetworkError, True),
    (httpx.TooManyRedirects("loop", request=_REQ), HttpNetworkError, True),
    (httpx.InvalidURL("bad url"), HttpConnectorError, False),
    (httpx.StreamConsumed(), HttpNetworkError, True),
    (OSError("unexpected"), HttpNetworkError, True),
    (RuntimeError("bug in a transport"), HttpNetworkError, True),
]


@pytest.mark.parametrize(("exc", "expected", "maybe_applied"), TRANSPORT_FAILURES,
                         ids=[type(e).__name__ for e, _, _ in TRANSPORT_FAILURES])
async def test_no_raw_exception_escapes(exc: Exception, expected: type[HttpConnectorError],
                                        maybe_applied: bool) -> None:
    async with HttpActionConnector(BASE, transport=_raising(exc),
                                   idempotent_destination=False) as connector:
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")

    assert type(info.value) is expected
    assert info.value.may_have_taken_effect is maybe_applied
    assert info.value.__cause__ is exc
    assert isinstance(result, Unknown)


@pytest.mark.parametrize(("status", "expected", "maybe_applied"), [
    (500, HttpServerError, True), (502, HttpServerError, True), (409, HttpServerError, True),
    (425, HttpServerError, True), (429, HttpServerError, False), (408, HttpServerError, False),
    (400, HttpRejectedError, False), (401, HttpRejectedError, False),
    (404, HttpRejectedError, False), (302, HttpRejectedError, False),
    (307, HttpRejectedError, False),
    # See Other after a POST: processed, the result is elsewhere (not followed).
    (303, HttpResponseError, True),
])
async def test_status_mapping(status: int, expected: type[HttpConnectorError],
                              maybe_applied: bool) -> None:
    async with HttpActionConnector(BASE, transport=_answering(status, b"nope"),
                                   dispatch_attempts=1) as connector:
        with pytest.raises(expected) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")

    assert info.value.status == status
    assert info.value.may_have_taken_effect is maybe_applied
    assert info.value.body_excerpt == "nope"
    assert isinstance(info.value, HttpTransientError) is (expected is HttpServerError)
    assert isinstance(result, Absent if status == 404 else Unknown)


@pytest.mark.parametrize("body", [b"", b"NaN", b"{\"a\": Infinity}", b"\xff\xfe\x00",
                                  b"[" * 100_000, b"<html/>", b"{\"amount\": 1e999}",
                                  b"[-1E400]", b"1" * 5000])
async def test_success_without_strict_json_is_a_response_error(body: bytes) -> None:
    async with HttpActionConnector(BASE, transport=_answering(200, body)) as connector:
        with pytest.raises(HttpResponseError) as info:
            await connector.dispatch(make_request())
        lookup = await connector.resolve_result("act_any")
    assert info.value.may_have_taken_effect is True
    assert isinstance(lookup, Unknown)


async def test_retry_after_is_honoured_within_the_cap() -> None:
    transport = _answering(429, b"slow down", {"Retry-After": "0.01"})
    async with HttpActionConnector(BASE, transport=transport, dispatch_attempts=2,
                                   retry_wait_s=0, retry_max_wait_s=0.02) as connector:
        with pytest.raises(HttpServerError) as info:
            await connector.dispatch(make_request())
    assert info.value.retry_after_s == 0.01
    assert connector._backoff(1, 30.0) == 0.02


@pytest.mark.parametrize("value", ["inf", "nan", "1e999", "-inf"])
async def test_a_retry_after_that_is_no_finite_number_is_ignored(value: str) -> None:
    transport = _answering(429, b"slow down", {"Retry-After": value})
    async with HttpActionConnector(BASE, transport=transport, dispatch_attempts=1) as c:
        with pytest.raises(HttpServerError) as info:
            await c.dispatch(make_request())
    assert info.value.retry_after_s is None
    json.dumps(info.value.to_info().details, allow_nan=False)  # journals as strict JSON


async def test_requests_carry_key_json_and_static_headers_only() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"id": "ch_1"})

    connector = HttpActionConnector(f"{BASE}/v1/", create_path="charges",
                                    lookup_path_template="charges/by-key/{key}",
                                    headers={"Authorization": "Bearer s3cret"},
                                    transport=httpx.MockTransport(handler))
    async with connector:
        await connector.dispatch(make_request("act_1", args={"amount": 1, "note": "é"}))
        await connector.resolve_result("act/1?%")

    post, get = seen
    assert (post.method, str(post.url)) == ("POST", f"{BASE}/v1/charges")
    assert post.headers["idempotency-key"] == "act_1"
    assert post.headers["authorization"] == "Bearer s3cret"
    assert post.headers["content-type"] == "application/json"
    assert json.loads(post.content) == {"amount": 1, "note": "é"}
    assert (get.method, get.url.raw_path) == ("GET", b"/v1/charges/by-key/act%2F1%3F%25")
    assert "idempotency-key" not in get.headers
    assert "s3cret" not in repr(connector.config) + repr(connector)


async def test_a_shared_client_is_left_open() -> None:
    client = httpx.AsyncClient(transport=_answering(200, b"{\"ok\": true}"))
    async with client:
        async with HttpActionConnector(BASE, client=client) as connector:
            outcome = await connector.dispatch(make_request())
        assert outcome.output == {"ok": True}
        assert not client.is_closed


@pytest.mark.parametrize("options", [
    {"base_url": "payments.test"},
    {"base_url": "ftp://payments.test"},
    {"base_url": "https://user:pw@payments.test"},
    {"base_url": "https://payments.test?x=1"},
    {"lookup_path_template": "/charges"},
    {"lookup_path_template": "/charges/{key}/{other}"},
    {"lookup_path_template": "/charges/{key}?token=t0p"},
    {"lookup_path_template": "/charges/{key}#frag"},
    {"max_response_bytes": 10},
    {"create_path": "/"},
    {"headers": {"Idempotency-Key": "fixed"}},
    {"headers": {"X-Bad": "a\r\nb"}},
    {"headers": {"bad header": "x"}},
    {"timeout_s": 0},
    {"dispatch_attempts": 0},
    {"method": "GET"},
])
def test_bad_configuration_is_a_configuration_error(options: dict[str, object]) -> None:
    options = {"base_url": BASE, **options}
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(**options)  # type: ignore[arg-type]
    assert "pw" not in str(info.value)


async def test_client_and_transport_are_exclusive() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ConfigurationError):
            HttpActionConnector(BASE, client=client, transport=_answering(200))


def test_constructor_mirrors_the_config() -> None:
    params = inspect.signature(HttpActionConnector).parameters
    fields = HttpConnectorConfig.model_fields
    assert set(params) - {"client", "transport"} == set(fields)
    for name, info in fields.items():
        default = info.get_default(call_default_factory=True)
        expected = {"base_url": inspect.Parameter.empty, "headers": None}.get(name, default)
        assert params[name].default == expected, name
    config = HttpConnectorConfig(base_url=BASE, id="pay", headers={"A": "b"}, timeout_s=3)
    assert HttpActionConnector.from_config(config).config == config


def test_public_surface_is_pinned() -> None:
    assert sorted(agentium_graph_http.__all__) == sorted([
        "HttpActionConnector", "HttpConnectorConfig", "HttpConnectorError",
        "HttpNetworkError", "HttpRejectedError", "HttpResponseError",
        "HttpResponseTooLargeError", "HttpServerError", "HttpTimeoutError",
        "HttpTransientError", "__version__"])
    codes: list[str] = []
    for name in agentium_graph_http.__all__:
        obj = getattr(agentium_graph_http, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, AgentiumGraphError), name
            codes.append(obj.code)
    assert len(codes) == len(set(codes)) == 8


def test_errors_journal_as_plain_data() -> None:
    error = HttpServerError("boom", url=BASE, status=503, may_have_taken_effect=True,
                            body_excerpt="x", retry_after_s=1.5)
    info = error.to_info()
    assert info.code == "http_server_error"
    assert info.details == {"url": BASE, "status": 503, "may_have_taken_effect": True,
                            "body_excerpt": "x", "retry_after_s": 1.5}


SECRET = "sk_live_0123456789abcdef"


@pytest.mark.parametrize("value", [f"Bearer {SECRET}\x00", f"Bearer {SECRET}\x01",
                                   f"Bearer {SECRET}\x7f", f"Bearer {SECRET}é",
                                   f"Bearer {SECRET}€", f"Bearer {SECRET}\n",
                                   f" Bearer {SECRET}", f"Bearer {SECRET}\t"])
def test_header_values_that_are_not_field_content_are_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(BASE, headers={"Authorization": value})
    assert "'Authorization'" in str(info.value)
    assert SECRET not in str(info.value)


def test_valid_field_content_is_accepted() -> None:
    connector = HttpActionConnector(BASE, headers={"Authorization": "Bearer a\tb c",
                                                   "X-Empty": ""})
    assert connector.config.headers["X-Empty"] == ""


def test_names_and_keys_with_a_trailing_newline_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        HttpActionConnector(BASE, headers={"X-Token\n": "a"})
    with pytest.raises(ConfigurationError):
        HttpActionConnector(BASE, idempotency_header="Idempotency-Key\n")


async def test_a_key_with_a_trailing_newline_is_refused_before_sending() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={})

    async with HttpActionConnector(BASE, transport=httpx.MockTransport(handler)) as connector:
        with pytest.raises(HttpConnectorError, match="Idempotency-Key"):
            await connector.dispatch(make_request("act_1\n"))
        assert isinstance(await connector.resolve_result("act_1\n"), Unknown)
    assert seen == []


async def test_framing_errors_never_quote_their_text() -> None:
    exc = httpx.LocalProtocolError(f"Illegal header value b'Bearer {SECRET}'")
    async with HttpActionConnector(BASE, transport=_raising(exc),
                                   idempotent_destination=False) as connector:
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")
    assert info.value.may_have_taken_effect is False
    assert "LocalProtocolError" in str(info.value)
    assert isinstance(result, Unknown)
    assert SECRET not in str(info.value) + result.reason + repr(info.value.to_info())


class _UnbuildableClient(httpx.AsyncClient):
    def build_request(self, *args: object, **kwargs: object) -> httpx.Request:
        raise UnicodeEncodeError("ascii", f"Bearer {SECRET}é", 31, 32, "not ASCII")


async def test_a_request_that_cannot_be_built_was_not_sent() -> None:
    async with _UnbuildableClient() as client:
        connector = HttpActionConnector(BASE, client=client, idempotent_destination=False)
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")
    assert type(info.value) is HttpConnectorError
    assert info.value.may_have_taken_effect is False
    assert "UnicodeEncodeError" in str(info.value)
    assert isinstance(result, Unknown)
    assert SECRET not in str(info.value) + result.reason


@pytest.mark.parametrize("status", [200, 401, 500, 503])
async def test_static_header_values_are_redacted_from_echoed_bodies(status: int) -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        token = request.headers["authorization"]
        body = f"<p>bad auth {token} and {token.split()[1]}</p> " * 3 + " pad" * 100
        return httpx.Response(status, text=body)

    headers = {"Authorization": f"Bearer   {SECRET}"}
    async with HttpActionConnector(BASE, transport=httpx.MockTransport(echo), headers=headers,
                                   dispatch_attempts=1) as connector:
        with pytest.raises(HttpConnectorError) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")
    assert isinstance(result, Unknown)
    texts = [str(info.value), info.value.body_excerpt or "", result.reason,
             json.dumps(info.value.to_info().details)]
    assert all(SECRET not in text for text in texts), texts
    assert "[redacted]" in (info.value.body_excerpt or "")


async def test_redirects_are_never_followed_even_by_a_shared_client() -> None:
    elsewhere: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host != "payments.test":
            elsewhere.append(request)
            return httpx.Response(404, json={"error": "no such route"})
        return httpx.Response(302, headers={"Location": "http://other.test/elsewhere"})

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as client:
        connector = HttpActionConnector(BASE, client=client, idempotent_destination=False,
                                        headers={"X-Api-Key": SECRET})
        with pytest.raises(HttpRejectedError) as info:
            await connector.dispatch(make_request())
        result = await connector.resolve_result("act_any")
    assert info.value.status == 302
    assert isinstance(result, Unknown) and "302" in result.reason  # never Absent()
    assert elsewhere == []


def _chunked(status: int, chunk: bytes, count: int, pulled: list[int],
             headers: dict[str, str] | None = None) -> httpx.MockTransport:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(count):
            pulled.append(1)
            yield chunk

    return httpx.MockTransport(lambda request: httpx.Response(status, content=body(),
                                                              headers=headers))


async def test_a_success_body_over_the_limit_is_not_read() -> None:
    pulled: list[int] = []
    transport = _chunked(201, b"[" + b"1," * 512, 10_000, pulled)
    async with HttpActionConnector(BASE, transport=transport, max_response_bytes=4096,
                                   dispatch_attempts=3) as connector:
        with pytest.raises(HttpResponseTooLargeError) as info:
            await connector.dispatch(make_request())
    error = info.value
    assert isinstance(error, HttpResponseError) and not isinstance(error, HttpTransientError)
    assert (error.code, error.status, error.may_have_taken_effect) == (
        "http_response_too_large", 201, True)
    assert error.details["max_response_bytes"] == 4096
    assert len(pulled) < 10  # stopped at the limit, not after 10 MB; and never retried


async def test_a_compressed_body_counts_inflated() -> None:
    bomb = gzip.compress(b'{"x": "' + b"a" * 2_000_000 + b'"}')
    assert len(bomb) < 4096
    transport = _answering(200, bomb, {"Content-Encoding": "gzip"})
    async with HttpActionConnector(BASE, transport=transport, max_response_bytes=4096) as c:
        with pytest.raises(HttpResponseTooLargeError):
            await c.dispatch(make_request())
        lookup = await c.resolve_result("act_any")
    assert isinstance(lookup, Unknown) and "max_response_bytes" in lookup.reason


async def test_a_body_at_the_limit_is_read() -> None:
    body = json.dumps({"x": "a" * 2000}).encode()
    async with HttpActionConnector(BASE, transport=_answering(200, body),
                                   max_response_bytes=len(body)) as connector:
        assert (await connector.dispatch(make_request())).output == {"x": "a" * 2000}


@pytest.mark.parametrize(("status", "expected"), [(500, HttpServerError),
                                                  (422, HttpRejectedError)])
async def test_a_large_error_body_keeps_its_status_class(
        status: int, expected: type[HttpConnectorError]) -> None:
    pulled: list[int] = []
    async with HttpActionConnector(BASE, transport=_chunked(status, b"x" * 1024, 1000, pulled),
                                   max_response_bytes=2048, dispatch_attempts=1) as c:
        with pytest.raises(expected) as info:
            await c.dispatch(make_request())
    assert info.value.status == status
    assert len(pulled) < 10


async def test_a_large_404_lookup_is_still_absent() -> None:
    pulled: list[int] = []
    async with HttpActionConnector(BASE, transport=_chunked(404, b"x" * 1024, 1000, pulled),
                                   max_response_bytes=2048) as connector:
        assert await connector.resolve_result("act_any") == Absent()
