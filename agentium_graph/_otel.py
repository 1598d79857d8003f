"""OpenTelemetry spans through the API only: a no-op until the host configures an SDK."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

_tracer = trace.get_tracer("agentium_graph")

AttrValue = str | int | float | bool


_UNKNOWN = object()
_NO_SPAN: Final = nullcontext()  # reusable: what every span is while tracing is off
# With this variable set, the first get_tracer_provider() call loads that provider.
_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _configured() -> bool:
    """Whether a host has set a tracer provider. ``get_tracer_provider()`` reads the
    environment on every call until one is set (about 2 us, paid per node), so the API's
    module global is read first; the public call decides when that global is absent."""
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _FROM_ENVIRONMENT:
        return False
    if provider is None or provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider)


def span(name: str, attributes: Mapping[str, AttrValue]) -> AbstractContextManager[Any]:
    """A span named ``name``; skipped entirely while no tracer provider is configured, so
    the per-node path pays nothing for observability nobody collects."""
    if not _configured():
        return _NO_SPAN
    return _tracer.start_as_current_span(name, attributes=dict(attributes))


def attempt_span(key: str, node_id: str, attempt: int,
                 binding: str) -> AbstractContextManager[Any]:
    """:func:`span` of one attempt of a node; its attributes are built only when a tracer
    provider is configured (this runs once per node)."""
    if not _configured():
        return _NO_SPAN
    return _tracer.start_as_current_span("agentium_graph.node.attempt", attributes={
        "agentium.task.key": key, "agentium.node.id": node_id, "agentium.attempt": attempt,
        "agentium.binding": binding})


_O = TypeVar("_O")


def ended(attempt: Any, outcome: _O) -> _O:
    """``outcome`` (a leaf's Outcome), after marking the attempt span ``attempt`` (None while
    tracing is off) with it: ``agentium.attempt.outcome`` is its state, and a ``failed`` or
    ``uncertain`` attempt has status ERROR with its error's message. ``outcome`` None: the
    attempt was canceled (no error)."""
    if attempt is not None:
        state = "canceled" if outcome is None else str(getattr(outcome, "state", "unknown"))
        attempt.set_attribute("agentium.attempt.outcome", state)
        if state in ("failed", "uncertain"):
            error = getattr(outcome, "error", None)
            attempt.set_status(Status(StatusCode.ERROR, getattr(error, "message", state)))
    return outcome


def failed(current: Any, error: BaseException) -> None:
    """Mark ``current`` (a span, None while tracing is off) failed with ``error``, which
    the code it covers handles itself (so the span's own exit never sees it)."""
    if current is not None:
        current.record_exception(error)
        current.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def traced_attempt(ctx: Any, work: Coroutine[Any, Any, _O]) -> Coroutine[Any, Any, _O]:
    """``work`` (a leaf node's attempt: an effect or an agent) in a node-attempt span like a
    tool's (:func:`attempt_span`, marked by :func:`ended`); ``work`` itself while tracing is
    off. ``ctx`` is the node's ToolContext."""
    if not _configured():
        return work
    return _attempt(ctx, work)


async def _attempt(ctx: Any, work: Coroutine[Any, Any, _O]) -> _O:
    with attempt_span(ctx.key, ctx.node_id, ctx.attempt, ctx.binding) as current:
        try:
            outcome = await work
        except asyncio.CancelledError:
            ended(current, None)
            raise
        return ended(current, outcome)


def start_span(name: str, attributes: Mapping[str, AttrValue]) -> Any:
    """A span started now and ended by the caller (``.end()``), for a wait that no single
    coroutine spans (a node's root permit is granted by another part of the loop); None
    while no tracer provider is configured."""
    if not _configured():
        return None
    return _tracer.start_span(name, attributes=dict(attributes))


STORE_OPS = ("create_task", "get_header", "get_task", "get_identity", "list_tasks",
             "acquire_lease", "renew_lease", "release_lease", "request_cancel", "commit",
             "get_blobs", "read_timeline")
_S = TypeVar("_S")


def traced_store(store: str) -> Callable[[type[_S]], type[_S]]:
    """Class decorator: every store operation runs in an ``agentium_graph.store.<op>`` span
    (attributes ``agentium.store`` and, when the request names one, ``agentium.task.key``).
    Unconfigured, an operation costs one extra function call: its coroutine is returned as
    is, not wrapped."""
    def decorate(cls: type[_S]) -> type[_S]:
        for op in STORE_OPS:
            setattr(cls, op, _traced_op(getattr(cls, op), store, op))
        return cls
    return decorate


def _traced_op(fn: Callable[..., Coroutine[Any, Any, Any]], store: str,
               op: str) -> Callable[..., Any]:
    name = f"agentium_graph.store.{op}"

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        coro = fn(self, *args, **kwargs)
        if not _configured():
            return coro
        attributes: dict[str, AttrValue] = {"agentium.store": store}
        first = args[0] if args else kwargs.get("key", kwargs.get("request"))
        # A key (str), a request with .key, or a create request (its header's key).
        key = first if isinstance(first, str) else getattr(
            first, "key", getattr(getattr(first, "header", None), "key", None))
        if isinstance(key, str):
            attributes["agentium.task.key"] = key
        return _run_in_span(coro, name, attributes)

    call.__name__ = fn.__name__
    call.__qualname__ = fn.__qualname__
    call.__doc__ = fn.__doc__
    return call


async def _run_in_span(coro: Coroutine[Any, Any, Any], name: str,
                       attributes: dict[str, AttrValue]) -> Any:
    with _tracer.start_as_current_span(name, attributes=attributes):
        return await coro
