"""Effects through connectors: the action ledger and reconciliation after a crash.

Ledger of one action: ``intent`` (identity, origin evidence, admission id) and
``dispatching`` are committed together with the node's attempt *before* the connector is
called; the receipt (``confirmed``, outcome digest) is committed together with the node's
completion. After a crash between dispatch and receipt the action is ``dispatching`` under
an older fence, and the runtime asks ``resolve_result`` what happened before it would ever
dispatch again:

* an outcome                      -> record the receipt, complete, no dispatch, no charge;
* ``Absent()``                    -> dispatch again under the same action id;
* idempotent destination          -> dispatch again with the same action id;
* ``Unknown``, exception, timeout -> never dispatch again: the node becomes ``uncertain``
                                     and the task ``recovery_required``.

A dispatch that fails (raises, times out, or returns something else) is reconciled the same
way at once. A ``CancelledError`` the connector's own code raises is such a failure too;
only a cancellation of the running task itself (the run abandoning its work) propagates.
A dispatch or lookup runs in a task of its own (:func:`_abandon.within`): one that swallows
the cancellation of its time limit (or of the run abandoning it) is abandoned after
:data:`_abandon.GRACE` seconds with a warning, and counts as timed out; nothing it returns
later is used.
Lookups hold no root permit: the caller's permit is given up before one and taken again,
FIFO, only before a dispatch that follows it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import admission_id, derive_id, digest
from agentium_graph._otel import failed, span
from agentium_graph.catalog._bindings import ToolBinding
from agentium_graph.connectors import Absent, ActionOutcome, ActionRequest, Unknown
from agentium_graph.errors import BudgetExhaustedError, ErrorInfo, NodeFailedError, described
from agentium_graph.runtime import _abandon
from agentium_graph.runtime._admission import Ticket
from agentium_graph.runtime._blobs import read_verified
from agentium_graph.runtime._graph import NodeSpec
from agentium_graph.runtime._outcome import Outcome, check_output
from agentium_graph.store._records import ActionRecord, NodeRecord
from agentium_graph.store._requests import Charge, RecordAction, StartAttempt, Step

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

log = logging.getLogger("agentium_graph.effects")

DISPATCH_CHARGES = {"work_attempts": 1, "tool_calls": 1}


def action_id_for(run: TaskRun, rec: NodeRecord, binding: ToolBinding, args: dict[str, Any],
                  call_id: str = "node") -> str:
    """Identity of an effect: incarnation, call, operation, actual args, destination,
    policy revision + grants, caller."""
    return derive_id("act", rec.incarnation_id, call_id, binding.id, binding.version,
                     digest(args), binding.destination, run.policy_revision,
                     list(run.grants) if run.grants is not None else None, run.caller)


def dispatch_admission(action_id: str, number: int) -> str:
    return admission_id(action_id, f"dispatch:{number}")


def planned_admission(run: TaskRun, act: str) -> str | None:
    """The admission id the next start of action ``act`` charges (:func:`start_steps`):
    its next dispatch's, or None when it is reconciled or reused (nothing charged then)."""
    existing = run.actions.get(act)
    if existing is not None and existing.state in ("dispatching", "confirmed"):
        return None
    return dispatch_admission(act, (existing.dispatches if existing else 0) + 1)


def origin_of(binding: ToolBinding, catalog_digest: str) -> dict[str, Any]:
    connector = binding.typed_connector
    return {"kind": "tool", "binding": binding.id, "binding_version": binding.version,
            "connector": str(connector.id), "connector_version": str(connector.version),
            "destination": binding.destination, "catalog_digest": catalog_digest}


def start_steps(run: TaskRun, node: NodeSpec, rec: NodeRecord, attempt: str,
                args: dict[str, Any], input_digest: str, *, call_id: str = "node"
                ) -> tuple[list[Step], dict[str, int], ActionRecord | None]:
    """Steps that start an effect node's attempt, and the charges they carry.

    Returns ``(steps, charges, intent)``; ``intent`` is the new ledger record (or None when
    the action already exists and the node task must reconcile or reuse it).
    """
    binding = node.binding
    assert isinstance(binding, ToolBinding)
    act = action_id_for(run, rec, binding, args, call_id)
    existing = run.actions.get(act)
    start = StartAttempt(node_id=rec.node_id, attempt_id=attempt, input_digest=input_digest,
                         requires_completed=node.deps)
    if existing is not None and existing.state in ("dispatching", "confirmed"):
        return [start], {}, None  # reconcile (or reuse the receipt) inside the node task
    number = (existing.dispatches if existing else 0) + 1
    adm = dispatch_admission(act, number)
    steps: list[Step] = [start]
    base = existing or ActionRecord(
        action_id=act, node_id=rec.node_id, state="intent", admission_id=adm,
        origin=origin_of(binding, run.catalog_digest),
        request_digest=digest({"args": args, "destination": binding.destination}),
        result_ref=act, fence=run.fence)
    if existing is None:
        steps.append(RecordAction(action=base))
    steps.append(Charge(admission_id=adm, charges=DISPATCH_CHARGES, node_id=rec.node_id))
    steps.append(RecordAction(action=base.model_copy(update={
        "state": "dispatching", "dispatches": number, "admission_id": adm,
        "fence": run.fence})))
    return steps, DISPATCH_CHARGES, base


def runtime_cancelled() -> bool:
    """Whether the current task itself was canceled (by the runtime), as opposed to a
    ``CancelledError`` raised by code it awaits (a connector letting an inner task's
    cancellation escape), which is an ordinary failure of that code."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def execute_effect(run: TaskRun, node: NodeSpec, args: dict[str, Any], *,
                         call_id: str = "node", permit: Ticket | None = None) -> Outcome:
    """Dispatch (or reconcile) the node's action; never dispatch blindly twice.

    ``permit``: the root permit held for it (by default the effect node's own), given up
    while a lookup runs and taken again before a dispatch after one."""
    binding = node.binding
    assert isinstance(binding, ToolBinding)
    connector = binding.typed_connector
    rec = run.nodes[node.id]
    if permit is None and node.id in run.running:
        permit = run.running[node.id].ticket
    act = action_id_for(run, rec, binding, args, call_id)
    action = run.actions[act]
    if action.state == "confirmed":
        return await _reuse_receipt(run, node, action)
    if action.state == "dispatching" and action.fence < run.fence:
        verdict = await _lookup(run, connector, action, permit)
        if isinstance(verdict, ActionOutcome):
            return receipt(run, node, action, verdict, source="reconcile")
        if not isinstance(verdict, Absent) and not connector.idempotent_destination:
            return uncertain(run, action, verdict.reason)
        why = "absent" if isinstance(verdict, Absent) else "idempotent destination"
        number = action.dispatches + 1
        adm = dispatch_admission(act, number)
        again = action.model_copy(update={"state": "dispatching", "dispatches": number,
                                          "admission_id": adm, "fence": run.fence,
                                          "reason": f"redispatch: {why}"})
        try:
            if permit is not None:
                permit.admission_id = adm  # its events name the dispatch it now admits
                await run.admission.reacquire(permit)
            await run.submit([Charge(admission_id=adm, charges=DISPATCH_CHARGES,
                                     node_id=node.id), RecordAction(action=again)])
        except BudgetExhaustedError as exc:
            return Outcome("budget", exception=exc)
        except asyncio.CancelledError:
            if runtime_cancelled() or run.stop is None:
                raise
            # The run began stopping while this waited for its permit or its charge.
            return not_dispatched_again(run, action, verdict)
        action = again
    request = ActionRequest(action_id=act, result_ref=action.result_ref, binding_id=binding.id,
                            binding_version=binding.version, args=args,
                            destination=str(binding.destination),
                            caller={"task": run.key, "node": node.id, "call": call_id},
                            fence=action.fence, dispatch=action.dispatches)
    return await _dispatch(run, node, connector, request, action, permit)


def not_dispatched_again(run: TaskRun, action: ActionRecord,
                          verdict: Absent | Unknown) -> Outcome:
    """A recovered action that was to be dispatched again when the run began stopping (or
    that a stop looked up: :mod:`_stop_lookups`)."""
    assert run.stop is not None
    if run.stop.reason in ("budget", "recovery"):
        # The task stays resumable: the node stays running and the next run reconciles the
        # action again (an outcome in state "budget" without an exception: interrupted).
        return Outcome("budget")
    if isinstance(verdict, Absent):
        return Outcome("canceled", action=action.model_copy(update={
            "state": "rejected", "fence": run.fence, "reason": "proved absent; not "
            f"dispatched again because the task stopped ({run.stop.reason})"}))
    return uncertain(run, action, f"lookup: {verdict.reason}; not dispatched again to the "
                     f"idempotent destination because the task stopped ({run.stop.reason})")


async def _dispatch(run: TaskRun, node: NodeSpec, connector: Any, request: ActionRequest,
                    action: ActionRecord, permit: Ticket | None) -> Outcome:
    with span("agentium_graph.connector.dispatch", {"agentium.task.key": run.key,
                                                    "agentium.node.id": node.id,
                                                    "agentium.action.id": action.action_id}
              ) as current:
        failure: BaseException | None = None
        try:
            # The permit covers the dispatch's own task: one abandoned (it swallowed a
            # cancel) keeps its slot until it really ends, as an abandoned tool does.
            running = run.running.get(node.id)  # an effect node's own permit
            ticket = permit if permit is not None or running is None else running.ticket
            result = await _bounded(connector.dispatch(request), run.rt.effect_timeout,
                                    _who(run, connector, action, "dispatch"),
                                    f"dispatch:{run.key}:{action.action_id}",
                                    started=None if ticket is None else
                                    functools.partial(run.admission.bind, ticket))
        except asyncio.CancelledError as exc:
            if runtime_cancelled():
                raise  # the run abandons its work: the next run reconciles it
            failure = exc  # the connector's own code let a cancellation escape
        except (KeyboardInterrupt, SystemExit):
            raise  # the process is going down: the next run reconciles the action
        except BaseException as exc:  # any other: the effect may have happened; reconcile
            failure = exc
        if failure is not None:  # dispatch failed or timed out: did it take effect?
            failed(current, failure)
            return await _failed(run, node, connector, action, failure, permit)
    if not isinstance(result, ActionOutcome):
        return uncertain(run, action, f"connector returned {type(result).__name__}, not an "
                         "ActionOutcome")
    return receipt(run, node, action, result, source="dispatch")


async def _failed(run: TaskRun, node: NodeSpec, connector: Any, action: ActionRecord,
                  exc: BaseException, permit: Ticket | None) -> Outcome:
    log.warning("task %s node %s: dispatch of %s failed (%r); reconciling",
                run.key, node.id, action.action_id, exc)
    verdict = await _lookup(run, connector, action, permit)
    if isinstance(verdict, ActionOutcome):
        return receipt(run, node, action, verdict, source="reconcile")
    if isinstance(verdict, Absent):
        info = ErrorInfo.from_exception(exc, node_id=node.id)
        rejected = action.model_copy(update={
            "state": "rejected", "reason": f"dispatch failed and the connector proved "
            f"the action absent: {info.message}"})
        return Outcome("failed", error=info.model_copy(update={
            "code": "effect_dispatch_failed"}), action=rejected)
    return uncertain(run, action, f"dispatch raised {described(exc)}; "
                     f"lookup: {verdict.reason}")


async def _lookup(run: TaskRun, connector: Any, action: ActionRecord,
                  permit: Ticket | None) -> ActionOutcome | Absent | Unknown:
    """:func:`reconcile` holding no root permit: ``permit`` is released first (the runtime
    releases it again at the end, which is then a no-op)."""
    if permit is not None:
        run.admission.release(permit)
    return await reconcile(run, connector, action)


def receipt(run: TaskRun, node: NodeSpec, action: ActionRecord, result: ActionOutcome,
            *, source: str) -> Outcome:
    returned = result.result_ref
    if returned != action.result_ref and returned in run.actions:
        # A connector may return a handle of its own (the destination's id for the
        # result), but not another action of this task: that outcome is evidence about a
        # different action, and taking it as this one's receipt would complete the node
        # with another action's output.
        return uncertain(run, action, f"the connector's {source} outcome names action "
                         f"{returned} of this task, not {action.result_ref}: it answers for "
                         "another action; check the destination, then resolve this action")
    checked = check_output(node.id, node.binding, result.output, run.max_blob_bytes)
    if checked.state != "completed":
        # The destination acted but its answer is unusable: never re-dispatch; say so.
        assert checked.error is not None
        bad = action.model_copy(update={"state": "uncertain",
                                        "reason": f"invalid outcome: {checked.error.message}"})
        return Outcome("uncertain", error=checked.error, action=bad)
    checked.action = action.model_copy(update={
        "state": "confirmed", "outcome_digest": checked.digest, "outcome_source": source,
        "result_ref_returned": result.result_ref})
    return checked


def uncertain(run: TaskRun, action: ActionRecord, reason: str) -> Outcome:
    info = ErrorInfo(code="effect_uncertain", node_id=action.node_id,
                     message=f"outcome of action {action.action_id} is unknown: {reason}",
                     details={"action_ids": [action.action_id]})
    return Outcome("uncertain", error=info,
                   action=action.model_copy(update={"state": "uncertain", "reason": reason}))


async def reconcile(run: TaskRun, connector: Any,
                    action: ActionRecord) -> ActionOutcome | Absent | Unknown:
    """Ask the connector what happened, bounded by a timeout and a few jittered retries."""

    async def once() -> ActionOutcome | Absent | Unknown:
        with span("agentium_graph.connector.resolve", {"agentium.task.key": run.key,
                                                       "agentium.action.id": action.action_id}
                  ) as current:
            try:
                verdict = await _bounded(connector.resolve_result(action.result_ref),
                                         run.rt.lookup_timeout,
                                         _who(run, connector, action, "lookup"),
                                         f"lookup:{run.key}:{action.action_id}")
            except asyncio.CancelledError:
                if runtime_cancelled():
                    raise
                return Unknown(reason="lookup failed: it raised CancelledError itself")
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # a connector's failure, whatever its class
                failed(current, exc)
                return Unknown(reason=f"lookup failed: {described(exc)}")
        if isinstance(verdict, ActionOutcome | Absent | Unknown):
            return verdict
        return Unknown(reason=f"lookup returned {type(verdict).__name__}")

    last: ActionOutcome | Absent | Unknown = Unknown(reason="no lookup made")
    for attempt in range(run.rt.lookup_attempts):
        last = await once()
        if not isinstance(last, Unknown):
            return last
        if attempt + 1 < run.rt.lookup_attempts:
            # Full jitter, exponential: spreads lookups of many recovering workers.
            await asyncio.sleep(random.uniform(0, min(1.0, 0.05 * 2 ** attempt)))
    return last


async def _bounded(work: Coroutine[Any, Any, Any], limit: float, who: str,
                   name: str, *,
                   started: Callable[[asyncio.Task[Any]], None] | None = None) -> Any:
    """Await a connector's ``work`` for at most ``limit`` seconds (``TimeoutError`` then),
    as :func:`asyncio.wait_for` would, except that a connector that swallows the
    cancellation (of the limit, or of the run abandoning its work) is abandoned after
    :data:`_abandon.GRACE` seconds (logged) instead of holding the run. ``started`` is
    given the task that runs ``work``."""
    task = await _abandon.within(work, limit, who, name=name, party=_abandon.CONNECTOR,
                                 started=started)
    if task is None:
        raise TimeoutError(f"no answer within {limit:g} s")
    return task.result()


def _who(run: TaskRun, connector: Any, action: ActionRecord, what: str) -> str:
    return (f"the {what} of action {action.action_id} of node {action.node_id!r} of task "
            f"{run.key!r} through {_abandon.named('connector', connector)}")


async def _reuse_receipt(run: TaskRun, node: NodeSpec, action: ActionRecord) -> Outcome:
    assert action.outcome_digest is not None
    blobs = await read_verified(run.store, [action.outcome_digest])
    problem = blobs.problem(action.outcome_digest)
    if problem is not None:
        raise NodeFailedError(f"node {node.id!r}: the outcome blob of action "
                              f"{action.action_id}'s receipt is {problem}; the store was "
                              "damaged", node_id=node.id)
    checked = check_output(node.id, node.binding,
                           json.loads(blobs.texts[action.outcome_digest]), run.max_blob_bytes)
    checked.action = action
    return checked
