"""MongoDBDurableTaskStore's parameters take exact types, checked before any I/O.

Constructing a store does no I/O (the URI's client connects on first use), so these need no
server. Each wrong value is a ConfigurationError that names its parameter in the message and
in ``details["argument"]``: ``read_only=1`` used to be reported as "read_only and create"
with ``details["argument"] == "read_only/create"``, without saying which was wrong.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
from pymongo import WriteConcern

from agentium_graph import ConfigurationError
from agentium_graph_mongodb import MongoDBDurableTaskStore

URI = "mongodb://127.0.0.1:1/?directConnection=true"


class Two(enum.IntEnum):
    TWO = 2


BAD = [
    pytest.param("read_only", 1, "int", id="read_only-1"),
    pytest.param("read_only", "yes", "str", id="read_only-yes"),
    pytest.param("read_only", None, "NoneType", id="read_only-none"),
    pytest.param("create", 0, "int", id="create-0"),
    pytest.param("create", "false", "str", id="create-false-text"),
    pytest.param("create", 1.0, "float", id="create-float"),
    pytest.param("server_selection_timeout_s", True, "bool", id="selection-true"),
    pytest.param("connect_timeout_s", "5", "str", id="connect-str"),
    pytest.param("socket_timeout_s", b"20", "bytes", id="socket-bytes"),
    pytest.param("retry_max_wait_s", False, "bool", id="retry_max_wait_s-false"),
    pytest.param("retries", True, "bool", id="retries-true"),
    pytest.param("retries", 3.0, "float", id="retries-float"),
    pytest.param("cas_attempts", "20", "str", id="cas_attempts-str"),
    pytest.param("cache_size", False, "bool", id="cache_size-false"),
    pytest.param("cache_size", 256.0, "float", id="cache_size-float"),
]


@pytest.mark.parametrize(("name", "value", "named"), BAD)
def test_a_wrong_type_is_a_configuration_error_naming_the_parameter(
        name: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MongoDBDurableTaskStore(URI, **{name: value})
    message = str(info.value)
    assert info.value.details["argument"] == name
    assert name in message and f"{named} {value!r}" in message, message
    if name in ("read_only", "create"):
        assert f"{name} is {named} {value!r}" in message, message


def test_good_values_still_work() -> None:
    store = MongoDBDurableTaskStore(
        URI, database="d", write_concern=WriteConcern(w=1, j=True),
        server_selection_timeout_s=2, connect_timeout_s=1.5, socket_timeout_s=Two.TWO,
        retries=Two.TWO, retry_max_wait_s=0.5, cas_attempts=1, cache_size=0,
        read_only=True, create=False)
    assert store.read_only and "read_only=True" in repr(store)
    assert store.database_name == "d"
    writer = MongoDBDurableTaskStore(URI, read_only=False, create=False)
    assert not writer.read_only and "create=False" in repr(writer)
    assert store.capabilities.durable is True and store.capabilities.multi_process is True
