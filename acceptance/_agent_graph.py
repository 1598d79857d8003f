"""The agent/nesting acceptance graph: ask (agent) -> nested (graph) -> loop (repeat) -> final.

The agent streams from a :class:`ScriptedProvider` whose calls are logged to a file shared
by every process of a case, so the test counts provider calls across kills.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from acceptance._graph import CallLog
from agentium_graph import (
    Agent,
    AgentBinding,
    ExecutionGraphProgram,
    GraphBinding,
    HostCatalog,
    RepeatBinding,
    ToolBinding,
    tool_context,
)
from agentium_graph.providers import ToolCall, Usage
from agentium_graph.testing import PartialStream, ScriptedProvider, ScriptedTurn, TurnMatch

NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}
EXPECTED = {"ask": "rate is 7", "nested": {"x": {"value": 8}, "y": {"value": 16}},
            "loop": {"iterations": 3, "stopped": "max_iterations",
                     "last": {"step": {"value": 17}}},
            "final": {"value": 33}}


def _ref(node: str, *path: Any) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


def program() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="agentic", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "ask", "binding": "analyst", "version": "1",
             "args": {"prompt": "What is the rate?"}},
            {"id": "nested", "binding": "sub", "version": "1", "args": {"x": 7},
             "dependsOn": ["ask"]},
            {"id": "loop", "binding": "loop", "version": "1",
             "args": {"start": _ref("nested", "y", "value")}},
            {"id": "final", "binding": "add", "version": "1",
             "args": {"a": _ref("nested", "y", "value"),
                      "b": _ref("loop", "last", "step", "value")}}]})


def script(variant: str) -> list[ScriptedTurn]:
    first = ScriptedTurn(tool_calls=(ToolCall(id="call-rate", name="lookup",
                                              arguments={"what": "rate"}),),
                         usage=Usage(input_tokens=20, output_tokens=10),
                         match=TurnMatch(assistant_turns=0))
    if variant == "hang":
        first = first.model_copy(update={"partial_stream_then_fail": PartialStream(
            events=1, ending="hang")})
    return [first, ScriptedTurn(text="rate is 7", usage=Usage(input_tokens=40, output_tokens=4),
                                match=TurnMatch(assistant_turns=1))]


def catalog(log: CallLog, config: dict[str, Any]) -> HostCatalog:
    provider = ScriptedProvider(script(config.get("script", "normal")),
                                call_log_path=config["provider_log"])
    kill_in_tool = config.get("kill_in_tool")

    def record() -> None:
        log.record("start")
        if kill_in_tool is not None and tool_context().node_id == kill_in_tool:
            os.kill(os.getpid(), signal.SIGKILL)

    async def lookup(args: dict[str, Any]) -> dict[str, Any]:
        record()
        return {"rate": 7}

    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        record()
        return {"value": args["x"] + 1}

    async def double(args: dict[str, Any]) -> dict[str, Any]:
        record()
        return {"value": args["x"] * 2}

    async def add(args: dict[str, Any]) -> dict[str, Any]:
        record()
        return {"value": args["a"] + args["b"]}

    sub = ExecutionGraphProgram(id="sub", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "x", "binding": "inc", "version": "1", "args": {"x": _ref("$input", "x")}},
            {"id": "y", "binding": "double", "version": "1", "args": {"x": _ref("x", "value")}}]})
    # Each iteration adds one to the loop's start; the last one is what "final" reads.
    step = ExecutionGraphProgram(id="step", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "step", "binding": "add", "version": "1",
             "args": {"a": _ref("$input", "start"), "b": 1}}]})
    return HostCatalog([
        ToolBinding(id="lookup", version="1", execute=lookup, recovery="pure"),
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure", output_schema=NUM),
        ToolBinding(id="double", version="1", execute=double, recovery="pure",
                    output_schema=NUM),
        ToolBinding(id="add", version="1", execute=add, recovery="pure", output_schema=NUM),
        AgentBinding(id="analyst", version="1", agent=Agent(
            provider=provider, instructions="Answer with the rate.", tools=("lookup",),
            max_output_tokens=32, stream=True)),
        GraphBinding(id="sub", version="1", program=sub),
        RepeatBinding(id="loop", version="1", program=step, max_iterations=3,
                      condition=lambda s: True),
    ])
