"""Looking up, as a run stops for good, the effects a crashed run left ``dispatching``.

A cancel, a passed deadline or a failure closes every open node. An action a crashed run
left ``dispatching`` (sent, no receipt) may have taken effect, so its node is not simply
canceled: this module asks the action's connector what happened first, once per run, with
the same bounded lookups recovery makes (:func:`_effects.reconcile`) and never a dispatch:

* an outcome -> the receipt is recorded; an effect node completes with it, an agent's tool
  call keeps it in the ledger (its agent node is closed by the stop);
* ``Absent()`` -> the action is ``rejected`` (it never happened and will not be sent);
* ``Unknown`` (or a connector the catalog no longer has) -> it is surfaced ``uncertain`` and
  the task ends ``recovery_required`` (:func:`_stops._surface`), naming what the lookup said.

The lookups run in a task of the run while the loop waits, so the lease is kept renewed;
the run's final commit carries what they found. A run that ends otherwise meanwhile (lease
lost, ``run()`` canceled) abandons them with its other work.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentium_graph.catalog._bindings import ToolBinding
from agentium_graph.connectors import Absent, ActionOutcome, Unknown
from agentium_graph.runtime._effects import not_dispatched_again, receipt, reconcile
from agentium_graph.runtime._stops import crash_left
from agentium_graph.store._records import ActionRecord
from agentium_graph.store._requests import RecordAction, Step

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

Verdict = ActionOutcome | Absent | Unknown

TERMINAL_STOPS = ("canceled", "deadline", "failed")


def advance(run: TaskRun, steps: list[Step], blobs: dict[str, str], launching: bool) -> bool:
    """Start the lookups when the stop is about to close nodes with such actions, or add
    what they found to this turn's ``steps``. True while they run (the run must not end)."""
    task = run.stop_lookup
    if task is not None:
        if not task.done():
            return True
        run.stop_lookup = None
        _settle(run, task.result(), steps, blobs)
        return False
    stop = run.stop
    if run.stop_looked or stop is None or stop.reason not in TERMINAL_STOPS or \
            run.running or launching or run.planning is not None or \
            run.pending_acquire is not None or run.lost is not None:
        return False
    actions = crash_left(run)
    if not actions:
        return False
    run.stop_looked = True
    run.stop_lookup = asyncio.create_task(_look_up(run, actions),
                                          name=f"stop-lookups:{run.key}")
    run.stop_lookup.add_done_callback(lambda _t: run.wake.set())
    return True


def _binding(run: TaskRun, action: ActionRecord) -> ToolBinding | None:
    """The tool that sent ``action``, as the task pinned it; None when this catalog no
    longer has that binding version behind the same connector."""
    origin = action.origin
    spec = run.graph.specs.get(action.node_id)
    binding: Any = spec.binding if spec is not None and spec.kind != "agent" else \
        run.rt.catalog.get(str(origin.get("binding")), str(origin.get("binding_version")))
    if not isinstance(binding, ToolBinding) or binding.connector is None or \
            binding.id != origin.get("binding") or \
            binding.version != origin.get("binding_version"):
        return None
    connector = binding.typed_connector
    if str(connector.id) != origin.get("connector") or \
            str(connector.version) != origin.get("connector_version"):
        return None
    return binding


async def _look_up(run: TaskRun, actions: list[ActionRecord]
                   ) -> list[tuple[ActionRecord, ToolBinding | None, Verdict]]:
    async def one(action: ActionRecord) -> tuple[ActionRecord, ToolBinding | None, Verdict]:
        binding = _binding(run, action)
        if binding is None:
            return action, None, Unknown(
                reason="not looked up: this runtime's catalog no longer registers the "
                       f"binding {action.origin.get('binding')!r} version "
                       f"{action.origin.get('binding_version')!r} behind its connector")
        return action, binding, await reconcile(run, binding.typed_connector, action)

    # At most the root's max_concurrent_work lookups at once (an agent may have left many).
    gate = asyncio.Semaphore(max(1, run.admission.capacity))

    async def gated(action: ActionRecord) -> tuple[ActionRecord, ToolBinding | None, Verdict]:
        async with gate:
            return await one(action)

    return list(await asyncio.gather(*(gated(a) for a in actions)))


def _settle(run: TaskRun, found: list[tuple[ActionRecord, ToolBinding | None, Verdict]],
            steps: list[Step], blobs: dict[str, str]) -> None:
    for action, binding, verdict in found:
        if isinstance(verdict, Unknown):
            run.stop_unknown[action.action_id] = verdict.reason
            continue
        spec = run.graph.specs[action.node_id]
        agent = spec.kind == "agent"
        if isinstance(verdict, Absent):
            outcome = not_dispatched_again(run, action, verdict)
        else:
            assert binding is not None
            # Checked against the tool that sent it: the effect node's own, or the agent's.
            outcome = receipt(run, replace(spec, binding=binding) if agent else spec, action,
                              verdict, source="reconcile")
            if outcome.state != "completed":
                # Surfaced with the unknown ones under this stop (_stops._surface), not as
                # a stop of its own that would leave them open.
                error = outcome.error
                run.stop_unknown[action.action_id] = "the outcome it found is invalid: " + (
                    error.message if error is not None else outcome.state)
                continue
        run.stop_settled.add(action.action_id)
        if agent:
            # A tool call of an agent that stops here: only the ledger records it (the stop
            # closes the agent node).
            assert outcome.action is not None
            steps.append(RecordAction(action=outcome.action))
            if outcome.action.outcome_digest and outcome.text is not None:
                blobs[outcome.action.outcome_digest] = outcome.text
        else:
            # The effect node's own action: the node completes with the receipt, or is
            # closed canceled now (even if another action is surfaced and the task ends
            # recovery_required, which leaves open nodes open).
            run.settle(action.node_id, outcome, steps, blobs)
