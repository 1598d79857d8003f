"""Connectors that misbehave in ways a library or a settings file makes easy: an exception
that is not an ``Exception``, an ``idempotent_destination`` read from text. Neither may end
with an effect that happened but can never be settled, or one dispatched twice."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphRuntime,
    ToolBinding,
)
from tests.conftest import CountingStore, program
from tests.test_effects import PAY_OUT, PLAN, Destination, FakeConnector, pay_catalog


class LibraryAbort(BaseException):
    """What some client libraries raise on a torn connection: not an Exception."""


class AbortsAfterAccepting(FakeConnector):
    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        await super().dispatch(request)  # the destination accepted the charge
        raise LibraryAbort("connection aborted")


class AbortingLookups(FakeConnector):
    async def resolve_result(self, result_ref: str) -> Any:
        self.resolved.append(result_ref)
        raise LibraryAbort("lookup aborted")


async def test_a_base_exception_from_dispatch_is_reconciled_not_a_failed_node() -> None:
    # It used to fail the node and the task while the ledger kept the action 'dispatching'
    # forever: applied, yet neither confirmed nor resolvable.
    dest = Destination()
    conn = AbortsAfterAccepting(dest)
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=CountingStore(),
                               lookup_timeout=0.2)
    await rt.create("p", program(PLAN))
    result = await rt.run("p")
    assert result.output["charge"] == {"charge_id": "ch_1", "amount": 500}
    assert dest.accept_count == 1 and len(conn.dispatched) == 1 and conn.resolved
    view = await rt.inspect("p")
    assert [a.state for a in view.actions] == ["confirmed"] and view.verified


async def test_a_base_exception_from_a_lookup_leaves_the_effect_resolvable() -> None:
    dest = Destination()
    conn = AbortingLookups(dest, dispatch_mode="raise_after_accept")
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=CountingStore(),
                               lookup_timeout=0.2, lookup_attempts=2)
    await rt.create("p", program(PLAN))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    view = await rt.inspect("p")
    [action] = view.actions
    assert action.state == "uncertain" and "LibraryAbort" in (action.reason or "")
    await rt.resolve_action("p", action.action_id,
                            ActionOutcome(output=dest.accepted[action.action_id],
                                          result_ref=action.action_id), actor="oncall")
    assert (await rt.run("p")).output["charge"]["charge_id"] == "ch_1"
    assert dest.accept_count == 1


@pytest.mark.parametrize("flag", ["false", "true", 0, 1, None])
def test_idempotent_destination_must_be_a_bool(flag: Any) -> None:
    # A string "false" (a setting read from an environment variable) is true: an effect
    # whose outcome is unknown would be dispatched again to a destination that does not
    # deduplicate.
    conn = FakeConnector(Destination())
    conn.idempotent_destination = flag  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match="idempotent_destination") as info:
        ToolBinding(id="pay", version="1", connector=conn, destination="payments",
                    output_schema=PAY_OUT)
    assert "True or False" in str(info.value)


@pytest.mark.parametrize(("attr", "value"), [("id", ""), ("id", 5), ("version", None)])
def test_a_connector_id_and_version_must_be_non_empty_strings(attr: str, value: Any) -> None:
    conn = FakeConnector(Destination())
    setattr(conn, attr, value)
    with pytest.raises(ConfigurationError, match=f"connector {attr} must be a non-empty"):
        ToolBinding(id="pay", version="1", connector=conn, destination="payments")



class AnswersForTheFirstAction(FakeConnector):
    """Answers every action after the first with the first one's outcome: a connector that
    mixed up its keys (a cache keyed wrongly, a lookup by the wrong column)."""

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        first = self.dispatched[0].action_id if self.dispatched else None
        if first is None or self.dispatch_mode != "other":
            return await super().dispatch(request)
        self.dispatched.append(request)
        return ActionOutcome(output=self.dest.accepted[first], result_ref=first)

    async def resolve_result(self, result_ref: str) -> Any:
        self.resolved.append(result_ref)
        first = self.dispatched[0].action_id
        return ActionOutcome(output=self.dest.accepted[first], result_ref=first)


TWO_CHARGES = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "charge", "binding": "pay", "version": "1", "args": {"amount": 500}},
    {"id": "again", "binding": "pay", "version": "1", "args": {"amount": 7},
     "dependsOn": ["charge"]}]}


@pytest.mark.parametrize("mode", ["other", "raise_after_accept"], ids=["dispatch", "lookup"])
async def test_an_outcome_naming_another_action_is_not_this_ones_receipt(mode: str) -> None:
    # (review 37) Another action's outcome completed the node with its output. A handle of
    # the destination's own is still fine, even one shaped like an action id (review 42):
    # see test_review22_consumer and the test below.
    conn = AnswersForTheFirstAction(Destination(), dispatch_mode=mode)
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=CountingStore(),
                               lookup_timeout=0.2, lookup_attempts=1)
    await rt.create("p", program(TWO_CHARGES))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    view = await rt.inspect("p")
    first, second = (view.actions[0], view.actions[1]) if \
        view.actions[0].node_id == "charge" else (view.actions[1], view.actions[0])
    assert first.state == "confirmed" and second.state == "uncertain"
    assert first.action_id in (second.reason or "")
    assert "answers for another action" in (second.reason or "")
    assert view.nodes["again"].output is None and len(conn.dispatched) == 2


class OwnIdShapedLikeAnActionId(FakeConnector):
    """A destination that is itself an agentium-graph service answers with its own id."""

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        outcome = await super().dispatch(request)
        return ActionOutcome(output=outcome.output, result_ref="act_0123456789abcdef01234567")


async def test_a_destination_handle_shaped_like_an_action_id_is_kept() -> None:
    conn = OwnIdShapedLikeAnActionId(Destination())
    rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=CountingStore())
    await rt.create("p", program(PLAN))
    assert (await rt.run("p")).output["charge"]["amount"] == 500
    [action] = (await rt.inspect("p")).actions
    assert action.state == "confirmed"
    assert action.result_ref_returned == "act_0123456789abcdef01234567"
