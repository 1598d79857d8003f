"""The running node's context, visible to tool callbacks through ``tool_context()``."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

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


def new_context(key: str, node_id: str, attempt: int, attempt_id: str, fence: int,
                worker_id: str, binding: str, version: str) -> ToolContext:
    """``ToolContext(key=..., ..., version=...)`` with a fresh cancel flag, built directly:
    a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, nine
    calls per node. The instance's ``__dict__`` is the one ``__init__`` leaves (same keys,
    same order: ``tests/test_hot_path_equivalence.py`` compares them)."""
    ctx = _new_ctx(ToolContext)
    ctx.__dict__.update({"key": key, "node_id": node_id, "attempt": attempt,
                         "attempt_id": attempt_id, "fence": fence, "worker_id": worker_id,
                         "binding": binding, "version": version, "_cancel": CancelFlag()})
    return ctx


_new_ctx = object.__new__

_current: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "agentium_graph_tool_context", default=None)


def tool_context() -> ToolContext:
    """The context of the node whose callback is running; raises outside a tool."""
    ctx = _current.get()
    if ctx is None:
        raise AgentiumGraphError(
            "tool_context() is only available inside a tool callback run by the runtime")
    return ctx


# The variable's own methods, not Python functions wrapping them: each runs once or twice
# per node (a frame apiece).
current_context: Final[Callable[[], ToolContext | None]] = _current.get
set_context: Final[Callable[[ToolContext | None], contextvars.Token[ToolContext | None]]] = \
    _current.set
reset_context: Final[Callable[[contextvars.Token[ToolContext | None]], None]] = _current.reset
