"""Provider and connector calls the runtime can stop waiting for.

The provider and connector contracts say a canceled call stops promptly. One that breaks it
-- that catches ``CancelledError`` and keeps awaiting, or keeps streaming -- must not hold a
run open: a task cancel, a lost lease, a deadline or a time limit would then never end
``run()``. So such a call runs in a task of its own. To stop it, the runtime cancels that
task and waits at most :data:`GRACE` seconds for it to end; a task still running then is
abandoned: a warning naming the call (its task, node and provider or connector) is logged,
nothing awaits it any more and nothing it returns or sends later is used. The caller then
ends exactly as it would have had the call honored the cancel.

:func:`call` runs one awaitable this way (a ``complete()`` or a whole assembled stream) and
:func:`within` is the same for a caller that must tell a timeout from any result (a
connector's dispatch or lookup); :class:`OwnedStream` reads a stream event by event, every
step of it (each ``__anext__`` and the final ``aclose()``) in one task, since a provider may
hold task-bound state across its yields (a timeout or cancel scope). :func:`stop_all` ends
what a run leaves behind, and :func:`overdue` is how long a stop waits for a node's task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from agentium_graph.providers._models import StreamEvent
from agentium_graph.providers._protocol import close_stream

T = TypeVar("T")

# Seconds a canceled provider call has to end before it is abandoned. The contract asks a
# provider to stop promptly (closing a connection is local work), so one that has not ended
# within a second has swallowed the cancellation; a longer wait would only delay the end of
# every canceled run whose provider misbehaves.
GRACE = 1.0
log = logging.getLogger("agentium_graph.runtime")

_END: Any = object()  # what OwnedStream's task reports for the stream's end

PROVIDER = "a ModelProvider"  # whose contract a call breaks when it swallows a cancel
CONNECTOR = "a DurableActionConnector"


def named(kind: str, thing: Any) -> str:
    """How a log line names a provider or a connector: its id, its version and its class."""
    return (f"{kind} {getattr(thing, 'id', '?')!r} version "
            f"{getattr(thing, 'version', '?')!r} ({type(thing).__name__})")


def provider_name(provider: Any) -> str:
    return named("provider", provider)


async def call(work: Coroutine[Any, Any, T], limit: float | None, who: str, *,
               name: str, started: Callable[[asyncio.Task[Any]], None] | None = None
               ) -> T | None:
    """Await ``work`` (a provider call) in a task of its own, for at most ``limit`` seconds.

    Returns its result (its exception is raised), or None when the time passed: the task
    was then stopped (:func:`stop`). When the caller is canceled, the task is stopped and
    the cancellation goes on. ``who`` names the call and its provider in the log;
    ``started`` is given the task first (whatever must last as long as the call does)."""
    task = await within(work, limit, who, name=name, started=started)
    return None if task is None else task.result()


async def within(work: Coroutine[Any, Any, T], limit: float | None, who: str, *, name: str,
                 party: str = PROVIDER,
                 started: Callable[[asyncio.Task[Any]], None] | None = None
                 ) -> asyncio.Task[T] | None:
    """:func:`call`, returning the task that ran ``work`` once it ended (its result or its
    exception), or None when the time passed. ``party`` names the contract the code
    breaks if it swallows the cancel."""
    task = asyncio.create_task(work, name=name)
    if started is not None:
        started(task)
    if not await wait_or_stop(task, task, limit, who, party=party):
        return None
    return task


async def wait_or_stop(waited: asyncio.Future[Any], task: asyncio.Task[Any],
                       limit: float | None, who: str,
                       stopping: Callable[[], None] | None = None, *,
                       party: str = PROVIDER) -> bool:
    """Wait at most ``limit`` seconds for ``waited`` (which ``task`` resolves): True when
    it is done (or ``task`` ended without resolving it), False when the time passed. On a
    timeout, or when the caller is canceled (the cancellation then goes on), ``stopping``
    is called and ``task`` is stopped (:func:`stop`)."""
    try:
        done, _ = await asyncio.wait({waited, task}, timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        if stopping is not None:
            stopping()
        await stop(task, who, "the call was canceled", party=party)
        raise
    if done:
        return True
    if stopping is not None:
        stopping()
    await stop(task, who, f"the call took longer than {limit:g} s", party=party)
    return False


async def stop(task: asyncio.Task[Any], who: str, why: str, *, party: str = PROVIDER,
               grace: float | None = None) -> None:
    """Cancel ``task`` and wait at most ``grace`` (:data:`GRACE`) seconds for it to end; if
    it does not, abandon it (a warning naming ``who`` and the contract of ``party``).

    A further cancellation of the caller meanwhile is held until the grace is over and then
    raised: a second cancel (a run abandoning the work it stopped a moment ago) must not
    cut short the time a well-behaved provider gets to end."""
    grace = GRACE if grace is None else grace
    left, held = await _cancel_within_grace([task], grace)
    if left:
        log.warning("%s did not end within %g s of being canceled (%s): it swallows "
                    "cancellation, which %s must not do; the call is abandoned and anything "
                    "it returns or sends later is ignored", who, grace, why, party)
    if held is not None:
        raise held


async def stop_all(tasks: list[asyncio.Task[Any]], who: str) -> None:
    """:func:`stop` for the tasks a run leaves behind (its lease was lost, or ``run()`` itself
    was canceled): its nodes' and its planner's. They are canceled and given three times
    :data:`GRACE` to end together (a planner stops its provider within at most twice that
    itself, so only code that swallows cancellation is reported); one still running then
    is abandoned with a warning, so a tool that swallows cancellation cannot hold ``run()``
    open. Nothing it returns later is used: the run that launched it has ended."""
    grace = overdue()
    left, held = await _cancel_within_grace(tasks, grace)
    for task in left:
        abandoned(f"{who}: {task.get_name()}", grace)
    if held is not None:
        raise held


def overdue() -> float:
    """Seconds a canceled node's task (or a planner's) gets to end before it is abandoned:
    three times :data:`GRACE`, as it may first stop a provider or connector call, which
    gets one grace itself (an agent waiting for its effect call, two)."""
    return 3 * GRACE


def abandoned(who: str, grace: float) -> None:
    """Log that the node task ``who`` was abandoned after ``grace`` seconds."""
    log.warning("%s did not end within %g s of being canceled: it swallows cancellation "
                "(a tool must let CancelledError propagate), or it is a sync tool whose "
                "thread cannot be interrupted (it can watch tool_context().cancelled); it is "
                "abandoned, keeps its permit until it ends, and its result is ignored",
                who, grace)


async def _cancel_within_grace(tasks: list[asyncio.Task[Any]], grace: float) -> tuple[
        list[asyncio.Task[Any]], asyncio.CancelledError | None]:
    """Cancel ``tasks`` and wait at most ``grace`` seconds for them to end: the tasks
    still running then, and a cancellation of the caller that came meanwhile (held, so a
    second cancel cannot cut short the time well-behaved code gets to end)."""
    for task in tasks:
        task.add_done_callback(_retrieve)  # nobody may await it any more
        task.cancel()
    loop = asyncio.get_running_loop()
    until = loop.time() + grace
    held: asyncio.CancelledError | None = None
    pending = [t for t in tasks if not t.done()]
    while pending and (left := until - loop.time()) > 0:
        try:
            await asyncio.wait(pending, timeout=left)
        except asyncio.CancelledError as exc:
            held = exc
        pending = [t for t in pending if not t.done()]
    return pending, held


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: nobody awaits a stopped call


class OwnedStream:
    """A provider's stream read through a task of its own.

    :meth:`next` asks that task for one event; :meth:`aclose` has it close the stream
    (``aclose()``). When a :meth:`next` is canceled or times out, the task is stopped
    (:func:`stop`): an event the provider still produces after that is dropped, and the
    task then closes the stream. The task asks the provider for an event only when
    :meth:`next` is called, so the provider is read exactly as by a plain loop."""

    def __init__(self, stream: AsyncIterator[StreamEvent], who: str, *, name: str) -> None:
        self._stream = stream
        self._who = who
        self._asks: asyncio.Queue[asyncio.Future[tuple[bool, Any]] | None] = asyncio.Queue()
        self._stopped = False  # set when the consumer stopped the task (cancel, timeout)
        self._task = asyncio.create_task(self._serve(), name=name)

    @property
    def task(self) -> asyncio.Task[None]:
        """The task reading the stream: it ends with the stream, later than a stop gave up
        on it when the provider swallowed the cancel (or never)."""
        return self._task

    def _stopping(self) -> None:
        self._stopped = True

    async def next(self, within: float | None) -> StreamEvent:
        """The next event: raises what the stream raised (``StopAsyncIteration`` at its
        end), or :class:`TimeoutError` when none came within ``within`` seconds."""
        ask: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self._asks.put_nowait(ask)
        if not await wait_or_stop(ask, self._task, within, self._who, self._stopping):
            raise TimeoutError(f"no stream event within {within:g} s")
        if not ask.done():  # its task ended without answering (read after the end)
            self._task.result()
            raise StopAsyncIteration
        ok, value = ask.result()
        if not ok:
            raise value
        if value is _END:
            raise StopAsyncIteration
        return value  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Close the stream (its ``aclose()``), waiting at most :data:`GRACE` seconds for
        that, then as :func:`stop` does. An error the close raises is raised here. Nothing
        to do once the task was stopped: it closes the stream itself (or was abandoned)."""
        if self._stopped:
            return
        self._asks.put_nowait(None)
        if await wait_or_stop(self._task, self._task, GRACE, self._who, self._stopping):
            self._task.result()

    async def _serve(self) -> None:
        try:
            while not self._stopped:
                ask = await self._asks.get()
                if ask is None:
                    return  # closed by the consumer
                try:
                    event = await anext(self._stream)
                except StopAsyncIteration:
                    _answer(ask, True, _END)
                    return
                except BaseException as exc:  # the consumer raises it as it is
                    _answer(ask, False, exc)
                    if self._stopped and isinstance(exc, asyncio.CancelledError):
                        raise  # the consumer stopped this task
                    return
                _answer(ask, True, event)  # dropped if the consumer stopped meanwhile
        finally:
            await close_stream(self._stream)


def _answer(ask: asyncio.Future[tuple[bool, Any]], ok: bool, value: Any) -> None:
    if not ask.done():
        ask.set_result((ok, value))
