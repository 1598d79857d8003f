"""Review 20: what a new user hit by doing ordinary things a little carelessly.

* Two ``run(key)`` calls at once on one runtime (the default ``worker_id``) took the lease
  from each other: the second fenced the first out, so a payment the destination confirmed
  to the first never reached the journal and the task ended ``recovery_required``; with
  pure tools every node ran twice. The second call now gets ``LeaseHeldError``
  (``same_runtime``), or waits for the first with ``wait=True``.
* ``effect_timeout=nan`` / ``lookup_timeout=nan`` were accepted, then timed effects out at
  once.
* The same ``create`` re-sent after a deploy that only added an unrelated binding raised
  ``TaskConflictError`` (catalog_digest) telling the caller to re-send what it had re-sent.
* A tool exception whose ``__str__`` raises was journaled as that RuntimeError; a returned
  dict subclass whose ``items()`` raises failed as a tool error, not an output error.
* A planner answer holding a 5,000-digit integer was diagnosed as "ValueError".
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    LeaseHeldError,
    NodeFailedError,
    NodeOutputError,
    PlannerConfig,
    PlanValidationError,
    TaskConflictError,
    ToolBinding,
    Unknown,
)
from agentium_graph.errors import ErrorInfo, described
from agentium_graph.testing import ScriptedProvider, ScriptedTurn
from agentium_graph_sqlite import SQLiteDurableTaskStore


def plan(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": list(nodes)}


def node(node_id: str, binding: str, *after: str) -> dict[str, Any]:
    args: dict[str, Any] = {f"in_{a}": {"$ref": {"node": a}} for a in after}
    return {"id": node_id, "binding": binding, "version": "1", "args": args}


class Bank:
    """A destination that applies each charge it is sent, slowly, and keeps no lookup."""

    id = "bank"
    version = "1"
    idempotent_destination = False

    def __init__(self) -> None:
        self.dispatched: list[str] = []

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched.append(request.action_id)
        await asyncio.sleep(0.3)
        return ActionOutcome(output={"charged": True}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> Unknown:
        return Unknown("no lookup here")


# --- 1. two run() calls at once on one runtime -------------------------------------------

async def test_a_second_run_of_a_running_task_is_refused_and_the_first_keeps_it(
        tmp_path: Path) -> None:
    bank = Bank()
    catalog = HostCatalog([ToolBinding(id="pay", version="1", connector=bank,
                                       destination="bank")])
    async with SQLiteDurableTaskStore(tmp_path / "t.db") as store:
        runtime = ExecutionGraphRuntime(catalog=catalog, store=store)
        await runtime.create("order-1", ExecutionGraphProgram(
            id="p", version="1", plan=plan(node("pay", "pay"))))
        first, second = await asyncio.gather(runtime.run("order-1"), runtime.run("order-1"),
                                             return_exceptions=True)
        assert not isinstance(first, BaseException), first
        assert first.status == "completed" and first.output == {"pay": {"charged": True}}
        assert isinstance(second, LeaseHeldError), second
        assert second.same_runtime and second.details["same_runtime"] is True
        assert second.holder == "worker" and "already being run by this runtime" in str(second)
        assert "wait=True" in str(second)
        view = await runtime.inspect("order-1")
        assert bank.dispatched == [a.action_id for a in view.actions]  # dispatched once
        assert [a.state for a in view.actions] == ["confirmed"]


async def test_a_second_run_with_wait_gets_the_result_without_running_anything_again() -> None:
    calls: list[str] = []

    async def step(args: dict[str, Any]) -> dict[str, Any]:
        calls.append("x")
        await asyncio.sleep(0.05)
        return {"n": len(calls)}

    catalog = HostCatalog([ToolBinding(id="step", version="1", execute=step, recovery="pure")])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1", plan=plan(
        node("a", "step"), node("b", "step", "a"), node("c", "step", "b"))))
    first, second = await asyncio.gather(runtime.run("k"), runtime.run("k", wait=True))
    assert len(calls) == 3  # each node once (before: 6, the second run fenced the first)
    assert first.output == second.output and first.status == second.status == "completed"


async def test_a_run_of_another_task_or_after_the_first_ended_is_not_refused() -> None:
    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {}

    catalog = HostCatalog([ToolBinding(id="t", version="1", execute=tool, recovery="pure")])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    program = ExecutionGraphProgram(id="p", version="1", plan=plan(node("a", "t")))
    for key in ("k1", "k2"):
        await runtime.create(key, program)
    done = await asyncio.gather(runtime.run("k1"), runtime.run("k2"))
    assert [r.status for r in done] == ["completed", "completed"]
    assert (await runtime.run("k1")).status == "completed"  # the claim ended with the call


async def test_a_refused_second_run_leaves_no_claim_behind() -> None:
    release = asyncio.Event()

    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return {}

    catalog = HostCatalog([ToolBinding(id="t", version="1", execute=tool, recovery="pure")])
    runtime = ExecutionGraphRuntime(catalog=catalog)
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1",
                                                    plan=plan(node("a", "t"))))
    running = asyncio.ensure_future(runtime.run("k"))
    await asyncio.sleep(0.05)
    with pytest.raises(LeaseHeldError):
        await runtime.run("k")
    release.set()
    assert (await running).status == "completed"
    assert (await runtime.run("k")).status == "completed"


# --- 2. NaN timeouts ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["effect_timeout", "lookup_timeout"])
@pytest.mark.parametrize("value", [math.nan, 0, -1.0])
def test_a_timeout_that_is_not_a_positive_number_is_refused(name: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=name):
        ExecutionGraphRuntime(catalog=HostCatalog([]), **{name: value})


def test_lookup_attempts_out_of_range_names_itself() -> None:
    with pytest.raises(ConfigurationError, match=r"lookup_attempts .* got 11"):
        ExecutionGraphRuntime(catalog=HostCatalog([]), lookup_attempts=11)


# --- 3. create re-sent after a deploy ----------------------------------------------------

def _lookup(args: dict[str, Any]) -> dict[str, Any]:
    return {"amount": 1}


QUOTE = ExecutionGraphProgram(id="quote", version="1", plan=plan(node("price", "lookup")))


async def test_the_same_create_after_an_unrelated_binding_was_added_is_a_redelivery(
        tmp_path: Path) -> None:
    lookup = ToolBinding(id="lookup", version="1", execute=_lookup, recovery="pure")
    other = ToolBinding(id="other", version="2", execute=_lookup, recovery="pure")
    async with SQLiteDurableTaskStore(tmp_path / "t.db") as store:
        before = await ExecutionGraphRuntime(catalog=HostCatalog([lookup]),
                                             store=store).create("quote-1", QUOTE)
        deployed = ExecutionGraphRuntime(catalog=HostCatalog([lookup, other]), store=store)
        again = await deployed.create("quote-1", QUOTE)
        assert again.catalog_digest == before.catalog_digest  # the task keeps what it pinned
        assert again.status == before.status == "pending"
        assert (await deployed.run("quote-1")).output == {"price": {"amount": 1}}


async def test_the_same_create_after_a_used_binding_changed_is_still_a_conflict() -> None:
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="lookup", version="1", execute=_lookup, recovery="pure")]))
    await runtime.create("quote-1", QUOTE)
    changed = ExecutionGraphRuntime(store=runtime.store, catalog=HostCatalog([
        ToolBinding(id="lookup", version="1", execute=_lookup, recovery="pure",
                    output_schema={"type": "object"})]))
    with pytest.raises(TaskConflictError) as caught:
        await changed.create("quote-1", QUOTE)
    assert "descriptors" in caught.value.differing


# --- 4. exceptions and outputs that fail while being read --------------------------------

class Declined(Exception):
    def __str__(self) -> str:
        raise RuntimeError("formatting bug")


def test_an_exception_whose_str_raises_is_recorded_as_itself() -> None:
    info = ErrorInfo.from_exception(Declined())
    assert info.details["exception_type"] == "Declined"
    assert info.message == "Declined: <its str() raised RuntimeError>"
    assert described(Declined()) == "Declined: <its str() raised RuntimeError>"
    assert described(ValueError()) == "ValueError"
    assert described(ValueError("bad")) == "ValueError: bad"


async def test_a_tool_raising_an_unprintable_exception_fails_its_node_with_it() -> None:
    def charge(args: dict[str, Any]) -> dict[str, Any]:
        raise Declined

    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="charge", version="1", execute=charge, recovery="pure")]))
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1",
                                                    plan=plan(node("c", "charge"))))
    with pytest.raises(NodeFailedError) as caught:
        await runtime.run("k")
    assert caught.value.cause.details["exception_type"] == "Declined"
    assert caught.value.cause.code == "tool_error"


class ItemsRaise(dict[str, Any]):
    def items(self) -> Any:
        raise RuntimeError("items boom")

    def __iter__(self) -> Any:
        raise RuntimeError("iter boom")


async def test_an_output_whose_items_raise_is_an_output_error_naming_the_node() -> None:
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="t", version="1", execute=lambda args: ItemsRaise(x=1),
                    recovery="pure")]))
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1",
                                                    plan=plan(node("n", "t"))))
    with pytest.raises(NodeFailedError) as caught:
        await runtime.run("k")
    cause = caught.value.cause
    assert cause.code == NodeOutputError.code and cause.node_id == "n"
    assert "RuntimeError raised while reading it (items boom)" in cause.message


class RaisesOnDispatch:
    id = "odd"
    version = "1"
    idempotent_destination = False

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        raise Declined

    async def resolve_result(self, result_ref: str) -> Unknown:
        raise Declined


async def test_a_connector_raising_an_unprintable_exception_is_an_uncertain_action() -> None:
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="pay", version="1", connector=RaisesOnDispatch(), destination="d")]))
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1",
                                                    plan=plan(node("pay", "pay"))))
    with pytest.raises(Exception) as caught:
        await runtime.run("k")
    assert type(caught.value).__name__ == "DurableRecoveryRequiredError"
    view = await runtime.inspect("k")
    (action,) = view.actions
    assert action.state == "uncertain"
    assert action.reason is not None and "Declined: <its str() raised RuntimeError>" in \
        action.reason


# --- 5. a planner answer with a huge integer ---------------------------------------------

async def test_a_planner_answer_with_a_huge_integer_says_so() -> None:
    answer = ('{"schemaVersion": 1, "revision": 1, "nodes": [{"id": "n", "binding": "t", '
              '"version": "1", "args": {"x": ' + "9" * 5000 + '}}]}')
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="t", version="1", execute=lambda args: {}, recovery="pure")]))
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1", planner=PlannerConfig(
        provider=ScriptedProvider([ScriptedTurn(text=answer)]), host_instructions="plan",
        max_corrections=0)))
    with pytest.raises(PlanValidationError) as caught:
        await runtime.run("k")
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "proposal_not_json"
    assert "integer of more than 4300 digits" in diagnostic.message
    assert "string" in diagnostic.message
