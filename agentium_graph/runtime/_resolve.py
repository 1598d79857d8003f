"""Operator resolution of uncertain effects (used by the runtime and the CLI).

Resolution needs only the store: the output is checked against the output schema the task
pinned for the binding, so an operator can resolve from the CLI without the host catalog.

An attested outcome is the action's receipt. For a tool node's own effect it is also the
node's output (the node completes); for a call made inside a node (an agent's tool call)
the node is reopened, like after an attested absence, and its next run reuses the receipt
without dispatching. The decision is made on a read taken under the task's lease, so of two
concurrent resolutions of one action the later one sees the first: an identical one is a
no-op, a different one is refused with ResolutionConflictError.

Canceling a ``recovery_required`` task is the other operator action here: nothing runs it,
so it is canceled in one commit under its lease, leaving its uncertain actions in the ledger.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable
from datetime import datetime

from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for
from pydantic import TypeAdapter

from agentium_graph._canonical import NotJSONError, canonical_json, check_json, digest_text
from agentium_graph._schemarefs import local_registry
from agentium_graph.connectors import Absent, ActionOutcome
from agentium_graph.errors import (
    ConfigurationError,
    DurableRecoveryRequiredError,
    ErrorInfo,
    InvalidTransitionError,
    LeaseHeldError,
    ResolutionConflictError,
    StaleFenceError,
    StoreError,
    TaskCanceledError,
    TaskNotFoundError,
)
from agentium_graph.runtime._args import check_actor
from agentium_graph.runtime._config import DEFAULT_LEASE_TTL
from agentium_graph.runtime._inspect import check_snapshot, verified_identity
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import (
    TERMINAL_TASK,
    ActionRecord,
    NodeRecord,
    TaskIdentity,
    TaskSnapshot,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CommitRequest,
    RecordAction,
    ReleaseLeaseRequest,
    ReopenNode,
    SetStatus,
    SettleNode,
    Step,
)
from agentium_graph.store._transitions import TERMINAL_NODE

log = logging.getLogger("agentium_graph.runtime")


async def resolve_action(store: DurableTaskStore, key: str, action_id: str,
                         outcome: ActionOutcome | Absent, *, actor: str,
                         clock: Callable[[], datetime],
                         lease_ttl: float = DEFAULT_LEASE_TTL) -> None:
    check_actor(actor)
    if not isinstance(outcome, ActionOutcome | Absent):
        raise ConfigurationError("outcome must be ActionOutcome(...) or Absent()")
    verdict = "absent" if isinstance(outcome, Absent) else "outcome"
    # A first look without the lease: an already resolved action needs no lease at all.
    first = await _snapshot(store, key)
    if not _unresolved(first, action_id, outcome, verdict):
        return
    # Check the attested output before taking the lease: a refused outcome must leave the
    # task as it was (taking the lease journals it and raises the fence). The pinned schema
    # and the action's origin never change, so the check holds under the lease too.
    text = None if isinstance(outcome, Absent) else _checked_output(
        key, first.actions[action_id], outcome,
        await verified_identity(store, key, first.header.identity_digest))
    worker = f"operator:{actor}"
    try:
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=key, worker_id=worker, ttl_seconds=lease_ttl, now=clock()))
    except LeaseHeldError as exc:
        if not exc.holder.startswith("operator:"):
            raise  # a worker runs the task: retry once its run has ended
        snapshot = await _snapshot(store, key)
        if not _unresolved(snapshot, action_id, outcome, verdict):
            return
        raise ResolutionConflictError(
            f"another resolution of task {key!r} by "
            f"{exc.holder.removeprefix('operator:')!r} is in progress, so this resolution of "
            f"action {action_id} was not recorded; inspect the task and, if the action is "
            "still uncertain, resolve it again", node_id=snapshot.actions[action_id].node_id,
            details={"key": key, "action_id": action_id, "retryable": True}) from None
    committed = False
    try:
        # Decide on a read made under the lease: a concurrent resolution may have committed
        # after the first look, and the lease's fence keeps any later one out until ours
        # commits (so the later one sees ours and is refused, or repeats it as a no-op).
        snapshot = await _snapshot(store, key)
        if not _unresolved(snapshot, action_id, outcome, verdict):
            return
        now = clock()
        steps, blobs = _steps(snapshot, action_id, outcome, text, verdict, actor,
                              grant.fence, now)
        try:
            await store.commit(CommitRequest(key=key, worker_id=worker, fence=grant.fence,
                                             now=now, steps=steps, blobs=blobs))
        except StaleFenceError:
            # Another holder took the lease after our grant: with the same actor (the same
            # worker id re-acquires at once) that is another resolution of this task.
            await _superseded(store, key, action_id, outcome, verdict)
            return
        committed = True
    finally:
        if not committed:
            await _release(store, key, worker, grant.fence, clock)


async def _snapshot(store: DurableTaskStore, key: str) -> TaskSnapshot:
    snapshot = await store.get_task(key)
    if snapshot is None:
        raise TaskNotFoundError(key)
    return snapshot


_TIMESTAMP: TypeAdapter[datetime] = TypeAdapter(datetime)


def _unresolved(snapshot: TaskSnapshot, action_id: str, outcome: ActionOutcome | Absent,
                verdict: str) -> bool:
    """True while the action is uncertain; False when this very resolution is already
    recorded (a harmless repeat); ResolutionConflictError for anything else."""
    action = snapshot.actions.get(action_id)
    if action is None:
        raise ConfigurationError(f"task {snapshot.header.key!r} has no action {action_id!r}; "
                                 "list its actions with inspect")
    if action.state == "uncertain" and snapshot.header.status in TERMINAL_TASK:
        raise ResolutionConflictError(
            f"task {snapshot.header.key!r} is {snapshot.header.status}, so action {action_id} "
            "can no longer be resolved: the ledger keeps it uncertain, as the evidence that "
            "its outcome was never attested (resolve uncertain actions before canceling a "
            "task, if the task should record them)", node_id=action.node_id,
            details={"key": snapshot.header.key, "action_id": action_id,
                     "status": snapshot.header.status})
    if action.state == "uncertain":
        return True
    if action.resolution is not None and _same(action, outcome, verdict):
        return False  # identical re-delivery of a resolution already recorded
    if action.resolution is not None:
        raise ResolutionConflictError(
            f"action {action_id} is {action.state}, not uncertain (already resolved by "
            f"{action.resolution.get('actor')!r}); a second resolution is rejected",
            node_id=action.node_id)
    raise ResolutionConflictError(
        f"action {action_id} is {action.state}, not uncertain: only an uncertain action "
        "can be resolved"
        + ("; a run looks a dispatching action up through its connector first"
           if action.state == "dispatching" else ""), node_id=action.node_id)


async def _superseded(store: DurableTaskStore, key: str, action_id: str,
                      outcome: ActionOutcome | Absent, verdict: str) -> None:
    """After our commit lost the lease: return if what we meant is recorded now, else raise
    the conflict, or a retryable one while the action is still uncertain."""
    snapshot = await _snapshot(store, key)
    if not _unresolved(snapshot, action_id, outcome, verdict):
        return
    owner = snapshot.header.lease.owner if snapshot.header.lease is not None else ""
    if owner.startswith("operator:"):
        what = (f"another resolution of task {key!r} by {owner.removeprefix('operator:')!r} "
                "is in progress")
    else:  # it has finished already (or a worker took the lease after ours expired)
        what = (f"the lease of task {key!r} was taken (by another resolution or a worker) "
                "while this one was in progress")
    raise ResolutionConflictError(
        f"{what}, so this resolution of action {action_id} was not recorded; inspect the "
        "task and, if the action is still uncertain, resolve it again",
        node_id=snapshot.actions[action_id].node_id,
        details={"key": key, "action_id": action_id, "retryable": True})


def _steps(snapshot: TaskSnapshot, action_id: str, outcome: ActionOutcome | Absent,
           text: str | None, verdict: str, actor: str, fence: int,
           now: datetime) -> tuple[tuple[Step, ...], dict[str, str]]:
    """The steps (and blobs) that record the resolution of the uncertain ``action_id``;
    ``text``: the checked canonical output of an ``ActionOutcome``."""
    key = snapshot.header.key
    action = snapshot.actions[action_id]
    # "at" as every record's timestamp is written (UTC with "Z"), not isoformat()'s "+00:00".
    resolution = {"actor": actor, "verdict": verdict, "at": _TIMESTAMP.dump_python(
        now, mode="json")}
    steps: list[Step] = []
    blobs: dict[str, str] = {}
    if isinstance(outcome, ActionOutcome):
        assert text is not None
        out_digest = digest_text(text)
        blobs[out_digest] = text
        steps.append(RecordAction(action=action.model_copy(update={
            "state": "confirmed", "outcome_digest": out_digest,
            "outcome_source": "operator", "result_ref_returned": outcome.result_ref,
            "resolution": resolution, "fence": fence})))
        if _own_effect(snapshot.nodes.get(action.node_id), action):
            steps.append(SettleNode(node_id=action.node_id, state="completed",
                                    output_digest=out_digest))
        else:
            # A call made inside the node (an agent's tool call): the output is that call's
            # receipt, not the node's; the node runs again and reuses it without dispatch.
            steps.append(ReopenNode(node_id=action.node_id,
                                    reason=f"action {action_id} resolved by {actor}; the "
                                    "node resumes with its receipt"))
    else:
        steps.append(RecordAction(action=action.model_copy(update={
            "state": "intent", "resolution": resolution, "fence": fence,
            "reason": f"operator {actor} attested the effect is absent"})))
        steps.append(ReopenNode(node_id=action.node_id,
                                reason=f"action {action_id} attested absent by {actor}"))
    others = sorted(a.action_id for a in snapshot.actions.values()
                    if a.state == "uncertain" and a.action_id != action_id)
    if others:
        # Name only what is still uncertain (the error run raises until it is resolved).
        error = DurableRecoveryRequiredError(key, others)
        steps.append(SetStatus(status="recovery_required", release_lease=True,
                               error=ErrorInfo(code=error.code, message=str(error),
                                               details={"action_ids": others})))
    else:
        steps.append(SetStatus(status="pending", release_lease=True))
    return tuple(steps), blobs


def _own_effect(node: NodeRecord | None, action: ActionRecord) -> bool:
    """Whether the action is its node's own effect (a tool node of the action's binding),
    so that its output is the node's output. (A missing node is left to the state machine,
    which refuses to settle it.)"""
    return node is None or (node.kind == "tool" and (node.binding, node.version) == (
        action.origin.get("binding"), action.origin.get("binding_version")))


def _same(action: ActionRecord, outcome: ActionOutcome | Absent, verdict: str) -> bool:
    assert action.resolution is not None
    if action.resolution.get("verdict") != verdict:
        return False
    if isinstance(outcome, ActionOutcome):
        if outcome.result_ref != action.result_ref_returned:
            return False  # the same output attested with another result_ref: a conflict
        try:
            return digest_text(canonical_json(outcome.output)) == action.outcome_digest
        except (NotJSONError, TypeError, ValueError):
            return False
    return True


def _checked_output(key: str, action: ActionRecord, outcome: ActionOutcome,
                    identity: TaskIdentity | None) -> str:
    try:
        check_json(outcome.output, "$output")
    except NotJSONError as exc:
        raise ConfigurationError(
            f"resolution output is not JSON at {exc.path}: {exc.reason}") from None
    if identity is not None:
        origin = action.origin
        pinned = identity.descriptors.get(f"{origin.get('binding')}@"
                                          f"{origin.get('binding_version')}")
        if pinned is not None:
            schema = pinned["output_schema"]
            cls = validator_for(schema, default=Draft202012Validator)  # the pinned draft
            try:
                errors = list(cls(schema, registry=local_registry()).iter_errors(
                    outcome.output))
            except RecursionError:  # a recursive schema checks each level in several frames
                raise ConfigurationError(
                    f"task {key!r}: resolution output nests too deeply to be checked against "
                    f"the output schema of {origin.get('binding')!r}; attest a flatter "
                    "output") from None
            if errors:
                raise ConfigurationError(
                    f"task {key!r}: resolution output violates the output schema of "
                    f"{origin.get('binding')!r}: {errors[0].message}")
    return canonical_json(outcome.output)


def canceler_id(key: str) -> str:
    """A worker id for one operator's cancel to run or lease the task under:
    ``canceler:KEY:NONCE`` (or ``canceler:sha256:DIGEST:NONCE`` for a key too long for a
    worker id's 200 characters). The nonce is new for every cancel: a store hands a live
    lease over to the worker id holding it (a restarted worker), so two cancels sharing one
    id, in two processes, would take the task from each other mid-commit."""
    nonce = secrets.token_hex(4)
    worker = f"canceler:{key}:{nonce}"
    if len(worker) <= 200:
        return worker
    hashed = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"canceler:sha256:{hashed}:{nonce}"


async def cancel_stopped(store: DurableTaskStore, key: str, *, lease_ttl: float,
                         clock: Callable[[], datetime], idle: bool = False,
                         worker: str | None = None, leave_lookups: bool = False) -> bool:
    """Cancel a task nobody runs in one commit under its lease, without running it.

    By default only a ``recovery_required`` task (a run would stop at its uncertain
    actions). With ``idle``, also a ``pending`` or ``running`` one whose lease is free, for
    when no run can apply the cancel (the catalog no longer has what the task pinned). Its
    open nodes become ``canceled`` and actions never dispatched ``rejected``; uncertain
    actions stay in the ledger and are named. An action a crashed run left
    ``dispatching`` may have taken effect, and no run looked it up: it becomes
    ``uncertain`` and the task ``recovery_required`` instead (canceling it again then
    cancels it), as a run's own stop does.

    ``leave_lookups`` (for a task a budget stopped, which a run can still run): only
    such a task, checked again under the lease, and if a crash left an action
    ``dispatching``, change nothing and leave the cancel to a run, whose stop looks the
    action up through its connector first.

    False when the task is in neither state any more (an operator resolved it, a worker
    ended it meanwhile) or its cancel is left to a run; True otherwise, also when another
    worker took the lease (the cancel request stays for it)."""
    worker = canceler_id(key) if worker is None else worker
    try:
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=key, worker_id=worker, ttl_seconds=lease_ttl, now=clock(),
            snapshot=True))
    except (LeaseHeldError, InvalidTransitionError) as exc:
        log.info("task %s: cancel recorded; a worker will apply it (%s)", key, exc)
        return True
    try:
        snapshot = grant.snapshot or await store.get_task(key)
        assert snapshot is not None
        allowed = ("recovery_required", "pending", "running") if idle else \
            ("recovery_required",)
        header = snapshot.header
        if header.status not in allowed or (leave_lookups and (not header.budget_stopped or any(
                a.state == "dispatching" for a in snapshot.actions.values()))):
            await _release(store, key, worker, grant.fence, clock)
            return False
        # Nothing is written over damage (the lease is given back by the handler below).
        check_snapshot(snapshot, await verified_identity(store, key,
                                                         snapshot.header.identity_digest))
        await store.commit(CommitRequest(key=key, worker_id=worker, fence=grant.fence,
                                         now=clock(),
                                         steps=_cancel_steps(snapshot, grant.fence,
                                                             idle)))
    except StaleFenceError as exc:
        log.info("task %s: cancel recorded; a worker will apply it (%s)", key, exc)
    except BaseException:
        await _release(store, key, worker, grant.fence, clock)
        raise
    return True


def _cancel_steps(snapshot: TaskSnapshot, fence: int, idle: bool) -> tuple[Step, ...]:
    key = snapshot.header.key
    cancel = snapshot.header.cancel
    why = cancel.reason if cancel is not None else "canceled"
    open_nodes = {node_id for node_id, rec in snapshot.nodes.items()
                  if rec.state not in TERMINAL_NODE}
    actions = sorted(snapshot.actions.values(), key=lambda a: a.action_id)
    steps: list[Step] = []
    reason = ("its dispatch was interrupted by a crash, and the task was canceled by a "
              "runtime that cannot look it up (its catalog cannot run the task): check the "
              "destination, then resolve_action or cancel again" if idle else
              "its dispatch was interrupted by a crash and the task was canceled before a "
              "run looked it up")
    interrupted = [a for a in actions if a.state == "dispatching"]
    for action in interrupted:
        steps.append(RecordAction(action=action.model_copy(update={
            "state": "uncertain", "fence": fence, "reason": reason})))
    stuck = sorted(a.action_id for a in actions if a.state in ("uncertain", "dispatching"))
    if interrupted and snapshot.header.status != "recovery_required":
        # Never hidden by a cancel: the task waits for an operator, who may cancel again.
        by_node: dict[str, list[str]] = {}
        for action in interrupted:
            by_node.setdefault(action.node_id, []).append(action.action_id)
        for node_id, ids in sorted(by_node.items()):
            if snapshot.nodes[node_id].state in ("prepared", "running") if \
                    node_id in snapshot.nodes else False:
                steps.append(SettleNode(node_id=node_id, state="uncertain", error=ErrorInfo(
                    code="effect_uncertain", node_id=node_id,
                    message=f"outcome of action(s) {', '.join(ids)} is unknown: {reason}",
                    details={"action_ids": ids})))
        error = DurableRecoveryRequiredError(key, stuck)
        steps.append(SetStatus(status="recovery_required", release_lease=True,
                               error=ErrorInfo(code=error.code, message=str(error),
                                               details={"action_ids": stuck})))
        return tuple(steps)
    info = TaskCanceledError(
        f"task {key!r} was canceled: {why}"
        + (f"; the outcome of action(s) {', '.join(stuck)} stays unknown, so check "
           "their destinations" if stuck else ""),
        details={"reason": why, "uncertain_actions": stuck}).to_info()
    for action in actions:
        if action.state == "intent":  # never dispatched, and now never will be
            steps.append(RecordAction(action=action.model_copy(update={
                "state": "rejected", "fence": fence,
                "reason": "not dispatched: the task was canceled"})))
    steps.extend(SettleNode(node_id=node_id, state="canceled", error=info)
                 for node_id in sorted(open_nodes))
    steps.append(SetStatus(status="canceled", error=info, release_lease=True))
    return tuple(steps)


async def _release(store: DurableTaskStore, key: str, worker: str, fence: int,
                   clock: Callable[[], datetime]) -> None:
    with contextlib.suppress(StaleFenceError, StoreError):
        await store.release_lease(ReleaseLeaseRequest(key=key, worker_id=worker, fence=fence,
                                                      now=clock()))
