"""Error mapping, configuration and the public surface, without a server where none is needed."""

from __future__ import annotations

import inspect
import json

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
                                  b"[" * 100_000, b"<html/>"])
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
        "HttpNetworkError", "HttpRejectedError", "HttpResponseError", "HttpServerError",
        "HttpTimeoutError", "HttpTransientError", "__version__"])
    codes: list[str] = []
    for name in agentium_graph_http.__all__:
        obj = getattr(agentium_graph_http, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, AgentiumGraphError), name
            codes.append(obj.code)
    assert len(codes) == len(set(codes)) == 7


def test_errors_journal_as_plain_data() -> None:
    error = HttpServerError("boom", url=BASE, status=503, may_have_taken_effect=True,
                            body_excerpt="x", retry_after_s=1.5)
    info = error.to_info()
    assert info.code == "http_server_error"
    assert info.details == {"url": BASE, "status": 503, "may_have_taken_effect": True,
                            "body_excerpt": "x", "retry_after_s": 1.5}
