"""Opening a store file: refuse anything that is not ours, then create tables idempotently.

Order matters so that a foreign, corrupt, newer or read-only file is never modified:

1. plain filesystem checks (directory, regular file, write permission, SQLite magic bytes;
   a 0-byte file is a new database: SQLite creates files empty and writes the header with
   the first transaction, so another process creating the file, or a crash between its
   creation and that first write, leaves one);
2. a *read-only* probe connection reads the schema, ``application_id`` and our ``meta``;
3. only then a read-write connection switches to WAL and, inside ``BEGIN IMMEDIATE``,
   re-checks and creates the tables (so two processes creating one file agree: the one
   that gets the write lock second finds the tables and creates nothing).

A read-only open (:func:`open_read_only`) does steps 1 and 2 only and keeps the read-only
connection: it never creates, converts to WAL or migrates anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentium_graph.errors import StoreError, StoreSchemaError
from agentium_graph_sqlite._errors import (
    mapped_errors,
    read_only_filesystem,
    read_only_fs_message,
    write_protected,
)

SCHEMA_VERSION = 2  # 2: journal rows per commit, node slack (1 is migrated on open)
APPLICATION = "agentium-graph-sqlite"
APPLICATION_ID = 0x41475351  # "AGSQ", stored in the SQLite file header
_MAGIC = b"SQLite format 3\x00"
log = logging.getLogger("agentium_graph.sqlite")
# The write connection's auto-checkpoint (pages), a backstop only: the store's background
# checkpointer (_checkpoint.py) copies the WAL about every 1000 pages, off the commit path,
# and the WAL then starts over at about the size SQLite's default (1000) keeps. This one runs
# inside a COMMIT only when that has not happened for eight of those cycles (the thread is
# slow, stuck or failing, or could not start), so with one writing process the WAL file
# stays bounded at about 32 MiB of 4 KiB pages (several writing processes, or a reader that
# holds an old snapshot, can keep it growing, as with SQLite's default). Per connection:
# nothing is stored in the file.
WAL_BACKSTOP_PAGES = 8000

# tasks: the small, hot header row; identities: the large pinned identity, written once,
# kept apart so a header update never rewrites it. journal: one row per commit holding
# that commit's entries as a JSON array, ``seq`` being the last entry's; a rowid table so
# every insert appends at the right edge of the b-tree (a WITHOUT ROWID table keyed by
# task would insert into the middle of full pages and rewrite their siblings: about four
# page writes per commit instead of one), found through a small (key, seq) index.
# nodes: each row carries zero-filled ``slack`` that keeps it at a constant size while its
# record grows (pending -> running -> completed), so SQLite overwrites the row in place
# (one page) instead of deleting and re-inserting it, which rebalances the leaf with its
# siblings and rewrites their parent: about three page writes per node transition.
_JOURNAL_DDL = (
    "CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY, key TEXT NOT NULL, "
    "seq INTEGER NOT NULL, entries TEXT NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS journal_by_key ON journal (key, seq)",
)
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tasks (key TEXT PRIMARY KEY, status TEXT NOT NULL, "
    "header TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, key)",
    "CREATE TABLE IF NOT EXISTS identities (key TEXT PRIMARY KEY, identity TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (key TEXT NOT NULL, node_id TEXT NOT NULL, "
    "record TEXT NOT NULL, slack BLOB, PRIMARY KEY (key, node_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS actions (key TEXT NOT NULL, action_id TEXT NOT NULL, "
    "record TEXT NOT NULL, PRIMARY KEY (key, action_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS admissions (key TEXT NOT NULL, admission_id TEXT NOT NULL, "
    "charges TEXT NOT NULL, PRIMARY KEY (key, admission_id)) WITHOUT ROWID",
    *_JOURNAL_DDL,
    "CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, body TEXT NOT NULL) "
    "WITHOUT ROWID",
)
OUR_TABLES = frozenset({"meta", "tasks", "identities", "nodes", "actions", "admissions",
                        "journal", "blobs"})


@dataclass(frozen=True, slots=True)
class Settings:
    path: Path
    synchronous: str
    busy_timeout_s: float
    # read_only: open without writing anything (no WAL switch, no schema, no migration);
    # create=False: refuse a file that is not already an agentium-graph database.
    read_only: bool = False
    create: bool = True


@dataclass(frozen=True, slots=True)
class _Found:
    tables: frozenset[str]
    application_id: int
    user_version: int
    meta: dict[str, str] | None  # None: no readable meta table of ours
    others: frozenset[str] = frozenset()  # views and other schema objects (not tables)



def not_a_directory(directory: Path) -> Path | None:
    """The nearest existing ancestor of ``directory`` (itself included) when it is not a
    directory (a file where a directory of the path must be), else None."""
    for candidate in (directory, *directory.parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else candidate
        except OSError:
            return None
    return None

def _not_ours(path: Path, why: str) -> StoreSchemaError:
    return StoreSchemaError(
        f"cannot open SQLite store {str(path)!r}: {why}, so it is not an agentium-graph "
        "database; point the store at the task database (a worker creates one on first use; "
        "this file was left unchanged)", details={"path": str(path)})


def _missing(path: Path) -> StoreError:
    what = "it is a symlink that leads nowhere (its target is missing, or the links loop)" \
        if path.is_symlink() else "the file does not exist"
    return StoreError(
        f"cannot open SQLite store {str(path)!r}: {what} and this store does not create "
        "one; point the store at an existing task database", details={"path": str(path)})


@contextlib.contextmanager
def _path_errors(path: Path) -> Iterator[None]:
    """An OS error while looking at the path (a directory this user may not enter, a
    symlink loop) as a StoreError naming it, before SQLite ever opens the file."""
    try:
        yield
    except OSError as exc:
        where = exc.filename if exc.filename is not None else str(path)
        raise StoreError(
            f"cannot open SQLite store {str(path)!r}: {exc.strerror or exc} ({where}); check "
            "the path, its symlinks and the permissions of each directory on it (nothing "
            "was changed)", details={"path": str(path), "errno": exc.errno}) from exc


def side_file(path: Path, suffix: str) -> Path:
    """``path``'s ``-wal`` or ``-shm`` file: SQLite keeps them next to the file a symlink
    leads to, not next to the link."""
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + suffix)


def _wal_with_commits(path: Path) -> Path | None:
    """The write-ahead log of ``path`` when it holds something (commits that may not be in
    the file yet), else None."""
    wal = side_file(path, "-wal")
    return wal if wal.is_file() and wal.stat().st_size > 0 else None


def _orphaned_wal(path: Path) -> StoreError | None:
    """The error for a write-ahead log left without its database file, or None. SQLite
    would create an empty database there and discard the log with the commits it holds."""
    wal = _wal_with_commits(path)
    if wal is None:
        return None
    return StoreError(
        f"cannot open SQLite store {str(path)!r}: the file does not exist, but its "
        f"write-ahead log {str(wal)!r} does and may hold committed tasks; restore the "
        "database file next to it (if the log is not needed, move it and its -shm file "
        "away). Nothing was created", details={"path": str(path), "wal": str(wal)})


def open_database(settings: Settings) -> sqlite3.Connection:
    """Validate the file, open the read-write connection and ensure the schema (for a
    read-only store: the read-only connection, see :func:`open_read_only`)."""
    if settings.read_only:
        return open_read_only(settings)[0]
    path = settings.path
    with _path_errors(path):
        _check_filesystem(path, writable=True)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1  # a new file (dangling symlinks included): created below
        orphan = _orphaned_wal(path) if size < 0 else None
    if orphan is not None:
        raise orphan
    if size > 0:
        with mapped_errors(path, "open (read-only probe)"):
            found = _probe(path)
        if _verify(found, path) == 0 and not settings.create:
            raise _not_ours(path, "it is a SQLite database without agentium-graph tables")
    elif not settings.create:
        raise _missing(path) if size < 0 else _not_ours(path, "the file is empty")
    with mapped_errors(path, "open"):
        conn = sqlite3.connect(str(path), timeout=settings.busy_timeout_s,
                               isolation_level=None, check_same_thread=False,
                               cached_statements=256, factory=StoreConnection)
        try:
            conn.path, conn.opened = path, file_identity(path)
            _prepare(conn, settings)
        except BaseException:
            conn.close()
            raise
    return conn


def open_read_only(settings: Settings) -> tuple[sqlite3.Connection, int]:
    """A read-only connection to an existing agentium-graph file and its schema version
    (an older version is read as it is, never migrated). Nothing is created or written."""
    path = settings.path
    with _path_errors(path):
        _check_filesystem(path, writable=False)
        if not path.exists():
            raise _missing(path)
        if path.stat().st_size == 0:
            raise _not_ours(path, "the file is empty")
        real = Path(os.path.realpath(path))  # where SQLite keeps the -wal and -shm files
        read_only_fs = read_only_filesystem(real)
        shm = side_file(path, "-shm")
        # A reader of a WAL database needs its -shm file, which SQLite creates next to it
        # when no connection has: impossible on a read-only mount, or in a directory this
        # user may not write (an operator reading a service's database while it is idle).
        # Not wanted either for a file this user may not write: SQLite gives the -shm and
        # -wal it creates the database file's mode, so reading a file left read-only would
        # leave read-only side files that no writer can open once the file is writable again.
        dir_writable = os.access(real.parent, os.W_OK | os.X_OK)
        no_shm = read_only_fs or (not shm.exists() and (
            not dir_writable or write_protected(real)))
        wal = _wal_with_commits(path) if no_shm else None
    query = "?mode=ro"
    if no_shm:
        # With no -wal holding commits, the file itself is the whole database: it is
        # opened as immutable (read without the -shm), which a later writer's checkpoint
        # would invalidate: fine for a short read (the CLI), not for a long-lived reader.
        where = "it is on a read-only filesystem" if read_only_fs else \
            f"its directory {str(real.parent)!r} is not writable by this user" \
            if not dir_writable else "the file is not writable by this user"
        if wal is not None:
            raise StoreError(
                f"cannot open SQLite store {str(path)!r}: {where} and its write-ahead log "
                f"{str(wal)!r} holds commits not yet in the file; copy the file with its -wal "
                "and -shm files to a writable location and open that (or read it while a "
                "worker has it open, or as a user who may write the directory)",
                details={"path": str(path)})
        query += "&immutable=1"
    with mapped_errors(path, "open (read-only)"):
        conn = sqlite3.connect(path.absolute().as_uri() + query, uri=True,
                               timeout=settings.busy_timeout_s, isolation_level=None,
                               check_same_thread=False, cached_statements=256)
        try:
            version = _verify(_inspect(conn), path)
            if version == 0:
                raise _not_ours(path, "it is a SQLite database without agentium-graph tables")
            conn.execute(f"PRAGMA busy_timeout = {int(settings.busy_timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
    return conn, version


def _check_filesystem(path: Path, *, writable: bool) -> None:
    directory = path.parent
    details = {"path": str(path), "directory": str(directory)}
    if path.is_symlink() and not path.exists():
        target = Path(os.path.realpath(path))  # SQLite follows the link to create the file
        if not target.parent.is_dir():
            raise StoreError(
                f"cannot open SQLite store {str(path)!r}: it is a symlink to {str(target)!r}, "
                f"whose directory {str(target.parent)!r} does not exist; create that "
                "directory or fix the symlink", details={**details, "target": str(target)})
        directory = target.parent
    if not directory.is_dir():
        tilde = _unexpanded_tilde(directory)
        if tilde is not None:  # "mkdir -p" would make a directory named '~' here
            raise StoreError(
                f"cannot open SQLite store {str(path)!r}: directory {str(tilde)!r} does not "
                f"exist: a leading {tilde.name!r} is not expanded in a path given to "
                "SQLiteDurableTaskStore (nor by open() or sqlite3); pass the path through "
                "os.path.expanduser() or Path.expanduser() first (a sqlite:/// store URI "
                "expands it)", details=details)
        blocker = not_a_directory(directory)
        if blocker is not None:  # "mkdir -p" would fail: a file stands where a directory must
            raise StoreError(
                f"cannot open SQLite store {str(path)!r}: {str(blocker)!r} is a file, not a "
                "directory, so nothing can be created under it; choose another path",
                details=details)
        raise StoreError(
            f"cannot open SQLite store {str(path)!r}: directory {str(directory)!r} does not "
            f"exist; create it first (mkdir -p {str(directory)!r}) or choose another path",
            details=details)
    if writable and read_only_filesystem(directory):
        raise StoreError(f"cannot open SQLite store {str(path)!r} for writing: "
                         f"{read_only_fs_message(path)} (nothing was changed)", details=details)
    if not path.exists():
        if writable and not os.access(directory, os.W_OK | os.X_OK):
            raise StoreError(
                f"cannot create SQLite store {str(path)!r}: directory {str(directory)!r} is "
                "not writable; make it writable or choose another path", details=details)
        return
    if not path.is_file():
        what = "a directory, not a regular file" if path.is_dir() else "not a regular file"
        raise StoreError(f"cannot open SQLite store {str(path)!r}: it is {what}; point the "
                         "store at a database file path", details=details)
    if not os.access(path, os.R_OK):
        raise StoreError(f"cannot open SQLite store {str(path)!r}: the file is not readable "
                         f"by this process; check its permissions (ls -l {str(path)!r})",
                         details=details)
    if writable and write_protected(path):
        raise StoreError(
            f"cannot open SQLite store {str(path)!r}: the file is read-only; make it "
            f"writable (chmod u+w {str(path)!r}) or copy it to a writable location "
            "(the file was left unchanged)", details=details)
    with path.open("rb") as fh:
        magic = fh.read(len(_MAGIC))
    # A 0-byte file is a database nobody has written yet (see the module docstring).
    if magic and magic != _MAGIC:
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: the file is not a SQLite database; "
            "point the store at a new path (the file was left unchanged)", details=details)


def _unexpanded_tilde(directory: Path) -> Path | None:
    """The first missing directory on the way to ``directory`` when its name starts with
    '~' (a home directory the caller meant to have expanded), else None."""
    missing = directory
    while not missing.parent.is_dir() and missing.parent != missing:
        missing = missing.parent
    return missing if missing.name.startswith("~") else None


def _probe(path: Path) -> _Found:
    conn = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True,
                           isolation_level=None, check_same_thread=False)
    try:
        return _inspect(conn)
    finally:
        conn.close()


def _inspect(conn: sqlite3.Connection) -> _Found:
    """What the file holds, read in one transaction: read one statement at a time, another
    process creating the schema in between would be seen half (no tables yet, then its
    application id and version) and taken for another application's database."""
    if conn.in_transaction:
        return _read_found(conn)
    conn.execute("BEGIN")
    try:
        return _read_found(conn)
    finally:
        conn.execute("COMMIT")


def _read_found(conn: sqlite3.Connection) -> _Found:
    objects = conn.execute("SELECT type, name FROM sqlite_master").fetchall()
    tables = frozenset(str(name) for kind, name in objects if kind == "table")
    # Indexes and triggers belong to a table; a view stands alone (a file of views only
    # is someone else's database, not an empty one).
    others = frozenset(str(name) for kind, name in objects if kind == "view")
    application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    user_version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    meta: dict[str, str] | None = None
    if "meta" in tables:
        try:
            meta = {str(k): str(v) for k, v in conn.execute("SELECT name, value FROM meta")}
        except sqlite3.OperationalError:
            meta = None  # someone else's table called "meta"
    return _Found(tables, application_id, user_version, meta, others)


def _verify(found: _Found, path: Path) -> int:
    """The file's schema version (0 when it is empty); raise unless it is ours and one this
    code can open (an older version is migrated by :func:`_prepare`)."""
    details = {"path": str(path)}
    if not found.tables and not found.others and \
            found.application_id in (0, APPLICATION_ID) and found.user_version == 0:
        return 0
    meta = found.meta or {}
    try:
        version = int(meta.get("schema_version", ""))
    except ValueError:
        version = -1
    if found.application_id == 0 and found.user_version == 0 and \
            meta.get("application") == APPLICATION and found.tables >= OUR_TABLES and \
            1 <= version <= SCHEMA_VERSION:
        # Every table of ours, but not the file header's marks: what a restore from a text
        # dump (sqlite3 .dump, iterdump) gives, since a dump does not carry them.
        marks = f"PRAGMA application_id = {APPLICATION_ID}" + (
            f"; PRAGMA user_version = {version}" if version >= 2 else "")
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: it holds agentium-graph-sqlite tables "
            "(schema version {v}) but its file header lost the application id{uv}, as a "
            "restore from a text dump (sqlite3 .dump) does; if it is such a restore, set "
            "them back (sqlite3 {p} '{m}') and open it again (the file was left "
            "unchanged)".format(v=version, uv=" and schema version" if version >= 2 else "",
                                p=shlex.quote(str(path)), m=marks),
            details={**details, "schema_version": version, "fix": marks})
    objects = sorted(found.tables | found.others)
    if found.application_id == APPLICATION_ID and found.meta is None:
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: its file header carries "
            "agentium-graph-sqlite's application id"
            + (f" and schema version {found.user_version}" if found.user_version else "")
            + f", but its meta table is gone (tables: {', '.join(objects) or 'none'}): it "
            "was emptied or damaged; restore it from a backup or use a new file (this one "
            "was left unchanged)", details={**details, "schema_version": found.user_version})
    if found.application_id != APPLICATION_ID or meta.get("application") != APPLICATION:
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: it is another application's SQLite "
            f"database ({'tables and views' if found.others else 'tables'}: "
            f"{', '.join(objects) or 'none'}); point the store "
            "at a new file (this one was left unchanged)", details=details)
    # The header's user_version too: every schema since 2 sets it with meta, so a file
    # whose header says newer is newer whatever meta says.
    if found.user_version > SCHEMA_VERSION and version >= 1:
        version = found.user_version
    elif found.user_version and found.user_version != version and version <= SCHEMA_VERSION:
        # Both are written in one transaction (version 1 wrote no user_version), so they
        # only disagree in a file changed by hand; migrating by either could corrupt it.
        # (A meta version newer than this code is reported as newer, below.)
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: its metadata disagrees about the "
            f"store schema version (meta table: {meta.get('schema_version')!r}, file "
            f"header user_version: {found.user_version}), which this store never writes; "
            "restore it from a backup or use a new file (this one was left unchanged)",
            details={**details, "schema_version": found.user_version,
                     "meta_schema_version": meta.get("schema_version")})
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: it was written with store schema "
            f"version {version}, newer than this agentium-graph-sqlite supports "
            f"({SCHEMA_VERSION}); upgrade agentium-graph-sqlite to open it (the file was left "
            "unchanged)", details={**details, "schema_version": version,
                                   "supported": SCHEMA_VERSION})
    if version < 1 or not found.tables >= OUR_TABLES:
        raise StoreSchemaError(
            f"cannot open SQLite store {str(path)!r}: its agentium-graph-sqlite metadata is "
            f"damaged (schema version {meta.get('schema_version')!r}, missing tables: "
            f"{', '.join(sorted(OUR_TABLES - found.tables)) or 'none'}); restore it from a "
            "backup or use a new file", details=details)
    return version


def _prepare(conn: sqlite3.Connection, settings: Settings) -> None:
    # Validate again on the read-write connection: the file may have been created or
    # replaced since the probe (another process racing us to create it).
    version = _verify(_inspect(conn), settings.path)
    if version == 0 and not settings.create:  # before _configure writes the WAL header
        raise _not_ours(settings.path, "it has no agentium-graph tables")
    if version == SCHEMA_VERSION:
        _configure(conn, settings)
        return
    _configure(conn, settings)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _verify(_inspect(conn), settings.path)  # under the write lock now
        if version == 0 and not settings.create:
            raise _not_ours(settings.path, "it has no agentium-graph tables")
        if version == 0:
            for statement in _DDL:
                conn.execute(statement)
            conn.executemany("INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)",
                             [("application", APPLICATION),
                              ("schema_version", str(SCHEMA_VERSION))])
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        elif version == 1:
            _migrate_1_to_2(conn)
        # In the header too, where every open connection's transactions look for it.
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class StoreConnection(sqlite3.Connection):
    """The store's read-write connection, knowing which file it opened (``opened``: device
    and inode), so a write can tell that its ``path`` no longer names that file."""

    path: Path
    opened: tuple[int, int] | None = None
    emptied = False  # its log was emptied after the path was found naming another file


def file_identity(path: Path) -> tuple[int, int] | None:
    """The device and inode the path names now, or None if it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class FileReplacedError(StoreError):
    """The store's path no longer names the database file its connection opened."""


def check_same_file(conn: sqlite3.Connection) -> None:
    """Raise :class:`StoreError` when the store's path no longer names the file its
    connection opened: the file was moved, deleted or replaced (another database moved onto
    the path) while it was open. SQLite would go on writing to the file it holds open,
    which nobody can open any more, and acknowledge commits no later process sees. Called
    under the write lock of every write transaction (one ``stat``)."""
    if not isinstance(conn, StoreConnection) or conn.opened is None:
        return
    path = conn.path
    if file_identity(path) != conn.opened:
        raise FileReplacedError(
            f"SQLite store {str(path)!r}: the path no longer names the database file this "
            "store opened (the file was moved, deleted or replaced while it was open); "
            "nothing was written. Close this store and open the path again once it names "
            "the task database (put the file back, or point the store at where it went)",
            details={"path": str(path), "reason": "file_replaced"})


def empty_wal_if_replaced(conn: sqlite3.Connection) -> None:
    """If the store's path now names another file (found by a refused write, or at close):
    copy the write-ahead log into the file this connection opened and truncate it. The log
    stays next to the path, and whoever opens the path next would apply it to the file
    found there now (and damage it); an empty one is ignored. Only a process that opens the
    path between the replacement and this store's next write or close can still meet the
    log. Never raises."""
    if not isinstance(conn, StoreConnection) or conn.opened is None or \
            file_identity(conn.path) == conn.opened:
        return
    if not conn.emptied:
        conn.emptied = True
        log.error("SQLite store %s: the path no longer names the database file this "
                  "store opened (moved, deleted or replaced while open); its write-ahead "
                  "log is emptied into the file it opened so the file now at the path is "
                  "not changed", conn.path)
    with contextlib.suppress(sqlite3.Error):
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def check_not_upgraded(conn: sqlite3.Connection) -> None:
    """Raise :class:`StoreSchemaError` when a newer agentium-graph-sqlite migrated the file
    while this connection had it open. Called at the start of every write transaction and
    every multi-statement read (a read of the file header: microseconds); the file is
    checked and migrated only at open, and writing this version's rows into a newer schema
    would corrupt it for the newer code.

    Every schema since 2 records its version in the header's ``user_version`` as well as in
    ``meta``, and every migration sets it: a later version must keep doing so."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"this SQLite store's file was upgraded to store schema version {version} by a "
            f"newer agentium-graph-sqlite while this process had it open (it supports "
            f"{SCHEMA_VERSION}); nothing was changed: stop this process and upgrade "
            "agentium-graph-sqlite to run it", details={
                "schema_version": version, "supported": SCHEMA_VERSION})


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Version 1 kept one journal row per entry in a WITHOUT ROWID table; rewrite each as a
    one-entry row of the new table, and give node rows their slack column. Runs inside the
    caller's transaction: all or nothing, and a process still running version 1 code refuses
    the file from then on."""
    log.info("migrating SQLite store schema 1 -> 2 (journal rows)")
    conn.execute("ALTER TABLE nodes ADD COLUMN slack BLOB")
    conn.execute("ALTER TABLE journal RENAME TO journal_v1")
    for statement in _JOURNAL_DDL:
        conn.execute(statement)
    conn.execute("INSERT INTO journal (key, seq, entries) SELECT key, seq, '[' || entry || ']' "
                 "FROM journal_v1 ORDER BY key, seq")
    conn.execute("DROP TABLE journal_v1")
    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'",
                 (str(SCHEMA_VERSION),))


def _configure(conn: sqlite3.Connection, settings: Settings) -> None:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() != "wal":
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(
                f"SQLite store {str(settings.path)!r}: could not switch to WAL mode (got "
                f"{mode!r}); use a local filesystem that supports shared memory",
                details={"path": str(settings.path)})
    conn.execute(f"PRAGMA synchronous = {settings.synchronous}")
    conn.execute(f"PRAGMA busy_timeout = {int(settings.busy_timeout_s * 1000)}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_BACKSTOP_PAGES}")
