"""``Agent(max_tool_errors=n)`` (asked for by review 26's user journey): a tool call the
model gets wrong is told to the model, which may correct it, instead of failing the task
at once; the default keeps the old behaviour (the node fails)."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult
from tests.test_effects import Crash

CALLS: list[dict[str, Any]] = []


async def _add(args: dict[str, Any]) -> dict[str, Any]:
    CALLS.append(args)
    return {"sum": args["a"] + args["b"]}


def _catalog(provider: ScriptedProvider, errors: int) -> HostCatalog:
    return HostCatalog([
        ToolBinding(id="add", version="1", execute=_add, recovery="pure", input_schema={
            "type": "object", "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
        AgentBinding(id="solver", version="1", agent=Agent(
            provider, "add the numbers", tools=("add",), max_tool_errors=errors))])


PROGRAM = ExecutionGraphProgram(id="p", version="1", plan={
    "schemaVersion": 1, "revision": 1,
    "nodes": [{"id": "ask", "binding": "solver", "version": "1", "args": {"prompt": "1+2"}}]})


def _script(*wrong: ToolCall) -> ScriptedProvider:
    return ScriptedProvider([
        *(ScriptedTurn(tool_calls=(call,)) for call in wrong),
        ScriptedTurn(tool_calls=(ToolCall(id="ok", name="add", arguments={"a": 1, "b": 2}),)),
        ScriptedTurn(text="3")])


BAD_ARGS = ToolCall(id="c1", name="add", arguments={"a": 1})
NO_SUCH_TOOL = ToolCall(id="c2", name="multiply", arguments={"a": 1, "b": 2})


async def test_by_default_a_wrong_call_fails_the_node() -> None:
    CALLS.clear()
    runtime = ExecutionGraphRuntime(catalog=_catalog(_script(BAD_ARGS), 0))
    await runtime.create("k", PROGRAM)
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    assert info.value.cause is not None and info.value.cause.code == "agent_failed"
    assert "'b' is a required property" in str(info.value)
    assert CALLS == []


async def test_wrong_calls_are_told_to_the_model_and_replayed_alike() -> None:
    CALLS.clear()
    provider = _script(BAD_ARGS, NO_SUCH_TOOL)
    store = InMemoryDurableTaskStore()
    runtime = ExecutionGraphRuntime(catalog=_catalog(provider, 2), store=store)
    await runtime.create("k", PROGRAM)
    result = await runtime.run("k")
    assert result.output["ask"]["text"] == "3"
    assert CALLS == [{"a": 1, "b": 2}]  # the refused calls ran nothing
    told = [m.content for r in provider.calls[1:3] for m in r.model_messages[-1:]]
    assert "'b' is a required property" in told[0] and '"refused":1' in told[0]
    assert "'multiply'" in told[1] and '"refused":2' in told[1]
    node = (await runtime.inspect("k")).nodes["ask"]
    assert node.state == "completed" and provider.call_count == 4


class CrashOnToolResult(InMemoryDurableTaskStore):
    """The worker dies as the agent's one real tool call is journaled."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.armed and any(isinstance(s, AppendJournal) and s.kind == "agent_tool_result"
                              for s in request.steps):
            self.armed = False
            raise Crash
        return await super().commit(request)


async def test_a_recovery_replays_the_refusals_without_asking_the_model() -> None:
    CALLS.clear()
    store = CrashOnToolResult()
    await ExecutionGraphRuntime(catalog=_catalog(_script(BAD_ARGS, NO_SUCH_TOOL), 2),
                                store=store).create("k", PROGRAM)
    with pytest.raises(Crash):
        await ExecutionGraphRuntime(catalog=_catalog(_script(BAD_ARGS, NO_SUCH_TOOL), 2),
                                    store=store).run("k")
    # The recovering worker's provider answers only the fourth request of the node: the
    # first three (refusals included) must be found in the journal by their digests.
    last = ScriptedProvider([ScriptedTurn(text="3", match=TurnMatch(assistant_turns=3))])
    result = await ExecutionGraphRuntime(catalog=_catalog(last, 2), store=store).run("k")
    assert result.output["ask"]["text"] == "3"
    assert last.call_count == 1
    assert CALLS == [{"a": 1, "b": 2}, {"a": 1, "b": 2}]  # the crash lost the first result


async def test_one_more_wrong_call_than_allowed_fails_the_node() -> None:
    CALLS.clear()
    runtime = ExecutionGraphRuntime(catalog=_catalog(_script(BAD_ARGS, NO_SUCH_TOOL), 1))
    await runtime.create("k", PROGRAM)
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    assert "'multiply'" in str(info.value) and CALLS == []
    # (review 41) It read as if the first wrong call had failed the node: the message and
    # details say which refused call it was and the allowance it went past.
    assert "refused call 2 of this node, past its max_tool_errors=1" in str(info.value)
    assert info.value.cause is not None
    assert (info.value.cause.details["refused"], info.value.cause.details["max_tool_errors"]) \
        == (2, 1)
    assert "refused call" not in str(await _first_wrong_call_fails())


async def _first_wrong_call_fails() -> NodeFailedError:
    runtime = ExecutionGraphRuntime(catalog=_catalog(_script(BAD_ARGS), 0))
    await runtime.create("k", PROGRAM)
    with pytest.raises(NodeFailedError) as info:
        await runtime.run("k")
    return info.value


@pytest.mark.parametrize("value", [-1, 257, True, 1.0, "2"])
def test_max_tool_errors_is_a_small_int(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        Agent(ScriptedProvider([]), "x", max_tool_errors=value)
    assert "max_tool_errors" in str(info.value)


def test_the_default_leaves_pinned_descriptors_as_they_were() -> None:
    provider = ScriptedProvider([])
    plain = AgentBinding(id="a", version="1", agent=Agent(provider, "x"))
    allowed = AgentBinding(id="a", version="1", agent=Agent(provider, "x", max_tool_errors=2))
    assert "max_tool_errors" not in str(plain.descriptor())
    assert plain.descriptor() != allowed.descriptor()


@pytest.mark.parametrize("errors", [0, 1])
async def test_a_call_past_the_limit_fails_the_node_before_any_call_of_its_answer_runs(
        errors: int) -> None:
    """Found by review 35: the valid calls of an answer ran (an effect would have been
    dispatched) before a wrong call after them in the same answer failed the node."""
    CALLS.clear()
    valid = ToolCall(id="v1", name="add", arguments={"a": 1, "b": 2})
    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(valid, *[BAD_ARGS, NO_SUCH_TOOL][:errors + 1])),
        ScriptedTurn(text="3")])
    runtime = ExecutionGraphRuntime(catalog=_catalog(provider, errors))
    await runtime.create("k", PROGRAM)
    with pytest.raises(NodeFailedError):
        await runtime.run("k")
    assert CALLS == []  # nothing of that answer ran
