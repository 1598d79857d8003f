"""The lease keeper of a run: renews the run's lease every ``poll_interval`` and passes on
what a renewal reports (a cancel request, a lost lease)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from agentium_graph.errors import AgentiumGraphError, StaleFenceError, StoreError
from agentium_graph.runtime._stops import Stop, begin_stop
from agentium_graph.store._requests import RenewLeaseRequest

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

log = logging.getLogger("agentium_graph.runtime")


async def keep_lease(run: TaskRun) -> None:
    """Renew ``run``'s lease until the run cancels this task.

    A renewal that fails with a :class:`StoreError` (unavailable or not) is tried again at
    the next interval: the run's own commits meet a failure that persists. One refused with
    :class:`StaleFenceError` (another worker took the lease) or failing with anything else
    (a store bug, a task that vanished) means the lease can no longer be kept: the run stops
    with that error instead of going on unleased. Unless the run is committing its final
    steps: that commit is fenced itself, and if it lands, what it records is the outcome (a
    renewal that reached the store after it finds the lease released)."""
    interval = run.rt.poll_interval
    while True:
        await asyncio.sleep(interval)
        if run.pending_acquire is not None:
            continue  # the lease is taken by the first commit, not yet made
        asked = time.monotonic()
        try:
            status = await run.store.renew_lease(RenewLeaseRequest(
                key=run.key, worker_id=run.worker_id, fence=run.fence,
                ttl_seconds=run.rt.lease_ttl, now=run.clock()))
            _slow(run, time.monotonic() - asked)
        except StaleFenceError as exc:
            log.warning("task %s: lease lost (%s); stopping this run", run.key, exc)
            _lost(run, exc, exc)
            return
        except StoreError as exc:
            log.warning("task %s: lease renewal failed, will retry: %s", run.key, exc)
            continue
        except Exception as exc:
            log.warning("task %s: lease renewal failed (%r); stopping this run", run.key, exc)
            _lost(run, exc, AgentiumGraphError(str(exc)))
            return
        if status.cancel is not None and run.cancel_reason is None:
            run.request_cancel(status.cancel.reason)
        elif run.header.deadline is not None and run.clock() >= run.header.deadline:
            run.wake.set()  # past it on our clock, sooner than the loop's wait said


def _slow(run: TaskRun, took: float) -> None:
    """Warn when a renewal took more than half the lease TTL: a little slower and the lease
    expires before it is renewed, and another worker may take the task over."""
    ttl = run.rt.lease_ttl
    if took > ttl / 2:
        log.warning("task %s: a lease renewal took %.2f s of the %g s lease TTL; another "
                    "worker may take the task over if renewals get slower (the store is slow "
                    "to answer: overloaded, or threads of CPU-bound sync tools hold the GIL "
                    "its calls need); raise lease_ttl, or run CPU-heavy work in a process "
                    "pool", run.key, took, ttl)


def _lost(run: TaskRun, exc: BaseException, error: AgentiumGraphError) -> None:
    if run.finishing:
        return  # the final commit in flight decides (it raises if it was fenced out)
    run.lost = exc
    begin_stop(run, Stop("canceled", error))
    run.wake.set()
