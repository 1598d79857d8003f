"""Found by review 24 (of stop 23's stop lookups and admission ids). Each test failed
before its fix."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    Unknown,
)
from agentium_graph._canonical import admission_id
from agentium_graph.store import Charge
from tests.conftest import Calls, CountingStore, chain_plan, make_catalog, program
from tests.test_effects import (
    PLAN,
    Crash,
    CrashOnReceipt,
    Destination,
    FakeConnector,
    pay_catalog,
    runtime,
)
from tests.test_review21_cancel import Clock

THREE = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": n, "binding": "pay", "version": "1", "args": {"amount": a}}
    for n, a in (("a", 1), ("b", 2), ("c", 3))]}


class Answers(FakeConnector):
    """Looks each action up by its amount: a schema-invalid receipt, absent or unknown."""

    def __init__(self, dest: Destination, by_ref: dict[str, int],
                 verdicts: dict[int, str]) -> None:
        super().__init__(dest)
        self.by_ref, self.verdicts = by_ref, verdicts

    async def resolve_result(self, result_ref: str) -> Any:
        self.resolved.append(result_ref)
        verdict = self.verdicts[self.by_ref[result_ref]]
        if verdict == "invalid":
            return ActionOutcome(output={"nope": 1}, result_ref=result_ref)
        return Absent() if verdict == "absent" else Unknown(reason="the log is down")


async def test_an_invalid_receipt_is_surfaced_with_the_others_under_the_stop() -> None:
    # a's lookup found a receipt the schema refuses, b's proved it absent, c's cannot tell.
    # The invalid receipt began a stop of its own while the lookups were being settled: c
    # stayed 'dispatching' and unnamed, and b stayed 'running' over a rejected action.
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    first = FakeConnector(dest)
    await runtime(first, store, clock=clock).create("p", program(THREE))
    with pytest.raises(Crash):
        await runtime(first, store, clock=clock).run("p", worker_id="w1")
    clock.now += timedelta(minutes=5)
    conn = Answers(dest, {r.action_id: r.args["amount"] for r in first.dispatched},
                   {1: "invalid", 2: "absent", 3: "unknown"})
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=store, clock=clock,
                               lookup_timeout=0.2, lookup_attempts=1)
    view = await rt.cancel("p", "stop")
    states = {conn.by_ref[a.action_id]: a.state for a in view.actions}
    assert view.status == "recovery_required"
    assert states == {1: "uncertain", 2: "rejected", 3: "uncertain"}
    assert {n: r.state for n, r in view.nodes.items()} == {
        "a": "uncertain", "b": "canceled", "c": "uncertain"}
    assert view.error is not None
    named = {conn.by_ref[i] for i in view.error.details["action_ids"]}
    assert named == {1, 3}
    reasons = {conn.by_ref[a.action_id]: a.reason or "" for a in view.actions}
    assert "invalid" in reasons[1] and "the log is down" in reasons[3]
    assert view.nodes["c"].error is not None and "the log is down" in \
        view.nodes["c"].error.message
    assert conn.dispatched == []


def test_a_copy_with_another_plan_and_model_construct_are_not_refused() -> None:
    base = ExecutionGraphProgram(id="p", version="1", plan=chain_plan(1))
    other = chain_plan(2)
    copied = base.model_copy(update={"plan": other})
    assert copied.checked_plan() == other
    built = ExecutionGraphProgram.model_construct(id="p", version="1", plan=chain_plan(1))
    assert built.checked_plan() == chain_plan(1)
    assert base.checked_plan() == chain_plan(1)  # the original keeps its own
    copied.plan["nodes"].append({})  # type: ignore[index]
    with pytest.raises(ConfigurationError, match="changed in place"):
        copied.checked_plan()


async def test_a_redispatch_after_a_lookup_reports_the_dispatch_it_charges() -> None:
    dest, clock, store = Destination(), Clock(), CrashOnReceipt()
    first = FakeConnector(dest, dispatch_mode="hang")
    await runtime(first, store, clock=clock).create("p", program(PLAN))
    with pytest.raises(TimeoutError):  # nothing accepted: the next lookup proves it absent
        await asyncio.wait_for(runtime(first, store, clock=clock).run("p", worker_id="w1"),
                               0.5)
    clock.now += timedelta(minutes=5)
    events: list[AdmissionEvent] = []
    store.commits.clear()
    store.armed = False
    await runtime(FakeConnector(dest), store, clock=clock,
                  on_admission=events.append).run("p", worker_id="w2")
    charged = [s.admission_id for c in store.commits for s in c.steps
               if isinstance(s, Charge)]
    assert len(charged) == 1
    admitted = [e.admission_id for e in events if e.kind == "admitted"]
    assert admitted == [None, charged[0]]  # the lookup charges nothing; the dispatch does


async def test_an_exhausted_start_reports_the_dispatch_it_would_charge() -> None:
    dest, store = Destination(), CrashOnReceipt()
    conn = FakeConnector(dest)
    await runtime(conn, store).create("p", program(PLAN), budgets=Budgets(tool_calls=1))
    with pytest.raises(Crash):
        await runtime(conn, store).run("p")
    dest.accepted.clear()
    with pytest.raises(DurableRecoveryRequiredError):
        await runtime(FakeConnector(dest, lookups=["unknown"] * 3), store).run("p")
    act = conn.dispatched[0].action_id
    await runtime(conn, store).resolve_action("p", act, Absent(), actor="ops")
    events: list[AdmissionEvent] = []
    with pytest.raises(BudgetExhaustedError):
        await runtime(FakeConnector(dest), store, on_admission=events.append).run("p")
    exhausted = [e.admission_id for e in events if e.kind == "exhausted"]
    assert exhausted == [admission_id(act, "dispatch:2")]  # was dispatch:1's


async def test_a_streamed_planner_call_reports_its_admission_id() -> None:
    from tests.test_planner_stream import ScriptedProvider, frame, node, streamed, turn

    events: list[AdmissionEvent] = []
    store = CountingStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store,
                               on_admission=events.append)
    await rt.create("s", streamed(ScriptedProvider([turn(frame(0, node("a", 1)))], chunks=3)))
    await rt.run("s")
    planner = {s.admission_id for c in store.commits for s in c.steps
               if isinstance(s, Charge) and s.node_id is None}
    assert len(planner) == 1
    assert {e.admission_id for e in events if e.node_id is None} == planner


def test_mongodb_options_separated_by_semicolons_are_checked_too() -> None:
    pytest.importorskip("agentium_graph_mongodb")
    from agentium_graph_mongodb import MongoDBDurableTaskStore

    with pytest.raises(ConfigurationError, match="more than once"):
        MongoDBDurableTaskStore("mongodb://127.0.0.1:1/d?w=1;w=2")
    store = MongoDBDurableTaskStore(
        "mongodb://127.0.0.1:1/d?serverSelectionTimeoutMS=100;connectTimeoutMS=150")
    client: Any = store._spare  # the client the store made from the URI (no I/O)
    assert client.options.pool_options.connect_timeout == pytest.approx(0.15)
