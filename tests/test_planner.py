"""Planner programs (complete mode): proposals checked, corrected, journaled and replayed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    ConfigurationError,
    DescriptorMismatchError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    PlannerConfig,
    PlannerFailedError,
    PlanValidationError,
    RootLimits,
    TaskCanceledError,
    TaskConflictError,
)
from agentium_graph.providers import (
    ProviderError,
    ScriptedProvider,
    ScriptedTurn,
    ToolCall,
    TurnMatch,
    Usage,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult
from tests.conftest import Calls, CountingStore, make_catalog, wait_until

GOOD = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "inc", "version": "1",
     "args": {"x": {"$ref": {"node": "$input", "path": ["start"]}}}},
    {"id": "b", "binding": "inc", "version": "1",
     "args": {"x": {"$ref": {"node": "a", "path": ["value"]}}}}]}
UNKNOWN = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "teleport", "version": "1", "args": {}}]}
USAGE = Usage(input_tokens=100, output_tokens=20)


def turn(plan: Any, proposal: int | None = None, **kw: Any) -> ScriptedTurn:
    text = plan if isinstance(plan, str) else json.dumps(plan)
    match = None if proposal is None else TurnMatch(metadata={"proposal": proposal})
    return ScriptedTurn(text=text, usage=USAGE, match=match, **kw)


def planned(provider: ScriptedProvider, **kw: Any) -> ExecutionGraphProgram:
    config = PlannerConfig(provider=provider, host_instructions="Plan the arithmetic.",
                           max_output_tokens=200, **kw)
    return ExecutionGraphProgram(id="planned", version="1", planner=config)


def kinds(events: Any) -> list[str]:
    return [e.kind for e in events]


async def journal(rt: ExecutionGraphRuntime, key: str) -> list[Any]:
    return list((await rt.timeline(key, limit=1000)).events)


async def test_an_accepted_proposal_is_committed_as_revision_1_and_runs(calls: Calls) -> None:
    provider = ScriptedProvider([turn(GOOD)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    created = await rt.create("t", planned(provider), input={"start": 40})
    assert created.revision == 0 and created.nodes == {} and created.status == "pending"
    assert created.counters["plan_revisions"] == 0 and created.counters["expanded_nodes"] == 0

    result = await rt.run("t")
    assert result.output == {"a": {"value": 41}, "b": {"value": 42}}
    assert created.planner is not None and created.planner.state == "planning"
    assert created.planner.proposals == 0 and created.planner.plan_digest is None
    view = await rt.inspect("t")
    assert view.revision == 1 and view.verified and set(view.nodes) == {"a", "b"}
    assert view.counters["plan_revisions"] == 1 and view.counters["expanded_nodes"] == 2
    assert view.planner is not None and view.planner.state == "planned"
    assert (view.planner.proposals, view.planner.rejected) == (1, 0)
    assert view.planner.mode == "complete" and view.planner.max_corrections == 2
    assert view.planner.provider == {"id": provider.id, "version": provider.version}
    assert view.counters["model_calls"] == 1
    # The reservation (max_output_tokens) is charged before the call and never refunded.
    assert view.counters["output_tokens"] == 200

    (request,) = provider.calls
    assert request.tools == () and request.max_output_tokens == 200
    system, user = request.model_messages
    assert system.role == "system" and system.content.startswith("Plan the arithmetic.")
    data = json.loads(user.content)  # everything but the host's instructions is data
    assert data["task_input"] == {"start": 40}
    assert [(c["binding"], c["version"]) for c in data["catalog"]] == [("add", "1"),
                                                                       ("inc", "1")]

    events = await journal(rt, "t")
    proposals = [e for e in events if e.kind == "plan_proposal"]
    assert [p.data["accepted"] for p in proposals] == [True]
    committed = [e for e in events if e.kind == "revision_committed"]
    assert [e.data["plan_digest"] for e in committed] == [proposals[0].data["plan_digest"]]
    assert kinds(events).index("planner_response") < kinds(events).index("node_added")


async def test_the_first_planner_request_is_pinned(calls: Calls) -> None:
    # Recorded responses replay by request digest: a change to the request's wording or
    # layout would make every planned task stored by an earlier version ask again (and pay
    # again). Change this digest only with a migration story for stored tasks.
    provider = ScriptedProvider([turn(GOOD)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", planned(provider), input={"start": 40})
    await rt.run("t")
    assert provider.calls[0].digest() == \
        "sha256:acf1ba6b89e6d1ced7a5467dc2b7ec95d8a7d6305a22d9d7117fb7ca2518214d"


async def test_the_committed_plan_is_found_from_the_header_or_the_journal(
        calls: Calls) -> None:
    from agentium_graph.runtime._planner import committed_plan

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", planned(ScriptedProvider([turn(GOOD)])), input={"start": 1})
    await rt.run("t")
    header = await rt.store.get_header("t")
    assert header is not None and header.plan_digest is not None
    found = await committed_plan(rt.store, header)
    # A header written before headers carried the digest: the journal says which plan.
    assert await committed_plan(rt.store, header.model_copy(update={"plan_digest": None})) \
        == found
    assert found[0] == GOOD and found[1] == header.plan_digest


async def test_inspect_reads_the_journal_only_up_to_the_plan(
        calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every planning entry precedes the commit of revision 1: inspecting a planned task
    # that ran for long reads that far, not its whole journal.
    from agentium_graph.runtime import _planner

    monkeypatch.setattr(_planner, "JOURNAL_PAGE", 20)
    pages: list[int] = []

    class PageCounting(InMemoryDurableTaskStore):
        async def read_timeline(self, request: Any) -> Any:
            pages.append(request.after_seq)
            return await super().read_timeline(request)

    wide = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": f"n{i}", "binding": "inc", "version": "1", "args": {"x": i}}
        for i in range(30)]}
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=PageCounting())
    created = await rt.create("w", planned(ScriptedProvider([turn(wide)])))
    assert pages == [] and created.planner is not None  # just created: nothing to read
    await rt.run("w")
    header = await rt.store.get_header("w")
    assert header is not None and header.journal_seq > 100  # at least five pages
    pages.clear()
    view = await rt.inspect("w")
    assert view.planner is not None and view.planner.proposals == 1
    assert view.planner.state == "planned" and view.planner.calls == 1
    # Revision 1's commit (30 nodes added) ends on the second page; then the journal's last
    # entry, which inspect checks against the header.
    assert len(pages) == 3 and pages[2] == header.journal_seq - 1


async def test_a_rejected_proposal_is_corrected_with_its_diagnostics(calls: Calls) -> None:
    provider = ScriptedProvider([turn(UNKNOWN, 0), turn(GOOD, 1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", planned(provider), input={"start": 1})
    result = await rt.run("t")
    assert result.output["b"] == {"value": 3}

    first, second = provider.calls
    assert second.model_messages[:2] == first.model_messages
    assistant, feedback = second.model_messages[2:]
    assert assistant.role == "assistant" and json.loads(assistant.content) == UNKNOWN
    diagnostics = json.loads(feedback.content)["diagnostics"]
    assert any("teleport" in d["message"] for d in diagnostics)

    proposals = [e for e in await journal(rt, "t") if e.kind == "plan_proposal"]
    assert [p.data["accepted"] for p in proposals] == [False, True]
    assert proposals[0].data["diagnostics"] == diagnostics
    view = await rt.inspect("t")
    assert view.counters["model_calls"] == 2 and view.counters["plan_revisions"] == 1
    assert view.planner is not None and view.planner.state == "planned"
    assert (view.planner.proposals, view.planner.rejected) == (2, 1)
    assert view.planner.plan_digest == proposals[1].data["plan_digest"]
    assert [d.model_dump(exclude_none=True) for d in view.planner.last_diagnostics] == \
        diagnostics


async def test_exhausted_corrections_fail_with_the_last_validation_cause(calls: Calls) -> None:
    provider = ScriptedProvider([turn(UNKNOWN, 0), turn("not json at all", 1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", planned(provider, max_corrections=1), input={"start": 1})
    with pytest.raises(PlanValidationError) as failed:
        await rt.run("t")
    assert [d.code for d in failed.value.diagnostics] == ["proposal_not_json"]
    view = await rt.inspect("t")
    assert view.status == "failed" and view.nodes == {} and view.revision == 0
    assert calls.by_node == {} and provider.call_count == 2
    assert view.planner is not None and view.planner.state == "failed"
    assert (view.planner.proposals, view.planner.rejected) == (2, 2)
    assert view.planner.plan_digest is None and view.planner.max_corrections == 1
    assert [d.code for d in view.planner.last_diagnostics] == ["proposal_not_json"]
    # A later run raises the same typed error from what was stored, with no provider call.
    with pytest.raises(PlanValidationError) as again:
        await rt.run("t")
    assert [d.code for d in again.value.diagnostics] == ["proposal_not_json"]
    assert provider.call_count == 2
    for error in (failed.value, again.value):  # says what the host can change
        assert "host instructions" in str(error) and "submit it again" not in str(error)
    proposals = [e for e in await journal(rt, "t") if e.kind == "plan_proposal"]
    assert [p.data["accepted"] for p in proposals] == [False, False]


def _ref_to(node: str, *path: str) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1",
         "args": {"x": {"$ref": {"node": node, "path": list(path)}}}}]}


@pytest.mark.parametrize(("text", "code"), [
    ('{"schemaVersion": 1, "revision": 1, "nodes": [', "proposal_not_json"),
    (json.dumps({**GOOD, "revision": 2}), "revision_mismatch"),
    (json.dumps([GOOD]), "plan_shape"),
    (json.dumps(_ref_to("$previous")), "bad_reference"),  # no iterations at the root
    (json.dumps(_ref_to("$input", "begin")), "bad_reference_path"),  # the input has "start"
    # (review 46) A duplicated key: json.loads kept the last value, another reader of the
    # journaled answer would keep the first.
    ('{"schemaVersion": 1, "revision": 1, "nodes": [], "nodes": '
     + json.dumps(GOOD["nodes"]) + "}", "proposal_not_json"),
])
async def test_bad_proposals_name_what_is_wrong(calls: Calls, text: str, code: str) -> None:
    provider = ScriptedProvider([turn(text)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", planned(provider, max_corrections=0), input={"start": 1})
    with pytest.raises(PlanValidationError) as failed:
        await rt.run("t")
    assert code in [d.code for d in failed.value.diagnostics]


async def test_a_fenced_answer_is_read_and_a_tool_call_is_refused(calls: Calls) -> None:
    fenced = ScriptedProvider([turn("```json\n" + json.dumps(GOOD) + "\n```")])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("f", planned(fenced), input={"start": 0})
    assert (await rt.run("f")).output["b"] == {"value": 2}

    calling = ScriptedProvider([ScriptedTurn(tool_calls=(
        ToolCall(id="c1", name="inc", arguments={"x": 1}),), usage=USAGE)])
    rt2 = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt2.create("c", planned(calling, max_corrections=0), input={"start": 0})
    with pytest.raises(PlanValidationError) as failed:
        await rt2.run("c")
    assert [d.code for d in failed.value.diagnostics] == ["planner_tool_call"]


async def test_grants_and_the_expansion_allowance_bound_proposals(calls: Calls) -> None:
    uses_add = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "s", "binding": "add", "version": "1", "args": {"values": [1, 2]}}]}
    provider = ScriptedProvider([turn(uses_add)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("g", planned(provider, max_corrections=0), input={"start": 0},
                    grants=["inc"])
    with pytest.raises(PlanValidationError) as failed:
        await rt.run("g")
    assert "binding_not_granted" in [d.code for d in failed.value.diagnostics]
    offered = json.loads(provider.calls[0].model_messages[1].content)["catalog"]
    assert [c["binding"] for c in offered] == ["inc"]  # only granted bindings are offered

    small = ScriptedProvider([turn(GOOD)])
    await rt.create("x", planned(small, max_corrections=0), input={"start": 0},
                    limits=RootLimits(max_expanded_nodes=1))
    with pytest.raises(PlanValidationError) as over:
        await rt.run("x")
    assert [d.code for d in over.value.diagnostics] == ["expansion_limit"]


class CrashOnPlannerCommit(CountingStore):
    """Dies right after the n-th commit that journals a planner response."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        if any(isinstance(s, AppendJournal) and s.kind == "planner_response"
               for s in request.steps):
            self.after -= 1
            if self.after == 0:
                raise _Crash
        return result


class _Crash(BaseException):
    pass


async def test_recovery_replays_a_rejected_proposal_without_a_provider_call(
        calls: Calls) -> None:
    store = CrashOnPlannerCommit(after=1)
    first = ScriptedProvider([turn(UNKNOWN, 0), turn(GOOD, 1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    program = planned(first)
    await rt.create("r", program, input={"start": 5})
    with pytest.raises(_Crash):
        await rt.run("r", "w1")
    assert first.call_count == 1
    charged = (await rt.inspect("r")).counters["model_calls"]

    second = ScriptedProvider([turn(GOOD, 1)])  # has no answer for the first request
    fresh = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store,
                                  programs=[planned(second)])
    result = await fresh.run("r", "w1")
    assert result.output["b"] == {"value": 7}
    assert second.call_count == 1 and second.calls[0].metadata["proposal"] == 1
    view = await fresh.inspect("r")
    assert view.counters["model_calls"] == charged + 1
    proposals = [e for e in await journal(fresh, "r") if e.kind == "plan_proposal"]
    assert [p.data["accepted"] for p in proposals] == [False, True]


async def test_a_committed_plan_is_never_planned_again(calls: Calls) -> None:
    store = CrashOnPlannerCommit(after=1)
    first = ScriptedProvider([turn(GOOD)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("r", planned(first), input={"start": 0})
    with pytest.raises(_Crash):
        await rt.run("r", "w1")
    assert (await rt.inspect("r")).revision == 1

    silent = ScriptedProvider([])  # any call would raise ScriptExhaustedError
    fresh = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store,
                                  programs=[planned(silent)])
    assert (await fresh.run("r", "w1")).output["b"] == {"value": 2}
    assert silent.call_count == 0


async def test_a_worker_needs_the_planned_program_and_its_pinned_settings(
        calls: Calls) -> None:
    store = CountingStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("p", planned(ScriptedProvider([turn(GOOD)])), input={"start": 0})
    stranger = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    with pytest.raises(ConfigurationError, match="programs="):
        await stranger.run("p")
    changed = ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
        provider=ScriptedProvider([turn(GOOD)]), host_instructions="Something else."))
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store, programs=[changed])
    with pytest.raises(DescriptorMismatchError):
        await other.run("p")
    assert (await rt.inspect("p")).status == "pending"  # nothing was written


async def test_create_refuses_another_program_under_a_known_id_and_version(
        calls: Calls) -> None:
    # (review 46) create() replaced the program the runtime knew, so the task created with
    # the first one could no longer run on the runtime that created it.
    store = CountingStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    first = planned(ScriptedProvider([turn(GOOD)]))
    await rt.create("x", first, input={"start": 0})
    changed = ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
        provider=ScriptedProvider([turn(GOOD)]), host_instructions="Something else."))
    with pytest.raises(ConfigurationError, match="bump the version"):
        await rt.create("y", changed, input={"start": 0})
    assert await store.get_header("y") is None  # nothing stored
    await rt.create("x", first, input={"start": 0})  # the same program again: fine
    assert (await rt.run("x")).output["b"] == {"value": 2}


async def test_the_model_call_budget_is_enforced_before_the_planner_call(
        calls: Calls) -> None:
    provider = ScriptedProvider([turn(GOOD)])
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), on_admission=events.append)
    await rt.create("b", planned(provider), input={"start": 0},
                    budgets=Budgets(model_calls=0))
    with pytest.raises(BudgetExhaustedError) as refused:
        await rt.run("b")
    assert refused.value.counter == "model_calls"
    assert provider.call_count == 0
    view = await rt.inspect("b")
    assert view.status == "pending" and view.counters["model_calls"] == 0
    assert view.planner is not None and view.planner.state == "planning"
    assert view.planner.proposals == 0
    # The refusal is reported to the host's admission observer like a node's.
    (exhausted,) = [e for e in events if e.kind == "exhausted"]
    assert exhausted.counter == "model_calls" and exhausted.node_id is None
    assert exhausted.admission_id is not None and exhausted.key == "b"


async def test_cancel_while_planning_stops_the_call_and_cancels_the_task(
        calls: Calls) -> None:
    provider = ScriptedProvider([turn(GOOD, delay=60)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("c", planned(provider), input={"start": 0})
    running = asyncio.create_task(rt.run("c"))
    await wait_until(lambda: provider.call_count == 1)
    await rt.cancel("c", reason="changed my mind")
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(running, 5)
    view = await rt.inspect("c")
    assert view.status == "canceled" and view.nodes == {}
    assert view.planner is not None and view.planner.state == "canceled"


def test_planner_config_checks_its_provider() -> None:
    with pytest.raises(ConfigurationError, match="complete"):
        PlannerConfig(provider=object(), host_instructions="x")
    with pytest.raises(ConfigurationError, match="max_corrections"):
        PlannerConfig(provider=ScriptedProvider([]), host_instructions="x", max_corrections=-1)


async def test_a_provider_failure_fails_the_task_with_a_typed_error(calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(fail=ProviderError("model is down"))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("d", planned(provider), input={"start": 0})
    with pytest.raises(PlannerFailedError, match="model is down"):
        await rt.run("d")
    view = await rt.inspect("d")
    assert view.status == "failed" and view.counters["model_calls"] == 1
    with pytest.raises(PlannerFailedError, match="model is down"):
        await rt.run("d")  # raised again from what was stored
    assert provider.call_count == 1


async def test_replay_does_not_depend_on_the_recovering_catalog_s_descriptions(
        calls: Calls) -> None:
    store = CrashOnPlannerCommit(after=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("d", planned(ScriptedProvider([turn(UNKNOWN, 0)])), input={"start": 1})
    with pytest.raises(_Crash):
        await rt.run("d", "w1")
    reworded = HostCatalog([b.model_copy(update={"description": "reworded"})
                            for b in make_catalog(calls)])
    second = ScriptedProvider([turn(GOOD, 1)])
    fresh = ExecutionGraphRuntime(catalog=reworded, store=store, programs=[planned(second)])
    assert (await fresh.run("d", "w1")).output["b"] == {"value": 3}
    assert second.call_count == 1  # proposal 0 replayed although the catalog text changed
    assert (await fresh.inspect("d")).counters["model_calls"] == 2


async def test_usage_over_a_budget_keeps_the_response_and_charges_up_to_the_limit(
        calls: Calls) -> None:
    provider = ScriptedProvider([ScriptedTurn(text=json.dumps(GOOD), usage=Usage(
        input_tokens=5000, output_tokens=20))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("u", planned(provider), input={"start": 1},
                    budgets=Budgets(input_tokens=3000))
    assert (await rt.run("u")).output["b"] == {"value": 3}
    view = await rt.inspect("u")
    assert view.counters["input_tokens"] == 3000 and provider.call_count == 1
    (response,) = [e for e in await journal(rt, "u") if e.kind == "planner_response"]
    assert response.data["usage_over_limit"]["input_tokens"] > 0


@pytest.mark.parametrize("text", ['{"schemaVersion": NaN}', "[" * 5000 + "]" * 5000,
                                  '{"revision": ' + "9" * 5000 + "}"])
async def test_unreadable_answers_are_corrected_not_fatal(calls: Calls, text: str) -> None:
    provider = ScriptedProvider([turn(text, 0), turn(GOOD, 1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("n", planned(provider), input={"start": 1})
    assert (await rt.run("n")).output["b"] == {"value": 3}
    proposals = [e for e in await journal(rt, "n") if e.kind == "plan_proposal"]
    assert proposals[0].data["diagnostics"][0]["code"] == "proposal_not_json"


async def test_cancel_needs_no_planner_program(calls: Calls) -> None:
    store = CountingStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("c", planned(ScriptedProvider([turn(GOOD)])), input={"start": 0})
    stranger = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    view = await stranger.cancel("c", reason="not needed")
    assert view.status == "canceled" and view.nodes == {}


async def test_after_planning_only_the_bindings_the_plan_uses_must_stay(calls: Calls) -> None:
    store = CrashOnPlannerCommit(after=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("u", planned(ScriptedProvider([turn(GOOD)])), input={"start": 0})
    with pytest.raises(_Crash):
        await rt.run("u", "w1")
    only_inc = HostCatalog([b for b in make_catalog(calls) if b.id == "inc"])
    fresh = ExecutionGraphRuntime(catalog=only_inc, store=store,
                                  programs=[planned(ScriptedProvider([]))])
    assert (await fresh.run("u", "w1")).output["b"] == {"value": 2}


def test_nested_programs_cannot_be_planned(calls: Calls) -> None:
    nested = planned(ScriptedProvider([]))
    with pytest.raises(ConfigurationError, match="static plan"):
        HostCatalog([*make_catalog(calls), GraphBinding(id="sub", version="1", program=nested)])


async def test_a_verdict_journaled_with_a_longer_message_replays_as_it_was_sent(
        calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    # (review 47) Replayed verdicts went through the diagnostic bound added later: one
    # journaled unbounded came back cut, the correction request no longer matched the one
    # sent, and the planner was asked (and charged) again for an answer the journal held.
    from agentium_graph import errors

    store = CrashOnPlannerCommit(after=2)
    monkeypatch.setattr(errors, "MAX_DIAGNOSTIC_MESSAGE", 10**9)  # an older version
    long_shape = {"schemaVersion": 1, "revision": 1, "nodes": "y" * 3000}
    first = ScriptedProvider([turn(long_shape, 0), turn(UNKNOWN, 1), turn(GOOD, 2)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("r", planned(first, max_corrections=3), input={"start": 0})
    with pytest.raises(_Crash):
        await rt.run("r", "w1")
    monkeypatch.undo()  # the upgraded worker bounds new diagnostics
    second = ScriptedProvider([turn(GOOD, 1), turn(GOOD, 2)])
    fresh = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store,
                                  programs=[planned(second, max_corrections=3)])
    assert (await fresh.run("r", "w1")).output["b"] == {"value": 2}
    assert [c.metadata["proposal"] for c in second.calls] == [2]


async def test_two_concurrent_creates_cannot_swap_a_known_program(calls: Calls) -> None:
    # (review 47) The program was checked before the store was awaited and registered
    # after: two creates of other content under one id and version both passed, the second
    # replaced the first, and the first task failed on the runtime that created it.
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=CountingStore())
    first = planned(ScriptedProvider([turn(GOOD)]))
    changed = ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
        provider=ScriptedProvider([turn(GOOD)]), host_instructions="Something else."))
    outcomes = await asyncio.gather(rt.create("a", first, input={"start": 0}),
                                    rt.create("b", changed, input={"start": 0}),
                                    return_exceptions=True)
    assert isinstance(outcomes[1], ConfigurationError) and not isinstance(outcomes[0],
                                                                          Exception)
    assert (await rt.run("a")).output["b"] == {"value": 2}


async def test_a_create_that_fails_does_not_forget_the_program_of_one_that_did(
        calls: Calls) -> None:
    # (review 50) A failed create rolled the program back while a concurrent create of the
    # same program had stored its task: the runtime no longer knew how to plan it.
    store = CountingStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("a", ExecutionGraphProgram(id="static", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": []}))
    fresh = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    shared = planned(ScriptedProvider([turn(GOOD)]))
    outcomes = await asyncio.gather(fresh.create("a", shared, input={"start": 0}),
                                    fresh.create("b", shared, input={"start": 0}),
                                    return_exceptions=True)
    assert isinstance(outcomes[0], TaskConflictError)
    assert (await fresh.run("b")).output["b"] == {"value": 2}
