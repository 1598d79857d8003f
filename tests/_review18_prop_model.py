"""Random valid task graphs of pure tools, and a reference evaluator for them.

Used by ``tests/test_review18_prop_runtime.py``. A :class:`Case` is a root plan plus up to a
few container programs (graph or repeat bindings, each a small plan of its own that may use
the containers defined before it), drawn by :func:`cases`. Every leaf is a pure tool whose
output is a fixed-shape function of its binding id and its resolved args; "picky" tools
fail for about a quarter of their inputs. :func:`evaluate` computes from the case alone what
every node incarnation (root nodes, graph children ``c/x``, repeat children ``r/i/x``) would
output, which fail, and which are blocked behind a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st

from agentium_graph import (
    ExecutionGraphProgram,
    GraphBinding,
    HostCatalog,
    PlanLimits,
    RepeatBinding,
    ToolBinding,
    tool_context,
)

Path = tuple[str | int, ...]

# a: async, returns without suspending; s: async, suspends twice; i: sync, inline on the
# loop; t: sync, in a worker thread.
IMPLS = ("a", "s", "i", "t")
# t_*: total; p_*: picky (fail for about a quarter of their inputs, by raising or by
# returning an output their schema refuses); q_*: their input schema wants an integer "a"
# (a $ref that resolves to anything else fails the node before it runs).
LEAVES = tuple(f"{kind}_{impl}" for kind in ("t", "p", "q") for impl in IMPLS)
Q_INPUT_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
LEAF_PATHS: tuple[Path, ...] = ((), ("h",), ("items",), ("items", 0), ("items", 1),
                                ("items", 2), ("sub",), ("sub", "k"), ("sub", "tag"))
ROOT_INPUT_PATHS: tuple[Path, ...] = ((), ("seed",), ("xs",), ("xs", 0), ("xs", 1))
SCOPE_INPUT_PATHS: tuple[Path, ...] = ((), ("x",))
LEAF_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"h": {"type": "integer"}, "items": {"type": "array"},
                   "sub": {"type": "object",
                           "properties": {"k": {"type": "integer"}, "tag": {"type": "string"}},
                           "required": ["k", "tag"]}},
    "required": ["h", "items", "sub"]}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def small_hash(*parts: Any) -> int:
    text = "\x1f".join(canonical(p) for p in parts)
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def leaf_output(binding: str, args: Any) -> dict[str, Any]:
    h = small_hash(binding, args) % 1000
    return {"h": h, "items": [h, h % 10, binding], "sub": {"k": h % 7, "tag": f"{binding}-{h % 3}"}}


def leaf_fails(binding: str, args: Any) -> bool:
    if binding.startswith("q_"):
        return type(args.get("a")) is not int
    return binding.startswith("p_") and leaf_output(binding, args)["h"] % 4 == 0


def repeat_condition(rounds: int) -> Callable[[dict[str, Any]], bool]:
    """Another iteration while fewer than ``rounds`` ran and the whole state hashes right:
    any difference in what the runtime hands the condition changes the outcome."""
    def condition(state: dict[str, Any]) -> bool:
        return bool(state["iteration"] + 1 < rounds and small_hash(state) % 5 != 0)
    return condition


# --- the case ------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeDef:
    id: str
    binding: str
    args: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    inputs_from: tuple[str, ...] = ()
    refs: tuple[str, ...] = ()  # producers named by $refs (not $input / $previous)

    @property
    def deps(self) -> tuple[str, ...]:
        return tuple(sorted({*self.depends_on, *self.inputs_from, *self.refs}))

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "binding": self.binding, "version": "1",
                               "args": self.args}
        if self.depends_on:
            out["dependsOn"] = list(self.depends_on)
        if self.inputs_from:
            out["inputsFrom"] = list(self.inputs_from)
        return out


@dataclass(frozen=True)
class PlanDef:
    nodes: tuple[NodeDef, ...]
    limit: int                       # the program's PlanLimits.max_concurrency
    requested: int | None = None     # the plan's own "maxConcurrency" (at most ``limit``)

    @property
    def max_concurrency(self) -> int:
        return self.limit if self.requested is None else min(self.limit, self.requested)

    def json(self) -> dict[str, Any]:
        plan: dict[str, Any] = {"schemaVersion": 1, "revision": 1,
                                "nodes": [n.json() for n in self.nodes]}
        if self.requested is not None:
            plan["maxConcurrency"] = self.requested
        return plan

    def program(self, pid: str) -> ExecutionGraphProgram:
        return ExecutionGraphProgram(id=pid, version="1", plan=self.json(),
                                     limits=PlanLimits(max_concurrency=self.limit,
                                                       max_nodes=max(100, len(self.nodes))))


@dataclass(frozen=True)
class ContainerDef:
    id: str
    kind: Literal["graph", "repeat"]
    plan: PlanDef
    max_iterations: int = 1
    rounds: int = 1


@dataclass(frozen=True)
class Case:
    containers: tuple[ContainerDef, ...]
    plan: PlanDef
    input: dict[str, Any]
    max_concurrent_work: int

    @property
    def container_map(self) -> dict[str, ContainerDef]:
        return {c.id: c for c in self.containers}

    def program(self) -> ExecutionGraphProgram:
        return self.plan.program("prop-root")

    def suspends(self) -> bool:
        """Whether some leaf may finish in another turn than the one that started it (so
        the order of events can depend on timing)."""
        plans = [self.plan, *(c.plan for c in self.containers)]
        return any(n.binding.endswith(("_s", "_t")) for p in plans for n in p.nodes)


class Executions:
    """Tool executions by node id, counted when the callback is entered, and how many ran
    at once (in all, and per scope: the node id's prefix)."""

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []  # (run number, node id)
        self.run = 0
        self._lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}  # scope prefix ("" root, "*" all) -> most at once
        self.hook: Callable[[str], None] | None = None  # called as a tool starts

    def hit(self, node_id: str) -> None:
        self.log.append((self.run, node_id))

    @contextlib.contextmanager
    def running(self, node_id: str) -> Iterator[None]:
        scope = node_id.rsplit("/", 1)[0] + "/" if "/" in node_id else ""
        hook = self.hook
        if hook is not None:
            hook(node_id)
        with self._lock:
            self.log.append((self.run, node_id))
            for name in (scope, "*"):
                self.active[name] = self.active.get(name, 0) + 1
                self.peak[name] = max(self.peak.get(name, 0), self.active[name])
        try:
            yield
        finally:
            with self._lock:
                for name in (scope, "*"):
                    self.active[name] -= 1

    def count(self, run: int | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r, node in self.log:
            if run is None or r == run:
                out[node] = out.get(node, 0) + 1
        return out


def _leaf_binding(bid: str, executions: Executions) -> ToolBinding:
    impl = bid.rsplit("_", 1)[1]

    def compute(args: dict[str, Any]) -> dict[str, Any]:
        if bid.startswith("q_"):
            assert type(args.get("a")) is int, "the input schema let a non-integer through"
        out = leaf_output(bid, args)
        if leaf_fails(bid, args):
            if out["h"] % 8 == 0:
                raise ValueError(f"{bid} refuses {canonical(args)[:60]}")
            return {**out, "h": "not an integer"}  # refused by the output schema
        return out

    if impl == "a":
        async def run_a(args: dict[str, Any]) -> dict[str, Any]:
            with executions.running(tool_context().node_id):
                return compute(args)
        execute: Callable[[dict[str, Any]], Any] = run_a
    elif impl == "s":
        async def run_s(args: dict[str, Any]) -> dict[str, Any]:
            with executions.running(tool_context().node_id):
                for _ in range(3):
                    await asyncio.sleep(0)
                return compute(args)
        execute = run_s
    else:
        def run_sync(args: dict[str, Any]) -> dict[str, Any]:
            with executions.running(tool_context().node_id):
                if impl == "t":
                    time.sleep(0.001)  # overlap with the other threads of a wave
                return compute(args)
        execute = run_sync
    return ToolBinding(id=bid, version="1", execute=execute, recovery="pure",
                       output_schema=LEAF_OUTPUT_SCHEMA, run_in_thread=impl == "t",
                       input_schema=Q_INPUT_SCHEMA if bid.startswith("q_") else {})


def catalog(case: Case, executions: Executions) -> HostCatalog:
    bindings: list[Any] = [_leaf_binding(b, executions) for b in LEAVES]
    for c in case.containers:
        program = c.plan.program(f"prog-{c.id}")
        if c.kind == "graph":
            bindings.append(GraphBinding(id=c.id, version="1", program=program))
        else:
            bindings.append(RepeatBinding(id=c.id, version="1", program=program,
                                          max_iterations=c.max_iterations,
                                          condition=repeat_condition(c.rounds)))
    return HostCatalog(bindings)


# --- drawing cases -------------------------------------------------------------------------
def output_paths(binding: str, containers: dict[str, ContainerDef], depth: int = 0) -> list[Path]:
    """Paths that exist in every output of ``binding``."""
    if binding in LEAVES:
        return list(LEAF_PATHS)
    c = containers[binding]
    inner: list[Path] = []
    for node in c.plan.nodes:
        inner.append((node.id,))
        if depth < 2:
            inner.extend((node.id, *p) for p in output_paths(node.binding, containers, depth + 1)
                         if p)
    if c.kind == "graph":
        return [(), *inner]
    return [(), ("iterations",), ("stopped",), ("last",), *(("last", *p) for p in inner)]


def _ref(node: str, path: Path, explicit: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"node": node}
    if path or explicit:
        body["path"] = list(path)
    return {"$ref": body}


_SCALARS = st.one_of(st.integers(-50, 50), st.text("abé z", max_size=3), st.booleans(),
                     st.none())


@st.composite
def _value(draw: st.DrawFn, producers: list[tuple[str, list[Path]]], used: set[str],
           depth: int = 0) -> Any:
    choice = draw(st.integers(0, 5 if depth < 2 else 2))
    if choice <= 1:
        return draw(_SCALARS)
    if choice <= 3:  # producers always hold $input
        node, paths = draw(st.sampled_from(producers))
        path = draw(st.sampled_from(paths))
        if node not in ("$input", "$previous"):
            used.add(node)
        return _ref(node, path, draw(st.booleans()))
    if choice == 4:
        if draw(st.integers(0, 3)) == 0:  # taken verbatim, $ref-looking content included
            node, paths = draw(st.sampled_from(producers))
            inner = draw(st.one_of(_SCALARS, st.just(_ref(node, draw(st.sampled_from(paths)),
                                                         True))))
            return {"$literal": inner}
        return [draw(_value(producers, used, depth + 1)) for _ in range(draw(st.integers(0, 3)))]
    keys = draw(st.lists(st.sampled_from("abcdk"), unique=True, max_size=3))
    return {k: draw(_value(producers, used, depth + 1)) for k in keys}


@st.composite
def _plan(draw: st.DrawFn, bindings: list[str], containers: dict[str, ContainerDef],
          input_paths: tuple[Path, ...], previous: bool, max_nodes: int) -> PlanDef:
    n = draw(st.integers(1, max_nodes))
    nodes: list[NodeDef] = []
    leaves = [b for b in bindings if b in LEAVES]
    boxes = [b for b in bindings if b not in LEAVES]
    for i in range(n):
        nid = f"n{i}"
        binding = draw(st.sampled_from(boxes)) if boxes and draw(st.integers(0, 4)) == 0 \
            else draw(st.sampled_from(leaves))
        producers: list[tuple[str, list[Path]]] = [
            (p.id, output_paths(p.binding, containers)) for p in nodes]
        producers.append(("$input", list(input_paths)))
        if previous:
            producers.append(("$previous", [()]))
        used: set[str] = set()
        keys = draw(st.lists(st.sampled_from("abcdk"), unique=True, max_size=3))
        # (a q_* node's "a" is drawn below: a value drawn here would leave its refs in used)
        args = {k: draw(_value(producers, used)) for k in keys
                if not (k == "a" and binding.startswith("q_"))}
        if binding not in LEAVES:
            args["x"] = draw(_value(producers, used))
        if binding.startswith("q_"):
            if draw(st.booleans()):
                args["a"] = draw(st.integers(-5, 5))
            else:
                node, paths = draw(st.sampled_from(producers))
                if node not in ("$input", "$previous"):
                    used.add(node)
                args["a"] = _ref(node, draw(st.sampled_from(paths)), draw(st.booleans()))
        earlier = [p.id for p in nodes]
        depends_on = tuple(draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2))) \
            if earlier else ()
        inputs_from = tuple(draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2))) \
            if earlier else ()
        nodes.append(NodeDef(nid, binding, args, depends_on, inputs_from, tuple(sorted(used))))
    limit = draw(st.integers(1, 5))
    return PlanDef(tuple(nodes), limit, draw(st.one_of(st.none(), st.integers(1, limit))))


@st.composite
def cases(draw: st.DrawFn, max_root_nodes: int = 8, max_containers: int = 2) -> Case:
    containers: list[ContainerDef] = []
    for i in range(draw(st.integers(0, max_containers))):
        kind: Literal["graph", "repeat"] = draw(st.sampled_from(("graph", "repeat")))
        cid = f"{kind[0]}{i}"
        known = {c.id: c for c in containers}
        plan = draw(_plan([*LEAVES, *known], known, SCOPE_INPUT_PATHS, kind == "repeat", 3))
        if kind == "graph":
            containers.append(ContainerDef(cid, kind, plan))
        else:
            containers.append(ContainerDef(cid, kind, plan, draw(st.integers(1, 3)),
                                           draw(st.integers(1, 3))))
    known = {c.id: c for c in containers}
    plan = draw(_plan([*LEAVES, *known], known, ROOT_INPUT_PATHS, False, max_root_nodes))
    task_input = {"seed": draw(st.integers(0, 99)),
                  "xs": [draw(st.integers(-9, 9)), draw(st.text("xy", max_size=2))]}
    return Case(tuple(containers), plan, task_input, draw(st.integers(1, 4)))


@st.composite
def wide_cases(draw: st.DrawFn) -> Case:
    """Plans of 65 to 130 nodes, most of them ready at once (a large scheduler frontier):
    each node refers to at most one earlier node, often to none; a few are containers."""
    box = draw(_plan([*LEAVES], {}, SCOPE_INPUT_PATHS, False, 3))
    containers = (ContainerDef("g0", "graph", box),)
    n = draw(st.integers(65, 130))
    fanin = draw(st.integers(0, 3))  # how often a node has a dependency (of 4)
    picks = draw(st.lists(st.integers(0, 10 ** 6), min_size=3 * n, max_size=3 * n))
    nodes: list[NodeDef] = []
    depth: list[int] = []
    for i in range(n):
        a, b, c = picks[3 * i:3 * i + 3]
        boxes = sum(node.binding == "g0" for node in nodes)
        # (at most 20 containers: each costs a plan revision, 32 by default)
        binding = "g0" if c % 17 == 0 and boxes < 20 else \
            "p_a" if c % 41 == 3 else ("t_a", "t_i", "t_s", "q_i")[c % 4]
        args: dict[str, Any] = {"i": i}
        refs: tuple[str, ...] = ()
        if i and a % 4 < fanin and depth[b % i] < 20:  # well within PlanLimits.max_depth
            producer = nodes[b % i]
            path = ("h",) if producer.binding in LEAVES else ("n0", "h")  # g0's n0: a leaf
            args["a"] = _ref(producer.id, path, False)
            refs = (producer.id,)
            depth.append(depth[b % i] + 1)
        else:
            depth.append(1)
        if binding.startswith("q_") and not refs:
            args["a"] = i
        if binding == "g0":
            args["x"] = i
        nodes.append(NodeDef(f"n{i}", binding, args, refs=refs))
    limit = draw(st.integers(1, 16))
    plan = PlanDef(tuple(nodes), limit, draw(st.one_of(st.none(), st.integers(1, limit))))
    return Case(containers, plan, {"seed": 0, "xs": [0, ""]}, draw(st.integers(1, 8)))


# --- the reference -------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: Literal["ok", "fail", "blocked"]
    output: Any = None


@dataclass
class Reference:
    """What every node incarnation does when nothing else stops the task."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    leaves: set[str] = field(default_factory=set)      # leaf node ids (materialized)
    parents: dict[str, str | None] = field(default_factory=dict)
    scopes: list[tuple[str, int | None, int]] = field(default_factory=list)  # container, it, n
    root: dict[str, Outcome] = field(default_factory=dict)

    @property
    def failing(self) -> set[str]:
        return {n for n in self.leaves if self.outcomes[n].kind == "fail"}

    @property
    def completes(self) -> bool:
        return all(o.kind == "ok" for o in self.root.values())

    def output(self) -> dict[str, Any]:
        return {n: o.output for n, o in self.root.items()}

    def ancestors(self, node: str) -> list[str]:
        out = []
        parent = self.parents[node]
        while parent is not None:
            out.append(parent)
            parent = self.parents[parent]
        return out

    def expanded_nodes(self) -> int:
        return len(self.outcomes)

    def plan_revisions(self) -> int:
        return 1 + len(self.scopes)


def value_at(value: Any, path: Iterable[str | int]) -> Any:
    for part in path:
        value = value[part]
    return value


def resolve(template: Any, values: dict[str, Any]) -> Any:
    if isinstance(template, dict) and set(template) == {"$literal"}:
        return template["$literal"]
    if isinstance(template, dict) and set(template) == {"$ref"}:
        ref = template["$ref"]
        return json.loads(canonical(value_at(values[ref["node"]], ref.get("path", []))))
    if isinstance(template, dict):
        return {k: resolve(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [resolve(v, values) for v in template]
    return template


def evaluate(case: Case) -> Reference:
    ref = Reference()
    containers = case.container_map

    def run_plan(plan: PlanDef, scope_input: Any, previous: Any, prefix: str,
                 parent: str | None) -> dict[str, Outcome]:
        local: dict[str, Outcome] = {}
        for node in plan.nodes:
            full = prefix + node.id
            ref.parents[full] = parent
            if any(local[d].kind != "ok" for d in node.deps):
                outcome = Outcome("blocked")
            else:
                values = {d: local[d].output for d in node.deps}
                values["$input"] = scope_input
                values["$previous"] = previous
                args = resolve(node.args, values)
                outcome = run_node(node.binding, args, full)
            local[node.id] = outcome
            ref.outcomes[full] = outcome
        return local

    def run_node(binding: str, args: Any, full: str) -> Outcome:
        if binding in LEAVES:
            ref.leaves.add(full)
            return Outcome("fail") if leaf_fails(binding, args) else \
                Outcome("ok", leaf_output(binding, args))
        c = containers[binding]
        if c.kind == "graph":
            ref.scopes.append((full, None, len(c.plan.nodes)))
            children = run_plan(c.plan, args, None, f"{full}/", full)
            if any(o.kind != "ok" for o in children.values()):
                return Outcome("fail")
            return Outcome("ok", {k: o.output for k, o in children.items()})
        previous = None
        condition = repeat_condition(c.rounds)
        for i in range(c.max_iterations):
            ref.scopes.append((full, i, len(c.plan.nodes)))
            children = run_plan(c.plan, args, previous, f"{full}/{i}/", full)
            if any(o.kind != "ok" for o in children.values()):
                return Outcome("fail")
            outputs = {k: o.output for k, o in children.items()}
            again = condition(json.loads(canonical({"iteration": i, "outputs": outputs,
                                                    "input": args})))
            if not again or i + 1 >= c.max_iterations:
                return Outcome("ok", {"iterations": i + 1,
                                      "stopped": "max_iterations" if again else "condition",
                                      "last": outputs})
            previous = outputs
        raise AssertionError("unreachable")

    ref.root = run_plan(case.plan, case.input, None, "", None)
    return ref


__all__ = ["IMPLS", "LEAVES", "Case", "ContainerDef", "Executions", "NodeDef", "Outcome",
           "PlanDef", "Reference", "canonical", "cases", "catalog", "evaluate", "leaf_fails",
           "leaf_output", "repeat_condition", "wide_cases"]
