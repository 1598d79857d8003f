"""Root admission: FIFO permits for controlled leaf work within one task.

One permit covers one controlled leaf dispatch (a tool callback or a provider request /
stream). Containers (graphs, repeats, agents waiting on children) never hold one. Waiters
are served strictly in arrival order; a waiter is rejected when the task is canceled or its
deadline passes while it is queued. Persisted counters are charged by the caller, in the
same commit that records the attempt, before anything is dispatched. An effect gives its
permit up while it only looks up what happened and queues again (``reacquire``) before a
dispatch that follows the lookup.

A permit bound to the task that does its work (:meth:`AdmissionController.bind`: a provider
call, a node's task) is released when that task really ends: a call abandoned after a
cancel (it swallowed the ``CancelledError``) keeps its slot while it goes on, so abandoned
work never lets more than ``max_concurrent_work`` calls run at once. Once the run stops
(:meth:`~AdmissionController.reject_all`) nothing queues any more: a request no permit is
free for is rejected at once, so a stopping run never waits for a slot held by such a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentium_graph._otel import start_span
from agentium_graph.errors import NestedDispatchError
from agentium_graph.runtime._context import current_context
from agentium_graph.runtime._views import AdmissionEvent, AdmissionEventKind

log = logging.getLogger("agentium_graph.admission")


@dataclass(eq=False)
class Ticket:
    """A place in the admission queue; ``granted`` once it holds a permit."""

    node_id: str | None
    future: asyncio.Future[None] = field(repr=False)
    # The admission id the work it admits is charged under, when known at the request (and
    # looked up only with an observer: it goes into the ticket's events).
    admission_id: str | None = None
    granted: bool = False
    released: bool = False
    wait_span: Any = field(default=None, repr=False)  # open while it waits (when tracing)
    # bind(): the work the permit covers (a node's task, a call of its in a task of its own)
    work: tuple[asyncio.Future[Any], ...] = field(default=(), repr=False)


class AdmissionController:
    def __init__(self, key: str, capacity: int, clock: Callable[[], datetime],
                 on_event: Callable[[AdmissionEvent], None] | None) -> None:
        self.key = key
        self.capacity = capacity
        self._clock = clock
        self._on_event = on_event
        self._active = 0
        self._holding: dict[int, Ticket] = {}  # granted, not released (by id: unhashable)
        # Tickets an ended run left holding permits (work it abandoned), from reopen(),
        # each dropped when it is released: the next run counts them against their plan's
        # concurrency too, and is told (on_carried_end) when one ends.
        self.carried: list[Ticket] = []
        self.on_carried_end: Callable[[], None] | None = None
        self._queue: deque[Ticket] = deque()
        self._closed: str | None = None  # why the run stopped: nothing queues any more
        self._held: list[AdmissionEvent] | None = None  # events not reported yet
        self.loop = asyncio.get_running_loop()
        # Called when the last permit is released (set while the controller outlives its run)
        self.on_idle: Callable[[], None] | None = None

    def reopen(self) -> None:
        """Serve the task's next run in this runtime: permits still held by work an ended
        run abandoned count against its capacity until that work really ends (and, through
        :attr:`carried`, against their plan's concurrency)."""
        self._closed = None
        self.on_idle = None
        self.carried = [t for t in self._holding.values() if t.node_id is not None]

    def hold_events(self) -> None:
        """Keep events back until :meth:`release_events` (a start that may be refused)."""
        if self._held is None:
            self._held = []

    def release_events(self) -> None:
        """Report every held event, in order, and report new ones at once from now on."""
        held, self._held = self._held or [], None
        for event in held:
            self._report(event)

    @property
    def active(self) -> int:
        return self._active

    @property
    def queued(self) -> int:
        return len(self._queue)

    def emit(self, kind: AdmissionEventKind, node_id: str | None, *,
             admission_id: str | None = None, reason: str | None = None,
             counter: str | None = None) -> None:
        if self._on_event is None:
            return
        event = AdmissionEvent(kind=kind, key=self.key, node_id=node_id,
                               admission_id=admission_id, active=self._active,
                               queued=len(self._queue), capacity=self.capacity,
                               at=self._clock(), reason=reason, counter=counter)
        if self._held is not None:
            self._held.append(event)
        else:
            self._report(event)

    def _report(self, event: AdmissionEvent) -> None:
        assert self._on_event is not None
        try:
            self._on_event(event)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # an observer must never break admission (a sync callback
            # raising CancelledError was not canceled by anyone)
            log.exception("on_admission callback failed for %s", event.kind)

    @property
    def observed(self) -> bool:
        """Whether an ``on_admission`` observer receives events (admission ids are worked
        out for them only then)."""
        return self._on_event is not None

    def request(self, node_id: str | None, admission_id: str | None = None) -> Ticket:
        """Join the FIFO queue; the ticket is granted at once when a permit is free."""
        if current_context() is not None:
            raise NestedDispatchError(
                f"task {self.key!r}: controlled dispatch from inside a running leaf "
                f"({current_context()!r}) is rejected; model the work as a plan node",
                node_id=node_id)
        ticket = Ticket(node_id=node_id, future=asyncio.get_running_loop().create_future(),
                        admission_id=admission_id)
        self._enqueue(ticket)
        return ticket

    def _enqueue(self, ticket: Ticket) -> None:
        self._queue.append(ticket)
        self._grant_waiting()
        if not ticket.granted and self._closed is not None:
            self._queue.remove(ticket)
            self.emit("rejected", ticket.node_id, admission_id=ticket.admission_id,
                      reason=self._closed)
            ticket.future.cancel()
            return
        if not ticket.granted:
            self.emit("queued", ticket.node_id, admission_id=ticket.admission_id)
            ticket.wait_span = start_span("agentium_graph.admission.wait", {
                "agentium.task.key": self.key, "agentium.node.id": ticket.node_id or "",
                "agentium.admission.queued": len(self._queue)})

    def _grant_waiting(self) -> None:
        while self._queue and self._active < self.capacity:
            ticket = self._queue.popleft()
            ticket.granted = True
            self._active += 1
            self._holding[id(ticket)] = ticket
            if ticket.wait_span is not None:
                _end_wait(ticket, "admitted")
            if not ticket.future.done():
                ticket.future.set_result(None)
            if self._on_event is not None:
                self.emit("admitted", ticket.node_id, admission_id=ticket.admission_id)

    def free_ticket(self, node_id: str | None) -> Ticket:
        """A placeholder for work that holds no permit (agents): never counted, never queued."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return Ticket(node_id=node_id, future=future, granted=False, released=True)

    async def acquire(self, node_id: str | None, admission_id: str | None = None) -> Ticket:
        ticket = self.request(node_id, admission_id)
        await self._granted(ticket)
        return ticket

    async def reacquire(self, ticket: Ticket) -> None:
        """Wait for a permit again with a ticket whose permit was released meanwhile (an
        effect gives its permit up while it only looks up what happened, and needs one to
        dispatch again). It queues at the back, FIFO like any request: it gave its place
        up. The same ticket object, so whoever releases it at the end still does.

        Raises ``CancelledError`` when rejected (a stop) or canceled while it waits."""
        if ticket.granted and not ticket.released:
            return  # it still holds its permit
        ticket.granted = ticket.released = False
        ticket.work = ()
        ticket.future = asyncio.get_running_loop().create_future()
        self._enqueue(ticket)
        await self._granted(ticket)

    async def _granted(self, ticket: Ticket) -> None:
        try:
            await ticket.future
        except asyncio.CancelledError:
            self.withdraw(ticket)
            raise

    def withdraw(self, ticket: Ticket, reason: str | None = None) -> None:
        """Leave the queue without a permit (or release one if it was granted meanwhile)."""
        if ticket.granted:
            self.release(ticket)
            return
        try:
            self._queue.remove(ticket)
        except ValueError:
            return
        _end_wait(ticket, "withdrawn")
        if reason is not None:
            self.emit("rejected", ticket.node_id, admission_id=ticket.admission_id,
                      reason=reason)
        if not ticket.future.done():
            ticket.future.cancel()

    def bind(self, ticket: Ticket, work: asyncio.Future[Any]) -> None:
        """The permit of ``ticket`` covers ``work`` too: releasing it before all the work
        bound to it ended releases it when the last of it ends instead (an abandoned call
        keeps its slot). Work already done is dropped."""
        ticket.work = (*(w for w in ticket.work if not w.done() and w is not work), work)

    def release(self, ticket: Ticket) -> None:
        if not ticket.granted or ticket.released:
            return
        for work in ticket.work:
            if not work.done():
                work.add_done_callback(lambda _w: self.release(ticket))
                return
        ticket.released = True
        self._active -= 1
        del self._holding[id(ticket)]
        if self._on_event is not None:
            self.emit("released", ticket.node_id, admission_id=ticket.admission_id)
        if self._queue:
            self._grant_waiting()
        if self.carried:
            kept = [t for t in self.carried if t is not ticket]
            if len(kept) < len(self.carried):
                self.carried = kept
                if self.on_carried_end is not None:
                    self.on_carried_end()
        if self._active == 0 and self.on_idle is not None:
            self.on_idle()

    def reject_all(self, reason: str) -> None:
        """Reject every queued waiter (cancellation, deadline, failure), and from now on
        every request no permit is free for: a stopping run queues no new work."""
        self._closed = reason
        while self._queue:
            ticket = self._queue.popleft()
            _end_wait(ticket, "rejected")
            self.emit("rejected", ticket.node_id, admission_id=ticket.admission_id,
                      reason=reason)
            if not ticket.future.done():
                ticket.future.cancel()


def _end_wait(ticket: Ticket, outcome: str) -> None:
    """End a ticket's admission-wait span (if tracing opened one) with how the wait ended."""
    wait_span, ticket.wait_span = ticket.wait_span, None
    if wait_span is not None:
        wait_span.set_attribute("agentium.admission.outcome", outcome)
        wait_span.end()
