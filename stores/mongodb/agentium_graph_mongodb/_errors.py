"""The one place where pymongo and bson failures become store errors.

Every driver call of the store runs inside :func:`mapped_errors`, so no raw ``pymongo`` or
``bson`` exception leaves the package. Errors are classified by exception class and
server error code, never by message text or server version:

* transient (the network, a stepping-down primary, a shutting-down server, a write
  concern that could not be confirmed) become :class:`TransientStoreError`, the only
  error the store retries; when the bounded retries run out the store raises a plain
  :class:`~agentium_graph.StoreUnavailableError` (:func:`retries_exhausted`);
* authentication and authorization failures say to check the credentials and roles;
* documents over the BSON size limit (or integers beyond 64 bits) say what to change;
  a server that refuses such a write with a generic internal error (SecantusDB's
  ``findAndModify``: code 1, ``InternalError``) gets the same error once the store has
  measured that the write would indeed take the document over the limit
  (:func:`internal_error_of`, ``too_large=True``);
* everything else is a :class:`~agentium_graph.StoreError` naming the operation.

Domain errors of the shared state machine (``StaleFenceError``, ``LeaseHeldError``, ...)
are ``AgentiumGraphError`` subclasses and pass through unchanged. Duplicate keys are not
errors for this store: the operations that insert handle them as idempotency results.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from bson.errors import BSONError, InvalidDocument
from pydantic_core import PydanticSerializationError
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    ConnectionFailure,
    DocumentTooLarge,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
)
from pymongo.errors import ConfigurationError as DriverConfigurationError

from agentium_graph.errors import ConfigurationError, StoreError, StoreUnavailableError

# Server error codes that mean "try again": network and host errors, elections, shutdown,
# not-primary, and time limits. (pymongo's own retryable-error list, plus time limits.)
TRANSIENT_CODES = frozenset({
    6,      # HostUnreachable
    7,      # HostNotFound
    50,     # MaxTimeMSExpired
    64,     # WriteConcernFailed (wtimeout): the write may or may not have applied
    89,     # NetworkTimeout
    91,     # ShutdownInProgress
    134,    # ReadConcernMajorityNotAvailableYet
    189,    # PrimarySteppedDown
    262,    # ExceededTimeLimit
    9001,   # SocketException
    10107,  # NotWritablePrimary
    11600,  # InterruptedAtShutdown
    11602,  # InterruptedDueToReplStateChange
    13435,  # NotPrimaryNoSecondaryOk
    13436,  # NotPrimaryOrSecondary
})
AUTH_CODES = frozenset({18, 13, 11})  # AuthenticationFailed, Unauthorized, UserNotFound
# BSONObjectTooLarge; "resulting document after update is larger than ..." (17419, 17420).
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
DOCUMENT_LIMIT_MIB = 16  # MongoDB's maximum BSON document size
DOCUMENT_LIMIT_BYTES = DOCUMENT_LIMIT_MIB * 1024 * 1024
#: InternalError: what a server answers for a failure it does not classify. SecantusDB
#: (the tests' fallback server) answers it, with the text "internal server error", for a
#: ``findAndModify`` whose result would be over the limit, where mongod answers 10334. Too
#: generic to mean "too large" by itself: the store measures before it says so.
INTERNAL_ERROR = 1
#: Every message built from a driver exception stays within this many characters: a
#: driver's text can quote a whole rejected document (tens of megabytes).
MESSAGE_CAP = 2000
_DRIVER_TEXT_CAP = 600  # how much of the driver's own text a message quotes
DUPLICATE_KEY = 11000
DATABASE_DIFFER_CASE = 13297  # a database whose name differs only in case exists
_TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError")


class TransientStoreError(StoreUnavailableError):
    """A failure that may pass on its own; retried (bounded, jittered) by the store."""

    code = "store_transient"


class RedoSideWrites(Exception):
    """A compare-and-set met a transient failure: the server may have restarted and lost
    side records it had acknowledged, so they must be inserted again before it is retried.
    ``last`` is the failure."""

    def __init__(self, last: TransientStoreError) -> None:
        super().__init__(str(last))
        self.last = last


class FailureWatch:
    """How many transient failures the driver calls of one transition met."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


_WATCH: ContextVar[FailureWatch | None] = ContextVar("agentium_graph_mongodb_watch",
                                                     default=None)


@contextmanager
def watching_failures() -> Iterator[FailureWatch]:
    """Count the transient failures of the driver calls made inside the block (the tasks
    it starts, which copy the context, included)."""
    watch = FailureWatch()
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def note_transient_failure() -> None:
    watch = _WATCH.get()
    if watch is not None:
        watch.count += 1


def bounded(text: str, limit: int = _DRIVER_TEXT_CAP) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 40)  # room for the marker
    return f"{text[:keep]}... [{len(text) - keep} more characters]"


def _code(exc: PyMongoError) -> int | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def _bulk_codes(exc: BulkWriteError) -> tuple[set[int], set[int]]:
    details: Mapping[str, Any] = exc.details or {}
    write = {int(e.get("code", 0)) for e in details.get("writeErrors", ())}
    concern = {int(e.get("code", 0)) for e in details.get("writeConcernErrors", ())}
    return write, concern


def _client_bulk_codes(exc: ClientBulkWriteException) -> tuple[set[int], set[int]]:
    def code(e: Any) -> int:
        found = e.get("code", 0) if isinstance(e, Mapping) else getattr(e, "code", 0)
        return int(found or 0)
    return ({code(e) for e in exc.write_errors or []},
            {code(e) for e in exc.write_concern_errors or []})


def _cause(exc: PyMongoError | BSONError | OverflowError) -> PyMongoError | BSONError | \
        OverflowError:
    """The error that decides: a client bulk write's top-level error when it has one."""
    if isinstance(exc, ClientBulkWriteException) and isinstance(
            exc.error, PyMongoError | BSONError):
        return exc.error
    return exc


def is_dns_failure(exc: PyMongoError) -> bool:
    """A mongodb+srv:// host name that did not resolve (or whose lookup timed out): pymongo
    reports it as a ConfigurationError raised by the first call, not at construction."""
    if not isinstance(exc, DriverConfigurationError):
        return False
    text = str(exc)
    return "DNS" in text or "_mongodb._tcp" in text or "resolution" in text.lower()


def is_transient(exc: PyMongoError) -> bool:
    if isinstance(exc, ConnectionFailure):  # AutoReconnect, NetworkTimeout, NotPrimary, ...
        return True
    if is_dns_failure(exc):  # a name server that is down now may answer on the next try
        return True
    if isinstance(exc, ClientBulkWriteException):
        write, concern = _client_bulk_codes(exc)
        return bool((write | concern) & TRANSIENT_CODES) and not write - TRANSIENT_CODES - {
            DUPLICATE_KEY}
    if isinstance(exc, BulkWriteError):
        write, concern = _bulk_codes(exc)
        return bool((write | concern) & TRANSIENT_CODES) and not write - TRANSIENT_CODES - {
            DUPLICATE_KEY}
    if isinstance(exc, OperationFailure):
        if _code(exc) in TRANSIENT_CODES:
            return True
        return any(exc.has_error_label(label) for label in _TRANSIENT_LABELS)
    return False


def _write_codes(exc: PyMongoError | BSONError | OverflowError) -> set[int]:
    """The per-write error codes of a bulk write (empty for any other error)."""
    if isinstance(exc, ClientBulkWriteException):
        return _client_bulk_codes(exc)[0]
    if isinstance(exc, BulkWriteError):
        return _bulk_codes(exc)[0]
    return set()


def is_too_large(exc: PyMongoError | BSONError | OverflowError) -> bool:
    """A document over the BSON size limit, refused by the driver or by the server."""
    exc = _cause(exc)
    if isinstance(exc, DocumentTooLarge):
        return True
    code = _code(exc) if isinstance(exc, PyMongoError) else None
    return code in TOO_LARGE_CODES or bool(_write_codes(exc) & TOO_LARGE_CODES)


def internal_error_of(error: StoreError) -> OperationFailure | None:
    """The server's generic InternalError (code 1) that ``error`` was mapped from, if so."""
    cause = error.__cause__
    if isinstance(cause, OperationFailure) and _code(cause) == INTERNAL_ERROR:
        return cause
    return None


def map_mongo_error(exc: PyMongoError | BSONError | OverflowError, op: str,
                    where: str, *, too_large: bool = False) -> StoreError:
    """The typed store error for a driver failure of ``op`` against ``where``; its message
    stays within :data:`MESSAGE_CAP` characters whatever the driver's text. ``too_large``:
    the caller measured that the failed write was over the document limit."""
    error = _map(exc, op, where, too_large)
    if len(error.args[0]) > MESSAGE_CAP:  # only a very long ``where`` or ``op`` gets here
        error.args = (bounded(error.args[0], MESSAGE_CAP),)
    return error


def _map(exc: PyMongoError | BSONError | OverflowError, op: str, where: str,
         measured_too_large: bool) -> StoreError:
    too_large = measured_too_large or is_too_large(exc)
    exc = _cause(exc)
    name = type(exc).__name__
    code = _code(exc) if isinstance(exc, PyMongoError) else None
    details: dict[str, Any] = {"op": op, "where": where, "driver_error": name}
    if code is not None:
        details["server_code"] = code
    if isinstance(exc, BulkWriteError | ClientBulkWriteException):
        details["write_codes"] = sorted(_write_codes(exc))[:10]
    text = bounded(str(exc))
    head = f"MongoDB store ({where}): {op} failed ({name}{f' {code}' if code else ''}: {text})"
    if isinstance(exc, PyMongoError) and is_transient(exc):
        hint = ("no server was reachable in time" if isinstance(
            exc, ServerSelectionTimeoutError) else
            "the mongodb+srv:// host name did not resolve: check it in the URI, and this "
            "host's DNS" if is_dns_failure(exc) else "a transient server or network failure")
        return TransientStoreError(f"{head}; {hint}", details=details)
    if code in AUTH_CODES or (isinstance(exc, BulkWriteError) and
                              _bulk_codes(exc)[0] & AUTH_CODES) or (
            isinstance(exc, ClientBulkWriteException) and
            _client_bulk_codes(exc)[0] & AUTH_CODES):
        return StoreError(
            f"{head}: authentication or authorization failed; check the user name, password "
            "and authSource in the URI, and that the user may read and write this database",
            details=details)
    if code == DATABASE_DIFFER_CASE:
        return StoreError(
            f"{head}: the server has a database whose name differs from this one only in "
            "case, and MongoDB refuses to create a second one; pass the existing database's "
            "exact name (database=..., the CLI's --database or the URI's path). Nothing was "
            "written", details={**details, "reason": "database_differs_in_case"})
    if too_large:
        return StoreError(
            f"{head}: a record is too large for one MongoDB document: it is over MongoDB's "
            f"{DOCUMENT_LIMIT_MIB} MiB document limit, so nothing was written. Keep task "
            "inputs, outputs, plans and error texts smaller (store large payloads elsewhere "
            "and pass references), or use a store without this limit",
            details={**details, "reason": "document_too_large",
                     "limit_bytes": DOCUMENT_LIMIT_BYTES})
    if isinstance(exc, InvalidDocument):
        return StoreError(
            f"{head}: a record cannot be encoded as a MongoDB (BSON) document", details=details)
    if isinstance(exc, OverflowError):  # bson refuses integers beyond 64 bits
        return StoreError(
            f"{head}: a number does not fit MongoDB's 64-bit integers; keep limits, budgets "
            "and counters within int64", details=details)
    if isinstance(exc, InvalidOperation):
        return StoreError(
            f"{head}: the MongoDB client is closed or unusable; create a new "
            "MongoDBDurableTaskStore (and client)", details=details)
    if isinstance(exc, WriteConcernError):
        return StoreError(
            f"{head}: the server cannot satisfy the write concern; configure a write concern "
            "the deployment supports (for example WriteConcern(w=1, j=True) on a standalone "
            "server). The write may have applied; the task stays recoverable",
            details=details)
    return StoreError(f"{head}; the operation did not complete. Check the server's logs; the "
                      "task stays recoverable", details=details)


@contextmanager
def mapped_errors(op: str, where: str) -> Iterator[None]:
    """Translate pymongo and bson errors raised inside the block."""
    try:
        yield
    except (PyMongoError, BSONError, OverflowError) as exc:
        raise map_mongo_error(exc, op, where) from exc


@contextmanager
def text_errors(op: str, where: str) -> Iterator[None]:
    """Refuse text that is not valid Unicode (a lone surrogate: what Python makes of an
    invalid byte in a command-line argument), wherever bson or pydantic's JSON encoder
    meets it: a caller's mistake, not a store failure, so never retried."""
    try:
        yield
    except (UnicodeEncodeError, PydanticSerializationError) as exc:
        raise ConfigurationError(
            f"MongoDB store ({where}): {op} was given text that is not valid Unicode "
            f"({bounded(str(exc), 200)}): a lone surrogate, as Python decodes an invalid "
            "byte of a command-line argument. Pass keys, ids and texts as valid UTF-8 "
            "text; the task was not changed",
            details={"op": op, "where": where}) from exc


def retries_exhausted(last: TransientStoreError, op: str, where: str, attempts: int,
                      elapsed_s: float) -> StoreUnavailableError:
    """The error raised when a transient failure outlived every bounded retry."""
    return StoreUnavailableError(
        f"MongoDB store ({where}): {op} kept failing through {attempts} attempt(s) over "
        f"{elapsed_s:.1f}s: {bounded(str(last), MESSAGE_CAP // 2)}. Check that the server "
        "is running and reachable from this host (URI, network, firewall, replica set "
        "health), then run the task again: it stays recoverable. To wait longer, raise "
        "the store's retries / server_selection_timeout_s (or serverSelectionTimeoutMS in "
        "the URI, which the CLI takes too)",
        details={**last.details, "attempts": attempts, "elapsed_s": round(elapsed_s, 3)})


def closed_error(where: str) -> StoreError:
    return StoreError(f"MongoDB store ({where}) is closed; create a new "
                      "MongoDBDurableTaskStore to use the database again",
                      details={"where": where})


def stalled_call(op: str, where: str, deadline_s: float | None, *,
                 replaced: bool) -> StoreUnavailableError:
    """A driver call that gave no answer within its whole-call bound. Not retried: the
    same call on a stuck client would stall again. Like a lost reply, a write may have
    applied, which the store's writes are built for."""
    then = ("the store replaced its client, so run the task again: it stays recoverable"
            if replaced else "close the AsyncMongoClient you passed and create a new one "
            "(or pass a mongodb:// URI: the store then replaces a stuck client itself), "
            "then run the task again: it stays recoverable")
    return StoreUnavailableError(
        f"MongoDB store ({where}): {op} gave no answer within {deadline_s or 0:g}s (the "
        "server selection, connect and socket timeouts together, twice the socket one, "
        f"plus 5s): the server stopped answering or the driver is stuck; {then}",
        details={"op": op, "where": where, "driver_error": "stalled",
                 "deadline_s": deadline_s, "client_replaced": replaced})


def driver_failure(exc: RuntimeError, op: str, where: str) -> TransientStoreError:
    """A RuntimeError out of the driver (its async pool's locks after a cancel, as
    pymongo 4.20 raises "cannot wait on un-acquired lock"): transient, and retried."""
    return TransientStoreError(
        f"MongoDB store ({where}): {op} failed inside the MongoDB driver (RuntimeError: "
        f"{bounded(str(exc), 200)}); a transient driver failure",
        details={"op": op, "where": where, "driver_error": "RuntimeError"})


def from_driver(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside pymongo (or the asyncio machinery it waits on),
    not by this package's own code."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and any(part in last.replace("\\", "/") for part in (
        "/pymongo/", "/asyncio/"))
