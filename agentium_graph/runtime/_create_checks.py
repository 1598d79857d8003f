"""What ``create`` checks of a task's input (and sizes) before anything is stored."""

from __future__ import annotations

from typing import Any

from agentium_graph._canonical import NotJSONError, canonical_json, check_json, json_path
from agentium_graph._program import ExecutionGraphProgram
from agentium_graph.errors import Diagnostic, PlanValidationError
from agentium_graph.runtime._outcome import bytes_over
from agentium_graph.store import DurableTaskStore


def check_sizes(store: DurableTaskStore, plan_text: str | None, value: Any) -> None:
    """Refuse a plan or an input larger than the store's largest record
    (``StoreCapabilities.max_blob_bytes``) before anything is stored."""
    limit: int | None = getattr(store.capabilities, "max_blob_bytes", None)
    if limit is None:
        return
    for path, code, text in (("$", "plan_too_large", plan_text),
                             ("$input", "input_too_large",
                              canonical_json(value, trusted=True))):
        size = None if text is None else bytes_over(text, limit)
        if size is not None:
            raise PlanValidationError([Diagnostic(path=path, code=code, message=(
                f"{size} bytes of canonical JSON; the store keeps at most {limit} bytes "
                "in one record (StoreCapabilities.max_blob_bytes): pass large data by "
                "reference (a key a tool looks up) instead"))],
                subject="input" if path == "$input" else "plan")


def check_input(program: ExecutionGraphProgram, value: Any) -> None:
    try:
        check_json(value, "$input")
    except NotJSONError as exc:
        raise PlanValidationError([Diagnostic(path=exc.path, code="input_not_json",
                                              message=exc.reason)], subject="input") from None
    validator = program.input_validator
    if validator is not None:
        try:
            errors = list(validator.iter_errors(value))
        except RecursionError:
            # A recursive schema checks each level through several frames: plain JSON
            # within the nesting bound can still exhaust the stack.
            raise PlanValidationError([Diagnostic(
                path="$input", code="input_invalid",
                message="the input nests too deeply to be checked against the program's "
                        "recursive input_schema; send flatter data")],
                subject="input") from None
        if errors:
            raise PlanValidationError([
                Diagnostic(path=json_path(e.absolute_path, "$input"),
                           code="input_invalid", message=e.message) for e in errors],
                subject="input")
