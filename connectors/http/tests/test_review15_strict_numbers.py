"""The connector's numbers take real numbers only, like the core's config.

Pydantic's lax mode turned ``dispatch_attempts=True`` into 1 attempt, ``timeout_s="10"``
into 10.0 s and ``max_response_bytes=2048.0`` into 2048: a value read from text, or a flag
passed in the wrong place, was silently accepted. Counts take real ints; the ``*_s``
durations an int or a float; never a bool or a string.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import httpx
import pytest
from http_support import make_request
from pydantic import ValidationError

from agentium_graph import ConfigurationError
from agentium_graph_http import HttpActionConnector, HttpConnectorConfig

BASE = "http://payments.test"
INTS = ("dispatch_attempts", "lookup_attempts", "max_response_bytes")
FLOATS = ("timeout_s", "lookup_timeout_s", "retry_wait_s", "retry_max_wait_s")

NOT_INTS = [pytest.param(True, "bool", id="true"), pytest.param(False, "bool", id="false"),
            pytest.param(2048.0, "float", id="float"), pytest.param("2048", "str", id="str"),
            pytest.param(b"2048", "bytes", id="bytes")]
NOT_NUMBERS = [pytest.param(True, "bool", id="true"), pytest.param(False, "bool", id="false"),
               pytest.param("10", "str", id="str"), pytest.param("1.5", "str", id="str-float"),
               pytest.param(b"10", "bytes", id="bytes")]


class Two(enum.IntEnum):
    TWO = 2


@pytest.mark.parametrize("name", INTS)
@pytest.mark.parametrize(("value", "named"), NOT_INTS)
def test_an_int_option_refuses_lax_values(name: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(BASE, **{name: value})
    message = str(info.value)
    assert "invalid HTTP connector config 'http'" in message, message
    assert f"{name}: must be an int, not {named}" in message, message
    # Built directly, the config raises pydantic's error, as it does for its other fields.
    with pytest.raises(ValidationError, match=f"{name}\n.*must be an int, not {named}"):
        HttpConnectorConfig(base_url=BASE, **{name: value})


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize(("value", "named"), NOT_NUMBERS)
def test_a_duration_refuses_lax_values(name: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector(BASE, **{name: value})
    message = str(info.value)
    assert "invalid HTTP connector config 'http'" in message, message
    assert f"{name}: must be a number (an int or a float), not {named}" in message, message
    with pytest.raises(ValidationError, match=f"{name}\n.*must be a number"):
        HttpConnectorConfig(base_url=BASE, **{name: value})


@pytest.mark.parametrize("value", [2, Two.TWO])
@pytest.mark.parametrize("name", ["dispatch_attempts", "lookup_attempts"])
def test_attempt_counts_take_ints(name: str, value: int) -> None:
    connector = HttpActionConnector(BASE, **{name: value})
    got = getattr(connector.config, name)
    assert got == 2 and type(got) is int
    assert HttpActionConnector.from_config(connector.config).config == connector.config


def test_max_response_bytes_takes_an_int() -> None:
    config = HttpConnectorConfig(base_url=BASE, max_response_bytes=2048)
    assert config.max_response_bytes == 2048 and type(config.max_response_bytes) is int


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("value", [2, 2.5, Two.TWO])
def test_durations_take_ints_and_floats(name: str, value: float) -> None:
    connector = HttpActionConnector(BASE, **{name: value})
    got = getattr(connector.config, name)
    assert got == value and type(got) is float
    assert HttpActionConnector.from_config(connector.config).config == connector.config


def test_defaults_and_none_are_unchanged() -> None:
    config = HttpActionConnector(BASE, lookup_timeout_s=None).config
    assert (config.dispatch_attempts, config.lookup_attempts) == (3, 1)
    assert (config.timeout_s, config.lookup_timeout_s, config.retry_wait_s,
            config.retry_max_wait_s) == (10.0, None, 0.25, 5.0)
    assert config.max_response_bytes == 4 * 1024 * 1024


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, -1])
def test_a_real_number_out_of_range_is_still_refused(value: float) -> None:
    with pytest.raises(ConfigurationError, match="timeout_s"):
        HttpActionConnector(BASE, timeout_s=value)


@pytest.mark.parametrize("value", ["Authorization: x", [("Authorization", "x")], ""])
def test_headers_must_be_a_mapping(value: Any) -> None:
    # A string made dict() raise a bare ValueError; a list of pairs was taken as a dict.
    with pytest.raises(ConfigurationError,
                       match=r"invalid HTTP connector config 'http': headers: must be a "
                             rf"mapping .*not {type(value).__name__}"):
        HttpActionConnector(BASE, headers=value)


async def test_dispatch_attempts_true_is_not_one_attempt() -> None:
    # The bug in one line: True used to mean a single attempt against a flaky server.
    with pytest.raises(ConfigurationError, match="dispatch_attempts"):
        HttpActionConnector(BASE, dispatch_attempts=True)
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503) if len(calls) == 1 else httpx.Response(200, json={"ok": 1})

    async with HttpActionConnector(BASE, dispatch_attempts=2, retry_wait_s=0,
                                   transport=httpx.MockTransport(handler)) as connector:
        outcome = await connector.dispatch(make_request())
    assert outcome.output == {"ok": 1} and len(calls) == 2
