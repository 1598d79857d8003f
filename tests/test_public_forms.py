"""The public constructors accept the forms SPEC.md writes, and the protocols can be checked
with isinstance."""

from __future__ import annotations

import pytest

from agentium_graph import (
    ActionOutcome,
    Agent,
    ConfigurationError,
    DurableActionConnector,
    DurableTaskStore,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
    PlannerConfig,
    RepeatBinding,
    Unknown,
)
from agentium_graph.providers import ModelProvider, ScriptedProvider
from tests.conftest import Calls, chain_plan, make_catalog


def test_positional_forms_of_the_spec() -> None:
    provider = ScriptedProvider([])
    assert Unknown("network partition").reason == "network partition"
    assert Unknown().reason == ""
    outcome = ActionOutcome({"id": 7}, "ref-7")
    assert (outcome.output, outcome.result_ref) == ({"id": 7}, "ref-7")
    agent = Agent(provider, "Answer briefly.", tools=["inc"])
    assert (agent.provider, agent.instructions, agent.tools) == (provider, "Answer briefly.",
                                                                ("inc",))
    config = PlannerConfig(provider, "Plan it.", 3, 900, mode="stream")
    assert (config.host_instructions, config.max_corrections, config.max_output_tokens,
            config.mode) == ("Plan it.", 3, 900, "stream")
    inner = ExecutionGraphProgram(id="inner", version="1", plan=chain_plan(1))
    repeat = RepeatBinding(inner, 4, condition=lambda *_: False, id="loop", version="1",
                           input_schema={"type": "object"})
    assert (repeat.program, repeat.max_iterations) == (inner, 4)


@pytest.mark.parametrize("make", [
    lambda: Unknown("a", reason="b"),
    lambda: Agent(ScriptedProvider([]), "x", "y", "z"),
    lambda: PlannerConfig(ScriptedProvider([]), "x", provider=ScriptedProvider([])),
])
def test_positional_mistakes_are_configuration_errors(make: object) -> None:
    with pytest.raises(ConfigurationError):
        make()  # type: ignore[operator]


def test_the_protocols_can_be_checked_with_isinstance() -> None:
    assert isinstance(InMemoryDurableTaskStore(), DurableTaskStore)
    assert not isinstance(object(), DurableTaskStore)
    assert isinstance(ScriptedProvider([]), ModelProvider)
    assert not isinstance(object(), ModelProvider)
    assert not isinstance(object(), DurableActionConnector)


async def test_admission_snapshot_reports_the_queue_depth(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("q", ExecutionGraphProgram(id="p", version="1", plan=chain_plan(2)))
    snapshot = await rt.admission_snapshot("q")
    assert snapshot.queue_depth == snapshot.queued == 0
    assert snapshot.counters["expanded_nodes"] == 2
