"""Public config refuses bools, floats and strings where it takes an int.

Pydantic's lax mode turned ``True`` into 1, ``2.0`` into 2 and ``"3"`` into 3: a limit read
from text or a flag passed by mistake was silently accepted (and pinned with the task).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    Budgets,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlanLimits,
    PlannerConfig,
    RepeatBinding,
    RootLimits,
    StreamLimits,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn
from tests.conftest import Calls, chain_plan, make_catalog, program

LAX = [pytest.param(True, "bool", id="true"), pytest.param(False, "bool", id="false"),
       pytest.param(2.0, "float", id="float"), pytest.param("3", "str", id="str")]


def _step() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="step", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "n", "binding": "inc", "version": "1", "args": {"x": 1}}]})


def _provider() -> ScriptedProvider:
    return ScriptedProvider([ScriptedTurn(text="hi")])


def _model(cls: type[RootLimits | Budgets | PlanLimits | StreamLimits],
           name: str) -> Callable[[Any], object]:
    return lambda value: cls(**{name: value})


MAKERS: dict[str, Callable[[Any], object]] = {
    **{f"RootLimits.{f}": _model(RootLimits, f) for f in RootLimits.model_fields},
    **{f"Budgets.{f}": _model(Budgets, f) for f in Budgets.model_fields},
    **{f"PlanLimits.{f}": _model(PlanLimits, f) for f in PlanLimits.model_fields},
    **{f"StreamLimits.{f}": _model(StreamLimits, f) for f in StreamLimits.model_fields},
    "PlannerConfig.max_corrections": lambda v: PlannerConfig(
        provider=_provider(), host_instructions="plan", max_corrections=v),
    "PlannerConfig.max_output_tokens": lambda v: PlannerConfig(
        provider=_provider(), host_instructions="plan", max_output_tokens=v),
    "RepeatBinding.max_iterations": lambda v: RepeatBinding(
        id="r", version="1", program=_step(), max_iterations=v, condition=lambda s: False),
    "Agent.max_turns": lambda v: Agent(_provider(), "be brief", max_turns=v),
    "Agent.max_output_tokens": lambda v: Agent(_provider(), "be brief",
                                               max_output_tokens=v),
}


@pytest.mark.parametrize("field", sorted(MAKERS))
@pytest.mark.parametrize(("value", "named"), LAX)
def test_an_int_field_refuses_lax_values(field: str, value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        MAKERS[field](value)
    message = str(caught.value)
    assert field.split(".")[1] in message, message
    assert f"must be an int, not {named}" in message, message


class Level(enum.IntEnum):
    TWO = 2


# Fields whose lower bound is above 2 (sizes in bytes, at least 64).
BYTE_SIZES = {"PlanLimits.max_bytes", "StreamLimits.max_frame_bytes",
              "StreamLimits.max_total_bytes"}


@pytest.mark.parametrize("field", sorted(set(MAKERS) - BYTE_SIZES))
@pytest.mark.parametrize("value", [2, Level.TWO])
def test_an_int_field_takes_ints(field: str, value: int) -> None:
    made = MAKERS[field](value)
    name = field.split(".")[1]
    owner = made.agent if isinstance(made, AgentBinding) else made
    got = getattr(owner, name)
    assert got == 2 and type(got) is int


@pytest.mark.parametrize("field", ["Budgets.model_calls", "Agent.max_output_tokens"])
def test_optional_int_fields_still_take_none(field: str) -> None:
    made = MAKERS[field](None)
    assert getattr(made, field.split(".")[1]) is None


async def test_dict_forms_refuse_lax_values_too() -> None:
    with pytest.raises(ConfigurationError, match=r"limits: .*max_concurrent_work: must be an "
                                                 r"int, not bool"):
        ExecutionGraphRuntime(catalog=make_catalog(Calls()), limits={"max_concurrent_work": True})
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()))
    with pytest.raises(ConfigurationError, match=r"budgets: .*tool_calls: must be an int, "
                                                 r"not str"):
        await rt.create("k", program(chain_plan(2)), budgets={"tool_calls": "3"})
    with pytest.raises(ConfigurationError, match=r"max_plan_revisions: must be an int, "
                                                 r"not float"):
        await rt.create("k", program(chain_plan(2)), limits={"max_plan_revisions": 4.0})
    assert await rt.store.get_header("k") is None
    # Real ints pass, and the pinned limits read back as they were.
    await rt.create("k", program(chain_plan(2)), budgets={"tool_calls": 3},
                    limits=RootLimits(max_plan_revisions=4))
    assert (await rt.run("k")).status == "completed"
    assert (await rt.inspect("k")).counters["tool_calls"] == 2


def test_a_catalog_of_strict_bindings_still_builds() -> None:
    HostCatalog([*make_catalog(Calls()),
                 MAKERS["RepeatBinding.max_iterations"](3),
                 AgentBinding(id="a", version="1", agent=Agent(_provider(), "x", max_turns=2))])
