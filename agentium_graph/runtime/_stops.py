"""How a run stops: cancel, deadline, failure, an exhausted budget or an uncertain effect.

A stop is decided once (the first cause wins), withdraws queued work, cancels what may be
cancelled, abandons what swallows that cancel past its grace (:func:`abandon_overdue`), and
ends in one final commit that closes every open node and sets the task's status. A run that
ends abnormally abandons what it leaves running (:func:`abandon_running`). The functions
take the run whose loop calls them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentium_graph.errors import (
    AgentiumGraphError,
    BudgetExhaustedError,
    DataIntegrityError,
    DeadlineExceededError,
    DurableRecoveryRequiredError,
    ErrorInfo,
    PlannerFailedError,
    PlanValidationError,
    StaleFenceError,
    StoreError,
    TaskCanceledError,
    described,
)
from agentium_graph.runtime import _abandon
from agentium_graph.runtime._outcome import Outcome, node_error
from agentium_graph.store._records import ActionRecord
from agentium_graph.store._requests import RecordAction, SetStatus, SettleNode, Step

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

StopReason = Literal["canceled", "deadline", "failed", "budget", "recovery"]


@dataclass
class Stop:
    reason: StopReason
    error: AgentiumGraphError
    info: ErrorInfo | None = None
    node_id: str | None = None  # the node whose failure stops the run
    # Nodes that failed too while the run stopped for that failure (work in flight, a
    # crashed run's records): their containers fail with them as well.
    also: list[tuple[str, ErrorInfo | None]] = field(default_factory=list)


def observe_stop(run: TaskRun) -> None:
    if run.stop is not None:
        return
    if run.cancel_reason is not None:
        begin_stop(run, Stop("canceled", TaskCanceledError(
            f"task {run.key!r} was canceled: {run.cancel_reason}",
            details={"reason": run.cancel_reason})))
        return
    deadline = run.header.deadline
    if deadline is not None and run.clock() >= deadline:
        begin_stop(run, Stop("deadline", DeadlineExceededError(
            f"task {run.key!r} passed its deadline {deadline.isoformat()}; recovery "
            "never extends a deadline, so create a new task to retry",
            details={"deadline": deadline.isoformat()})))


def settle_planning(run: TaskRun) -> None:
    """Stop the task with why planning ended without a plan, if it did. (Committed
    revisions are installed by the loop right after their commit: install_revisions.)"""
    task = run.planning
    if task is None or not task.done():
        return
    run.planning = None
    run.program = None
    if task.cancelled():
        if run.stop is not None or run.lost is not None:
            return  # a stop canceled it
        # Only a stop cancels planning: this cancellation escaped the provider itself, and
        # the task has no (complete) plan, so it must not end as if planning had finished.
        _planner_failed(run, "its provider raised CancelledError although the runtime did "
                        "not cancel it", "CancelledError", None)
        return
    exc = task.exception()
    if exc is None:
        return
    if isinstance(exc, StoreError | StaleFenceError | DataIntegrityError):
        if run.lost is None:
            run.lost = exc  # the run ends with it; the task stays recoverable
        return
    if run.stop is not None or run.lost is not None:
        return  # the planner failed because the run is ending anyway
    if isinstance(exc, BudgetExhaustedError):
        begin_stop(run, Stop("budget", exc))
    elif isinstance(exc, PlanValidationError):
        begin_stop(run, Stop("failed", exc, ErrorInfo(
            code=exc.code, message=str(exc),
            details={"diagnostics": [d.model_dump() for d in exc.diagnostics]})))
    else:
        what = described(exc)
        if isinstance(exc, TimeoutError):
            what = "the call took longer than the planner's max_latency_ms"
        _planner_failed(run, what, type(exc).__name__, exc)


def _planner_failed(run: TaskRun, what: str, error_name: str,
                    cause: BaseException | None) -> None:
    error = PlannerFailedError(
        f"task {run.key!r}: the planner failed: {what}; fix the provider (or its script) "
        "and create the task again", details={"error": error_name})
    error.__cause__ = cause
    begin_stop(run, Stop("failed", error, error.to_info()))


def begin_stop(run: TaskRun, stop: Stop) -> None:
    run.stop = stop
    reason = stop.reason
    run.admission.reject_all(reason)
    for item in run.ready.values():
        run.admission.withdraw(item.ticket, reason)
    run.ready.clear()
    if run.planning is not None:
        # Whatever stops the run stops planning too (a streamed plan would otherwise keep
        # the run open, and ask again after a rejection); committed revisions stay.
        run.planning.cancel()
    if reason in ("canceled", "deadline"):
        for running in run.running.values():
            running.ctx._cancel.set()
            if running.task is not None and _cancellable(run, running.node_id):
                running.task.cancel()
                run.overdue_at = asyncio.get_running_loop().time() + _abandon.overdue()


def abandon_overdue(run: TaskRun) -> None:
    """Abandon the node tasks a live stop (cancel, deadline) canceled that are still running
    :func:`_abandon.overdue` seconds later: their code swallows the cancellation, and would
    otherwise hold the stop, and ``run()``, for as long as it likes. Each is logged, settled
    ``canceled`` like every node the stop closes, and keeps its root permit until it really
    ends; what it returns or submits later is ignored (:meth:`TaskRun.submit` takes nothing
    from a node that is no longer running). An agent waiting for its effect call in flight
    is not abandoned: the effect is never preempted, and is bounded itself."""
    until = run.overdue_at
    if until is None or asyncio.get_running_loop().time() < until or run.lost is not None:
        return
    run.overdue_at = None
    grace = _abandon.overdue()
    for running in run.running.values():
        task = running.task
        if task is None or task.done() or running.effects or \
                not _cancellable(run, running.node_id):
            continue
        _abandon.abandoned(f"task {run.key!r}: node {running.node_id!r} ({task.get_name()})",
                           grace)
        run.admission.bind(running.ticket, task)
        run.finished.append((running.node_id, Outcome("canceled")))
        run.wake.set()


async def abandon_running(run: TaskRun) -> None:
    """As a run ends: stop the node tasks (and the planner) still running (an abnormal exit:
    lease lost, store failure, ``run()`` canceled); their work is not this run's to settle
    (:func:`_abandon.stop_all`). Then the run is over: whatever abandoned work submits
    later is refused, and nothing commits it.

    Its admission queue closes first: a waiter is rejected (never admitted by a permit
    this ends), and so is every request made later (reason ``abandoned`` when no stop of
    the run's own gave one). The permits of nodes a failed commit was to launch are
    released like those of running nodes."""
    try:
        reason = run.stop.reason if run.stop is not None else "abandoned"
        run.admission.reject_all(reason)
        for item in run.ready.values():
            run.admission.withdraw(item.ticket, reason)
        run.ready.clear()
        launching, run.launching = run.launching, []
        for item in launching:
            run.admission.release(item.ticket)
        tasks: list[asyncio.Task[Any]] = [r.task for r in run.running.values()
                                          if r.task is not None]
        if run.planning is not None:
            tasks.append(run.planning)
            run.planning = None
        if run.stop_lookup is not None:
            tasks.append(run.stop_lookup)
            run.stop_lookup = None
        for r in run.running.values():
            r.ctx._cancel.set()
            if r.task is not None:  # its permit is held until the node's code really ends
                run.admission.bind(r.ticket, r.task)
            run.admission.release(r.ticket)
        if tasks:
            await _abandon.stop_all(tasks, f"task {run.key!r}")
        run.running.clear()
    finally:
        run.ended = True
        for sub in run.submissions:
            sub.future.cancel()
        run.submissions.clear()


def _cancellable(run: TaskRun, node_id: str) -> bool:
    # Effects are never preempted: a connector honors cancellation itself, and the
    # receipt of accepted remote work must still be recorded.
    spec = run.graph.specs.get(node_id)
    if spec is None:
        return False
    # An agent's model calls are cancellable; an effect call it has in flight runs to its
    # end in a task of its own first (_agent._unpreempted). A pure tool is if it is async
    # (an ``async def``, a partial of one or an object whose ``__call__`` is one).
    return spec.kind == "agent" or spec.is_async


def check_records(run: TaskRun) -> None:
    """Every node of the plan (and of the containers a crashed run entered) has its stored
    record, under its own id: a store always writes them with the plan (create, AddNodes),
    so a missing or misfiled one is damage, and scheduling around it could run a node
    again whose dependents already consumed its output, or fail the task for it."""
    misfiled = sorted(i for i, rec in run.nodes.items() if rec.node_id != i)
    missing = [i for i in run.graph.order if i not in run.nodes]
    if misfiled or missing:
        problem = (f"the record stored for node {misfiled[0]!r} names node "
                   f"{run.nodes[misfiled[0]].node_id!r}" if misfiled else
                   f"node {missing[0]!r} of its plan has no stored record")
        raise DataIntegrityError(
            f"task {run.key!r}: {problem}; the store was damaged, restore it from a backup "
            "(nothing was run)", node_id=(misfiled or missing)[0],
            details={"key": run.key, "missing": missing[:10], "misfiled": misfiled[:10]})


def check_recoverable(run: TaskRun) -> None:
    """A crash may have left a failed or uncertain node without the matching task
    status; finish that first instead of scheduling around it."""
    check_records(run)
    for node_id in run.graph.order:
        rec = run.nodes[node_id]
        if rec.state == "failed":
            also_failed(run, node_id, rec.error)
    stuck = sorted(a.action_id for a in run.actions.values() if a.state == "uncertain")
    if stuck and run.stop is None:
        run.uncertain.extend(stuck)
        begin_stop(run, recovery_stop(run))


def recovery_stop(run: TaskRun, reason: str = "") -> Stop:
    ids = sorted(run.uncertain)
    error = DurableRecoveryRequiredError(run.key, ids, reason)
    return Stop("recovery", error, ErrorInfo(code=error.code, message=str(error),
                                              details={"action_ids": ids}))


def also_failed(run: TaskRun, node_id: str, info: ErrorInfo | None) -> None:
    """``node_id`` failed: the run stops for it (a budget stop too: the task is no longer
    resumable, so it must not be reported as such), or, when it is stopping for another
    failure already, the containers holding it fail too (:func:`_failed_containers`)."""
    if run.stop is None or run.stop.reason == "budget":
        begin_stop(run, failure_stop(run, node_id, info))
    elif run.stop.reason == "failed":
        run.stop.also.append((node_id, info))


def failure_stop(run: TaskRun, node_id: str, info: ErrorInfo | None) -> Stop:
    info = info or ErrorInfo(code="node_failed", message="node failed", node_id=node_id)
    return Stop("failed", node_error(info, f"node {node_id!r} failed: {info.message}",
                                      node_id), info, node_id)


def _failed_containers(run: TaskRun, stop: Stop) -> dict[str, ErrorInfo]:
    """The open containers holding a node that failed (the one whose failure stops the run,
    or one that failed as it stopped), each with an error naming the first such node: they
    failed with it (canceled would say someone stopped them)."""
    failed: dict[str, ErrorInfo] = {}
    if stop.reason != "failed" or stop.node_id is None:
        return failed
    for child, info in ((stop.node_id, stop.info), *stop.also):
        what = info.message if info is not None else "it failed"
        spec = run.graph.specs.get(child)
        scope = run.graph.scopes.get(spec.scope) if spec is not None else None
        while scope is not None and scope.parent is not None:
            container = scope.parent
            if container not in run.closed and container not in failed:
                failed[container] = ErrorInfo(
                    code="child_failed", node_id=container,
                    message=f"node {container!r}: its child {child!r} failed: {what}",
                    details={"child": child,
                             **({"child_code": info.code} if info is not None else {})})
            parent = run.graph.specs.get(container)
            scope = run.graph.scopes.get(parent.scope) if parent is not None else None
    return failed


def final_steps(run: TaskRun, launching: bool, turn: list[Step]) -> list[Step]:
    """The steps that end the run, or none while work remains; ``turn``: the steps
    this turn's commit already carries."""
    if run.running or launching or run.planning is not None or \
            (run.ready and run.stop is None):
        return []
    stop = run.stop
    if stop is None:
        if any(n not in run.done for n in run.graph.order):
            return []  # more nodes become ready next turn
        return [SetStatus(status="completed", release_lease=True)]
    # Stopping and nothing is running: close every open node, then the task.
    steps: list[Step] = []
    hidden = _unreconciled(run, stop)
    if hidden:
        stop = _surface(run, stop, hidden, steps)
    failed = _failed_containers(run, stop)
    if stop.reason not in ("budget", "recovery"):
        _reject_undispatched(run, stop, steps, turn)
    for node_id in run.graph.order:
        if node_id not in run.closed and stop.reason not in ("budget", "recovery"):
            error = failed.get(node_id)
            steps.append(SettleNode(node_id=node_id, state="canceled", error=stop.error.to_info())
                         if error is None else
                         SettleNode(node_id=node_id, state="failed", error=error))
    if stop.reason == "recovery":
        if not hidden:
            stop = recovery_stop(run)  # name every uncertain action, not just the first
            run.stop = stop
        steps.append(SetStatus(status="recovery_required", error=stop.info,
                               release_lease=True))
    elif stop.reason == "canceled":
        steps.append(SetStatus(status="canceled", error=stop.error.to_info(),
                               release_lease=True))
    elif stop.reason == "budget":
        steps.append(SetStatus(status="pending", error=stop.error.to_info(),
                               release_lease=True))
    else:
        steps.append(SetStatus(status="failed", error=stop.info or stop.error.to_info(),
                               release_lease=True))
    return steps


def _reject_undispatched(run: TaskRun, stop: Stop, steps: list[Step],
                         turn: list[Step]) -> None:
    """An action still ``intent`` when the task ends was never dispatched (one an operator
    attested absent, then the task was canceled; one whose node was stopped between its
    start and its dispatch): it becomes ``rejected``, so no ended task lists a pending
    action nothing will ever move on."""
    latest = {s.action.action_id: s.action.state for s in turn if isinstance(s, RecordAction)}
    for action in sorted(run.actions.values(), key=lambda a: a.action_id):
        if latest.get(action.action_id, action.state) == "intent":
            steps.append(RecordAction(action=action.model_copy(update={
                "state": "rejected", "fence": run.fence,
                "reason": f"not dispatched: the task stopped ({stop.reason})"})))


def _unreconciled(run: TaskRun, stop: Stop) -> dict[str, list[ActionRecord]]:
    """The ``dispatching`` actions of the nodes a terminal stop (cancel, deadline, failure)
    is about to close, by node. Such an action was left by a run that died between its
    dispatch and its receipt, and this run stopped before it reconciled it (a node this run
    settled is closed already): closing its node as canceled would leave an effect that may
    have happened ``dispatching`` in an ended task, which no run reconciles and no operator
    can resolve."""
    found: dict[str, list[ActionRecord]] = {}
    if stop.reason in ("budget", "recovery"):
        return found  # the task stays resumable: its next run reconciles them
    for action in crash_left(run):
        found.setdefault(action.node_id, []).append(action)
    return found


def crash_left(run: TaskRun) -> list[ActionRecord]:
    """The ``dispatching`` actions of the nodes still open, by action id, but those a stop's
    lookups settled (:mod:`_stop_lookups`)."""
    return [a for a in sorted(run.actions.values(), key=lambda a: a.action_id)
            if a.state == "dispatching" and a.node_id in run.nodes
            and a.node_id not in run.closed and a.action_id not in run.stop_settled]


def _surface(run: TaskRun, stop: Stop, hidden: dict[str, list[ActionRecord]],
             steps: list[Step]) -> Stop:
    """Make the unreconciled actions (:func:`_unreconciled`) and their nodes ``uncertain``
    and stop the run as ``recovery_required`` instead, naming them: an effect whose outcome
    is unknown is never hidden by a stop (the recorded cancel applies once an operator
    resolved them, or at once when the task is canceled again)."""
    why = {"canceled": "canceled", "deadline": "past its deadline",
           "failed": "failing"}.get(stop.reason, stop.reason)
    reason = (f"its dispatch was interrupted by a crash and the task was {why} before a "
              "run looked it up")
    for node_id, actions in hidden.items():
        ids = [a.action_id for a in actions]
        reasons: list[str] = []
        for action in actions:
            said = run.stop_unknown.get(action.action_id)
            reasons.append(reason if said is None else
                           "its dispatch was interrupted by a crash, and a lookup as the task "
                           f"was {why} could not tell whether it took effect: {said}")
            steps.append(RecordAction(action=action.model_copy(update={
                "state": "uncertain", "reason": reasons[-1]})))
        steps.append(SettleNode(node_id=node_id, state="uncertain", error=ErrorInfo(
            code="effect_uncertain", node_id=node_id,
            message=f"outcome of action(s) {', '.join(ids)} is unknown: "
                    f"{'; '.join(dict.fromkeys(reasons))}",
            details={"action_ids": ids})))
        run.closed.add(node_id)
        run.uncertain.extend(ids)
    surfaced = recovery_stop(run, f"the task was {why}; {reason}")
    run.stop = surfaced
    return surfaced
