"""A worker process for the review-17 recovery cases:
``python -m acceptance._review17_worker '<json config>'``.

The destination is a file (``dest.jsonl``) shared by every process of a case: a dispatch
appends the action it applied (fsynced), a lookup reads it back, so the test counts what
the destination applied across kills. Every dispatch and lookup call is logged
(``calls.jsonl``) before it does anything. Kill points: inside the connector
(``connector_kill``: ``dispatch_before_apply``, ``dispatch_after_apply``, ``lookup``) or at a
store boundary (:class:`Kills`, a :class:`~acceptance._worker.KillSwitch` with more points).

Graphs: ``effect`` (prep -> pay (connector) -> done), ``agent`` (an agent whose model calls
the connector tool ``pay``, then answers), ``planner`` (a planner, complete mode, whose plan
is the effect graph).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from acceptance._stores import open_store
from acceptance._worker import KillSwitch
from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    AgentiumGraphError,
    DurableTaskStore,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlannerConfig,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ToolCall, Usage
from agentium_graph.store import (
    AppendJournal,
    CommitRequest,
    CommitResult,
    CommitRevision,
    RecordAction,
)
from agentium_graph.testing import PartialStream, ScriptedProvider, ScriptedTurn, TurnMatch

AMOUNT = 5


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def append(path: Path, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


class FileDestination:
    """A connector whose destination is a file; ``lookup``: normal | unknown | raise."""

    id = "file-dest"
    version = "1"

    def __init__(self, folder: Path, *, idempotent: bool, lookup: str, kill: str | None
                 ) -> None:
        self.dest = folder / "dest.jsonl"
        self.calls = folder / "calls.jsonl"
        self.idempotent_destination = idempotent
        self.lookup = lookup
        self.kill = kill

    def _applied(self, action_id: str) -> dict[str, Any] | None:
        found = [r for r in read(self.dest) if r["action_id"] == action_id]
        return found[0] if found else None

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        append(self.calls, {"call": "dispatch", "action_id": request.action_id,
                            "pid": os.getpid()})
        if self.kill == "dispatch_before_apply":
            die()
        known = self._applied(request.action_id) if self.idempotent_destination else None
        if known is None:
            known = {"action_id": request.action_id, "amount": request.args["amount"],
                     "pid": os.getpid()}
            append(self.dest, known)
        if self.kill == "dispatch_after_apply":
            die()
        return ActionOutcome(output={"charged": known["amount"]},
                             result_ref=request.action_id)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        append(self.calls, {"call": "lookup", "action_id": result_ref, "pid": os.getpid()})
        if self.kill == "lookup":
            die()
        if self.lookup == "unknown":
            return Unknown("the lookup service is down")
        if self.lookup == "raise":
            raise ConnectionError("lookup refused")
        known = self._applied(result_ref)
        if known is None:
            return Absent()
        return ActionOutcome(output={"charged": known["amount"]}, result_ref=result_ref)


class Kills(KillSwitch):
    """More store boundaries: ``after_intent_commit`` (the commit that records an action
    ``dispatching``), ``before_receipt_commit`` (the commit that confirms one),
    ``after_tool_result`` (the commit journaling an agent's tool result),
    ``before_plan_commit`` (the commit of a planner's accepted proposal)."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.point == "before_receipt_commit" and self._actions(request, "confirmed"):
            die()
        if self.point == "before_plan_commit" and any(
                isinstance(s, CommitRevision) for s in request.steps):
            die()
        result = await super().commit(request)
        if self.point == "after_intent_commit" and self._actions(request, "dispatching"):
            die()
        if self.point == "after_tool_result" and any(
                isinstance(s, AppendJournal) and s.kind == "agent_tool_result"
                for s in request.steps):
            die()
        return result

    @staticmethod
    def _actions(request: CommitRequest, state: str) -> bool:
        return any(isinstance(s, RecordAction) and s.action.state == state
                   for s in request.steps)


def effect_plan() -> dict[str, Any]:
    return {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "prep", "binding": "prep", "version": "1", "args": {"amount": AMOUNT}},
        {"id": "pay", "binding": "pay", "version": "1",
         "args": {"amount": {"$ref": {"node": "prep", "path": ["amount"]}}}},
        {"id": "done", "binding": "done", "version": "1",
         "args": {"charge": {"$ref": {"node": "pay", "path": ["charged"]}}}}]}


def agent_script(variant: str) -> list[ScriptedTurn]:
    first = ScriptedTurn(tool_calls=(ToolCall(id="call-pay", name="pay",
                                              arguments={"amount": AMOUNT}),),
                         usage=Usage(input_tokens=20, output_tokens=10),
                         match=TurnMatch(assistant_turns=0))
    last = ScriptedTurn(text="paid", usage=Usage(input_tokens=40, output_tokens=4),
                        match=TurnMatch(assistant_turns=1))
    if variant == "hang-last":  # the answer after the tool's receipt hangs mid-stream
        last = last.model_copy(update={"partial_stream_then_fail": PartialStream(
            events=1, ending="hang")})
        return [first, last, ScriptedTurn(text="paid", usage=Usage(input_tokens=40,
                                                                   output_tokens=4),
                                          match=TurnMatch(assistant_turns=1))]
    return [first, last]


def planner_script() -> list[ScriptedTurn]:
    return [ScriptedTurn(text=json.dumps(effect_plan()),
                         usage=Usage(input_tokens=300, output_tokens=60))] * 3


def build(config: dict[str, Any]) -> tuple[HostCatalog, ExecutionGraphProgram]:
    folder = Path(config["folder"])
    connector = FileDestination(folder, idempotent=config.get("idempotent", False),
                                lookup=config.get("lookup", "normal"),
                                kill=config.get("connector_kill"))
    num = {"type": "object", "properties": {"amount": {"type": "integer"}},
           "required": ["amount"]}
    charged = {"type": "object", "properties": {"charged": {"type": "integer"}},
               "required": ["charged"]}

    async def prep(args: dict[str, Any]) -> dict[str, Any]:
        return {"amount": args["amount"]}

    async def done(args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": args["charge"] == AMOUNT}

    provider_log = str(folder / "provider.log")
    bindings: list[Any] = [
        ToolBinding(id="prep", version="1", execute=prep, recovery="pure",
                    input_schema=num, output_schema=num),
        ToolBinding(id="pay", version="1", connector=connector, destination="file://dest",
                    description="charge an amount", input_schema=num,
                    output_schema=charged),
        ToolBinding(id="done", version="1", execute=done, recovery="pure"),
        AgentBinding(id="clerk", version="1", agent=Agent(
            provider=ScriptedProvider(agent_script(config.get("script", "normal")),
                                      call_log_path=provider_log),
            instructions="Charge the amount.", tools=("pay",), max_output_tokens=32,
            stream=True)),
    ]
    graph = config.get("graph", "effect")
    if graph == "agent":
        prog = ExecutionGraphProgram(id="agent", version="1", plan={
            "schemaVersion": 1, "revision": 1, "nodes": [
                {"id": "ask", "binding": "clerk", "version": "1",
                 "args": {"prompt": "charge it"}}]})
    elif graph == "planner":
        prog = ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
            provider=ScriptedProvider(planner_script(), call_log_path=provider_log),
            host_instructions="Plan the payment.", max_corrections=2,
            max_output_tokens=400))
    else:
        prog = ExecutionGraphProgram(id="effect", version="1", plan=effect_plan())
    return HostCatalog(bindings), prog


async def main(config: dict[str, Any]) -> dict[str, Any]:
    store: DurableTaskStore = Kills(open_store(config["store"]), config.get("kill_at", "none"),
                                    config.get("node"))
    cat, prog = build(config)
    runtime = ExecutionGraphRuntime(
        catalog=cat, store=store, require_durable=True, lease_ttl=5.0, poll_interval=0.05,
        lookup_timeout=2.0, programs=[prog] if prog.planner is not None else ())
    try:
        if config.get("create", False):
            deadline = config.get("deadline_s")
            await runtime.create(config["key"], prog, budgets=config.get("budgets"),
                                 deadline=None if deadline is None
                                 else timedelta(seconds=deadline))
        if config.get("op") == "cancel":
            view = await runtime.cancel(config["key"], reason="operator cancel")
            return {"ok": True, "status": view.status}
        result = await runtime.run(config["key"], config.get("worker", "w1"))
        return {"ok": True, "output": result.output}
    except AgentiumGraphError as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc),
                "details": exc.details}
    finally:
        await store.close()


if __name__ == "__main__":
    outcome = asyncio.run(main(json.loads(sys.argv[1])))
    print(json.dumps(outcome))
