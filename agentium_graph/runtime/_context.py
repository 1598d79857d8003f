"""The running node's context, visible to tool callbacks through ``tool_context()``."""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field

from agentium_graph.errors import AgentiumGraphError

_EVENT_LOCK = threading.Lock()


class CancelFlag:
    """A set-once flag a sync tool can block on. The ``threading.Event`` (a lock and a
    condition) is only built when a tool actually waits, not once per node."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        self._set = True
        with _EVENT_LOCK:
            event = self._event
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._set:  # set before anyone waited
                    self._event.set()
            event = self._event
        return event.wait(timeout)


@dataclass(frozen=True)
class ToolContext:
    """Where a tool callback runs: task, node, attempt, fence, and cooperative cancellation."""

    key: str
    node_id: str
    attempt: int
    attempt_id: str
    fence: int
    worker_id: str
    binding: str
    version: str
    _cancel: CancelFlag = field(default_factory=lambda: CancelFlag(), repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the task was canceled or its deadline passed; stop work and return."""
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        if self._cancel.is_set():
            from agentium_graph.errors import TaskCanceledError

            raise TaskCanceledError(f"task {self.key!r} is stopping (canceled, or past its "
                                    f"deadline) while node {self.node_id!r} runs",
                                    node_id=self.node_id)

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block (in a sync tool) until cancellation or ``timeout``; True if canceled."""
        return self._cancel.wait(timeout)


_current: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "agentium_graph_tool_context", default=None)


def tool_context() -> ToolContext:
    """The context of the node whose callback is running; raises outside a tool."""
    ctx = _current.get()
    if ctx is None:
        raise AgentiumGraphError(
            "tool_context() is only available inside a tool callback run by the runtime")
    return ctx


def current_context() -> ToolContext | None:
    return _current.get()


def set_context(ctx: ToolContext | None) -> contextvars.Token[ToolContext | None]:
    return _current.set(ctx)


def reset_context(token: contextvars.Token[ToolContext | None]) -> None:
    _current.reset(token)
