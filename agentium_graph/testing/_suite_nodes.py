"""Conformance: node transitions (claim, prepare, start, settle) and atomic commits."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentium_graph._canonical import digest
from agentium_graph.errors import BudgetExhaustedError, ErrorInfo, InvalidTransitionError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import NodeRecord, NodeState
from agentium_graph.store._requests import (
    Charge,
    ClaimNode,
    CommitRevision,
    PrepareNode,
    ReopenNode,
    SettleNode,
    StartAttempt,
    Step,
)
from agentium_graph.store._transitions import NODE_TRANSITIONS
from agentium_graph.testing._base import KEY, W1, W2, SuiteBase, rejected
from agentium_graph.testing._fixtures import T0, acquire, capture, commit, read_timeline

IN = digest({"input": 1})
OUT = digest({"output": 1})
LATER = T0 + timedelta(seconds=1)

ALL_STATES: tuple[NodeState, ...] = ("pending", "claimed", "prepared", "running", "completed",
                                     "failed", "canceled", "uncertain", "tombstoned")


def _reach(state: NodeState) -> list[Step]:
    """Steps that take a fresh pending ``n0`` to ``state``."""
    start = StartAttempt(node_id="n0", attempt_id="att-1", input_digest=IN)
    settled: dict[NodeState, SettleNode] = {
        "completed": SettleNode(node_id="n0", state="completed", output_digest=OUT),
        "failed": SettleNode(node_id="n0", state="failed",
                             error=ErrorInfo(code="tool_error", message="boom")),
        "canceled": SettleNode(node_id="n0", state="canceled"),
        "uncertain": SettleNode(node_id="n0", state="uncertain"),
    }
    if state == "pending":
        return []
    if state == "claimed":
        return [ClaimNode(node_id="n0")]
    if state == "prepared":
        return [ClaimNode(node_id="n0"), PrepareNode(node_id="n0", input_digest=IN)]
    if state == "running":
        return [start]
    if state == "tombstoned":
        return [CommitRevision(base_revision=1, revision=2, plan_digest=digest("rev-2"),
                               tombstone=("n0",), admission_id="rev-2")]
    return [start, settled[state]]


def _to(state: NodeState, revision: int) -> Step:
    """The one step that moves ``n0`` to ``state``."""
    if state == "claimed":
        return ClaimNode(node_id="n0")
    if state == "prepared":
        return PrepareNode(node_id="n0", input_digest=IN)
    if state == "running":
        return StartAttempt(node_id="n0", attempt_id="att-2", input_digest=IN)
    if state == "tombstoned":
        return CommitRevision(base_revision=revision, revision=revision + 1,
                              plan_digest=digest("next"), tombstone=("n0",),
                              admission_id="rev-next")
    if state == "completed":
        return SettleNode(node_id="n0", state="completed", output_digest=OUT)
    if state == "failed":
        return SettleNode(node_id="n0", state="failed",
                          error=ErrorInfo(code="tool_error", message="again"))
    if state == "pending":  # only an operator-attested reopen of an uncertain node
        return ReopenNode(node_id="n0", reason="operator attested the effect is absent")
    assert state in ("canceled", "uncertain")
    return SettleNode(node_id="n0", state=state)


class NodeTests(SuiteBase):
    """Node steps through ``commit``: allowed transitions apply, others change nothing."""

    async def node(self, store: DurableTaskStore, node_id: str = "n0") -> NodeRecord:
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        return snapshot.nodes[node_id]

    @pytest.mark.parametrize("source", ALL_STATES)
    @pytest.mark.parametrize("target", ALL_STATES)
    async def test_node_transition_table(self, store: DurableTaskStore, source: NodeState,
                                         target: NodeState) -> None:
        fence = await self.leased(store, nodes=1)
        await commit(store, KEY, W1, fence, *_reach(source))
        assert (await self.node(store)).state == source
        # A newer fence, so "running -> running" (a new attempt) is legal where allowed.
        fence = await acquire(store, KEY, W1, now=LATER)
        header = await store.get_header(KEY)
        assert header is not None
        step = _to(target, header.revision)
        if target in NODE_TRANSITIONS[source]:
            await commit(store, KEY, W1, fence, step, now=LATER)
            node = await self.node(store)
            assert node.state == target
            if target != source:
                assert node.updated_at == LATER
        else:
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, step, now=LATER))

    async def test_start_attempt_runs_a_node_under_the_fence_and_charges_once(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, deps="none")
        result = await commit(store, KEY, W1, fence, StartAttempt(
            node_id="n0", attempt_id="att-1", input_digest=IN, admission_id="adm-n0-1",
            charges={"work_attempts": 1, "tool_calls": 1}))
        node = await self.node(store)
        assert node.state == "running"
        assert node.input_digest == IN
        assert len(node.attempts) == 1
        attempt = node.attempts[0]
        assert (attempt.number, attempt.attempt_id, attempt.fence, attempt.worker_id) == (
            1, "att-1", fence, W1)
        assert (attempt.started_at, attempt.admission_id, attempt.ended_at) == (
            T0, "adm-n0-1", None)
        assert result.charged == ("adm-n0-1",)
        assert result.header.status == "running"
        assert result.header.counters["work_attempts"] == 1
        assert result.header.counters["tool_calls"] == 1
        assert result.nodes["n0"] == node
        kinds = [e.kind for e in await read_timeline(store, KEY)]
        assert "attempt_started" in kinds and "admission_charged" in kinds

    async def test_start_attempt_requires_completed_dependencies(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        start_n1 = StartAttempt(node_id="n1", attempt_id="att-n1", requires_completed=("n0",))
        await rejected(store, KEY, InvalidTransitionError,
                       commit(store, KEY, W1, fence, start_n1))
        # One commit may carry "n0 completed" and "n1 started": steps apply in order.
        await commit(store, KEY, W1, fence,
                     StartAttempt(node_id="n0", attempt_id="att-n0"),
                     SettleNode(node_id="n0", state="completed", output_digest=OUT), start_n1)
        assert (await self.node(store, "n1")).state == "running"

    async def test_a_new_attempt_needs_a_newer_fence_and_interrupts_the_old_one(
            self, store: DurableTaskStore) -> None:
        first = await self.leased(store, deps="none", ttl=10)
        start = StartAttempt(node_id="n0", attempt_id="att-1", admission_id="adm-1",
                             charges={"work_attempts": 1})
        await commit(store, KEY, W1, first, start)
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, first, StartAttempt(node_id="n0", attempt_id="att-2")))
        # Another worker recovers after expiry: the interrupted attempt is closed.
        recovered_at = T0 + timedelta(seconds=10)
        second = await acquire(store, KEY, W2, now=recovered_at)
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W2, second, start, now=recovered_at))  # attempt id reused
        result = await commit(store, KEY, W2, second, StartAttempt(
            node_id="n0", attempt_id="att-2", admission_id="adm-1",
            charges={"work_attempts": 1}), now=recovered_at)
        # The retried admission id was charged before: nothing new is charged.
        assert result.charged == ()
        assert result.already_charged == ("adm-1",)
        assert result.header.counters["work_attempts"] == 1
        node = await self.node(store)
        assert [(a.number, a.fence, a.worker_id, a.outcome) for a in node.attempts] == [
            (1, first, W1, "interrupted"), (2, second, W2, None)]
        assert node.attempts[0].ended_at == recovered_at
        kinds = [e.kind for e in await read_timeline(store, KEY)]
        assert "attempt_interrupted" in kinds

    async def test_settle_completed_needs_an_output_digest(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, deps="none")
        await commit(store, KEY, W1, fence, StartAttempt(node_id="n0", attempt_id="a"))
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, SettleNode(node_id="n0", state="completed")))
        await commit(store, KEY, W1, fence, SettleNode(node_id="n0", state="completed",
                                                      output_digest=OUT), now=LATER)
        node = await self.node(store)
        assert (node.state, node.output_digest) == ("completed", OUT)
        assert node.attempts[-1].outcome == "completed"
        assert node.attempts[-1].ended_at == LATER
        completed = [e for e in await read_timeline(store, KEY) if e.kind == "node_completed"]
        assert len(completed) == 1 and completed[0].node_id == "n0"
        assert completed[0].data.get("output_digest") == OUT

    async def test_settle_failed_keeps_the_error_as_data(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, deps="none")
        error = ErrorInfo(code="tool_error", message="ValueError: bad", node_id="n0",
                          details={"exception_type": "ValueError"})
        await commit(store, KEY, W1, fence, StartAttempt(node_id="n0", attempt_id="a"),
                     SettleNode(node_id="n0", state="failed", error=error))
        node = await self.node(store)
        assert (node.state, node.error) == ("failed", error)
        assert node.attempts[-1].outcome == "failed"

    async def test_claim_is_idempotent_and_honours_dependencies(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, ClaimNode(node_id="n1", requires_completed=("n0",))))
        await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"))
        claimed = await self.node(store)
        entries = len(await read_timeline(store, KEY))
        await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"), now=LATER)
        assert await self.node(store) == claimed
        assert len(await read_timeline(store, KEY)) == entries

    async def test_prepare_pins_the_input(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"),
                     PrepareNode(node_id="n0", input_digest=IN))
        assert (await self.node(store)).input_digest == IN
        await commit(store, KEY, W1, fence, PrepareNode(node_id="n0", input_digest=IN))
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, PrepareNode(node_id="n0", input_digest=OUT)))
        node = await self.node(store)
        assert (node.state, node.input_digest) == ("prepared", IN)

    async def test_unknown_nodes_are_rejected(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        for step in (ClaimNode(node_id="nope"), StartAttempt(node_id="nope", attempt_id="a"),
                     SettleNode(node_id="nope", state="canceled"),
                     PrepareNode(node_id="nope", input_digest=IN),
                     StartAttempt(node_id="n0", attempt_id="a", requires_completed=("nope",))):
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, step))

    async def test_a_rejected_batch_applies_none_of_its_steps(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, deps="none", limits={"tool_calls": 1})
        good: list[Step] = [ClaimNode(node_id="n0"),
                            Charge(admission_id="adm-a", charges={"tool_calls": 1})]
        for bad in (SettleNode(node_id="n1", state="completed"),  # no output digest
                    StartAttempt(node_id="n1", attempt_id="x", requires_completed=("n2",)),
                    ClaimNode(node_id="missing")):
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, *good, bad))
        # Over budget in the third step: the first two are not applied either.
        await rejected(store, KEY, BudgetExhaustedError, commit(
            store, KEY, W1, fence, *good, Charge(admission_id="adm-b",
                                                 charges={"tool_calls": 1})))
        # The admission id of the rejected batch was not remembered.
        before = await capture(store, KEY)
        assert before.snapshot is not None
        assert before.snapshot.nodes["n0"].state == "pending"
        result = await commit(store, KEY, W1, fence, *good)
        assert result.charged == ("adm-a",)
        assert (await self.node(store)).state == "claimed"

    async def test_commit_result_matches_what_the_store_reads_back(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        result = await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"),
                              StartAttempt(node_id="n0", attempt_id="a", input_digest=IN,
                                           admission_id="adm", charges={"tool_calls": 1}))
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        assert result.header == snapshot.header
        assert result.nodes == {"n0": snapshot.nodes["n0"]}
        timeline = await read_timeline(store, KEY)
        assert result.journal == tuple(timeline[-len(result.journal):])
        assert result.header.journal_seq == timeline[-1].seq
        assert result.header.seq > 0

    async def test_concurrent_starts_of_one_node_let_exactly_one_win(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, deps="none")
        results = await asyncio.gather(*(
            commit(store, KEY, W1, fence, StartAttempt(
                node_id="n0", attempt_id=f"att-{i}", admission_id=f"adm-{i}",
                charges={"work_attempts": 1}))
            for i in range(10)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 9, results
        assert all(isinstance(e, InvalidTransitionError) for e in errors)
        node = await self.node(store)
        assert len(node.attempts) == 1
        header = await store.get_header(KEY)
        assert header is not None and header.counters["work_attempts"] == 1
