"""Operator resolution of uncertain effects (used by the runtime and the CLI).

Resolution needs only the store: the output is checked against the output schema the task
pinned for the binding, so an operator can resolve from the CLI without the host catalog.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from agentium_graph._canonical import NotJSONError, canonical_json, check_json, digest_text
from agentium_graph._schemarefs import local_registry
from agentium_graph.connectors import Absent, ActionOutcome
from agentium_graph.errors import (
    ConfigurationError,
    ResolutionConflictError,
    StaleFenceError,
    StoreError,
    TaskNotFoundError,
)
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import ActionRecord, TaskIdentity
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


async def resolve_action(store: DurableTaskStore, key: str, action_id: str,
                         outcome: ActionOutcome | Absent, *, actor: str,
                         clock: Callable[[], datetime], lease_ttl: float = 15.0) -> None:
    if not actor:
        raise ConfigurationError("resolve_action needs actor=... (who attests the outcome)")
    if not isinstance(outcome, ActionOutcome | Absent):
        raise ConfigurationError("outcome must be ActionOutcome(...) or Absent()")
    snapshot = await store.get_task(key)
    if snapshot is None:
        raise TaskNotFoundError(key)
    action = snapshot.actions.get(action_id)
    if action is None:
        raise ConfigurationError(f"task {key!r} has no action {action_id!r}; list its actions "
                                 "with inspect")
    verdict = "absent" if isinstance(outcome, Absent) else "outcome"
    if action.state != "uncertain":
        if action.resolution is not None and _same(action, outcome, verdict):
            return  # identical re-delivery of a resolution already recorded
        raise ResolutionConflictError(
            f"action {action_id} is {action.state}, not uncertain"
            + (f" (already resolved by {action.resolution.get('actor')!r})"
               if action.resolution else "") + "; a second resolution is rejected",
            node_id=action.node_id)
    worker = f"operator:{actor}"
    grant = await store.acquire_lease(AcquireLeaseRequest(key=key, worker_id=worker,
                                                          ttl_seconds=lease_ttl, now=clock()))
    now = clock()
    resolution = {"actor": actor, "verdict": verdict, "at": now.isoformat()}
    steps: list[Step] = []
    blobs: dict[str, str] = {}
    try:
        if isinstance(outcome, ActionOutcome):
            text = _checked_output(snapshot.header.key, action, outcome, await
                                   store.get_identity(key))
            out_digest = digest_text(text)
            blobs[out_digest] = text
            steps.append(RecordAction(action=action.model_copy(update={
                "state": "confirmed", "outcome_digest": out_digest,
                "outcome_source": "operator", "result_ref_returned": outcome.result_ref,
                "resolution": resolution, "fence": grant.fence})))
            steps.append(SettleNode(node_id=action.node_id, state="completed",
                                    output_digest=out_digest))
        else:
            steps.append(RecordAction(action=action.model_copy(update={
                "state": "intent", "resolution": resolution, "fence": grant.fence,
                "reason": f"operator {actor} attested the effect is absent"})))
            steps.append(ReopenNode(node_id=action.node_id,
                                    reason=f"action {action_id} attested absent by {actor}"))
        others = [a for a in snapshot.actions.values()
                  if a.state == "uncertain" and a.action_id != action_id]
        if others:
            steps.append(SetStatus(status="recovery_required", release_lease=True,
                                   error=snapshot.header.error))
        else:
            steps.append(SetStatus(status="pending", release_lease=True))
        await store.commit(CommitRequest(key=key, worker_id=worker, fence=grant.fence,
                                         now=now, steps=tuple(steps), blobs=blobs))
    except BaseException:
        with contextlib.suppress(StaleFenceError, StoreError):
            await store.release_lease(ReleaseLeaseRequest(key=key, worker_id=worker,
                                                          fence=grant.fence, now=clock()))
        raise


def _same(action: ActionRecord, outcome: ActionOutcome | Absent, verdict: str) -> bool:
    assert action.resolution is not None
    if action.resolution.get("verdict") != verdict:
        return False
    if isinstance(outcome, ActionOutcome):
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
            errors = list(cls(schema, registry=local_registry()).iter_errors(outcome.output))
            if errors:
                raise ConfigurationError(
                    f"task {key!r}: resolution output violates the output schema of "
                    f"{origin.get('binding')!r}: {errors[0].message}")
    return canonical_json(outcome.output)
