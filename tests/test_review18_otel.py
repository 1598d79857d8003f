"""Review 18: OpenTelemetry spans, recorded by the real SDK's span processor.

SPEC 13: spans for the task run, node attempts, admission waits, store operations and
connector dispatch/lookup, with stable attributes. Recorded with opentelemetry-sdk (a test
dependency; the library itself uses the API only), without installing a global provider:
the tests point the library's tracer at an SDK provider of their own, as the fixture of
tests/test_otel.py does with a fake tracer.

What failed before:
* only a pure tool node's attempt had a ``agentium_graph.node.attempt`` span: an effect
  node's attempt (its connector dispatch) and an agent node's attempt had none;
* a failed attempt's span (the tool raised, the dispatch raised, the output was refused)
  ended with status UNSET, as if it had succeeded: the span had no error status and no
  attribute saying how the attempt ended;
* a run the host canceled left the admission-wait span of a node still queued open for
  ever (fixed with the admission queue: tests/test_review18_admission.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace  # the test extra installs the SDK
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

from agentium_graph import (
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    RootLimits,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn
from tests.conftest import INT_OUT, wait_until

WAIT = 10.0
ATTEMPT = "agentium_graph.node.attempt"


class Recorder(SpanProcessor):
    """Every span started, and every span ended (by span id)."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)
        self.ended.append(span)

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.ended if s.name == name]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(recorder)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr("agentium_graph._otel._tracer", provider.get_tracer("agentium_graph"))
    yield recorder
    provider.shutdown()


class Connector:
    id = "otel-pay"
    version = "1"
    idempotent_destination = False

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        if self.fail:
            raise ConnectionError("connection reset by the destination")
        return ActionOutcome(output={"value": 7}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Unknown:
        return Unknown(reason="the destination has no lookup")


async def ok(args: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"value": 1}


async def boom(args: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    raise RuntimeError("the tool broke")


async def bad_output(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": "not an int"}


async def hang(args: dict[str, Any]) -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def catalog() -> HostCatalog:
    def tool(id: str, fn: Any) -> ToolBinding:
        return ToolBinding(id=id, version="1", execute=fn, recovery="pure",
                           output_schema=INT_OUT)

    return HostCatalog([
        tool("ok", ok), tool("boom", boom), tool("bad_output", bad_output), tool("hang", hang),
        ToolBinding(id="pay", version="1", connector=Connector(), destination="payments",
                    output_schema=INT_OUT),
        ToolBinding(id="pay_fails", version="1", connector=Connector(fail=True),
                    destination="payments", output_schema=INT_OUT),
        AgentBinding(id="writer", version="1", agent=Agent(
            ScriptedProvider([ScriptedTurn(text="done")]), "write it")),
    ])


def program(*bindings: str) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="otel", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": f"n{i}", "binding": b, "version": "1", "args": {}}
                  for i, b in enumerate(bindings)]})


def attempt_attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_every_kind_of_leaf_attempt_has_a_node_attempt_span(spans: Recorder) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog())
    await rt.create("kinds", program("ok", "pay", "writer"))
    assert (await rt.run("kinds", "w1")).status == "completed"
    attempts = {attempt_attrs(s)["agentium.node.id"]: s for s in spans.named(ATTEMPT)}
    assert sorted(attempts) == ["n0", "n1", "n2"]
    for node_id, binding in (("n0", "ok"), ("n1", "pay"), ("n2", "writer")):
        attrs = attempt_attrs(attempts[node_id])
        assert attrs == {"agentium.task.key": "kinds", "agentium.node.id": node_id,
                         "agentium.attempt": 1, "agentium.binding": binding,
                         "agentium.attempt.outcome": "completed"}
        assert attempts[node_id].status.status_code == StatusCode.UNSET
    # The connector's dispatch is a child of the effect node's attempt span.
    (dispatch,) = spans.named("agentium_graph.connector.dispatch")
    assert dispatch.parent is not None and attempts["n1"].context is not None
    assert dispatch.parent.span_id == attempts["n1"].context.span_id
    assert spans.open == {}


@pytest.mark.parametrize("binding", ["boom", "bad_output"])
async def test_a_failed_tool_attempt_span_has_an_error_status(spans: Recorder,
                                                              binding: str) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog())
    await rt.create("fails", program(binding))
    with pytest.raises(NodeFailedError):
        await rt.run("fails", "w1")
    (attempt,) = spans.named(ATTEMPT)
    assert attempt.status.status_code == StatusCode.ERROR
    assert attempt_attrs(attempt)["agentium.attempt.outcome"] == "failed"
    assert attempt.status.description  # says why
    (run,) = spans.named("agentium_graph.task.run")
    assert run.status.status_code == StatusCode.ERROR
    assert spans.open == {}


async def test_a_failed_dispatch_has_error_spans_and_an_uncertain_attempt(
        spans: Recorder) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(), lookup_attempts=1)
    await rt.create("pay", program("pay_fails"))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("pay", "w1")
    (dispatch,) = spans.named("agentium_graph.connector.dispatch")
    assert dispatch.status.status_code == StatusCode.ERROR
    assert "ConnectionError" in (dispatch.status.description or "")
    (attempt,) = spans.named(ATTEMPT)
    assert attempt.status.status_code == StatusCode.ERROR
    assert attempt_attrs(attempt)["agentium.attempt.outcome"] == "uncertain"
    assert len(spans.named("agentium_graph.connector.resolve")) == 1
    assert spans.open == {}


async def test_canceled_attempts_and_waits_end_their_spans(spans: Recorder) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(), limits=RootLimits(max_concurrent_work=1))
    await rt.create("stop", program("hang", "hang", "hang"))
    run = asyncio.create_task(rt.run("stop", "w1"))
    await wait_until(lambda: list(spans.open.values()).count(
        "agentium_graph.admission.wait") == 2, WAIT)
    await rt.cancel("stop", "operator stop")
    async with asyncio.timeout(WAIT):
        with pytest.raises(TaskCanceledError):
            await run
    (attempt,) = spans.named(ATTEMPT)
    assert attempt_attrs(attempt)["agentium.attempt.outcome"] == "canceled"
    assert attempt.status.status_code == StatusCode.UNSET  # a cancel is no error
    waits = spans.named("agentium_graph.admission.wait")
    assert sorted(attempt_attrs(w)["agentium.admission.outcome"] for w in waits) == \
        ["rejected", "rejected"]
    assert spans.open == {}


async def test_a_run_the_host_cancels_ends_every_span(spans: Recorder) -> None:
    rt = ExecutionGraphRuntime(catalog=catalog(), limits=RootLimits(max_concurrent_work=1))
    await rt.create("kill", program("hang", "hang", "hang"))
    run = asyncio.create_task(rt.run("kill", "w1"))
    await wait_until(lambda: list(spans.open.values()).count(
        "agentium_graph.admission.wait") == 2, WAIT)
    run.cancel()
    async with asyncio.timeout(WAIT):
        with pytest.raises(asyncio.CancelledError):
            await run
    assert spans.open == {}
    waits = spans.named("agentium_graph.admission.wait")
    assert sorted(attempt_attrs(w)["agentium.admission.outcome"] for w in waits) == \
        ["rejected", "rejected"]
