"""StoreCapabilities takes real bools and ints; ``errors.number_only`` for float config.

A third-party store author writing ``StoreCapabilities(durable=1)`` or
``max_blob_bytes="5"`` got pydantic's lax coercion (True, 5) instead of an error; the
capabilities decide whether the runtime trusts the store with durable work and how large an
output it attempts to commit.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest

from agentium_graph import ConfigurationError, ExecutionGraphRuntime, StoreCapabilities
from agentium_graph.errors import number_only
from agentium_graph.store import InMemoryDurableTaskStore
from tests.conftest import Calls, chain_plan, make_catalog, program

NOT_BOOLS = [pytest.param(1, "int", id="one"), pytest.param(0, "int", id="zero"),
             pytest.param(1.0, "float", id="float"), pytest.param("yes", "str", id="yes"),
             pytest.param("false", "str", id="false-text"),
             pytest.param(b"1", "bytes", id="bytes")]
NOT_INTS = [pytest.param(True, "bool", id="true"), pytest.param(False, "bool", id="false"),
            pytest.param(5.0, "float", id="float"), pytest.param("5", "str", id="str")]


class Five(enum.IntEnum):
    FIVE = 5


@pytest.mark.parametrize("name", ["durable", "multi_process"])
@pytest.mark.parametrize(("value", "named"), NOT_BOOLS)
def test_capability_flags_refuse_lax_values(name: str, value: Any, named: str) -> None:
    given: dict[str, Any] = {"durable": True, name: value}
    with pytest.raises(ConfigurationError) as caught:
        StoreCapabilities(**given)
    message = str(caught.value)
    assert "invalid StoreCapabilities" in message, message
    assert f"{name}: must be a bool (True or False), not {named}" in message, message


@pytest.mark.parametrize(("value", "named"), NOT_INTS)
def test_max_blob_bytes_refuses_lax_values(value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        StoreCapabilities(durable=True, max_blob_bytes=value)
    message = str(caught.value)
    assert "invalid StoreCapabilities" in message, message
    assert f"max_blob_bytes: must be an int, not {named}" in message, message


@pytest.mark.parametrize("flag", [True, False])
def test_capabilities_take_real_values(flag: bool) -> None:
    caps = StoreCapabilities(durable=flag, multi_process=not flag, name="mine",
                             max_blob_bytes=Five.FIVE)
    assert caps.durable is flag and caps.multi_process is (not flag)
    assert caps.max_blob_bytes == 5 and type(caps.max_blob_bytes) is int
    defaults = StoreCapabilities(durable=flag)
    assert defaults.multi_process is False and defaults.max_blob_bytes is None
    assert StoreCapabilities(durable=flag, max_blob_bytes=None).max_blob_bytes is None


def test_durable_is_still_required_and_bounds_still_hold() -> None:
    with pytest.raises(ConfigurationError, match="durable"):
        StoreCapabilities()
    with pytest.raises(ConfigurationError, match="durable"):
        StoreCapabilities(durable=None)
    with pytest.raises(ConfigurationError, match="max_blob_bytes"):
        StoreCapabilities(durable=True, max_blob_bytes=0)


async def test_the_built_in_store_and_runtime_still_work() -> None:
    store = InMemoryDurableTaskStore()
    assert store.capabilities.durable is False
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store)
    await rt.create("k", program(chain_plan(2)))
    assert (await rt.run("k")).status == "completed"


@pytest.mark.parametrize("value", [0, 3, 2.5, -1.0, Five.FIVE, None])
def test_number_only_passes_ints_floats_and_none(value: Any) -> None:
    assert number_only(value) is value


@pytest.mark.parametrize(("value", "named"), [
    (True, "bool"), (False, "bool"), ("10", "str"), ("1.5", "str"), (b"10", "bytes"),
    ([1], "list")])
def test_number_only_refuses_bools_and_text(value: Any, named: str) -> None:
    with pytest.raises(ValueError, match=rf"must be a number \(an int or a float\), "
                                         rf"not {named} "):
        number_only(value)
