"""The operator API of ExecutionGraphRuntime: inspect, cancel, resolve stuck actions, read
admission and page the timeline. None of it runs a task's nodes; all of it is safe to call
from another process while a worker runs the task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict

from agentium_graph.connectors import Absent, ActionOutcome
from agentium_graph.errors import (
    ConfigurationError,
    DataIntegrityError,
    DeadlineExceededError,
    DescriptorMismatchError,
    DurableRecoveryRequiredError,
    LeaseHeldError,
    NodeFailedError,
    PlannerFailedError,
    PlanValidationError,
    StaleFenceError,
    TaskCanceledError,
    TaskNotFoundError,
)
from agentium_graph.runtime._args import (
    check_actor,
    check_key,
    check_reason,
    check_text,
    decode_cursor,
    encode_cursor,
    kind,
)
from agentium_graph.runtime._config import RootLimits
from agentium_graph.runtime._inspect import build_view, journal_problem
from agentium_graph.runtime._resolve import cancel_stopped, canceler_id, resolve_action
from agentium_graph.runtime._views import AdmissionSnapshot, TaskResult, TaskView
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import JournalEntry, TaskHeader, TaskIdentity
from agentium_graph.store._requests import CancelTaskRequest, TimelineRequest

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

log = logging.getLogger("agentium_graph.runtime")
T = TypeVar("T")


# The reason recorded for a cancel that gives none.
DEFAULT_CANCEL_REASON = "canceled by the host"


class TimelinePage(BaseModel):
    """One page of a task's journal in its stable order; pass ``next_cursor`` for more."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    events: tuple[JournalEntry, ...]
    next_cursor: str | None
    total: int


class OperatorAPI:
    """The operator half of :class:`~agentium_graph.ExecutionGraphRuntime` (its base class):
    what the runtime's run machinery provides is declared here for the type checker."""

    store: DurableTaskStore
    clock: Callable[[], datetime]
    lease_ttl: float
    _active: dict[str, TaskRun]

    if TYPE_CHECKING:
        async def run(self, key: str, worker_id: str = "worker", *,
                      wait: bool = False) -> TaskResult: ...

        def _forget_fresh(self, key: str) -> Any: ...

        async def _pinned_identity(self, header: TaskHeader) -> TaskIdentity: ...

        def limits_for(self, identity: TaskIdentity) -> RootLimits: ...

    async def inspect(self, key: str) -> TaskView:
        """A verified, read-only view of the task: no lease is taken and nothing is written."""
        check_key(key)
        snapshot = await self.store.get_task(key)
        if snapshot is None:
            raise TaskNotFoundError(key)
        identity = await self.store.get_identity(key)
        view = await build_view(self.store, snapshot, identity)
        problem = await journal_problem(self.store, snapshot.header)
        if problem is None:
            return view
        return view.model_copy(update={"verified": False,
                                       "problems": (*view.problems, problem)})

    async def cancel(self, key: str, reason: str = DEFAULT_CANCEL_REASON) -> TaskView:
        """Persist a cancel request; the lease holder observes it and stops cooperatively.

        ``reason`` is recorded with it (default :data:`DEFAULT_CANCEL_REASON`); a blank one
        is refused.

        A task nobody is running is canceled at once, including one in
        ``recovery_required``: its open nodes become ``canceled`` and its uncertain actions
        stay ``uncertain`` in the ledger (append-only evidence, listed by ``inspect``),
        so check their destinations; nothing is dispatched or looked up. Any other such
        task is run here, under a worker id of this cancel's own, until the cancel is
        observed (effects a crashed worker left dispatching are looked up before their
        nodes are closed); when this runtime's catalog cannot run it (it no longer
        registers a binding the task pinned), it is canceled without running, and an
        effect a crash left dispatching, which it cannot look up, makes it
        ``recovery_required`` instead (cancel again to end it). A task another worker
        holds the lease of (or takes meanwhile) is canceled by that worker (or by whoever
        runs it next).
        Canceling an ended task changes nothing; the first reason recorded wins.
        """
        check_key(key)
        check_reason(reason)
        await self._header(key)
        self._forget_fresh(key)  # a run started from create's state would not see it
        header = await self.store.request_cancel(CancelTaskRequest(key=key, reason=reason,
                                                                   now=self.clock()))
        run = self._active.get(key)
        if run is not None:
            run.request_cancel(reason)
            return await self.inspect(key)
        if header.status == "recovery_required" and self._lease_free(header):
            if await cancel_stopped(self.store, key, lease_ttl=self.lease_ttl,
                                    clock=self.clock):
                return await self.inspect(key)
            header = await self._header(key)  # resolved meanwhile: cancel it as any other
        if header.status not in ("completed", "failed", "canceled", "recovery_required") and \
                self._lease_free(header):
            worker = canceler_id(key)  # this cancel's own: never another process's
            try:
                await self.run(key, worker_id=worker)
            except TaskCanceledError:
                pass
            except (DescriptorMismatchError, ConfigurationError) as exc:
                # This runtime cannot run the task (its catalog no longer registers what the
                # task pinned): cancel it without running it, as for recovery_required.
                log.info("task %s: cannot be run here to apply the cancel (%s); canceling "
                         "it without running it", key, exc)
                await cancel_stopped(self.store, key, lease_ttl=self.lease_ttl,
                                     clock=self.clock, idle=True, worker=worker)
            except (LeaseHeldError, StaleFenceError, DurableRecoveryRequiredError) as exc:
                # Another worker took the task meanwhile (or this run's lease expired): it
                # observes the recorded cancel.
                log.info("task %s: cancel recorded; a worker will apply it (%s)", key, exc)
            except (NodeFailedError, DeadlineExceededError, PlannerFailedError,
                    PlanValidationError) as exc:
                # Recovery found the task ended another way (a node a crashed worker left
                # failed, its deadline): the view says how; the cancel stays recorded.
                log.info("task %s: the run applying the cancel ended it otherwise (%s)",
                         key, exc)
        return await self.inspect(key)

    def _lease_free(self, header: TaskHeader) -> bool:
        return header.lease is None or header.lease.expires_at <= self.clock()

    async def resolve_action(self, key: str, action_id: str,
                             outcome: ActionOutcome | Absent, *, actor: str) -> TaskView:
        """Record a host-attested resolution of an uncertain action, so ``run`` can go on.

        ``ActionOutcome``: the effect happened with this output; nothing is dispatched. An
        effect node completes with it; an action an agent's tool call made becomes that
        call's receipt, and the agent node returns to pending, so the next ``run`` resumes
        the agent with it. ``Absent()``: the effect never happened (the node returns to
        pending and the next ``run`` dispatches it again under the same action id). The
        resolution is journaled with ``actor``; a conflicting second resolution is rejected
        (``ResolutionConflictError``; with ``details["retryable"]`` when another operator's
        resolution of the task was in progress: inspect, and resolve again if still needed).
        """
        check_key(key)
        if not isinstance(action_id, str) or not action_id:
            raise ConfigurationError(f"action_id must be a non-empty string, not "
                                     f"{kind(action_id)}")
        check_text("action_id", action_id)
        check_actor(actor)
        await resolve_action(self.store, key, action_id, outcome, actor=actor,
                             clock=self.clock, lease_ttl=self.lease_ttl)
        return await self.inspect(key)

    async def admission_snapshot(self, key: str) -> AdmissionSnapshot:
        """The task's counters against their limits and its admission queue (its depth and
        the permits held, when this runtime is running it)."""
        check_key(key)
        header = await self._header(key)
        run = self._active.get(key)
        if run is not None:
            capacity = run.admission.capacity
        else:  # the concurrency the task pinned at create, whoever created it
            identity = await self._pinned_identity(header)
            capacity = self.limits_for(identity).max_concurrent_work
        return AdmissionSnapshot(
            key=key, counters=dict(header.counters), limits=dict(header.limits),
            active=run.admission.active if run else 0,
            queued=run.admission.queued if run else 0, capacity=capacity)

    async def timeline(self, key: str, cursor: str | None = None,
                       limit: int = 100) -> TimelinePage:
        """A page of the task's journal in stable order; ``cursor`` is opaque."""
        check_key(key)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit must be an int between 1 and 1000, not "
                                     f"{kind(limit)}")
        if cursor is not None and not isinstance(cursor, str):
            raise ConfigurationError(
                f"cursor must be None or a next_cursor string returned by timeline(), not "
                f"{kind(cursor)}")
        header = await self._header(key)
        if header.journal_seq < 0:  # not a cursor's fault: no write stores that
            raise DataIntegrityError(
                f"task {key!r}: its header says its journal holds {header.journal_seq} "
                "entries; the store was damaged, restore it from a backup",
                details={"key": key, "journal_seq": header.journal_seq})
        after = decode_cursor(cursor, key)
        if after > header.journal_seq:
            # The journal only grows and a page never ends past it: a forged cursor.
            raise ConfigurationError(
                f"invalid timeline cursor for task {key!r}: it points past the end of the "
                f"journal ({header.journal_seq} entries); pass a next_cursor returned by "
                "timeline() for the same task")
        events = await self.store.read_timeline(TimelineRequest(key=key, after_seq=after,
                                                                limit=limit))
        events = [e for e in events if e.seq <= header.journal_seq]
        if not events and after < header.journal_seq:
            # A cursor that would not move: every page after it would be this one.
            raise DataIntegrityError(
                f"task {key!r}: its journal has no entry after seq {after}, but its header "
                f"says it holds {header.journal_seq}; the store was damaged (journal entries "
                "deleted, or the header edited): restore it from a backup",
                details={"key": key, "after_seq": after, "journal_seq": header.journal_seq})
        last = events[-1].seq if events else after
        more = last < header.journal_seq
        return TimelinePage(key=key, events=tuple(events),
                            next_cursor=encode_cursor(key, last) if more else None,
                            total=header.journal_seq)

    def inspect_sync(self, key: str) -> TaskView:
        return run_sync(self.inspect(key))

    def cancel_sync(self, key: str, reason: str = DEFAULT_CANCEL_REASON) -> TaskView:
        return run_sync(self.cancel(key, reason))

    async def _header(self, key: str) -> TaskHeader:
        header = await self.store.get_header(key)
        if header is None:
            raise TaskNotFoundError(key)
        return header


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise ConfigurationError("the *_sync wrappers cannot run inside an event loop; await the "
                             "async method instead")

