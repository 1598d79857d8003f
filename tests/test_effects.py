"""Effects through connectors: ledger order, reconciliation rules, operator resolution."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    BudgetExhaustedError,
    Budgets,
    DurableRecoveryRequiredError,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    ResolutionConflictError,
    ToolBinding,
    Unknown,
)
from agentium_graph.store import CommitRequest, CommitResult, RecordAction
from tests.conftest import CountingStore, program

PAY_OUT = {"type": "object", "required": ["charge_id", "amount"],
           "properties": {"charge_id": {"type": "string"}, "amount": {"type": "integer"}}}


class Destination:
    """A remote system that accepts charges; counts what it accepted."""

    def __init__(self) -> None:
        self.accepted: dict[str, dict[str, Any]] = {}
        self.accept_count = 0

    def accept(self, key: str, amount: int) -> dict[str, Any]:
        if key not in self.accepted:
            self.accept_count += 1
            self.accepted[key] = {"charge_id": f"ch_{self.accept_count}", "amount": amount}
        return self.accepted[key]


class FakeConnector:
    def __init__(self, dest: Destination, *, idempotent: bool = False,
                 lookups: list[str] | None = None, dispatch_mode: str = "ok",
                 id: str = "fake-pay", destination_name: str = "payments") -> None:
        self.id = id
        self.version = "1"
        self.idempotent_destination = idempotent
        self.dest = dest
        self.lookups = list(lookups or [])
        self.dispatch_mode = dispatch_mode
        self.dispatched: list[ActionRequest] = []
        self.resolved: list[str] = []

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request)
        if self.dispatch_mode == "raise_before_accept":
            raise ConnectionError("connection refused")
        if self.dispatch_mode == "hang":
            await asyncio.sleep(3600)
        out = self.dest.accept(request.action_id, request.args["amount"])
        if self.dispatch_mode == "raise_after_accept":
            raise ConnectionResetError("response lost")
        if self.dispatch_mode == "non_json":
            return ActionOutcome(output={"when": object()}, result_ref=request.result_ref)
        return ActionOutcome(output=out, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        self.resolved.append(result_ref)
        mode = self.lookups.pop(0) if self.lookups else "real"
        if mode == "unknown":
            return Unknown(reason="lookup service down")
        if mode == "raise":
            raise TimeoutError("lookup timed out")
        if mode == "hang":
            await asyncio.sleep(3600)
        if result_ref in self.dest.accepted:
            return ActionOutcome(output=self.dest.accepted[result_ref], result_ref=result_ref)
        return Absent()


class CrashOnReceipt(CountingStore):
    """Simulates a worker dying after the destination accepted, before the receipt."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.armed and any(isinstance(s, RecordAction) and s.action.state == "confirmed"
                              for s in request.steps):
            self.armed = False
            raise Crash
        return await super().commit(request)


class Crash(BaseException):
    pass


def pay_catalog(connector: FakeConnector, extra: list[ToolBinding] | None = None
                ) -> HostCatalog:
    return HostCatalog([
        ToolBinding(id="pay", version="1", connector=connector, destination="payments",
                    input_schema={"type": "object", "required": ["amount"]},
                    output_schema=PAY_OUT),
        *(extra or []),
    ])


PLAN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "charge", "binding": "pay", "version": "1", "args": {"amount": 500}}]}


def runtime(connector: FakeConnector, store: CountingStore, **kw: Any) -> ExecutionGraphRuntime:
    kw.setdefault("lookup_timeout", 0.2)
    return ExecutionGraphRuntime(catalog=pay_catalog(connector), store=store, **kw)


async def test_effect_ledger_records_intent_before_dispatch_and_receipt_after() -> None:
    dest = Destination()
    conn = FakeConnector(dest)
    store = CountingStore()
    rt = runtime(conn, store)
    await rt.create("p", program(PLAN))
    result = await rt.run("p")
    assert result.output["charge"] == {"charge_id": "ch_1", "amount": 500}
    [request] = conn.dispatched
    assert request.result_ref == request.action_id and request.args == {"amount": 500}
    assert request.destination == "payments" and request.binding_id == "pay"
    # The commit before dispatch holds intent + dispatching; the one after, the receipt.
    states = [[s.action.state for s in c.steps if isinstance(s, RecordAction)]
              for c in store.commits]
    assert states[0] == ["intent", "dispatching"] and states[1] == ["confirmed"]
    view = await rt.inspect("p")
    [action] = view.actions
    assert action.state == "confirmed" and action.outcome_source == "dispatch"
    assert action.origin["binding"] == "pay" and action.origin["connector"] == "fake-pay"
    assert view.counters["tool_calls"] == 1 and view.counters["work_attempts"] == 1
    again = await rt.run("p", "w2")
    assert again.output == result.output and len(conn.dispatched) == 1


@pytest.mark.parametrize("lookups, idempotent, dispatches, source", [
    (["real"], False, 1, "reconcile"),            # confirmed by lookup: no re-dispatch
    (["raise", "real"], False, 1, "reconcile"),   # transient lookup failure, then found
    (["unknown", "real"], False, 1, "reconcile"),
    (["unknown"] * 3, True, 2, "dispatch"),       # unknown, but idempotent destination
])
async def test_crash_between_dispatch_and_receipt_reconciles(
        lookups: list[str], idempotent: bool, dispatches: int, source: str) -> None:
    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest, idempotent=idempotent, lookups=lookups)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    assert dest.accept_count == 1
    before = await store.get_task("p")
    assert before is not None
    [pending] = before.actions.values()
    assert pending.state == "dispatching"
    fresh = FakeConnector(dest, idempotent=idempotent, lookups=lookups)
    result = await runtime(fresh, store).run("p")
    assert result.output["charge"] == {"charge_id": "ch_1", "amount": 500}
    assert dest.accept_count == 1  # the destination accepted exactly once
    assert len(conn.dispatched) + len(fresh.dispatched) == dispatches
    assert all(r.action_id == pending.action_id for r in fresh.dispatched)
    view = await runtime(fresh, store).inspect("p")
    [action] = view.actions
    assert action.state == "confirmed" and action.outcome_source == source
    assert view.counters["tool_calls"] == dispatches  # a lookup charges nothing


async def test_absent_after_crash_dispatches_again_under_the_same_action_id() -> None:
    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    dest.accepted.clear()  # the destination lost (or never applied) it: provably absent
    fresh = FakeConnector(dest)
    await runtime(fresh, store).run("p")
    assert [r.action_id for r in fresh.dispatched] == [conn.dispatched[0].action_id]
    view = await runtime(fresh, store).inspect("p")
    assert view.actions[0].dispatches == 2 and view.counters["tool_calls"] == 2


async def test_unknown_outcome_requires_recovery_and_operator_resolution() -> None:
    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    blind = FakeConnector(dest, lookups=["unknown", "raise", "hang"])
    rt = runtime(blind, store)
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await rt.run("p")
    action_id = conn.dispatched[0].action_id
    assert info.value.action_ids == (action_id,)
    assert blind.dispatched == [] and len(blind.resolved) == 3  # bounded lookups
    view = await rt.inspect("p")
    assert view.status == "recovery_required"
    assert view.nodes["charge"].state == "uncertain"
    assert [a.action_id for a in view.uncertain_actions] == [action_id]
    # Running again does not even look: an operator must decide.
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    assert len(blind.resolved) == 3
    outcome = ActionOutcome(output=dest.accepted[action_id], result_ref=action_id)
    view = await rt.resolve_action("p", action_id, outcome, actor="ops@example")
    assert view.status == "pending" and view.nodes["charge"].state == "completed"
    assert view.actions[0].resolution is not None
    assert view.actions[0].resolution["actor"] == "ops@example"
    result = await rt.run("p")
    assert result.output["charge"] == dest.accepted[action_id]
    assert blind.dispatched == [] and dest.accept_count == 1
    # The same resolution again is idempotent; a different one is rejected.
    await rt.resolve_action("p", action_id, outcome, actor="ops@example")
    with pytest.raises(ResolutionConflictError):
        await rt.resolve_action("p", action_id, Absent(), actor="someone-else")
    timeline = await rt.timeline("p", limit=1000)
    assert any(e.kind == "action_confirmed" and e.data.get("source") == "operator"
               for e in timeline.events)


async def test_operator_attests_absence_then_run_dispatches_again() -> None:
    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    dest.accepted.clear()
    rt = runtime(FakeConnector(dest, lookups=["unknown"] * 3), store)
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    action_id = conn.dispatched[0].action_id
    view = await rt.resolve_action("p", action_id, Absent(), actor="ops")
    assert view.nodes["charge"].state == "pending" and view.actions[0].state == "intent"
    later = FakeConnector(dest)
    result = await runtime(later, store).run("p")
    assert [r.action_id for r in later.dispatched] == [action_id]
    assert result.output["charge"]["amount"] == 500


async def test_resolution_output_must_match_the_pinned_schema() -> None:
    from agentium_graph import ConfigurationError

    dest = Destination()
    store = CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    rt = runtime(FakeConnector(dest, lookups=["unknown"] * 3), store)
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    action_id = conn.dispatched[0].action_id
    with pytest.raises(ConfigurationError, match="output schema"):
        await rt.resolve_action("p", action_id, ActionOutcome(output={"amount": "x"},
                                                               result_ref=action_id),
                                actor="ops")
    assert (await rt.inspect("p")).status == "recovery_required"


async def test_dispatch_error_with_proven_absence_fails_the_node() -> None:
    dest = Destination()
    conn = FakeConnector(dest, dispatch_mode="raise_before_accept")
    rt = runtime(conn, CountingStore())
    await rt.create("p", program(PLAN))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("p")
    assert info.value.cause is not None and info.value.cause.code == "effect_dispatch_failed"
    view = await rt.inspect("p")
    assert view.actions[0].state == "rejected" and len(conn.dispatched) == 1


async def test_dispatch_error_after_accept_is_reconciled_not_redispatched() -> None:
    dest = Destination()
    conn = FakeConnector(dest, dispatch_mode="raise_after_accept")
    rt = runtime(conn, CountingStore())
    await rt.create("p", program(PLAN))
    result = await rt.run("p")
    assert result.output["charge"]["charge_id"] == "ch_1"
    assert len(conn.dispatched) == 1 and dest.accept_count == 1
    assert (await rt.inspect("p")).actions[0].outcome_source == "reconcile"


async def test_hanging_dispatch_times_out_and_unknown_lookup_makes_it_uncertain() -> None:
    dest = Destination()
    conn = FakeConnector(dest, dispatch_mode="hang", lookups=["unknown"] * 3)
    rt = runtime(conn, CountingStore(), effect_timeout=0.1)
    await rt.create("p", program(PLAN))
    with pytest.raises(DurableRecoveryRequiredError):
        await asyncio.wait_for(rt.run("p"), 5)
    assert len(conn.dispatched) == 1
    assert (await rt.inspect("p")).nodes["charge"].state == "uncertain"


async def test_non_json_connector_output_is_uncertain_never_redispatched() -> None:
    dest = Destination()
    conn = FakeConnector(dest, dispatch_mode="non_json")
    rt = runtime(conn, CountingStore())
    await rt.create("p", program(PLAN))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    view = await rt.inspect("p")
    assert view.actions[0].state == "uncertain" and "invalid outcome" in (
        view.actions[0].reason or "")
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    assert len(conn.dispatched) == 1


async def test_budget_rejection_is_journaled_as_known_not_dispatched() -> None:
    dest = Destination()
    conn = FakeConnector(dest)
    rt = runtime(conn, CountingStore())
    await rt.create("p", program(PLAN), budgets=Budgets(tool_calls=0))
    with pytest.raises(BudgetExhaustedError):
        await rt.run("p")
    view = await rt.inspect("p")
    assert conn.dispatched == [] and view.actions[0].state == "rejected"
    assert view.counters["tool_calls"] == 0


async def test_origin_evidence_distinguishes_connectors_sharing_destination() -> None:
    dest = Destination()
    a = FakeConnector(dest, id="same")
    b = FakeConnector(dest, id="same")
    catalog = HostCatalog([
        ToolBinding(id="pay_eu", version="1", connector=a, destination="payments",
                    output_schema=PAY_OUT),
        ToolBinding(id="pay_us", version="1", connector=b, destination="payments",
                    output_schema=PAY_OUT)])
    rt = ExecutionGraphRuntime(catalog=catalog)
    await rt.create("p", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "eu", "binding": "pay_eu", "version": "1", "args": {"amount": 1}},
        {"id": "us", "binding": "pay_us", "version": "1", "args": {"amount": 1}}]}))
    await rt.run("p")
    view = await rt.inspect("p")
    by_node = {x.node_id: x for x in view.actions}
    assert by_node["eu"].origin["binding"] == "pay_eu"
    assert by_node["us"].origin["binding"] == "pay_us"
    assert by_node["eu"].action_id != by_node["us"].action_id
    assert len(a.dispatched) == 1 and len(b.dispatched) == 1


class CrashBeforeRecoveryStatus(CountingStore):
    """Dies after the uncertain settlement committed, before the task's status did."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        from agentium_graph.store import SetStatus

        if self.armed and any(isinstance(s, SetStatus) and s.status == "recovery_required"
                              for s in request.steps):
            self.armed = False
            raise Crash
        return await super().commit(request)


async def test_uncertain_node_left_by_a_crash_still_requires_recovery() -> None:
    from agentium_graph.store import SettleNode

    settled = asyncio.Event()

    class Store(CrashBeforeRecoveryStatus):
        async def commit(self, request: CommitRequest) -> CommitResult:
            result = await super().commit(request)
            if any(isinstance(s, SettleNode) and s.state == "uncertain"
                   for s in request.steps):
                settled.set()
            return result

    dest = Destination()
    store = Store()
    # Split the uncertain settle from the status: a sibling keeps the run busy until the
    # commit that settled the charge uncertain (without the task's status) is durable.
    conn = FakeConnector(dest, dispatch_mode="non_json")

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        if not settled.is_set():  # the run after the crash does not wait
            await asyncio.wait_for(settled.wait(), 5)
        return {}

    extra = [ToolBinding(id="slow", version="1", execute=slow, recovery="pure")]
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        *PLAN["nodes"], {"id": "sibling", "binding": "slow", "version": "1"}]}
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn, extra), store=store)
    await rt.create("p", program(plan))
    with pytest.raises(Crash):
        await rt.run("p")
    snap = await store.get_task("p")
    assert snap is not None and snap.nodes["charge"].state == "uncertain"
    assert snap.header.status == "running"
    fresh = ExecutionGraphRuntime(catalog=pay_catalog(FakeConnector(dest), extra), store=store)
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await asyncio.wait_for(fresh.run("p"), 5)
    assert info.value.action_ids == (next(iter(snap.actions)),)
    assert (await fresh.inspect("p")).status == "recovery_required"
