"""Node code that misbehaves: cancellations it raises itself, outputs it mutates later,
repeat conditions that return something other than a bool, containers whose output breaks
their own schema. Each must end the node clearly, never wedge the task."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable
from typing import Any

import pytest

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    DurableRecoveryRequiredError,
    ErrorInfo,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    NodeFailedError,
    NodeOutputError,
    PlanValidationError,
    RepeatBinding,
    StoreCapabilities,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)

OBJ = {"type": "object"}


def plan(*nodes: dict[str, Any]) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": list(nodes)})


def node(node_id: str, binding: str = "t", args: dict[str, Any] | None = None,
         **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "binding": binding, "version": "1", "args": args or {}, **extra}


def tool(binding_id: str, fn: Callable[..., Any]) -> ToolBinding:
    return ToolBinding(id=binding_id, version="1", execute=fn, recovery="pure",
                       input_schema=OBJ, output_schema=OBJ)


async def _raises_cancelled(args: dict[str, Any]) -> dict[str, Any]:
    raise asyncio.CancelledError()


def _sync_cancelled_future(args: dict[str, Any]) -> dict[str, Any]:
    future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
    future.cancel()
    return future.result()


async def _awaits_canceled_inner(args: dict[str, Any]) -> dict[str, Any]:
    inner = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    inner.cancel()
    await inner
    return {}


@pytest.mark.parametrize("fn", [_raises_cancelled, _sync_cancelled_future,
                                _awaits_canceled_inner],
                         ids=["raises", "sync-future", "inner-task"])
async def test_a_cancellation_the_tool_raises_itself_fails_the_node(
        fn: Callable[..., Any]) -> None:
    ran: list[str] = []
    rt = ExecutionGraphRuntime(catalog=HostCatalog([
        tool("t", fn), tool("after", lambda a: ran.append("after") or {})]))
    await rt.create("k", plan(node("a"), node("b", "after", dependsOn=["a"])))
    with pytest.raises(NodeFailedError, match="raised CancelledError") as caught:
        await rt.run("k")
    assert caught.value.node_id == "a"
    view = await rt.inspect("k")
    assert (view.status, view.nodes["a"].state, view.nodes["b"].state) == \
        ("failed", "failed", "canceled")  # as after any node failure
    # A second run reports the same failure instead of stalling the scheduler.
    with pytest.raises(NodeFailedError, match="raised CancelledError"):
        await rt.run("k")
    assert ran == []


async def test_a_cancel_of_the_task_still_cancels_an_async_tool() -> None:
    started = asyncio.Event()

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(30)
        return {}

    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", slow)]))
    await rt.create("k", plan(node("a")))
    run = asyncio.create_task(rt.run("k"))
    await started.wait()
    await rt.cancel("k", reason="stop")
    with pytest.raises(TaskCanceledError):
        await run
    view = await rt.inspect("k")
    assert (view.status, view.nodes["a"].state) == ("canceled", "canceled")


async def test_successors_and_the_result_see_the_journaled_output_not_the_tools_object(
        ) -> None:
    kept: dict[str, Any] = {}

    def produce(args: dict[str, Any]) -> dict[str, Any]:
        kept["out"] = {"n": 1, "pair": (1, 2)}
        return kept["out"]

    def mutate(args: dict[str, Any]) -> dict[str, Any]:
        kept["out"]["n"] = 2  # changes the object the producer returned, after the fact
        return {}

    def see(args: dict[str, Any]) -> dict[str, Any]:
        return {"saw": args["x"]}

    rt = ExecutionGraphRuntime(catalog=HostCatalog([
        tool("prod", produce), tool("side", mutate), tool("see", see)]))
    await rt.create("k", plan(
        node("a", "prod"), node("b", "side", dependsOn=["a"]),
        node("c", "see", {"x": {"$ref": {"node": "a", "path": ["n"]}}}, dependsOn=["b"])))
    result = await rt.run("k")
    assert result.output["a"] == {"n": 1, "pair": [1, 2]}  # as journaled: a list, n=1
    assert result.output["c"] == {"saw": 1}
    assert (await rt.inspect("k")).nodes["a"].output == result.output["a"]


def _inner() -> ExecutionGraphProgram:
    return plan(node("x", "one"))


def _one() -> ToolBinding:
    return tool("one", lambda a: {"value": 1})


@pytest.mark.parametrize("returned", ["no", None, 1, [True]],
                         ids=["str", "none", "int", "list"])
async def test_a_repeat_condition_must_return_a_bool(returned: Any) -> None:
    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one(), RepeatBinding(
        id="loop", version="1", program=_inner(), max_iterations=5,
        condition=lambda state: returned)]))
    await rt.create("k", plan(node("r", "loop")))
    with pytest.raises(NodeFailedError, match="must return True") as caught:
        await rt.run("k")
    assert caught.value.node_id == "r"
    view = await rt.inspect("k")
    assert view.nodes["r"].state == "failed"
    assert [n for n in view.nodes if n.startswith("r/")] == ["r/0/x"]  # no second iteration


async def test_a_repeat_condition_returning_a_coroutine_is_refused_without_a_warning(
        ) -> None:
    async def later() -> bool:
        return True

    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one(), RepeatBinding(
        id="loop", version="1", program=_inner(), max_iterations=5,
        condition=lambda state: later())]))
    await rt.create("k", plan(node("r", "loop")))
    with pytest.raises(NodeFailedError, match="returned coroutine"):
        await rt.run("k")


@pytest.mark.parametrize("kind", ["graph", "repeat"])
async def test_a_container_output_is_checked_against_its_output_schema(kind: str) -> None:
    strict = {"type": "object", "required": ["zzz"]}
    container = GraphBinding(id="c", version="1", program=_inner(), output_schema=strict) \
        if kind == "graph" else RepeatBinding(id="c", version="1", program=_inner(),
                                              max_iterations=1, output_schema=strict,
                                              condition=lambda state: True)
    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one(), container]))
    await rt.create("k", plan(node("c", "c")))
    with pytest.raises(NodeOutputError, match="zzz") as caught:
        await rt.run("k")
    assert caught.value.node_id == "c"
    view = await rt.inspect("k")
    assert (view.status, view.nodes["c"].state) == ("failed", "failed")
    assert view.nodes["c/x" if kind == "graph" else "c/0/x"].state == "completed"


class SmallRecords(InMemoryDurableTaskStore):
    """A store that keeps at most 1000 bytes per blob (as MongoDB keeps at most 16 MiB)."""

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(durable=False, name="small", max_blob_bytes=1000)


@pytest.mark.parametrize("value", ["x" * 2000, "\u00e9" * 600],  # 600 chars, 1200 bytes
                         ids=["ascii", "multibyte"])
async def test_an_output_larger_than_the_store_keeps_fails_the_node(value: str) -> None:
    calls: list[str] = []

    def big(args: dict[str, Any]) -> dict[str, Any]:
        calls.append("big")
        return {"blob": value}

    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", big)]), store=SmallRecords())
    await rt.create("k", plan(node("a")))
    for _ in range(2):  # a second run reports it; the tool is not run again
        with pytest.raises(NodeOutputError, match="more than the 1000 bytes") as caught:
            await rt.run("k")
        assert caught.value.details["limit"] == 1000
    assert calls == ["big"]
    view = await rt.inspect("k")
    assert (view.status, view.nodes["a"].state) == ("failed", "failed")


async def test_an_output_within_the_stores_limit_completes() -> None:
    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", lambda a: {"blob": "x" * 900})]),
                               store=SmallRecords())
    await rt.create("k", plan(node("a")))
    assert (await rt.run("k")).output["a"] == {"blob": "x" * 900}


async def test_a_huge_error_message_is_journaled_bounded() -> None:
    def fails(args: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("e" * 1_000_000)

    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", fails)]))
    await rt.create("k", plan(node("a")))
    with pytest.raises(NodeFailedError):
        await rt.run("k")
    view = await rt.inspect("k")
    error = view.nodes["a"].error
    assert error is not None and view.error is not None
    assert 4000 < len(error.message) < 4100 and error.message.endswith("more characters)")
    assert len(view.error.message) < 4200
    events = (await rt.timeline("k", limit=1000)).events
    assert max(len(json.dumps(e.data)) for e in events) < 10_000


class BigAnswers:
    """A destination that accepts the action and answers with more than the store keeps."""

    id = "big"
    version = "1"
    idempotent_destination = False

    def __init__(self) -> None:
        self.dispatches = 0

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatches += 1
        return ActionOutcome(output={"blob": "x" * 2000}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        return Unknown("not asked")


async def test_an_effect_answer_larger_than_the_store_keeps_is_uncertain_not_redone() -> None:
    conn = BigAnswers()
    rt = ExecutionGraphRuntime(catalog=HostCatalog([ToolBinding(
        id="send", version="1", connector=conn, destination="d", input_schema=OBJ,
        output_schema=OBJ)]), store=SmallRecords())
    await rt.create("k", plan(node("a", "send")))
    for _ in range(2):
        with pytest.raises(DurableRecoveryRequiredError):
            await rt.run("k")
    assert conn.dispatches == 1  # it took effect: never dispatched again
    view = await rt.inspect("k")
    [action] = view.actions
    assert (view.nodes["a"].state, action.state) == ("uncertain", "uncertain")
    assert "more than the 1000 bytes" in (action.reason or "")


@pytest.mark.parametrize("in_thread", [True, False], ids=["thread", "loop"])
async def test_a_sync_tool_raising_stopiteration_fails_the_node(in_thread: bool) -> None:
    # asyncio cannot set a StopIteration on a future: raised in a tool's thread, it used to
    # leave the node's await pending forever.
    def exhausted(args: dict[str, Any]) -> dict[str, Any]:
        return {"first": next(iter([]))}

    binding = ToolBinding(id="t", version="1", execute=exhausted, recovery="pure",
                          run_in_thread=in_thread)
    rt = ExecutionGraphRuntime(catalog=HostCatalog([binding]))
    await rt.create("k", plan(node("a")))
    with pytest.raises(NodeFailedError, match="StopIteration") as caught:
        await asyncio.wait_for(rt.run("k"), 10)
    assert caught.value.node_id == "a"
    view = await rt.inspect("k")
    assert view.status == "failed" and view.nodes["a"].state == "failed"
    assert view.nodes["a"].error is not None
    assert view.nodes["a"].error.details["exception_type"] == "StopIteration"


async def test_an_error_message_holding_a_lone_surrogate_is_journaled_escaped(
        tmp_path: Any) -> None:
    # A file name decoded with surrogateescape, quoted by the exception: text no store can
    # encode as UTF-8. It used to fail the settling commit, leaving the node running and
    # its tool called again by every later run.
    from agentium_graph_sqlite import SQLiteDurableTaskStore

    name = b"report-\xff.csv".decode("utf-8", "surrogateescape")
    calls: list[int] = []

    def read(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        raise FileNotFoundError(f"no such file: {name}")

    for store in (InMemoryDurableTaskStore(), SQLiteDurableTaskStore(tmp_path / "s.db")):
        calls.clear()
        rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", read)]), store=store)
        await rt.create("k", plan(node("a")))
        for _ in range(2):  # the second run re-raises the journaled failure
            with pytest.raises(NodeFailedError, match=r"report-\\udcff\.csv"):
                await rt.run("k")
        view = await rt.inspect("k")
        assert calls == [1] and view.verified
        assert view.nodes["a"].state == "failed" and len(view.nodes["a"].attempts) == 1
        error = view.nodes["a"].error
        assert error is not None and error.message.endswith("report-\\udcff.csv")
        await store.close()


def test_error_info_escapes_lone_surrogates_in_its_details() -> None:
    bad = "x\udcffy"
    info = ErrorInfo(code="c", message=bad, details={"name": bad, "list": [bad, 1],
                                                      bad: {"deep": bad}})
    assert info.message == "x\\udcffy"
    assert info.details == {"name": "x\\udcffy", "list": ["x\\udcffy", 1],
                            "x\\udcffy": {"deep": "x\\udcffy"}}
    assert ErrorInfo.model_validate_json(info.model_dump_json()) == info
    plain = ErrorInfo(code="c", message="é ok", details={"k": ("a", "b")})
    assert plain.message == "é ok" and plain.details == {"k": ["a", "b"]}


async def test_a_repeat_condition_changing_what_it_is_given_changes_no_output() -> None:
    def condition(state: dict[str, Any]) -> bool:
        state["outputs"].pop("x")
        state["input"]["seed"] = "changed"
        return False

    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one(), RepeatBinding(
        id="loop", version="1", program=_inner(), max_iterations=5,
        condition=condition)]))
    await rt.create("k", plan(node("r", "loop", {"seed": "s"})))
    result = await rt.run("k")
    assert result.output["r"] == {"iterations": 1, "stopped": "condition",
                                  "last": {"x": {"value": 1}}}
    view = await rt.inspect("k")
    assert view.verified and view.nodes["r"].output == result.output["r"]


class _Abort(BaseException):
    """A host's own BaseException (not an Exception)."""


@pytest.mark.parametrize("error", [_Abort("give up"), asyncio.CancelledError()],
                         ids=["base-exception", "cancelled"])
async def test_a_repeat_condition_raising_a_base_exception_fails_the_node(
        error: BaseException) -> None:
    def condition(state: dict[str, Any]) -> bool:
        raise error

    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one(), RepeatBinding(
        id="loop", version="1", program=_inner(), max_iterations=5,
        condition=condition)]))
    await rt.create("k", plan(node("r", "loop")))
    for _ in range(2):  # the failure is journaled: a second run re-raises it
        with pytest.raises(NodeFailedError, match="repeat condition raised") as caught:
            await rt.run("k")
        assert caught.value.node_id == "r"
    view = await rt.inspect("k")
    assert view.status == "failed" and view.nodes["r"].state == "failed"
    assert view.nodes["r/0/x"].state == "completed" and view.verified


async def test_an_admission_observer_raising_a_base_exception_breaks_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def observer(event: Any) -> None:
        seen.append(event.kind)
        raise _Abort("observer gave up")

    rt = ExecutionGraphRuntime(catalog=HostCatalog([_one()]), on_admission=observer)
    await rt.create("k", plan(node("a", "one"), node("b", "one", dependsOn=["a"])))
    assert (await rt.run("k")).output == {"a": {"value": 1}, "b": {"value": 1}}
    assert seen.count("admitted") == 2 and seen.count("released") == 2
    assert "on_admission callback failed" in caplog.text


async def test_an_output_integer_too_long_to_write_fails_as_output_not_json() -> None:
    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", lambda a: {"n": 10 ** 5000})]))
    await rt.create("k", plan(node("a")))
    with pytest.raises(NodeOutputError, match=r"at \$\.n: integer has more than 4300 digits"):
        await rt.run("k")
    assert (await rt.inspect("k")).nodes["a"].state == "failed"


@pytest.mark.parametrize("where", ["input", "plan"])
async def test_an_input_or_plan_larger_than_the_store_keeps_is_refused_at_create(
        where: str) -> None:
    # (review 44) Only outputs were held to the store's record size: a larger input or plan
    # reached a store that had said it cannot hold it, with whatever error that store gives.
    rt = ExecutionGraphRuntime(catalog=HostCatalog([tool("t", lambda args: {})]),
                               store=SmallRecords())
    big = "\u00e9" * 600  # 600 characters, 1200 bytes
    program = plan(node("a", args={"note": big})) if where == "plan" else plan(node("a"))
    with pytest.raises(PlanValidationError) as info:
        await rt.create("k", program, input={"blob": big} if where == "input" else None)
    [problem] = info.value.diagnostics
    assert problem.code == f"{where}_too_large" and "max_blob_bytes" in problem.message
    assert await rt.store.get_header("k") is None
