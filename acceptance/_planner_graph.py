"""The planner acceptance program: a scripted planner whose first proposal is rejected
(unknown binding) and whose correction is the acceptance graph of :mod:`acceptance._graph`.

Provider calls are logged to a file shared by every process of a case, so a test counts
them across kills.
"""

from __future__ import annotations

import json
from typing import Any

from acceptance._graph import FAN, plan
from agentium_graph import ExecutionGraphProgram, PlanLimits, PlannerConfig
from agentium_graph.providers import Usage
from agentium_graph.testing import PartialStream, ScriptedProvider, ScriptedTurn, TurnMatch

WRONG = {"schemaVersion": 1, "revision": 1, "nodes": [
    {"id": "a", "binding": "teleport", "version": "1", "args": {}}]}


def script(variant: str) -> list[ScriptedTurn]:
    usage = Usage(input_tokens=300, output_tokens=60)
    first = ScriptedTurn(text=json.dumps(WRONG), usage=usage,
                         match=TurnMatch(metadata={"proposal": 0}))
    if variant == "hang":  # the first call never answers: the worker is killed inside it
        first = first.model_copy(update={"partial_stream_then_fail": PartialStream(
            events=0, ending="hang")})
    return [first, ScriptedTurn(text=json.dumps(plan()), usage=usage,
                                match=TurnMatch(metadata={"proposal": 1}))]


PREFIX = ("a", "b")  # what the streamed planner's first frame plans


def stream_script(rejected_first: bool = False) -> list[ScriptedTurn]:
    """Stream mode: a call sends a frame with the prefix a -> b, then hangs (the worker is
    killed while a and b run); the continuation sends the whole graph. With
    ``rejected_first`` a call with a frame that names an unknown binding comes before."""
    usage = Usage(input_tokens=300, output_tokens=60)
    whole = plan()
    prefix = {**whole, "nodes": [n for n in whole["nodes"] if n["id"] in PREFIX]}
    first = json.dumps({"baseRevision": 0, "plan": prefix}) + "\n"
    rest = json.dumps({"baseRevision": 1, "plan": {**whole, "revision": 2}}) + "\n"
    turns: list[ScriptedTurn] = []
    if rejected_first:
        turns.append(ScriptedTurn(text=json.dumps({"baseRevision": 0, "plan": WRONG}) + "\n",
                                  usage=usage, match=TurnMatch(metadata={"call": 0})))
    call = len(turns)
    return [*turns,
            ScriptedTurn(text=first, usage=usage, match=TurnMatch(metadata={"call": call}),
                         partial_stream_then_fail=PartialStream(events=1, ending="hang")),
            ScriptedTurn(text=rest, usage=usage, match=TurnMatch(metadata={"call": call + 1}))]


def program(config: dict[str, Any]) -> ExecutionGraphProgram:
    stream = str(config.get("script", "")).startswith("stream")
    turns = stream_script(config.get("script") == "stream-rejected") if stream else \
        script(config.get("script", "normal"))
    provider = ScriptedProvider(turns, call_log_path=config["provider_log"], chunks=1)
    return ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
        provider=provider, host_instructions="Plan the acceptance pipeline.",
        max_corrections=2, max_output_tokens=400, mode="stream" if stream else "complete"),
        limits=PlanLimits(max_concurrency=FAN))
