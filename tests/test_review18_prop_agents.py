"""Property-based tests of nested graphs, bounded repeats and agents, interrupted at random.

Hypothesis draws programs that nest graph and repeat bindings several levels deep (each
container's program may use the containers drawn before it), with random ``max_iterations``,
conditions that stop at random iterations, ``$input`` and ``$previous`` refs, pure tools, a
connector tool whose fake destination records every action it applied, and agent nodes
driven by the shipped :class:`ScriptedProvider` (several tool calls per response, call ids
reused across turns, usage beyond the reservation, providers that fail). A reference
evaluator computes every node incarnation's output. Runs are interrupted at random store
writes (the worker dies, the store fails, ``run()`` is canceled, an operator cancels), inside
tools, by budgets, with fresh runtimes taking over on SQLite. Checked throughout:

* outputs, node states and counters agree with the reference; counters never go down and
  stay within their limits; completed work is never run again;
* with ``max_concurrent_work=1`` any nesting completes (containers and agents hold no permit),
  and no more leaf calls (tools, model calls, dispatches) ever run at once than the capacity;
* a model response whose journal entry landed is never asked of the provider again;
* the destination never applies one action twice (receipts are reused, dispatches reconciled);
* a repeat's guard decision is journaled once per iteration, and the condition is never
  evaluated again for an iteration whose decision landed; iterations are materialized once.

Deterministic in CI (``derandomize=True``); ``HYPOTHESIS_PROFILE=deep`` runs many more.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    BudgetExhaustedError,
    Budgets,
    DurableRecoveryRequiredError,
    DurableTaskStore,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    NodeFailedError,
    RepeatBinding,
    RootLimits,
    StoreUnavailableError,
    TaskCanceledError,
    TaskResult,
    TaskView,
    ToolBinding,
    tool_context,
)
from agentium_graph.providers import (
    ModelRequest,
    ModelResponse,
    ProviderError,
    ScriptedProvider,
    ScriptedTurn,
    ToolCall,
    Usage,
)
from agentium_graph.store import AppendJournal, CommitRequest, CommitResult
from agentium_graph.testing import ForwardingStore
from tests._review18_prop_model import Executions, canonical, repeat_condition, small_hash
from tests.test_review18_prop_runtime import (
    DEEP,
    FAULT_MODES,
    IN_TOOL,
    KEY,
    LEASE_TTL,
    POLL,
    Crash,
    Fault,
    Faulty,
    Stores,
    _clock,
    check_nodes_sane,
    check_progress,
    observe,
    prop_settings,
)

pytestmark = pytest.mark.timeout(7200 if DEEP else 120)

MAX_OUT = 8  # every agent's max_output_tokens (the reservation of each model call)
Value = Any  # a template: an int, or {"$ref": {"node": ...}} (whole outputs only)


# --- the case --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    calls: tuple[tuple[str, str, int], ...]  # (call id, tool "t" | "fx", arg)
    usage: tuple[int, int]
    fail: bool = False  # the provider raises instead of answering


@dataclass(frozen=True)
class AgentDef:
    id: str
    turns: tuple[Turn, ...]  # the last one answers (no calls) unless it fails

    @property
    def instructions(self) -> str:
        return f"agent {self.id}"


@dataclass(frozen=True)
class Node:
    id: str
    binding: str
    arg: Value
    deps: tuple[str, ...]  # producers its arg refers to


@dataclass(frozen=True)
class Box:
    id: str
    kind: Literal["graph", "repeat"]
    nodes: tuple[Node, ...]
    max_iterations: int = 1
    rounds: int = 1


@dataclass(frozen=True)
class Case:
    agents: tuple[AgentDef, ...]
    boxes: tuple[Box, ...]
    root: tuple[Node, ...]
    capacity: int

    def plan(self, nodes: tuple[Node, ...]) -> dict[str, Any]:
        return {"schemaVersion": 1, "revision": 1, "nodes": [
            {"id": n.id, "binding": n.binding, "version": "1",
             "args": {"x" if n.binding in self.box_map else "a": n.arg}} for n in nodes]}

    @property
    def box_map(self) -> dict[str, Box]:
        return {b.id: b for b in self.boxes}

    @property
    def agent_map(self) -> dict[str, AgentDef]:
        return {a.id: a for a in self.agents}


@st.composite
def turns(draw: st.DrawFn) -> tuple[Turn, ...]:
    out: list[Turn] = []
    for t in range(draw(st.integers(0, 2))):
        n = draw(st.integers(1, 3))
        numbered = draw(st.booleans())  # ids like an adapter numbering calls per response
        calls = tuple((f"call_{i}" if numbered else f"c{t}_{i}", draw(st.sampled_from("tf")),
                       draw(st.integers(0, 3))) for i in range(n))
        calls = tuple((i, "t" if k == "t" else "fx", a) for i, k, a in calls)
        out.append(Turn(calls, (draw(st.integers(0, 30)), draw(st.integers(0, 12)))))
    last_fails = draw(st.integers(0, 4)) == 0
    out.append(Turn((), (draw(st.integers(0, 30)), draw(st.integers(0, 12))), last_fails))
    return tuple(out)


def _value(draw: st.DrawFn, earlier: list[str], repeat: bool) -> tuple[Value, tuple[str, ...]]:
    options = ["int", "$input"] + (["ref"] if earlier else []) + (["$previous"] if repeat else [])
    kind = draw(st.sampled_from(options))
    if kind == "int":
        return draw(st.integers(0, 9)), ()
    if kind == "ref":
        node = draw(st.sampled_from(earlier))
        return {"$ref": {"node": node}}, (node,)
    return {"$ref": {"node": kind}}, ()


def _nodes(draw: st.DrawFn, bindings: list[str], repeat: bool, most: int,
           prefer: str | None) -> tuple[Node, ...]:
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, most))):
        binding = prefer if prefer is not None and i == 0 else draw(st.sampled_from(bindings))
        arg, deps = _value(draw, [n.id for n in nodes], repeat)
        nodes.append(Node(f"n{i}", binding, arg, deps))
    return tuple(nodes)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    agents = tuple(AgentDef(f"ag{i}", draw(turns())) for i in range(draw(st.integers(1, 2))))
    leaves = ["t", "fx", *(a.id for a in agents)]
    boxes: list[Box] = []
    for i in range(draw(st.integers(0, 4 if DEEP else 3))):
        kind: Literal["graph", "repeat"] = draw(st.sampled_from(("graph", "repeat")))
        # Mostly nest the container drawn just before: chains of several levels.
        prefer = boxes[-1].id if boxes and draw(st.integers(0, 2)) else None
        nodes = _nodes(draw, [*leaves, *(b.id for b in boxes)], kind == "repeat", 3, prefer)
        if kind == "graph":
            boxes.append(Box(f"g{i}", kind, nodes))
        else:
            boxes.append(Box(f"r{i}", kind, nodes, draw(st.integers(1, 3)),
                             draw(st.integers(1, 3))))
    prefer = boxes[-1].id if boxes else None
    root = _nodes(draw, [*leaves, *(b.id for b in boxes)], False, 4, prefer)
    return Case(agents, tuple(boxes), root, draw(st.sampled_from((1, 1, 2, 3))))


# --- the host: tools, destination, provider, catalog -----------------------------------------
def tool_output(args: Any) -> dict[str, Any]:
    return {"h": small_hash("t", args) % 1000}


def effect_output(args: Any) -> dict[str, Any]:
    return {"ok": small_hash("fx", args) % 1000}


@dataclass
class Seq:
    """One clock for everything observed, to order provider calls, condition calls and the
    commits that landed."""

    n: int = 0

    def tick(self) -> int:
        self.n += 1
        return self.n


@dataclass
class Host:
    case: Case
    seq: Seq = field(default_factory=Seq)
    executions: Executions = field(default_factory=Executions)
    applied: list[str] = field(default_factory=list)       # action ids, as applied
    provider_calls: list[tuple[int, str]] = field(default_factory=list)  # (seq, digest)
    conditions: list[tuple[int, str]] = field(default_factory=list)      # (seq, state)
    journaled: dict[str, int] = field(default_factory=dict)  # request digest -> seq landed
    guards: list[tuple[int, str, int]] = field(default_factory=list)     # (seq, node, it)
    provider: ScriptedProvider | None = None

    def landed(self, request: CommitRequest) -> None:
        at = self.seq.tick()
        for step in request.steps:
            if not isinstance(step, AppendJournal):
                continue
            if step.kind == "model_response":
                self.journaled.setdefault(str(step.data["request_digest"]), at)
            elif step.kind == "repeat_guard":
                assert step.node_id is not None
                self.guards.append((at, step.node_id, int(step.data["iteration"])))


class Destination:
    """The connector: its destination applies each action it is sent and remembers it."""

    id, version, idempotent_destination = "fake-dest", "1", False

    def __init__(self, host: Host) -> None:
        self.host = host
        self.outcomes: dict[str, dict[str, Any]] = {}

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        with self.host.executions.running(str(request.caller.get("node"))):
            await asyncio.sleep(0)
            self.host.applied.append(request.action_id)
            self.outcomes[request.action_id] = effect_output(request.args)
            return ActionOutcome(output=effect_output(request.args),
                                 result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent:
        if result_ref in self.outcomes:
            return ActionOutcome(output=self.outcomes[result_ref], result_ref=result_ref)
        return Absent()


class Provider(ScriptedProvider):
    """The shipped scripted provider, logging each call on the host's clock."""

    def __init__(self, host: Host, script: list[ScriptedTurn]) -> None:
        super().__init__(script)
        self.host = host

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.host.provider_calls.append((self.host.seq.tick(), request.digest()))
        with self.host.executions.running(str(request.metadata.get("node"))):
            await asyncio.sleep(0)
            return await super().complete(request)


def script(case: Case, copies: int) -> list[ScriptedTurn]:
    """Each agent's turns, answered by instructions and position; ``copies`` of each, as
    every incarnation (and every retried call) consumes one."""
    out: list[ScriptedTurn] = []
    for agent in case.agents:
        for t, turn in enumerate(agent.turns):
            def when(request: ModelRequest, instructions: str = agent.instructions,
                     t: int = t) -> bool:
                return request.model_messages[0].content == instructions and \
                    request.metadata.get("turn") == t
            calls = tuple(ToolCall(id=i, name=k, arguments={"k": a}) for i, k, a in turn.calls)
            usage = Usage(input_tokens=turn.usage[0], output_tokens=turn.usage[1])
            out.extend(ScriptedTurn(
                text="" if calls else f"{agent.id} answers", tool_calls=calls, usage=usage,
                fail=ProviderError(f"{agent.id} fails") if turn.fail else None, when=when)
                for _ in range(copies))
    return out


def catalog(host: Host, copies: int) -> HostCatalog:
    case = host.case

    async def t(args: dict[str, Any]) -> dict[str, Any]:
        with host.executions.running(tool_context().node_id):
            await asyncio.sleep(0)
            return tool_output(args)

    provider = host.provider = Provider(host, script(case, copies))
    bindings: list[Any] = [
        ToolBinding(id="t", version="1", execute=t, recovery="pure"),
        ToolBinding(id="fx", version="1", connector=Destination(host), destination="dest")]
    bindings.extend(AgentBinding(id=a.id, version="1", agent=Agent(
        provider, a.instructions, tools=("t", "fx"), max_output_tokens=MAX_OUT,
        max_turns=len(a.turns))) for a in case.agents)
    for box in case.boxes:
        program = ExecutionGraphProgram(id=f"prog-{box.id}", version="1",
                                        plan=case.plan(box.nodes))
        if box.kind == "graph":
            bindings.append(GraphBinding(id=box.id, version="1", program=program))
        else:
            decide = repeat_condition(box.rounds)

            def condition(state: dict[str, Any], decide: Callable[[Any], bool] = decide
                          ) -> bool:
                host.conditions.append((host.seq.tick(), canonical(state)))
                return decide(state)
            bindings.append(RepeatBinding(id=box.id, version="1", program=program,
                                          max_iterations=box.max_iterations,
                                          condition=condition))
    return HostCatalog(bindings)


# --- the reference ---------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: Literal["ok", "fail", "blocked"]
    output: Any = None


@dataclass
class Reference:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)         # node -> tool/effect/agent/box
    states: dict[tuple[str, int], str] = field(default_factory=dict)  # repeat guard inputs
    scopes: int = 0
    model_calls: int = 0
    tool_calls: int = 0      # tool and effect nodes, and agents' tool calls
    effects: int = 0         # actions applied
    root: dict[str, Outcome] = field(default_factory=dict)

    @property
    def completes(self) -> bool:
        return all(o.kind == "ok" for o in self.root.values())

    @property
    def failing(self) -> set[str]:
        return {n for n, o in self.outcomes.items()
                if o.kind == "fail" and self.kinds[n] != "box"}


def evaluate(case: Case) -> Reference:
    ref = Reference()
    boxes, agents = case.box_map, case.agent_map

    def resolve(value: Value, values: dict[str, Any]) -> Any:
        if isinstance(value, dict):
            return json.loads(canonical(values[value["$ref"]["node"]]))
        return value

    def run_plan(nodes: tuple[Node, ...], scope_input: Any, previous: Any,
                 prefix: str) -> dict[str, Outcome]:
        local: dict[str, Outcome] = {}
        for node in nodes:
            full = prefix + node.id
            if any(local[d].kind != "ok" for d in node.deps):
                outcome = Outcome("blocked")
                ref.kinds[full] = "box" if node.binding in boxes else "leaf"
            else:
                values = {d: local[d].output for d in node.deps}
                values["$input"], values["$previous"] = scope_input, previous
                outcome = run_node(node.binding, resolve(node.arg, values), full)
            local[node.id] = outcome
            ref.outcomes[full] = outcome
        return local

    def run_node(binding: str, arg: Any, full: str) -> Outcome:
        if binding == "t":
            ref.kinds[full] = "tool"
            ref.tool_calls += 1
            return Outcome("ok", tool_output({"a": arg}))
        if binding == "fx":
            ref.kinds[full] = "effect"
            ref.tool_calls += 1
            ref.effects += 1
            return Outcome("ok", effect_output({"a": arg}))
        if binding in agents:
            ref.kinds[full] = "agent"
            agent = agents[binding]
            usage = {"input_tokens": 0, "output_tokens": 0, "model_calls": 0}
            for turn in agent.turns:
                ref.model_calls += 1
                if turn.fail:
                    return Outcome("fail")
                usage["input_tokens"] += turn.usage[0]
                usage["output_tokens"] += turn.usage[1]
                usage["model_calls"] += 1
                ref.tool_calls += len(turn.calls)
                ref.effects += sum(k == "fx" for _, k, _ in turn.calls)
            return Outcome("ok", {"text": f"{agent.id} answers", "usage": usage})
        ref.kinds[full] = "box"
        box = boxes[binding]
        args = {"x": arg}
        if box.kind == "graph":
            ref.scopes += 1
            children = run_plan(box.nodes, args, None, f"{full}/")
            if any(o.kind != "ok" for o in children.values()):
                return Outcome("fail")
            return Outcome("ok", {k: o.output for k, o in children.items()})
        previous, decide = None, repeat_condition(box.rounds)
        for i in range(box.max_iterations):
            ref.scopes += 1
            children = run_plan(box.nodes, args, previous, f"{full}/{i}/")
            if any(o.kind != "ok" for o in children.values()):
                return Outcome("fail")
            outputs = {k: o.output for k, o in children.items()}
            state = json.loads(canonical({"iteration": i, "outputs": outputs, "input": args}))
            ref.states[(full, i)] = canonical(state)
            again = decide(state)
            if not again or i + 1 >= box.max_iterations:
                return Outcome("ok", {"iterations": i + 1, "stopped": "max_iterations"
                                      if again else "condition", "last": outputs})
            previous = outputs
        raise AssertionError("unreachable")

    ref.root = run_plan(case.root, {"seed": 1}, None, "")
    return ref


# --- running ---------------------------------------------------------------------------------
class Landing(ForwardingStore):
    """Wraps a store; tells the host about every commit that landed (before its answer)."""

    def __init__(self, inner: DurableTaskStore, host: Host) -> None:
        super().__init__(inner)
        self.host = host

    async def commit(self, request: CommitRequest) -> CommitResult:
        result: CommitResult = await self.inner.commit(request)
        self.host.landed(request)
        return result


@dataclass
class Driver:
    """Runs one task until it settles, one fault per run, each run checked against the last
    (as ``test_review18_prop_runtime.Driver``, for these catalogs)."""

    host: Host
    stores: Stores
    faults: list[Fault]
    budgets: Budgets | None
    limits: RootLimits
    copies: int
    outcomes: list[str] = field(default_factory=list)
    views: list[TaskView] = field(default_factory=list)
    fired: bool = False
    canceled: bool = False
    offset: timedelta = timedelta(0)
    worker: int = 0

    def runtime(self, fault: Fault | None) -> tuple[ExecutionGraphRuntime, Faulty]:
        store = Faulty(Landing(self.stores.open(), self.host), fault)
        store.canceler = self.cancel
        return ExecutionGraphRuntime(catalog=self.cat, store=store, clock=_clock(self.offset),
                                     lease_ttl=LEASE_TTL, poll_interval=POLL), store

    async def cancel(self) -> None:
        await self.observer.cancel(KEY, "an operator stopped it")
        self.canceled = True

    def arm(self, fault: Fault | None, store: Faulty, task: list[asyncio.Task[Any]]) -> None:
        executions = self.host.executions
        executions.hook = None
        if fault is None or fault.mode not in IN_TOOL:
            return
        entered = [0]

        def hook(_node: str) -> None:
            entered[0] += 1
            if entered[0] != (fault.at - 1) % 3 + 1:
                return
            store.fired = True
            if fault.mode == "crash_in_tool":
                store.dead = True
            else:
                task[0].cancel()
        executions.hook = hook

    async def drive(self) -> tuple[TaskResult | None, BaseException | None]:
        self.cat = catalog(self.host, self.copies)
        self.observer = ExecutionGraphRuntime(catalog=self.cat, store=self.stores.open())
        queue = list(self.faults)
        fault = queue.pop(0) if queue else None
        rt, store = self.runtime(fault)
        await rt.create(KEY, ExecutionGraphProgram(id="root", version="1",
                                                   plan=self.host.case.plan(
                                                       self.host.case.root)),
                        input={"seed": 1}, budgets=self.budgets, limits=self.limits)
        self.views.append(await self.observer.inspect(KEY))
        stalled = 0
        for run in range(len(self.faults) + 6):
            self.host.executions.run = run
            holder: list[asyncio.Task[Any]] = []
            self.arm(fault, store, holder)
            holder.append(asyncio.create_task(rt.run(KEY, f"w{self.worker}")))
            await asyncio.wait(holder, timeout=60)
            task = holder[0]
            assert task.done(), f"run {run} did not end: {self.outcomes}"
            self.host.executions.hook = None
            if store.fired and fault is not None:
                event(f"fired: {fault.mode}")
                self.fired = self.fired or fault.mode != "renew_error"
            result: TaskResult | None = None
            error: BaseException | None = None
            if task.cancelled():
                outcome = "cancelled"
            elif task.exception() is None:
                result, outcome = task.result(), "result"
            else:
                error = task.exception()
                outcome = type(error).__name__
            self.outcomes.append(outcome)
            view = await self.observer.inspect(KEY)
            assert view.verified, view.problems
            previous = self.views[-1]
            check_progress(previous, view, self.host.executions, run)
            self.views.append(view)
            if result is not None or isinstance(error, NodeFailedError | TaskCanceledError):
                return result, error
            if isinstance(error, DurableRecoveryRequiredError):
                # The destination answers every lookup, and a stop looks up a dispatch a
                # crash interrupted before it closes the node (stop 23): nothing is ever
                # uncertain here.
                raise AssertionError(f"run {run}: {error!r} although every lookup answers")
            if isinstance(error, BudgetExhaustedError):
                assert view.status == "pending" or (self.canceled and
                                                     view.status == "canceled"), view.status
                same = view.counters == previous.counters and \
                    {n: v.state for n, v in view.nodes.items()} == \
                    {n: v.state for n, v in previous.nodes.items()}
                stalled = stalled + 1 if same else 0
                if stalled and not queue:
                    return result, error
            elif not (isinstance(error, Crash | StoreUnavailableError) or
                      outcome == "cancelled"):
                raise AssertionError(f"run {run} ended with {outcome}: {error!r}") from error
            restart = isinstance(error, Crash) or (fault is not None and fault.fresh)
            fault = queue.pop(0) if queue else None
            if restart:
                # Another worker (process) takes over once the last one's lease expired.
                self.offset += timedelta(seconds=LEASE_TTL * 2 + 1)
                self.worker += 1
                rt, store = self.runtime(fault)
            else:
                store.fault = fault
                store.writes, store.renewals, store.fired = 0, 0, False
        raise AssertionError(f"the task never settled: {self.outcomes}")


# --- checks ----------------------------------------------------------------------------------
def check_counters(view: TaskView, ref: Reference) -> None:
    assert view.counters["expanded_nodes"] == len(view.nodes)
    scopes = {n.node_id.rsplit("/", 1)[0] for n in view.nodes.values() if n.parent is not None}
    assert view.counters["plan_revisions"] == 1 + len(scopes)
    leaf = sum(len(n.attempts) for n in view.nodes.values() if n.binding == "t")
    assert view.counters["tool_calls"] >= leaf
    c = view.counters
    assert c["work_attempts"] == c["tool_calls"] + c.get("model_calls", 0), c
    assert c.get("output_tokens", 0) >= MAX_OUT * c.get("model_calls", 0) or \
        view.limits.get("output_tokens") is not None
    for name, value in c.items():
        limit = view.limits.get(name)
        assert limit is None or value <= limit, (name, value, limit)


def check_journal(host: Host, ref: Reference, view: TaskView, journal: list[Any]) -> None:
    # A landed response is never asked for again.
    for at, request_digest in host.provider_calls:
        landed = host.journaled.get(request_digest)
        assert landed is None or at < landed, \
            f"the provider was asked again for {request_digest}, journaled at {landed}"
    # The destination applies an action at most once, and only actions of the ledger.
    assert len(host.applied) == len(set(host.applied)), "an action was applied twice"
    ledger = {a.action_id: a for a in view.actions}
    assert set(host.applied) <= set(ledger)
    for action in view.actions:
        if action.state == "confirmed":
            assert action.action_id in host.applied
    responses = [e for e in journal if e.kind == "model_response"]
    digests = [(e.node_id, e.data["request_digest"]) for e in responses]
    assert len(digests) == len(set(digests)), "a response was journaled twice"
    assert view.counters.get("model_calls", 0) >= len(responses)
    assert len(host.provider_calls) <= view.counters.get("model_calls", 0)
    # One guard decision per iteration; never re-decided once it landed.
    guards = [(e.node_id, e.data["iteration"]) for e in journal if e.kind == "repeat_guard"]
    assert len(guards) == len(set(guards)), f"a guard was journaled twice: {guards}"
    iterations = [(e.node_id, e.data["iteration"]) for e in journal
                  if e.kind == "repeat_iteration"]
    assert len(iterations) == len(set(iterations)), "an iteration was materialized twice"
    for node_id, iteration in guards:
        assert (node_id, iteration) in ref.states, (node_id, iteration)
    by_state: dict[str, list[tuple[str, int]]] = {}
    for where, state in ref.states.items():
        by_state.setdefault(state, []).append(where)
    decided = {(node, it): at for at, node, it in host.guards}
    for at, state in host.conditions:
        owners = by_state.get(state, [])
        assert owners, "the condition was given a state the reference never reaches"
        assert any(decided.get(w, at + 1) > at for w in owners), \
            f"the condition of {owners} was evaluated again after its decision landed"


def check_outputs(view: TaskView, ref: Reference) -> None:
    for node_id, node in view.nodes.items():
        assert node_id in ref.outcomes, f"{node_id} materialized; the reference has no such node"
        outcome = ref.outcomes[node_id]
        if node.state == "completed":
            assert outcome.kind == "ok", (node_id, outcome)
            assert node.output == outcome.output, node_id
        if outcome.kind == "blocked":
            assert not node.attempts, f"{node_id} started although a dependency failed"
        if node.parent is not None and view.nodes[node.parent].state == "completed":
            assert node.state == "completed", (node_id, node.state)


def check_containers(view: TaskView) -> None:
    """A container ends consistently with its children."""
    for node_id, node in view.nodes.items():
        if node.kind not in ("graph", "repeat"):
            continue
        children = [v for v in view.nodes.values() if v.parent == node_id]
        states = {c.state for c in children}
        if node.state == "completed":
            assert states == {"completed"}, (node_id, states)
        elif node.state in ("pending",):
            assert not children, node_id
        elif node.state in ("failed", "canceled"):
            assert states <= {"completed", "failed", "canceled"}, (node_id, states)
        if "failed" in states and view.status == "failed":
            assert node.state == "failed", (node_id, node.state, states)


def check_final(case: Case, ref: Reference, host: Host, view: TaskView, journal: list[Any],
                result: TaskResult | None, error: BaseException | None,
                interrupted: bool) -> None:
    if view.status != "recovery_required":  # (its uncertain nodes end an attempt so)
        check_nodes_sane(view, journal)
    check_counters(view, ref)
    check_journal(host, ref, view, journal)
    check_outputs(view, ref)
    check_containers(view)
    assert host.executions.peak.get("*", 0) <= case.capacity, \
        (host.executions.peak, case.capacity)
    if isinstance(error, BudgetExhaustedError):
        assert view.status == "pending" and view.error is not None
        assert all(n.state != "canceled" for n in view.nodes.values()), \
            "a budget stop canceled a node"
        return
    if isinstance(error, TaskCanceledError | DurableRecoveryRequiredError):
        assert view.status in ("canceled", "recovery_required")
        for node in view.nodes.values():
            assert node.state in ("completed", "failed", "canceled", "uncertain") or \
                view.status == "recovery_required", (node.node_id, node.state)
        return
    if ref.completes:
        assert error is None, f"the reference completes; the run raised {error!r}"
        assert result is not None and result.status == "completed"
        assert result.output == {n: o.output for n, o in ref.root.items()}
        assert set(view.nodes) == set(ref.outcomes)
        assert view.counters["plan_revisions"] == 1 + ref.scopes
        if not interrupted:
            c = view.counters
            assert (c["model_calls"], c["tool_calls"]) == (ref.model_calls, ref.tool_calls)
            assert len(host.provider_calls) == ref.model_calls
            assert len(host.applied) == ref.effects
        assert len({a.action_id for a in view.actions}) == ref.effects
        assert all(a.state == "confirmed" for a in view.actions)
        return
    assert isinstance(error, NodeFailedError), error
    assert view.status == "failed"
    assert error.node_id in ref.failing, (error.node_id, ref.failing)
    for node in view.nodes.values():
        assert node.state in ("completed", "failed", "canceled"), (node.node_id, node.state)
        if node.state == "failed" and node.kind == "agent":
            assert node.node_id in ref.failing


def copies_for(ref: Reference, faults: int) -> int:
    return 2 * (faults + 2) * max(1, sum(1 for k in ref.kinds.values() if k == "agent"))


# --- the properties --------------------------------------------------------------------------
@prop_settings(100)
@given(case=cases(), kind=st.sampled_from(("memory", "sqlite")))
def test_nested_agents_and_repeats_match_the_reference(case: Case, kind: str) -> None:
    ref = evaluate(case)
    event("completes" if ref.completes else "fails")
    event(f"boxes: {len(case.boxes)}, nodes: {len(ref.outcomes)}, capacity {case.capacity}")

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            host = Host(case)
            stores = Stores(kind, directory)
            driver = Driver(host, stores, [], None, RootLimits(
                max_concurrent_work=case.capacity, max_expanded_nodes=1000,
                max_work_attempts=1000), copies_for(ref, 0))
            try:
                result, error = await driver.drive()
                view, journal = await observe(driver.observer, 50)
            finally:
                await stores.close()
        assert driver.outcomes == ["result" if ref.completes else "NodeFailedError"]
        check_final(case, ref, host, view, journal, result, error, interrupted=False)

    asyncio.run(main())


@st.composite
def fault_lists(draw: st.DrawFn) -> list[Fault]:
    return draw(st.lists(st.builds(Fault, st.integers(1, 14), st.sampled_from(FAULT_MODES),
                                   st.booleans()), min_size=1, max_size=3))


@prop_settings(250)
@given(data=st.data(), case=cases(), faults=fault_lists(),
       kind=st.sampled_from(("sqlite", "memory")))
def test_interrupted_nested_agents_recover_to_the_reference(
        data: st.DataObject, case: Case, faults: list[Fault], kind: str) -> None:
    ref = evaluate(case)
    event("completes" if ref.completes else "fails")
    budgets = data.draw(st.one_of(st.none(), st.builds(
        Budgets, model_calls=st.one_of(st.none(), st.integers(0, 8)),
        tool_calls=st.one_of(st.none(), st.integers(0, 10)))))
    limits = RootLimits(max_concurrent_work=case.capacity,
                        max_expanded_nodes=data.draw(st.one_of(
                            st.just(1000), st.integers(len(case.root),
                                                       max(len(case.root), len(ref.outcomes))))),
                        max_work_attempts=data.draw(st.one_of(st.just(1000),
                                                              st.integers(1, 16))))

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            host = Host(case)
            stores = Stores(kind, directory)
            driver = Driver(host, stores, faults, budgets, limits, copies_for(ref, len(faults)))
            try:
                result, error = await driver.drive()
                view, journal = await observe(driver.observer, 7)
            finally:
                await stores.close()
        event(f"outcomes: {driver.outcomes}")
        if isinstance(error, BudgetExhaustedError):
            counter = error.counter
            assert counter in ("model_calls", "tool_calls", "work_attempts", "expanded_nodes")
        elif ref.completes and error is not None and not driver.canceled:
            raise AssertionError(f"the reference completes; the task ended with {error!r}")
        check_final(case, ref, host, view, journal, result, error, interrupted=True)

    asyncio.run(main())
