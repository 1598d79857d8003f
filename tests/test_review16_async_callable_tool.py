"""A tool whose ``execute`` is an object with an ``async def __call__`` (or a partial of an
``async def``) is an async tool: called on the event loop in the node's own task, like an
``async def``, never first called in a worker thread to make its coroutine.

Before, only an ``async def`` or a partial of one counted (``inspect.iscoroutinefunction``):
a callable object was called through ``asyncio.to_thread`` (a thread hop per call, for
nothing: its body only runs when the coroutine it returns is awaited) and a stop of the run
did not cancel it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    ToolBinding,
)


class Doubler:
    """An async callable object that notes where it was called and in which task."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str | None]] = []

    async def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        task = asyncio.current_task()
        self.calls.append((threading.get_ident(), None if task is None else task.get_name()))
        await asyncio.sleep(0)
        return {"value": args["x"] * 2}


async def _doubled(note: list[tuple[int, str | None]], args: dict[str, Any]) -> dict[str, Any]:
    task = asyncio.current_task()
    note.append((threading.get_ident(), None if task is None else task.get_name()))
    return {"value": args["x"] * 2}


@pytest.mark.parametrize("shape", ["object", "partial"])
async def test_an_async_callable_tool_runs_on_the_loop_in_its_node_task(
        shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    threaded: list[Any] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        threaded.append(args)
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    calls: list[tuple[int, str | None]] = []
    if shape == "object":
        doubler = Doubler()
        calls = doubler.calls
        execute: Any = doubler
    else:
        execute = functools.partial(_doubled, calls)
    catalog = HostCatalog([ToolBinding(
        id="double", version="1", execute=execute, recovery="pure",
        input_schema={"type": "object", "properties": {"x": {"type": "integer"}}},
        output_schema={"type": "object", "properties": {"value": {"type": "integer"}}})])
    program = ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "a", "binding": "double", "version": "1", "args": {"x": 3}}]})
    runtime = ExecutionGraphRuntime(catalog=catalog, store=InMemoryDurableTaskStore())
    await runtime.create("k", program)
    result = await runtime.run("k")
    assert result.status == "completed"
    assert result.output["a"] == {"value": 6}
    assert calls == [(threading.get_ident(), "node:k:a")]
    assert threaded == []  # before: the object was called in a worker thread first
