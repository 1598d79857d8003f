"""What ``run`` raises for a task that already ended: its stored status and error, as the
exception the run that ended it raised."""

from __future__ import annotations

import contextlib

from pydantic import ValidationError

from agentium_graph.errors import (
    DeadlineExceededError,
    Diagnostic,
    DurableRecoveryRequiredError,
    ErrorInfo,
    NodeFailedError,
    PlannerFailedError,
    PlanValidationError,
    TaskCanceledError,
)
from agentium_graph.runtime._outcome import node_error
from agentium_graph.runtime._planner import EXHAUSTED_ADVICE
from agentium_graph.store import TaskHeader


def raise_terminal(header: TaskHeader) -> None:
    info = header.error
    if header.status == "canceled":
        raise TaskCanceledError(info.message if info else f"task {header.key!r} was canceled")
    if header.status == "recovery_required":
        ids = info.details.get("action_ids") if info else None
        # Free-form details: a damaged header may hold anything there.
        raise DurableRecoveryRequiredError(header.key, [str(i) for i in ids]
                                           if isinstance(ids, list) else [],
                                           reason="resolve them before running again")
    if header.status == "failed":
        raise error_from_info(header.key, info)


def error_from_info(key: str, info: ErrorInfo | None) -> Exception:
    if info is None:
        return NodeFailedError(f"task {key!r} failed")
    if info.code == "deadline_exceeded":
        return DeadlineExceededError(info.message, details=info.details)
    if info.code == PlanValidationError.code and "diagnostics" in info.details:
        with contextlib.suppress(TypeError, ValidationError):  # damaged: as any failure
            return PlanValidationError([Diagnostic(**d) for d in info.details["diagnostics"]],
                                       subject=f"task {key!r}: the planner's last proposal",
                                       advice=EXHAUSTED_ADVICE)
    if info.code == PlannerFailedError.code:
        return PlannerFailedError(info.message, details=info.details)
    return node_error(info, f"task {key!r} failed at node {info.node_id!r}: {info.message}",
                      info.node_id)
