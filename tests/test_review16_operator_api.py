"""Hostile operator input to the operator API (inspect / cancel / timeline / resolve_action /
admission_snapshot): every bad input is a typed AgentiumGraphError, and none of them changes
anything journaled; inspect reports damaged data it can see instead of calling it verified."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    AgentiumGraphError,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
)
from agentium_graph.runtime._args import encode_cursor
from tests.test_resolve_fixes import ASK, PAY, LostReplies, agent, pay


def catalog() -> HostCatalog:
    return HostCatalog([pay(LostReplies()), agent()])


def runtime(store: InMemoryDurableTaskStore) -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=catalog(), store=store, lookup_attempts=1,
                                 lookup_timeout=0.2)


async def stuck(store: InMemoryDurableTaskStore, node: dict[str, Any]
                ) -> tuple[ExecutionGraphRuntime, str]:
    rt = runtime(store)
    await rt.create("k", ExecutionGraphProgram(
        id="p", version="1", plan={"schemaVersion": 1, "revision": 1, "nodes": [node]}))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("k")
    [action] = (await rt.inspect("k")).actions
    return rt, action.action_id


async def journaled(store: InMemoryDurableTaskStore) -> tuple[Any, ...]:
    snapshot = await store.get_task("k")
    assert snapshot is not None
    h = snapshot.header
    return (h.journal_seq, h.fence, h.status, h.lease, h.cancel, snapshot.actions,
            snapshot.nodes)


# --- timeline cursors ------------------------------------------------------------------

@pytest.mark.parametrize("cursor", [5, b"YWd0", ["a"], 1.5, object()])
async def test_a_cursor_that_is_not_a_string_is_a_configuration_error(cursor: Any) -> None:
    store = InMemoryDurableTaskStore()
    rt, _ = await stuck(store, PAY)
    with pytest.raises(ConfigurationError, match="cursor"):
        await rt.timeline("k", cursor=cursor)


async def test_a_forged_cursor_past_the_end_of_the_journal_is_refused() -> None:
    store = InMemoryDurableTaskStore()
    rt, _ = await stuck(store, PAY)
    total = (await rt.timeline("k")).total
    for seq in (total + 1, 10 ** 6, 2 ** 62):
        with pytest.raises(ConfigurationError, match="cursor"):
            await rt.timeline("k", cursor=encode_cursor("k", seq))
    # A real cursor still works, also the one at the very end (nothing new yet).
    page = await rt.timeline("k", limit=2)
    assert page.next_cursor is not None
    rest = await rt.timeline("k", cursor=page.next_cursor, limit=1000)
    assert [e.seq for e in page.events + rest.events] == list(range(1, total + 1))
    assert (await rt.timeline("k", cursor=encode_cursor("k", total))).events == ()


async def test_a_cursor_of_an_earlier_page_still_works_after_the_task_grew() -> None:
    store = InMemoryDurableTaskStore()
    rt, aid = await stuck(store, PAY)
    first = await rt.timeline("k", limit=1)
    assert first.next_cursor is not None
    await rt.resolve_action("k", aid, ActionOutcome(output={"charge_id": "x"},
                                                    result_ref=aid), actor="op")
    later = await rt.timeline("k", cursor=first.next_cursor, limit=1000)
    assert later.events[0].seq == 2 and later.events[-1].seq == later.total


# --- admission_snapshot key checks -----------------------------------------------------

@pytest.mark.parametrize("key", [5, None, b"k", "", "x" * 201, "\ud800"])
async def test_admission_snapshot_checks_the_key_like_the_other_calls(key: Any) -> None:
    rt = runtime(InMemoryDurableTaskStore())
    with pytest.raises(ConfigurationError, match="task key"):
        await rt.admission_snapshot(key)


# --- resolve_action: a refused outcome journals nothing --------------------------------

@pytest.mark.parametrize("output", [{"nope": 1}, {"charge_id": float("nan")}])
async def test_an_outcome_refused_by_its_checks_changes_nothing_journaled(
        output: Any) -> None:
    store = InMemoryDurableTaskStore()
    rt, aid = await stuck(store, PAY)
    before = await journaled(store)
    with pytest.raises(ConfigurationError, match="resolution output"):
        await rt.resolve_action("k", aid, ActionOutcome(output=output, result_ref=aid),
                                actor="op")
    assert await journaled(store) == before
    # And the action can still be resolved properly.
    view = await rt.resolve_action("k", aid, ActionOutcome(output={"charge_id": "x"},
                                                           result_ref=aid), actor="op")
    assert view.nodes["charge"].state == "completed"


# --- cancel reasons --------------------------------------------------------------------

@pytest.mark.parametrize("reason", [" ", "\t\n", "\u3000"])
async def test_a_blank_cancel_reason_is_refused_and_changes_nothing(reason: str) -> None:
    store = InMemoryDurableTaskStore()
    rt, _ = await stuck(store, PAY)
    before = await journaled(store)
    with pytest.raises(ConfigurationError, match="reason"):
        await rt.cancel("k", reason=reason)
    assert await journaled(store) == before


# --- inspect verifies the receipts it lists ---------------------------------------------

@pytest.mark.parametrize("damage", ["missing", "damaged"])
async def test_inspect_reports_a_missing_or_damaged_receipt_of_an_agent_tool_call(
        damage: str) -> None:
    store = InMemoryDurableTaskStore()
    rt, aid = await stuck(store, ASK)
    await rt.resolve_action("k", aid, ActionOutcome(output={"charge_id": "x"},
                                                    result_ref=aid), actor="op")
    [action] = (await rt.inspect("k")).actions
    assert action.outcome_digest is not None
    if damage == "missing":
        del store._blobs[action.outcome_digest]
    else:
        store._blobs[action.outcome_digest] = '{"charge_id":"forged"}'
    view = await runtime(store).inspect("k")  # a fresh runtime: nothing remembered
    assert view.verified is False
    assert any(aid in p and "receipt" in p for p in view.problems), view.problems
    # The run that would replay the receipt refuses it too: inspect agrees with it.
    with pytest.raises(AgentiumGraphError):
        await runtime(store).run("k")
