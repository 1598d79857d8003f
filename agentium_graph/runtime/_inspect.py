"""What ``inspect`` returns: a task's stored state assembled into a verified TaskView."""

from __future__ import annotations

import json
from typing import Any

from agentium_graph.errors import DataIntegrityError, StoreSchemaError
from agentium_graph.runtime._blobs import read_verified
from agentium_graph.runtime._planner import planner_view
from agentium_graph.runtime._views import NodeView, TaskView
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import (
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    identity_digest_of,
    trusted,
)
from agentium_graph.store._requests import TimelineRequest

_NODE_VIEW_SET = frozenset(NodeView.model_fields)


async def build_view(store: DurableTaskStore, snapshot: TaskSnapshot,
                     identity: TaskIdentity | None, *,
                     identity_digest: str | None = None) -> TaskView:
    """Assemble a TaskView, verifying every digest it can; problems are listed, not raised.

    ``identity_digest``: the identity's digest when the caller just computed it itself
    (create), so it is not hashed twice.
    """
    header = snapshot.header
    problems: list[str] = []
    if identity is None:
        problems.append("identity record is missing")
    elif (identity_digest or identity_digest_of(identity)) != \
            header.identity_digest:
        problems.append("identity record does not match the task's identity digest")
    # One read for every blob a run may load: node outputs and the receipts of confirmed
    # actions (an agent's tool call replays its receipt, which no node output names).
    # And a planned task's committed plan, which its next run loads.
    actions = sorted(snapshot.actions.values(), key=lambda a: a.action_id)
    plan_digest = header.plan_digest if identity is not None and identity.plan is None \
        else None
    blobs = await read_verified(store, [*(n.output_digest for n in snapshot.nodes.values()
                                          if n.output_digest),
                                        *(a.outcome_digest for a in actions
                                          if a.outcome_digest),
                                        *([plan_digest] if plan_digest else [])])
    plan_problem = blobs.problem(plan_digest) if plan_digest else None
    if plan_problem is not None:
        problems.append(f"committed plan of revision {header.revision} (blob {plan_digest}) "
                        f"is {plan_problem}")
    views: dict[str, NodeView] = {}
    # In node-id order on every store (each keeps its records in an order of its own).
    for node_id, rec in sorted(snapshot.nodes.items()):
        output: Any = None
        if rec.output_digest:
            problem = blobs.problem(rec.output_digest)
            if problem == "missing":
                problems.append(f"node {node_id!r}: output blob is missing")
            elif problem == "damaged":
                problems.append(f"node {node_id!r}: output does not match its digest")
            else:
                output = json.loads(blobs.texts[rec.output_digest])
        # The record's values as they are: it was validated when it was built or read.
        views[node_id] = trusted(NodeView, {
            "node_id": node_id, "state": rec.state, "kind": rec.kind, "binding": rec.binding,
            "version": rec.version, "revision": rec.revision,
            "incarnation_id": rec.incarnation_id, "parent": rec.parent, "deps": rec.deps,
            "attempts": list(rec.attempts), "input_digest": rec.input_digest,
            "output": output, "output_digest": rec.output_digest, "error": rec.error},
            _NODE_VIEW_SET)
    outputs = {n.output_digest for n in snapshot.nodes.values()}
    for action in actions:
        problem = blobs.problem(action.outcome_digest) if action.outcome_digest else None
        if problem is not None and action.outcome_digest not in outputs:  # else: its node's
            problems.append(f"action {action.action_id}: its receipt (outcome blob) is "
                            + ("missing" if problem == "missing" else
                               "damaged: it does not match its digest"))
    for name, value in header.counters.items():
        limit = header.limits.get(name)
        if limit is not None and value > limit:
            problems.append(f"counter {name}={value} exceeds its limit {limit}")
    problems.extend(record_problems(snapshot, identity))
    planner, planner_problems = await planner_view(store, header, identity)
    problems.extend(planner_problems)
    return TaskView(
        key=header.key, task_id=header.task_id, status=header.status, revision=header.revision,
        program=identity.program if identity else {},
        catalog_digest=identity.catalog_digest if identity else "",
        identity_digest=header.identity_digest, nodes=views, counters=dict(header.counters),
        limits=dict(header.limits),
        actions=tuple(actions),
        lease=header.lease, cancel=header.cancel, deadline=header.deadline, error=header.error,
        created_at=header.created_at, updated_at=header.updated_at, fence=header.fence,
        journal_length=header.journal_seq, verified=not problems, problems=tuple(problems),
        planner=planner)


def record_problems(snapshot: TaskSnapshot, identity: TaskIdentity | None) -> list[str]:
    """What no sequence of store writes can leave behind, so the stored records were
    changed outside the runtime: values out of range, records missing or misfiled, node
    and action records naming a fence the task never granted. A run refuses the ones it
    would build on (``check_records``, ``_load_outputs``)."""
    header = snapshot.header
    problems = [f"header: {name} is {value}, below 0" for name, value in (
        ("fence", header.fence), ("seq", header.seq), ("journal_seq", header.journal_seq),
        ("revision", header.revision)) if value < 0]
    problems.extend(f"counter {name}={value} is below 0"
                    for name, value in header.counters.items() if value < 0)
    if header.lease is not None and header.lease.fence != header.fence:
        problems.append(f"header: the lease's fence {header.lease.fence} is not the task's "
                        f"fence {header.fence}")
    plan = identity.plan if identity is not None else None
    nodes = plan.get("nodes") if isinstance(plan, dict) else None  # any JSON, if damaged
    planned = [n["id"] for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), str)
               ] if isinstance(nodes, list) else []
    problems.extend(f"node {node_id!r} of the plan has no stored record"
                    for node_id in planned if node_id not in snapshot.nodes)
    for node_id, rec in snapshot.nodes.items():
        if rec.node_id != node_id:
            problems.append(f"node {node_id!r}: its stored record names node {rec.node_id!r}")
        if rec.state == "completed" and not rec.output_digest:
            problems.append(f"node {node_id!r}: completed without an output digest")
        for attempt in rec.attempts:
            if not 0 < attempt.fence <= header.fence:
                problems.append(f"node {node_id!r}: attempt #{attempt.number} ran under fence "
                                f"{attempt.fence}, which the task (fence {header.fence}) "
                                "never granted")
    for action_id, action in snapshot.actions.items():
        if action.action_id != action_id:
            problems.append(f"action {action_id}: its stored record names action "
                            f"{action.action_id}")
        if action.node_id not in snapshot.nodes:
            problems.append(f"action {action_id}: its node {action.node_id!r} has no record")
        if not 0 < action.fence <= header.fence:
            problems.append(f"action {action_id}: recorded under fence {action.fence}, which "
                            f"the task (fence {header.fence}) never granted")
    return problems


async def journal_problem(store: DurableTaskStore, header: TaskHeader) -> str | None:
    """What is wrong with the end of the task's journal (one entry read: the last one its
    header counts), or None. A journal cut short or renumbered is seen here; the rest of it
    is checked as a timeline pages through it."""
    seq = header.journal_seq
    if seq < 1:
        return None  # record_problems names an impossible journal_seq
    try:
        last = await store.read_timeline(TimelineRequest(key=header.key, after_seq=seq - 1,
                                                         limit=1))
    except (StoreSchemaError, DataIntegrityError) as exc:
        return f"journal: {exc}"
    if [e.seq for e in last] != [seq]:
        found = f"entry {last[0].seq}" if last else "no entry"
        return f"journal: its last entry should be #{seq} (the header counts {seq}), " \
               f"the store has {found} there"
    return None


async def check_journal(store: DurableTaskStore, header: TaskHeader) -> None:
    """Raise DataIntegrityError for :func:`journal_problem`: a run appends to the journal,
    and does not go on from one whose end is damaged (``inspect`` lists it too)."""
    problem = await journal_problem(store, header)
    if problem is not None:
        raise DataIntegrityError(
            f"task {header.key!r}: {problem}; the store was damaged, restore it from a backup "
            f"(nothing was run; inspect {header.key!r} lists every problem)",
            details={"key": header.key, "problems": [problem]})


async def verified_identity(store: DurableTaskStore, key: str,
                            identity_digest: str) -> TaskIdentity:
    """The task's identity record, checked against the digest its header pins: what a run
    follows (plan, descriptors, input) and what an operator's resolution is checked with.
    DataIntegrityError when it is missing or another; nothing is written."""
    identity = await store.get_identity(key)
    if identity is None or identity_digest_of(identity) != identity_digest:
        problem = "is missing" if identity is None else \
            "does not match the task's identity digest"
        raise DataIntegrityError(
            f"task {key!r}: its identity record (plan, descriptors, input) {problem}; the "
            "store was damaged, restore it from a backup (nothing was run or written)",
            details={"key": key, "identity_digest": identity_digest,
                     "problem": "identity " + problem})
    return identity


def check_snapshot(snapshot: TaskSnapshot, identity: TaskIdentity) -> None:
    """Raise DataIntegrityError naming the first of :func:`record_problems`: a run does not
    build on records no store write can produce (``inspect`` lists every one)."""
    problems = record_problems(snapshot, identity)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        key = snapshot.header.key
        raise DataIntegrityError(
            f"task {key!r}: {problems[0]}{more}; the store was damaged, restore it from a "
            f"backup (nothing was run; inspect {key!r} lists every problem)",
            details={"key": key, "problems": problems[:10]})
