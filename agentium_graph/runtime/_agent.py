"""Agent nodes: a tool-calling loop over a model provider, replayable after a crash.

An agent node holds no root permit itself; every model call takes one permit for the whole
request (or stream, released when the stream is closed), and every tool call takes one like
a tool node. Before a model call its admission is charged (one model call, one work attempt,
the input-token estimate and the output-token reservation); the complete response is
journaled (a blob + a ``model_response`` entry bound to the request digest) **before** its
tool calls run, together with any usage beyond the reservation. Tool results are journaled
the same way, under the call's key (:func:`call_key`: the model's id, made distinct per turn
when a later turn reuses it). On recovery the node restarts from entry: a request whose
digest matches a journaled response replays it (same text, same tool-call ids) with no
provider call and no new charge; journaled tool results are reused. An interrupted call is
simply asked again; its reservation stays charged as unknown usage. The agent's tools are
the versions the task pinned at create, so its requests do not depend on the catalog of the
process that runs it. A response is checked whole (:func:`check_response`) before any of it
is journaled; a call is bounded by ``effect_timeout`` (:class:`ProviderTimeoutError`).

Canceling the agent (a task cancel or deadline) cancels its model calls, never an effect in
flight: a connector-backed tool call runs to its end in a task of its own (dispatch bounded by
``effect_timeout``, a failed dispatch reconciled, the receipt journaled) and only then does
the agent end canceled, without asking the model again. A run that abandons its work (lease
lost, store failure) cancels that call too, like an effect node's; the next run reconciles.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import admission_id, canonical_json, digest_text
from agentium_graph.catalog._bindings import AgentBinding, ToolBinding
from agentium_graph.errors import (
    AgentiumGraphError,
    BudgetExhaustedError,
    DescriptorMismatchError,
    ErrorInfo,
    NodeFailedError,
    exception_text,
)
from agentium_graph.providers import (
    IncompleteStreamError,
    MalformedResponseError,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
    assemble_stream,
    check_response,
)
from agentium_graph.providers._errors import (
    ProviderError,
    ProviderTimeoutError,
    ResponseTooLargeError,
)
from agentium_graph.providers._protocol import (
    MAX_TOKENS,
    call_complete,
    close_stream,
    open_stream,
)
from agentium_graph.runtime import _abandon
from agentium_graph.runtime import _effects as effects
from agentium_graph.runtime._admission import Ticket
from agentium_graph.runtime._blobs import read_verified
from agentium_graph.runtime._context import CancelFlag, ToolContext
from agentium_graph.runtime._graph import NodeSpec
from agentium_graph.runtime._outcome import Outcome, bytes_over, check_output, schema_error
from agentium_graph.runtime._reach import pinned_tool_version
from agentium_graph.runtime._tool import invoke_tool
from agentium_graph.store._requests import AppendJournal, Charge, RecordAction

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun

MODEL_KIND = "model_response"
PLANNER_KIND = "planner_response"
PROPOSAL_KIND = "plan_proposal"  # the verdict on one planner response
STREAM_ATTEMPTS = 2  # an incomplete stream is asked again once before the node fails
TOOL_KIND = "agent_tool_result"


@dataclass
class AgentRecords:
    """What earlier runs journaled for agent nodes, indexed for replay."""

    responses: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, req) -> blob
    tools: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, call key) -> blob
    # The planner's rejected proposals: request digest -> the diagnostics journaled for it.
    verdicts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Responses too large to journal: (node, req) -> {"bytes": n, "limit": m}. Their request
    # is not asked again; it ends the same way (ResponseTooLargeError).
    refused: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The provider ({"id", "version"}) whose responses an agent node journaled (entries
    # journaled before responses named their provider name none).
    providers: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, kind: str, node_id: str | None, data: dict[str, Any]) -> None:
        if kind in (PLANNER_KIND, MODEL_KIND) and isinstance(data.get("too_large"), dict):
            owner = "" if kind == PLANNER_KIND else node_id
            if owner is not None:
                self.refused[(owner, str(data["request_digest"]))] = dict(data["too_large"])
            return
        if kind == PLANNER_KIND:  # the task's planner: no node
            self.responses[("", str(data["request_digest"]))] = str(data["digest"])
            return
        if kind == PROPOSAL_KIND:
            # (A streamed frame's verdict has no request digest: frames are never replayed.)
            if not data.get("accepted") and "request_digest" in data:
                self.verdicts[str(data["request_digest"])] = list(data.get("diagnostics", []))
            return
        if node_id is None:
            return
        if kind == MODEL_KIND:
            self.responses[(node_id, str(data["request_digest"]))] = str(data["digest"])
            if isinstance(data.get("provider"), dict):
                self.providers.setdefault(node_id, dict(data["provider"]))
        elif kind == TOOL_KIND:
            self.tools[(node_id, str(data["call_id"]))] = str(data["digest"])


class AgentFailure(NodeFailedError):
    code = "agent_failed"


class _CallRefused(AgentFailure):
    """A tool call the model got wrong (a tool it may not use, arguments its schema
    refuses): nothing was run, so with ``Agent(max_tool_errors=n)`` the model is told why
    instead, up to ``n`` times per node. Decided from the recorded response alone, so a
    recovery decides it the same way."""


class _Settled(Exception):
    """A tool call's outcome that ends the agent node as it is (an uncertain effect, a
    failed one whose action must be recorded, an interrupted or stopped one)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"tool call ended the node: {outcome.state}")
        self.outcome = outcome


async def _permit(run: TaskRun, node_id: str, admission_id: str | None = None) -> Ticket:
    """A root permit for the agent's next model or tool call. A stopping run (failure,
    budget, an uncertain effect) starts no new work, so neither does a running agent: it
    ends where it is, open, for the stop's final commit to close it (canceled, or uncertain
    over an effect an earlier run dispatched that it did not reach), or, after a budget
    stop, for the next run to resume it from its journal. (A cancel or a deadline cancels
    the agent itself.)"""
    if run.stop is None:
        ticket = await run.admission.acquire(node_id, admission_id)
        if run.stop is None:
            return ticket
        run.admission.release(ticket)  # granted as the run began to stop
    raise _Settled(Outcome("canceled"))


async def run_agent(run: TaskRun, spec: NodeSpec, args: dict[str, Any]) -> Outcome:
    try:
        return await _loop(run, spec, args)
    except _Settled as exc:
        return exc.outcome


async def _loop(run: TaskRun, spec: NodeSpec, args: dict[str, Any]) -> Outcome:
    binding = spec.binding
    assert isinstance(binding, AgentBinding)
    agent = binding.agent
    _check_provider(run, spec, agent.provider)
    tools = _tool_bindings(run, spec, agent.tools)
    prompt = args["prompt"] if isinstance(args.get("prompt"), str) else canonical_json(args)
    messages: list[ModelMessage] = [ModelMessage(role="system", content=agent.instructions),
                                    ModelMessage(role="user", content=prompt)]
    specs = tuple(ToolSpec(name=t.id, description=t.description, input_schema=t.input_schema)
                  for t in tools.values())
    usage = {"input_tokens": 0, "output_tokens": 0, "model_calls": 0}
    rec = run.nodes[spec.id]
    keys: set[str] = set()  # the call keys of this agent's tool calls so far
    refusals = 0  # tool calls refused so far and told to the model (max_tool_errors)
    for turn in range(agent.max_turns):
        request = ModelRequest(model_messages=tuple(messages), tools=specs,
                               max_output_tokens=agent.max_output_tokens,
                               metadata={"node": spec.id, "turn": turn})
        response = await _model_call(run, spec, rec.incarnation_id, agent, request)
        usage["input_tokens"] += response.usage.input_tokens
        usage["output_tokens"] += response.usage.output_tokens
        usage["model_calls"] += 1
        messages.append(response.to_message())
        if not response.tool_calls:
            return check_output(spec.id, binding, {"text": response.text, "usage": usage},
                                run.max_blob_bytes)
        if turn + 1 == agent.max_turns:
            # No model would see these calls' results: they are not made (a tool may be an
            # effect, and a budget would pay for it).
            asked = sorted({call.name for call in response.tool_calls})
            raise AgentFailure(
                f"agent node {spec.id!r} did not finish within max_turns={agent.max_turns}: "
                f"its last answer asked for tools {asked}, which were not called (no turn was "
                "left to use their results); raise max_turns or simplify the task",
                node_id=spec.id, details={"max_turns": agent.max_turns, "not_called": asked})
        calls = [(call, call_key(call.id, turn, keys)) for call in response.tool_calls]
        # Every wrong call of the answer is found before any of its calls runs: the one past
        # max_tool_errors fails the node before a valid call beside it could run (or
        # dispatch an effect) for nothing. A call with a recorded result ran: it was valid.
        allowed = refusals
        for call, key in calls:
            refused = None if (spec.id, key) in run.agent_records.tools else \
                _refusal(run, spec, tools, call)
            if refused is not None:
                if allowed == agent.max_tool_errors:
                    raise _past_allowance(refused, agent.max_tool_errors)
                allowed += 1
        for call, key in calls:
            try:
                result = await _tool_call(run, spec, tools, call, key)
            except _CallRefused as refused:
                refusals += 1  # the model is told, and may correct the call next turn
                result = {"error": str(refused), "refused": refusals,
                          "max_tool_errors": agent.max_tool_errors}
            messages.append(ModelMessage(role="tool", content=canonical_json(result),
                                         tool_call_id=call.id))
    raise AssertionError("unreachable: the last turn returns or raises")  # pragma: no cover


def provider_pin(provider: Any) -> dict[str, str]:
    """Which model answers: the provider's id and version (``Agent`` requires both)."""
    return {"id": str(provider.id), "version": str(provider.version)}


def _check_provider(run: TaskRun, spec: NodeSpec, provider: Any) -> None:
    """Refuse to go on with a conversation another provider (id or version) began: its
    recorded answers would be mixed with a different model's. The run stops with a
    :class:`DescriptorMismatchError` and the node stays as it is (the task recoverable, as
    when a pinned descriptor changed), so restoring the provider recovers it. A node whose
    responses were journaled before they named their provider is not checked."""
    pinned = run.agent_records.providers.get(spec.id)
    current = provider_pin(provider)
    if pinned is None or pinned == current:
        return
    error = DescriptorMismatchError(
        f"task {run.key!r}: agent node {spec.id!r} began its conversation with provider "
        f"{pinned.get('id')!r} version {pinned.get('version')!r}, but this catalog's agent "
        f"{spec.binding.id!r} version {spec.binding.version!r} uses provider "
        f"{current['id']!r} version {current['version']!r}; restore the original provider "
        "to recover the task (a new provider needs a new binding version, for new tasks)",
        node_id=spec.id, details={"binding": spec.binding.id,
                                  "version": spec.binding.version,
                                  "pinned_provider": pinned, "provider": current})
    # "budget": the node stays running and the run stops with the task pending.
    raise _Settled(Outcome("budget", error=error.to_info(), exception=error))


def call_key(call_id: str, turn: int, used: set[str]) -> str:
    """The key a tool call's admission, action identity and journaled result go by.

    Many provider adapters number tool calls per response (``call_0`` in every turn), so a
    model's call id alone does not name one call of the agent. A call keeps its id as its
    key the first time the id appears (which is what tasks journaled before keys existed
    used, so their records are still found); a later call with an id already used gets a
    key naming its turn (``call_0#t1``, made unique if even that is taken). Keys depend only
    on the sequence of responses, which recovery replays, so they are stable across runs.
    The model still sees its own id (``tool_call_id``); only the runtime uses the key."""
    key = call_id
    if key in used:
        key = base = f"{call_id}#t{turn}"
        n = 1
        while key in used:
            n += 1
            key = f"{base}.{n}"
    used.add(key)
    return key


def _tool_bindings(run: TaskRun, spec: NodeSpec, names: tuple[str, ...]
                   ) -> dict[str, ToolBinding]:
    """The agent's tools in the versions the task pinned at create (the highest version of
    each that was registered then), so a version added to the catalog later changes neither
    what the agent may call nor its requests (whose digests find recorded responses)."""
    pinned = run.identity.descriptors
    found: dict[str, ToolBinding] = {}
    for name in names:
        version = pinned_tool_version(pinned, name)
        if version is None:
            # Not pinned (e.g. not granted to the task): the catalog's latest, as the task
            # could not have pinned it.
            tool = run.rt.catalog.latest_tool(name)
            if tool is None:
                raise AgentFailure(f"agent node {spec.id!r}: tool {name!r} is not in the "
                                   "catalog", node_id=spec.id)
            found[name] = tool
            continue
        binding = run.rt.catalog.get(name, version)
        current = run.rt.catalog.descriptor(name, version)
        if not isinstance(binding, ToolBinding) or current is None or \
                current.model_dump(mode="json") != pinned[f"{name}@{version}"]:
            raise DescriptorMismatchError(
                f"task {run.key!r} pinned tool {name!r} version {version!r} for agent node "
                f"{spec.id!r}, which this catalog "
                f"{'no longer registers' if current is None else 'registers differently'}; "
                "register the original binding again to recover the task",
                node_id=spec.id, details={"binding": name, "version": version})
        found[name] = binding
    return found


@dataclass(frozen=True, slots=True)
class ModelCaller:
    """Who makes a model call: its node (``None`` for the task's planner), the incarnation
    its admission ids derive from, how the provider is called, and the journal kind its
    responses are recorded under."""

    node_id: str | None
    incarnation: str
    provider: Any
    stream: bool
    timeout: float
    journal_kind: str = MODEL_KIND
    # What bounds the call, as the timeout error names it (what to raise).
    timeout_setting: str = "the model call's time limit"
    task_key: str = ""  # the task, as a log line names it


@dataclass(slots=True)
class Fetched:
    """A model response; ``steps``/``blobs`` journal it (empty when it was replayed)."""

    response: ModelResponse
    request_digest: str
    response_digest: str
    steps: list[Any]
    blobs: dict[str, str]

    @property
    def replayed(self) -> bool:
        return not self.steps


async def fetch_response(run: TaskRun, caller: ModelCaller, request: ModelRequest,
                         damaged: Callable[[str], Exception]) -> Fetched:
    """The response to ``request``: replayed from the journal, or asked of the provider
    under a charged admission (then returned with the steps that journal it)."""
    req_digest = request.digest()
    owner = caller.node_id or ""
    refused = run.agent_records.refused.get((owner, req_digest))
    if refused is not None:  # its usage was charged when it was refused: no new call
        raise _too_large(caller, int(refused["bytes"]), int(refused["limit"]))
    recorded = run.agent_records.responses.get((owner, req_digest))
    if recorded is not None:
        blobs = await read_verified(run.store, [recorded])
        problem = blobs.problem(recorded)
        if problem is not None:
            raise damaged(f"journaled model response {recorded} is {problem}; the store was "
                          "modified")
        try:
            replayed = check_response(ModelResponse.model_validate_json(blobs.texts[recorded]))
        except (ValueError, MalformedResponseError) as exc:  # pydantic's ValidationError too
            # Journaled by a version that did not check responses whole: unusable as it is.
            raise damaged(f"journaled model response {recorded} is not a valid response "
                          f"({_first_line(exc)}); it was journaled unchecked by an earlier "
                          "version, so this node cannot be recovered from it") from None
        return Fetched(replayed, req_digest, recorded, [], {})
    # A call reserves at least one output token: a call without max_output_tokens would
    # otherwise reserve none, and a task whose output_tokens counter already reached its
    # limit would go on calling the model (each overshoot only journaled as over the limit).
    reserve_out = request.max_output_tokens or 1
    estimate_in = math.ceil(len(canonical_json(request.model_dump(mode="json"))) / 4)
    for attempt in range(STREAM_ATTEMPTS):
        # One provider invocation = one work attempt; an interrupted one stays charged.
        adm = admission_id(caller.incarnation, f"model:{req_digest}:{run.fence}:{attempt}")
        ticket = await (run.admission.acquire(None, adm) if caller.node_id is None else
                        _permit(run, caller.node_id, adm))
        try:
            await run.submit([Charge(admission_id=adm, node_id=caller.node_id, charges={
                "model_calls": 1, "work_attempts": 1, "input_tokens": estimate_in,
                "output_tokens": reserve_out})])
            # The permit is released when the call really ends (bind): one abandoned
            # after a cancel it swallowed keeps its slot while it goes on.
            response = await _invoke_provider(
                caller, request, functools.partial(run.admission.bind, ticket))
            break
        except IncompleteStreamError:
            if attempt + 1 == STREAM_ATTEMPTS:
                raise
        finally:
            run.admission.release(ticket)
    text = response.model_dump_json()
    extra = beyond_reservation(response.usage, estimate_in, reserve_out,
                               admission_id(caller.incarnation, f"usage:{req_digest}"),
                               caller.node_id)
    limit = run.max_blob_bytes
    size = bytes_over(text, limit)
    if size is not None:
        assert limit is not None
        # The store would refuse its blob (and every re-run would pay for the call
        # again): its usage is charged and the refusal journaled instead, so a re-run
        # ends the same way without asking the model.
        refusal = {"bytes": size, "limit": limit}
        await run.submit([AppendJournal(kind=caller.journal_kind, node_id=caller.node_id,
                                        data={"request_digest": req_digest,
                                              "too_large": refusal,
                                              "usage": response.usage.model_dump()}),
                          *extra], clamp=True)
        run.agent_records.refused[(owner, req_digest)] = refusal
        raise _too_large(caller, size, limit)
    resp_digest = digest_text(text)
    steps: list[Any] = [
        AppendJournal(kind=caller.journal_kind, node_id=caller.node_id, data={
            "request_digest": req_digest, "digest": resp_digest,
            "usage": response.usage.model_dump(),
            # An agent's answers name their model (checked when the node restarts).
            **({"provider": provider_pin(caller.provider)}
               if caller.journal_kind == MODEL_KIND else {})}),
        *extra]
    return Fetched(response, req_digest, resp_digest, steps, {resp_digest: text})


def _too_large(caller: ModelCaller, size: int, limit: int) -> ResponseTooLargeError:
    return ResponseTooLargeError(
        f"the model response to {_who(caller)} is {size} bytes as JSON, more than the "
        f"{limit} bytes the store keeps in one record (StoreCapabilities.max_blob_bytes), so "
        "it cannot be journaled; its usage was charged and the request is not asked "
        "again. Ask for a shorter answer (lower max_output_tokens, clearer instructions) "
        "in a new version, then create a new task", node_id=caller.node_id,
        details={"bytes": size, "limit": limit})


def _first_line(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic's ValidationError: its first error, with its field
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    text = exception_text(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def beyond_reservation(usage: Usage, estimate_in: int, reserve_out: int, adm: str,
                       node_id: str | None) -> list[Charge]:
    """The charge for usage beyond what was reserved before a model call (none if none).

    The usage already happened: its submission is made with ``clamp=True``, so the drain
    charges it up to the limits (:func:`clamp_usage`) and journals the rest as
    ``usage_over_limit``; refusing it would lose the response that was paid for."""
    extra = {name: amount for name, amount in (
        ("input_tokens", usage.input_tokens - estimate_in),
        ("output_tokens", usage.output_tokens - reserve_out)) if amount > 0}
    return [Charge(admission_id=adm, node_id=node_id, charges=extra)] if extra else []


def clamp_usage(run: TaskRun, steps: list[Any], pending: dict[str, int]) -> list[Any]:
    """``steps`` with their Charge amounts cut to what the limits leave after ``pending``;
    what was cut is added to ``usage_over_limit`` of the first journal entry with usage."""
    over: dict[str, int] = {}
    out: list[Any] = []
    for step in steps:
        if isinstance(step, Charge):
            fitted: dict[str, int] = {}
            for name, amount in step.charges.items():
                # An unlimited counter still stays what every store keeps (int64).
                limit = run.header.limits.get(name)
                limit = MAX_TOKENS if limit is None else limit
                used = run.header.counters.get(name, 0) + pending.get(name, 0)
                room = max(0, min(amount, limit - used))
                if room:
                    fitted[name] = room
                if room < amount:
                    over[name] = over.get(name, 0) + amount - room
            if fitted:
                out.append(step.model_copy(update={"charges": fitted}))
        else:
            out.append(step)
    if over:
        for i, step in enumerate(out):
            if isinstance(step, AppendJournal) and "usage" in step.data:
                known = dict(step.data.get("usage_over_limit") or {})
                for name, amount in over.items():
                    known[name] = known.get(name, 0) + amount
                out[i] = step.model_copy(update={"data": {**step.data,
                                                          "usage_over_limit": known}})
                break
    return out


async def _model_call(run: TaskRun, spec: NodeSpec, incarnation: str, agent: Any,
                      request: ModelRequest) -> ModelResponse:
    caller = ModelCaller(node_id=spec.id, incarnation=incarnation, provider=agent.provider,
                         stream=agent.stream, timeout=run.rt.effect_timeout,
                         timeout_setting="ExecutionGraphRuntime(effect_timeout=...)",
                         task_key=run.key)
    fetched = await fetch_response(
        run, caller, request,
        lambda problem: AgentFailure(f"agent node {spec.id!r}: {problem}", node_id=spec.id))
    if not fetched.replayed:
        await run.submit(fetched.steps, fetched.blobs, clamp=True)
        run.agent_records.responses[(spec.id, fetched.request_digest)] = \
            fetched.response_digest
    return fetched.response


async def _invoke_provider(caller: ModelCaller, request: ModelRequest,
                           started: Callable[[asyncio.Task[Any]], None]) -> ModelResponse:
    """One provider call, bounded by ``caller.timeout``, its response checked whole
    (:func:`check_response`: a malformed one is a typed error before anything is
    journaled).

    The call runs in a task of its own (:func:`_abandon.call`). When the limit passes, or
    the caller is canceled (task cancel, deadline, a stop of the run), that task is canceled
    and given :data:`_abandon.GRACE` seconds to end; a provider that swallows the
    cancellation is then abandoned (logged), so it cannot hold the node, and the task,
    running forever. ``started`` is given that task (its permit lasts as long)."""
    # The provider's own errors (its transport's TimeoutError too): as they are for the
    # planner (whose failure names them), typed for an agent node.
    try:
        response = await _abandon.call(_provider_call(caller, request), caller.timeout,
                                       _who(caller, provider=True),
                                       name=f"model-call:{caller.incarnation}",
                                       started=started)
    except AgentiumGraphError:
        raise
    except Exception as exc:
        if caller.node_id is None:
            raise
        raise ProviderError(
            f"{_who(caller)}: its model provider raised {type(exc).__name__}: "
            f"{exception_text(exc)}; the node failed (failed work stays failed, its "
            "reservation stays charged): let the provider retry transient errors itself "
            "(its client's retries), or fix it", node_id=caller.node_id,
            details={"exception_type": type(exc).__qualname__}) from exc
    if response is None:
        raise ProviderTimeoutError(
            f"the model call {'stream' if caller.stream else 'request'} of "
            f"{_who(caller)} did not finish within {caller.timeout:g} s, the limit set by "
            f"{caller.timeout_setting}; raise it if the model needs longer, or make the "
            "provider answer sooner (its reservation stays charged)",
            node_id=caller.node_id,
            details={"timeout_seconds": caller.timeout, "limit": caller.timeout_setting,
                     "stream": caller.stream})
    return response


async def _provider_call(caller: ModelCaller, request: ModelRequest) -> ModelResponse:
    if not caller.stream:
        return await call_complete(caller.provider, request)
    # The permit is held until the stream is closed, also when it ends early.
    stream = open_stream(caller.provider, request)
    try:
        return await assemble_stream(stream)
    finally:
        await close_stream(stream)


def _who(caller: ModelCaller, *, provider: bool = False) -> str:
    """The planner or the agent node that makes the call (``provider``: with its task and
    its provider, as a log line names them)."""
    who = "the planner" if caller.node_id is None else f"agent node {caller.node_id!r}"
    if not provider:
        return who
    return f"the model call of {who} of task {caller.task_key!r} to " \
           f"{_abandon.provider_name(caller.provider)}"


async def _tool_call(run: TaskRun, spec: NodeSpec, tools: dict[str, ToolBinding],
                     call: ToolCall, key: str) -> Any:
    recorded = run.agent_records.tools.get((spec.id, key))
    if recorded is not None:
        return json.loads(await _blob(run, recorded, spec))
    refused = _refusal(run, spec, tools, call)
    if refused is not None:
        raise refused
    tool = tools[call.name]
    if tool.connector is not None:
        sub = NodeSpec(id=spec.id, local=spec.local, scope=spec.scope, binding=tool,
                       args=call.arguments, refs=(), deps=())
        return await _unpreempted(run, _effect_tool(run, spec, sub, call, key),
                                  f"the call {key} of tool {tool.id!r} by agent node "
                                  f"{spec.id!r} of task {run.key!r} through "
                                  f"{_abandon.named('connector', tool.connector)}",
                                  name=f"effect:{run.key}:{spec.id}:{key}", node_id=spec.id)
    return await _journal(run, spec, tool, call, key,
                          await _pure_call(run, spec, tool, call, key))


def _past_allowance(refused: NodeFailedError, allowance: int) -> NodeFailedError:
    """The refusal that fails the node: the first wrong call by default, else the one past
    ``max_tool_errors``, which the message then names (it is not the first)."""
    if allowance == 0:
        return refused
    return _CallRefused(f"{refused}; that is refused call {allowance + 1} of this node, past "
                        f"its max_tool_errors={allowance} (raise it to let the model correct "
                        "more calls)", node_id=refused.node_id,
                        details={**refused.details, "refused": allowance + 1,
                                 "max_tool_errors": allowance})


def _refusal(run: TaskRun, spec: NodeSpec, tools: dict[str, ToolBinding],
             call: ToolCall) -> NodeFailedError | None:
    """Why the model's ``call`` cannot be made (a :class:`_CallRefused`), or None."""
    tool = tools.get(call.name)
    if tool is None:
        return _CallRefused(f"agent node {spec.id!r}: the model called tool {call.name!r}, "
                            f"which this agent may not use (allowed: {sorted(tools)})",
                            node_id=spec.id, details={"tool": call.name, "call_id": call.id})
    if run.grants is not None and tool.id not in run.grants:
        return _CallRefused(f"agent node {spec.id!r}: tool {tool.id!r} is not granted to this "
                            "task", node_id=spec.id, details={"tool": tool.id})
    errors = tool.input_errors(call.arguments)
    if errors:
        return schema_error(_CallRefused, spec.id,
                            f"tool call {call.id} ({tool.id}) arguments", errors[0])
    return None


async def _effect_tool(run: TaskRun, spec: NodeSpec, sub: NodeSpec, call: ToolCall,
                       key: str) -> Any:
    tool = sub.binding
    assert isinstance(tool, ToolBinding)
    return await _journal(run, spec, tool, call, key,
                          await _effect_call(run, spec, sub, call, key))


async def _unpreempted(run: TaskRun, work: Coroutine[Any, Any, Any], who: str, *,
                       name: str, node_id: str) -> Any:
    """Await ``work`` (an effect call and its journaling) in a task of its own that a stop
    of the run does not cancel: accepted remote work must still get its receipt (or its
    failed dispatch a reconciliation). When the agent was canceled meanwhile, the
    cancellation goes on once ``work`` ended, unless ``work`` ended the node itself
    (uncertain, failed). A second cancellation, or one while the run is not stopping
    (it abandons its work), cancels ``work`` as an effect node's would be, and waits for
    it at most twice :data:`_abandon.GRACE` (the dispatch or lookup in it gets one grace
    itself): ``work`` still running then is abandoned (a warning naming ``who``), and the
    action stays ``dispatching`` for the next run to reconcile. Meanwhile a live stop does
    not abandon the agent itself (``effects`` of its running node)."""
    inner = asyncio.create_task(work, name=name)
    stopping: asyncio.CancelledError | None = None
    node = run.running.get(node_id)
    if node is not None:
        node.effects += 1
    try:
        while not inner.done():
            try:
                await asyncio.wait({inner})
            except asyncio.CancelledError as exc:
                if stopping is not None or not _effects_settle(run):
                    await _abandon.stop(inner, who, "the run abandons its work",
                                        party=_abandon.CONNECTOR, grace=2 * _abandon.GRACE)
                    raise
                stopping = exc
    finally:
        if node is not None:
            node.effects -= 1
    if stopping is None or inner.cancelled() or inner.exception() is not None:
        return inner.result()
    raise stopping


def _effects_settle(run: TaskRun) -> bool:
    """Whether a cancellation of the agent is a stop of a live run (cancel, deadline), which
    waits for an effect in flight, rather than the run abandoning its work."""
    return run.lost is None and run.stop is not None and \
        run.stop.reason in ("canceled", "deadline")


async def _journal(run: TaskRun, spec: NodeSpec, tool: ToolBinding, call: ToolCall,
                   key: str, outcome: Outcome) -> Any:
    """Journal a tool call's result (and its action's receipt) and return its output, or
    end the node as the outcome says."""
    if outcome.state in ("uncertain", "budget", "canceled"):
        if outcome.state == "budget" and isinstance(outcome.exception, BudgetExhaustedError):
            raise outcome.exception
        raise _Settled(outcome)
    if outcome.state != "completed":
        info = outcome.error or ErrorInfo(code="agent_tool_failed", message=outcome.state)
        error = AgentFailure(f"agent node {spec.id!r}: tool call {call.id} ({tool.id}) "
                             f"{outcome.state}: {info.message}", node_id=spec.id,
                             details={"tool": tool.id, "call_id": call.id}, cause=info)
        if outcome.action is None:
            raise error
        # The action is settled too (e.g. rejected: proved absent), with the node's failure.
        raise _Settled(Outcome("failed", error=ErrorInfo.from_exception(error),
                               exception=error, action=outcome.action))
    assert outcome.text is not None and outcome.digest is not None
    # "call_id" is the call's key (the model's own id the first time it is used).
    steps: list[Any] = [AppendJournal(kind=TOOL_KIND, node_id=spec.id, data={
        "call_id": key, "tool": tool.id, "digest": outcome.digest})]
    if outcome.action is not None:
        steps.insert(0, RecordAction(action=outcome.action))
    await run.submit(steps, {outcome.digest: outcome.text})
    run.agent_records.tools[(spec.id, key)] = outcome.digest
    return outcome.output


async def _pure_call(run: TaskRun, spec: NodeSpec, tool: ToolBinding, call: ToolCall,
                     key: str) -> Outcome:
    rec = run.nodes[spec.id]
    adm = admission_id(rec.incarnation_id, f"tool:{key}:{run.fence}")
    ticket = await _permit(run, spec.id, adm)
    try:
        await run.submit([Charge(admission_id=adm, node_id=spec.id,
                                 charges={"work_attempts": 1, "tool_calls": 1})])
        # The agent node's own cancel flag (set when the run stops: cancel, deadline, lost
        # lease), so a sync tool sees tool_context().cancelled / wait_cancelled() as it
        # would as a plan node.
        node = run.running.get(spec.id)
        ctx = ToolContext(key=run.key, node_id=spec.id, attempt=len(rec.attempts),
                          attempt_id=rec.attempts[-1].attempt_id, fence=run.fence,
                          worker_id=run.worker_id, binding=tool.id, version=tool.version,
                          _cancel=CancelFlag() if node is None else node.ctx._cancel)
        sub = NodeSpec(id=spec.id, local=spec.local, scope=spec.scope, binding=tool,
                       args=call.arguments, refs=(), deps=())
        return await invoke_tool(run, sub, dict(call.arguments), ctx)
    finally:
        run.admission.release(ticket)


async def _effect_call(run: TaskRun, spec: NodeSpec, sub: NodeSpec, call: ToolCall,
                       key: str) -> Outcome:
    """A connector-backed tool called by the agent: the same ledger as a tool node, with
    the call's key as the call id of the action's identity."""
    tool = sub.binding
    assert isinstance(tool, ToolBinding)
    rec = run.nodes[spec.id]
    args = dict(call.arguments)
    act = effects.action_id_for(run, rec, tool, args, call_id=key)
    ticket = await _permit(run, spec.id, effects.planned_admission(run, act)
                           if run.admission.observed else None)
    try:
        existing = run.actions.get(act)
        if existing is None or existing.state == "intent":
            steps, _, _ = effects.start_steps(run, sub, rec, "", args, "", call_id=key)
            await run.submit(steps[1:])  # no new node attempt: the agent's attempt covers it
        return await effects.execute_effect(run, sub, args, call_id=key, permit=ticket)
    finally:
        run.admission.release(ticket)


async def _blob(run: TaskRun, blob_digest: str, spec: NodeSpec) -> str:
    blobs = await read_verified(run.store, [blob_digest])
    problem = blobs.problem(blob_digest)
    if problem is not None:
        raise AgentFailure(f"agent node {spec.id!r}: journaled record {blob_digest} is "
                           f"{problem}; the store was modified", node_id=spec.id)
    return blobs.texts[blob_digest]
