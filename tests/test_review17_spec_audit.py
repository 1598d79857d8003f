"""An outside audit of the public contract (SPEC.md), written as an SDK consumer would.

Only names ``agentium_graph`` (and ``agentium_graph.testing``) export are used. Each test
is a place where the code disagreed with the contract or with "a clear typed error naming
the field, nothing journaled":

* the typed errors could not be copied or pickled (``copy.copy``, ``copy.deepcopy``,
  ``pickle``: what ``concurrent.futures``' process pools, multiprocessing and many task
  queues do with an exception): every error whose constructor takes its fields raised a
  bare ``TypeError`` (``LeaseHeldError``, ``StaleFenceError``, ``TaskConflictError``,
  ``BudgetExhaustedError``, ``DurableRecoveryRequiredError``), ``PlanValidationError`` an
  ``AttributeError``, and ``TaskNotFoundError`` came back naming its own message as key;
* a connector, or a model provider, passed as a class instead of an instance
  (``connector=MyConnector``) was accepted: the effect's ``dispatch`` then failed with a
  ``TypeError`` about a missing argument and the task ended ``recovery_required`` with an
  uncertain action, where a ``ConfigurationError`` at construction was due;
* ``admission_snapshot(key)`` of a task no worker is running reported the runtime's
  default ``capacity`` instead of the ``max_concurrent_work`` the task pinned at create.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentiumGraphError,
    BudgetExhaustedError,
    ConfigurationError,
    DataIntegrityError,
    Diagnostic,
    DurableRecoveryRequiredError,
    ErrorInfo,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    LeaseHeldError,
    NodeFailedError,
    NodeOutputError,
    PlannerConfig,
    PlanValidationError,
    ResolutionConflictError,
    RootLimits,
    StaleFenceError,
    StoreUnavailableError,
    TaskCanceledError,
    TaskConflictError,
    TaskNotFoundError,
    ToolBinding,
    Unknown,
)
from agentium_graph.testing import ScriptedProvider

# --- errors survive copy and pickle --------------------------------------------------

EXPIRES = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

ERRORS: dict[str, Callable[[], AgentiumGraphError]] = {
    "root": lambda: AgentiumGraphError("m", node_id="n", details={"a": 1}),
    "configuration": lambda: ConfigurationError("bad limits", details={"field": "x"}),
    "plan": lambda: PlanValidationError([Diagnostic(path="$.nodes[0].binding",
                                                    code="unknown_binding", message="m",
                                                    node_id="a")]),
    "not_found": lambda: TaskNotFoundError("k"),
    "conflict": lambda: TaskConflictError("k", ["input", "grants"]),
    "lease": lambda: LeaseHeldError("k", "w1", EXPIRES),
    "fence": lambda: StaleFenceError("k", 1, 2),
    "budget": lambda: BudgetExhaustedError("k", "tool_calls", 2, 1, 2, node_id="n"),
    "node": lambda: NodeFailedError("node 'n' failed", node_id="n",
                                    cause=ErrorInfo(code="tool_error", message="boom")),
    "output": lambda: NodeOutputError("bad output", node_id="n"),
    "recovery": lambda: DurableRecoveryRequiredError("k", ["act_1", "act_2"], "lookup down"),
    "resolution": lambda: ResolutionConflictError("again", details={"retryable": True}),
    "canceled": lambda: TaskCanceledError("task 'k' was canceled: stop"),
    "integrity": lambda: DataIntegrityError("damaged"),
    "unavailable": lambda: StoreUnavailableError("busy", details={"attempts": 3}),
}

FIELDS = ("key", "holder", "expires_at", "fence", "current", "differing", "counter", "used",
          "requested", "limit", "action_ids", "cause", "diagnostics")


def _roundtrip(how: str, error: AgentiumGraphError) -> Any:
    if how == "pickle":
        return pickle.loads(pickle.dumps(error))
    return copy.copy(error) if how == "copy" else copy.deepcopy(error)


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
@pytest.mark.parametrize("name", sorted(ERRORS))
def test_every_error_survives_copy_and_pickle_with_its_fields(name: str, how: str) -> None:
    error = ERRORS[name]()
    again = _roundtrip(how, error)
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert again.code == error.code
    assert again.node_id == error.node_id and again.details == error.details
    assert again.to_info() == error.to_info()
    for field in FIELDS:
        assert getattr(again, field, None) == getattr(error, field, None), field


async def test_a_raised_error_pickles_as_the_runtime_raised_it() -> None:
    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        return {}
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="t", version="1", execute=tool, recovery="pure")]))
    with pytest.raises(PlanValidationError) as caught:
        await runtime.create("k", ExecutionGraphProgram(id="p", version="1", plan={
            "schemaVersion": 1, "revision": 1,
            "nodes": [{"id": "a", "binding": "nope", "version": "1", "args": {}}]}))
    again = pickle.loads(pickle.dumps(caught.value))
    assert [d.code for d in again.diagnostics] == ["unknown_binding"]
    assert str(again) == str(caught.value)


# --- a class where an instance is due ----------------------------------------------------

class PayConnector:
    id = "pay"
    version = "1"
    idempotent_destination = False

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        return ActionOutcome(output={"ok": True}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Unknown:
        return Unknown("never")


class FakeModel:
    id = "fake"
    version = "1"

    async def complete(self, request: Any) -> Any:
        raise AssertionError("never called")

    async def stream(self, request: Any) -> Any:
        raise AssertionError("never called")


def test_a_connector_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="PayConnector") as caught:
        ToolBinding(id="pay", version="1", connector=PayConnector, destination="psp")
    assert "instance" in str(caught.value)
    # the instance is what works
    ToolBinding(id="pay", version="1", connector=PayConnector(), destination="psp")


@pytest.mark.parametrize("provider", [FakeModel, ScriptedProvider])
@pytest.mark.parametrize("build", ["agent", "planner"])
def test_a_provider_class_instead_of_an_instance_is_refused(provider: type,
                                                              build: str) -> None:
    with pytest.raises(ConfigurationError, match=provider.__name__) as caught:
        if build == "agent":
            Agent(provider, "answer briefly")
        else:
            PlannerConfig(provider, "plan it")
    assert "instance" in str(caught.value)


# --- admission_snapshot --------------------------------------------------------------

async def test_snapshot_capacity_is_the_tasks_pinned_concurrency() -> None:
    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        return {}
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([
        ToolBinding(id="t", version="1", execute=tool, recovery="pure")]))
    await runtime.create("k", ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "a", "binding": "t", "version": "1", "args": {}}]}),
        limits=RootLimits(max_concurrent_work=1))
    snapshot = await runtime.admission_snapshot("k")
    assert (snapshot.active, snapshot.queued) == (0, 0)
    assert snapshot.capacity == 1
    other = ExecutionGraphRuntime(catalog=HostCatalog([]), store=runtime.store)
    assert (await other.admission_snapshot("k")).capacity == 1
