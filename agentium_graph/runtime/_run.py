"""One fenced run of one task: the scheduler loop, group commits, lease keeping.

A single loop owns every commit of the run. Each turn it settles the nodes that finished,
admits ready nodes (FIFO root permits, plan concurrency), and writes all of those
transitions in **one** commit, so "node k completed + node k+1 started" and a whole ready
wave cost one durable write. A node's callback starts only after the commit that records
its attempt (and its predecessors' completions) is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import admission_id, attempt_id, digest
from agentium_graph._otel import span, traced_attempt
from agentium_graph._program import ExecutionGraphProgram
from agentium_graph.catalog._bindings import ToolBinding
from agentium_graph.errors import (
    AgentiumGraphError,
    BudgetExhaustedError,
    ConfigurationError,
    ErrorInfo,
    InvalidTransitionError,
    LeaseHeldError,
    NodeInputError,
    StaleFenceError,
)
from agentium_graph.plan._validate import CompiledPlan
from agentium_graph.runtime import _containers as containers
from agentium_graph.runtime import _effects as effects
from agentium_graph.runtime import _stop_lookups as stop_lookups
from agentium_graph.runtime._admission import Ticket
from agentium_graph.runtime._agent import (
    MODEL_KIND,
    PLANNER_KIND,
    PROPOSAL_KIND,
    TOOL_KIND,
    AgentRecords,
    run_agent,
)
from agentium_graph.runtime._context import ToolContext, new_context
from agentium_graph.runtime._eager import NOT_DONE, start_eager
from agentium_graph.runtime._frontier import CONTAINERS as FRONTIER_CONTAINERS
from agentium_graph.runtime._frontier import Frontier, Turn
from agentium_graph.runtime._graph import FlatGraph, NodeSpec
from agentium_graph.runtime._lease import keep_lease
from agentium_graph.runtime._node_args import prepare_args
from agentium_graph.runtime._outcome import Outcome
from agentium_graph.runtime._planner import install_revisions, plan_task
from agentium_graph.runtime._states import RESTARTABLE
from agentium_graph.runtime._stops import (
    Stop,
    abandon_overdue,
    abandon_running,
    also_failed,
    begin_stop,
    check_recoverable,
    failure_stop,
    final_steps,
    observe_stop,
    recovery_stop,
    settle_planning,
)
from agentium_graph.runtime._submissions import Submission, drain_submissions, submitter
from agentium_graph.runtime._tool import escaped_cancel, invoke_tool
from agentium_graph.runtime._views import TaskResult
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import ActionRecord, NodeRecord, TaskHeader, TaskIdentity
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    AppendJournal,
    Charge,
    RecordAction,
    SettleNode,
    StartAttempt,
    Step,
    TimelineRequest,
    commit_request,
    node_completed,
    start_attempt,
)
from agentium_graph.store._transitions import TERMINAL_NODE

if TYPE_CHECKING:
    from agentium_graph.runtime._runtime import ExecutionGraphRuntime

log = logging.getLogger("agentium_graph.runtime")

@dataclass(slots=True)
class _Running:
    node_id: str
    ticket: Ticket
    ctx: ToolContext
    task: asyncio.Task[Outcome] | None = None
    effects: int = 0  # an agent's effect calls in flight (never abandoned: _unpreempted)


@dataclass(slots=True)
class _Ready:
    node_id: str
    args: dict[str, Any]
    input_digest: str
    ticket: Ticket
    free: bool = False  # an agent: holds no permit itself (each model/tool call takes one)


@dataclass
class RunState:
    """Loaded state a run starts from."""

    header: TaskHeader
    nodes: dict[str, NodeRecord]
    actions: dict[str, ActionRecord]
    identity: TaskIdentity
    outputs: dict[str, Any] = field(default_factory=dict)


class FastStartRefused(Exception):
    """The store refused a run's combined lease + first commit; nothing was written, so the
    caller starts the task the ordinary way (read, acquire, commit)."""


class TaskRun:
    def __init__(self, runtime: ExecutionGraphRuntime, key: str, worker_id: str, fence: int,
                 state: RunState, plan: CompiledPlan,
                 acquire: AcquireLeaseRequest | None = None,
                 program: ExecutionGraphProgram | None = None) -> None:
        self.rt = runtime
        self.identity = state.identity
        # A planner program whose task has no plan yet (or whose stream is not sealed): planning
        # runs first, as a job of the loop (its commits are the loop's group commits).
        self.program = program if program is not None and program.planner is not None and (
            state.header.revision == 0 or program.planner.mode == "stream") else None
        self.planning: asyncio.Task[None] | None = None
        # Lookups of effects a crash left dispatching, made as a terminal stop closes their
        # nodes (_stop_lookups): the task, whether they were made, the actions they settled
        # and what they said of the rest.
        self.stop_lookup: asyncio.Task[Any] | None = None
        self.stop_looked = False
        self.stop_settled: set[str] = set()
        self.stop_unknown: dict[str, str] = {}
        # Root plan revisions submitted by the planner, installed once committed:
        # (revision, compiled plan, nodes it tombstones, nodes it adds).
        self.proposed: list[tuple[int, CompiledPlan, tuple[str, ...], tuple[str, ...]]] = []
        # Nodes a drained (not yet installed) revision tombstones: never started meanwhile.
        self.revising: set[str] = set()
        # Set when ``state`` is what this runtime itself just created: the lease is then
        # taken by the first commit (one durable write instead of two), and ``fence`` is
        # only the expected one until that commit returns the real one.
        self.pending_acquire = acquire
        self.store: DurableTaskStore = runtime.store
        self.max_blob_bytes: int | None = getattr(runtime.store.capabilities, "max_blob_bytes",
                                                  None)
        self.clock: Callable[[], datetime] = runtime.clock
        self.key = key
        self.worker_id = worker_id
        self.fence = fence
        self.header = state.header
        self.nodes = state.nodes
        self.actions = state.actions
        self.outputs = state.outputs
        self.policy_revision = state.identity.policy_revision
        self.grants = state.identity.grants
        self.catalog_digest = state.identity.catalog_digest
        self.caller = {"task": key}
        self.submissions: list[Submission] = []
        self.graph = FlatGraph(plan)
        self.container_args: dict[str, dict[str, Any]] = {}
        self.task_input = state.identity.input
        capacity = runtime.limits_for(state.identity).max_concurrent_work
        self.admission = runtime.admission_for(key, capacity)
        if acquire is not None:
            # Until a fast start's first write is accepted, admission events are held back:
            # a refused start never ran anything, and the ordinary start reports its own.
            self.admission.hold_events()
        self.running: dict[str, _Running] = {}
        self.ready: dict[str, _Ready] = {}
        self.launching: list[_Ready] = []  # granted, launched once this turn's commit is in
        self.finished: list[tuple[str, Outcome]] = []
        self.done: set[str] = {n for n, r in self.nodes.items() if r.state == "completed"}
        # Nodes whose terminal state is decided (possibly not yet committed this turn).
        self.closed: set[str] = {n for n, r in self.nodes.items() if r.state in TERMINAL_NODE}
        self.wake = asyncio.Event()
        # An earlier run's abandoned leaf that ends frees its place in its plan: look again.
        self.admission.on_carried_end = self.wake.set
        self.stop: Stop | None = None
        # When a live stop abandons the node tasks it canceled that are still running
        # (loop time; _stops.abandon_overdue).
        self.overdue_at: float | None = None
        self.ended = False  # run() is over: nothing is submitted any more
        self.finishing = False  # this turn's commit holds the final steps
        self.lost: BaseException | None = None
        self.cancel_reason: str | None = None
        self.uncertain: list[str] = []
        self.again = False  # set when a turn materialized nodes that may be ready now
        self.agent_records = AgentRecords()
        self.frontier = Frontier(self.graph.pos.__getitem__, self._frontier_group)
        self.active_containers: set[str] = set()
        containers.restore(self)
        for cid in self.graph.order:
            spec = self.graph.specs[cid]
            rec = self.nodes.get(cid)  # None: damage, check_recoverable names it
            if containers.is_container(spec) and rec is not None and rec.state == "running":
                with contextlib.suppress(NodeInputError):
                    self.container_args[cid] = prepare_args(self, spec)

    # --- public entry ---------------------------------------------------------------
    async def execute(self) -> TaskResult:
        if any(s.kind == "agent" for s in self.graph.specs.values()) or \
                any(n.kind == "agent" for n in self.nodes.values()) or self.program is not None:
            await self._load_agent_records()
        keeper = asyncio.create_task(keep_lease(self), name=f"lease:{self.key}")
        if self.program is None and self.identity.plan is None and \
                self.header.revision == 0 and self.cancel_reason is None:
            raise ConfigurationError(
                f"task {self.key!r} has no plan yet and this runtime does not know its planner "
                "program: pass it with ExecutionGraphRuntime(programs=[...])")
        if self.program is not None and self.cancel_reason is None:
            self.planning = asyncio.create_task(plan_task(self, self.program),
                                                name=f"planner:{self.key}")
            self.planning.add_done_callback(lambda _t: self.wake.set())
        try:
            with span("agentium_graph.task.run", {"agentium.task.key": self.key,
                                                   "agentium.worker.id": self.worker_id,
                                                   "agentium.fence": self.fence}):
                return await self._loop()
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await abandon_running(self)

    async def _load_agent_records(self) -> None:
        after = 0
        while after < self.header.journal_seq:
            page = await self.store.read_timeline(TimelineRequest(key=self.key,
                                                                  after_seq=after, limit=1000))
            if not page:
                break
            for entry in page:
                if entry.kind in (MODEL_KIND, TOOL_KIND, PLANNER_KIND, PROPOSAL_KIND):
                    self.agent_records.add(entry.kind, entry.node_id, entry.data)
            after = page[-1].seq

    def request_cancel(self, reason: str) -> None:
        """In-process shortcut: the same cancel the lease keeper would observe."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.wake.set()

    # --- the loop -------------------------------------------------------------------
    async def _loop(self) -> TaskResult:
        check_recoverable(self)
        while True:
            # Cleared as the turn starts, never in _wait: a wake-up that arrives while this
            # turn runs or awaits its commit (a cancel request, planning that ended) must
            # make the next wait return at once, not be cleared unseen.
            self.wake.clear()
            if self.lost is not None:
                raise self.lost
            # (Each call below is skipped while it has nothing to do: a pure node's turn.)
            if self.stop is None:
                observe_stop(self)
            if self.overdue_at is not None:
                abandon_overdue(self)
            if self.planning is not None:
                settle_planning(self)
            steps: list[Step] = []
            blobs: dict[str, str] = {}
            if self.finished:
                self._settle_finished(steps, blobs)
            pending: dict[str, int] = {}
            accepted = drain_submissions(self, steps, blobs, pending) if self.submissions \
                else []
            if self.stop is None and self.active_containers:
                containers.advance(self, steps, blobs, pending)
            launch: list[_Ready] = []
            if self.stop is None:
                self._request_ready(steps, pending)
                launch = self._start_granted(steps, pending)
            # (A stop is never undone: without one there is nothing to look up.)
            looking = self.stop is not None and \
                stop_lookups.advance(self, steps, blobs, bool(launch))
            final = [] if looking else final_steps(self, bool(launch), steps)
            steps.extend(final)
            self.finishing = bool(final)  # a lease lost meanwhile no longer stops the run
            if steps or self.pending_acquire is not None:
                self.launching = launch  # their permits are released if the run ends here
                try:
                    await self._commit(steps, blobs)
                except BaseException as exc:
                    for sub in accepted:
                        if not sub.future.done():
                            sub.future.set_exception(exc)
                    raise
                self.launching = []
                if self.proposed:
                    install_revisions(self)  # before a planner sees its submission committed
                for sub in accepted:
                    if not sub.future.done():
                        sub.future.set_result(None)
            if final:
                return self._finish()
            for item in launch:
                self._launch(item)
            if self.graph.changed:
                self.graph.changed = False
                self.again = True
            await self._wait()

    async def submit(self, steps: list[Step], blobs: dict[str, str] | None = None, *,
                     tombstone: tuple[str, ...] = (), revision: bool = False,
                     clamp: bool = False) -> None:
        """Commit ``steps`` from inside a running node, in the loop's next group commit.

        ``tombstone``: pending nodes the steps remove (a plan revision). The submission is
        refused with :class:`~._submissions.RevisionConflict` if one of them was started meanwhile.
        ``clamp``: its charges are usage that already happened (a model's tokens beyond the
        reservation): charged up to what the limits leave in this commit, the rest added to
        the ``usage_over_limit`` of its journal entry, never refused.

        A node's steps are refused (``CancelledError``) once the node is no longer running
        in this run (a stop abandoned its task), and every submission once the run ended:
        work that was given up on never commits anything."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.ended:
            future.cancel()
        else:
            self.submissions.append(Submission(steps, blobs or {}, future, tombstone,
                                               revision, clamp, submitter(steps)))
            self.wake.set()
        await future

    # --- settle ---------------------------------------------------------------------
    def _settle_finished(self, steps: list[Step], blobs: dict[str, str]) -> None:
        finished, self.finished = self.finished, []
        for node_id, outcome in finished:
            running = self.running.pop(node_id)
            self.admission.release(running.ticket)
            self.settle(node_id, outcome, steps, blobs)

    def settle(self, node_id: str, outcome: Outcome, steps: list[Step],
               blobs: dict[str, str]) -> None:
        """The steps that record how a node's work ended (its task's, or a lookup's as the
        run stops: :mod:`_stop_lookups`), and the stop it causes."""
        if outcome.action is not None:
            steps.append(RecordAction(action=outcome.action))
            if outcome.action.outcome_digest and outcome.text is not None:
                blobs[outcome.action.outcome_digest] = outcome.text
        if outcome.state == "budget":
            # The node stays running (interrupted); a later run reconciles it again.
            if self.stop is None and isinstance(outcome.exception, AgentiumGraphError):
                begin_stop(self, Stop("budget", outcome.exception))
            return
        if outcome.state == "canceled" and outcome.action is None and \
                self.stop is not None:
            # Stopped where it was (canceled, its permit refused, an agent starting no
            # new call): left open for the stop's final commit, which closes it as it
            # closes every open node: canceled, uncertain with an effect an earlier run
            # dispatched that nobody reconciled yet, or left running after a budget or
            # recovery stop, so the next run resumes it.
            return
        self.closed.add(node_id)
        if outcome.state == "uncertain":
            steps.append(SettleNode(node_id=node_id, state="uncertain",
                                    error=outcome.error))
            self.uncertain.append(outcome.action.action_id if outcome.action else node_id)
            if self.stop is None or self.stop.reason != "recovery":
                begin_stop(self, recovery_stop(self))
            return
        if outcome.state == "completed":
            assert outcome.text is not None and outcome.digest is not None
            blobs[outcome.digest] = outcome.text
            self.outputs[node_id] = outcome.output
            self.mark_done(node_id)
            steps.append(node_completed(node_id, outcome.digest))
        elif outcome.state == "canceled":
            steps.append(SettleNode(node_id=node_id, state="canceled",
                                    error=self.stop.error.to_info() if self.stop else None))
        else:
            steps.append(SettleNode(node_id=node_id, state="failed", error=outcome.error))
            if self.stop is None or self.stop.reason == "budget":  # no longer resumable
                stop = failure_stop(self, node_id, outcome.error)
                if outcome.exception is not None:  # in this process: chain the original
                    stop.error.__cause__ = outcome.exception
                begin_stop(self, stop)
            else:
                also_failed(self, node_id, outcome.error)

    # --- admit ----------------------------------------------------------------------
    def _is_ready(self, node: NodeSpec) -> bool:
        rec = self.nodes.get(node.id)
        if rec is None:
            return False  # materialized this turn; ready once the commit recorded it
        return (rec.state in RESTARTABLE and node.id not in self.running and
                node.id not in self.ready and node.id not in self.done and
                self.done.issuperset(node.deps))

    def replaceable(self, node_id: str) -> bool:
        """Whether a plan revision may still replace or drop ``node_id``: it is pending,
        never ran (no attempt, not even one reopened after an absent effect), and nothing
        in this run started or settled it."""
        rec = self.nodes.get(node_id)
        return rec is not None and rec.state == "pending" and not rec.attempts and \
            node_id not in self.running and node_id not in self.closed

    def mark_done(self, node_id: str) -> None:
        """Record a completion (maybe not yet committed); its successors may be ready."""
        self.done.add(node_id)
        self.frontier.update(self.graph.succ.get(node_id, ()))

    def _frontier_group(self, node_id: str) -> str:
        spec = self.graph.specs[node_id]
        return FRONTIER_CONTAINERS if spec.kind == "container" else spec.scope

    def _request_ready(self, steps: list[Step], pending: dict[str, int]) -> None:
        # Only the frontier is examined (nodes whose dependencies just completed, or newly
        # materialized ones), in schedule order, and a scope's waiting leaves only until
        # it is full: a turn costs O(admitted), so a long chain or a wide fan-out stays
        # O(n log n) overall.
        if self.graph.fresh:
            self.frontier.update(self.graph.fresh)
            self.graph.fresh.clear()
        if not self.frontier:
            return
        in_scope: dict[str, int] = {}
        for active in (*self.running, *self.ready):
            prefix = self.graph.specs[active].scope
            in_scope[prefix] = in_scope.get(prefix, 0) + 1
        if self.admission.carried:
            self._count_carried(in_scope)
        turn = self.frontier.turn()
        try:
            self._admit_frontier(turn, in_scope, steps, pending)
        finally:
            turn.end()

    def _count_carried(self, in_scope: dict[str, int]) -> None:
        """Leaves an earlier run of this task in this runtime abandoned, still running (a
        sync tool's thread, a call that swallowed its cancel), count against their plan's
        concurrency until they end, as their permits count against the root's."""
        for node_id in {t.node_id for t in self.admission.carried}:  # once (an agent: many)
            spec = self.graph.specs.get(node_id or "")
            if spec is not None and node_id not in self.running and node_id not in self.ready:
                in_scope[spec.scope] = in_scope.get(spec.scope, 0) + 1

    def _admit_frontier(self, turn: Turn, in_scope: dict[str, int], steps: list[Step],
                        pending: dict[str, int]) -> None:
        for node_id in turn:
            node = self.graph.specs[node_id]
            if node_id not in self.nodes or node_id in self.revising:
                # Materialized this turn (considered once its commit recorded it), or about
                # to be replaced or dropped by a revision in this turn's commit.
                continue
            if node_id in self.done or not self._is_ready(node):
                self.frontier.discard(node_id)  # re-added when a dependency completes
                continue
            leaf = node.kind != "container"
            if leaf and in_scope.get(node.scope, 0) >= \
                    self.graph.scopes[node.scope].concurrency:
                # Its plan's concurrency is full for the rest of this turn: this node and
                # the scope's other waiting leaves ask for a permit in a later turn.
                turn.close(node.scope)
                continue
            self.frontier.discard(node_id)
            try:
                args = prepare_args(self, node)
            except NodeInputError as exc:
                steps.append(SettleNode(node_id=node_id, state="failed", error=exc.to_info()))
                self.closed.add(node_id)
                begin_stop(self, failure_stop(self, node_id, exc.to_info()))
                return
            if not leaf:
                # Containers hold no permit: entering one only materializes its children.
                if self.nodes[node_id].state == "running":
                    continue
                if not containers.enter(self, node, args, digest(args, trusted=True), steps,
                                        pending):
                    return
                continue
            in_scope[node.scope] = in_scope.get(node.scope, 0) + 1
            if node.kind == "agent":
                self.ready[node_id] = _Ready(node_id, args, digest(args, trusted=True),
                                             self.admission.free_ticket(node_id), free=True)
                continue
            adm = self._planned_admission(node, args) if self.admission.observed else None
            self.ready[node_id] = _Ready(node_id, args, digest(args, trusted=True),
                                         self.admission.request(node_id, adm))

    def _planned_admission(self, node: NodeSpec, args: dict[str, Any]) -> str | None:
        """The admission id :meth:`_start_granted` will charge the node's start under (for
        the events of its permit): its attempt's work, or its action's next dispatch."""
        rec = self.nodes[node.id]
        if node.kind == "effect":
            binding = node.binding
            assert isinstance(binding, ToolBinding)
            return effects.planned_admission(
                self, effects.action_id_for(self, rec, binding, args))
        return admission_id(attempt_id(rec.incarnation_id, len(rec.attempts) + 1), "work")

    def admit_charges(self, node_id: str, charges: dict[str, int], pending: dict[str, int],
                      adm: str | None) -> bool:
        """Reserve ``charges`` in this turn's commit, or begin a budget stop."""
        exhausted = self.exceeds(charges, pending)
        if exhausted is not None:
            counter, used, limit = exhausted
            self.admission.emit("exhausted", node_id, admission_id=adm, counter=counter)
            begin_stop(self, Stop("budget", BudgetExhaustedError(
                self.key, counter, used, charges[counter], limit, node_id=node_id)))
            return False
        for name, amount in charges.items():
            pending[name] = pending.get(name, 0) + amount
        return True

    def fail(self, node_id: str, info: ErrorInfo) -> None:
        also_failed(self, node_id, info)

    def _start_granted(self, steps: list[Step], pending: dict[str, int]) -> list[_Ready]:
        launch: list[_Ready] = []
        for node_id in list(self.ready):
            item = self.ready[node_id]
            if not (item.free or item.ticket.granted):
                continue  # still queued; the controller grants permits in FIFO order
            node = self.graph.specs[node_id]
            rec = self.nodes[node_id]
            att = attempt_id(rec.incarnation_id, len(rec.attempts) + 1)
            if item.free:
                start: list[Step] = [StartAttempt(node_id=node_id, attempt_id=att,
                                                  input_digest=item.input_digest,
                                                  requires_completed=node.deps)]
                charges: dict[str, int] = {}
                adm: str | None = None
                intent = None
            elif node.kind == "effect":
                start, charges, intent = effects.start_steps(
                    self, node, rec, att, item.args, item.input_digest)
                # The dispatch it charges (an existing intent still names an earlier one).
                adm = next((s.admission_id for s in start if isinstance(s, Charge)), None)
            else:
                adm = admission_id(att, "work")
                charges = {"work_attempts": 1, "tool_calls": 1}
                start = [start_attempt(node_id, att, item.input_digest, adm, charges,
                                       node.deps)]
                intent = None
            exhausted = self.exceeds(charges, pending)
            if exhausted is not None:
                counter, used, limit = exhausted
                self.admission.emit("exhausted", node_id, admission_id=adm, counter=counter)
                del self.ready[node_id]
                if intent is not None and intent.action_id not in self.actions:
                    # Local admission rejection: journaled as known not dispatched.
                    steps.append(RecordAction(action=intent))
                    steps.append(RecordAction(action=intent.model_copy(update={
                        "state": "rejected", "reason": f"{counter} budget exhausted"})))
                begin_stop(self, Stop("budget", BudgetExhaustedError(
                    self.key, counter, used, charges[counter], limit, node_id=node_id)))
                # Released after the stop rejected the queue: the permit goes to no waiter.
                self.admission.release(item.ticket)
                break
            for name, amount in charges.items():
                pending[name] = pending.get(name, 0) + amount
            steps.extend(start)
            del self.ready[node_id]
            launch.append(item)
        return launch

    def exceeds(self, charges: dict[str, int],
                 pending: dict[str, int]) -> tuple[str, int, int] | None:
        header = self.header
        limits, counters = header.limits, header.counters
        for name, amount in charges.items():
            limit = limits.get(name)
            used = counters.get(name, 0) + pending.get(name, 0)
            if limit is not None and used + amount > limit:
                return name, used, limit
        return None

    # --- run a leaf -----------------------------------------------------------------
    def _launch(self, item: _Ready) -> None:
        node = self.graph.specs[item.node_id]
        rec = self.nodes[item.node_id]
        attempt = rec.attempts[-1]
        ctx = new_context(self.key, node.id, attempt.number, attempt.attempt_id, self.fence,
                          self.worker_id, node.binding.id, node.binding.version)
        running = _Running(node.id, item.ticket, ctx)
        self.running[node.id] = running
        body: Coroutine[Any, Any, Outcome]
        if node.kind == "agent":
            body = traced_attempt(ctx, run_agent(self, node, item.args))
        elif node.kind == "effect":
            body = traced_attempt(ctx, effects.execute_effect(self, node, item.args))
        else:
            body = invoke_tool(self, node, item.args, ctx)
        name = f"node:{self.key}:{node.id}"
        value: Any
        if self.lost is not None or self.cancel_reason is not None:
            # The lease was lost or a cancel arrived while this turn's commit was in flight:
            # the next turn stops the run, and cancels this task before its code runs.
            running.task = asyncio.create_task(body, name=name)
            value = NOT_DONE
        else:
            # Started eagerly: a tool that returns without suspending has its outcome taken
            # in this very turn (``_wait`` then returns at once), with no event-loop pass.
            running.task, value = start_eager(asyncio.get_running_loop(), body, name)
        if value is NOT_DONE:
            running.task.add_done_callback(functools.partial(self._on_done, node.id))
        else:
            self.finished.append((node.id, value))

    def _on_done(self, node_id: str, task: asyncio.Task[Outcome]) -> None:
        if task.cancelled() and self.stop is None:
            # The runtime cancels a node's task only while stopping: this cancellation came
            # from the node's own code (a provider or connector letting one escape).
            outcome = Outcome("failed", error=escaped_cancel(node_id).to_info())
        elif task.cancelled():
            outcome = Outcome("canceled")
        else:
            exc = task.exception()
            if isinstance(exc, BudgetExhaustedError):
                outcome = Outcome("budget", exception=exc)
            elif exc is not None:
                outcome = Outcome("failed", error=ErrorInfo.from_exception(exc, node_id=node_id),
                                  exception=exc)
            else:
                outcome = task.result()
        if node_id in self.running:
            self.finished.append((node_id, outcome))
        self.wake.set()

    # --- commit, finish, wait -------------------------------------------------------
    async def _commit(self, steps: list[Step], blobs: dict[str, str]) -> None:
        if self.pending_acquire is not None:
            await self._acquire_with(steps, blobs)
            return
        request = commit_request(self.key, self.worker_id, self.fence, self.clock(), steps,
                                 blobs)
        try:
            result = await self.store.commit(request)
        except StaleFenceError as exc:
            self.lost = exc
            raise
        self.header = result.header
        self.nodes.update(result.nodes)
        self.actions.update(result.actions)

    async def _acquire_with(self, steps: list[Step], blobs: dict[str, str]) -> None:
        """Take the lease with this first turn's steps in one atomic write."""
        pending = self.pending_acquire
        assert pending is not None
        # Ledger entries carry the fence they were written under, which is only known once
        # the lease is granted: such a first turn takes the lease on its own first.
        carries_fence = any(isinstance(s, RecordAction | AppendJournal) for s in steps)
        request = AcquireLeaseRequest(
            key=pending.key, worker_id=pending.worker_id, ttl_seconds=pending.ttl_seconds,
            now=self.clock(), steps=() if carries_fence else tuple(steps),
            blobs={} if carries_fence else blobs)
        try:
            grant = await self.store.acquire_lease(request)
        except (InvalidTransitionError, BudgetExhaustedError, LeaseHeldError) as exc:
            raise FastStartRefused(str(exc)) from exc
        self.pending_acquire = None
        expected, self.fence = self.fence, grant.fence
        self.header = grant.header
        if grant.commit is not None:
            self.nodes.update(grant.commit.nodes)
            self.actions.update(grant.commit.actions)
        elif request.steps:
            carries_fence = True  # a store that ignores steps: commit them on their own
        if carries_fence:
            # The lease alone was taken: the steps go in an ordinary commit, but only if
            # nothing happened since create (no other lease, no cancel request).
            if grant.fence != expected or grant.header.cancel is not None:
                raise FastStartRefused(f"fence {grant.fence} (expected {expected}), cancel "
                                       f"{grant.header.cancel is not None}")
            self.admission.release_events()
            await self._commit(steps, blobs)
            return
        self.admission.release_events()
        if grant.header.cancel is not None:
            self.request_cancel(grant.header.cancel.reason)

    def _finish(self) -> TaskResult:
        if self.stop is not None:
            raise self.stop.error
        return TaskResult(key=self.key, status="completed", output=self.top_outputs(),
                          revision=self.header.revision, counters=dict(self.header.counters))

    def top_outputs(self) -> dict[str, Any]:
        # In node-id order, as a completed task's retained output: the same on every run.
        return {n: self.outputs[n] for n in sorted(self.graph.root.members)
                if n in self.outputs}

    async def _wait(self) -> None:
        if self.finished or self.submissions or self.lost is not None or self.again:
            self.again = False
            return
        if any(item.free or item.ticket.granted for item in self.ready.values()):
            return
        if not self.running and not self.ready and self.stop is None and \
                self.planning is None and not self.admission.carried:
            # Nothing runs, nothing waits for a permit, yet work remains: a bug, not a wait.
            stuck = [n for n in self.graph.order if n not in self.done][:10]
            raise AgentiumGraphError(
                f"task {self.key!r}: the scheduler stalled with nodes {stuck} unfinished; "
                "this is a bug in agentium-graph, please report it with the task's timeline")
        timeout: float | None = None
        deadline = self.header.deadline
        if deadline is not None and self.stop is None:
            timeout = max(0.0, (deadline - self.clock()).total_seconds())
        if self.overdue_at is not None:
            left = max(0.0, self.overdue_at - asyncio.get_running_loop().time())
            timeout = left if timeout is None else min(timeout, left)
        for item in self.ready.values():
            if not item.ticket.future.done():
                item.ticket.future.add_done_callback(lambda _f: self.wake.set())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
