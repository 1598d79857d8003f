"""WAL checkpoints on a background thread instead of inside a commit.

With SQLite's default auto-checkpoint (1000 pages) the connection whose ``COMMIT`` takes
the WAL past the limit copies the WAL into the database file (and fsyncs both) before that
``COMMIT`` returns: on a chain of one commit per node that added about 0.11 ms per commit at
``synchronous=NORMAL`` and 0.05 ms at ``FULL`` (single checkpoints up to 27 ms), all on the
critical path of a node.

Instead, each store has a :class:`Checkpointer`. The worker thread counts what it commits
(:meth:`Checkpointer.committed`: an addition and a comparison) and, about every
:data:`THRESHOLD_PAGES` pages written to the WAL, wakes a daemon thread that runs
``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection. sqlite3 releases the GIL during
the step, so the copy and its fsyncs overlap the worker's next commits. A PASSIVE
checkpoint never waits for, blocks or fails a writer; any error it meets (busy, locked,
I/O) is logged and the next signal tries again.

That pass cannot let the WAL start over by itself: SQLite rewinds the WAL only when a write
transaction *begins* while every frame is already in the database file, and the worker
keeps committing while the pass runs, so some frames always arrive after its snapshot.
Without a rewind the WAL file grows to the backstop, and a commit that appends to (grows)
the file costs far more than one that overwrites it: measured here, 0.42-0.51 ms instead of
0.24-0.27 ms per ``FULL`` commit, more than all the checkpoints saved. So after a complete
pass the worker *finishes* it (:meth:`Checkpointer.finish`, before its next write
transaction): a PASSIVE checkpoint of the few frames committed since, on its own connection
(an fsync of the database file, and at ``NORMAL`` of the WAL; it never waits for a lock and
its errors are only logged), after which that transaction rewinds the WAL, whose file is
then reused at about the size SQLite's default keeps. That is the one checkpoint step left
on the worker: about 1-5 ms once per cycle where the default spent 7-27 ms.

``close()`` stops the thread and joins it; there is no extra final checkpoint: the store's
own connection closes last and, being the last one, SQLite checkpoints and removes the WAL
as it always did.

Durability is unchanged: at ``FULL`` each commit still fsyncs the WAL itself; a checkpoint
only moves committed pages into the main file (after fsyncing the WAL, which is what makes
``NORMAL`` commits durable), with the same ``synchronous`` setting as the store's.

The write connection keeps SQLite's auto-checkpoint as a backstop only
(:data:`~agentium_graph_sqlite._schema.WAL_BACKSTOP_PAGES`), so the WAL stays bounded even
if this thread is slow, stuck or failing.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import weakref

from agentium_graph_sqlite._schema import Settings
from agentium_graph_sqlite._schema import file_identity as path_identity

log = logging.getLogger("agentium_graph.sqlite")

THREAD_NAME = "agentium-sqlite-checkpoint"
# Wake the checkpointer after about this many WAL pages: the cadence of SQLite's default
# auto-checkpoint, so one pass copies about what one default checkpoint did and the WAL file
# keeps about its size.
THRESHOLD_PAGES = 1000
# The estimate per commit: a fixed number of pages plus the payload in pages. A commit of
# one node transition writes about 6.3 WAL frames for some 2.9 KB of payload (header row,
# node leaf, journal leaf and its index, admissions, their interior pages: W1, measured
# from the WAL), so a chain wakes the checkpointer about every 160 commits; a commit with
# large payloads (a big create_task, blobs) counts its pages as well.
PAGES_PER_COMMIT = 6
PAGE_BYTES = 4096
# The checkpointer's connection waits at most this long for a lock (opening the WAL index);
# a PASSIVE checkpoint itself never waits.
BUSY_TIMEOUT_S = 0.05
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)
# After this many failed passes in a row (other than a busy lock) the thread gives up and
# SQLite's auto-checkpoint (the backstop) does the work: a persistent failure (a deleted or
# replaced file, a broken disk) is logged once more, not at every signal.
MAX_FAILURES = 5


class _Replaced(Exception):
    """The path no longer names the file the store opened (moved, deleted or replaced)."""


def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """One PASSIVE checkpoint: (busy, frames in the WAL, frames now in the database file)."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def _log_failure(what: str, settings: Settings, exc: Exception) -> bool:
    """Log a failed checkpoint: at debug level when another connection held a lock (True),
    else as a warning (False)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and int(code) & 0xFF in _BUSY_CODES:
        log.debug("%s of %s skipped (%s); retrying on the next signal", what, settings.path,
                  exc)
        return True
    log.warning("%s of %s failed (%s: %s); commits are unaffected, retrying on the next "
                "signal", what, settings.path, type(exc).__name__, exc)
    return False


class _Shared:
    """What the checkpointer thread sees: never the :class:`Checkpointer` itself, so a store
    dropped without ``close()`` is collected and its finalizer ends the thread."""

    __slots__ = ("conn", "failures", "file", "finish", "settings", "stopping", "wake")

    def __init__(self, settings: Settings, file: tuple[int, int] | None) -> None:
        self.settings = settings
        self.file = file  # (st_dev, st_ino) of the database the store opened
        self.failures = 0  # failed passes in a row
        self.wake = threading.Event()
        self.stopping = False
        self.finish = False  # set by the thread after a complete pass, cleared by the worker
        self.conn: sqlite3.Connection | None = None  # the checkpointer thread's only

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()


def file_identity(settings: Settings) -> tuple[int, int] | None:
    """What the store's path names now (see :func:`_schema.file_identity`)."""
    return path_identity(settings.path)


def _connect(shared: _Shared) -> sqlite3.Connection:
    settings = shared.settings
    # The connection opens the file by path, later than the store's: it must be the same
    # file (opening a replacement would share the store's WAL index with another database).
    if shared.file is None or file_identity(settings) != shared.file:
        raise _Replaced(f"{settings.path} is no longer the database file the store opened")
    # mode=rw: never create the file (the store's own connection created and verified it).
    conn = sqlite3.connect(settings.path.as_uri() + "?mode=rw", uri=True,
                           timeout=min(BUSY_TIMEOUT_S, settings.busy_timeout_s),
                           isolation_level=None)
    try:
        # The checkpoint's fsyncs follow this connection's setting: keep the store's.
        conn.execute(f"PRAGMA synchronous = {settings.synchronous}")
        if file_identity(settings) != shared.file:
            raise _Replaced(f"{settings.path} was replaced while it was being opened")
    except BaseException:
        conn.close()
        raise
    return conn


def _step(shared: _Shared) -> None:
    """One background pass; never raises (the next signal retries)."""
    try:
        if shared.conn is None:
            shared.conn = _connect(shared)
        busy, frames, done = checkpoint(shared.conn)
    except _Replaced as exc:
        log.warning("background WAL checkpoints of %s stop: %s; SQLite's auto-checkpoint "
                    "goes on", shared.settings.path, exc)
        shared.stopping = True
        return
    except Exception as exc:
        if not _log_failure("WAL checkpoint", shared.settings, exc):
            _close(shared)  # reopen next time: the connection may be what failed
            shared.failures += 1
            if shared.failures >= MAX_FAILURES:
                log.warning("background WAL checkpoints of %s stop after %d failures in a "
                            "row; SQLite's auto-checkpoint goes on", shared.settings.path,
                            shared.failures)
                shared.stopping = True
        return
    shared.failures = 0
    log.debug("WAL checkpoint of %s: busy=%d, %d frames in the WAL, %d in the database",
              shared.settings.path, busy, frames, done)
    # Only a pass that got everything up to its snapshot leaves a short tail to finish; with a
    # reader holding older frames (or another checkpoint running) finishing would not help.
    if not busy and 0 < frames == done:
        shared.finish = True


def _close(shared: _Shared) -> None:
    conn, shared.conn = shared.conn, None
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


def _run(shared: _Shared) -> None:
    """The checkpointer thread: one pass per wake-up until stopped."""
    try:
        while True:
            shared.wake.wait()
            shared.wake.clear()  # a signal during the pass below wakes the next one
            if shared.stopping:
                return
            _step(shared)
            if shared.stopping:
                return
    finally:
        _close(shared)


class Checkpointer:
    """A store's background checkpointer; :meth:`committed` and :meth:`finish` run on the
    worker thread.

    The thread starts, and its connection opens, at the first signal: a store that writes
    less than one threshold never starts either. The thread is a daemon holding only
    :class:`_Shared`, so a store nobody closed neither keeps the interpreter alive nor
    leaks the thread once collected.
    """

    def __init__(self, settings: Settings) -> None:
        # Created by the worker right after a commit on its open connection: the file at the
        # path now is the one the store has open.
        self._shared = _Shared(settings, file_identity(settings))
        self._pending = 0
        self._thread: threading.Thread | None = None
        weakref.finalize(self, self._shared.stop)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def finish_due(self) -> bool:
        """A complete background pass is waiting for :meth:`finish`."""
        return self._shared.finish

    def committed(self, payload_bytes: int) -> None:
        """Count one committed write transaction; wake the thread once enough has piled up."""
        self._pending += PAGES_PER_COMMIT + payload_bytes // PAGE_BYTES
        if self._pending < THRESHOLD_PAGES:
            return
        self._pending = 0
        if self._thread is None:
            if self._shared.stopping:
                return
            thread = threading.Thread(target=_run, args=(self._shared,), name=THREAD_NAME,
                                      daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # cannot start a thread: the backstop still holds
                log.warning("cannot start the WAL checkpointer for %s (%s); relying on "
                            "SQLite's auto-checkpoint", self._shared.settings.path, exc)
                self._shared.stopping = True
                return
            self._thread = thread
        self._shared.wake.set()

    def finish(self, conn: sqlite3.Connection) -> None:
        """On the worker's connection, outside a transaction: checkpoint the frames committed
        since the last complete background pass, so the next write transaction rewinds the
        WAL. Never raises."""
        self._shared.finish = False
        if conn.in_transaction:
            return
        try:
            checkpoint(conn)
        except Exception as exc:
            _log_failure("WAL checkpoint (finishing)", self._shared.settings, exc)

    def close(self) -> None:
        """Stop the thread (after its current pass) and wait until it closed its connection;
        closing twice is a no-op."""
        self._shared.stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
