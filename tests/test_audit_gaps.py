"""Gaps found by a test-quality audit: behaviour no test pinned down, so that a mutation of
the library went unnoticed.

* A recovered effect that is to be dispatched again (its lookup proved ``Absent()``, or its
  destination is idempotent and the lookup could not tell) and waits for its root permit
  when the run stops: a ``budget`` or ``recovery`` stop leaves it resumable (the node stays
  running, the action ``dispatching``; the next run reconciles it again), only a ``canceled``
  or ``deadline`` stop rejects it (``_effects.not_dispatched_again``).
* A stop rejects every queued admission request, including an effect's permit re-acquire
  that is in no ready list (``_stops.begin_stop`` -> ``AdmissionController.reject_all``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    DeadlineExceededError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    RootLimits,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)
from tests.conftest import ManualClock
from tests.test_effects import Crash, CrashOnReceipt

OBJ = {"type": "object"}
PAY_OUT = {"type": "object", "required": ["charge_id"]}
WAIT = 5.0  # generous bound on every wait for an event; the tests take well under a second


class Pay:
    """A payment destination behind a connector. ``lookup``: ``real`` (the outcome if the
    destination accepted the action id, else ``Absent()``) or ``unknown``."""

    id = "audit-pay"
    version = "1"

    def __init__(self, *, idempotent: bool = False, lookup: str = "real") -> None:
        self.idempotent_destination = idempotent
        self.lookup = lookup
        self.accepted: dict[str, dict[str, Any]] = {}
        self.dispatched: list[str] = []
        self.lookups = 0

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request.action_id)
        out = self.accepted.setdefault(request.action_id,
                                       {"charge_id": f"ch_{len(self.accepted) + 1}"})
        return ActionOutcome(output=out, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        self.lookups += 1
        if self.lookup == "unknown":
            return Unknown(reason="lookup service down")
        if result_ref in self.accepted:
            return ActionOutcome(output=self.accepted[result_ref], result_ref=result_ref)
        return Absent()


class Garbled:
    """A connector whose dispatch, once ``go`` is set, answers with something that is not an
    ``ActionOutcome``: its effect becomes uncertain (a recovery stop) without a lookup."""

    id = "audit-garbled"
    version = "1"
    idempotent_destination = False

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.dispatched: list[str] = []

    async def dispatch(self, request: ActionRequest) -> Any:
        self.dispatched.append(request.action_id)
        await asyncio.wait_for(self.go.wait(), WAIT)
        return {"not": "an ActionOutcome"}

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        return Unknown(reason="never asked")



class Requeued:
    """``on_admission`` observer: keeps every event and sets :attr:`event` when node ``n``
    queues for a permit (in these runs ``n`` only queues when it re-acquires one after its
    lookup; its first request is granted at once)."""

    def __init__(self) -> None:
        self.events: list[AdmissionEvent] = []
        self.event = asyncio.Event()

    def __call__(self, event: AdmissionEvent) -> None:
        self.events.append(event)
        if event.kind == "queued" and event.node_id == "n":
            self.event.set()

    def of(self, node_id: str) -> list[tuple[str, str | None]]:
        return [(e.kind, e.reason) for e in self.events if e.node_id == node_id]


def plain(id: str, fn: Any) -> ToolBinding:
    return ToolBinding(id=id, version="1", execute=fn, recovery="pure", input_schema=OBJ,
                       output_schema=OBJ)


async def _nothing(args: dict[str, Any]) -> dict[str, Any]:
    return {}


def pay_binding(conn: Pay) -> ToolBinding:
    return ToolBinding(id="pay", version="1", connector=conn, destination="payments",
                       input_schema=OBJ, output_schema=PAY_OUT)


def program(*nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="audit", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


PAY_NODE = {"id": "n", "binding": "pay", "version": "1", "args": {"amount": 5}}


def node(id: str, binding: str) -> dict[str, Any]:
    return {"id": id, "binding": binding, "version": "1"}


async def crash_after_dispatch(store: CrashOnReceipt, bindings: list[ToolBinding],
                               plan: ExecutionGraphProgram, *, idempotent: bool = False,
                               **create: Any) -> str:
    """Create the task (one root permit) and run it until ``n``'s payment was dispatched and
    the worker died before its receipt; returns the action id left ``dispatching``."""
    first = Pay(idempotent=idempotent)
    rt = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(first), *bindings]),
                               store=store)
    await rt.create("k", plan, limits=RootLimits(max_concurrent_work=1), **create)
    with pytest.raises(Crash):
        await rt.run("k")
    snapshot = await store.get_task("k")
    assert snapshot is not None
    [action] = snapshot.actions.values()
    assert action.state == "dispatching" and first.dispatched == [action.action_id]
    assert {n: r.state for n, r in snapshot.nodes.items() if n != "n"} == \
        dict.fromkeys([n for n in snapshot.nodes if n != "n"], "pending")
    return action.action_id


def recovering(idempotent: bool) -> Pay:
    """The connector of the run after the crash: the destination has no record of the call
    (``Absent()``), or it is idempotent and its lookup cannot tell."""
    return Pay(idempotent=idempotent, lookup="unknown" if idempotent else "real")


VERDICTS = pytest.mark.parametrize("idempotent", [False, True],
                                   ids=["absent", "idempotent-unknown"])


# --- 1. a re-dispatch waiting for its permit when the run stops for budget / recovery ---

@VERDICTS
async def test_a_budget_stop_while_a_redispatch_waits_for_its_permit_leaves_it_resumable(
        idempotent: bool) -> None:
    """n's lookup releases its permit (b takes it), n queues again behind c and d; b ends,
    c is granted but exceeds tool_calls: the budget stop rejects n's queued re-acquire.
    n must stay running with its action dispatching, never rejected or uncertain."""
    store = CrashOnReceipt()
    seen = Requeued()

    async def hold(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(seen.event.wait(), WAIT)  # until n queued again
        return {}

    bindings = [plain("hold", hold), plain("noop", _nothing)]
    plan = program(PAY_NODE, node("b", "hold"), node("c", "noop"), node("d", "noop"))
    # n's first dispatch charged 1, b charges the 2nd: c cannot start.
    action_id = await crash_after_dispatch(store, bindings, plan, idempotent=idempotent,
                                           budgets=Budgets(tool_calls=2))
    conn = recovering(idempotent)
    rt = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(conn), *bindings]),
                               store=store, on_admission=seen, lookup_attempts=1)
    with pytest.raises(BudgetExhaustedError) as info:
        await asyncio.wait_for(rt.run("k", "w2"), WAIT)
    assert info.value.node_id == "c"
    assert conn.dispatched == [] and conn.lookups == 1
    assert seen.of("n") == [("admitted", None), ("released", None), ("queued", None),
                            ("rejected", "budget")]
    view = await rt.inspect("k")
    [action] = view.actions
    assert view.status == "pending"  # resumable, not canceled, failed or recovery_required
    assert {n: s.state for n, s in view.nodes.items()} == {
        "n": "running", "b": "completed", "c": "pending", "d": "pending"}
    assert (action.action_id, action.state, action.dispatches) == \
        (action_id, "dispatching", 1)
    assert view.uncertain_actions == ()
    assert view.counters["tool_calls"] == 2

    # The next run reconciles the action again (it still cannot dispatch: no budget left,
    # and create cannot raise it) and again leaves everything resumable.
    again = recovering(idempotent)
    rt3 = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(again), *bindings]),
                                store=store, lookup_attempts=1)
    with pytest.raises(BudgetExhaustedError):
        await asyncio.wait_for(rt3.run("k", "w3"), WAIT)
    assert again.lookups == 1 and again.dispatched == []
    view = await rt3.inspect("k")
    assert view.status == "pending" and view.nodes["n"].state == "running"
    [action] = view.actions
    assert (action.state, action.dispatches) == ("dispatching", 1)


@VERDICTS
async def test_a_recovery_stop_while_a_redispatch_waits_for_its_permit_leaves_it_resumable(
        idempotent: bool) -> None:
    """n's lookup releases its permit (effect b takes it), n queues again behind c; b's
    outcome is uncertain: the recovery stop rejects n's queued re-acquire. Only b's action
    is uncertain; n stays running with its action dispatching, and once an operator
    resolved b the next run reconciles n again and dispatches it under the same id."""
    store = CrashOnReceipt()
    seen = Requeued()
    garbled = Garbled()

    def watch(event: AdmissionEvent) -> None:
        seen(event)
        if seen.event.is_set():
            garbled.go.set()  # b answers (garbled) only once n waits for a permit again

    other = ToolBinding(id="other", version="1", connector=garbled, destination="ledger",
                        input_schema=OBJ, output_schema=OBJ)
    bindings = [other, plain("noop", _nothing)]
    plan = program(PAY_NODE, node("b", "other"), node("c", "noop"))
    action_id = await crash_after_dispatch(store, bindings, plan, idempotent=idempotent)
    conn = recovering(idempotent)
    rt = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(conn), *bindings]),
                               store=store, on_admission=watch, lookup_attempts=1)
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await asyncio.wait_for(rt.run("k", "w2"), WAIT)
    [b_action] = garbled.dispatched
    assert info.value.action_ids == (b_action,)  # n's action is not named: not uncertain
    assert conn.dispatched == [] and conn.lookups == 1
    assert seen.of("n") == [("admitted", None), ("released", None), ("queued", None),
                            ("rejected", "recovery")]
    view = await rt.inspect("k")
    assert view.status == "recovery_required"
    assert {n: s.state for n, s in view.nodes.items()} == {
        "n": "running", "b": "uncertain", "c": "pending"}
    states = {a.action_id: (a.state, a.dispatches) for a in view.actions}
    assert states == {action_id: ("dispatching", 1), b_action: ("uncertain", 1)}

    # The operator settles b; the next run reconciles n again and, as documented for
    # Absent() / an idempotent destination, dispatches it again under the same action id.
    await rt.resolve_action("k", b_action, ActionOutcome(output={}, result_ref=b_action),
                            actor="ops")
    later = recovering(idempotent)
    rt3 = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(later), *bindings]),
                                store=store, lookup_attempts=1)
    result = await asyncio.wait_for(rt3.run("k", "w3"), WAIT)
    assert result.status == "completed"
    assert later.lookups == 1 and later.dispatched == [action_id]
    view = await rt3.inspect("k")
    n_action = next(a for a in view.actions if a.action_id == action_id)
    assert (n_action.state, n_action.dispatches) == ("confirmed", 2)


# --- 2. a stop rejects queued admission requests ------------------------------------------

@pytest.mark.parametrize("stop", ["cancel", "deadline"])
async def test_a_stop_rejects_a_node_queued_for_its_permit(stop: str) -> None:
    """One root permit: a runs, z waits for the permit. A cancel (or the deadline) rejects
    z's request with the stop's reason; z never starts and the run ends at once."""
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    events: list[AdmissionEvent] = []
    z_queued = asyncio.Event()
    a_running = asyncio.Event()
    started: list[str] = []

    def watch(event: AdmissionEvent) -> None:
        events.append(event)
        if event.kind == "queued" and event.node_id == "z":
            z_queued.set()

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        from agentium_graph import tool_context

        started.append(tool_context().node_id)
        a_running.set()
        if stop == "deadline":
            await asyncio.wait_for(z_queued.wait(), WAIT)
            clock.now += timedelta(seconds=10)  # past the deadline; ending wakes the loop
            return {}
        await asyncio.Event().wait()  # until the cancel cancels it
        return {}

    rt = ExecutionGraphRuntime(catalog=HostCatalog([plain("slow", slow)]), clock=clock,
                               on_admission=watch)
    await rt.create("k", program(node("a", "slow"), node("z", "slow")),
                    limits=RootLimits(max_concurrent_work=1),
                    deadline=clock.now + timedelta(seconds=5))
    runner = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(asyncio.gather(z_queued.wait(), a_running.wait()), WAIT)
    if stop == "cancel":
        await rt.cancel("k", reason="operator")
    error = TaskCanceledError if stop == "cancel" else DeadlineExceededError
    with pytest.raises(error):
        await asyncio.wait_for(runner, WAIT)
    reason = "canceled" if stop == "cancel" else "deadline"
    assert [(e.kind, e.reason) for e in events if e.node_id == "z"] == \
        [("queued", None), ("rejected", reason)]
    assert started == ["a"]
    view = await rt.inspect("k")
    assert view.nodes["z"].state == "canceled" and not view.nodes["z"].attempts
    assert view.status == ("canceled" if stop == "cancel" else "failed")


@pytest.mark.parametrize("stop", ["cancel", "deadline"])
async def test_a_stop_rejects_an_effects_permit_reacquire_after_a_lookup_proved_absent(
        stop: str) -> None:
    """A recovered effect whose lookup proved Absent() queues for its permit again (b holds
    it). A cancel or the deadline rejects that queued re-acquire at once (it is in no ready
    list, only the admission queue knows it): the action is rejected, never dispatched
    again, and the permit is never granted to it."""
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store = CrashOnReceipt()
    seen = Requeued()

    async def hold(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(seen.event.wait(), WAIT)  # until n queued again
        if stop == "deadline":
            clock.now += timedelta(seconds=10)  # past the deadline; ending wakes the loop
            return {}
        await asyncio.Event().wait()  # until the cancel cancels it
        return {}

    bindings = [plain("hold", hold)]
    plan = program(PAY_NODE, node("b", "hold"))
    first = Pay()
    rt = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(first), *bindings]),
                               store=store, clock=clock)
    await rt.create("k", plan, limits=RootLimits(max_concurrent_work=1),
                    deadline=clock.now + timedelta(seconds=5))
    with pytest.raises(Crash):
        await rt.run("k")
    [action_id] = first.dispatched
    conn = Pay()  # the destination knows nothing of the call: Absent()
    rt2 = ExecutionGraphRuntime(catalog=HostCatalog([pay_binding(conn), *bindings]),
                                store=store, clock=clock, on_admission=seen,
                                lookup_attempts=1)
    runner = asyncio.create_task(rt2.run("k", "w2"))
    await asyncio.wait_for(seen.event.wait(), WAIT)
    if stop == "cancel":
        await rt2.cancel("k", reason="operator")
    error = TaskCanceledError if stop == "cancel" else DeadlineExceededError
    with pytest.raises(error):
        await asyncio.wait_for(runner, WAIT)
    reason = "canceled" if stop == "cancel" else "deadline"
    assert seen.of("n") == [("admitted", None), ("released", None), ("queued", None),
                            ("rejected", reason)]
    assert conn.dispatched == [] and conn.lookups == 1
    view = await rt2.inspect("k")
    [action] = view.actions
    assert (action.action_id, action.state, action.dispatches) == (action_id, "rejected", 1)
    assert view.nodes["n"].state == "canceled"
