"""What a leaf execution hands back to the scheduler, and output checking."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.exceptions import ValidationError as SchemaValidationError

from agentium_graph._canonical import (
    NotJSONError,
    checked_json,
    digest_text,
    json_path,
)
from agentium_graph.catalog._bindings import Binding
from agentium_graph.errors import (
    ErrorInfo,
    NodeFailedError,
    NodeInputError,
    NodeOutputError,
    exception_text,
)
from agentium_graph.store._records import ActionRecord

OutcomeState = Literal["completed", "failed", "canceled", "uncertain", "budget"]


@dataclass(slots=True)
class Outcome:
    state: OutcomeState
    output: Any = None
    text: str | None = None
    digest: str | None = None
    error: ErrorInfo | None = None
    action: ActionRecord | None = None   # ledger record to persist with the settlement
    exception: BaseException | None = None


def schema_error(cls: type[NodeFailedError], node_id: str, what: str,
                 err: SchemaValidationError) -> NodeFailedError:
    where = json_path(err.absolute_path)
    schema_path = "/".join(str(p) for p in err.absolute_schema_path)
    return cls(f"node {node_id!r}: the value at {where} of its {what} violates the schema "
               f"(#/{schema_path}): {err.message}", node_id=node_id,
               details={"path": where, "schema_path": "#/" + schema_path})


def node_error(info: ErrorInfo, message: str, node_id: str | None) -> NodeFailedError:
    """The typed error a journaled node failure re-raises as (input, output or other)."""
    cls: type[NodeFailedError] = {"node_input_invalid": NodeInputError,
                                  "node_output_invalid": NodeOutputError}.get(
        info.code, NodeFailedError)
    return cls(message, node_id=node_id, details=info.details, cause=info)


def bytes_over(text: str, limit: int | None) -> int | None:
    """The UTF-8 size of ``text`` when it is over ``limit`` bytes (a store's
    ``max_blob_bytes``), else None. A character is at most 4 UTF-8 bytes: most texts are
    not encoded at all."""
    if limit is None or len(text) * 4 <= limit:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > limit else None


def check_output(node_id: str, binding: Binding, result: Any,
                 max_bytes: int | None = None) -> Outcome:
    """A completed outcome with canonical text and digest, or a failed one naming why.

    ``max_bytes``: the store's largest blob (``StoreCapabilities.max_blob_bytes``)."""
    try:
        text, output = checked_json(result)
    except NotJSONError as exc:
        error = NodeOutputError(
            f"node {node_id!r}: output is not JSON at {exc.path}: {exc.reason}; return "
            "dicts, lists, strings, numbers, booleans or None", node_id=node_id,
            details={"path": exc.path})
        return Outcome("failed", error=error.to_info())
    except Exception as exc:  # the value's own methods raised while it was read
        error = NodeOutputError(
            f"node {node_id!r}: its output could not be read as JSON: "
            f"{type(exc).__name__} raised while reading it ({exception_text(exc)}); return "
            "plain dicts, lists, strings, numbers, booleans or None", node_id=node_id,
            details={"exception_type": type(exc).__qualname__})
        return Outcome("failed", error=error.to_info())
    # The value successors and the result see is the journaled one, never the tool's own
    # object: a tool (or a later one) mutating what it returned must not make this run
    # differ from a recovery, which reads the journaled text.
    errors = binding.output_errors(output)
    if errors:
        return Outcome("failed", error=schema_error(NodeOutputError, node_id, "output",
                                                    errors[0]).to_info())
    size = bytes_over(text, max_bytes)
    if size is not None:
        return Outcome("failed", error=NodeOutputError(
            f"node {node_id!r}: its output is {size} bytes as JSON, more than the "
            f"{max_bytes} bytes the store keeps in one record; return a smaller output "
            "(keep large data elsewhere and return a reference to it)", node_id=node_id,
            details={"bytes": size, "limit": max_bytes}).to_info())
    return Outcome("completed", output=output, text=text, digest=digest_text(text))
