"""The ``agentium-graph`` operator CLI: list, inspect, cancel and page the timeline of tasks.

Built on click (parsing) and rich (tables). Every command is one function registered on
the :data:`cli` group and gets its store through :func:`run_with_store`, which opens the
``--store`` URI, awaits the command's coroutine and always closes the store. New commands
(``demo``, ``resolve``) are added the same way, or with ``cli.add_command(...)``.

The CLI never runs a task: ``list``, ``inspect`` and ``timeline`` only read (a SQLite file is
opened read-only: nothing is created or migrated), and ``cancel`` records a cancel request
that the worker holding the task's lease observes (a ``recovery_required`` task, which no
worker can run, it cancels at once). No command creates a database.

Exit codes (:data:`EXIT_CODES`): 0 ok; 1 any other error; 2 usage (a bad option, a bad
``--store`` URI or cursor); 3 no task under that key; 4 the store cannot be opened or is
unavailable, or a stored record is damaged (a DataIntegrityError too; ``list`` still lists
every task it can read and shows the damaged ones as such: :mod:`agentium_graph._cli_list`).
Errors, usage errors included, are one line on stderr starting with ``error:``, never a
traceback. Text from the store or the command line reaches the terminal with the characters
a terminal acts on (ESC and the other controls) escaped: :func:`_safe`. How text and
tables are shown lives in :mod:`agentium_graph._cli_render`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import shlex
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, get_args

import click
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentium_graph._cli_list import MAX_PAGE, DamagedTask, TaskList, run_list
from agentium_graph._cli_render import (
    _UNSAFE,
    _attempts,
    _compact,
    _console,
    _deadline,
    _emit_json,
    _encodable,
    _error,
    _Grid,
    _lease,
    _safe,
    _short,
    _shown,
    _state,
    _status,
    _t,
    _table,
    _utf8,
    _when,
)
from agentium_graph._entry import discard_stream as _discard
from agentium_graph._store_uri import open_store_uri, redact
from agentium_graph.catalog._catalog import HostCatalog
from agentium_graph.errors import (
    AgentiumGraphError,
    ConfigurationError,
    DataIntegrityError,
    StoreError,
    TaskNotFoundError,
)
from agentium_graph.runtime._args import MAX_REASON_CHARS, check_key
from agentium_graph.runtime._config import DEFAULT_LEASE_TTL
from agentium_graph.runtime._inspect import build_view
from agentium_graph.runtime._operator import TimelinePage
from agentium_graph.runtime._resolve import cancel_stopped
from agentium_graph.runtime._runtime import ExecutionGraphRuntime
from agentium_graph.runtime._views import NodeView, PlannerView, TaskView
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import (
    COUNTERS,
    TaskHeader,
    TaskStatus,
)
from agentium_graph.store._requests import CancelTaskRequest

__all__ = [
    "EXIT_CODES", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_STORE", "EXIT_USAGE", "CancelOutcome",
    "CliConfig", "DamagedTask", "TaskList", "cli", "exit_code_for", "main", "require_text",
    "run_with_store",
]

T = TypeVar("T")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_STORE = 4
EXIT_CODES: dict[str, int] = {"error": EXIT_ERROR, "usage": EXIT_USAGE,
                              "not_found": EXIT_NOT_FOUND, "store": EXIT_STORE}

DEFAULT_STORE = "sqlite:///agentium.db"
STATUSES: tuple[str, ...] = get_args(TaskStatus)


# --- errors -----------------------------------------------------------------------------

def exit_code_for(exc: AgentiumGraphError) -> int:
    """The process exit code for an SDK error (see the module docstring)."""
    if isinstance(exc, TaskNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, StoreError | DataIntegrityError):  # DataIntegrityError: damaged data
        return EXIT_STORE
    if isinstance(exc, ConfigurationError):
        return EXIT_USAGE
    return EXIT_ERROR


def _one_line(exc: AgentiumGraphError) -> str:
    return _safe(" ".join((str(exc) or exc.code).split()))


def require_text(**values: str | None) -> None:
    """Refuse a command-line string that is not valid UTF-8 text (stores keep UTF-8): an
    argument holding bytes that are not UTF-8 reaches Python as lone surrogates
    ('\\udcff'). Raises ConfigurationError (exit 2) naming the argument."""
    for name, value in values.items():
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigurationError(
                f"{name} {value!r} is not valid UTF-8 text (the byte at position {exc.start} "
                f"is not UTF-8, shown as {value[exc.start]!r}); pass it as UTF-8 text",
                details={"argument": name}) from None


def _text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click callback: check a string parameter with :func:`require_text` as it is parsed."""
    if value is not None:
        name = (param.opts[0] if isinstance(param, click.Option) and param.opts
                else param.human_readable_name)
        require_text(**{name: value})
    return value


def _key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """click callback of a KEY argument: :func:`_text`, then the runtime's rule for a task
    key (non-empty, at most 200 characters), so no command looks up a key no task can have."""
    _text(ctx, param, value)
    check_key(value)
    return value


# click >= 8.2 reports a bare command (no subcommand) as this usage error, showing the help.
_HELP_ERRORS: tuple[type[click.UsageError], ...] = tuple(
    getattr(click.exceptions, name) for name in ("NoArgsIsHelpError",)
    if hasattr(click.exceptions, name))


def _error_line(line: str, file: Any = None) -> None:
    """Write one ``error:`` line to stderr (or ``file``). A stream that cannot take it (stderr
    closed with ``2>&-``, a full disk) loses the line, never the exit code: the write error
    is dropped and the stream pointed at the null device, so Python's flush at exit does not
    fail again (which would make the exit code 120)."""
    try:
        # Escaped for stderr's encoding first: click re-encodes an ASCII stream as UTF-8.
        click.echo(_encodable(line, sys.stderr if file is None else file), file=file,
                   err=True)
    except (OSError, ValueError):  # ValueError: the stream object itself was closed
        _discard(sys.stderr if file is None else file)


class _UsageLine(click.UsageError):
    """A usage error shown as the CLI shows every error: one ``error:`` line (exit 2)."""

    def show(self, file: Any = None) -> None:
        _error_line(f"error: {_safe(' '.join(self.message.split()))}", file=file)


def _usage_line(exc: click.UsageError, path: str | None = None) -> click.UsageError:
    """click's usage error as one line: its message and where help is, not the usage block
    (a bare ``agentium-graph``, which prints the help, is left as it is). ``path``: the
    command path to name when click gives the error no context (an option missing its
    value, ``list --limit``, is reported by click's parser before there is one)."""
    if isinstance(exc, (_UsageLine, *_HELP_ERRORS)):
        return exc
    message = exc.format_message().rstrip(".")
    if message[1:2].islower():  # "Invalid value ..." like the CLI's own messages
        message = message[0].lower() + message[1:]
    path = exc.ctx.command_path if exc.ctx is not None else path
    if path:
        message += f"; see '{path} --help'"
    return _UsageLine(message, ctx=exc.ctx)


class _Group(click.Group):
    """Reports every SDK error raised by any subcommand, and every usage error (a bad option
    of the group or of a command), as one ``error:`` line on stderr."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            path = " ".join(filter(None, [parent.command_path if parent else None,
                                          info_name or self.name]))
            raise _usage_line(exc, path) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            if sys.stdout is not None:  # so a write that fails fails here, not at exit
                sys.stdout.flush()
            return result
        except click.UsageError as exc:
            # Set before the subcommand's arguments are parsed: names it when the parser's
            # error has no context.
            sub = ctx.invoked_subcommand
            raise _usage_line(exc, f"{ctx.command_path} {sub}" if sub else None) from None
        except AgentiumGraphError as exc:
            _error_line(f"error: {_one_line(exc)}")
            ctx.exit(exit_code_for(exc))
        except OSError as exc:
            # Writing the output failed (a full disk): one line, like every error. A closed
            # pipe (`| head`) click ends quietly; an error naming a file is not the output's.
            if exc.errno == errno.EPIPE or exc.filename is not None:
                raise
            _discard(sys.stdout)
            _error_line(f"error: cannot write the output ({exc.strerror or exc}); what was "
                       "printed is incomplete")
            ctx.exit(EXIT_ERROR)


# --- store plumbing -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CliConfig:
    """The group's options, available to every command as ``ctx.obj``."""

    store_uri: str
    database: str | None = None
    # Whether --store was given on the command line (not from AGENTIUM_STORE or the
    # default): paging hints repeat it then.
    store_given: bool = False


def run_with_store(config: CliConfig, fn: Callable[[DurableTaskStore], Awaitable[T]], *,
                   read_only: bool = False) -> T:
    """Open the configured store (it must already exist), await ``fn(store)``, close it.

    ``read_only=True`` for commands that only read: a SQLite file is then opened read-only
    (nothing is created, converted or migrated); otherwise a file that is not already an
    agentium-graph database is refused rather than initialized."""
    return asyncio.run(_with_store(config, fn, read_only=read_only))


async def _with_store(config: CliConfig, fn: Callable[[DurableTaskStore], Awaitable[T]],
                      read_only: bool = False) -> T:
    store = open_store_uri(config.store_uri, database=config.database, must_exist=True,
                           read_only=read_only)
    try:
        result = await fn(store)
    except BaseException:
        # The original error is the one to report; a failing close must not mask it.
        with contextlib.suppress(AgentiumGraphError):
            await store.close()
        raise
    await store.close()
    return result


async def _header(store: DurableTaskStore, key: str) -> TaskHeader:
    header = await store.get_header(key)
    if header is None:
        raise TaskNotFoundError(key)
    return header


def _hint(config: CliConfig, args: Sequence[str]) -> str:
    """A command line to paste: the group options given on the command line (the store
    URI redacted like every message), then ``args``, each shell-quoted."""
    words = ["agentium-graph"]
    if config.store_given:
        words += ["--store", redact(config.store_uri)]
    if config.database is not None:
        words += ["--database", config.database]
    return " ".join(_shell_word(word) for word in [*words, *args])


def _shell_word(word: str) -> str:
    """``word`` quoted for a POSIX shell; a word holding a character of :data:`_UNSAFE` is
    written ``$'...'`` with that character escaped (bash, zsh, ksh, POSIX.1-2024 sh), so the
    line stays pasteable and never reaches the terminal raw."""
    if not _UNSAFE.search(word):
        return shlex.quote(word)
    chars = []
    for char in word:
        if char in "\\'":
            chars.append("\\" + char)
        elif _UNSAFE.match(char):
            # $'\xNN' is one byte: a character past ASCII is \uNNNN (its UTF-8 bytes).
            chars.append(f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}")
        else:
            chars.append(char)
    return "$'" + "".join(chars) + "'"


def _reader(store: DurableTaskStore) -> ExecutionGraphRuntime:
    # Reading a timeline never consults the catalog; an empty one keeps a single
    # implementation of paging and cursors, shared with runtime.timeline().
    return ExecutionGraphRuntime(catalog=HostCatalog([]), store=store)


# --- output models ------------------------------------------------------------------------

class CancelOutcome(BaseModel):
    """``cancel --json``: whether this call recorded the request and who will observe it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    recorded: bool
    observed_by: str | None
    header: TaskHeader
    # This command ended the task itself (a recovery_required task nobody can run).
    applied: bool = False


def _tolerant_output() -> None:
    """On a stream that cannot encode every character (``PYTHONIOENCODING=cp1252``, a
    latin-1 locale), show the others as backslash escapes instead of dying with
    UnicodeEncodeError half way through a table. JSON is kept valid by ``ensure_ascii``."""
    for stream in (sys.stdout, sys.stderr):
        if (isinstance(stream, io.TextIOWrapper) and stream.errors == "strict"
                and not _utf8(stream)):
            stream.reconfigure(errors="backslashreplace")
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper) and isinstance(out.buffer, io.FileIO):
        # PYTHONUNBUFFERED (python -u): the text layer writes straight to the file and
        # drops what a short write left over, so output cut by a pipe closing early went
        # unreported (exit 0, half a JSON document). A buffered layer writes it all or
        # raises. The original stream stays in sys.__stdout__, which keeps it open.
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(out.buffer), encoding=out.encoding,
                                      errors=out.errors, line_buffering=out.isatty())


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (the models' model_dump(mode='json')) instead of "
                                "tables.")


# --- the group ----------------------------------------------------------------------------

@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_uri", envvar="AGENTIUM_STORE", default=DEFAULT_STORE,
              show_default=True, show_envvar=True, metavar="URI",
              help="Task store: sqlite:///relative/path.db, sqlite:////absolute/path.db, "
                   "mongodb://host[:port]/[database] or mongodb+srv://host/[database].")
@click.option("--database", default=None, metavar="NAME",
              help="MongoDB database (default: the URI's path, else 'agentium').")
@click.version_option(package_name="agentium-graph", prog_name="agentium-graph")
@click.pass_context
def cli(ctx: click.Context, store_uri: str, database: str | None) -> None:
    """Inspect and control agentium-graph tasks in a durable store.

    Exit codes: 0 ok, 1 error, 2 usage (bad option, --store URI or cursor),
    3 unknown task key, 4 store cannot be opened or is unavailable, or a record is damaged.
    """
    _tolerant_output()
    given = ctx.get_parameter_source("store_uri") == click.core.ParameterSource.COMMANDLINE
    ctx.obj = CliConfig(store_uri=store_uri, database=database, store_given=given)


def main() -> None:
    """Console-script entry point (``agentium-graph``, ``python -m agentium_graph``)."""
    cli()


# --- list ---------------------------------------------------------------------------------

@cli.command("list")
@click.option("--status", type=click.Choice(STATUSES), default=None,
              help="Only tasks with this status.")
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True,
              help="At most this many tasks.")
@click.option("--after", metavar="KEY", callback=_text, default=None,
              help="Only keys sorted after KEY (the next_after of the previous page).")
@json_option
@click.pass_context
def list_command(ctx: click.Context, status: str | None, limit: int, after: str | None,
                 as_json: bool) -> None:
    """List tasks in key order, with status, lease and counters.

    A task whose stored header cannot be read is listed as damaged (exit 4).
    """
    run_list(ctx, status=status, limit=limit, after=after, as_json=as_json)


# --- inspect ------------------------------------------------------------------------------

@cli.command("inspect", short_help="Show a task: status, lease, counters, nodes.")
@click.argument("key", callback=_key)
@json_option
@click.pass_obj
def inspect_command(config: CliConfig, key: str, as_json: bool) -> None:
    """Show a task's status, lease, counters and every node; verifies digests, never writes."""

    async def fetch(store: DurableTaskStore) -> TaskView:
        snapshot = await store.get_task(key)
        if snapshot is None:
            raise TaskNotFoundError(key)
        return await build_view(store, snapshot, await store.get_identity(key))

    view = run_with_store(config, fetch, read_only=True)
    if as_json:
        _emit_json(view)
    else:
        _render_view(_console(), view)


def _render_view(console: Console, view: TaskView) -> None:
    now = datetime.now(UTC)
    summary = Table(title=_t(f"task {view.key}"), title_justify="left", show_header=False,
                    box=None, padding=(0, 2, 0, 0))
    summary.add_column("field", style="bold", no_wrap=True)
    summary.add_column("value", overflow="fold")
    program = view.program
    rows: list[tuple[str, Text]] = [
        ("status", _status(view.status)),
        ("program", _t(f"{program.get('id', '?')}@{program.get('version', '?')}")),
        ("revision", Text(str(view.revision))),
        ("fence", Text(str(view.fence))),
        ("lease", _lease(view.lease, now)),
        ("deadline", _deadline(view.deadline, now)),
        ("cancel", _t(f"requested {_when(view.cancel.requested_at)}: {view.cancel.reason}"
                      if view.cancel else "-")),
        ("error", _error(view.error)),
        ("actions", Text(f"{len(view.actions)} total, {len(view.pending_actions)} pending, "
                         f"{len(view.uncertain_actions)} uncertain")),
        ("journal", Text(f"{view.journal_length} event(s)")),
        ("created", Text(_when(view.created_at))),
        ("updated", Text(_when(view.updated_at))),
        ("verified", Text("yes", style="green") if view.verified
         else Text(f"NO: {len(view.problems)} problem(s)", style="bold red")),
    ]
    if view.planner is not None:
        rows.insert(3, ("planner", _planner(view.planner)))
    for name, value in rows:
        summary.add_row(name, value)
    console.print(summary)
    for problem in view.problems:
        console.print(_t(f"  problem: {problem}", style="red"))
    if view.planner is not None and view.planner.state != "planned":
        for diagnostic in view.planner.last_diagnostics:
            console.print(_t(f"  last rejection: {diagnostic}", style="yellow"))
    console.print(_counters_table(view.counters, view.limits))
    console.print(_nodes_table(_plan_order(view.nodes)))
    if view.actions:
        console.print(_actions_table(view))


def _planner(planner: PlannerView) -> Text:
    provider = planner.provider
    style = {"planned": "green", "failed": "bold red", "canceled": "yellow"}.get(
        planner.state, "cyan")
    text = _t(planner.state, style=style)
    text.append(_safe(f": {planner.proposals} proposal(s), {planner.rejected} rejected "
                f"(max corrections {planner.max_corrections}), {planner.calls} call(s), "
                f"{planner.mode} mode, provider "
                f"{provider.get('id', '?')}@{provider.get('version', '?')}"))
    return text


def _counters_table(counters: dict[str, int], limits: dict[str, int | None]) -> _Grid:
    names = [c for c in COUNTERS if c in counters or c in limits]
    names += sorted((set(counters) | set(limits)) - set(names))
    rows: list[list[Text | str]] = []
    for name in names:
        used, limit = counters.get(name, 0), limits.get(name)
        over = limit is not None and used > limit
        rows.append([_t(name), Text(str(used), style="bold red" if over else ""),
                     "-" if limit is None else str(limit)])
    return _table("counters (used / limit)",
                  [("counter", "fixed"), ("used", "num"), ("limit", "num")], rows)


def _plan_order(nodes: dict[str, NodeView]) -> list[NodeView]:
    """Nodes in dependency order (ties by id), the way the plan reads; cycles can't occur."""
    done: set[str] = set()
    ordered: list[NodeView] = []
    remaining = sorted(nodes)
    while remaining:
        ready = [n for n in remaining
                 if all(d in done or d not in nodes for d in nodes[n].deps)] or remaining[:1]
        for node_id in ready:
            done.add(node_id)
            ordered.append(nodes[node_id])
        remaining = [n for n in remaining if n not in done]
    return ordered


def _nodes_table(nodes: Iterable[NodeView]) -> _Grid:
    return _table(
        "nodes",
        [("node", "id"), ("state", "fixed"), ("binding", "id"), ("attempts", "text"),
         ("output", "id"), ("error", "text")],
        [[_t(node.node_id), _state(node.state), _t(f"{node.binding}@{node.version}"),
          _attempts(node.attempts), _t(_short(node.output_digest)), _error(node.error)]
         for node in nodes])


def _actions_table(view: TaskView) -> _Grid:
    return _table(
        "actions",
        [("action", "id"), ("node", "id"), ("state", "fixed"), ("fence", "num"),
         ("outcome", "text")],
        # The whole action id: it is what `resolve KEY ACTION_ID` takes.
        [[_t(a.action_id), _t(a.node_id), _state(a.state), str(a.fence),
          _t(a.outcome_source or _short(a.outcome_digest))] for a in view.actions])


# --- cancel -------------------------------------------------------------------------------

@cli.command("cancel", short_help="Request cancellation of a task.")
@click.argument("key", callback=_key)
@click.option("--reason", callback=_text, required=True, help="Why; recorded with the request.")
@json_option
@click.pass_obj
def cancel_command(config: CliConfig, key: str, reason: str, as_json: bool) -> None:
    """Record a cancel request; the worker holding the lease observes it and stops.

    The CLI never runs the task: with no live lease, the next run(key) applies the cancel.
    """
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="'--reason'")
    if len(reason) > MAX_REASON_CHARS:
        raise click.BadParameter(
            f"is {len(reason):,} characters, more than the {MAX_REASON_CHARS:,} accepted (the "
            "task's header keeps it); say why in a few lines",
            param_hint="'--reason'")

    async def request(store: DurableTaskStore) -> CancelOutcome:
        before = await _header(store, key)
        now = datetime.now(UTC)
        after = await store.request_cancel(CancelTaskRequest(key=key, reason=reason, now=now))
        live = after.lease is not None and after.lease.expires_at > now
        applied = False
        budget_stopped = after.budget_stopped
        if (after.status == "recovery_required" or budget_stopped) and not live:
            # Nothing will run it until its actions are resolved, or a run would stop at
            # the same pinned budget again: cancel it now (this needs only the store; its
            # uncertain actions stay in the ledger). A budget-stopped task with an action a
            # crash left dispatching is left to a run, which looks that action up first.
            await cancel_stopped(store, key, lease_ttl=DEFAULT_LEASE_TTL,
                                 clock=lambda: datetime.now(UTC), idle=budget_stopped,
                                 leave_lookups=budget_stopped)
            after = await _header(store, key)
            live = after.lease is not None and after.lease.expires_at > now
            applied = after.status == "canceled"
        return CancelOutcome(
            key=key, recorded=before.cancel is None and after.cancel is not None,
            observed_by=after.lease.owner if live and after.lease else None, header=after,
            applied=applied)

    outcome = run_with_store(config, request)
    if as_json:
        _emit_json(outcome)
    else:
        click.echo(_shown(_cancel_message(outcome)))


def _cancel_message(outcome: CancelOutcome) -> str:
    header, key = outcome.header, repr(outcome.key)
    if header.status in ("completed", "failed", "canceled") and not outcome.recorded:
        return f"task {key} is already {header.status}; nothing to cancel"
    if header.status == "canceled" and (outcome.recorded or outcome.applied):
        stuck = header.error.details.get("uncertain_actions") if header.error else None
        stuck = stuck if isinstance(stuck, list) else []
        return (f"task {key} canceled" + (
            f"; the outcome of action(s) {', '.join(map(str, stuck))} stays unknown: check "
            "their destinations" if stuck else ""))
    if not outcome.recorded and header.cancel is not None:
        return (f"a cancel of task {key} was already requested at "
                f"{_when(header.cancel.requested_at)} (reason: {header.cancel.reason!r}); "
                "the first request stands")
    if outcome.observed_by is not None and header.lease is not None:
        return (f"cancel of task {key} recorded; worker {outcome.observed_by!r} holds the lease "
                f"(fence {header.lease.fence}, until {_when(header.lease.expires_at)}) and "
                "stops the task when it next renews its lease; if that worker is gone, the "
                "next run of the task after the lease expires cancels it")
    if header.status == "recovery_required":
        stuck = header.error.details.get("action_ids") if header.error else None
        stuck = stuck if isinstance(stuck, list) else []
        return (f"cancel of task {key} recorded; it needs a decision first: action(s) "
                f"{', '.join(map(str, stuck)) or '?'} may have taken effect (resolve each, "
                "then cancel again)")
    return (f"cancel of task {key} recorded; no worker holds its lease now, so the next "
            "run of the task cancels it")


# --- timeline -----------------------------------------------------------------------------

@cli.command("timeline")
@click.argument("key", callback=_key)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Events per page.")
@click.option("--cursor", callback=_text, default=None, metavar="CURSOR",
              help="Continue after a page: its next_cursor.")
@click.option("--all", "all_pages", is_flag=True, help="Follow cursors to the end.")
@json_option
@click.pass_context
def timeline_command(ctx: click.Context, key: str, limit: int, cursor: str | None,
                     all_pages: bool, as_json: bool) -> None:
    """Page through a task's journal in its stable order."""

    async def fetch(store: DurableTaskStore) -> TimelinePage:
        reader = _reader(store)
        page = await reader.timeline(key, cursor=cursor, limit=limit)
        events = list(page.events)
        while all_pages and page.next_cursor is not None:
            page = await reader.timeline(key, cursor=page.next_cursor, limit=limit)
            events.extend(page.events)
        return page.model_copy(update={"events": tuple(events)}) if all_pages else page

    config: CliConfig = ctx.obj
    page = run_with_store(config, fetch, read_only=True)
    if as_json:
        _emit_json(page)
        return
    _render_timeline(_console(), page)
    if page.next_cursor is not None:
        args = ["timeline", page.key]
        if ctx.get_parameter_source("limit") == click.core.ParameterSource.COMMANDLINE:
            args += ["--limit", str(limit)]
        click.echo(_shown(f"more: {_hint(config, [*args, '--cursor', page.next_cursor])}"))


def _render_timeline(console: Console, page: TimelinePage) -> None:
    stamps = [_when(e.at, precise=True) for e in page.events]
    days = {stamp[:10] for stamp in stamps}
    # One day: its date goes in the title and the data column keeps the width.
    on = f" on {days.pop()}" if len(days) == 1 else ""
    console.print(_table(
        f"timeline of {page.key}: {len(page.events)} of {page.total} event(s){on} (UTC)",
        [("seq", "num"), ("at", "fixed"), ("kind", "fixed"), ("node", "id"), ("fence", "num"),
         ("data", "text")],
        [[str(e.seq), stamp[11:] if on else stamp, _t(e.kind), _t(e.node_id or "-"),
          "-" if e.fence is None else str(e.fence), _t(_compact(e.data))]
         for e, stamp in zip(page.events, stamps, strict=True)]))


# --- demo -----------------------------------------------------------------------------------

from agentium_graph.demo._command import demo_command  # noqa: E402  (registered last)

cli.add_command(demo_command)

from agentium_graph._cli_resolve import resolve_command  # noqa: E402  (registered last)

cli.add_command(resolve_command)
