"""Starting a node's coroutine eagerly: its first step runs at once, inside its own task.

A tool that finishes without suspending (a pure computation, a cache hit, the bench's no-op
tools) then costs no pass of the event loop at all: the scheduler takes its outcome in the
same turn it launched it, instead of waiting one pass for the task to run, one for its done
callback and one for the wake-up of the scheduler itself. A tool that does suspend goes on
exactly as in an ordinary task.

Python 3.12 does this natively (``asyncio.Task(..., eager_start=True)``). On 3.11 the task
is created as usual with a wrapper coroutine, and its first step is run here with the task
made current (``asyncio.current_task()`` inside the tool is the node's task, as code using
``asyncio.timeout`` or a ``TaskGroup`` requires) and in the task's own context copy. The
wrapper hands the task whatever that first step left: the future it waits for, its return
value or its exception, so the task's own first step only passes it on.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")

NOT_DONE: Final = object()  # the first step suspended (or raised): wait for the task

_NATIVE: Final = sys.version_info >= (3, 12)

_FRESH, _YIELDED, _RETURNED, _RAISED, _THROUGH = range(5)


def start_eager(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T],
                name: str) -> tuple[asyncio.Task[T], Any]:
    """A task running ``coro`` whose first step has already run, and its return value when
    that step finished it (else :data:`NOT_DONE`: await the task or add a done callback).

    The value is handed over only for a coroutine that *returned*; one that raised (even a
    ``BaseException``) is reported by its task, like any task's failure. A loop with a task
    factory of the host's gets an ordinary ``create_task``: that factory decides what a
    task is (and may not take the ``context`` argument the 3.11 path passes)."""
    if loop.get_task_factory() is not None:
        return loop.create_task(coro, name=name), NOT_DONE
    if _NATIVE:  # pragma: no cover - CI runs 3.11; the 3.12 test job covers this branch
        task: asyncio.Task[T] = asyncio.Task(coro, loop=loop, name=name,  # type: ignore[call-arg, unused-ignore]
                                             eager_start=True)
        if task.done() and not task.cancelled() and task.exception() is None:
            return task, task.result()
        return task, NOT_DONE
    first = _FirstStep(coro)
    context = contextvars.copy_context()
    task = loop.create_task(first, name=name, context=context)
    current = asyncio.current_task(loop)
    if current is not None:
        asyncio.tasks._leave_task(loop, current)
    asyncio.tasks._enter_task(loop, task)
    try:
        context.run(first.run)
    finally:
        asyncio.tasks._leave_task(loop, task)
        if current is not None:
            asyncio.tasks._enter_task(loop, current)
    if first.state == _RETURNED:
        return task, first.value
    return task, NOT_DONE


class _FirstStep(Coroutine[Any, Any, T], Generic[T]):
    """The coroutine a 3.11 eager task runs: ``coro`` after its first step ran elsewhere."""

    __slots__ = ("coro", "state", "value")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.state = _FRESH
        self.value: Any = None

    def run(self) -> None:
        """The first step, run by :func:`start_eager` with the task current."""
        try:
            self.value = self.coro.send(None)
        except StopIteration as stop:
            self.state, self.value = _RETURNED, stop.value
        except BaseException as exc:  # the task raises it at its first step
            self.state, self.value = _RAISED, exc
        else:
            self.state = _YIELDED

    def send(self, value: Any) -> Any:
        state = self.state
        if state == _THROUGH:
            return self.coro.send(value)
        pending, self.value = self.value, None
        self.state = _THROUGH
        if state == _YIELDED:
            return pending  # the future the first step waits for: the task waits for it
        if state == _RETURNED:
            raise StopIteration(pending)
        if state == _RAISED:
            raise pending
        return self.coro.send(value)  # never stepped eagerly (not reached)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        # Tasks call throw(exc); the old three-argument form is accepted too.
        if isinstance(val, BaseException):
            exc = val
        elif isinstance(typ, BaseException):
            exc = typ
        else:
            exc = typ() if val is None else typ(val)
        state = self.state
        if state == _YIELDED:
            # Canceled before the task took over the first step's wait: cancel what it waits
            # for, as Task.cancel() would have, then deliver the cancellation to the code.
            self.state = _THROUGH
            pending, self.value = self.value, None
            if isinstance(exc, asyncio.CancelledError) and isinstance(pending, asyncio.Future):
                pending.cancel()
        elif state in (_RETURNED, _RAISED):
            self.state, self.value = _THROUGH, None
            raise exc  # the coroutine already ended: the task ends with this exception
        return self.coro.throw(exc)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, None, T]:  # pragma: no cover - tasks step it
        return (yield from self.coro.__await__())
