"""SQLiteDurableTaskStore: the async facade over one connection owned by one worker thread."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import queue
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from agentium_graph._otel import traced_store
from agentium_graph.errors import ConfigurationError, StoreError, check_flags, shown
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import JournalEntry, TaskHeader, TaskIdentity, TaskSnapshot
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    StoreCapabilities,
    TimelineRequest,
)
from agentium_graph_sqlite import _ops
from agentium_graph_sqlite._checkpoint import Checkpointer
from agentium_graph_sqlite._errors import BusyError, busy_exhausted, check_text, mapped_errors
from agentium_graph_sqlite._schema import (
    SCHEMA_VERSION,
    Settings,
    empty_wal_if_replaced,
    open_database,
    open_read_only,
)

log = logging.getLogger("agentium_graph.sqlite")

T = TypeVar("T")
R = TypeVar("R")
Synchronous = Literal["FULL", "NORMAL"]


@dataclass(frozen=True, slots=True)
class SQLiteStoreStats:
    """Counters since the store was constructed; subtract two snapshots to measure a span.

    ``commits``: committed write transactions (each one durable commit: one WAL fsync at
    ``synchronous="FULL"``). ``bytes_written``: UTF-8 payload bytes of the records and blobs
    those transactions wrote (JSON text, not SQLite page I/O). ``reads``: read operations.
    ``busy_retries``: attempts repeated because another connection held the lock.
    """

    commits: int = 0
    bytes_written: int = 0
    reads: int = 0
    busy_retries: int = 0

    def __sub__(self, other: SQLiteStoreStats) -> SQLiteStoreStats:
        return SQLiteStoreStats(self.commits - other.commits,
                                self.bytes_written - other.bytes_written,
                                self.reads - other.reads,
                                self.busy_retries - other.busy_retries)


_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


_MAX_WAIT_S = 86_400.0  # a day: far beyond any sensible lock wait, and fits SQLite's int


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return  # the awaiting coroutine was canceled; the operation itself still ran
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker:
    """The one thread that owns a store's connection; calls run one at a time, in order.

    A bare thread and a ``SimpleQueue`` rather than a ``ThreadPoolExecutor``: each store
    call is one hand-off each way, and the executor's extra locking and bookkeeping cost
    about as much again on the per-commit path. The thread is a daemon so a store nobody
    closed never keeps the interpreter alive (an interrupted transaction is rolled back by
    SQLite on the next open).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | _Wake | None] = queue.SimpleQueue()
        self._urgent: collections.deque[_Job] = collections.deque()
        self._stopping = False
        # The thread holds only the queues, never this object: a store dropped without
        # close() is collected, and its finalizer ends the thread.
        self._thread = threading.Thread(target=_serve, args=(self._jobs, self._urgent),
                                        name=name, daemon=True)
        self._thread.start()
        weakref.finalize(self, self._jobs.put, None)

    def submit(self, call: Callable[[], T], *, urgent: bool = False) -> asyncio.Future[T]:
        """Queue ``call``; ``urgent`` (a lease renewal) runs before every job queued but not
        started: a renewal stuck behind a backlog of commits (many tasks at once, threads
        of CPU-bound tools holding the GIL) could otherwise answer after the lease expired."""
        if self._stopping:
            raise RuntimeError("worker stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if urgent:
            self._urgent.append((call, loop, future))
            self._jobs.put(_WAKE)  # a worker blocked on the queue takes it at once
        else:
            self._jobs.put((call, loop, future))
        return future

    def stop(self) -> None:
        """Let queued calls finish, then end the thread."""
        self._stopping = True
        self._jobs.put(None)



class _Wake:
    """Put on the queue beside an urgent job: it wakes the worker, which runs urgent jobs
    first, and is then skipped."""


_WAKE = _Wake()


def _serve(jobs: queue.SimpleQueue[_Job | _Wake | None],
           urgent: collections.deque[_Job]) -> None:
    """The worker thread: run queued calls in order until the stop signal (None), urgent
    ones before whatever is queued when they arrive."""
    while True:
        item = jobs.get()
        while urgent:
            _run(urgent.popleft())
        if item is None:
            return
        if not isinstance(item, _Wake):
            _run(item)
        del item


def _run(job: _Job) -> None:
    call, loop, future = job
    result: Any = None
    error: BaseException | None = None
    try:
        result = call()
    except BaseException as exc:  # delivered to the awaiting coroutine
        error = exc
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
        loop.call_soon_threadsafe(_settle, future, result, error)
    # The error's traceback holds this frame: without these names the frame no longer
    # holds the error, the future and the call (and through it the store) in a cycle.
    del job, call, loop, future, result, error


def _fspath(path: object) -> str | bytes:
    """``os.fspath(path)``, or a ConfigurationError naming ``path`` for anything that is no
    path (None, a number: os.fspath would raise a bare TypeError)."""
    if isinstance(path, str | bytes | os.PathLike):
        with contextlib.suppress(TypeError):  # an __fspath__ that returns neither
            text: str | bytes = os.fspath(path)
            return text
    raise ConfigurationError(
        f"SQLiteDurableTaskStore path must be a str or an os.PathLike (e.g. a pathlib.Path) "
        f"naming the database file, not {type(path).__name__}", details={"argument": "path"})


def _check_path(text: str) -> None:
    """Refuse, without I/O, a path string no file can have or that names a directory."""
    if "\0" in text:
        raise ConfigurationError(
            f"SQLiteDurableTaskStore path {text!r} contains a NUL character, which no file "
            "path can hold; pass the database file's path", details={"argument": "path"})
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"SQLiteDurableTaskStore path {text!r} is not valid UTF-8 text (it holds a lone "
            "surrogate, e.g. from an invalid byte in a shell argument); SQLite needs a UTF-8 "
            "path: rename the file or its directory", details={"argument": "path"}) from None
    if text.endswith(("/", os.sep)) or text.endswith(("/.", "/..")) or text in (".", ".."):
        raise ConfigurationError(
            f"SQLiteDurableTaskStore path {text!r} names a directory; pass a database file "
            "path inside it, e.g. " + repr(text.rstrip("/" + os.sep) + "/tasks.db"),
            details={"argument": "path"})


@traced_store("sqlite")
class SQLiteDurableTaskStore:
    """A durable task store in one SQLite file (WAL mode); safe for several processes.

    ``path``: the database file. Its directory must exist; the file is created on first
    use. Constructing the store does no I/O: the first operation opens the file, refuses
    anything that is not an agentium-graph-sqlite database (another application's SQLite
    file, a non-SQLite file, a file written by a newer schema, a read-only file, a file
    whose schema pages are corrupt) with a typed :class:`~agentium_graph.StoreError` or
    :class:`~agentium_graph.StoreSchemaError` *without modifying it*, and creates the
    tables idempotently. Damage inside data pages surfaces as a ``StoreError`` from the
    operation that reads it.

    ``synchronous``:

    * ``"FULL"`` (default): every acknowledged commit is fsynced to the WAL before the call
      returns, so it survives a process crash *and* a power loss or OS crash.
    * ``"NORMAL"``: commits are fsynced only at WAL checkpoints. Faster (no fsync per
      commit). An acknowledged commit still survives a process crash or SIGKILL, but a
      **power loss or OS crash can lose the most recent acknowledged commits** (the
      database stays consistent; it rolls back to an earlier commit). After such a loss a
      worker may redo work it had already reported done, including effects whose receipts
      were lost; use it only where that is acceptable.

    ``read_only=True``: only read. The first operation opens the file with a read-only
    connection (``mode=ro``): it must already be an agentium-graph-sqlite database (a
    missing, empty or blank SQLite file, or another application's, is refused with a typed
    error), and nothing in it is ever created, converted or migrated (SQLite itself may
    create the empty ``-wal``/``-shm`` side files of a WAL database in a writable
    directory); a file of an older schema version is read as it is (a writing store
    migrates it). The file itself may be read-only, and so may its directory or mount:
    where SQLite cannot create the ``-shm`` file a reader needs (a read-only mount, or a
    directory this user may not write while no worker has the file open), a file whose
    write-ahead log holds no commits is read as immutable (fine for a short read; a long-
    lived reader would not see later commits), and one whose log does is refused with a
    typed error. Every mutating operation raises :class:`~agentium_graph.StoreError`
    without touching the file. This is how the ``agentium-graph`` CLI's ``list``,
    ``inspect`` and ``timeline`` open a store.

    ``create=False``: a writing store that refuses a file that is not already an
    agentium-graph-sqlite database (missing, empty, or a SQLite file without our tables)
    instead of creating the schema in it; an older schema is still migrated. The CLI's
    writing commands (``cancel``, ``resolve``) use it.

    ``busy_timeout_s``: how long one attempt waits for another connection's write lock.
    ``busy_retries``: how many times a transaction that still found the database locked is
    retried (with jittered exponential backoff up to ``retry_max_wait_s``); when they run
    out the operation raises :class:`~agentium_graph.StoreUnavailableError`, nothing was
    written and the task stays recoverable.

    Arguments are checked at construction, before any I/O, and types are exact:
    ``read_only`` and ``create`` take real bools (not 1 or ``"yes"``), ``busy_retries`` a
    real int, the ``*_s`` durations an int or a float (not a bool or a string). A wrong one
    is a :class:`~agentium_graph.ConfigurationError` naming it (``details["argument"]``).

    Every mutating operation is one ``BEGIN IMMEDIATE`` transaction applying the shared
    state machine (:mod:`agentium_graph.store`), so fencing holds across processes.
    Domain errors of that state machine (``StaleFenceError``, ``LeaseHeldError``, ...)
    roll the transaction back and propagate unchanged; driver failures are only ever
    raised as ``StoreError`` subclasses, never as ``sqlite3`` exceptions. All sqlite3
    calls run on one dedicated worker thread per store that owns the connection; the
    event loop never blocks on the database. WAL checkpoints run on a second thread with
    its own connection, started once the store has written about 1000 pages, so they stay
    out of commits (see ``_checkpoint.py``); its failures are logged to
    ``agentium_graph.sqlite``, never raised. :attr:`stats` counts durable commits and
    bytes written. Close with ``await store.close()`` (which also ends the checkpointer)
    or use ``async with``.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: Synchronous = "FULL",
                 busy_timeout_s: float = 5.0, busy_retries: int = 4,
                 retry_max_wait_s: float = 0.5, read_only: bool = False,
                 create: bool = True) -> None:
        text = _fspath(path)
        if not isinstance(text, str) or not text or text == ":memory:" or \
                text.startswith("file:"):
            raise ConfigurationError(
                f"SQLiteDurableTaskStore needs a filesystem path, got {text!r}; for a "
                "process-local store use InMemoryDurableTaskStore()",
                details={"argument": "path"})
        if "://" in text:
            raise ConfigurationError(
                f"SQLiteDurableTaskStore needs a filesystem path, got the URI {text!r}; pass "
                f"the path part (for sqlite:///data/tasks.db pass 'data/tasks.db')",
                details={"argument": "path"})
        _check_path(text)
        check_flags(read_only=read_only, create=create)
        if not isinstance(synchronous, str) or \
                (sync := synchronous.upper()) not in ("FULL", "NORMAL"):
            raise ConfigurationError(
                f"synchronous must be 'FULL' (default, survives power loss) or 'NORMAL', "
                f"got {shown(synchronous)}",
                details={"argument": "synchronous"})
        for name, seconds in (("busy_timeout_s", busy_timeout_s),
                              ("retry_max_wait_s", retry_max_wait_s)):
            # SQLite takes the busy timeout in whole milliseconds, as a 32-bit int.
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or \
                    not 0 < seconds <= _MAX_WAIT_S:
                raise ConfigurationError(
                    f"{name} must be a number of seconds (an int or a float) above 0 and at "
                    f"most {_MAX_WAIT_S:g}, got {shown(seconds)}", details={"argument": name})
        if not isinstance(busy_retries, int) or isinstance(busy_retries, bool) or \
                not 0 <= busy_retries <= 100:
            raise ConfigurationError(f"busy_retries must be an int from 0 to 100, got "
                                     f"{shown(busy_retries)}",
                                     details={"argument": "busy_retries"})
        self._settings = Settings(path=Path(text).absolute(), synchronous=sync,
                                  busy_timeout_s=float(busy_timeout_s), read_only=read_only,
                                  create=create)
        # The file's schema version: an older one is read as it is by a read-only store.
        self._version = SCHEMA_VERSION
        self._busy_retries = busy_retries
        self._retry_max_wait_s = retry_max_wait_s
        self._capabilities = StoreCapabilities(durable=True, multi_process=True,
                                               name="sqlite")
        self._executor: _Worker | None = None
        self._executor_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread
        self._closed = False
        # Set once the connection is closed (or there was none); a close() that finds the
        # store closing waits for it: see close(). Both under _executor_lock.
        self._shut = False
        self._shut_waiters: list[asyncio.Future[None]] = []
        self._pid = os.getpid()
        self._inherited: list[tuple[_Worker, sqlite3.Connection | None]] = []
        # The background WAL checkpointer (see _checkpoint.py): created by the worker thread
        # at the first write and touched only there, like _conn.
        self._checkpointer: Checkpointer | None = None
        self._inherited_checkpointers: list[Checkpointer] = []
        self._stats = SQLiteStoreStats()
        # What the worker thread last wrote of each task (see _ops.Kept); worker thread only.
        self._kept = _ops.Kept()

    # --- properties ---------------------------------------------------------------------
    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    @property
    def path(self) -> Path:
        return self._settings.path

    @property
    def read_only(self) -> bool:
        """Whether this store only reads (see the class docstring)."""
        return self._settings.read_only

    @property
    def synchronous(self) -> Synchronous:
        return "FULL" if self._settings.synchronous == "FULL" else "NORMAL"

    @property
    def stats(self) -> SQLiteStoreStats:
        """A snapshot of the store's counters (see :class:`SQLiteStoreStats`)."""
        return self._stats

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else \
            ", create=False" if not self._settings.create else ""
        return (f"SQLiteDurableTaskStore({str(self.path)!r}, "
                f"synchronous={self._settings.synchronous!r}{mode})")

    # --- plumbing -----------------------------------------------------------------------
    def _closed_error(self) -> StoreError:
        return StoreError(f"SQLite store {str(self.path)!r} is closed; create a new "
                          "SQLiteDurableTaskStore to use the file again",
                          details={"path": str(self.path)})

    def _worker(self) -> _Worker:
        if self._closed:
            raise self._closed_error()
        with self._executor_lock:
            if self._executor is not None and self._pid != os.getpid():
                # A forked child: the thread and connection belong to the parent. SQLite
                # connections must not cross fork, so keep them untouched and start afresh.
                self._inherited.append((self._executor, self._conn))
                self._executor, self._conn = None, None
                if self._checkpointer is not None:  # its thread is gone, its connection not ours
                    self._inherited_checkpointers.append(self._checkpointer)
                    self._checkpointer = None
                self._kept = _ops.Kept()
            if self._executor is None:
                self._executor = _Worker("agentium-sqlite")
                self._pid = os.getpid()
            return self._executor

    async def _on_worker(self, call: Callable[[], T], urgent: bool = False) -> T:
        executor = self._worker()
        try:
            future = executor.submit(call, urgent=urgent)
        except RuntimeError:  # close() stopped the worker meanwhile
            raise self._closed_error() from None
        return await future

    def _connection(self) -> sqlite3.Connection:
        # Worker thread only. A failed open is not cached: the next operation tries again.
        if self._conn is None:
            if self._shut:  # a call queued behind close()'s must not reopen the file
                raise self._closed_error()
            if self._settings.read_only:
                self._conn, self._version = open_read_only(self._settings)
            else:
                self._conn = open_database(self._settings)
        return self._conn

    def _call(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        with mapped_errors(self.path, op):
            return fn(self._connection())

    async def _submit(self, op: str, fn: Callable[[sqlite3.Connection], T],
                      urgent: bool = False) -> T:
        """Run ``fn`` on the worker thread, retrying only SQLITE_BUSY/LOCKED (bounded)."""
        call = functools.partial(self._call, op, fn)
        try:
            # Fast path: no retry machinery unless the database is actually locked.
            return await self._on_worker(call, urgent)
        except BusyError as exc:
            failed = exc
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._busy_retries + 1),
            wait=wait_random_exponential(multiplier=0.005, max=self._retry_max_wait_s),
            retry=retry_if_exception_type(BusyError), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number == 1:
                        raise failed  # the fast path's attempt: back off (jittered), retry
                    self._bump(busy_retries=1)
                    return await self._on_worker(call, urgent)
        except BusyError as exc:
            raise busy_exhausted(exc, self.path, op, self._busy_retries + 1,
                                 self._settings.busy_timeout_s) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _write(self, op: str, fn: Callable[[sqlite3.Connection], _ops.Outcome[T]],
                     urgent: bool = False) -> T:
        if self._settings.read_only:
            raise StoreError(
                f"SQLite store {str(self.path)!r}: {op} writes, but this store was opened "
                "read-only (read_only=True); open it without read_only to change tasks "
                "(nothing was written)", details={"path": str(self.path), "op": op})
        outcome = await self._submit(op, fn, urgent)
        if outcome.wrote:
            self._bump(commits=1, bytes_written=outcome.bytes)
        return outcome.result

    def _op(self, fn: Callable[[sqlite3.Connection, R, _ops.Kept], _ops.Outcome[T]],
            request: R) -> Callable[[sqlite3.Connection], _ops.Outcome[T]]:
        """A mutating operation bound to its request and this store's kept tasks."""
        # self._kept is read on the worker thread: a forked child replaces it first.
        def run(conn: sqlite3.Connection) -> _ops.Outcome[T]:
            checkpointer = self._checkpointer
            if checkpointer is not None and checkpointer.finish_due:
                checkpointer.finish(conn)  # lets this transaction rewind the WAL
            outcome = fn(conn, request, self._kept)
            if outcome.wrote:
                self._committed(outcome.bytes)
            return outcome
        return run

    def _committed(self, payload_bytes: int) -> None:
        """Worker thread, after a COMMIT: count it towards the next background checkpoint.
        Never raises: the commit is durable, whatever happens here."""
        try:
            checkpointer = self._checkpointer
            if checkpointer is None:
                if self._closed:
                    return
                checkpointer = self._checkpointer = Checkpointer(self._settings)
            checkpointer.committed(payload_bytes)
        except Exception:  # pragma: no cover - a bug here must not fail a durable commit
            log.exception("WAL checkpoint bookkeeping of %s failed; commits are unaffected",
                          self.path)

    async def _read(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        result = await self._submit(op, fn)
        self._bump(reads=1)
        return result

    def _bump(self, commits: int = 0, bytes_written: int = 0, reads: int = 0,
              busy_retries: int = 0) -> None:
        s = self._stats
        self._stats = SQLiteStoreStats(s.commits + commits, s.bytes_written + bytes_written,
                                       s.reads + reads, s.busy_retries + busy_retries)

    # --- DurableTaskStore -----------------------------------------------------------------
    def _text(self, op: str, **fields: str | None) -> None:
        """Refuse text sqlite3 cannot encode before it gets there (see check_text)."""
        check_text(self.path, op, **fields)

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        self._text("create_task", key=request.header.key)
        return await self._write("create_task", self._op(_ops.create_task, request))

    async def get_header(self, key: str) -> TaskHeader | None:
        self._text("get_header", key=key)
        return await self._read("get_header", functools.partial(_ops.get_header, key=key))

    async def get_task(self, key: str) -> TaskSnapshot | None:
        self._text("get_task", key=key)
        return await self._read("get_task", functools.partial(_ops.get_task, key=key))

    async def get_identity(self, key: str) -> TaskIdentity | None:
        self._text("get_identity", key=key)
        return await self._read("get_identity",
                                functools.partial(_ops.get_identity, key=key))

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        self._text("list_tasks", after=request.after)
        return await self._read("list_tasks",
                                functools.partial(_ops.list_tasks, request=request))

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        self._text("acquire_lease", key=request.key, worker_id=request.worker_id)
        return await self._write("acquire_lease", self._op(_ops.acquire, request))

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        self._text("renew_lease", key=request.key, worker_id=request.worker_id)
        # Ahead of queued commits: the lease must not expire in the queue.
        return await self._write("renew_lease", self._op(_ops.renew, request), urgent=True)

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        self._text("release_lease", key=request.key, worker_id=request.worker_id)
        return await self._write("release_lease", self._op(_ops.release, request))

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        self._text("request_cancel", key=request.key, reason=request.reason)
        return await self._write("request_cancel", self._op(_ops.cancel, request))

    async def commit(self, request: CommitRequest) -> CommitResult:
        self._text("commit", key=request.key, worker_id=request.worker_id)
        return await self._write("commit", self._op(_ops.commit, request))

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        if not digests:
            return {}
        return await self._read("get_blobs",
                                functools.partial(_ops.get_blobs, digests=list(digests)))

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        self._text("read_timeline", key=request.key)

        def read(conn: sqlite3.Connection) -> list[JournalEntry]:
            # Runs after _connection(): a read-only store knows the file's version by then.
            return _ops.read_timeline(conn, request, version=self._version)
        return await self._read("read_timeline", read)

    async def close(self) -> None:
        """Close the connection and stop the worker thread. Every call, a second one made
        while the first is still closing included, returns only once the file is closed;
        closing a closed store is a no-op."""
        waiter: asyncio.Future[None] | None = None
        executor: _Worker | None = None
        with self._executor_lock:
            if self._closed:
                if self._shut:
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._shut_waiters.append(waiter)
            else:
                self._closed = True
                executor, self._executor = self._executor, None
                if executor is not None and self._pid != os.getpid():
                    executor = None  # a forked child: the parent's thread and connection
        if waiter is not None:
            await waiter  # settled by the first close's job, whatever its loop
            return
        try:
            future = None if executor is None else executor.submit(self._close_connection)
        except RuntimeError:
            future = None  # the worker is already stopped
        if executor is None or future is None:
            self._shut_down()
            return
        try:
            await future
        finally:
            executor.stop()

    def _close_connection(self) -> None:
        # The checkpointer first (it waits for a pass in progress), so the store's own
        # connection stays the last one and its close checkpoints and removes the WAL as before.
        try:
            checkpointer, self._checkpointer = self._checkpointer, None
            if checkpointer is not None:
                checkpointer.close()
            conn, self._conn = self._conn, None
            self._kept.clear()
            if conn is not None:
                empty_wal_if_replaced(conn)
                with mapped_errors(self.path, "close"):
                    conn.close()
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        """The file is closed (any thread): release every close() waiting for that."""
        with self._executor_lock:
            self._shut = True
            waiters, self._shut_waiters = self._shut_waiters, []
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                waiter.get_loop().call_soon_threadsafe(_settle, waiter, None, None)

    async def __aenter__(self) -> SQLiteDurableTaskStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


if TYPE_CHECKING:
    # The store fits the protocol: checked by mypy --strict, no runtime_checkable needed.
    _fits: DurableTaskStore = SQLiteDurableTaskStore("tasks.db")
