"""Conformance: plan growth (AddNodes, CommitRevision), the action ledger and task status."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentium_graph._canonical import digest
from agentium_graph.errors import (
    BudgetExhaustedError,
    ErrorInfo,
    InvalidTransitionError,
    StaleFenceError,
)
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import ActionRecord, ActionState, NodeState, TaskStatus
from agentium_graph.store._requests import (
    AddNodes,
    AppendJournal,
    ClaimNode,
    CommitRevision,
    RecordAction,
    ReopenNode,
    SetStatus,
    SettleNode,
    StartAttempt,
    Step,
)
from agentium_graph.store._transitions import ACTION_TRANSITIONS
from agentium_graph.testing._base import KEY, W1, SuiteBase, rejected
from agentium_graph.testing._fixtures import (
    T0,
    acquire,
    action_record,
    capture,
    commit,
    node_record,
    read_timeline,
)

OUT = digest({"output": 1})
LATER = T0 + timedelta(seconds=1)
ACTION_STATES: tuple[ActionState, ...] = ("intent", "dispatching", "confirmed", "rejected",
                                          "uncertain")


def _revision(base: int, *, add: tuple[str, ...] = (), tombstone: tuple[str, ...] = (),
              admission: str | None = None) -> CommitRevision:
    return CommitRevision(
        base_revision=base, revision=base + 1,
        plan_digest=digest({"revision": base + 1, "add": list(add), "drop": list(tombstone)}),
        add=tuple(node_record(KEY, n, revision=base + 1) for n in add), tombstone=tombstone,
        admission_id=admission or f"rev-{base + 1}")


class PlanTests(SuiteBase):
    """AddNodes and CommitRevision: only unclaimed pending nodes change; growth is charged."""

    async def test_add_nodes_materializes_pending_nodes_and_charges_expansion(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=2)
        # The store forces new nodes to pending, whatever the request said.
        children = (node_record(KEY, "g/c1", parent="n0"),
                    node_record(KEY, "g/c2", parent="n0", deps=("g/c1",)).model_copy(
                        update={"state": "completed"}))
        step = AddNodes(nodes=children, admission_id="expand-g")
        result = await commit(store, KEY, W1, fence, step)
        assert result.charged == ("expand-g",)
        assert result.header.counters["expanded_nodes"] == 4
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        assert {n: snapshot.nodes[n].state for n in ("g/c1", "g/c2")} == {
            "g/c1": "pending", "g/c2": "pending"}
        assert snapshot.nodes["g/c2"].deps == ("g/c1",)
        assert snapshot.nodes["g/c1"].parent == "n0"
        added = [e.node_id for e in await read_timeline(store, KEY) if e.kind == "node_added"]
        assert added == ["g/c1", "g/c2"]
        # Re-materializing the same incarnations is idempotent.
        before = await capture(store, KEY)
        await commit(store, KEY, W1, fence, step, now=LATER)
        after = await capture(store, KEY)
        assert after.snapshot is not None and before.snapshot is not None
        assert after.snapshot.nodes == before.snapshot.nodes
        assert after.snapshot.header.counters == before.snapshot.header.counters

    async def test_add_nodes_rejects_another_incarnation_of_an_existing_node(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        other = node_record(KEY, "n1", args={"different": True})
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, AddNodes(nodes=(other,), admission_id="x")))

    async def test_add_nodes_never_exceeds_the_expansion_limit(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=3, limits={"expanded_nodes": 4})
        two = AddNodes(nodes=(node_record(KEY, "x1"), node_record(KEY, "x2")),
                       admission_id="two")
        error = await rejected(store, KEY, BudgetExhaustedError,
                               commit(store, KEY, W1, fence, two))
        assert (error.counter, error.limit) == ("expanded_nodes", 4)
        await commit(store, KEY, W1, fence, AddNodes(nodes=(node_record(KEY, "x1"),),
                                                     admission_id="one"))
        header = await store.get_header(KEY)
        assert header is not None and header.counters["expanded_nodes"] == 4

    async def test_commit_revision_replaces_pending_nodes_with_tombstones(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=3)
        result = await commit(store, KEY, W1, fence, _revision(1, add=("n3",),
                                                               tombstone=("n2",)))
        assert result.header.revision == 2
        assert result.header.counters["plan_revisions"] == 2
        assert result.header.counters["expanded_nodes"] == 4
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        assert snapshot.nodes["n2"].state == "tombstoned"
        assert (snapshot.nodes["n3"].state, snapshot.nodes["n3"].revision) == ("pending", 2)
        kinds = [e.kind for e in await read_timeline(store, KEY)]
        assert {"node_tombstoned", "node_added", "revision_committed"} <= set(kinds)

    async def test_a_revision_replaces_a_pending_node_under_its_id(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=3)
        old = (await store.get_task(KEY))
        assert old is not None
        step = _revision(1, add=("n2",), tombstone=("n2",))  # n2 again, at revision 2
        result = await commit(store, KEY, W1, fence, step)
        assert result.header.revision == 2 and result.header.counters["expanded_nodes"] == 4
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        replaced = snapshot.nodes["n2"]
        assert (replaced.state, replaced.revision) == ("pending", 2)
        assert replaced.incarnation_id != old.nodes["n2"].incarnation_id
        # The journal keeps the incarnation that was replaced.
        entries = await read_timeline(store, KEY)
        (gone,) = [e for e in entries if e.kind == "node_tombstoned"]
        assert gone.node_id == "n2"
        assert gone.data["incarnation_id"] == old.nodes["n2"].incarnation_id
        # Sending the same revision again changes nothing.
        before = await capture(store, KEY)
        await commit(store, KEY, W1, fence, step, now=LATER)
        after = await capture(store, KEY)
        assert after.snapshot is not None and before.snapshot is not None
        assert after.snapshot.nodes == before.snapshot.nodes
        assert after.snapshot.header.counters == before.snapshot.header.counters
        # A started node cannot be replaced.
        await commit(store, KEY, W1, fence, StartAttempt(node_id="n0", attempt_id="a"))
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, _revision(2, add=("n0",), tombstone=("n0",))))
        # Only a plan revision may give a tombstoned id a new incarnation.
        await commit(store, KEY, W1, fence, _revision(2, tombstone=("n1",)))
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, AddNodes(nodes=(node_record(KEY, "n1", revision=9),),
                                            admission_id="sneak")))

    async def test_identical_revision_retransmission_is_idempotent(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=3)
        step = _revision(1, add=("n3",), tombstone=("n2",))
        result = await commit(store, KEY, W1, fence, step)
        assert result.header.plan_digest == step.plan_digest  # the revision's plan, kept
        before = await capture(store, KEY)
        await commit(store, KEY, W1, fence, step, now=LATER)
        after = await capture(store, KEY)
        assert after.snapshot is not None and before.snapshot is not None
        assert after.snapshot.nodes == before.snapshot.nodes
        assert after.snapshot.header.revision == 2
        assert after.snapshot.header.counters == before.snapshot.header.counters
        assert after.snapshot.header.plan_digest == step.plan_digest
        # The same delta under the same admission, but another plan: not a retransmission.
        other = step.model_copy(update={"plan_digest": digest({"another": "plan"})})
        await rejected(store, KEY, InvalidTransitionError, commit(store, KEY, W1, fence, other))

    async def test_a_different_revision_on_a_stale_base_is_rejected(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=3)
        await commit(store, KEY, W1, fence, _revision(1, add=("n3",), tombstone=("n2",)))
        for step in (_revision(1, add=("other",), admission="rev-2-other"),  # base 1 again
                     _revision(0, add=("n9",)),                           # stale base
                     _revision(2, add=("n4",)).model_copy(update={"revision": 4}),  # a gap
                     _revision(3, add=("n4",))):                          # a future base
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, step))

    @pytest.mark.parametrize("state", ["claimed", "running", "completed"])
    async def test_only_unclaimed_pending_nodes_may_be_tombstoned(
            self, store: DurableTaskStore, state: NodeState) -> None:
        fence = await self.leased(store, nodes=2, deps="none")
        reach: dict[str, list[Step]] = {
            "claimed": [ClaimNode(node_id="n1")],
            "running": [StartAttempt(node_id="n1", attempt_id="a")],
            "completed": [StartAttempt(node_id="n1", attempt_id="a"),
                          SettleNode(node_id="n1", state="completed", output_digest=OUT)],
        }
        await commit(store, KEY, W1, fence, *reach[state])
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, _revision(1, tombstone=("n1",))))
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, _revision(1, tombstone=("n0", "n1"))))

    async def test_a_node_that_ran_cannot_be_tombstoned_even_when_pending_again(
            self, store: DurableTaskStore) -> None:
        # An uncertain effect attested absent returns its node to pending, with its attempt
        # (and action) history: it is not "unclaimed" and no revision may replace it.
        fence = await self.leased(store, nodes=2, deps="none")
        await commit(store, KEY, W1, fence, StartAttempt(node_id="n1", attempt_id="a"))
        await commit(store, KEY, W1, fence, SettleNode(node_id="n1", state="uncertain"))
        await commit(store, KEY, W1, fence, ReopenNode(node_id="n1", reason="absent"))
        snapshot = await store.get_task(KEY)
        assert snapshot is not None and snapshot.nodes["n1"].state == "pending"
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, _revision(1, tombstone=("n1",))))

    async def test_revisions_never_exceed_their_limit(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, nodes=1, limits={"plan_revisions": 2})
        await commit(store, KEY, W1, fence, _revision(1))
        error = await rejected(store, KEY, BudgetExhaustedError,
                               commit(store, KEY, W1, fence, _revision(2)))
        assert error.counter == "plan_revisions"


class ActionTests(SuiteBase):
    """RecordAction: the ledger moves intent -> dispatching -> confirmed | ..., append-only."""

    async def reach(self, store: DurableTaskStore, fence: int, state: ActionState) -> None:
        path: dict[ActionState, list[ActionState]] = {
            "intent": ["intent"], "rejected": ["rejected"],
            "dispatching": ["intent", "dispatching"],
            "confirmed": ["intent", "dispatching", "confirmed"],
            "uncertain": ["intent", "dispatching", "uncertain"],
        }
        for step_state in path[state]:
            await commit(store, KEY, W1, fence, RecordAction(action=self.action(step_state)))

    def action(self, state: ActionState) -> ActionRecord:
        return action_record("act-1", "n0", state,
                             outcome_digest=OUT if state == "confirmed" else None,
                             outcome_source="dispatch" if state == "confirmed" else None)

    async def test_action_lifecycle_is_recorded_and_journaled(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await self.reach(store, fence, "confirmed")
        snapshot = await store.get_task(KEY)
        assert snapshot is not None
        recorded = snapshot.actions["act-1"]
        assert (recorded.state, recorded.outcome_digest) == ("confirmed", OUT)
        assert recorded.updated_at == T0
        assert recorded.model_copy(update={"updated_at": None}) == self.action("confirmed")
        entries = [e for e in await read_timeline(store, KEY) if e.kind.startswith("action_")]
        assert [e.kind for e in entries] == ["action_intent", "action_dispatching",
                                             "action_confirmed"]
        assert all(e.data.get("action_id") == "act-1" for e in entries)

    @pytest.mark.parametrize("source", ACTION_STATES)
    @pytest.mark.parametrize("target", ACTION_STATES)
    async def test_action_transition_table(self, store: DurableTaskStore, source: ActionState,
                                           target: ActionState) -> None:
        fence = await self.leased(store)
        await self.reach(store, fence, source)
        before = await capture(store, KEY)
        step = RecordAction(action=self.action(target))
        if target == source:  # an identical retransmission changes nothing
            await commit(store, KEY, W1, fence, step, now=LATER)
            after = await capture(store, KEY)
            assert after.snapshot is not None and before.snapshot is not None
            assert after.snapshot.actions == before.snapshot.actions
            assert [e for e in after.timeline if e.kind.startswith("action_")] == [
                e for e in before.timeline if e.kind.startswith("action_")]
        elif target in ACTION_TRANSITIONS[source]:
            await commit(store, KEY, W1, fence, step, now=LATER)
            snapshot = await store.get_task(KEY)
            assert snapshot is not None
            assert snapshot.actions["act-1"].state == target
            assert snapshot.actions["act-1"].updated_at == LATER
        else:
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, step, now=LATER))

    @pytest.mark.parametrize("state", ["dispatching", "confirmed", "uncertain"])
    async def test_a_new_action_starts_as_an_intent(self, store: DurableTaskStore,
                                                    state: ActionState) -> None:
        fence = await self.leased(store)
        await rejected(store, KEY, InvalidTransitionError, commit(
            store, KEY, W1, fence, RecordAction(action=self.action(state))))

    async def test_request_and_origin_evidence_are_append_only(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await self.reach(store, fence, "intent")
        base = self.action("dispatching")
        for changed in (base.model_copy(update={"origin": {"binding": "other"}}),
                        base.model_copy(update={"request_digest": digest("other")})):
            await rejected(store, KEY, InvalidTransitionError, commit(
                store, KEY, W1, fence, RecordAction(action=changed)))


class StatusTests(SuiteBase):
    """SetStatus: the first commit runs the task; terminal tasks accept no transitions."""

    async def test_the_first_commit_moves_a_pending_task_to_running(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        header = await store.get_header(KEY)
        assert header is not None and header.status == "pending"
        result = await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"))
        assert result.header.status == "running"

    @pytest.mark.parametrize("status", ["completed", "failed", "canceled"])
    async def test_a_terminal_task_rejects_further_transitions(
            self, store: DurableTaskStore, status: TaskStatus) -> None:
        fence = await self.leased(store, deps="none")
        error = ErrorInfo(code="node_failed", message="n0 failed") if status == "failed" \
            else None
        await commit(store, KEY, W1, fence, SetStatus(status=status, error=error))
        header = await store.get_header(KEY)
        assert header is not None and (header.status, header.error) == (status, error)
        for step in (ClaimNode(node_id="n0"), SetStatus(status="running"),
                     SetStatus(status=status), SetStatus(status="recovery_required"),
                     StartAttempt(node_id="n1", attempt_id="a"),
                     AddNodes(nodes=(node_record(KEY, "late"),), admission_id="late")):
            await rejected(store, KEY, InvalidTransitionError,
                           commit(store, KEY, W1, fence, step, now=LATER))
        # Journal notes remain possible (an operator's annotation, cleanup notes).
        result = await commit(store, KEY, W1, fence, AppendJournal(
            kind="note", node_id="n0", data={"text": "after the end"}), now=LATER)
        assert result.header.status == status
        last = (await read_timeline(store, KEY))[-1]
        assert (last.kind, last.node_id, last.data, last.at) == (
            "note", "n0", {"text": "after the end"}, LATER)

    async def test_set_status_may_release_the_lease(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, SetStatus(status="recovery_required",
                                                      release_lease=True))
        header = await store.get_header(KEY)
        assert header is not None
        assert (header.status, header.lease, header.fence) == ("recovery_required", None, fence)
        await rejected(store, KEY, StaleFenceError,
                       commit(store, KEY, W1, fence, ClaimNode(node_id="n0")))
        # recovery_required is not terminal: a worker may lease the task again.
        again = await acquire(store, KEY, W1, now=LATER)
        result = await commit(store, KEY, W1, again, SetStatus(status="running"), now=LATER)
        assert result.header.status == "running"
