"""The one place where sqlite3 (and stored-record parse) failures become store errors.

Every call into sqlite3 runs inside :func:`mapped_errors`, so no raw ``sqlite3`` exception
ever leaves the package. Domain errors raised by the shared state machine
(``StaleFenceError``, ``LeaseHeldError``, ...) are ``AgentiumGraphError`` subclasses and
pass through unchanged.

``SQLITE_BUSY``/``SQLITE_LOCKED`` become :class:`BusyError`, the only retried error; when
the bounded retries run out the store raises a plain ``StoreUnavailableError``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from agentium_graph.errors import StoreError, StoreSchemaError, StoreUnavailableError

# Primary result codes (the low byte of an extended code), from sqlite3.h.
_BUSY, _LOCKED, _CORRUPT, _READONLY, _IOERR, _FULL, _CANTOPEN, _PERM, _NOTADB = (
    5, 6, 11, 8, 10, 13, 14, 3, 26)


class BusyError(StoreUnavailableError):
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock; retried."""

    code = "store_busy"


def _primary_code(exc: sqlite3.Error | sqlite3.Warning) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def map_sqlite_error(exc: sqlite3.Error | sqlite3.Warning, path: Path, op: str) -> StoreError:
    """The typed store error for a sqlite3 failure of ``op`` on the file at ``path``."""
    code = _primary_code(exc)
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    details = {"path": str(path), "op": op, "sqlite_error": name}
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
    if code in (_READONLY, _PERM):
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
    if code == _IOERR:
        return StoreError(f"{where}: the operating system reported an I/O error; check the "
                          "disk, then run the task again (it stays recoverable)",
                          details=details)
    if isinstance(exc, sqlite3.ProgrammingError):
        return StoreError(f"{where}: the connection is unusable; close the store and open "
                          "a new SQLiteDurableTaskStore", details=details)
    return StoreError(f"{where}; the task was not changed by this operation",
                      details=details)


@contextmanager
def mapped_errors(path: Path, op: str) -> Iterator[None]:
    """Translate sqlite3 and stored-record parse errors raised inside the block."""
    try:
        yield
    except (sqlite3.Error, sqlite3.Warning) as exc:  # Warning is not an Error subclass
        raise map_sqlite_error(exc, path, op) from exc
    except ValidationError as exc:
        raise StoreSchemaError(
            f"SQLite store {str(path)!r}: {op} read a record this version of "
            f"agentium-graph-sqlite cannot parse ({exc.error_count()} problem(s)); the file "
            "was written by an incompatible version: upgrade agentium-graph-sqlite or use a "
            "new file", details={"path": str(path), "op": op}) from exc


def busy_exhausted(last: BusyError, path: Path, op: str, attempts: int,
                   busy_timeout_s: float) -> StoreUnavailableError:
    """The error raised when SQLITE_BUSY outlived every bounded retry."""
    return StoreUnavailableError(
        f"SQLite store {str(path)!r}: {op} stayed locked by another connection through "
        f"{attempts} attempt(s) of up to {busy_timeout_s:g}s each; nothing was written and the "
        "task stays recoverable. Find the process holding a long write transaction on this "
        "file, or raise busy_timeout_s / busy_retries, then retry",
        details={**last.details, "attempts": attempts, "busy_timeout_s": busy_timeout_s})
