"""Eager start of a node's coroutine (runtime/_eager.py): the first step runs at once, yet
inside the node's own task and context, so tool code sees exactly what an ordinary task
would give it."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    ToolBinding,
    tool_context,
)
from agentium_graph.runtime._eager import NOT_DONE, start_eager

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


class Boom(BaseException):
    pass


def _runtime(tool: Any) -> ExecutionGraphRuntime:
    catalog = HostCatalog([ToolBinding(id="t", version="1", execute=tool, recovery="pure")])
    return ExecutionGraphRuntime(catalog=catalog, store=InMemoryDurableTaskStore())


def _plan(*ids: str) -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": i, "binding": "t", "version": "1", "args": {}} for i in ids]})


async def test_the_first_step_runs_inside_the_nodes_own_task() -> None:
    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        return {"task": task.get_name()}

    rt = _runtime(tool)
    await rt.create("k", _plan("a"))
    result = await rt.run("k")
    assert result.output["a"] == {"task": "node:k:a"}


async def test_a_timeout_entered_in_the_first_step_cancels_only_the_tool() -> None:
    # asyncio.timeout() captures the current task when entered: were it the scheduler's,
    # the expiry would cancel the whole run instead of the tool's own wait.
    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)
        except TimeoutError:
            return {"timed_out": True}
        return {"timed_out": False}

    rt = _runtime(tool)
    await rt.create("k", _plan("a", "b"))
    result = await asyncio.wait_for(rt.run("k"), 5)
    assert result.output == {"a": {"timed_out": True}, "b": {"timed_out": True}}


async def test_context_is_the_nodes_own_before_and_after_it_suspends() -> None:
    seen: list[tuple[str, str]] = []

    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        VAR.set(tool_context().node_id)
        seen.append(("first", tool_context().node_id))
        await asyncio.sleep(0)
        seen.append(("after", VAR.get()))
        return {}

    rt = _runtime(tool)
    await rt.create("k", _plan("a", "b"))
    await rt.run("k")
    assert sorted(seen) == [("after", "a"), ("after", "b"), ("first", "a"), ("first", "b")]
    assert VAR.get() == "unset"  # nothing leaked into the caller's context


async def test_a_coroutine_that_returns_at_once_is_handed_over_and_its_task_ends() -> None:
    async def body() -> int:
        return 7

    loop = asyncio.get_running_loop()
    task, value = start_eager(loop, body(), "eager")
    assert value == 7
    assert await task == 7
    assert asyncio.current_task() is not task  # the caller's task is current again


async def test_a_coroutine_that_suspends_goes_on_in_its_task() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def body() -> int:
        steps.append("first")
        value = await future
        steps.append("second")
        return value + 1

    task, value = start_eager(asyncio.get_running_loop(), body(), "eager")
    assert value is NOT_DONE and steps == ["first"]
    future.set_result(41)
    assert await task == 42
    assert steps == ["first", "second"]


async def test_cancel_before_the_task_takes_over_reaches_the_code_and_its_wait() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    caught: list[str] = []

    async def body() -> None:
        try:
            await future
        except asyncio.CancelledError:
            caught.append("cancelled")
            raise

    task, value = start_eager(asyncio.get_running_loop(), body(), "eager")
    assert value is NOT_DONE
    task.cancel()  # before the loop ran the task's first step
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught == ["cancelled"]
    assert future.cancelled()  # what it waited for is canceled, as Task.cancel() does


async def test_an_exception_of_the_first_step_is_the_tasks_own() -> None:
    async def fails() -> None:
        raise ValueError("no")

    async def interrupts() -> None:
        raise Boom()

    task, value = start_eager(asyncio.get_running_loop(), fails(), "eager")
    assert value is NOT_DONE
    with pytest.raises(ValueError, match="no"):
        await task
    task, value = start_eager(asyncio.get_running_loop(), interrupts(), "eager")
    assert value is NOT_DONE
    with pytest.raises(Boom):
        await task


async def test_a_hosts_task_factory_is_respected() -> None:
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        made.append("factory")  # no context parameter, as many older factories
        return asyncio.Task(coro, loop=loop)

    async def tool(args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    loop.set_task_factory(factory)
    try:
        rt = _runtime(tool)
        await rt.create("k", _plan("a"))
        result = await rt.run("k")
    finally:
        loop.set_task_factory(None)
    assert result.output == {"a": {"ok": True}}
    assert made  # the node's task came from the host's factory
