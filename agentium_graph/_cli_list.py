"""``agentium-graph list``: a page of tasks that goes on past a task it cannot read.

The command's options are declared on the group in :mod:`agentium_graph.cli`; this module
is the rest of it: paging (:func:`list_rows`), the ``--json`` model (:class:`TaskList`), the
table and the ``error:`` line of a listing with damaged tasks (:func:`run_list`).

A store parses every header of a page and fails the whole page on one that does not parse
(damaged by hand or by the disk), naming the task's key in the error's ``details``. The
protocol returns headers only, so the CLI turns such an error into a :class:`DamagedTask`
row and asks again after that key: every healthy task is still listed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import click
from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from agentium_graph._cli_render import (
    _console,
    _emit_json,
    _lease,
    _relative,
    _shown,
    _status,
    _t,
    _table,
    clip,
)
from agentium_graph.errors import DataIntegrityError, ErrorInfo, StoreSchemaError, valid_text
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import TaskHeader
from agentium_graph.store._requests import ListTasksRequest

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from agentium_graph.cli import CliConfig

__all__ = ["MAX_PAGE", "DamagedTask", "Row", "TaskList", "clip", "damaged_message",
           "list_rows", "run_list"]

MAX_PAGE = 1000  # the most rows a ListTasksRequest may ask for


class DamagedTask(BaseModel):
    """``list --json``: a task whose stored header cannot be read, with the store's error
    (``inspect KEY`` shows it in full). ``reason``: the damaged field and what is wrong with
    it, at most CLIP_CHARS (80) characters (the table's ``problem`` cell)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    status: Literal["damaged"] = "damaged"
    reason: str
    error: ErrorInfo


Row = TaskHeader | DamagedTask


class TaskList(BaseModel):
    """``list --json``: task headers in key order; pass ``next_after`` to ``--after``.
    ``damaged`` (dumped only when there is one) holds the tasks of the page whose stored
    header cannot be read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tasks: tuple[TaskHeader, ...]
    next_after: str | None
    damaged: tuple[DamagedTask, ...] = ()

    @model_serializer(mode="wrap")
    def _without_empty_damaged(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A healthy page dumps exactly as before the field existed.
        data: dict[str, Any] = handler(self)
        if not self.damaged:
            data.pop("damaged", None)
        return data


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


def run_list(ctx: click.Context, *, status: str | None, limit: int, after: str | None,
             as_json: bool) -> None:
    """The ``list`` command: the page as a table (with a ``more:`` hint) or as ``--json``;
    a page with damaged tasks ends with one ``error:`` line and exit 4."""
    # Imported here, as _cli_resolve does: cli imports this module as it loads.
    from agentium_graph.cli import EXIT_STORE, _error_line, _hint, run_with_store

    async def fetch(store: DurableTaskStore) -> TaskList:
        # One extra row tells whether another page exists; a full page of the store's
        # largest (1000, which leaves no room for it) asks for the row after its last key.
        rows = await list_rows(store, status=status, after=after,
                               want=min(limit + 1, MAX_PAGE))
        page = rows[:limit]
        more = len(rows) > limit
        if not more and len(page) == MAX_PAGE:
            more = bool(await list_rows(store, status=status, after=page[-1].key, want=1))
        return TaskList(tasks=tuple(r for r in page if isinstance(r, TaskHeader)),
                        damaged=tuple(r for r in page if isinstance(r, DamagedTask)),
                        next_after=page[-1].key if more and page else None)

    config: CliConfig = ctx.obj
    result = run_with_store(config, fetch, read_only=True)
    if as_json:
        _emit_json(result)
    else:
        _list_output(ctx, config, result, status, limit)
    if result.damaged:
        message = damaged_message(result.damaged, lambda key: _hint(config, ["inspect", key]))
        _error_line(f"error: {_shown(message)}")
        ctx.exit(EXIT_STORE)


def _list_output(ctx: click.Context, config: CliConfig, result: TaskList, status: str | None,
                 limit: int) -> None:
    from agentium_graph.cli import _hint

    _render_list(_console(), result, status)
    if result.next_after is not None:
        args = ["list"]
        if status is not None:
            args += ["--status", status]
        if ctx.get_parameter_source("limit") == click.core.ParameterSource.COMMANDLINE:
            args += ["--limit", str(limit)]
        click.echo(_shown(f"more: {_hint(config, [*args, '--after', result.next_after])}"))


def _render_list(console: Console, result: TaskList, status: str | None) -> None:
    if not result.tasks and not result.damaged:
        console.print(f"no tasks{' with status ' + status if status else ''}")
        return
    now = datetime.now(UTC)
    columns = [("key", "id"), ("status", "fixed"), ("fence", "num"), ("lease", "text"),
               ("cancel", "text"), ("attempts", "num"), ("updated", "fixed")]
    title = f"{len(result.tasks) + len(result.damaged)} task(s)"
    if result.damaged:
        columns.append(("problem", "text"))
        title += f", {len(result.damaged)} damaged"
    rows: list[list[Text | str]] = []
    listed: list[Row] = [*result.tasks, *result.damaged]
    for row in sorted(listed, key=lambda r: r.key):
        if isinstance(row, DamagedTask):
            rows.append([_t(row.key), _t(row.status, style="bold red"), "-", "-", "-", "-", "-",
                         _t(row.reason, style="red")])
            continue
        shown = _status(row.status)
        if row.budget_stopped:  # pending, like a task nobody ran yet: say which it is
            shown.append(" (budget)", style="yellow")
        rows.append([_t(row.key), shown, str(row.fence),
                     _lease(row.lease, now, short=True),
                     _t(clip(row.cancel.reason) if row.cancel else "-"),
                     str(row.counters.get("work_attempts", 0)), _relative(row.updated_at, now),
                     *([""] if result.damaged else [])])
    console.print(_table(title, columns, rows))


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
    """Why the header cannot be read, in at most CLIP_CHARS (80) characters (the error's
    message has it all): the damaged field and what is wrong with it when the store says
    (``details["problem"]``, as the MongoDB store does), else read from the pydantic error
    that caused it (the SQLite store's)."""
    if exc.details.get("newer") or "schema_version" in exc.details:
        return "unknown fields or values: written by a newer version?"
    problem = exc.details.get("problem")
    if isinstance(problem, str) and problem.strip():
        # Shown as it is: the table and the error: line escape control characters.
        return clip(valid_text(problem))
    cause = exc.__cause__
    if isinstance(cause, ValidationError):
        problems = cause.errors(include_url=False, include_input=False)
        if {p["type"] for p in problems} & {"json_invalid", "json_type"}:
            return "header is not valid JSON"
        first = problems[0]
        where = ".".join(["header", *(str(p) for p in first.get("loc", ()))])
        return clip(f"{where}: {first.get('msg', '?')}")
    if cause is not None:
        return f"header cannot be parsed ({type(cause).__name__})"
    return f"header cannot be read ({exc.code})"
