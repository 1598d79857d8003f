"""The one place where sqlite3 (and stored-record parse) failures become store errors.

Every call into sqlite3 runs inside :func:`mapped_errors`, so no raw ``sqlite3`` exception
ever leaves the package. Domain errors raised by the shared state machine
(``StaleFenceError``, ``LeaseHeldError``, ...) are ``AgentiumGraphError`` subclasses and
pass through unchanged.

``SQLITE_BUSY``/``SQLITE_LOCKED`` become :class:`BusyError`, the only retried error; when
the bounded retries run out the store raises a plain ``StoreUnavailableError``.

A stored record that does not parse is reported by :class:`BadRecord` (raised by
``_ops``, which knows the task key and the row) as a ``StoreSchemaError`` naming the row and
saying whether it looks damaged or written by a newer version. Text that cannot be encoded
as UTF-8 (lone surrogates, e.g. from a shell argument holding an invalid byte) is refused
by :func:`check_text` before it reaches sqlite3, as a ``ConfigurationError`` naming the field.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
)

# Primary result codes (the low byte of an extended code), from sqlite3.h.
_BUSY, _LOCKED, _CORRUPT, _READONLY, _IOERR, _FULL, _CANTOPEN, _PERM, _NOTADB = (
    5, 6, 11, 8, 10, 13, 14, 3, 26)
_IOERR_SHORT_READ = 522  # an extended code: SQLITE_IOERR | (2 << 8)


class BusyError(StoreUnavailableError):
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock; retried."""

    code = "store_busy"


# What sqlite3 raises while fetching a TEXT value that is not UTF-8 (it has no error code).
_NOT_UTF8 = re.compile(r"Could not decode to UTF-8 column '([^']*)'")


def not_utf8_column(exc: BaseException) -> str | None:
    """The column named by sqlite3's error for a stored text that is not UTF-8, or None."""
    match = _NOT_UTF8.match(str(exc)) if isinstance(exc, sqlite3.OperationalError) else None
    return None if match is None else match[1]


def _primary_code(exc: sqlite3.Error | sqlite3.Warning) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def read_only_filesystem(path: Path) -> bool:
    """Whether the filesystem holding ``path`` (or its nearest existing parent) is mounted
    read-only (``ST_RDONLY``); False when that cannot be told."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError, ValueError):
        return False


def read_only_fs_message(path: Path) -> str:
    return (f"it is on a read-only filesystem (the mount holding {str(path.parent)!r} is "
            "read-only); remount it read-write or copy the file to a writable location "
            "(reading it with read_only=True works in place)")


def map_sqlite_error(exc: sqlite3.Error | sqlite3.Warning, path: Path, op: str) -> StoreError:
    """The typed store error for a sqlite3 failure of ``op`` on the file at ``path``."""
    code = _primary_code(exc)
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    details = {"path": str(path), "op": op, "sqlite_error": name}
    column = not_utf8_column(exc)
    if column is not None:  # its message quotes the damaged bytes: not shown
        return StoreSchemaError(
            f"SQLite store {str(path)!r}: {op} read a row whose {column!r} column holds text "
            "that is not valid UTF-8, so the row is damaged (on disk, or by a tool that wrote "
            "raw bytes); restore the file from a backup, or find and repair the row; other "
            "tasks stay readable", details={**details, "column": column})
    where = f"SQLite store {str(path)!r}: {op} failed ({name}: {exc})"
    if code in (_BUSY, _LOCKED):
        return BusyError(f"{where}; another connection holds the database lock",
                         details=details)
    if code == _NOTADB:
        return StoreSchemaError(
            f"{where}: the file is not a SQLite database; point the store at a new path "
            "(the file was left unchanged)", details=details)
    if code == _CORRUPT:
        return StoreError(
            f"{where}: the database file is corrupt; stop writing to it, then restore it "
            "from a backup or point the store at a new path", details=details)
    if code in (_READONLY, _PERM, _CANTOPEN) and read_only_filesystem(path):
        return StoreError(f"{where}: {read_only_fs_message(path)}", details=details)
    if code in (_READONLY, _PERM):
        stuck = _unwritable_side_files(path)
        if stuck:
            return StoreError(
                f"{where}: its side file(s) {stuck} are read-only (SQLite gives them the "
                "database file's mode when it creates them, e.g. a reader opened the file "
                f"while it was read-only); make them writable (chmod u+w {' '.join(stuck)}), "
                "or remove them while no process has the database open",
                details={**details, "side_files": stuck})
        return StoreError(
            f"{where}: the database or its directory is read-only; make both writable "
            f"(e.g. chmod u+w {str(path)!r}) or use a writable copy", details=details)
    if code == _CANTOPEN:
        return StoreError(
            f"{where}: cannot open the file; check that {str(path.parent)!r} exists and is "
            "writable by this process", details=details)
    if code == _FULL:
        return StoreError(f"{where}: the disk is full; free space and run the task again "
                          "(nothing was acknowledged, the task stays recoverable)",
                          details=details)
    if code == _IOERR and getattr(exc, "sqlite_errorcode", None) == _IOERR_SHORT_READ:
        return StoreError(
            f"{where}: a read of the database came up short: one of its files was truncated "
            "or removed while in use (a -wal or -shm file deleted by hand, the file "
            "replaced); stop every process that has it open and open it again (the task "
            "stays recoverable); if that fails, restore the file from a backup",
            details=details)
    if code == _IOERR:
        return StoreError(f"{where}: the operating system reported an I/O error; check the "
                          "disk, then run the task again (it stays recoverable)",
                          details=details)
    if isinstance(exc, sqlite3.ProgrammingError):
        return StoreError(f"{where}: the connection is unusable; close the store and open "
                          "a new SQLiteDurableTaskStore", details=details)
    return StoreError(f"{where}; the task was not changed by this operation",
                      details=details)


class BadRecord(Exception):
    """A stored record that does not parse (raised by ``_ops``, mapped by
    :func:`mapped_errors`). ``what`` names the row for a human, e.g. ``"the header of task
    'k'"``; ``sql`` shows how to look at it."""

    def __init__(self, error: ValidationError | None, what: str, key: str, sql: str, *,
                 problem: str | None = None) -> None:
        super().__init__(what)
        self.error = error  # None: a record that parses but contradicts its row (problem)
        self.what = what
        self.key = key
        self.sql = sql
        self.problem = problem


# Error types that a newer version's records would cause (a field or a value this version
# does not know). Anything else (not JSON, missing fields, wrong types) is damage.
_NEWER_TYPES = frozenset({"extra_forbidden", "literal_error", "enum", "union_tag_invalid"})


def _first_problem(error: ValidationError) -> str:
    first = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "record"
    return f"{where}: {first.get('msg', '?')}"


def bad_record_error(bad: BadRecord, path: Path, op: str) -> StoreSchemaError:
    """The error for a stored record this version cannot parse: damage, or maybe newer."""
    error = bad.error
    if error is None:
        return StoreSchemaError(
            f"SQLite store {str(path)!r}: {op} found {bad.what} damaged ({bad.problem}); "
            f"restore the file from a backup, or inspect and repair the row ({bad.sql}); "
            "other tasks stay readable", details={"path": str(path), "op": op, "key": bad.key,
                                                  "problem": bad.problem})
    types = {e["type"] for e in error.errors(include_url=False, include_input=False)}
    details: dict[str, Any] = {"path": str(path), "op": op, "key": bad.key,
                               "problems": error.error_count()}
    where = f"SQLite store {str(path)!r}: {op} cannot parse {bad.what}"
    problem = _first_problem(error)
    if types <= _NEWER_TYPES:
        details["newer"] = True
        return StoreSchemaError(
            f"{where} ({error.error_count()} problem(s), first {problem}): it has fields or "
            "values this agentium-graph-sqlite does not know, so it was probably written by a "
            "newer agentium-graph; upgrade agentium-graph-sqlite to read it. If no newer "
            "version wrote to this file, the row is damaged: restore the file from a backup "
            f"or inspect the row ({bad.sql}); other tasks stay readable", details=details)
    kind = "is not valid JSON" if types & {"json_invalid", "json_type"} else \
        "does not have the stored record's format"
    return StoreSchemaError(
        f"{where}: the row is damaged (it {kind}; {problem}); restore the file from a backup, "
        f"or inspect and repair the row ({bad.sql}); other tasks stay readable",
        details=details)


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(path: Path, op: str, **fields: str | None) -> None:
    """Refuse a string that cannot be stored as UTF-8 (a lone surrogate such as the
    ``'\\udcff'`` Python makes of an invalid byte in a command-line argument)."""
    for name, value in fields.items():
        if value is not None and not _is_text(value):
            raise ConfigurationError(
                f"SQLite store {str(path)!r}: {op} got a {name} that is not valid UTF-8 text "
                f"({value[:80]!r} holds a lone surrogate, e.g. from an invalid byte in a "
                f"shell argument); pass the {name} as valid UTF-8 text",
                details={"path": str(path), "op": op, "field": name})


@contextmanager
def mapped_errors(path: Path, op: str) -> Iterator[None]:
    """Translate sqlite3 and stored-record parse errors raised inside the block."""
    try:
        yield
    except (sqlite3.Error, sqlite3.Warning) as exc:  # Warning is not an Error subclass
        raise map_sqlite_error(exc, path, op) from exc
    except BadRecord as exc:
        raise bad_record_error(exc, path, op) from exc.error
    except ValidationError as exc:  # a record parsed outside _ops' named parses
        raise StoreSchemaError(
            f"SQLite store {str(path)!r}: {op} read a record this version of "
            f"agentium-graph-sqlite cannot parse ({exc.error_count()} problem(s), first "
            f"{_first_problem(exc)}); the row is damaged or was written by a newer version: "
            "restore the file from a backup, or upgrade agentium-graph-sqlite if a newer one "
            "wrote it", details={"path": str(path), "op": op}) from exc
    except (UnicodeEncodeError, PydanticSerializationError) as exc:
        # Text that is not UTF-8 somewhere check_text does not look (a record's contents).
        raise ConfigurationError(
            f"SQLite store {str(path)!r}: {op} was given text that is not valid UTF-8 "
            f"({exc}); pass valid UTF-8 text (nothing was written)",
            details={"path": str(path), "op": op}) from exc
    except OverflowError as exc:
        raise ConfigurationError(
            f"SQLite store {str(path)!r}: {op} was given an integer SQLite cannot store "
            f"({exc}); integers must fit in 64 bits (nothing was written)",
            details={"path": str(path), "op": op}) from exc


def write_protected(path: str | Path) -> bool:
    """Whether this process may not write the existing file ``path``, or its mode marks it
    read-only (root passes ``access()`` even then)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not os.access(path, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP |
                                                       stat.S_IWOTH)


def _unwritable_side_files(path: Path) -> list[str]:
    """The -wal and -shm files of ``path`` that exist and this process may not write."""
    real = os.path.realpath(path)
    return [side for side in (real + "-wal", real + "-shm")
            if os.path.exists(side) and write_protected(side)]


def busy_exhausted(last: BusyError, path: Path, op: str, attempts: int,
                   busy_timeout_s: float) -> StoreUnavailableError:
    """The error raised when SQLITE_BUSY outlived every bounded retry."""
    return StoreUnavailableError(
        f"SQLite store {str(path)!r}: {op} stayed locked by another connection through "
        f"{attempts} attempt(s) of up to {busy_timeout_s:g}s each; nothing was written and the "
        "task stays recoverable. Find the process holding a long write transaction on this "
        "file, then retry (a store opened in code can wait longer: raise its busy_timeout_s "
        "or busy_retries)",
        details={**last.details, "attempts": attempts, "busy_timeout_s": busy_timeout_s})
