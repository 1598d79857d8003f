"""Running a pure tool's callback for one attempt: its context, its thread, and what its
exceptions mean (the scheduler in :mod:`._run` launches it; agents call tools through it)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentium_graph._otel import attempt_span, ended
from agentium_graph.catalog._bindings import ToolBinding
from agentium_graph.errors import (
    ConfigurationError,
    ErrorInfo,
    NodeFailedError,
    TaskCanceledError,
)
from agentium_graph.runtime import _effects as effects
from agentium_graph.runtime._context import ToolContext, reset_context, set_context
from agentium_graph.runtime._graph import NodeSpec
from agentium_graph.runtime._outcome import Outcome, check_output

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun


async def invoke_tool(run: TaskRun, node: NodeSpec, args: dict[str, Any],
                      ctx: ToolContext) -> Outcome:
    binding = node.binding
    if not isinstance(binding, ToolBinding) or binding.execute is None:
        raise ConfigurationError(
            f"node {node.id!r}: {binding.kind} bindings are not executable by this "
            "runtime version", node_id=node.id)
    fn = binding.execute
    with attempt_span(run.key, node.id, ctx.attempt, binding.id) as attempt:
        token = set_context(ctx)
        try:
            if node.is_async:
                result = await fn(args)
            elif binding.run_in_thread:
                result = await _in_a_thread(fn, args, ctx)
                if type(result) is _Raised:
                    raise result.error
            else:
                result = fn(args)
            if type(result) not in _PLAIN and inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError as exc:
            if effects.runtime_cancelled():
                ended(attempt, None)
                raise  # the runtime canceled this node (cancel, deadline)
            error = escaped_cancel(node.id)
            error.__cause__ = exc
            return ended(attempt, Outcome("failed", error=error.to_info(), exception=error))
        except Exception as exc:
            if isinstance(exc, TaskCanceledError) and ctx.cancelled:
                # ctx.raise_if_cancelled(): the tool stopped as asked, which is a cancel
                # (the stop's final commit closes the node with the stop's own error).
                return ended(attempt, Outcome("canceled"))
            return ended(attempt, Outcome("failed", exception=exc,
                                          error=ErrorInfo.from_exception(exc, node_id=node.id)))
        finally:
            reset_context(token)
        return ended(attempt, check_output(node.id, binding, result, run.max_blob_bytes))


# What a tool returns when it returns data: nothing of these types is awaitable.
_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})


def escaped_cancel(node_id: str) -> NodeFailedError:
    return NodeFailedError(
        f"node {node_id!r}: its code raised CancelledError although the runtime did not "
        "cancel it (an inner task or future was canceled); catch that cancellation in the "
        "tool, or raise an ordinary exception to fail the node", node_id=node_id,
        details={"error": "CancelledError"})


class _Raised:
    """A StopIteration a sync tool raised in its thread, carried back as a value: asyncio
    cannot set one on a future (it raises TypeError in the executor's callback instead, and
    the awaiting node would wait forever)."""

    __slots__ = ("error",)

    def __init__(self, error: StopIteration) -> None:
        self.error = error


async def _in_a_thread(fn: Callable[[dict[str, Any]], Any], args: dict[str, Any],
                      ctx: ToolContext) -> Any:
    """``fn(args)`` in a worker thread (with this context, as ``asyncio.to_thread``), but a
    cancellation does not end the wait while the thread goes on: no thread can be stopped,
    so the node's task, and the root permit bound to it, last until the tool really ends.
    The run gives a canceled node its grace period and then abandons it, as for an async
    tool that ignores its cancellation; the CancelledError is raised when the thread ends.

    The thread comes from the loop's default executor, which every task of the process
    shares: a node stopped (canceled, past its deadline) while it waited there for a thread
    never calls the tool."""
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(None, functools.partial(
        contextvars.copy_context().run, _in_thread, fn, args, ctx))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():  # asyncio.wait neither cancels nor raises what work raised
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # seen: what an abandoned tool raised is ignored, like its result
        raise


def _in_thread(fn: Callable[[dict[str, Any]], Any], args: dict[str, Any],
               ctx: ToolContext) -> Any:
    ctx.raise_if_cancelled()  # stopped while it queued for a thread: the tool never starts
    try:
        return fn(args)
    except StopIteration as exc:
        return _Raised(exc)
