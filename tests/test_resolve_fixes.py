"""Operator resolution (runtime.resolve_action) of uncertain effects: an agent's tool call,
concurrent resolutions, and the action ids a task still waits for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    Agent,
    AgentBinding,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    ResolutionConflictError,
    ToolBinding,
    Unknown,
)
from agentium_graph.connectors import ActionRequest
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch
from agentium_graph.store import (
    AcquireLeaseRequest,
    CommitRequest,
    CommitResult,
    LeaseGrant,
    TaskSnapshot,
)

OUT = {"type": "object", "required": ["charge_id"]}
PAY = {"id": "charge", "binding": "pay", "version": "1", "args": {"amount": 5}}
ASK = {"id": "ask", "binding": "ag", "version": "1", "args": {"prompt": "pay"}}
AFTER = {"id": "after", "binding": "e", "version": "1",
         "args": {"t": {"$ref": {"node": "ask", "path": ["text"]}}}}


class LostReplies:
    """Accepts every dispatch, then loses the reply; its lookup cannot tell."""

    id = "c"
    version = "1"
    idempotent_destination = False

    def __init__(self) -> None:
        self.accepted: dict[str, dict[str, Any]] = {}
        self.dispatches = 0

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatches += 1
        self.accepted[request.action_id] = {"charge_id": f"ch{self.dispatches}"}
        raise ConnectionResetError("reply lost")

    async def resolve_result(self, result_ref: str) -> Unknown:
        return Unknown(reason="destination down")


def pay(conn: LostReplies) -> ToolBinding:
    return ToolBinding(id="pay", version="1", connector=conn, destination="payments",
                       input_schema={"type": "object"}, output_schema=OUT)


def agent() -> AgentBinding:
    provider = ScriptedProvider([
        ScriptedTurn(tool_calls=(ToolCall(id="c1", name="pay", arguments={"amount": 5}),),
                     match=TurnMatch(assistant_turns=0)),
        ScriptedTurn(text="paid", match=TurnMatch(assistant_turns=1))])
    return AgentBinding(id="ag", version="1",
                        agent=Agent(provider=provider, instructions="x", tools=("pay",)),
                        input_schema={"type": "object"})


def echo() -> ToolBinding:
    return ToolBinding(id="e", version="1", execute=lambda a: a, recovery="pure",
                       input_schema={"type": "object"}, output_schema={"type": "object"})


def program(nodes: list[dict[str, Any]]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes})


def runtime(catalog: HostCatalog, store: InMemoryDurableTaskStore | None = None
            ) -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=catalog, store=store or InMemoryDurableTaskStore(),
                                 lookup_attempts=1, lookup_timeout=0.2)


async def stuck(rt: ExecutionGraphRuntime, nodes: list[dict[str, Any]]) -> list[str]:
    """Create task "k" and run it until its effects are uncertain; their action ids."""
    await rt.create("k", program(nodes))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("k")
    return [a.action_id for a in (await rt.inspect("k")).actions]


def charged(action_id: str, charge_id: str = "ch1") -> ActionOutcome:
    return ActionOutcome(output={"charge_id": charge_id}, result_ref=action_id)


# --- an agent's tool call --------------------------------------------------------------

async def test_outcome_of_an_agent_tool_call_is_its_receipt_and_the_agent_resumes() -> None:
    conn = LostReplies()
    rt = runtime(HostCatalog([pay(conn), agent(), echo()]))
    [aid] = await stuck(rt, [ASK, AFTER])

    view = await rt.resolve_action("k", aid, charged(aid), actor="op")

    # The tool call's receipt, not the agent's output: the agent node is reopened.
    assert view.status == "pending"
    assert view.nodes["ask"].state == "pending"
    assert view.nodes["ask"].output_digest is None
    [action] = view.actions
    assert action.state == "confirmed" and action.outcome_source == "operator"
    assert action.resolution is not None and action.resolution["actor"] == "op"
    result = await rt.run("k")
    assert result.output["ask"]["text"] == "paid"
    assert result.output["after"] == {"t": "paid"}
    assert conn.dispatches == 1  # the receipt was reused: no second charge at the destination
    events = (await rt.timeline("k", limit=1000)).events
    assert [e.node_id for e in events if e.kind == "node_reopened"] == ["ask"]
    tool_results = [e.data for e in events if e.kind == "agent_tool_result"]
    assert [(d["call_id"], d["digest"]) for d in tool_results] == [
        ("c1", action.outcome_digest)]


async def test_outcome_of_a_tool_node_still_completes_the_node() -> None:
    conn = LostReplies()
    rt = runtime(HostCatalog([pay(conn)]))
    [aid] = await stuck(rt, [PAY])
    view = await rt.resolve_action("k", aid, charged(aid), actor="op")
    assert view.nodes["charge"].state == "completed"
    assert (await rt.run("k")).output["charge"] == {"charge_id": "ch1"}
    assert conn.dispatches == 1


# --- concurrent resolutions --------------------------------------------------------------

class AliceFirst(InMemoryDurableTaskStore):
    """Both resolutions read the task before either takes its lease; bob's lease waits
    until alice's resolution has committed (or given up)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.reads = 0
        self.both_read = asyncio.Event()
        self.alice_done = asyncio.Event()

    async def get_task(self, key: str) -> TaskSnapshot | None:
        snapshot = await super().get_task(key)
        if self.armed:
            self.reads += 1
            if self.reads == 2:
                self.both_read.set()
        return snapshot

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        if self.armed and request.worker_id == "operator:alice":
            await self.both_read.wait()
        if self.armed and request.worker_id == "operator:bob":
            await self.alice_done.wait()
        return await super().acquire_lease(request)

    async def commit(self, request: CommitRequest) -> CommitResult:
        try:
            return await super().commit(request)
        finally:
            if request.worker_id == "operator:alice":
                self.alice_done.set()


Verdict = Callable[[str], ActionOutcome | Absent]  # the action id -> what is attested


async def _alice_then_bob(alice: Verdict, bob: Verdict
                          ) -> tuple[ExecutionGraphRuntime, list[Any]]:
    store = AliceFirst()
    rt = runtime(HostCatalog([pay(LostReplies())]), store)
    [aid] = await stuck(rt, [PAY])
    store.armed = True
    results = await asyncio.wait_for(asyncio.gather(
        rt.resolve_action("k", aid, alice(aid), actor="alice"),
        rt.resolve_action("k", aid, bob(aid), actor="bob"), return_exceptions=True), 10)
    return rt, results


async def test_a_conflicting_concurrent_resolution_is_refused() -> None:
    rt, (first, second) = await _alice_then_bob(lambda _: Absent(), charged)
    assert not isinstance(first, BaseException), first
    assert isinstance(second, ResolutionConflictError), second
    assert "second resolution is rejected" in str(second)
    [action] = (await rt.inspect("k")).actions
    assert action.state == "intent" and action.resolution is not None
    assert action.resolution["actor"] == "alice"
    assert (await rt.inspect("k")).nodes["charge"].state == "pending"


async def test_an_identical_concurrent_resolution_is_a_no_op() -> None:
    rt, results = await _alice_then_bob(lambda _: Absent(), lambda _: Absent())
    assert [r for r in results if isinstance(r, BaseException)] == []
    [action] = (await rt.inspect("k")).actions
    assert action.state == "intent" and action.resolution is not None
    assert action.resolution["actor"] == "alice"
    events = (await rt.timeline("k", limit=1000)).events
    assert len([e for e in events if e.kind == "node_reopened"]) == 1


class SecondTakesTheLease(InMemoryDurableTaskStore):
    """The second lease grant comes after the first and before the first grant's commit,
    as when one operator resolves twice at once (the same worker id re-acquires at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.grants: list[int] = []
        self.second = asyncio.Event()

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        grant = await super().acquire_lease(request)
        if self.armed:
            self.grants.append(grant.fence)
            if len(self.grants) == 2:
                self.second.set()
        return grant

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.armed and self.grants and request.fence == self.grants[0]:
            await self.second.wait()
        return await super().commit(request)


async def _same_operator_twice(second: Verdict) -> tuple[ExecutionGraphRuntime, list[Any]]:
    store = SecondTakesTheLease()
    rt = runtime(HostCatalog([pay(LostReplies())]), store)
    [aid] = await stuck(rt, [PAY])
    store.armed = True
    results = await asyncio.wait_for(asyncio.gather(
        rt.resolve_action("k", aid, Absent(), actor="alice"),
        rt.resolve_action("k", aid, second(aid), actor="alice"), return_exceptions=True), 10)
    return rt, results


async def test_same_operator_resolving_twice_at_once_gets_a_conflict_not_a_stale_fence(
        ) -> None:
    rt, (first, second) = await _same_operator_twice(charged)
    # The second grant took the lease before the first committed: its outcome is recorded,
    # and the first (an absence attestation) is refused with the conflict error (saying the
    # other resolution is in progress when it had not committed yet at the time).
    assert isinstance(first, ResolutionConflictError), first
    assert not isinstance(second, BaseException), second
    [action] = (await rt.inspect("k")).actions
    assert action.state == "confirmed" and action.outcome_source == "operator"
    with pytest.raises(ResolutionConflictError, match="second resolution is rejected"):
        await rt.resolve_action("k", action.action_id, Absent(), actor="alice")


async def test_same_operator_repeating_a_resolution_at_once_is_a_no_op() -> None:
    rt, results = await _same_operator_twice(lambda _: Absent())
    assert not any(isinstance(r, BaseException) for r in results), results
    [action] = (await rt.inspect("k")).actions
    assert action.state == "intent" and action.resolution is not None


async def test_same_operator_resolving_two_actions_at_once_is_told_to_retry() -> None:
    store = SecondTakesTheLease()
    conn = LostReplies()
    rt = runtime(HostCatalog([pay(conn)]), store)
    first, second = await stuck(rt, [PAY, {**PAY, "id": "charge2", "args": {"amount": 6}}])
    store.armed = True
    results = await asyncio.wait_for(asyncio.gather(
        rt.resolve_action("k", first, Absent(), actor="alice"),
        rt.resolve_action("k", second, Absent(), actor="alice"), return_exceptions=True), 10)
    assert isinstance(results[0], ResolutionConflictError), results
    assert "in progress" in str(results[0]) and "again" in str(results[0])
    assert results[1] is not None and not isinstance(results[1], BaseException)
    store.armed = False
    states = {a.action_id: a.state for a in (await rt.inspect("k")).actions}
    assert states == {first: "uncertain", second: "intent"}
    await rt.resolve_action("k", first, Absent(), actor="alice")  # the retry succeeds
    assert (await rt.inspect("k")).status == "pending"


# --- the action ids a task still waits for ------------------------------------------------

async def test_after_one_resolution_run_names_only_the_still_uncertain_action() -> None:
    conn = LostReplies()
    rt = runtime(HostCatalog([pay(conn)]))
    ids = await stuck(rt, [PAY, {**PAY, "id": "charge2", "args": {"amount": 6}}])
    assert len(ids) == 2
    done, left = ids
    view = await rt.resolve_action("k", done, charged(done), actor="op")
    assert view.status == "recovery_required"
    assert view.error is not None and view.error.details["action_ids"] == [left]
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await rt.run("k")
    assert info.value.action_ids == (left,)
    assert done not in str(info.value)
    view = await rt.resolve_action("k", left, Absent(), actor="op")
    assert view.status == "pending" and view.error is None


class AliceHoldsTheLease(InMemoryDurableTaskStore):
    """Alice's commit waits until bob has tried to take the lease alice holds."""

    def __init__(self) -> None:
        super().__init__()
        self.bob_tried = asyncio.Event()

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        try:
            return await super().acquire_lease(request)
        finally:
            if request.worker_id == "operator:bob":
                self.bob_tried.set()

    async def commit(self, request: CommitRequest) -> CommitResult:
        if request.worker_id == "operator:alice":
            await self.bob_tried.wait()
        return await super().commit(request)


async def test_a_resolution_meeting_another_operators_lease_is_told_to_retry() -> None:
    store = AliceHoldsTheLease()
    rt = runtime(HostCatalog([pay(LostReplies())]), store)
    [aid] = await stuck(rt, [PAY])
    first, second = await asyncio.wait_for(asyncio.gather(
        rt.resolve_action("k", aid, Absent(), actor="alice"),
        rt.resolve_action("k", aid, Absent(), actor="bob"), return_exceptions=True), 10)
    assert not isinstance(first, BaseException), first
    assert isinstance(second, ResolutionConflictError), second  # not LeaseHeldError
    assert second.details["retryable"] is True and "'alice' is in progress" in str(second)
    # Retrying once alice's resolution is recorded: the same attestation is a no-op.
    await rt.resolve_action("k", aid, Absent(), actor="bob")
    [action] = (await rt.inspect("k")).actions
    assert action.resolution is not None and action.resolution["actor"] == "alice"


@pytest.mark.parametrize("actor", ["", "   ", "\t"])
async def test_a_blank_actor_is_refused(actor: str) -> None:
    rt = runtime(HostCatalog([pay(LostReplies())]), InMemoryDurableTaskStore())
    [aid] = await stuck(rt, [PAY])
    with pytest.raises(ConfigurationError, match="actor"):
        await rt.resolve_action("k", aid, Absent(), actor=actor)
    assert (await rt.inspect("k")).actions[0].resolution is None
