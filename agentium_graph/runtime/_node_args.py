"""A node's args at run time: references resolved against the run's outputs and checked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentium_graph._canonical import json_copy
from agentium_graph.errors import NodeInputError
from agentium_graph.plan._validate import resolve_args
from agentium_graph.runtime import _containers as containers
from agentium_graph.runtime._graph import NodeSpec
from agentium_graph.runtime._outcome import schema_error

if TYPE_CHECKING:
    from agentium_graph.runtime._run import TaskRun


def _ref_values(run: TaskRun, node: NodeSpec) -> dict[str, Any]:
    """What ``node``'s references name: the task's or its container's input, a repeat's
    previous outputs and the outputs of the nodes it reads."""
    scope = run.graph.scopes[node.scope]
    values: dict[str, Any] = {}
    for ref in node.refs:
        if ref.node == "$input":
            values["$input"] = run.task_input if scope.parent is None else \
                run.container_args.get(scope.parent)
        elif ref.node == "$previous":
            values["$previous"] = containers.previous_outputs(run, node)
        elif node.scope + ref.node in run.outputs:
            values[ref.node] = run.outputs[node.scope + ref.node]
    return values


def prepare_args(run: TaskRun, node: NodeSpec) -> dict[str, Any]:
    """``node``'s args for this run: its ``$ref`` values filled in from the run's outputs
    (or a copy of its static args), checked against the binding's input schema.
    NodeInputError names the node when a reference is missing or resolves to no object."""
    try:
        # Static args are copied too: a tool that mutates its args must not change the
        # plan (a retry would see different input).
        args: dict[str, Any] = resolve_args(node.args, _ref_values(run, node)) \
            if node.refs or node.literal else json_copy(node.args, trusted=True)
    except LookupError as exc:
        raise NodeInputError(f"node {node.id!r}: {exc}", node_id=node.id) from None
    if not isinstance(args, dict):
        # A $ref standing for the whole args resolved to something else: no tool,
        # connector or agent is handed it (and no action intent is recorded for it).
        ref = node.args["$ref"] if isinstance(node.args, dict) and "$ref" in node.args \
            else None
        where = f"$ref {ref.get('node')!r}" if isinstance(ref, dict) else "its args"
        raise NodeInputError(
            f"node {node.id!r}: its args ({where}, standing for the whole args) resolved "
            f"to {_json_kind(args)}, but a node's args must be an object; point the $ref "
            "at an object, or name the value: {\"value\": {\"$ref\": ...}}",
            node_id=node.id, details={"resolved": _json_kind(args)})
    if node.refs:
        errors = node.binding.input_errors(args)
        if errors:
            raise schema_error(NodeInputError, node.id, "resolved args", errors[0])
    return args


def _json_kind(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages ("an array", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
