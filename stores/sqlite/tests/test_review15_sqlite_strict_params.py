"""SQLiteDurableTaskStore's parameters take exact types, checked before any I/O.

Each wrong one is a ConfigurationError that names it (in the message and in
``details["argument"]``): ``read_only=1`` used to be reported as "read_only and create"
without saying which, and a path of None or a number escaped as a bare TypeError.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest

from agentium_graph import ConfigurationError
from agentium_graph_sqlite import SQLiteDurableTaskStore


class Two(enum.IntEnum):
    TWO = 2


class Sync(enum.Enum):
    FULL = "FULL"


class StrangePath:
    def __fspath__(self) -> Any:
        return 5


BAD = [
    pytest.param("read_only", 1, "int", id="read_only-1"),
    pytest.param("read_only", "yes", "str", id="read_only-yes"),
    pytest.param("read_only", None, "NoneType", id="read_only-none"),
    pytest.param("create", 0, "int", id="create-0"),
    pytest.param("create", "false", "str", id="create-false-text"),
    pytest.param("create", 1.0, "float", id="create-float"),
    pytest.param("synchronous", Sync.FULL, "Sync", id="synchronous-enum"),
    pytest.param("synchronous", b"FULL", "bytes", id="synchronous-bytes"),
    pytest.param("synchronous", 2, "int", id="synchronous-int"),
    pytest.param("busy_timeout_s", True, "bool", id="busy_timeout_s-true"),
    pytest.param("busy_timeout_s", "5", "str", id="busy_timeout_s-str"),
    pytest.param("retry_max_wait_s", False, "bool", id="retry_max_wait_s-false"),
    pytest.param("retry_max_wait_s", "0.5", "str", id="retry_max_wait_s-str"),
    pytest.param("busy_retries", True, "bool", id="busy_retries-true"),
    pytest.param("busy_retries", 2.0, "float", id="busy_retries-float"),
    pytest.param("busy_retries", "3", "str", id="busy_retries-str"),
]


@pytest.mark.parametrize(("name", "value", "named"), BAD)
def test_a_wrong_type_is_a_configuration_error_naming_the_parameter(
        tmp_path: Path, name: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        SQLiteDurableTaskStore(tmp_path / "tasks.db", **{name: value})
    message = str(info.value)
    assert info.value.details["argument"] == name
    assert name in message and f"{named} {value!r}" in message, message
    if name in ("read_only", "create"):
        assert f"{name} is {named} {value!r}" in message, message
    assert list(tmp_path.iterdir()) == []  # no I/O


@pytest.mark.parametrize("path", [None, 5, 1.5, ["tasks.db"], StrangePath()])
def test_a_path_that_is_no_path_is_a_configuration_error(tmp_path: Path, path: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"path must be a str or an os\.PathLike") as info:
        SQLiteDurableTaskStore(path)
    assert info.value.details["argument"] == "path"


@pytest.mark.parametrize("path", [":memory:", "", "data/", "sqlite:///tmp/x.db", b"x.db"])
def test_bad_path_strings_name_the_path_too(path: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        SQLiteDurableTaskStore(path)
    assert info.value.details["argument"] == "path"


def test_good_values_still_work(tmp_path: Path) -> None:
    store = SQLiteDurableTaskStore(str(tmp_path / "a.db"), synchronous="normal",
                                   busy_timeout_s=2, retry_max_wait_s=0.25,
                                   busy_retries=Two.TWO, read_only=True, create=False)
    assert store.synchronous == "NORMAL" and store.read_only
    assert "read_only=True" in repr(store)
    store = SQLiteDurableTaskStore(tmp_path / "b.db", busy_timeout_s=1.5, busy_retries=0,
                                   read_only=False, create=True)
    assert store.synchronous == "FULL" and not store.read_only
    assert list(tmp_path.iterdir()) == []


async def test_a_store_built_from_good_values_works(tmp_path: Path) -> None:
    async with SQLiteDurableTaskStore(tmp_path / "tasks.db", busy_timeout_s=3,
                                      busy_retries=1, create=True) as store:
        assert await store.get_header("absent") is None
        assert store.capabilities.durable is True
