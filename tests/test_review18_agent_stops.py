"""An agent node when its run stops: it starts no new call, and it is closed by the stop.

Found by the adversarial review of containers and agents under interruption (see
``tests/test_review18_prop_agents.py``). Each test failed before its fix.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    RootLimits,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch, Usage
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult, SettleNode

U1 = Usage(input_tokens=1, output_tokens=1)


class Destination:
    """A connector whose destination records every action it applied."""

    id, version, idempotent_destination = "dest", "1", False

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.applied.append(request.action_id)
        return ActionOutcome(output={"ok": True}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent:
        if result_ref in self.applied:
            return ActionOutcome(output={"ok": True}, result_ref=result_ref)
        return Absent()


def program(*nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


def agent_node(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "binding": "ag", "version": "1", "args": {"prompt": node_id}}


class SeesFailure(InMemoryDurableTaskStore):
    """Sets ``failed`` once a commit that settles a node failed has landed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = asyncio.Event()

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(s, SettleNode) and s.state == "failed" for s in request.steps):
            self.failed.set()
        return result


async def test_an_agent_starts_no_new_call_once_another_node_failed_the_run() -> None:
    # After node b failed (the run stopping, the task failing), the agent went on with its
    # conversation: four more model calls and a connector dispatch per turn, all charged,
    # to a destination that applied them, for a task that had already failed.
    store = SeesFailure()
    destination = Destination()
    started = asyncio.Event()

    async def boom(args: dict[str, Any]) -> dict[str, Any]:
        await started.wait()
        raise ValueError("boom")

    async def pure(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.wait_for(store.failed.wait(), 5)  # b's failure is committed first
        return {"v": 1}

    turns = [ScriptedTurn(tool_calls=(ToolCall(id=f"c{t}", name="pure", arguments={}),
                                      ToolCall(id=f"e{t}", name="eff", arguments={"t": t})),
                          usage=U1, match=TurnMatch(assistant_turns=t)) for t in range(4)]
    provider = ScriptedProvider([*turns, ScriptedTurn(text="done", usage=U1)])
    catalog = HostCatalog([
        ToolBinding(id="boom", version="1", execute=boom, recovery="pure"),
        ToolBinding(id="pure", version="1", execute=pure, recovery="pure"),
        ToolBinding(id="eff", version="1", connector=destination, destination="d"),
        AgentBinding(id="ag", version="1", agent=Agent(provider, "go", tools=("pure", "eff"),
                                                       max_output_tokens=5, max_turns=8))])
    rt = ExecutionGraphRuntime(catalog=catalog, store=store)
    await rt.create("k", program({"id": "b", "binding": "boom", "version": "1"},
                                 agent_node("a")),
                    limits=RootLimits(max_concurrent_work=2))
    with pytest.raises(NodeFailedError) as info:
        await asyncio.wait_for(rt.run("k"), 10)
    assert info.value.node_id == "b"
    assert provider.call_count == 1 and destination.applied == []
    view = await rt.inspect("k")
    assert view.status == "failed"
    assert {n: v.state for n, v in view.nodes.items()} == {"b": "failed", "a": "canceled"}
    assert view.counters["model_calls"] == 1 and view.counters["tool_calls"] == 2
    assert not view.actions


async def test_a_budget_stop_leaves_an_agent_waiting_for_a_permit_running() -> None:
    # a1's tool call waited for the one permit when a2's model call was refused by the
    # budget: the stop rejected the waiting request and a1 ended 'canceled' in a task left
    # 'pending' (recoverable), though nobody canceled anything; no later run could start it.
    async def pure(args: dict[str, Any]) -> dict[str, Any]:
        return {"v": 1}

    def script(node: str) -> list[ScriptedTurn]:
        return [ScriptedTurn(tool_calls=(ToolCall(id="c", name="pure", arguments={}),),
                             delay=0.01, usage=U1,
                             match=TurnMatch(assistant_turns=0, metadata={"node": node})),
                ScriptedTurn(text="done", usage=U1,
                             match=TurnMatch(assistant_turns=1, metadata={"node": node}))]

    provider = ScriptedProvider(script("a1") + script("a2") + script("a3"))
    catalog = HostCatalog([
        ToolBinding(id="pure", version="1", execute=pure, recovery="pure"),
        AgentBinding(id="ag", version="1", agent=Agent(provider, "go", tools=("pure",),
                                                       max_output_tokens=5))])
    rt = ExecutionGraphRuntime(catalog=catalog)
    await rt.create("k", program(agent_node("a1"), agent_node("a2"), agent_node("a3")),
                    limits=RootLimits(max_concurrent_work=1), budgets=Budgets(model_calls=1))
    for _ in range(2):  # and a later run stops the same way
        with pytest.raises(BudgetExhaustedError):
            await asyncio.wait_for(rt.run("k"), 10)
        view = await rt.inspect("k")
        assert view.status == "pending"
        assert {n: v.state for n, v in view.nodes.items()} == dict.fromkeys(
            ("a1", "a2", "a3"), "running")
    assert provider.call_count == 1 and view.counters["model_calls"] == 1


class Crash(BaseException):
    """The worker died."""


class CrashBeforeReceipt(InMemoryDurableTaskStore):
    """Dies before the commit of the first agent tool result (the action's receipt); in
    the next run, an operator cancels the task while the agent reads its journaled
    response back (before it reaches that action again)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "crash"
        self.rt: ExecutionGraphRuntime | None = None

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.mode == "crash" and any(isinstance(s, AppendJournal) and
                                        s.kind == "agent_tool_result" for s in request.steps):
            self.mode = "crashed"
            raise Crash("died before the receipt was committed")
        return await super().commit(request)

    async def get_blobs(self, digests: Any) -> dict[str, str]:
        if self.mode == "cancel":
            self.mode = "canceled"
            assert self.rt is not None
            await self.rt.cancel("k", "an operator stopped it")
            await asyncio.get_running_loop().create_future()  # until the cancel stops it
        return await super().get_blobs(digests)


class Unsure(Destination):
    """A destination that cannot say whether an action it may have applied happened."""

    async def resolve_result(self, result_ref: str) -> Any:
        return Unknown(reason="the destination's log is unavailable")


@pytest.mark.parametrize("lookup", ["finds it", "cannot tell"])
async def test_a_cancel_before_the_agent_reached_an_interrupted_dispatch_does_not_hide_it(
        lookup: str) -> None:
    # The agent's connector call was dispatched (and applied) when the worker died. The
    # next run was canceled while the agent replayed its conversation toward that call: the
    # agent ended 'canceled', the task 'canceled', and the action stayed 'dispatching' in an
    # ended task, which no run reconciles and no operator can resolve. The stop now looks
    # the action up first (stop 23): a receipt found is recorded and the task ends
    # canceled; an outcome the lookup cannot tell is surfaced: the action and its node
    # become uncertain and the task recovery_required.
    store = CrashBeforeReceipt()
    destination = Destination() if lookup == "finds it" else Unsure()

    def catalog() -> HostCatalog:
        provider = ScriptedProvider([
            ScriptedTurn(tool_calls=(ToolCall(id="e", name="eff", arguments={"t": 1}),),
                         usage=U1, match=TurnMatch(assistant_turns=0)),
            ScriptedTurn(text="done", usage=U1, match=TurnMatch(assistant_turns=1))])
        return HostCatalog([
            ToolBinding(id="eff", version="1", connector=destination, destination="d"),
            AgentBinding(id="ag", version="1", agent=Agent(provider, "go", tools=("eff",),
                                                           max_output_tokens=5))])

    first = ExecutionGraphRuntime(catalog=catalog(), store=store)
    await first.create("k", program(agent_node("a")))
    with pytest.raises(Crash):
        await first.run("k", "w1")
    assert len(destination.applied) == 1
    second = ExecutionGraphRuntime(catalog=catalog(), store=store)
    store.rt, store.mode = second, "cancel"
    expected = TaskCanceledError if lookup == "finds it" else DurableRecoveryRequiredError
    with pytest.raises(expected) as info:
        await asyncio.wait_for(second.run("k", "w1"), 10)
    assert store.mode == "canceled"
    view = await second.inspect("k")
    (action,) = view.actions
    assert view.cancel is not None
    assert len(destination.applied) == 1  # never dispatched again
    if lookup == "finds it":
        assert view.status == "canceled" and view.nodes["a"].state == "canceled"
        assert action.state == "confirmed" and action.outcome_source == "reconcile"
        assert action.outcome_digest is not None
        return
    assert info.value.details["action_ids"] == [action.action_id]
    assert view.status == "recovery_required" and view.nodes["a"].state == "uncertain"
    assert action.state == "uncertain"
    assert action.reason is not None and "log is unavailable" in action.reason


async def test_a_child_failing_while_the_run_stops_for_another_failure_fails_its_container(
        ) -> None:
    # Node b failed the run while g's child x was still running; x then failed too, but g
    # ended 'canceled' (only the containers of the first failure were failed), a container
    # canceled over a failed child as if someone had stopped it.
    store = SeesFailure()
    started = asyncio.Event()

    async def first(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(started.wait(), 5)
        raise ValueError("first")

    async def second(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.wait_for(store.failed.wait(), 5)  # b's failure is committed first
        raise ValueError("second")

    inner = ExecutionGraphProgram(id="inner", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "x", "binding": "second", "version": "1"}]})
    outer = ExecutionGraphProgram(id="outer", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "h", "binding": "inner", "version": "1"}]})
    catalog = HostCatalog([
        ToolBinding(id="first", version="1", execute=first, recovery="pure"),
        ToolBinding(id="second", version="1", execute=second, recovery="pure"),
        GraphBinding(id="inner", version="1", program=inner),
        GraphBinding(id="outer", version="1", program=outer)])
    rt = ExecutionGraphRuntime(catalog=catalog, store=store)
    await rt.create("k", program({"id": "g", "binding": "outer", "version": "1"},
                                 {"id": "b", "binding": "first", "version": "1"}))
    with pytest.raises(NodeFailedError) as info:
        await asyncio.wait_for(rt.run("k"), 10)
    assert info.value.node_id == "b"
    view = await rt.inspect("k")
    assert {n: v.state for n, v in view.nodes.items()} == {
        "g": "failed", "b": "failed", "g/h": "failed", "g/h/x": "failed"}
    for container in ("g", "g/h"):
        error = view.nodes[container].error
        assert error is not None and error.code == "child_failed"
        assert error.details["child"] == "g/h/x"
    assert view.error is not None and view.error.node_id == "b"
