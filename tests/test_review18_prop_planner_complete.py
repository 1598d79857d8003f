"""Property-based tests of complete-mode planning, with and without crashes.

Hypothesis draws, per proposal (``1 + max_corrections`` of them), what the planner answers:
a valid plan (plain or in a fenced block), text that is not JSON, an unknown binding, a
binding the task was not granted, the wrong revision, a tool call, more nodes than the
expansion allowance, or a provider error. Without interruptions the task must end as the
first valid proposal says (or fail with the last proposal's diagnostics, or with
PlannerFailedError); interrupted at random store writes and recovered by fresh runtimes, it
must end the same way: recorded responses replay without a provider call or a new charge
(each proposal's response and verdict are journaled once), completed nodes never re-run and
nothing is refunded. Deterministic in CI; ``HYPOTHESIS_PROFILE=deep`` runs more.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    PlannerFailedError,
    PlanValidationError,
    RootLimits,
    StoreUnavailableError,
    TaskCanceledError,
    TaskView,
    ToolBinding,
    tool_context,
)
from agentium_graph.providers import ProviderError, ToolCall, Usage
from agentium_graph.testing import ScriptedProvider, ScriptedTurn, TurnMatch
from tests.test_review18_prop_planner import Executions, check_progress
from tests.test_review18_prop_runtime import Crash, Fault, Faulty, Stores, _clock

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
KEY = "planned"
LEASE_TTL = 15.0
RESERVE = 50
ALLOWANCE = 4  # max_expanded_nodes of every task
pytestmark = pytest.mark.timeout(7200 if DEEP else 120)
KINDS = ("not_json", "good", "unknown", "fenced", "ungranted", "good", "revision", "tool_call",
         "good", "too_many", "raise")
CODES = {"not_json": "proposal_not_json", "unknown": "unknown_binding",
         "ungranted": "binding_not_granted", "revision": "revision_mismatch",
         "tool_call": "planner_tool_call", "too_many": "expansion_limit"}
INC_IN = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
INT_OUT = {"type": "object", "properties": {"value": {"type": "integer"}},
           "required": ["value"], "additionalProperties": False}


def prop_settings(examples: int) -> settings:
    return settings(derandomize=not DEEP, deadline=None,
                    max_examples=examples * 25 if DEEP else examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    database=None, phases=[Phase.explicit, Phase.generate, Phase.shrink])


@dataclass(frozen=True)
class Proposal:
    kind: str
    xs: tuple[int, ...]  # the plan: a chain n0 <- n1 <- ..., n0's x a literal

    def plan(self, revision: int = 1) -> dict[str, Any]:
        nodes: list[dict[str, Any]] = []
        for i, x in enumerate(self.xs):
            arg: Any = x if i == 0 else {"$ref": {"node": f"n{i - 1}", "path": ["value"]}}
            nodes.append({"id": f"n{i}", "binding": "inc", "version": "1", "args": {"x": arg}})
        return {"schemaVersion": 1, "revision": revision, "nodes": nodes}

    def outputs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        value = self.xs[0]
        for i in range(len(self.xs)):
            value += 1
            out[f"n{i}"] = {"value": value}
        return out

    def turn(self, index: int) -> ScriptedTurn:
        usage = Usage(input_tokens=10, output_tokens=20)
        match = TurnMatch(metadata={"proposal": index})
        plan = self.plan()
        if self.kind == "raise":
            return ScriptedTurn(fail=ProviderError("the planner's provider is down"),
                                match=match)
        if self.kind == "tool_call":
            return ScriptedTurn(tool_calls=(ToolCall(id="c1", name="inc", arguments={}),),
                                usage=usage, match=match)
        if self.kind == "not_json":
            return ScriptedTurn(text="Here is the plan: {nodes: ...}", usage=usage, match=match)
        if self.kind == "fenced":
            return ScriptedTurn(text=f"```json\n{json.dumps(plan)}\n```", usage=usage,
                                match=match)
        if self.kind == "unknown":
            plan["nodes"][0]["binding"] = "teleport"
        elif self.kind == "ungranted":
            plan["nodes"][0]["binding"] = "secret"
        elif self.kind == "revision":
            plan["revision"] = 2
        elif self.kind == "too_many":
            plan = Proposal("good", (1,) * (ALLOWANCE + 1)).plan()
        return ScriptedTurn(text=json.dumps(plan), usage=usage, match=match)

    @property
    def valid(self) -> bool:
        return self.kind in ("good", "fenced")


@dataclass(frozen=True)
class Script:
    proposals: tuple[Proposal, ...]

    def turns(self) -> list[ScriptedTurn]:
        # Each proposal answered as often as it is asked (a crash may lose an answer).
        return [p.turn(i) for i, p in enumerate(self.proposals) for _ in range(4)]

    def expected(self) -> tuple[str, int, Proposal | None]:
        """(outcome, proposals answered, the accepted proposal)."""
        for i, p in enumerate(self.proposals):
            if p.kind == "raise":
                return "PlannerFailedError", i, None
            if p.valid:
                return "completed", i + 1, p
        return "PlanValidationError", len(self.proposals), None


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    count = draw(st.integers(1, 4))
    return Script(tuple(
        Proposal(draw(st.sampled_from(KINDS)),
                 tuple(draw(st.lists(st.integers(-5, 5), min_size=1, max_size=ALLOWANCE))))
        for _ in range(count)))


def catalog(executions: Executions) -> HostCatalog:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        executions.log.append((executions.run, tool_context().node_id))
        return {"value": args["x"] + 1}

    def secret(args: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("never granted, never run")

    return HostCatalog([
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                    input_schema=INC_IN, output_schema=INT_OUT),
        ToolBinding(id="secret", version="1", execute=secret, recovery="pure",
                    input_schema=INC_IN, output_schema=INT_OUT)])


def program(script: Script, provider: ScriptedProvider) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="Plan the arithmetic.",
        max_corrections=len(script.proposals) - 1, max_output_tokens=RESERVE))


@dataclass
class Result:
    error: BaseException | None
    output: dict[str, Any] | None
    view: TaskView
    journal: list[Any]
    providers: list[ScriptedProvider]
    fired: int
    executions: Executions = field(default_factory=Executions)


async def drive(script: Script, stores: Stores, faults: list[Fault]) -> Result:
    executions = Executions()
    providers: list[ScriptedProvider] = []
    offset = timedelta(0)
    observer = ExecutionGraphRuntime(catalog=catalog(executions), store=stores.open())

    def runtime(store: Faulty) -> ExecutionGraphRuntime:
        provider = ScriptedProvider(script.turns())
        providers.append(provider)

        async def cancel() -> None:
            await observer.cancel(KEY, "an operator stopped it")
        store.canceler = cancel
        return ExecutionGraphRuntime(catalog=catalog(executions), store=store,
                                     clock=_clock(offset), lease_ttl=LEASE_TTL,
                                     poll_interval=0.005,
                                     programs=[program(script, provider)])

    queue = list(faults)
    store = Faulty(stores.open(), queue.pop(0) if queue else None)
    rt = runtime(store)
    await rt.create(KEY, program(script, providers[-1]), grants=["inc"],
                    limits=RootLimits(max_expanded_nodes=ALLOWANCE))
    views = [await observer.inspect(KEY)]
    fired = 0
    error: BaseException | None = None
    output: dict[str, Any] | None = None
    for run in range(len(faults) + 4):
        executions.run = run
        task = asyncio.create_task(rt.run(KEY, f"w{run}"))
        await asyncio.wait([task], timeout=60)
        assert task.done(), "a run did not end within 60 s"
        fired += store.fired
        error = None
        cancelled = task.cancelled()
        if not cancelled:
            error = task.exception()
            if error is None:
                output = task.result().output
        view = await observer.inspect(KEY)
        assert view.verified, view.problems
        check_progress(views[-1], view, executions, run)
        views.append(view)
        if output is not None or isinstance(error, PlanValidationError | PlannerFailedError |
                                            TaskCanceledError):
            break
        assert cancelled or isinstance(error, Crash | StoreUnavailableError), error
        offset += timedelta(seconds=LEASE_TTL * 2 + 1)  # a fresh worker takes over
        store = Faulty(stores.open(), queue.pop(0) if queue else None)
        rt = runtime(store)
    else:
        raise AssertionError("the task never settled")
    journal = list((await observer.timeline(KEY, limit=1000)).events)
    return Result(error, output, views[-1], journal, providers, fired, executions)


def check(script: Script, res: Result, interrupted: bool) -> None:
    outcome, answered, accepted = script.expected()
    event(f"expected: {outcome}")
    view = res.view
    if isinstance(res.error, TaskCanceledError):
        assert interrupted and view.status == "canceled"
        return
    responses = [e for e in res.journal if e.kind == "planner_response"]
    verdicts = [e.data for e in res.journal if e.kind == "plan_proposal"]
    assert [v["proposal"] for v in verdicts] == list(range(answered)), verdicts
    assert len(responses) == answered  # each answer journaled once, replayed after that
    judged = ([False] * (answered - 1) + [accepted is not None]) if answered else []
    assert [v["accepted"] for v in verdicts] == judged
    for verdict, proposal in zip(verdicts, script.proposals, strict=False):
        if not verdict["accepted"]:
            assert CODES[proposal.kind] in {d["code"] for d in verdict["diagnostics"]}
    made = sum(p.call_count for p in res.providers)
    asked = answered + (1 if outcome == "PlannerFailedError" else 0)
    assert view.counters["model_calls"] >= asked
    assert made >= asked
    if not interrupted:
        assert made == view.counters["model_calls"] == asked
        assert view.counters["output_tokens"] == RESERVE * asked
    else:  # an interrupted call is asked (and charged) again; a recorded one never
        assert view.counters["model_calls"] <= asked + res.fired
        assert made <= asked + res.fired
    assert view.planner is not None
    assert (view.planner.proposals, view.planner.rejected) == \
        (answered, answered - (accepted is not None))
    if accepted is not None:
        assert res.error is None, res.error
        assert res.output == accepted.outputs()
        assert view.revision == 1 and view.status == "completed"
        assert view.planner.state == "planned"
        assert view.counters["expanded_nodes"] == len(accepted.xs)
        counts = res.executions.count()
        assert set(counts) == set(accepted.outputs())
        if not interrupted:
            assert all(n == 1 for n in counts.values()), counts
        return
    assert view.status == "failed" and view.revision == 0 and not view.nodes
    assert view.planner.state == "failed"
    if outcome == "PlanValidationError":
        assert isinstance(res.error, PlanValidationError), res.error
        last = script.proposals[-1]
        assert CODES[last.kind] in {d.code for d in res.error.diagnostics}
    else:
        assert isinstance(res.error, PlannerFailedError), res.error


def run(script: Script, kind: str, faults: list[Fault]) -> Result:
    async def main() -> Result:
        with tempfile.TemporaryDirectory() as directory:
            stores = Stores(kind, directory)
            try:
                return await drive(script, stores, faults)
            finally:
                await stores.close()

    return asyncio.run(main())


@prop_settings(60)
@given(script=scripts(), kind=st.sampled_from(("memory", "sqlite")))
def test_complete_planning_matches_the_model(script: Script, kind: str) -> None:
    check(script, run(script, kind, []), interrupted=False)


FAULT_MODES = ("crash_after", "crash_before", "cancel", "unavailable_after", "operator_cancel",
               "unavailable_before")


@prop_settings(100)
@given(script=scripts(), kind=st.sampled_from(("sqlite", "memory")),
       faults=st.lists(st.builds(Fault, st.integers(1, 8), st.sampled_from(FAULT_MODES),
                                 st.just(True)), min_size=1, max_size=3))
def test_interrupted_complete_planning_ends_as_the_model_says(
        script: Script, kind: str, faults: list[Fault]) -> None:
    res = run(script, kind, faults)
    event(f"faults fired: {res.fired}")
    check(script, res, interrupted=True)
