"""``agentium-graph list``: a page of tasks that goes on past a task it cannot read.

A store parses every header of a page and fails the whole page on one that does not parse
(damaged by hand or by the disk), naming the task's key in the error's ``details``. The
protocol returns headers only, so the CLI turns such an error into a :class:`DamagedTask`
row and asks again after that key: every healthy task is still listed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from agentium_graph.errors import DataIntegrityError, ErrorInfo, StoreSchemaError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import TaskHeader
from agentium_graph.store._requests import ListTasksRequest

__all__ = ["DamagedTask", "Row", "damaged_message", "list_rows"]

_REASON_CHARS = 80


class DamagedTask(BaseModel):
    """``list --json``: a task whose stored header cannot be read, with the store's error
    (``inspect KEY`` shows it in full)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    status: Literal["damaged"] = "damaged"
    reason: str
    error: ErrorInfo


Row = TaskHeader | DamagedTask


async def list_rows(store: DurableTaskStore, *, status: str | None, after: str | None,
                    want: int) -> list[Row]:
    """Up to ``want`` rows after ``after`` in key order (with ``status`` if given); a task
    whose header the store cannot parse is a :class:`DamagedTask`. An error that names no
    row after the cursor is raised as it is (so the loop always moves forward)."""
    rows: list[Row] = []
    cursor = after
    limit = want
    while len(rows) < want:
        request = ListTasksRequest.model_validate(
            {"status": status, "after": cursor, "limit": min(limit, want - len(rows))})
        try:
            headers = await store.list_tasks(request)
        except (StoreSchemaError, DataIntegrityError) as exc:
            key = _damaged_key(exc, cursor)
            if key is None:
                raise
            if request.limit > 1:
                # The healthy rows before the damaged one came back with it in the failed
                # page: ask for fewer until it is the first row after the cursor.
                limit = request.limit // 2
                continue
            rows.append(DamagedTask(key=key, reason=_reason(exc), error=exc.to_info()))
            cursor, limit = key, want
            continue
        rows.extend(headers)
        if len(headers) < request.limit or (cursor is not None and headers[-1].key <= cursor):
            break
        cursor = headers[-1].key
    return rows


def damaged_message(damaged: Sequence[DamagedTask], inspect: Callable[[str], str]) -> str:
    """The ``error:`` line of a listing with damaged tasks: which, and what to do next.
    ``inspect(key)`` is the command line that shows a task."""
    if len(damaged) == 1:
        key = damaged[0].key
        return (f"task {key!r} is damaged ({damaged[0].reason}); the other tasks are listed. "
                f"Run `{inspect(key)}` for details, then restore the task from a backup (or "
                "repair its stored record)")
    keys = ", ".join(repr(d.key) for d in damaged[:5]) + (", ..." if len(damaged) > 5 else "")
    return (f"{len(damaged)} tasks are damaged ({keys}): their stored headers cannot be read; "
            f"the other tasks are listed. Run `{inspect('KEY')}` on each for details, then "
            "restore those tasks from a backup (or repair their records)")


def _damaged_key(exc: StoreSchemaError | DataIntegrityError, cursor: str | None) -> str | None:
    key = exc.details.get("key")
    if not isinstance(key, str) or (cursor is not None and key <= cursor):
        return None
    return key


def _reason(exc: StoreSchemaError | DataIntegrityError) -> str:
    """Why the header cannot be read, in a few words (the error's message has it all)."""
    if exc.details.get("newer") or "schema_version" in exc.details:
        return "unknown fields or values: written by a newer version?"
    cause = exc.__cause__
    if isinstance(cause, ValidationError):
        problems = cause.errors(include_url=False, include_input=False)
        if {p["type"] for p in problems} & {"json_invalid", "json_type"}:
            return "header is not valid JSON"
        first = problems[0]
        where = ".".join(["header", *(str(p) for p in first.get("loc", ()))])
        text = f"{where}: {first.get('msg', '?')}"
        return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 1] + "…"
    if cause is not None:
        return f"header cannot be parsed ({type(cause).__name__})"
    return f"header cannot be read ({exc.code})"
