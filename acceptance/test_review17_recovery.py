"""Review 17: SIGKILL around connector effects, agents' effect tool calls and planners, in
fresh processes on every durable store, counting what the destination applied across
processes.

What the effect/agent/planner windows of this suite did not cover: a kill inside the next
run's lookup, a lookup that says Unknown or raises after a kill before dispatch, a kill
around an agent's *connector* tool call (intent, dispatch, receipt, the answer after it), and
a planner whose plan holds an effect. Every case checks: the destination applied each
action at most once (exactly once where the outcome is knowable), counters were never
refunded and never exceed their limits, attempts carry strictly increasing fences, and
``inspect`` verifies the task.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from acceptance._review17_worker import AMOUNT, read
from acceptance._stores import open_store
from acceptance.conftest import DURABLE_STORES, store_spec
from agentium_graph import ExecutionGraphRuntime, HostCatalog, TaskView
from agentium_graph.providers import read_call_log
from agentium_graph.store import TaskSnapshot

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Worker:
    folder: Path
    spec: dict[str, Any]
    key: str = "task-1"

    def run(self, **kw: Any) -> tuple[int, dict[str, Any] | None, str]:
        config = {"store": self.spec, "folder": str(self.folder), "key": self.key, **kw}
        proc = subprocess.run(
            [sys.executable, "-m", "acceptance._review17_worker", json.dumps(config)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        out = None
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith("{"):
                out = json.loads(line)
                break
        return proc.returncode, out, proc.stderr

    def killed(self, **kw: Any) -> None:
        code, out, err = self.run(**kw)
        assert code == -signal.SIGKILL, f"worker was not killed (exit {code}): {out} {err}"

    def ok(self, **kw: Any) -> dict[str, Any]:
        code, out, err = self.run(**kw)
        assert code == 0 and out is not None and out["ok"], (code, out, err)
        return out

    def applied(self) -> Counter[str]:
        """Actions the destination applied, by action id."""
        return Counter(r["action_id"] for r in read(self.folder / "dest.jsonl"))

    def calls(self, kind: str) -> int:
        return sum(1 for r in read(self.folder / "calls.jsonl") if r["call"] == kind)

    def provider_calls(self) -> Counter[str]:
        log = self.folder / "provider.log"
        return Counter(r.request_digest for r in read_call_log(log)) if log.exists() \
            else Counter()

    async def snapshot(self) -> TaskSnapshot:
        store = open_store(self.spec)
        try:
            snap = await store.get_task(self.key)
        finally:
            await store.close()
        assert snap is not None
        return snap

    async def inspect(self) -> TaskView:
        store = open_store(self.spec)
        try:
            return await ExecutionGraphRuntime(catalog=HostCatalog([]),
                                               store=store).inspect(self.key)
        finally:
            await store.close()


@pytest.fixture(params=DURABLE_STORES)
def worker(request: pytest.FixtureRequest, tmp_path: Path) -> Worker:
    return Worker(tmp_path, store_spec(request.param, tmp_path, request))


def check_books(before: TaskSnapshot, after: TaskSnapshot) -> None:
    for name, value in before.header.counters.items():
        assert after.header.counters.get(name, 0) >= value, f"{name} refunded"
    for name, value in after.header.counters.items():
        limit = after.header.limits.get(name)
        assert limit is None or value <= limit, (name, value, limit)
    for node_id, rec in after.nodes.items():
        fences = [a.fence for a in rec.attempts]
        assert fences == sorted(set(fences)), f"{node_id} fences not increasing: {fences}"
    for node_id, rec in before.nodes.items():
        if rec.state == "completed":
            assert after.nodes[node_id].attempts == rec.attempts, f"{node_id} re-ran"


async def finish(worker: Worker, before: TaskSnapshot, **kw: Any) -> TaskSnapshot:
    out = worker.ok(**kw)
    after = await worker.snapshot()
    assert after.header.status == "completed"
    check_books(before, after)
    view = await worker.inspect()
    assert view.verified, view.problems
    assert view.status == "completed" and not view.uncertain_actions
    assert out["ok"]
    return after


def only_action(snap: TaskSnapshot) -> Any:
    [action] = snap.actions.values()
    return action


async def effect_done(worker: Worker, before: TaskSnapshot, *, source: str,
                      **kw: Any) -> TaskSnapshot:
    after = await finish(worker, before, **kw)
    action = only_action(after)
    assert action.state == "confirmed" and action.outcome_source == source
    assert worker.applied() == Counter({action.action_id: 1})  # applied exactly once
    pure = len(after.nodes["prep"].attempts) + len(after.nodes["done"].attempts)
    assert after.header.counters["tool_calls"] == action.dispatches + pure
    return after


# -- effect nodes ---------------------------------------------------------------------------

async def test_kill_inside_dispatch_before_the_destination_applied(worker: Worker) -> None:
    worker.killed(create=True, connector_kill="dispatch_before_apply")
    before = await worker.snapshot()
    assert only_action(before).state == "dispatching" and not worker.applied()
    after = await effect_done(worker, before, source="dispatch")
    assert only_action(after).dispatches == 2  # proved absent, dispatched again
    assert worker.calls("lookup") == 1 and worker.calls("dispatch") == 2
    assert [a.fence for a in after.nodes["pay"].attempts] == [1, 2]


async def test_kill_inside_the_next_runs_lookup(worker: Worker) -> None:
    worker.killed(create=True, connector_kill="dispatch_after_apply")
    worker.killed(connector_kill="lookup")
    before = await worker.snapshot()
    assert only_action(before).state == "dispatching"
    after = await effect_done(worker, before, source="reconcile")
    assert worker.calls("dispatch") == 1 and worker.calls("lookup") == 2
    assert [a.fence for a in after.nodes["pay"].attempts] == [1, 2, 3]
    assert only_action(after).dispatches == 1


async def test_kill_in_the_redispatch_after_proven_absence(worker: Worker) -> None:
    worker.killed(create=True, kill_at="after_intent_commit")
    worker.killed(connector_kill="dispatch_after_apply")  # absent -> dispatched -> killed
    before = await worker.snapshot()
    assert only_action(before).dispatches == 2
    await effect_done(worker, before, source="reconcile")
    assert worker.calls("dispatch") == 1 and worker.calls("lookup") == 2


@pytest.mark.parametrize("lookup", ["unknown", "raise"])
async def test_unknown_lookup_after_a_kill_before_dispatch_is_never_a_blind_dispatch(
        worker: Worker, lookup: str) -> None:
    from agentium_graph import Absent

    worker.killed(create=True, kill_at="after_intent_commit")
    for _ in range(2):
        code, out, err = worker.run(lookup=lookup)
        assert code == 0 and out is not None and not out["ok"], (out, err)
        assert out["error"] == "DurableRecoveryRequiredError"
        [action_id] = out["details"]["action_ids"]
    assert worker.calls("dispatch") == 0 and not worker.applied()
    stuck = await worker.snapshot()
    assert stuck.header.status == "recovery_required"
    assert stuck.nodes["pay"].state == "uncertain"
    view = await worker.inspect()
    assert view.verified, view.problems
    assert [a.action_id for a in view.uncertain_actions] == [action_id]
    store = open_store(worker.spec)
    try:
        runtime = ExecutionGraphRuntime(catalog=HostCatalog([]), store=store)
        await runtime.resolve_action(worker.key, action_id, Absent(), actor="oncall")
    finally:
        await store.close()
    await effect_done(worker, stuck, source="dispatch")
    assert worker.calls("dispatch") == 1


async def test_unknown_lookup_after_the_destination_applied_then_operator_outcome(
        worker: Worker) -> None:
    from agentium_graph import ActionOutcome

    worker.killed(create=True, kill_at="before_receipt_commit")
    _code, out, err = worker.run(lookup="unknown")
    assert out is not None and out["error"] == "DurableRecoveryRequiredError", (out, err)
    [action_id] = out["details"]["action_ids"]
    stuck = await worker.snapshot()
    store = open_store(worker.spec)
    try:
        runtime = ExecutionGraphRuntime(catalog=HostCatalog([]), store=store)
        await runtime.resolve_action(worker.key, action_id, ActionOutcome(
            output={"charged": AMOUNT}, result_ref=action_id), actor="oncall")
    finally:
        await store.close()
    await effect_done(worker, stuck, source="operator", lookup="unknown")
    assert worker.calls("dispatch") == 1


@pytest.mark.parametrize("kill", ["dispatch_before_apply", "dispatch_after_apply"])
async def test_idempotent_destination_dispatches_again_under_the_same_id(
        worker: Worker, kill: str) -> None:
    worker.killed(create=True, idempotent=True, connector_kill=kill)
    before = await worker.snapshot()
    after = await effect_done(worker, before, source="dispatch", idempotent=True,
                              lookup="unknown")
    assert worker.calls("dispatch") == 2 and only_action(after).dispatches == 2


# -- agents calling a connector tool --------------------------------------------------------

async def agent_done(worker: Worker, before: TaskSnapshot, **kw: Any) -> TaskSnapshot:
    after = await finish(worker, before, graph="agent", **kw)
    action = only_action(after)
    assert action.state == "confirmed"
    assert worker.applied() == Counter({action.action_id: 1})
    out = after.nodes["ask"]
    assert out.state == "completed"
    # Every request asked at most twice (an interrupted one), none lost.
    assert after.header.counters["model_calls"] == sum(worker.provider_calls().values())
    assert after.header.counters["tool_calls"] == action.dispatches
    return after


@pytest.mark.parametrize("point", ["after_model_response", "after_intent_commit",
                                   "before_receipt_commit", "after_tool_result"])
async def test_agent_killed_around_its_connector_call(worker: Worker, point: str) -> None:
    worker.killed(graph="agent", create=True, kill_at=point, node="ask")
    before = await worker.snapshot()
    await agent_done(worker, before)
    assert sorted(worker.provider_calls().values()) == [1, 1]  # every answer asked once
    assert worker.calls("dispatch") == 1  # proved absent, or reconciled: never twice
    assert worker.calls("lookup") == (1 if point in ("after_intent_commit",
                                                       "before_receipt_commit") else 0)


async def test_agent_killed_inside_the_dispatch_after_the_destination_applied(
        worker: Worker) -> None:
    worker.killed(graph="agent", create=True, connector_kill="dispatch_after_apply")
    before = await worker.snapshot()
    await agent_done(worker, before)
    assert worker.calls("dispatch") == 1 and worker.calls("lookup") == 1
    assert sorted(worker.provider_calls().values()) == [1, 1]


async def test_agent_killed_mid_stream_after_its_tool_receipt(worker: Worker) -> None:
    import asyncio
    import time

    config = {"graph": "agent", "create": True, "script": "hang-last"}
    cfg = {"store": worker.spec, "folder": str(worker.folder), "key": worker.key, **config}
    # A worker killed while the answer's stream hangs: started, watched, then SIGKILLed.
    proc = subprocess.Popen([sys.executable, "-m", "acceptance._review17_worker",  # noqa: ASYNC220
                             json.dumps(cfg)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while sum(worker.provider_calls().values()) < 2:  # the answer's stream hangs
        assert time.monotonic() < deadline and proc.poll() is None
        await asyncio.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    before = await worker.snapshot()
    assert only_action(before).state == "confirmed"
    after = await agent_done(worker, before)  # a fresh provider: the answer comes
    assert worker.calls("dispatch") == 1 and worker.calls("lookup") == 0
    assert sorted(worker.provider_calls().values()) == [1, 2]
    assert after.header.counters["model_calls"] == 3


async def test_agent_unknown_lookup_then_operator_outcome(worker: Worker) -> None:
    from agentium_graph import ActionOutcome

    worker.killed(graph="agent", create=True, connector_kill="dispatch_after_apply")
    _code, out, err = worker.run(graph="agent", lookup="unknown")
    assert out is not None and out["error"] == "DurableRecoveryRequiredError", (out, err)
    [action_id] = out["details"]["action_ids"]
    stuck = await worker.snapshot()
    assert stuck.nodes["ask"].state == "uncertain"
    view = await worker.inspect()
    assert view.verified, view.problems
    store = open_store(worker.spec)
    try:
        runtime = ExecutionGraphRuntime(catalog=HostCatalog([]), store=store)
        await runtime.resolve_action(worker.key, action_id, ActionOutcome(
            output={"charged": AMOUNT}, result_ref=action_id), actor="oncall")
    finally:
        await store.close()
    await agent_done(worker, stuck, lookup="unknown")
    assert worker.calls("dispatch") == 1
    assert sorted(worker.provider_calls().values()) == [1, 1]


# -- planners -------------------------------------------------------------------------------

async def test_planner_killed_before_its_accepted_plan_was_committed(worker: Worker) -> None:
    worker.killed(graph="planner", create=True, kill_at="before_plan_commit")
    before = await worker.snapshot()
    assert before.header.revision == 0 and not before.nodes
    assert before.header.counters["model_calls"] == 1
    after = await effect_done(worker, before, source="dispatch", graph="planner")
    assert after.header.revision == 1
    assert sorted(worker.provider_calls().values()) == [2]  # asked again: nothing recorded
    assert after.header.counters["model_calls"] == 2
    assert after.header.counters["plan_revisions"] == 1


async def test_planner_plan_committed_then_effect_reconciled(worker: Worker) -> None:
    worker.killed(graph="planner", create=True, connector_kill="dispatch_after_apply")
    before = await worker.snapshot()
    assert before.header.revision == 1
    after = await effect_done(worker, before, source="reconcile", graph="planner")
    assert sorted(worker.provider_calls().values()) == [1]  # the plan is never asked again
    assert after.header.counters["model_calls"] == 1
    assert worker.calls("dispatch") == 1


# -- a stop observed by the run after a crash ------------------------------------------------

def looked_up(snap: TaskSnapshot, out: dict[str, Any], node: str, state: str) -> str:
    """The action a crash left ``dispatching`` was looked up as the run stopped (stop 23),
    never left ``dispatching`` in an ended task: ``confirmed`` with the receipt the lookup
    found, or ``rejected`` when it proved the action absent. Returns its id."""
    action = only_action(snap)
    assert action.state == state, action
    assert action.outcome_source == ("reconcile" if state == "confirmed" else None), action
    assert snap.header.status in ("canceled", "failed"), (snap.header, out)
    assert snap.nodes[node].state != "uncertain"
    return action.action_id


@pytest.mark.parametrize("graph, node", [("effect", "pay"), ("agent", "ask")])
async def test_a_cancel_after_a_crash_never_hides_an_applied_dispatch(
        worker: Worker, graph: str, node: str) -> None:
    worker.killed(graph=graph, create=True, connector_kill="dispatch_after_apply")
    worker.ok(graph=graph, op="cancel")  # recorded while nobody runs the task
    crashed = await worker.snapshot()
    code, out, err = worker.run(graph=graph)
    assert code == 0 and out is not None and out["error"] == "TaskCanceledError", (out, err)
    snap = await worker.snapshot()
    assert worker.calls("dispatch") == 1  # never dispatched again
    action_id = looked_up(snap, out, node, "confirmed")
    assert snap.header.status == "canceled"
    # An effect node completes with the receipt; an agent stopped by the cancel does not.
    assert snap.nodes[node].state == ("completed" if graph == "effect" else "canceled")
    view = await worker.inspect()
    assert view.verified and not view.pending_actions and not view.uncertain_actions, view
    assert worker.applied() == Counter({action_id: 1}) and worker.calls("dispatch") == 1
    check_books(crashed, snap)


async def test_a_deadline_passed_after_a_crash_never_hides_an_applied_dispatch(
        worker: Worker) -> None:
    import time

    worker.killed(create=True, connector_kill="dispatch_after_apply", deadline_s=2.0)
    time.sleep(2.2)  # noqa: ASYNC251 - the deadline must pass while nobody runs the task
    code, out, err = worker.run()
    assert code == 0 and out is not None and out["error"] == "DeadlineExceededError", \
        (out, err)
    snap = await worker.snapshot()
    action_id = looked_up(snap, out, "pay", "confirmed")
    assert snap.header.status == "failed" and snap.nodes["pay"].state == "completed"
    assert worker.calls("dispatch") == 1 and worker.applied() == Counter({action_id: 1})
    view = await worker.inspect()
    assert view.verified and not view.pending_actions, view


async def test_a_cancel_after_a_kill_before_dispatch_rejects_the_intent(
        worker: Worker) -> None:
    # Nothing reached the destination; the lookup the stop makes proves it absent, so the
    # action is rejected (never dispatched) and the task canceled at once.
    worker.killed(create=True, kill_at="after_intent_commit")
    worker.ok(op="cancel")
    crashed = await worker.snapshot()
    code, out, err = worker.run()
    assert code == 0 and out is not None and out["error"] == "TaskCanceledError", (out, err)
    snap = await worker.snapshot()
    assert worker.calls("dispatch") == 0 and not worker.applied()
    looked_up(snap, out, "pay", "rejected")
    check_books(crashed, snap)
    assert snap.header.status == "canceled" and snap.nodes["pay"].state == "canceled"
    reason = only_action(snap).reason
    assert reason is not None and "proved absent" in reason
    view = await worker.inspect()
    assert view.verified and not view.uncertain_actions and not view.pending_actions, view
