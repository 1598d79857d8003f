"""What node code submits to the run (:meth:`TaskRun.submit`), and which of it the next
group commit takes: a submission of a node no longer running, new work once the task is
stopping, a revision after a stop, or one whose charges pass a limit is refused; the rest
is committed with the turn's own steps (the scheduler loop, :mod:`._run`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentium_graph.errors import BudgetExhaustedError
from agentium_graph.runtime._agent import clamp_usage
from agentium_graph.store._requests import Charge, CommitRevision, RecordAction, Step

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun


@dataclass
class Submission:
    steps: list[Step]
    blobs: dict[str, str]
    future: asyncio.Future[None]
    tombstone: tuple[str, ...] = ()  # nodes a plan revision removes: must still be unclaimed
    revision: bool = False           # a streamed plan revision: refused once the run stops
    clamp: bool = False              # usage that already happened: charged up to the limits
    node: str | None = None          # the node that submitted it (None: the planner)


def submitter(steps: list[Step]) -> str | None:
    """The node whose steps these are (the first step naming one), None for the planner's."""
    for step in steps:
        node = step.action.node_id if isinstance(step, RecordAction) else \
            getattr(step, "node_id", None)
        if node is not None:
            return str(node)
    return None


class RevisionConflict(Exception):
    """A plan revision would remove nodes that were started after it was checked."""

    def __init__(self, started: list[str]) -> None:
        super().__init__(f"nodes {started} were started before the revision was committed")
        self.started = started


def drain_submissions(run: TaskRun, steps: list[Step], blobs: dict[str, str],
                      pending: dict[str, int]) -> list[Submission]:
    """Take the steps node code submitted into this turn's commit: each submission is
    refused (its future canceled or failed) or added, with what it charges, to ``pending``."""
    accepted: list[Submission] = []
    queued, run.submissions = run.submissions, []
    halted = run.stop is not None and run.stop.reason in ("canceled", "deadline")
    for sub in queued:
        if sub.future.done():
            continue  # its submitter was canceled: nothing of it is committed
        if sub.node is not None and sub.node not in run.running:
            sub.future.cancel()  # its node's task was abandoned: its late work is not
            continue
        if halted and any(isinstance(step, Charge) for step in sub.steps):
            sub.future.cancel()  # no new work is admitted once the task is stopping
            continue
        if sub.revision and run.stop is not None:
            sub.future.cancel()  # a stopping run takes no new plan revision
            continue
        if sub.tombstone:
            started = sorted(n for n in sub.tombstone if not run.replaceable(n))
            if started:
                sub.future.set_exception(RevisionConflict(started))
                continue
        if sub.clamp:
            sub.steps = clamp_usage(run, sub.steps, pending)
        charges: dict[str, int] = {}
        charge: Charge | None = None
        for step in sub.steps:
            if isinstance(step, Charge):
                charge = step
                for name, amount in step.charges.items():
                    charges[name] = charges.get(name, 0) + amount
            elif isinstance(step, CommitRevision):  # what the store will charge for it
                charges["plan_revisions"] = charges.get("plan_revisions", 0) + 1
                charges["expanded_nodes"] = charges.get("expanded_nodes", 0) + \
                    len(step.add)
        exhausted = run.exceeds(charges, pending)
        if exhausted is not None:
            counter, used, limit = exhausted
            owner = None if charge is None else charge.node_id
            run.admission.emit("exhausted", owner, counter=counter,
                                admission_id=None if charge is None else
                                charge.admission_id)
            sub.future.set_exception(BudgetExhaustedError(
                run.key, counter, used, charges[counter], limit, node_id=owner))
            continue
        for name, amount in charges.items():
            pending[name] = pending.get(name, 0) + amount
        for node_id in sub.tombstone:  # not started until the revision is installed
            item = run.ready.pop(node_id, None)
            if item is not None:
                run.admission.withdraw(item.ticket, "revised")
            run.revising.add(node_id)
        steps.extend(sub.steps)
        blobs.update(sub.blobs)
        accepted.append(sub)
    return accepted
