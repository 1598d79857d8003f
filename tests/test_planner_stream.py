"""Planner programs in stream mode: revisions arrive as frames while the committed prefix runs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentium_graph import (
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    PlannerConfig,
    PlannerFailedError,
    PlanValidationError,
    RootLimits,
    StreamLimits,
    TaskCanceledError,
    ToolBinding,
)
from agentium_graph.providers import (
    IncompleteStreamError,
    ModelResponse,
    PartialStream,
    ProviderError,
    ScriptedProvider,
    ScriptedTurn,
    StreamEnd,
    TextDelta,
    TurnMatch,
    Usage,
)
from agentium_graph.store import CommitRequest, CommitResult, SettleNode
from tests.conftest import INT_OUT, Calls, make_catalog, wait_until

USAGE = Usage(input_tokens=100, output_tokens=20)


def node(node_id: str, x: Any, *deps: str, binding: str = "inc") -> dict[str, Any]:
    spec: dict[str, Any] = {"id": node_id, "binding": binding, "version": "1", "args": {"x": x}}
    if deps:
        spec["dependsOn"] = list(deps)
    return spec


def ref(node_id: str) -> dict[str, Any]:
    return {"$ref": {"node": node_id, "path": ["value"]}}


def frame(base: int, *nodes: dict[str, Any]) -> str:
    plan = {"schemaVersion": 1, "revision": base + 1, "nodes": list(nodes)}
    return json.dumps({"baseRevision": base, "plan": plan}) + "\n"


def turn(*frames: str, call: int | None = None, **kw: Any) -> ScriptedTurn:
    match = None if call is None else TurnMatch(metadata={"call": call})
    return ScriptedTurn(text="".join(frames), usage=USAGE, match=match, **kw)


def streamed(provider: ScriptedProvider, **kw: Any) -> ExecutionGraphProgram:
    config = PlannerConfig(provider=provider, host_instructions="Plan the arithmetic.",
                           max_output_tokens=400, mode="stream", **kw)
    return ExecutionGraphProgram(id="streamed", version="1", planner=config)


class Gate:
    """A tool that waits until the test opens it, so a node can be held running."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.started = 0

    def binding(self) -> ToolBinding:
        async def gate(args: dict[str, Any]) -> dict[str, Any]:
            self.started += 1
            await self.open.wait()
            return {"value": args["x"]}

        return ToolBinding(id="gate", version="1", execute=gate, recovery="pure",
                           input_schema={"type": "object"}, output_schema=INT_OUT)


async def events(rt: ExecutionGraphRuntime, key: str) -> list[Any]:
    return list((await rt.timeline(key, limit=1000)).events)


async def test_frames_commit_revisions_while_the_prefix_runs(calls: Calls) -> None:
    # Frame 1 plans a; frame 2 (after a pause) keeps a and adds b after it.
    provider = ScriptedProvider([turn(frame(0, node("a", 1)),
                                      frame(1, node("a", 1), node("b", ref("a"), "a")),
                                      chunk_delay=0.05)], chunks=12)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("s", streamed(provider))
    result = await rt.run("s")
    assert result.output == {"a": {"value": 2}, "b": {"value": 3}}
    assert result.revision == 2

    kinds = [(e.kind, e.node_id, e.data.get("revision")) for e in await events(rt, "s")]
    started_a = kinds.index(("attempt_started", "a", None))
    committed_2 = kinds.index(("revision_committed", None, 2))
    assert started_a < committed_2  # the committed prefix ran while frames arrived
    names = [k for k, _, _ in kinds]
    assert names.count("planner_call") == 1 and names.count("planner_sealed") == 1
    assert names.index("planner_sealed") > committed_2  # sealed at the stream's end

    view = await rt.inspect("s")
    assert view.verified and view.revision == 2
    assert view.counters["plan_revisions"] == 2 and view.counters["expanded_nodes"] == 2
    assert view.counters["model_calls"] == 1 and provider.open_streams == 0
    assert view.planner is not None and view.planner.state == "planned"
    assert view.planner.mode == "stream" and view.planner.proposals == 2
    (request,) = provider.calls
    assert "baseRevision" in request.model_messages[0].content
    # A sealed task never plans again.
    again = await rt.run("s")
    assert again.output == result.output and provider.call_count == 1


async def test_a_revision_replaces_and_removes_unstarted_nodes(calls: Calls) -> None:
    gate = Gate()
    first = frame(0, node("g", 5, binding="gate"), node("b", 100, "g"), node("c", 200, "g"))
    second = frame(1, node("g", 5, binding="gate"), node("b", ref("g"), "g"))
    provider = ScriptedProvider([turn(first, second, chunk_delay=0.05)], chunks=10)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [gate.binding()]))
    await rt.create("r", streamed(provider))
    running = asyncio.create_task(rt.run("r"))
    await wait_until(lambda: gate.started == 1)
    await wait_until(lambda: provider.call_count == 1 and provider.open_streams == 0)
    gate.open.set()
    result = await asyncio.wait_for(running, 5)
    assert result.output == {"g": {"value": 5}, "b": {"value": 6}}

    view = await rt.inspect("r")
    assert view.nodes["c"].state == "tombstoned" and view.nodes["b"].revision == 2
    # b was replaced under its id (new incarnation), c removed; both spent allowance.
    assert view.counters["expanded_nodes"] == 4
    gone = {e.node_id: e.data for e in await events(rt, "r") if e.kind == "node_tombstoned"}
    assert set(gone) == {"b", "c"}
    assert gone["b"]["incarnation_id"] != view.nodes["b"].incarnation_id
    assert calls.by_node.get("c") is None


async def test_a_frame_that_changes_a_started_node_is_corrected(calls: Calls) -> None:
    gate = Gate()
    provider = ScriptedProvider([
        turn(frame(0, node("g", 1, binding="gate")),
             frame(1, node("g", 2, binding="gate")), chunk_delay=0.05, call=0),
        turn(frame(1, node("g", 1, binding="gate"), node("b", ref("g"), "g")), call=1),
    ], chunks=8)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [gate.binding()]))
    await rt.create("c", streamed(provider))
    running = asyncio.create_task(rt.run("c"))
    await wait_until(lambda: provider.call_count == 2)
    gate.open.set()
    result = await asyncio.wait_for(running, 5)
    assert result.output == {"g": {"value": 1}, "b": {"value": 2}}
    assert gate.started == 1  # the started node was never re-run

    verdicts = [e.data for e in await events(rt, "c") if e.kind == "plan_proposal"]
    assert [v["accepted"] for v in verdicts] == [True, False, True]
    assert verdicts[1]["diagnostics"][0]["code"] == "node_already_started"
    feedback = json.loads(provider.calls[1].model_messages[-1].content)
    assert feedback["continue_from_revision"] == 1
    assert feedback["diagnostics"][0]["code"] == "node_already_started"
    assert feedback["committed_plan"]["nodes"][0]["args"] == {"x": 1}
    view = await rt.inspect("c")
    assert view.counters["model_calls"] == 2 and view.revision == 2
    assert view.planner is not None and (view.planner.proposals, view.planner.rejected) == (3, 1)


async def test_an_identical_retransmission_is_ignored(calls: Calls) -> None:
    one = frame(0, node("a", 1))
    provider = ScriptedProvider([turn(one, one, one)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("i", streamed(provider))
    assert (await rt.run("i")).output == {"a": {"value": 2}}
    view = await rt.inspect("i")
    assert view.revision == 1 and view.counters["plan_revisions"] == 1
    assert view.planner is not None and view.planner.rejected == 0


async def test_the_committed_plan_restated_on_the_next_base_is_ignored(calls: Calls) -> None:
    # (review 39) A model that sends its unchanged plan again on the next base (the natural
    # way to say "no change") committed a revision that changed nothing and spent one of
    # plan_revisions. It is ignored like a retransmission, also by max_frames; a real
    # change after it still commits as the next revision.
    provider = ScriptedProvider([turn(frame(0, node("a", 1)), frame(1, node("a", 1)),
                                      frame(1, node("a", 1)),
                                      frame(1, node("a", 1), node("b", ref("a"), "a")))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("n", streamed(provider, stream=StreamLimits(max_frames=2)))
    assert (await rt.run("n")).output == {"a": {"value": 2}, "b": {"value": 3}}
    view = await rt.inspect("n")
    assert view.revision == 2 and view.counters["plan_revisions"] == 2
    assert view.planner is not None and (view.planner.proposals, view.planner.rejected) == (2, 0)


@pytest.mark.parametrize(("text", "code"), [
    ("not json\n", "frame_not_json"),
    ('{"plan": {}}\n', "frame_shape"),
    ('{"baseRevision": true, "plan": {}}\n', "frame_shape"),
    ('{"baseRevision": 0, "baseRevision": 0, "plan": {}}\n', "frame_not_json"),  # review 46
    (frame(3, node("a", 1)), "base_revision_mismatch"),
    (frame(0, node("a", 1)).replace('"revision": 1', '"revision": 5'), "revision_mismatch"),
    (frame(0, node("a", 1, binding="teleport")), "unknown_binding"),
])
async def test_bad_frames_name_what_is_wrong(calls: Calls, text: str, code: str) -> None:
    provider = ScriptedProvider([turn(text, call=0), turn(frame(0, node("a", 1)), call=1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("b", streamed(provider))
    assert (await rt.run("b")).output == {"a": {"value": 2}}
    fed = json.loads(provider.calls[1].model_messages[-1].content)["diagnostics"]
    assert code in {d["code"] for d in fed}


async def test_limits_close_the_stream_or_fail_the_task(calls: Calls) -> None:
    big = frame(0, node("a", 1), node("b", 2), node("c", 3))
    provider = ScriptedProvider([turn(big, call=0), turn(frame(0, node("a", 1)), call=1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("f", streamed(provider, stream=StreamLimits(max_frame_bytes=len(big) - 10)))
    assert (await rt.run("f")).output == {"a": {"value": 2}}
    fed = json.loads(provider.calls[1].model_messages[-1].content)["diagnostics"]
    assert fed[0]["code"] == "frame_too_large"

    many = ScriptedProvider([turn(*(frame(i, *(node(f"n{j}", j) for j in range(i + 1)))
                                    for i in range(3)))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))  # another program, same id
    await rt.create("m", streamed(many, stream={"max_frames": 2}))
    with pytest.raises(PlanValidationError) as failed:
        await rt.run("m")
    assert [d.code for d in failed.value.diagnostics] == ["too_many_frames"]
    view = await rt.inspect("m")
    assert view.status == "failed" and view.revision == 2
    assert all(n.state == "canceled" for n in view.nodes.values() if n.state != "completed")


async def test_every_call_rejected_fails_with_the_last_diagnostics(calls: Calls) -> None:
    bad = frame(0, node("a", 1, binding="teleport"))
    provider = ScriptedProvider([turn(bad, call=0), turn(bad, call=1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("x", streamed(provider, max_corrections=1))
    with pytest.raises(PlanValidationError) as failed:
        await rt.run("x")
    assert failed.value.diagnostics[0].code == "unknown_binding"
    assert "host instructions" in str(failed.value)
    assert provider.call_count == 2
    view = await rt.inspect("x")
    assert view.status == "failed" and view.counters["model_calls"] == 2
    assert view.planner is not None and view.planner.state == "failed"


async def test_an_incomplete_stream_is_continued_from_the_committed_revision(
        calls: Calls) -> None:
    first = frame(0, node("a", 1))
    provider = ScriptedProvider([
        turn(first, call=0, partial_stream_then_fail=PartialStream(events=1, ending="eof")),
        turn(frame(1, node("a", 1), node("b", ref("a"), "a")), call=1)], chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("e", streamed(provider))
    assert (await rt.run("e")).output == {"a": {"value": 2}, "b": {"value": 3}}
    feedback = json.loads(provider.calls[1].model_messages[-1].content)
    assert feedback["continue_from_revision"] == 1
    assert feedback["diagnostics"][0]["code"] == "stream_incomplete"


async def test_a_provider_error_fails_the_task_with_a_typed_error(calls: Calls) -> None:
    provider = ScriptedProvider([turn(frame(0, node("a", 1)), fail=ProviderError("down"))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("d", streamed(provider))
    with pytest.raises(PlannerFailedError, match="down"):
        await rt.run("d")


async def test_a_new_worker_continues_an_unsealed_stream(calls: Calls) -> None:
    # The first worker dies mid-stream (its run is torn down after revision 1 committed);
    # another runtime on the same store asks for a continuation from revision 1.
    first = ScriptedProvider([turn(frame(0, node("a", 1)),
                                   partial_stream_then_fail=PartialStream(events=1,
                                                                          ending="hang"))],
                             chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), lease_ttl=0.2, poll_interval=0.05)
    await rt.create("w", streamed(first))
    dying = asyncio.create_task(rt.run("w", worker_id="w1"))
    await wait_until(lambda: calls.by_node.get("a") == 1)
    async with asyncio.timeout(5):  # a's completion is committed, not only its call made
        while (await rt.inspect("w")).nodes["a"].state != "completed":  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    dying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dying
    assert first.open_streams == 0

    second = ScriptedProvider([turn(frame(1, node("a", 1), node("b", ref("a"), "a")),
                                    call=1)])
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=rt.store,
                                  programs=[streamed(second)])
    result = await other.run("w", worker_id="w2", wait=True)
    assert result.output == {"a": {"value": 2}, "b": {"value": 3}}
    assert calls.by_node["a"] == 1  # the completed node was not re-run
    (request,) = second.calls
    assert json.loads(request.model_messages[-1].content)["continue_from_revision"] == 1
    view = await other.inspect("w")
    assert view.counters["model_calls"] == 2


async def test_cancel_while_streaming_closes_the_stream(calls: Calls) -> None:
    provider = ScriptedProvider([turn(frame(0, node("a", 1)),
                                      partial_stream_then_fail=PartialStream(events=1,
                                                                             ending="hang"))],
                                chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("k", streamed(provider))
    running = asyncio.create_task(rt.run("k"))
    await wait_until(lambda: calls.by_node.get("a") == 1)
    await rt.cancel("k", reason="enough")
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(running, 5)
    assert provider.open_streams == 0
    view = await rt.inspect("k")
    assert view.status == "canceled" and view.nodes["a"].state == "completed"
    assert view.planner is not None and view.planner.state == "canceled"


class HeldCompletion(InMemoryDurableTaskStore):
    """Holds the commit that completes node ``a`` until released."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def commit(self, request: CommitRequest) -> CommitResult:
        if any(isinstance(s, SettleNode) and s.node_id == "a" for s in request.steps):
            self.holding.set()
            await self.release.wait()
        return await super().commit(request)


async def test_a_cancel_that_arrives_while_the_loop_awaits_a_commit_is_not_lost(
        calls: Calls) -> None:
    # Planning is still open (the stream hangs) and nothing else runs: the only wake-up
    # the loop gets is the cancel, and it arrives while the loop awaits a's completion.
    provider = ScriptedProvider([turn(frame(0, node("a", 1)),
                                      partial_stream_then_fail=PartialStream(events=1,
                                                                             ending="hang"))],
                                chunks=1)
    store = HeldCompletion()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("k", streamed(provider))
    running = asyncio.create_task(rt.run("k"))
    await asyncio.wait_for(store.holding.wait(), 5)
    await rt.cancel("k", reason="enough")
    store.release.set()
    with pytest.raises(TaskCanceledError):
        await asyncio.wait_for(running, 5)
    view = await rt.inspect("k")
    assert view.status == "canceled" and view.nodes["a"].state == "completed"


async def test_a_provider_that_streams_a_non_event_fails_the_task(calls: Calls) -> None:
    class Broken:
        id, version = "broken", "1"

        async def complete(self, request: Any) -> Any:
            raise AssertionError("stream mode never calls complete()")

        async def stream(self, request: Any) -> Any:
            yield "not an event"

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("n", streamed(Broken()))  # type: ignore[arg-type]
    with pytest.raises(PlannerFailedError, match="not a stream event"):
        await rt.run("n")
    view = await rt.inspect("n")
    assert view.status == "failed" and view.counters["model_calls"] == 1


class TwoFrames:
    """A provider that sends its second frame only when the test's ``release`` is set."""

    id, version = "two-frames", "1"

    def __init__(self, first: str, second: str) -> None:
        self.frames = (first, second)
        self.release = asyncio.Event()

    async def complete(self, request: Any) -> Any:
        raise AssertionError("stream mode never calls complete()")

    async def stream(self, request: Any) -> Any:
        yield TextDelta(text=self.frames[0])
        await self.release.wait()
        yield TextDelta(text=self.frames[1])
        yield StreamEnd(usage=USAGE, stop_reason="end")


@pytest.mark.parametrize("replace", [True, False])
async def test_a_node_made_ready_by_a_container_is_not_started_by_the_revision_s_commit(
        replace: bool) -> None:
    # x waits for container c; c's child releases frame 2 (which replaces or drops x) as it
    # finishes, so c settles and x becomes ready in the very turn that drains frame 2. x
    # must then run as the revision says: with its new args, or not at all.
    seen: list[int] = []
    provider: TwoFrames

    async def signal(args: dict[str, Any]) -> dict[str, Any]:
        provider.release.set()
        await asyncio.sleep(0)
        return {"value": args["x"]}

    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        seen.append(args["x"])
        return {"value": args["x"] + 1}

    inner = ExecutionGraphProgram(id="inner", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "s", "binding": "signal", "version": "1", "args": {"x": 1}}]})
    catalog = HostCatalog([
        ToolBinding(id="signal", version="1", execute=signal, recovery="pure",
                    input_schema={"type": "object"}, output_schema=INT_OUT),
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                    input_schema={"type": "object"}, output_schema=INT_OUT),
        GraphBinding(id="sub", version="1", program=inner, input_schema={"type": "object"})])
    c = {"id": "c", "binding": "sub", "version": "1", "args": {}}
    later = [c, node("x", 20, "c")] if replace else [c]
    provider = TwoFrames(frame(0, c, node("x", 10, "c")), frame(1, *later))
    rt = ExecutionGraphRuntime(catalog=catalog)
    await rt.create("t", streamed(provider))  # type: ignore[arg-type]
    result = await asyncio.wait_for(rt.run("t"), 5)
    view = await rt.inspect("t")
    assert view.verified and view.revision == 2
    if replace:
        assert result.output["x"] == {"value": 21} and seen == [20]
        assert view.nodes["x"].revision == 2
    else:
        assert "x" not in result.output and seen == []
        assert view.nodes["x"].state == "tombstoned"


async def test_a_revision_over_the_revision_budget_stops_the_run_keeping_its_work(
        calls: Calls) -> None:
    provider = ScriptedProvider([turn(frame(0, node("a", 1)),
                                      frame(1, node("a", 1), node("b", ref("a"), "a")))])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", streamed(provider), limits=RootLimits(max_plan_revisions=1))
    with pytest.raises(BudgetExhaustedError) as refused:
        await rt.run("t")
    assert refused.value.counter == "plan_revisions"
    view = await rt.inspect("t")
    # Only the refused revision is lost: a's completion, committed meanwhile, is kept.
    assert view.status == "pending" and view.revision == 1
    assert view.nodes["a"].state == "completed" and calls.by_node == {"a": 1}
    assert view.counters["plan_revisions"] == 1


async def test_a_failing_node_stops_planning_at_once(calls: Calls) -> None:
    async def boom(args: dict[str, Any]) -> Any:
        raise RuntimeError("boom")

    failing = ToolBinding(id="boom", version="1", execute=boom, recovery="pure",
                          input_schema={"type": "object"}, output_schema=INT_OUT)
    provider = ScriptedProvider([turn(frame(0, node("f", 1, binding="boom")),
                                      partial_stream_then_fail=PartialStream(events=1,
                                                                             ending="hang"))],
                                chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [failing]))
    await rt.create("f", streamed(provider))
    with pytest.raises(Exception, match="boom"):
        await asyncio.wait_for(rt.run("f"), 5)  # not after max_latency_ms (30 s)
    assert provider.open_streams == 0 and provider.call_count == 1
    view = await rt.inspect("f")
    assert view.status == "failed" and view.planner is not None
    assert view.planner.state == "failed"


async def test_a_dropped_node_can_come_back_as_a_new_incarnation(calls: Calls) -> None:
    gate = Gate()
    g = node("g", 1, binding="gate")
    provider = ScriptedProvider([turn(frame(0, g, node("c", 1, "g")), frame(1, g),
                                      frame(2, g, node("c", 5, "g")),
                                      frame(3, g, node("c", 6, "g")), chunk_delay=0.02)],
                                chunks=16)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [gate.binding()]))
    await rt.create("d", streamed(provider))
    running = asyncio.create_task(rt.run("d"))
    await wait_until(lambda: provider.call_count == 1 and provider.open_streams == 0)
    gate.open.set()
    result = await asyncio.wait_for(running, 5)
    assert result.output == {"g": {"value": 1}, "c": {"value": 7}}
    view = await rt.inspect("d")
    assert view.revision == 4 and view.nodes["c"].revision == 4


async def test_a_cut_off_stream_is_continued_not_sealed(calls: Calls) -> None:
    provider = ScriptedProvider([
        turn(frame(0, node("a", 1)), call=0, stop_reason="max_tokens"),
        turn(frame(1, node("a", 1), node("b", ref("a"), "a")), call=1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("m", streamed(provider))
    assert (await rt.run("m")).output == {"a": {"value": 2}, "b": {"value": 3}}
    feedback = json.loads(provider.calls[1].model_messages[-1].content)
    assert feedback["diagnostics"][0]["code"] == "stream_cut_off"


async def test_a_retransmission_does_not_count_against_max_frames(calls: Calls) -> None:
    one = frame(0, node("a", 1))
    provider = ScriptedProvider([turn(one, one)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("r", streamed(provider, stream={"max_frames": 1}))
    assert (await rt.run("r")).output == {"a": {"value": 2}}


class SlowStore(InMemoryDurableTaskStore):
    """A store whose commit yields to the event loop, as SQLite's thread and MongoDB do."""

    async def commit(self, request: Any) -> Any:
        await asyncio.sleep(0.01)
        return await super().commit(request)


async def test_planning_that_ends_during_a_commit_still_wakes_the_run(calls: Calls) -> None:
    provider = ScriptedProvider([turn(frame(0, node("a", 1)))], chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=SlowStore())
    await rt.create("y", streamed(provider))
    result = await asyncio.wait_for(rt.run("y"), 5)  # hung forever before the fix
    assert result.output == {"a": {"value": 2}}


async def test_a_task_with_a_rejected_frame_can_be_run_again_by_another_worker(
        calls: Calls) -> None:
    gate = Gate()
    g = node("g", 1, binding="gate")
    provider = ScriptedProvider([turn(frame(0, node("a", 1, binding="teleport")), call=0),
                                 turn(frame(0, g), call=1)])
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [gate.binding()]),
                               lease_ttl=0.2, poll_interval=0.05)
    await rt.create("k", streamed(provider))
    dying = asyncio.create_task(rt.run("k", worker_id="w1"))
    await wait_until(lambda: gate.started == 1 and provider.open_streams == 0)
    dying.cancel()  # the worker dies with the stream sealed and g running
    with pytest.raises(asyncio.CancelledError):
        await dying
    gate.open.set()
    other = ExecutionGraphRuntime(catalog=make_catalog(calls, [gate.binding()]),
                                  store=rt.store, programs=[streamed(provider)])
    result = await other.run("k", worker_id="w2", wait=True)  # KeyError before the fix
    assert result.output == {"g": {"value": 1}} and provider.call_count == 2


async def test_usage_at_the_seal_is_capped_not_refused(calls: Calls) -> None:
    # An agent's usage and the planner's seal land in one commit; together they are over
    # the output-token budget. The seal's share is capped (the excess journaled), never
    # refused: refusing it would leave the task unsealed for good.
    returned = asyncio.Event()

    class AgentModel:
        id, version = "agent-model", "1"

        async def complete(self, request: Any) -> ModelResponse:
            returned.set()
            return ModelResponse(text="done", usage=Usage(input_tokens=1, output_tokens=500),
                                 stop_reason="end")

        async def stream(self, request: Any) -> Any:
            raise AssertionError("the agent does not stream")

    class Planner:
        id, version = "planner-model", "1"

        async def complete(self, request: Any) -> Any:
            raise AssertionError("stream mode never calls complete()")

        async def stream(self, request: Any) -> Any:
            yield TextDelta(text=frame(0, {"id": "ag", "binding": "ag", "version": "1",
                                           "args": {}}))
            await returned.wait()
            yield StreamEnd(usage=Usage(input_tokens=1, output_tokens=700), stop_reason="end")

    agent = AgentBinding(id="ag", version="1", input_schema={"type": "object"},
                         agent=Agent(provider=AgentModel(), instructions="x",
                                     max_output_tokens=100))
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [agent]), store=SlowStore())
    await rt.create("s", streamed(Planner()),  # type: ignore[arg-type]
                    budgets=Budgets(output_tokens=1000))
    result = await asyncio.wait_for(rt.run("s"), 5)
    assert result.status == "completed"
    view = await rt.inspect("s")
    assert view.counters["output_tokens"] == 1000  # up to the limit, never over it
    assert view.planner is not None and view.planner.state == "planned"
    over = [e.data.get("usage_over_limit") for e in await events(rt, "s")
            if e.kind in ("planner_sealed", "model_response")]
    assert any(over), over


async def test_a_trickling_stream_cannot_hold_the_task_open(calls: Calls) -> None:
    class Trickle:
        id, version = "trickle", "1"

        async def complete(self, request: Any) -> Any:
            raise AssertionError("stream mode never calls complete()")

        async def stream(self, request: Any) -> Any:
            yield TextDelta(text=frame(0, node("a", 1)))
            while True:  # keep-alive deltas, never another frame
                await asyncio.sleep(0.01)
                yield TextDelta(text="")

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("t", streamed(Trickle(), stream={"max_latency_ms": 200}))  # type: ignore
    with pytest.raises(PlannerFailedError, match="max_latency_ms"):
        await asyncio.wait_for(rt.run("t"), 10)
    view = await rt.inspect("t")
    assert view.status == "failed" and view.nodes["a"].state == "completed"


async def test_streams_that_only_break_off_fail_as_a_provider_problem(calls: Calls) -> None:
    broken = PartialStream(events=0, ending="eof")
    provider = ScriptedProvider([
        turn(frame(0, node("a", 1)), call=0, partial_stream_then_fail=broken),
        turn(frame(0, node("a", 1)), call=1, partial_stream_then_fail=broken)], chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("e", streamed(provider, max_corrections=1))
    with pytest.raises(PlannerFailedError) as failed:
        await rt.run("e")
    assert isinstance(failed.value.__cause__, IncompleteStreamError)
    view = await rt.inspect("e")
    assert view.planner is not None and view.planner.calls == 2
    assert (view.planner.proposals, view.planner.rejected) == (0, 0)
    assert [d.code for d in view.planner.last_diagnostics] == ["stream_incomplete"]
    # Each continuation says which call it is: two are never the same request.
    assert provider.calls[0].digest() != provider.calls[1].digest()


async def test_a_recovered_continuation_feeds_back_the_latest_problem(calls: Calls) -> None:
    # Call 0: a rejected frame; call 1: a stream that broke off; call 2 hangs and its
    # worker dies. The next worker's continuation reports call 1's problem, not call 0's.
    first = ScriptedProvider([
        turn(frame(0, node("a", 1, binding="teleport")), call=0),
        turn(frame(0, node("a", 1)), call=1,
             partial_stream_then_fail=PartialStream(events=0, ending="eof")),
        turn(frame(0, node("a", 1)), call=2,
             partial_stream_then_fail=PartialStream(events=0, ending="hang"))], chunks=1)
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), lease_ttl=0.2, poll_interval=0.05)
    await rt.create("w", streamed(first, max_corrections=5))
    dying = asyncio.create_task(rt.run("w", worker_id="w1"))
    await wait_until(lambda: first.call_count == 3)
    dying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dying
    told = json.loads(first.calls[2].model_messages[-1].content)["diagnostics"]
    second = ScriptedProvider([turn(frame(0, node("a", 1)), call=3)])
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=rt.store,
                                  programs=[streamed(second, max_corrections=5)])
    assert (await other.run("w", worker_id="w2", wait=True)).output == {"a": {"value": 2}}
    recovered = json.loads(second.calls[0].model_messages[-1].content)["diagnostics"]
    assert [d["code"] for d in told] == [d["code"] for d in recovered] == ["stream_incomplete"]
