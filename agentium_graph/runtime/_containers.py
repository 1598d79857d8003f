"""Graph and repeat containers: materialize children, wait for them, settle the container.

Containers never hold a root permit: they are bookkeeping in the scheduler loop, so a task
with ``max_concurrent_work=1`` completes any nesting. Entering a container is one commit
(its attempt + its children as new node incarnations, charged to ``expanded_nodes`` and
``plan_revisions``); a repeat's guard decision is journaled with the next iteration's
materialization (or the container's completion), so recovery resumes at the right iteration
and never re-runs a completed one.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import (
    admission_id,
    attempt_id,
    canonical_json,
    digest,
    digest_text,
    incarnation_id,
    json_copy,
)
from agentium_graph.catalog._bindings import GraphBinding, RepeatBinding
from agentium_graph.errors import ErrorInfo, NodeOutputError, described
from agentium_graph.plan._validate import CompiledPlan
from agentium_graph.runtime._graph import NodeSpec, Scope, child_prefix
from agentium_graph.runtime._outcome import bytes_over, schema_error
from agentium_graph.runtime._stops import observe_stop
from agentium_graph.store._records import NodeRecord, new_node
from agentium_graph.store._requests import (
    AddNodes,
    AppendJournal,
    Charge,
    SettleNode,
    StartAttempt,
    Step,
)

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun


def is_container(spec: NodeSpec) -> bool:
    return spec.kind == "container"


def child_records(key: str, scope: Scope, container: str) -> tuple[NodeRecord, ...]:
    return tuple(node_record(key, scope.plan, scope.prefix, local, container)
                 for local in scope.plan.order)


def node_record(key: str, plan: CompiledPlan, prefix: str, local: str,
                parent: str | None) -> NodeRecord:
    node = plan.nodes[local]
    path = prefix + local
    binding = node.binding
    return new_node(
        path, incarnation_id(key, path, plan.revision, binding.id, binding.version,
                             node.args_digest or digest(node.args)),
        binding.kind, binding.id, binding.version, plan.revision, parent,
        tuple(prefix + d for d in node.deps))


def materialize(run: TaskRun, spec: NodeSpec, iteration: int | None,
                pending: dict[str, int]) -> tuple[list[Step], Scope] | None:
    """Steps that add one scope of children under ``spec``; None when a limit forbids it."""
    binding = spec.binding
    assert isinstance(binding, GraphBinding | RepeatBinding)
    plan = run.rt.nested_plan(binding, run.grants)
    prefix = child_prefix(spec.id, iteration)
    scope = Scope(prefix, plan, spec.id, iteration)
    records = child_records(run.key, scope, spec.id)
    rec = run.nodes[spec.id]
    tag = "graph" if iteration is None else f"iteration:{iteration}"
    expand = admission_id(rec.incarnation_id, f"expand:{tag}")
    revise = admission_id(rec.incarnation_id, f"revision:{tag}")
    charges = {"expanded_nodes": len(records), "plan_revisions": 1}
    if not run.admit_charges(spec.id, charges, pending, expand):
        return None
    steps: list[Step] = [
        AddNodes(nodes=records, admission_id=expand),
        Charge(admission_id=revise, charges={"plan_revisions": 1}, node_id=spec.id),
    ]
    return steps, scope


def enter(run: TaskRun, spec: NodeSpec, args: dict[str, Any], input_digest: str,
          steps: list[Step], pending: dict[str, int]) -> bool:
    """Start a container: its attempt and its first children, in the loop's commit."""
    rec = run.nodes[spec.id]
    first = None if isinstance(spec.binding, GraphBinding) else 0
    made = materialize(run, spec, first, pending)
    if made is None:
        return False
    added, scope = made
    steps.append(StartAttempt(node_id=spec.id, attempt_id=attempt_id(
        rec.incarnation_id, len(rec.attempts) + 1), input_digest=input_digest,
        requires_completed=spec.deps))
    steps.extend(added)
    if first is not None:
        steps.append(AppendJournal(kind="repeat_iteration", node_id=spec.id,
                                   data={"iteration": 0}))
    run.graph.add_scope(scope.prefix, scope.plan, spec.id, first)
    run.container_args[spec.id] = args
    run.active_containers.add(spec.id)
    return True


def restore(run: TaskRun) -> None:
    """Rebuild the scopes of containers a crashed run had entered, from stored children."""
    pending = [i for i in run.graph.order if is_container(run.graph.specs[i])]
    by_parent: dict[str, list[NodeRecord]] = {}  # one pass, not one per container
    for rec in run.nodes.values():
        if rec.parent is not None:
            by_parent.setdefault(rec.parent, []).append(rec)
    while pending:
        container = pending.pop(0)
        stored = run.nodes.get(container)
        if stored is None or stored.state == "completed":  # None: damage, check_records names it
            continue
        spec = run.graph.specs[container]
        children = by_parent.get(container)
        if not children:
            continue
        run.active_containers.add(container)
        binding = spec.binding
        assert isinstance(binding, GraphBinding | RepeatBinding)
        plan = run.rt.nested_plan(binding, run.grants)
        iterations: list[int | None] = [None]
        if isinstance(binding, RepeatBinding):
            iterations = [*sorted({int(c.node_id[len(container) + 1:].split("/", 1)[0])
                                   for c in children})]
        for it in iterations:
            scope = run.graph.add_scope(child_prefix(container, it), plan, container, it)
            pending.extend(m for m in scope.members if is_container(run.graph.specs[m]))


def advance(run: TaskRun, steps: list[Step], blobs: dict[str, str],
            pending: dict[str, int]) -> None:
    """Settle containers whose current scope finished; start a repeat's next iteration
    (unless the run began to stop this turn)."""
    for container in sorted(run.active_containers, key=run.graph.pos.__getitem__):
        if container in run.done or container in run.closed:
            run.active_containers.discard(container)
            continue
        spec = run.graph.specs[container]
        if not is_container(spec) or run.nodes[container].state != "running":
            continue
        last = run.graph.last_scope(container)
        if last is None:
            continue
        if not all(m in run.done for m in last.members):
            continue
        outputs = {run.graph.specs[m].local: run.outputs[m] for m in last.members}
        binding = spec.binding
        if isinstance(binding, GraphBinding):
            _settle(run, binding, container, outputs, steps, blobs)
            continue
        assert isinstance(binding, RepeatBinding) and last.iteration is not None
        if run.stop is not None:
            # An earlier container of this turn failed or was refused by a budget: a
            # stopping run starts no new iteration (its charge would buy nodes born
            # canceled, or never runnable); a budget stop's next run decides again.
            continue
        if any(run.nodes[m].state != "completed" for m in last.members):
            # Completed this turn, not yet durable: the condition runs once they are, in
            # the next turn (SPEC 8: a completion persists before what uses it). A crash
            # or a takeover during a slow condition then never re-runs the iteration.
            run.again = True
            continue
        i = last.iteration
        try:
            # Copies: the condition may change what it is given, but not the outputs and
            # input this run settles and hands on (a recovery reads them from the journal).
            decision = binding.condition(json_copy({
                "iteration": i, "outputs": outputs,
                "input": run.container_args.get(container)}, trusted=True))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a host callback: any failure fails the node, typed
            # (A sync callable raising CancelledError was not canceled by anyone.)
            _fail(run, container, steps, "repeat_condition_failed",
                  f"node {container!r}: the repeat condition raised on iteration {i}: "
                  f"{described(exc)}", {"iteration": i})
            continue
        if not isinstance(decision, bool):
            # The decision is journaled and replayed: a truthy object (or an un-awaited
            # coroutine, always truthy) would silently decide something the host never meant.
            if inspect.iscoroutine(decision):
                decision.close()
            kind = type(decision)
            # numpy.bool_ calls itself 'bool': name a type of another module by its module.
            returned = kind.__qualname__ if kind.__module__ == "builtins" else \
                f"{kind.__module__}.{kind.__qualname__}"
            _fail(run, container, steps, "repeat_condition_failed",
                  f"node {container!r}: the repeat condition returned {returned} on "
                  f"iteration {i}; it must return True (run another iteration) or False "
                  "(stop), a Python bool (bool(x) converts), from a plain (not async) "
                  "function", {"iteration": i, "returned": returned})
            continue
        again = decision
        stop_reason = None if again else "condition"
        if again and i + 1 >= binding.max_iterations:
            stop_reason = "max_iterations"
        steps.append(AppendJournal(kind="repeat_guard", node_id=container, data={
            "iteration": i, "decision": "stop" if stop_reason else "continue",
            **({"reason": stop_reason} if stop_reason else {})}))
        if stop_reason is None:
            observe_stop(run)  # the condition may have taken long: a deadline passed meanwhile
            if run.stop is not None:
                steps.pop()  # decided again by a run that can start the iteration
                continue
            made = materialize(run, spec, i + 1, pending)
            if made is None:
                steps.pop()  # the decision is journaled when the iteration can start
                continue
            added, scope = made
            steps.extend(added)
            steps.append(AppendJournal(kind="repeat_iteration", node_id=container,
                                       data={"iteration": i + 1}))
            run.graph.add_scope(scope.prefix, scope.plan, container, i + 1)
            continue
        _settle(run, binding, container, {"iterations": i + 1, "stopped": stop_reason,
                                          "last": outputs}, steps, blobs)


def _fail(run: TaskRun, container: str, steps: list[Step], code: str, message: str,
          details: dict[str, Any]) -> None:
    info = ErrorInfo(code=code, message=message, node_id=container, details=details)
    steps.append(SettleNode(node_id=container, state="failed", error=info))
    run.closed.add(container)
    run.active_containers.discard(container)
    run.fail(container, info)


def _settle(run: TaskRun, binding: GraphBinding | RepeatBinding, container: str,
            output: dict[str, Any], steps: list[Step], blobs: dict[str, str]) -> None:
    errors = binding.output_errors(output)
    if errors:  # a container's output_schema binds like any other binding's (SPEC 4)
        error = schema_error(NodeOutputError, container, "output", errors[0])
        _fail(run, container, steps, error.code, str(error), dict(error.details))
        return
    text = canonical_json(output)
    limit = run.max_blob_bytes
    # Its children's outputs each fit the store, their sum may not: the commit would be
    # refused with the children's completions in it, on every run (as check_output for a
    # leaf, the node fails instead).
    size = bytes_over(text, limit)
    if size is not None:
        _fail(run, container, steps, "node_output_invalid",
              f"node {container!r}: its output (its children's outputs together) is {size} "
              f"bytes as JSON, more than the {limit} bytes the store keeps in one record; "
              "have the nested program return less (keep large data elsewhere and return "
              "a reference to it)", {"bytes": size, "limit": limit})
        return
    out_digest = digest_text(text)
    blobs[out_digest] = text
    steps.append(SettleNode(node_id=container, state="completed", output_digest=out_digest))
    run.outputs[container] = output
    run.mark_done(container)
    run.closed.add(container)
    run.active_containers.discard(container)
    run.again = True  # its successors may be ready now


def previous_outputs(run: TaskRun, spec: NodeSpec) -> dict[str, Any] | None:
    scope = run.graph.scopes[spec.scope]
    if scope.iteration is None or scope.iteration == 0 or scope.parent is None:
        return None
    prev = run.graph.scopes.get(child_prefix(scope.parent, scope.iteration - 1))
    if prev is None:
        return None
    return {run.graph.specs[m].local: run.outputs.get(m) for m in prev.members}
