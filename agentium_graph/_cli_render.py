r"""How the CLI shows stored and user text: escaped for a terminal, in tables that lose no
character at any width, and as JSON (:mod:`agentium_graph.cli` and its commands use these).

Text from the store or the command line reaches the terminal with the characters a terminal
acts on (ESC and the other controls) escaped: :func:`_safe`. Tables are :class:`_Grid`\ s,
whose id and text columns fold instead of being cut.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from pydantic import BaseModel
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from agentium_graph.errors import ErrorInfo
from agentium_graph.store._records import AttemptRecord, LeaseRecord

_DIGEST_CHARS = 12
_HEX_ID = re.compile(r"^([A-Za-z0-9]+[:_])([0-9a-f]{13,})$")
# Characters a terminal may act on rather than show: C0 controls, DEL, C1 controls (ESC and
# CSI start sequences that move the cursor, clear the screen, set the title or open a
# link), the line and paragraph separators and the bidirectional embeddings, overrides and
# isolates (which reorder what follows them).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Those json.dumps leaves as they are (it escapes only C0 controls, and only in strings,
# where every character of _UNSAFE can be): --json writes them as \u escapes.
_UNSAFE_IN_JSON = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
CLIP_CHARS = 80


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in ``…`` when cut: free text of any
    length (a cancel reason) as one table cell or ``key=value`` pair."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _escape(char: str) -> str:
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _safe(text: str) -> str:
    """``text`` (stored or given by a user) fit for a terminal: each character of
    :data:`_UNSAFE` shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``), every other
    character, non-ASCII letters included, as it is. Every human-readable line and table
    cell goes through it; ``--json`` writes them as JSON escapes (:func:`_emit_json`)."""
    return _UNSAFE.sub(lambda match: _escape(match[0]), text)


def _shown(text: str) -> str:
    """:func:`_safe`, and on a stdout that is not UTF-8 each character it cannot encode
    already escaped: a table is laid out with the width it is shown with, and a line that
    click writes (which re-encodes an ASCII stream as UTF-8) is in the stream's encoding."""
    return _encodable(_safe(text), sys.stdout)


def _encodable(text: str, stream: Any) -> str:
    """``text`` with each character that ``stream`` (not UTF-8) cannot encode escaped."""
    if not text.isascii() and not _utf8(stream):
        encoding = getattr(stream, "encoding", None) or "ascii"
        with contextlib.suppress(LookupError):
            text = text.encode(encoding, "backslashreplace").decode(encoding)
    return text


def _t(text: str, style: str = "") -> Text:
    """A table cell or line made of stored or user text: :func:`_shown`, never markup."""
    return Text(_shown(text), style=style)


def _utf8(stream: Any) -> bool:
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "ascii").name == "utf-8"
    except LookupError:
        return False


def _emit_json(model: BaseModel) -> None:
    # Non-ASCII characters as \u escapes unless stdout takes UTF-8: valid JSON either way;
    # the characters a terminal acts on always (the same text once parsed).
    text = json.dumps(model.model_dump(mode="json"), indent=2, sort_keys=True,
                      ensure_ascii=not _utf8(sys.stdout))
    click.echo(_UNSAFE_IN_JSON.sub(lambda match: f"\\u{ord(match[0]):04x}", text))


def _console() -> Console:
    # Resolved per call so click's CliRunner (which swaps sys.stdout) captures tables.
    return Console(highlight=False, soft_wrap=False)


# --- cell helpers -------------------------------------------------------------------------

_STATE_STYLES = {"completed": "green", "confirmed": "green", "running": "cyan",
                 "claimed": "cyan", "prepared": "cyan", "dispatching": "cyan",
                 "failed": "red", "rejected": "red", "uncertain": "bold magenta",
                 "recovery_required": "bold magenta", "canceled": "yellow",
                 "tombstoned": "dim"}


def _status(status: str) -> Text:
    return _t(status, style=_STATE_STYLES.get(status, ""))


_state = _status


def _table(title: str, columns: list[tuple[str, str]], rows: list[list[Text | str]]) -> _Grid:
    """A table whose columns are ``fixed`` (never wrap), ``num``, ``id`` or ``text``: see
    :class:`_Grid`. A ``str`` cell is shown as text (never markup), through :func:`_safe`
    like the title; a ``Text`` cell is built with :func:`_t`."""
    cells = [[_t(cell) if isinstance(cell, str) else cell for cell in row] for row in rows]
    return _Grid(_t(title), columns, cells)


# The fewest characters a line of an ``id`` or a ``text`` cell may keep in a table; a
# terminal too narrow for that shows the rows as records instead (:class:`_Grid`).
_ID_FOLD = 12
_TEXT_FOLD = 10


def _cell_width(text: Text) -> int:
    return max(cell_len(line) for line in text.plain.split("\n"))


class _Grid:
    """A table that loses no character at the width it is shown with (rich calls
    :meth:`__rich_console__` with the console's width, ``COLUMNS`` when piped).

    ``fixed`` and ``num`` columns never wrap; ``id`` columns (keys, node and action ids,
    digests) and ``text`` columns fold onto more lines, never cut with an ellipsis. When
    even folding them at :data:`_ID_FOLD` / :data:`_TEXT_FOLD` characters does not fit (rich
    would then shorten every column and drop the narrowest), each row is shown as a record:
    one ``column  value`` line per column, the values folding at the terminal's width."""

    def __init__(self, title: Text, columns: list[tuple[str, str]],
                 rows: list[list[Text]]) -> None:
        self.title = title
        self.columns = columns
        self.rows = rows

    def _fits(self, width: int) -> bool:
        least = 3 * len(self.columns) + 1  # a padded edge on each side, 3 between columns
        for index, (name, kind) in enumerate(self.columns):
            widest = max([cell_len(name), *(_cell_width(row[index]) for row in self.rows)])
            fold = {"id": _ID_FOLD, "text": _TEXT_FOLD}.get(kind)
            least += widest if fold is None else max(min(widest, fold), cell_len(name))
        return least <= width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._table() if self._fits(options.max_width) else self._records()

    def _table(self) -> Table:
        table = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD)
        for name, kind in self.columns:
            fixed = kind in ("fixed", "num")
            table.add_column(name, justify="right" if kind == "num" else "left",
                             no_wrap=fixed, overflow="ellipsis" if fixed else "fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def _records(self) -> Table:
        table = Table(title=self.title, title_justify="left", show_header=False, box=None,
                      padding=(0, 2, 0, 0))
        table.add_column("column", style="bold", no_wrap=True)
        table.add_column("value", overflow="fold")
        for number, row in enumerate(self.rows):
            if number:
                table.add_row("", "")
            for (name, _), cell in zip(self.columns, row, strict=True):
                table.add_row(name, cell)
        return table


def _compact(data: dict[str, Any]) -> str:
    """``key=value`` pairs with digests and ids shortened, for humans (--json has all)."""
    parts = []
    for name in sorted(data):
        value = data[name]
        if isinstance(value, str):
            shown = _short(value)
        else:
            shown = json.dumps(value, sort_keys=True, ensure_ascii=False,
                               separators=(",", ":"))
        parts.append(f"{name}={clip(shown)}")
    return " ".join(parts)


def _when(moment: datetime | None, *, precise: bool = False) -> str:
    if moment is None:
        return "-"
    moment = moment.astimezone(UTC)
    if precise:
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _relative(moment: datetime, now: datetime) -> str:
    seconds = (moment - now).total_seconds()
    span = abs(seconds)
    text = (f"{span:.0f}s" if span < 120 else f"{span / 60:.0f}m" if span < 7200
            else f"{span / 3600:.0f}h" if span < 172800 else f"{span / 86400:.0f}d")
    return f"in {text}" if seconds >= 0 else f"{text} ago"


def _lease(lease: LeaseRecord | None, now: datetime, *, short: bool = False) -> Text:
    if lease is None:
        return Text("-")
    expired = lease.expires_at <= now
    state = "expired" if expired else "held"
    if short:
        return _t(f"{lease.owner} ({state})", style="dim" if expired else "")
    return _t(f"{lease.owner}, fence {lease.fence}, {state}: expires "
                f"{_when(lease.expires_at)} ({_relative(lease.expires_at, now)})",
                style="dim" if expired else "")


def _deadline(deadline: datetime | None, now: datetime) -> Text:
    if deadline is None:
        return Text("-")
    passed = deadline <= now
    return Text(f"{_when(deadline)} ({_relative(deadline, now)})",
                style="red" if passed else "")


def _attempts(attempts: Sequence[AttemptRecord]) -> Text:
    if not attempts:
        return Text("-")
    # One line per attempt: the only newlines a cell holds are these.
    return Text("\n".join(_safe(f"#{a.number} fence {a.fence} {a.outcome or 'in progress'}")
                          for a in attempts))


def _error(error: ErrorInfo | None) -> Text:
    if error is None:
        return Text("-")
    return _t(f"{error.code}: {error.message}", style="red")


def _short(value: str | None) -> str:
    """A digest or id (``sha256:<hex>``, ``att_<hex>``) cut to 12 hex digits; else as is."""
    if not value:
        return "-"
    match = _HEX_ID.match(value)
    return f"{match[1]}{match[2][:_DIGEST_CHARS]}…" if match else value
