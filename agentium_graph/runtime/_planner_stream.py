"""Streamed planning (``mode="stream"``): plan revisions arrive as frames while the committed
prefix already runs.

The provider's text is read as newline-terminated frames ``{"baseRevision": n, "plan": {...}}``,
each the whole plan of revision ``n + 1``. A frame is checked like a complete-mode proposal
(the same plan validation, grants, pinned bindings) and against what already runs: nodes that
were claimed or started must stay exactly as they are (binding, version, args, dependencies);
unclaimed pending nodes may change or go. An accepted frame is one commit: its verdict and
``CommitRevision`` n -> n+1, which tombstones the removed and replaced nodes and adds the new
ones (spending expansion allowance), fenced like every write and compare-and-set on the
revision. A frame that asks for nothing new is ignored (see ``_unchanged``). The scheduler
installs each committed revision at once, so its ready nodes start while the stream goes on.

Planning seals at the stream's end (``StreamEnd``) once at least one revision is committed:
usage beyond the reservation is charged then (up to the limits, the rest journaled) together
with a ``planner_sealed`` entry, and no later run plans again. A rejected frame closes the
stream; its diagnostics go back to the model in a continuation request from the current
revision. A stream that ends without ``StreamEnd`` (or a worker that died mid-stream) is
continued the same way. Every provider call is charged and journaled before it is made
(``planner_call``), so ``1 + max_corrections`` calls bound planning across crashes too.

Limits (``PlannerConfig.stream``): ``max_frame_bytes`` per frame and ``max_total_bytes`` per
call close the stream as a rejection; ``max_frames`` (frames judged over the task's life) and
running out of calls fail the task; ``max_latency_ms`` bounds the wait for each event.

The stream is read through a task of its own (:class:`~._abandon.OwnedStream`). A stop of
the run (cancel, lost lease, deadline, budget) or ``max_latency_ms`` cancels it; a provider
that swallows that cancellation is abandoned after :data:`~._abandon.GRACE` seconds (a
warning naming it), and nothing it sends afterwards is judged or committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import (
    DuplicateKeyError,
    NotJSONError,
    admission_id,
    canonical_json,
    check_json,
    digest,
    digest_text,
    loads_unique,
)
from agentium_graph._program import ExecutionGraphProgram, PlannerConfig
from agentium_graph.errors import BudgetExhaustedError, Diagnostic, PlanValidationError
from agentium_graph.plan._validate import CompiledPlan
from agentium_graph.providers import (
    IncompleteStreamError,
    MalformedResponseError,
    ModelMessage,
    ModelRequest,
    StreamEnd,
    TextDelta,
    ToolCallDelta,
    check_stream_event,
)
from agentium_graph.providers._protocol import open_stream
from agentium_graph.runtime._abandon import OwnedStream, provider_name
from agentium_graph.runtime._agent import PROPOSAL_KIND, beyond_reservation
from agentium_graph.runtime._containers import node_record
from agentium_graph.runtime._planner import (
    BINDING_RULES,
    CALL_KIND,
    EXHAUSTED_ADVICE,
    FRAMES_ADVICE,
    INTERRUPTED_KIND,
    MAX_FED_BACK,
    SEALED_KIND,
    check_proposal,
    committed_plan,
    journal_entries,
    source_data,
)
from agentium_graph.store._requests import AppendJournal, Charge, CommitRevision, Step

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun


STREAM_RULES = """\
Stream the plan as frames: one JSON object per line, each line ending with a newline:
{"baseRevision": <n>, "plan": <the whole plan of revision n + 1>}.
The first frame has baseRevision 0 and a plan with "revision": 1; each later frame builds
on the revision before it. A plan has the form
{"schemaVersion": 1, "revision": <n + 1>, "nodes": [{"id": "...", "binding": "...",
"version": "...", "args": {...}, "dependsOn": [...]}]}.
Nodes may start as soon as a frame is committed: a later frame must keep every started
node exactly as it was; it may change or drop nodes that have not started.
""" + BINDING_RULES


@dataclass(slots=True)
class _State:
    """What the journal and the run say about this task's streamed planning so far."""

    calls: int = 0                      # provider calls charged (over the task's life)
    frames: int = 0                     # frames judged (accepted or rejected)
    sealed: bool = False
    # Why the last call did not seal (journaled): the diagnostics fed back, and whether a
    # frame was judged (a rejected plan) or the stream itself broke off (an interruption).
    problem: list[dict[str, Any]] = field(default_factory=list)
    judged: bool = False
    plan: dict[str, Any] | None = None  # the committed plan of the current revision
    plan_digest: str | None = None
    # The revision whose successor a frame asked for when a budget (a counter of the
    # CommitRevision) refused it, and that counter: journaled with the frame's verdict.
    refused_at: int | None = None
    refused_counter: str | None = None


class _Rejected(Exception):
    def __init__(self, diagnostics: list[Diagnostic], *, judged: bool = True,
                 spent: dict[str, Any] | None = None, final: bool = False) -> None:
        super().__init__(diagnostics[0].message if diagnostics else "rejected")
        self.diagnostics = diagnostics
        self.judged = judged  # a frame was judged (journaled as a rejected verdict)
        self.spent = spent  # a StreamEnd's usage ("usage") and its charge ("charges")
        self.final = final  # no correction can help: the planning fails once it is journaled


async def plan_stream(run: TaskRun, program: ExecutionGraphProgram) -> None:
    """Stream, check and commit plan revisions until the planner's stream seals."""
    config = program.planner
    assert config is not None
    state = await _load(run)
    while not state.sealed:
        if state.refused_at == run.header.revision and state.refused_counter is not None:
            # A frame already asked for a revision the budget refused, and counters are
            # never refunded: another provider call would be paid for and refused again.
            # (Checked first: the proposal was not invalid, even when it used the last call.)
            raise _budget_refusal(run, state.refused_counter)
        if state.frames > config.stream.max_frames:
            raise _too_many_frames(run, config)  # journaled before a crash: no new call
        if state.calls > config.max_corrections:
            raise _exhausted(run, config, state)
        request = _request(run, config, state)
        try:
            await _one_stream(run, program, config, request, state)
        except _Rejected as rejected:
            fed = [d.model_dump(exclude_none=True) for d in rejected.diagnostics[:MAX_FED_BACK]]
            if rejected.judged:
                await run.submit([AppendJournal(kind=PROPOSAL_KIND, data={
                    "call": state.calls - 1, "frame": state.frames - 1,
                    "base_revision": run.header.revision, "accepted": False,
                    "diagnostics": fed})])
            else:
                spent = rejected.spent or {}
                charges = list(spent.get("charges", ()))
                await run.submit([AppendJournal(kind=INTERRUPTED_KIND, data={
                    "call": state.calls - 1, "base_revision": run.header.revision,
                    "diagnostics": fed,
                    **({"usage": spent["usage"]} if "usage" in spent else {})}), *charges],
                    clamp=bool(charges))
            state.problem, state.judged = fed, rejected.judged
            if rejected.final:
                raise _too_many_frames(run, config) from None


async def _load(run: TaskRun) -> _State:
    state = _State()
    async for entry in journal_entries(run.store, run.header):
        if entry.kind == CALL_KIND:
            state.calls += 1
        elif entry.kind == SEALED_KIND:
            state.sealed = True
        elif entry.kind == PROPOSAL_KIND:
            state.frames += 1
            accepted = bool(entry.data.get("accepted"))
            state.problem = [] if accepted else list(entry.data.get("diagnostics", ()))
            state.judged = not accepted
            counter = entry.data.get("budget")
            state.refused_counter = counter if isinstance(counter, str) else None
            state.refused_at = entry.data.get("base_revision") if counter else None
        elif entry.kind == INTERRUPTED_KIND:
            state.problem, state.judged = list(entry.data.get("diagnostics", ())), False
    if run.header.revision >= 1 and not state.sealed:
        state.plan, state.plan_digest = await committed_plan(run.store, run.header)
    return state


def _budget_refusal(run: TaskRun, counter: str) -> BudgetExhaustedError:
    used = run.header.counters.get(counter, 0)
    limit = run.header.limits.get(counter)
    return BudgetExhaustedError(run.key, counter, used, 1, used if limit is None else limit)


def _exhausted(run: TaskRun, config: PlannerConfig, state: _State) -> Exception:
    subject = (f"task {run.key!r}: the planner's stream (1 + max_corrections="
               f"{config.max_corrections} calls)")
    if state.problem and state.judged:
        return PlanValidationError([Diagnostic(**d) for d in state.problem],
                                   subject=subject, advice=EXHAUSTED_ADVICE)
    why = "; ".join(d.get("message", "") for d in state.problem) or "its worker died"
    return IncompleteStreamError(
        f"{subject} did not reach a sealed end; the last call broke off ({why}); check the "
        "provider's streaming, or raise max_corrections")


def _request(run: TaskRun, config: PlannerConfig, state: _State) -> ModelRequest:
    """The first request, or a continuation from the current revision (after a rejected
    frame, an incomplete stream or a crash): built from durable state only."""
    messages = [ModelMessage(role="system", content=f"{config.host_instructions}\n\n"
                                                    f"{STREAM_RULES}"),
                ModelMessage(role="user", content=canonical_json(source_data(run)))]
    if state.calls:
        # The plan's own nodes that ran or run (not their nested children): a revision must
        # keep them as they are. The call number keeps two continuations apart.
        started = {}
        for node_id in sorted(run.graph.root.members):
            rec = run.nodes.get(node_id)
            if rec is not None and (rec.state != "pending" or rec.attempts):
                started[node_id] = rec.state
        messages.append(ModelMessage(role="user", content=canonical_json({
            "continue_from_revision": run.header.revision, "committed_plan": state.plan,
            "started_nodes": started, "diagnostics": state.problem, "call": state.calls})))
    return ModelRequest(model_messages=tuple(messages),
                        max_output_tokens=config.max_output_tokens,
                        metadata={"planner": run.identity.program["id"], "call": state.calls,
                                  "revision": run.header.revision})


async def _one_stream(run: TaskRun, program: ExecutionGraphProgram, config: PlannerConfig,
                      request: ModelRequest, state: _State) -> None:
    """One provider call: charged and journaled first, then read frame by frame."""
    call = state.calls
    reserve_out = request.max_output_tokens or 0
    estimate_in = math.ceil(len(canonical_json(request.model_dump(mode="json"))) / 4)
    incarnation = f"{run.header.task_id}:planner"
    adm = admission_id(incarnation, f"stream:{call}")
    ticket = await run.admission.acquire(None, adm)
    try:
        await run.submit([
            Charge(admission_id=adm, node_id=None,
                   charges={"model_calls": 1, "work_attempts": 1, "input_tokens": estimate_in,
                            "output_tokens": reserve_out}),
            AppendJournal(kind=CALL_KIND, data={"call": call,
                                                "request_digest": request.digest()})])
        state.calls += 1
        limits = config.stream
        timeout = limits.max_latency_ms / 1000
        reader = _Frames(limits.max_frame_bytes, limits.max_total_bytes)
        # Read through a task of its own, so a provider that swallows the cancellation of
        # a stop (or of a time limit) is abandoned after a grace instead of holding the run.
        stream = OwnedStream(open_stream(config.provider, request),
                             f"the planner stream of task {run.key!r} from "
                             f"{provider_name(config.provider)}",
                             name=f"planner-stream:{run.key}")
        # The permit covers the provider's work for as long as it really runs: a stream
        # abandoned still running keeps its root slot (as an agent's call does).
        run.admission.bind(ticket, stream.task)
        clock = asyncio.get_running_loop().time
        progress = clock()  # the stream's start, then each committed frame
        seen = 0
        try:
            while True:
                # max_latency_ms bounds the wait for each event *and* for each next frame, so
                # a stream that trickles (empty or tiny deltas) cannot hold the task open.
                left = timeout - (clock() - progress)
                if left <= 0:
                    raise TimeoutError("no frame within the planner's max_latency_ms")
                try:
                    event = await stream.next(min(timeout, left))
                except StopAsyncIteration:
                    raise _Rejected([Diagnostic(path="$", code="stream_incomplete", message=(
                        "the stream ended before its end; continue from the current "
                        "revision"))], judged=False) from None
                except IncompleteStreamError as exc:
                    raise _Rejected([Diagnostic(path="$", code="stream_incomplete",
                                                message=str(exc))], judged=False) from None
                seen += 1
                if isinstance(event, TextDelta | StreamEnd):
                    # Text that is no string, or usage that is no count, is the adapter's
                    # fault: typed, before anything of it is journaled or charged.
                    check_stream_event(event, seen - 1)
                if isinstance(event, TextDelta):
                    frames, closing = reader.feed(event.text)
                    for text in frames:
                        await _frame(run, program, config, text, state, call)
                        progress = clock()
                    if closing is not None:
                        raise closing
                elif isinstance(event, ToolCallDelta):
                    raise _Rejected([Diagnostic(path="$", code="planner_tool_call", message=(
                        "the planner is tool-free: stream plan frames as text, not tool "
                        "calls"))], judged=False)
                elif isinstance(event, StreamEnd):
                    rest = reader.finish()
                    if rest is not None:
                        await _frame(run, program, config, rest, state, call)
                    await _seal(run, event, estimate_in, reserve_out, state, call)
                    return
                else:  # the provider broke its contract: a fault, not a model answer
                    raise MalformedResponseError(
                        f"the planner's provider streamed a {type(event).__name__}, which is "
                        "not a stream event; fix the provider adapter",
                        details={"reason": "not_a_stream_event"})
        finally:
            await stream.aclose()
    finally:
        run.admission.release(ticket)


async def _seal(run: TaskRun, end: StreamEnd, estimate_in: int, reserve_out: int,
                state: _State, call: int) -> None:
    usage = beyond_reservation(end.usage, estimate_in, reserve_out,
                               admission_id(f"{run.header.task_id}:planner", f"usage:{call}"),
                               None)
    # A stream that ended without sealing still spent its usage: the rejection carries it,
    # charged (capped at the limits, the rest journaled) with the planner_interrupted entry.
    spent = {"usage": end.usage.model_dump(), "charges": usage}
    if end.stop_reason != "end":
        # Cut off (max_tokens) or stopped for tool calls: what came may be partial.
        raise _Rejected([Diagnostic(path="$", code="stream_cut_off", message=(
            f"the stream stopped with stop_reason={end.stop_reason!r}; continue from the "
            "current revision"))], judged=False, spent=spent)
    if run.header.revision == 0:
        raise _Rejected([Diagnostic(path="$", code="no_plan", message=(
            "the stream ended without a frame; send at least the frame with baseRevision 0"))],
            judged=False, spent=spent)
    steps: list[Step] = [
        AppendJournal(kind=SEALED_KIND, data={"call": call, "usage": end.usage.model_dump(),
                                              "revision": run.header.revision}),
        *usage]
    await run.submit(steps, clamp=True)
    state.sealed = True


class _Frames:
    """Newline-terminated frames out of text deltas, within the byte limits."""

    def __init__(self, max_frame: int, max_total: int) -> None:
        self.max_frame = max_frame
        self.max_total = max_total
        self.read = 0  # bytes of the complete lines so far, newlines included
        self.pending = ""

    def feed(self, text: str) -> tuple[list[str], _Rejected | None]:
        """The frames that ``text`` completes, in order, and the rejection that closes the
        stream after them (a line over ``max_frame_bytes``, or text past
        ``max_total_bytes``), if any. The frames before such a line are still judged, so
        what commits never depends on how the provider cut its text into deltas."""
        *lines, self.pending = (self.pending + text).split("\n")
        frames: list[str] = []
        for line in lines:
            size = len(line.encode("utf-8", "surrogatepass"))
            self.read += size + 1
            if self.read > self.max_total:
                return frames, self._too_much()
            if size > self.max_frame:
                return frames, self._too_large()
            if line.strip():
                frames.append(line)
        size = len(self.pending.encode("utf-8", "surrogatepass"))
        if self.read + size > self.max_total:
            return frames, self._too_much()
        return frames, self._too_large() if size > self.max_frame else None

    def finish(self) -> str | None:
        """What is left at the stream's end: a last frame the model did not end with a
        newline (taken as a frame), or None."""
        rest, self.pending = self.pending, ""
        return rest if rest.strip() else None

    def _too_much(self) -> _Rejected:
        return _Rejected([Diagnostic(path="$", code="stream_too_large", message=(
            f"the stream is over max_total_bytes={self.max_total}; send fewer or smaller "
            "frames"))], judged=False)

    def _too_large(self) -> _Rejected:
        return _Rejected([Diagnostic(path="$", code="frame_too_large", message=(
            f"a frame is over max_frame_bytes={self.max_frame}; send smaller revisions"))],
            judged=False)


async def _frame(run: TaskRun, program: ExecutionGraphProgram, config: PlannerConfig,
                 text: str, state: _State, call: int) -> None:
    """Judge one frame; commit it as the next revision or raise :class:`_Rejected`."""
    try:
        base, plan = _parse(text)
    except _Rejected:
        _count_frame(config, state, run)
        raise
    current = run.header.revision
    if _unchanged(base, plan, current, state):
        return
    _count_frame(config, state, run)
    if base != current:
        raise _Rejected([Diagnostic(path="$.baseRevision", code="base_revision_mismatch",
                                    message=f"the current revision is {current}; a frame "
                                            f"must build on it, not on {base}")])
    compiled, diags = check_proposal(run, program, plan, revision=current + 1,
                                     count_nodes=False)
    if compiled is None or diags:
        raise _Rejected([d.model_copy(update={"path": "$.plan" + d.path[1:]})
                         for d in diags])
    add, tombstone = _diff(run, compiled)
    limit = run.header.limits.get("expanded_nodes")
    used = run.header.counters.get("expanded_nodes", 0)
    if limit is not None and used + len(add) > limit:
        raise _Rejected([Diagnostic(path="$.plan.nodes", code="expansion_limit", message=(
            f"the revision adds {len(add)} node(s); {limit - used} of the task's "
            f"max_expanded_nodes={limit} are left"))])
    plan_text = canonical_json(plan)
    plan_digest = digest_text(plan_text)
    steps: list[Step] = [
        AppendJournal(kind=PROPOSAL_KIND, data={
            "call": call, "frame": state.frames - 1, "base_revision": current,
            "accepted": True, "plan_digest": plan_digest}),
        CommitRevision(base_revision=current, revision=current + 1, plan_digest=plan_digest,
                       add=tuple(node_record(run.key, compiled, "", n, None) for n in add),
                       tombstone=tombstone,
                       admission_id=admission_id(run.header.task_id,
                                                 f"planner:revision:{current + 1}"))]
    entry = (current + 1, compiled, tombstone, add)
    run.proposed.append(entry)
    try:
        await run.submit(steps, {plan_digest: plan_text}, tombstone=tombstone, revision=True)
    except asyncio.CancelledError:
        raise  # the commit may have happened: the loop installs it if it did
    except BudgetExhaustedError as exc:
        with contextlib.suppress(ValueError):
            run.proposed.remove(entry)  # refused before the commit: never installed
        # The frame's verdict is journaled like any other (SPEC 11), naming the budget: a
        # later run reads it and stops before paying for a call that could not commit.
        refusal = Diagnostic(path="$", code="budget_exhausted", message=(
            f"revision {current + 1} was refused: {exc.counter} has reached its limit "
            f"{exc.limit}; nothing is refunded, so the task cannot take another revision"))
        await run.submit([AppendJournal(kind=PROPOSAL_KIND, data={
            "call": call, "frame": state.frames - 1, "base_revision": current,
            "accepted": False, "diagnostics": [refusal.model_dump(exclude_none=True)],
            "budget": exc.counter})])
        state.refused_at, state.refused_counter = current, exc.counter
        raise
    except BaseException as exc:
        with contextlib.suppress(ValueError):
            run.proposed.remove(entry)  # refused before the commit: never installed
        from agentium_graph.runtime._submissions import RevisionConflict

        if isinstance(exc, RevisionConflict):
            raise _Rejected([Diagnostic(path="$.plan.nodes", code="node_already_started",
                                        message=f"nodes {exc.started} started before the "
                                                "revision arrived; keep them as they were")]
                            ) from None
        raise
    state.plan, state.plan_digest = plan, plan_digest


def _unchanged(base: int, plan: dict[str, Any], current: int, state: _State) -> bool:
    """Whether a frame asks for nothing new: the plan of the revision just committed, sent
    again on that revision's base (a retransmission) or on it as the next base with only
    its ``revision`` moved on (a model restating an unchanged plan). Either is ignored: it
    spends no revision and no frame."""
    if current < 1 or state.plan_digest is None:
        return False
    if base == current - 1:
        return digest(plan) == state.plan_digest
    return base == current and plan.get("revision") == current + 1 and \
        digest({**plan, "revision": current}) == state.plan_digest


def _count_frame(config: PlannerConfig, state: _State, run: TaskRun) -> None:
    state.frames += 1
    if state.frames > config.stream.max_frames:
        raise _Rejected([_frames_diagnostic(config)], final=True)


def _frames_diagnostic(config: PlannerConfig) -> Diagnostic:
    return Diagnostic(path="$", code="too_many_frames", message=(
        f"the planner sent more than max_frames={config.stream.max_frames} frames"))


def _too_many_frames(run: TaskRun, config: PlannerConfig) -> PlanValidationError:
    return PlanValidationError([_frames_diagnostic(config)],
                               subject=f"task {run.key!r}: the planner's stream",
                               advice=FRAMES_ADVICE)


def _parse(text: str) -> tuple[int, dict[str, Any]]:
    def bad(code: str, message: str, path: str = "$") -> _Rejected:
        return _Rejected([Diagnostic(path=path, code=code, message=message)])

    try:
        value = loads_unique(text)
        check_json(value)
    except json.JSONDecodeError as exc:
        raise bad("frame_not_json", f"the frame is not one JSON object: {exc.msg} at "
                                    f"column {exc.colno}") from None
    except DuplicateKeyError as exc:
        raise bad("frame_not_json", f"the frame is not one JSON object: {exc}; give each "
                                    "key once") from None
    except NotJSONError as exc:
        raise bad("frame_not_json", exc.reason, exc.path) from None
    except (ValueError, RecursionError) as exc:
        raise bad("frame_not_json",
                  f"the frame cannot be read as JSON data: {type(exc).__name__}") from None
    if not isinstance(value, dict) or set(value) != {"baseRevision", "plan"}:
        raise bad("frame_shape", 'a frame is {"baseRevision": <n>, "plan": {...}} and '
                                 "nothing else")
    base = value["baseRevision"]
    if type(base) is not int or base < 0:
        raise bad("frame_shape", "baseRevision must be a non-negative integer",
                  "$.baseRevision")
    if not isinstance(value["plan"], dict):
        raise bad("frame_shape", "plan must be a JSON object", "$.plan")
    return base, value["plan"]


def _diff(run: TaskRun, compiled: CompiledPlan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes a revision adds (new or changed) and tombstones (changed or dropped); a
    started node it would change or drop is a rejection."""
    graph = run.graph
    add: list[str] = []
    tombstone: list[str] = []
    started: list[str] = []
    for node_id in graph.root.members:
        spec = graph.specs[node_id]
        node = compiled.nodes.get(node_id)
        if node is not None and node.binding.id == spec.binding.id and \
                node.binding.version == spec.binding.version and node.deps == spec.deps and \
                node.args_digest == digest(spec.args, trusted=True):
            continue  # kept as it is
        if not run.replaceable(node_id):
            started.append(node_id)
            continue
        tombstone.append(node_id)
        if node is not None:
            add.append(node_id)
    if started:
        raise _Rejected([Diagnostic(path="$.plan.nodes", code="node_already_started",
                                    message=f"nodes {sorted(started)} have started; a "
                                            "revision must keep them exactly as they are "
                                            "(binding, version, args, dependsOn)")])
    add.extend(n for n in compiled.order if n not in graph.specs)
    return tuple(add), tuple(tombstone)
