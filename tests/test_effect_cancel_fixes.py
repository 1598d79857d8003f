"""Effects when a task stops or a connector misbehaves: an agent's dispatch in flight is never
preempted by a cancel or a deadline (its receipt is recorded, or the failed dispatch
reconciled), reconciliation lookups hold no root permit, and a ``CancelledError`` that a
connector raises itself is an ordinary dispatch failure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    AdmissionEvent,
    Agent,
    AgentBinding,
    DeadlineExceededError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    RootLimits,
    StoreUnavailableError,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch
from agentium_graph.store import CommitRequest, CommitResult
from tests.conftest import wait_until
from tests.test_effects import Crash, CrashOnReceipt

OBJ = {"type": "object"}
PAY_OUT = {"type": "object", "required": ["charge_id"]}
KINDS = ["plain", "agent"]


class Connector:
    """A destination behind a connector, with switches for how dispatch and lookup behave.

    ``dispatch``: ``ok``; ``raise_before_accept``; ``raise_after_accept`` (response lost);
    ``cancel_after_accept`` (raises ``CancelledError`` itself); ``hang`` (never answers).
    ``lookup``: ``real`` (the outcome if accepted, else ``Absent``); ``unknown``; ``cancel``
    (raises ``CancelledError`` itself). With ``gate`` a dispatch waits, after the destination
    accepted, until :attr:`gate` is set; ``before_lookup`` is awaited by every lookup.
    """

    id = "gate-pay"
    version = "1"

    def __init__(self, *, dispatch: str = "ok", lookup: str = "real", gate: bool = False,
                 before_lookup: Callable[[], Awaitable[None]] | None = None) -> None:
        self.idempotent_destination = False
        self.dispatch_mode = dispatch
        self.lookup_mode = lookup
        self.accepted: dict[str, dict[str, Any]] = {}
        self.dispatched: list[str] = []
        self.lookups = 0
        self.entered = asyncio.Event()  # the destination accepted a dispatch
        self.gate = asyncio.Event() if gate else None
        self.before_lookup = before_lookup
        self.dispatch_canceled = False

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request.action_id)
        if self.dispatch_mode == "raise_before_accept":
            raise ConnectionRefusedError("connection refused")
        self.accepted[request.action_id] = {"charge_id": f"ch_{len(self.accepted) + 1}"}
        self.entered.set()
        try:
            if self.dispatch_mode == "hang":
                await asyncio.Event().wait()
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.dispatch_canceled = True
            raise
        if self.dispatch_mode == "raise_after_accept":
            raise ConnectionResetError("response lost")
        if self.dispatch_mode == "cancel_after_accept":
            raise asyncio.CancelledError  # e.g. an HTTP client's own inner task canceled
        return ActionOutcome(output=self.accepted[request.action_id],
                             result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        self.lookups += 1
        if self.before_lookup is not None:
            await self.before_lookup()
        if self.lookup_mode == "unknown":
            return Unknown(reason="lookup service down")
        if self.lookup_mode == "cancel":
            raise asyncio.CancelledError
        if result_ref in self.accepted:
            return ActionOutcome(output=self.accepted[result_ref], result_ref=result_ref)
        return Absent()


def scripted() -> ScriptedProvider:
    return ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c1", name="pay", arguments={"amount": 5}),),
                     match=TurnMatch(assistant_turns=0)),
        ScriptedTurn(text="paid", match=TurnMatch(assistant_turns=1))])


def catalog(conn: Connector, provider: ScriptedProvider | None = None,
            extra: tuple[ToolBinding, ...] = ()) -> HostCatalog:
    bindings: list[Any] = [ToolBinding(id="pay", version="1", connector=conn,
                                       destination="payments", input_schema=OBJ,
                                       output_schema=PAY_OUT), *extra]
    if provider is not None:
        bindings.append(AgentBinding(id="ag", version="1", input_schema=OBJ, agent=Agent(
            provider=provider, instructions="pay when asked", tools=("pay",))))
    return HostCatalog(bindings)


def program(*nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


def effect_node(kind: str) -> dict[str, Any]:
    """The node that makes the one payment: an effect node, or an agent that calls it."""
    if kind == "agent":
        return {"id": "n", "binding": "ag", "version": "1", "args": {"prompt": "pay 5"}}
    return {"id": "n", "binding": "pay", "version": "1", "args": {"amount": 5}}


def setup(kind: str, conn: Connector, extra: tuple[ToolBinding, ...] = (),
          **kw: Any) -> tuple[ExecutionGraphRuntime, ScriptedProvider]:
    provider = scripted()
    kw.setdefault("lookup_timeout", 2.0)
    rt = ExecutionGraphRuntime(catalog=catalog(conn, provider if kind == "agent" else None,
                                               extra), **kw)
    return rt, provider


async def stop_seen(rt: ExecutionGraphRuntime, key: str) -> None:
    """Wait until the run has begun stopping (and canceled what it cancels)."""
    await wait_until(lambda: key in rt._active and rt._active[key].stop is not None)


# --- Bug 1: a stop never preempts an agent's dispatch in flight -------------------------

@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_lets_a_dispatch_in_flight_finish_and_records_its_receipt(
        kind: str) -> None:
    conn = Connector(gate=True)
    rt, provider = setup(kind, conn)
    await rt.create("k", program(effect_node(kind)))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(conn.entered.wait(), 5)
    await rt.cancel("k", reason="user pressed stop")
    await stop_seen(rt, "k")
    await asyncio.sleep(0.05)  # a preempting runtime would cancel the dispatch now
    assert conn.gate is not None
    conn.gate.set()
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(runner, 5)
    assert not conn.dispatch_canceled and len(conn.dispatched) == 1
    view = await rt.inspect("k")
    [action] = view.actions
    # An effect node keeps the output it got; an agent is canceled once its effect settled.
    assert (view.status, view.nodes["n"].state) == (
        "canceled", "completed" if kind == "plain" else "canceled")
    assert action.state == "confirmed" and action.outcome_source == "dispatch"
    assert view.pending_actions == ()
    if kind == "agent":
        assert provider.call_count == 1  # the model is not asked again after the cancel


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dispatch, lookup, node_state, action_state", [
    ("raise_after_accept", "real", "completed", "confirmed"),
    ("raise_after_accept", "unknown", "uncertain", "uncertain"),
    ("raise_before_accept", "real", "failed", "rejected"),
])
async def test_cancel_during_a_failing_dispatch_reconciles_it_like_an_effect_node(
        kind: str, dispatch: str, lookup: str, node_state: str, action_state: str) -> None:
    conn = Connector(dispatch=dispatch, lookup=lookup)
    gate = asyncio.Event()
    started = asyncio.Event()
    original = conn.dispatch

    async def gated(request: ActionRequest) -> ActionOutcome:
        started.set()
        await gate.wait()
        return await original(request)

    conn.dispatch = gated  # type: ignore[method-assign]
    rt, provider = setup(kind, conn, lookup_attempts=1)
    await rt.create("k", program(effect_node(kind)))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(started.wait(), 5)
    await rt.cancel("k", reason="stop")
    await stop_seen(rt, "k")
    await asyncio.sleep(0.05)
    gate.set()
    expected = DurableRecoveryRequiredError if action_state == "uncertain" else \
        TaskCanceledError
    with pytest.raises(expected):
        await asyncio.wait_for(runner, 5)
    view = await rt.inspect("k")
    [action] = view.actions
    assert action.state == action_state
    if kind == "plain":
        assert view.nodes["n"].state == node_state
    else:
        # The agent reconciles its effect the same way; a receipt only ends the agent.
        assert view.nodes["n"].state == ("canceled" if node_state == "completed"
                                         else node_state)
        assert provider.call_count == 1
    assert view.status == ("recovery_required" if action_state == "uncertain"
                           else "canceled")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deadline_lets_a_dispatch_in_flight_finish_and_records_its_receipt(
        kind: str) -> None:
    conn = Connector(gate=True)
    rt, provider = setup(kind, conn)
    # Long enough that the dispatch starts before it passes, even on a loaded machine.
    await rt.create("k", program(effect_node(kind)), deadline=timedelta(seconds=1))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(conn.entered.wait(), 5)
    await stop_seen(rt, "k")  # the deadline passes while the destination holds the call
    assert rt._active["k"].stop is not None and rt._active["k"].stop.reason == "deadline"
    await asyncio.sleep(0.05)
    assert conn.gate is not None
    conn.gate.set()
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(runner, 5)
    assert not conn.dispatch_canceled
    view = await rt.inspect("k")
    [action] = view.actions
    assert action.state == "confirmed" and view.status == "failed"
    if kind == "agent":
        assert provider.call_count == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_dispatch_that_never_answers_is_still_bounded_by_effect_timeout(
        kind: str) -> None:
    conn = Connector(dispatch="hang")
    rt, _ = setup(kind, conn, effect_timeout=0.3)
    await rt.create("k", program(effect_node(kind)))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(conn.entered.wait(), 5)
    await rt.cancel("k", reason="stop")
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(runner, 5)
    assert conn.dispatch_canceled  # by effect_timeout, then reconciled
    view = await rt.inspect("k")
    [action] = view.actions
    assert action.state == "confirmed" and action.outcome_source == "reconcile"


class FailingStore(InMemoryDurableTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.broken:
            raise StoreUnavailableError("the database went away")
        return await super().commit(request)


async def test_a_run_that_dies_abandons_an_agents_dispatch_instead_of_hanging() -> None:
    """Only a stop of a live run waits for a dispatch: a run that fails (here its store)
    abandons it like an effect node's, and the next run reconciles it."""
    store = FailingStore()
    conn = Connector(gate=True)
    go = asyncio.Event()

    async def other(args: dict[str, Any]) -> dict[str, Any]:
        await go.wait()
        return {}

    side = ToolBinding(id="side", version="1", execute=other, recovery="pure",
                       input_schema=OBJ, output_schema=OBJ)
    rt, provider = setup("agent", conn, (side,), store=store)
    await rt.create("k", program(effect_node("agent"),
                                 {"id": "s", "binding": "side", "version": "1"}))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(conn.entered.wait(), 5)
    store.broken = True
    go.set()  # node s finishes: its commit fails and the run ends
    with pytest.raises(StoreUnavailableError):
        await asyncio.wait_for(runner, 5)
    assert conn.dispatch_canceled
    store.broken = False
    fresh = Connector()
    fresh.accepted = conn.accepted
    rt2 = ExecutionGraphRuntime(catalog=catalog(fresh, provider, (side,)), store=store)
    result = await asyncio.wait_for(rt2.run("k", "w2"), 5)
    assert result.output["n"]["text"] == "paid" and fresh.dispatched == []
    view = await rt2.inspect("k")
    assert [(a.state, a.outcome_source) for a in view.actions] == [("confirmed", "reconcile")]


async def test_an_agent_effect_proved_absent_records_the_rejected_action() -> None:
    conn = Connector(dispatch="raise_before_accept")
    rt, _ = setup("agent", conn)
    await rt.create("k", program(effect_node("agent")))
    with pytest.raises(NodeFailedError, match="connection refused"):
        await rt.run("k")
    view = await rt.inspect("k")
    [action] = view.actions
    assert action.state == "rejected" and view.pending_actions == ()


# --- Bug 2: reconciliation lookups hold no root permit ----------------------------------

async def test_a_lookup_after_a_failed_dispatch_holds_no_root_permit() -> None:
    events: list[AdmissionEvent] = []
    b_ran = asyncio.Event()

    async def wait_for_b() -> None:
        await asyncio.wait_for(b_ran.wait(), 1.5)  # raises (-> unknown) if b cannot start

    async def b(args: dict[str, Any]) -> dict[str, Any]:
        b_ran.set()
        return {}

    conn = Connector(dispatch="raise_after_accept", before_lookup=wait_for_b)
    side = ToolBinding(id="b", version="1", execute=b, recovery="pure", input_schema=OBJ,
                       output_schema=OBJ)
    rt, _ = setup("plain", conn, (side,), limits=RootLimits(max_concurrent_work=1),
                  on_admission=events.append, lookup_attempts=1)
    await rt.create("k", program(effect_node("plain"),
                                 {"id": "b", "binding": "b", "version": "1"}))
    result = await rt.run("k")
    assert result.output["n"] == conn.accepted[conn.dispatched[0]]
    assert all(e.active <= 1 for e in events)
    seen = [(e.kind, e.node_id) for e in events]
    assert seen.index(("released", "n")) < seen.index(("admitted", "b"))
    assert seen.count(("admitted", "n")) == seen.count(("released", "n")) == 1


async def test_a_recovery_lookup_holds_no_permit_and_a_redispatch_queues_again() -> None:
    store = CrashOnReceipt()
    events: list[AdmissionEvent] = []
    b_ran = asyncio.Event()

    async def b(args: dict[str, Any]) -> dict[str, Any]:
        b_ran.set()
        return {}

    async def wait_for_b() -> None:
        await asyncio.wait_for(b_ran.wait(), 1.5)

    side = ToolBinding(id="b", version="1", execute=b, recovery="pure", input_schema=OBJ,
                       output_schema=OBJ)
    plan = program(effect_node("plain"), {"id": "b", "binding": "b", "version": "1"})
    first = Connector()
    rt, _ = setup("plain", first, (side,), store=store,
                  limits=RootLimits(max_concurrent_work=1))
    await rt.create("k", plan)
    with pytest.raises(Crash):
        await rt.run("k")
    assert not b_ran.is_set()
    # The destination lost the call: provably absent, so it is dispatched again.
    again = Connector(before_lookup=wait_for_b)
    rt2, _ = setup("plain", again, (side,), store=store, on_admission=events.append,
                   lookup_attempts=1)
    await rt2.run("k", "w2")
    assert again.dispatched == first.dispatched  # the same action id
    assert all(e.active <= 1 for e in events)
    seen = [(e.kind, e.node_id) for e in events if e.node_id == "n" or e.kind == "admitted"]
    # n's permit: taken, given up for the lookup (b runs meanwhile), taken again to dispatch.
    assert seen == [("admitted", "n"), ("released", "n"), ("admitted", "b"),
                    ("admitted", "n"), ("released", "n")]
    view = await rt2.inspect("k")
    assert view.actions[0].state == "confirmed" and view.actions[0].dispatches == 2



async def test_a_cancel_during_a_recovery_lookup_that_proves_absence_rejects_the_action(
        ) -> None:
    """The action was to be dispatched again, but the task is stopping: nothing is
    dispatched, and the ledger says it never took effect instead of leaving it in flight."""
    store = CrashOnReceipt()
    first = Connector()
    rt, _ = setup("plain", first, store=store)
    await rt.create("k", program(effect_node("plain")))
    with pytest.raises(Crash):
        await rt.run("k")
    looking = asyncio.Event()
    answer = asyncio.Event()

    async def held() -> None:
        looking.set()
        await answer.wait()

    again = Connector(before_lookup=held)  # knows nothing of the call: Absent
    rt2, _ = setup("plain", again, store=store)
    runner = asyncio.create_task(rt2.run("k", "w2"))
    await asyncio.wait_for(looking.wait(), 5)
    await rt2.cancel("k", reason="stop")
    await stop_seen(rt2, "k")
    answer.set()
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(runner, 5)
    assert again.dispatched == []
    view = await rt2.inspect("k")
    [action] = view.actions
    assert action.state == "rejected" and action.dispatches == 1
    assert (view.status, view.nodes["n"].state) == ("canceled", "canceled")


async def test_an_agents_lookup_holds_no_root_permit() -> None:
    active: list[int] = []
    rt: ExecutionGraphRuntime | None = None

    async def look() -> None:
        assert rt is not None
        active.append((await rt.admission_snapshot("k")).active)

    conn = Connector(dispatch="raise_after_accept", before_lookup=look)
    rt, _ = setup("agent", conn, limits=RootLimits(max_concurrent_work=1))
    await rt.create("k", program(effect_node("agent")))
    result = await rt.run("k")
    assert result.output["n"]["text"] == "paid"
    assert active == [0]


# --- Bug 3: a CancelledError the connector raises itself --------------------------------

@pytest.mark.parametrize("kind", KINDS)
async def test_a_dispatch_that_raises_cancelled_error_is_reconciled(kind: str) -> None:
    conn = Connector(dispatch="cancel_after_accept")
    rt, _ = setup(kind, conn)
    await rt.create("k", program(effect_node(kind)))
    result = await asyncio.wait_for(rt.run("k"), 5)
    assert result.status == "completed"
    view = await rt.inspect("k")
    [action] = view.actions
    assert (action.state, action.outcome_source) == ("confirmed", "reconcile")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dispatch", ["cancel_after_accept", "raise_after_accept"])
async def test_cancelled_error_with_an_unknown_lookup_requires_recovery(
        kind: str, dispatch: str) -> None:
    """An unknown lookup -- also one that raises CancelledError itself -- makes the action
    uncertain, and an operator can resolve it."""
    lookup = "unknown" if dispatch == "cancel_after_accept" else "cancel"
    conn = Connector(dispatch=dispatch, lookup=lookup)
    rt, _ = setup(kind, conn, lookup_attempts=1)
    await rt.create("k", program(effect_node(kind)))
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await asyncio.wait_for(rt.run("k"), 5)
    [action_id] = info.value.action_ids
    view = await rt.inspect("k")
    assert view.status == "recovery_required"
    assert [a.state for a in view.actions] == ["uncertain"]
    await rt.resolve_action("k", action_id, ActionOutcome(
        output=conn.accepted[action_id], result_ref=action_id), actor="ops")
    result = await asyncio.wait_for(rt.run("k"), 5)
    assert result.status == "completed" and len(conn.dispatched) == 1
