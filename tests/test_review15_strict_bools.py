"""Public config refuses ints, strings and other stand-ins where it takes a bool.

Pydantic's lax mode turned ``1`` into True and ``"no"``/``"false"``/``0`` into False: a flag
read from text (an env var, a YAML value) or passed by mistake was silently accepted, and
``Agent.stream`` is pinned with the task in the binding's descriptor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    ConfigurationError,
    HostCatalog,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn
from tests.conftest import Calls, make_catalog

LAX = [pytest.param(1, "int", id="one"), pytest.param(0, "int", id="zero"),
       pytest.param(1.0, "float", id="float"), pytest.param("yes", "str", id="yes"),
       pytest.param("true", "str", id="true-text"), pytest.param("false", "str", id="false-text"),
       pytest.param(b"1", "bytes", id="bytes")]


def _provider() -> ScriptedProvider:
    return ScriptedProvider([ScriptedTurn(text="hi")])


def _tool(value: Any) -> ToolBinding:
    return ToolBinding(id="t", version="1", recovery="pure", execute=lambda args: {},
                       run_in_thread=value)


MAKERS: dict[str, Callable[[Any], object]] = {
    "ToolBinding.run_in_thread": _tool,
    "Agent.stream": lambda v: Agent(_provider(), "be brief", stream=v),
}


def _flag(made: object, name: str) -> object:
    return getattr(made, name)


@pytest.mark.parametrize("field", sorted(MAKERS))
@pytest.mark.parametrize(("value", "named"), LAX)
def test_a_bool_field_refuses_lax_values(field: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        MAKERS[field](value)
    message = str(caught.value)
    owner, name = field.split(".")
    assert f"invalid {owner}" in message, message
    assert f"{name}: must be a bool (True or False), not {named}" in message, message


@pytest.mark.parametrize("field", sorted(MAKERS))
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_field_takes_bools(field: str, value: bool) -> None:
    got = _flag(MAKERS[field](value), field.split(".")[1])
    assert got is value


@pytest.mark.parametrize("field", sorted(MAKERS))
def test_none_is_still_refused(field: str) -> None:
    with pytest.raises(ConfigurationError, match=field.split(".")[1]):
        MAKERS[field](None)


def test_defaults_are_unchanged() -> None:
    assert _tool(True).run_in_thread is True
    assert ToolBinding(id="t", version="1", recovery="pure",
                       execute=lambda args: {}).run_in_thread is True
    assert Agent(_provider(), "x").stream is False


def test_the_dict_form_of_an_agent_refuses_lax_values_too() -> None:
    # Pydantic builds the nested Agent through Agent's own constructor, which names it.
    with pytest.raises(ConfigurationError,
                       match=r"invalid Agent: stream: must be a bool \(True or False\), "
                             r"not str 'false'"):
        AgentBinding(id="a", version="1",
                     agent={"provider": _provider(), "instructions": "x", "stream": "false"})


def test_a_catalog_of_strict_bindings_still_builds_and_pins_bools() -> None:
    agent = AgentBinding(id="a", version="1", agent=Agent(_provider(), "x", stream=False))
    catalog = HostCatalog([*make_catalog(Calls()), _tool(False), agent])
    assert catalog is not None
    assert agent.descriptor().extra["stream"] is False
