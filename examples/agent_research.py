"""A provider-free agent example: a scripted model calls catalog tools inside a graph.

The "research" agent looks up two facts with a pure tool and answers; a nested graph then
formats a report, and a bounded repeat polishes it twice. The model is the deterministic
ScriptedProvider from agentium_graph.providers, so this runs anywhere without credentials.

Run: python examples/agent_research.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from agentium_graph import (
    Agent,
    AgentBinding,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    RepeatBinding,
    ToolBinding,
)
from agentium_graph.providers import ScriptedProvider, ScriptedTurn, ToolCall, TurnMatch, Usage
from agentium_graph_sqlite import SQLiteDurableTaskStore

FACTS = {"boiling_point_c": 100, "freezing_point_c": 0}


async def lookup_fact(args: dict[str, Any]) -> dict[str, Any]:
    return {"name": args["name"], "value": FACTS[args["name"]]}


async def format_report(args: dict[str, Any]) -> dict[str, Any]:
    return {"text": f"# Water\n\n{args['answer']}"}


async def polish(args: dict[str, Any]) -> dict[str, Any]:
    return {"text": args["text"].rstrip(".") + "."}


provider = ScriptedProvider([
    ScriptedTurn(tool_calls=(
        ToolCall(id="c1", name="lookup_fact", arguments={"name": "boiling_point_c"}),
        ToolCall(id="c2", name="lookup_fact", arguments={"name": "freezing_point_c"})),
        usage=Usage(input_tokens=120, output_tokens=30), match=TurnMatch(assistant_turns=0)),
    ScriptedTurn(text="Water boils at 100 C and freezes at 0 C",
                 usage=Usage(input_tokens=180, output_tokens=12),
                 match=TurnMatch(assistant_turns=1)),
])

report = ExecutionGraphProgram(id="report", version="1", plan={
    "schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "format", "binding": "format_report", "version": "1",
         "args": {"answer": {"$ref": {"node": "$input", "path": ["answer"]}}}}]})
polish_once = ExecutionGraphProgram(id="polish", version="1", plan={
    "schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "polish", "binding": "polish", "version": "1",
         "args": {"text": {"$ref": {"node": "$input", "path": ["text"]}}}}]})

catalog = HostCatalog([
    ToolBinding(id="lookup_fact", version="1", execute=lookup_fact, recovery="pure",
                description="Look up a physical constant of water by name.",
                input_schema={"type": "object", "required": ["name"],
                              "properties": {"name": {"enum": sorted(FACTS)}}}),
    ToolBinding(id="format_report", version="1", execute=format_report, recovery="pure"),
    ToolBinding(id="polish", version="1", execute=polish, recovery="pure"),
    AgentBinding(id="researcher", version="1", agent=Agent(
        provider=provider, instructions="Answer using lookup_fact; cite numbers.",
        tools=("lookup_fact",), max_output_tokens=200),
        input_schema={"type": "object", "required": ["prompt"]}),
    GraphBinding(id="report", version="1", program=report),
    RepeatBinding(id="polish_loop", version="1", program=polish_once, max_iterations=2,
                  condition=lambda state: True),
])

program = ExecutionGraphProgram(id="water-report", version="1", plan={
    "schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "research", "binding": "researcher", "version": "1",
         "args": {"prompt": "At what temperatures does water boil and freeze?"}},
        {"id": "report", "binding": "report", "version": "1",
         "args": {"answer": {"$ref": {"node": "research", "path": ["text"]}}}},
        {"id": "final", "binding": "polish_loop", "version": "1",
         "args": {"text": {"$ref": {"node": "report", "path": ["format", "text"]}}}}]})


async def main() -> str:
    with tempfile.TemporaryDirectory(prefix="agentium-agent-") as tmp:
        async with SQLiteDurableTaskStore(Path(tmp) / "tasks.db") as store:
            runtime = ExecutionGraphRuntime(catalog=catalog, store=store, require_durable=True)
            await runtime.create("water-report", program)
            result = await runtime.run("water-report", worker_id="w1")
            text: str = result.output["final"]["last"]["polish"]["text"]
            usage = result.output["research"]["usage"]
            print(text)
            print(f"model calls: {usage['model_calls']}, tokens in/out: "
                  f"{usage['input_tokens']}/{usage['output_tokens']}")
            return text


if __name__ == "__main__":
    asyncio.run(main())
