"""Random streamed planners and a model of what the runtime must make of them.

Used by ``tests/test_review18_prop_planner.py``. A :class:`Script` is a sequence of target
plans ``P1 .. PN`` (the plan of revision ``r`` is always ``Pr``, whichever call commits it)
and, per provider call ``k``, what the planner sends: a list of frame *items* (advance to
the next target plan, retransmit the current one, stale or future base revisions, text that
is not JSON, a frame of the wrong shape, an unknown binding, a line over ``max_frame_bytes``,
blank lines) and how the stream ends (its end, ``max_tokens``, EOF before the end, a cut
mid-frame, a provider error, usage that is no count, a hang, a last frame without its
newline). The text of call ``k`` started at revision ``r`` is fixed by ``(k, r)``, so a
:class:`~agentium_graph.testing.ScriptedProvider` answers every continuation by matching the
request's ``call`` and ``revision`` metadata.

Plans: ``g`` (a gate tool that returns only once the run's planning is over) is in every
plan; *stable* nodes ``s*`` are never changed once added and may run while frames arrive;
*mutable* nodes ``m*`` depend on ``g`` (so they never start while planning goes on), and
later plans change their args, drop them, or bring a dropped id back.

:func:`simulate` plays a script without interruptions, the way the runtime must: which
frames are judged (complete lines, whatever the chunking), which revisions commit, the
tombstones, the counters, the journal's planning entries, the planner view and the outcome.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from agentium_graph._canonical import canonical_json, digest_text

MAX_FRAME = 1500  # StreamLimits.max_frame_bytes of every script
RESERVE = 40  # PlannerConfig.max_output_tokens
BAD_ITEMS = ("stale", "future", "garbage", "shape", "bad_binding", "huge")
# Interleaved and repeated: derandomized runs favour the first ones.
ITEMS = ("advance", "advance", "retransmit", "advance", "stale", "advance", "blank", "garbage",
         "advance", "huge", "future", "advance", "bad_binding", "shape")
ENDINGS = ("end", "end", "cut", "end", "nonl", "eof", "end", "max_tokens", "end", "raise",
           "end", "bad_usage", "end", "hang")
FAILING_ENDINGS = ("raise", "bad_usage", "hang")


def node(node_id: str, x: Any, *deps: str, binding: str = "inc") -> dict[str, Any]:
    spec: dict[str, Any] = {"id": node_id, "binding": binding, "version": "1",
                            "args": {"x": x}}
    if deps:
        spec["dependsOn"] = list(deps)
    return spec


def ref(node_id: str) -> dict[str, Any]:
    return {"$ref": {"node": node_id, "path": ["value"]}}


def plan_of(revision: int, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": revision, "nodes": nodes}


def frame_text(base: int, plan: dict[str, Any], spaced: bool = False) -> str:
    value = {"baseRevision": base, "plan": plan}
    if spaced:  # the same JSON written otherwise: still an identical retransmission
        return json.dumps(value, indent=None, separators=(" , ", " : "), sort_keys=True) + "\n"
    return json.dumps(value) + "\n"


def split(text: str, chunks: int) -> list[str]:
    """What ScriptedProvider streams: ``text`` in ``chunks`` pieces."""
    if not text:
        return []
    size = math.ceil(len(text) / chunks)
    return [text[i:i + size] for i in range(0, len(text), size)]


@dataclass(frozen=True)
class Call:
    items: tuple[str, ...]
    ending: str
    cut: int = 0  # "cut": how many text events are sent before EOF
    output_tokens: int = 0  # the usage a StreamEnd reports
    spaced: bool = False  # retransmissions written with other whitespace


@dataclass(frozen=True)
class Script:
    plans: tuple[dict[str, Any], ...]  # P1 .. PN (index 0 is P1)
    calls: tuple[Call, ...]
    chunks: int
    max_corrections: int
    max_frames: int
    gate_value: int
    max_expanded_nodes: int | None = None
    max_plan_revisions: int | None = None
    model_calls: int | None = None  # Budgets(model_calls=...)

    @property
    def hangs(self) -> bool:
        return any(c.ending == "hang" for c in self.calls)

    def plan(self, revision: int) -> dict[str, Any]:
        return self.plans[revision - 1]

    def text(self, k: int, revision: int) -> str:
        """What call ``k`` streams when it starts at ``revision``."""
        call = self.calls[k]
        cur = revision
        out: list[str] = []
        for item in call.items:
            if item == "advance":
                if cur < len(self.plans):
                    out.append(frame_text(cur, self.plan(cur + 1)))
                    cur += 1
            elif item == "retransmit":
                if cur >= 1:
                    out.append(frame_text(cur - 1, self.plan(cur), call.spaced))
            elif item == "blank":
                out.append("   \n")
            elif item == "stale":
                if cur >= 1:
                    wrong = plan_of(cur, [*self.plan(cur)["nodes"], node("zz", 1)])
                    out.append(frame_text(cur - 1, wrong))
                else:
                    out.append(frame_text(5, plan_of(6, [node("g", 0, binding="gate")])))
            elif item == "future":
                out.append(frame_text(cur + 1, plan_of(cur + 2, [node("g", 0, binding="gate")])))
            elif item == "garbage":
                out.append('{"baseRevision": 0, "plan": not json\n')
            elif item == "shape":
                out.append(json.dumps({"baseRevision": cur}) + "\n")
            elif item == "bad_binding":
                nodes = self.plan(cur)["nodes"] if cur >= 1 else [node("g", 0, binding="gate")]
                out.append(frame_text(cur, plan_of(cur + 1, [
                    *nodes, node("tp", 1, binding="teleport")])))
            elif item == "huge":
                out.append("x" * (MAX_FRAME + 10) + "\n")
        text = "".join(out)
        if call.ending == "nonl" and text.endswith("\n"):
            text = text[:-1]
        return text


# --- drawing scripts -----------------------------------------------------------------------
@st.composite
def target_plans(draw: st.DrawFn, gate_value: int) -> tuple[dict[str, Any], ...]:
    count = draw(st.integers(1, 4))
    stable: list[dict[str, Any]] = []
    mutable: dict[str, dict[str, Any]] = {}
    plans: list[dict[str, Any]] = []
    ids = iter(range(100))
    for revision in range(1, count + 1):
        if revision > 1:
            for mid in sorted(mutable):  # keep, change or drop the mutable nodes
                what = draw(st.sampled_from(("keep", "keep", "change", "drop")))
                if what == "change":
                    mutable[mid] = node(mid, draw(st.integers(-9, 9)), "g")
                elif what == "drop":
                    del mutable[mid]
        for _ in range(draw(st.integers(0, 2 if revision == 1 else 1))):
            sid = f"s{next(ids)}"
            source = draw(st.sampled_from(["lit", "g", *(s["id"] for s in stable)]))
            if source == "lit":
                stable.append(node(sid, draw(st.integers(-9, 9))))
            else:
                deps = ("g",) if source == "g" and draw(st.booleans()) else ()
                stable.append(node(sid, ref(source), *deps))
        for _ in range(draw(st.integers(0, 2))):
            mid = draw(st.sampled_from([f"m{i}" for i in range(4)]))
            source = draw(st.sampled_from(["lit", "g", *(s["id"] for s in stable)]))
            x: Any = draw(st.integers(-9, 9)) if source == "lit" else ref(source)
            mutable[mid] = node(mid, x, "g")
        nodes = [node("g", gate_value, binding="gate"), *stable,
                 *(mutable[m] for m in sorted(mutable))]
        plans.append(plan_of(revision, nodes))
    return tuple(plans)


@st.composite
def calls(draw: st.DrawFn, allow_hang: bool) -> Call:
    items = tuple(draw(st.lists(st.sampled_from(ITEMS), min_size=1, max_size=5)))
    endings = ENDINGS if allow_hang else tuple(e for e in ENDINGS if e != "hang")
    ending = draw(st.sampled_from(endings))
    return Call(items=items, ending=ending, cut=draw(st.integers(0, 6)),
                output_tokens=draw(st.integers(0, RESERVE + 30)), spaced=draw(st.booleans()))


@st.composite
def scripts(draw: st.DrawFn, allow_hang: bool = True, budgets: bool = True) -> Script:
    gate_value = draw(st.integers(0, 5))
    plans = draw(target_plans(gate_value))
    max_corrections = draw(st.sampled_from((2, 1, 0, 3, 4)))
    # Few calls may hang (each costs max_latency_ms): at most one per script.
    drawn: list[Call] = []
    for _ in range(max_corrections + 1):
        call = draw(calls(allow_hang and not any(c.ending == "hang" for c in drawn)))
        drawn.append(call)
    total = sum(len(p["nodes"]) for p in plans)
    return Script(
        plans=plans, calls=tuple(drawn), chunks=draw(st.integers(1, 5)),
        max_corrections=max_corrections,
        max_frames=draw(st.sampled_from((64, 64, 3, 5))), gate_value=gate_value,
        max_expanded_nodes=draw(st.integers(1, total + 1))
        if budgets and draw(st.integers(0, 4)) == 4 else None,
        max_plan_revisions=draw(st.integers(1, len(plans)))
        if budgets and draw(st.integers(0, 5)) == 5 else None,
        model_calls=draw(st.integers(1, max_corrections + 1))
        if budgets and draw(st.integers(0, 5)) == 5 else None)


# --- the reference -------------------------------------------------------------------------
def node_key(spec: dict[str, Any]) -> str:
    return canonical_json({k: spec.get(k) for k in ("binding", "version", "args")} |
                          {"deps": sorted(spec.get("dependsOn", []))})


def diff(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(added, tombstoned) node ids of the revision ``old`` -> ``new``."""
    before = {n["id"]: node_key(n) for n in (old or {"nodes": []})["nodes"]}
    after = {n["id"]: node_key(n) for n in new["nodes"]}
    tomb = [n for n in before if before[n] != after.get(n)]
    add = [n for n in after if before.get(n) != after[n]]
    return add, tomb


def outputs(script: Script, plan: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in plan["nodes"]:
        x = spec["args"]["x"]
        if isinstance(x, dict):
            x = out[x["$ref"]["node"]]["value"]
        out[spec["id"]] = {"value": x if spec["binding"] == "gate" else x + 1}
    return out


def plan_digest(plan: dict[str, Any]) -> str:
    return digest_text(canonical_json(plan))


@dataclass
class Expected:
    revision: int = 0
    sealed: bool = False
    outcome: str = "completed"  # completed | PlanValidationError | PlannerFailedError | budget
    codes: list[str] = field(default_factory=list)  # the outcome's diagnostics codes
    budget_counter: str | None = None
    calls: int = 0
    frames: int = 0
    expanded: int = 0
    output_tokens: int = 0
    journal: list[tuple[Any, ...]] = field(default_factory=list)
    tombstones: list[tuple[int, str]] = field(default_factory=list)
    proposals: int = 0
    rejected: int = 0
    last_codes: list[str] = field(default_factory=list)
    planner_digest: str | None = None


class _Stop(Exception):
    pass


def simulate(script: Script) -> Expected:
    e = Expected()
    problem: list[str] = []
    judged = False
    refused_at: int | None = None

    def reject(codes: list[str]) -> None:
        nonlocal problem, judged
        e.journal.append(("plan_proposal", False, tuple(codes)))
        e.proposals += 1
        e.rejected += 1
        e.last_codes = problem = codes
        judged = True

    def interrupted(codes: list[str], usage: bool) -> None:
        nonlocal problem, judged
        e.journal.append(("planner_interrupted", tuple(codes)))
        if usage:
            e.output_tokens += max(0, call.output_tokens - RESERVE)
        e.last_codes = problem = codes
        judged = False

    def count_frame() -> None:
        e.frames += 1
        if e.frames > script.max_frames:
            reject(["too_many_frames"])  # journaled like any rejected frame, then final
            e.outcome, e.codes = "PlanValidationError", ["too_many_frames"]
            raise _Stop

    def judge(line: str) -> bool:
        """Judge one frame; False when it closes the stream (a rejection)."""
        nonlocal refused_at
        try:
            value = json.loads(line)
        except ValueError:
            count_frame()
            reject(["frame_not_json"])
            return False
        if not isinstance(value, dict) or set(value) != {"baseRevision", "plan"}:
            count_frame()
            reject(["frame_shape"])
            return False
        base, plan = value["baseRevision"], value["plan"]
        cur = e.revision
        if cur >= 1 and base == cur - 1 and plan_digest(plan) == plan_digest(script.plan(cur)):
            return True  # an identical retransmission
        if cur >= 1 and base == cur and plan.get("revision") == cur + 1 and \
                plan_digest({**plan, "revision": cur}) == plan_digest(script.plan(cur)):
            return True  # the committed plan restated on the next base: nothing new
        count_frame()
        if base != cur:
            reject(["base_revision_mismatch"])
            return False
        if any(n["binding"] == "teleport" for n in plan["nodes"]):
            reject(["unknown_binding"])
            return False
        assert plan == script.plan(cur + 1), "the script only advances to its target plans"
        add, tomb = diff(script.plan(cur) if cur else None, plan)
        limit = script.max_expanded_nodes
        if limit is not None and e.expanded + len(add) > limit:
            reject(["expansion_limit"])
            return False
        if script.max_plan_revisions is not None and cur + 1 > script.max_plan_revisions:
            e.journal.append(("plan_proposal", False, ("budget_exhausted",)))
            e.proposals += 1
            e.rejected += 1
            e.last_codes = ["budget_exhausted"]
            refused_at = cur
            e.outcome, e.budget_counter = "budget", "plan_revisions"
            raise _Stop
        e.journal.append(("plan_proposal", True, ()))
        e.proposals += 1
        for node_id in tomb:
            e.journal.append(("node_tombstoned", node_id, cur + 1))
            e.tombstones.append((cur + 1, node_id))
        e.journal.append(("revision_committed", cur + 1))
        e.expanded += len(add)
        e.revision = cur + 1
        e.planner_digest = plan_digest(plan)
        return True

    try:
        while not e.sealed:
            if e.calls > script.max_corrections:
                if judged:
                    e.outcome, e.codes = "PlanValidationError", list(problem)
                else:
                    e.outcome, e.codes = "PlannerFailedError", []
                break
            if script.model_calls is not None and e.calls >= script.model_calls:
                e.outcome, e.budget_counter = "budget", "model_calls"
                break
            k = e.calls
            call = script.calls[k]
            text = script.text(k, e.revision)
            e.calls += 1
            e.output_tokens += RESERVE
            e.journal.append(("planner_call", k))
            events = split(text, script.chunks)
            if call.ending == "cut":
                events = events[:call.cut]
            received = "".join(events)
            lines = received.split("\n")
            complete, rest = lines[:-1], lines[-1]
            closed = False
            for line in complete:
                if len(line.encode()) > MAX_FRAME:
                    interrupted(["frame_too_large"], usage=False)
                    closed = True
                    break
                if line.strip() and not judge(line):
                    closed = True
                    break
            if closed:
                continue
            if len(rest.encode()) > MAX_FRAME:
                interrupted(["frame_too_large"], usage=False)
                continue
            if call.ending in ("cut", "eof"):
                interrupted(["stream_incomplete"], usage=False)
                continue
            if call.ending in ("raise", "bad_usage", "hang"):
                e.outcome = "PlannerFailedError"
                break
            if rest.strip() and not judge(rest):  # a last frame without its newline
                continue
            if call.ending == "max_tokens":
                interrupted(["stream_cut_off"], usage=True)
                continue
            if e.revision == 0:
                interrupted(["no_plan"], usage=True)
                continue
            e.journal.append(("planner_sealed", e.revision))
            e.output_tokens += max(0, call.output_tokens - RESERVE)
            e.sealed = True
    except _Stop:
        pass
    del refused_at
    return e
