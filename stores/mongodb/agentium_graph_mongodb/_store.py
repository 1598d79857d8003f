"""MongoDBDurableTaskStore: configuration, the client's lifecycle, retries and statistics."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, ReadPreference, ReturnDocument, WriteConcern
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, PyMongoError
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from agentium_graph._otel import traced_store
from agentium_graph.errors import (
    ConfigurationError,
    StoreError,
    StoreSchemaError,
    check_flags,
)
from agentium_graph.store import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    DurableTaskStore,
    JournalEntry,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    StoreCapabilities,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    TimelineRequest,
)
from agentium_graph_mongodb._client import (
    _client_from_uri,
    _count,
    _redact,
    _seconds,
    _source,
    call_deadline,
)
from agentium_graph_mongodb._codec import (
    APPLICATION,
    BLOBS,
    JOURNAL,
    META,
    META_ID,
    SCHEMA_VERSION,
    TASKS,
    check_meta,
)
from agentium_graph_mongodb._database import check_database_name, resolve_database
from agentium_graph_mongodb._doc import DocCache
from agentium_graph_mongodb._errors import (
    RedoSideWrites,
    TransientStoreError,
    closed_error,
    driver_failure,
    from_driver,
    mapped_errors,
    note_transient_failure,
    retries_exhausted,
    stalled_call,
    text_errors,
)
from agentium_graph_mongodb._loops import CLOSING, Discard, LoopState, close_when_idle
from agentium_graph_mongodb._ops import Counters, Session

log = logging.getLogger("agentium_graph.mongodb")
T = TypeVar("T")
DEFAULT_WRITE_CONCERN = WriteConcern(w="majority", j=True)
#: The largest blob (an output, plan, input or error text, as UTF-8 bytes) the store
#: promises to persist. A blob document is ``{_id: "sha256:<64 hex>", v: 1, body: <text>}``:
#: about 110 bytes of BSON around the text, far below the 64 KiB kept in reserve here
#: under MongoDB's 16 MiB (16,777,216 bytes) document limit.
MAX_BLOB_BYTES = 16 * 1024 * 1024 - 64 * 1024
#: Decoding options the store reads with, whatever the client's own (a client created
#: with document_class=RawBSONDocument or tz_aware=True works the same).
_CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict)


@dataclass(frozen=True, slots=True)
class MongoDBStoreStats:
    """Counters since the store was constructed; subtract two snapshots to measure a span.

    ``round_trips``: commands sent to the server (retries included). ``reads`` /
    ``writes``: logical read and write calls. ``transient_retries``: calls repeated after a
    transient failure. ``cas_misses``: writes that found the task changed by another
    writer (a compare-and-set miss, or journal slots already taken), each followed by one
    more read. ``cache_hits``: transitions that used the
    store's copy of the task instead of reading it. ``orphans_reclaimed``: journal entries
    of a crashed or outraced writer that were claimed and replaced.
    """

    round_trips: int = 0
    reads: int = 0
    writes: int = 0
    transient_retries: int = 0
    cas_misses: int = 0
    cache_hits: int = 0
    orphans_reclaimed: int = 0

    def __sub__(self, other: MongoDBStoreStats) -> MongoDBStoreStats:
        return MongoDBStoreStats(*(getattr(self, f.name) - getattr(other, f.name)
                                   for f in fields(self)))


def _one_source(positional: object, uri: object, client: object
                ) -> str | AsyncMongoClient[dict[str, Any]]:
    """The one URI or client given, positionally or as ``uri=`` / ``client=``."""
    given = [v for v in (positional, uri, client) if v is not None]
    if len(given) != 1:
        raise ConfigurationError(
            "MongoDBDurableTaskStore needs exactly one of a URI or a client: "
            "MongoDBDurableTaskStore('mongodb://host/db'), MongoDBDurableTaskStore(uri=...) or "
            f"MongoDBDurableTaskStore(client=AsyncMongoClient(...)); got {len(given)}",
            details={"argument": "uri_or_client"})
    if uri is not None and not isinstance(uri, str):
        raise ConfigurationError(
            f"uri= takes a mongodb:// URI string, not {type(uri).__name__}; pass a client as "
            "client=", details={"argument": "uri"})
    if client is not None and not isinstance(client, AsyncMongoClient):
        raise ConfigurationError(
            "client= takes a pymongo AsyncMongoClient, not "
            f"{type(client).__name__}; pass a URI as uri=", details={"argument": "client"})
    return given[0]  # type: ignore[return-value]  # checked by the constructor below


@traced_store("mongodb")
class MongoDBDurableTaskStore:
    """A durable task store in one MongoDB database; safe for many processes and hosts.

    ``uri_or_client`` (or ``uri=`` / ``client=``; give exactly one): a ``mongodb://`` /
    ``mongodb+srv://`` URI (the store creates, owns
    and closes its clients: one per event loop that uses it, so the runtime's ``*_sync``
    wrappers and threads work) or a :class:`pymongo.AsyncMongoClient` (the caller owns and
    closes it; its own timeouts apply; it is bound to one event loop, and using the store
    from another raises :class:`~agentium_graph.ConfigurationError`). ``database``: the
    database holding the store's collections (``tasks``, ``journal``, ``blobs``, ``meta``);
    give the store one of its own (MongoDB's ``admin``, ``local`` and ``config`` are refused).
    Without ``database``, the store uses the database the URI names, as pymongo reads it
    (``get_default_database()``: the path, percent-decoded, up to its first ``.``; for a
    client, the URI it was created with), else ``agentium``: ``"mongodb://h/orders"`` is the
    database ``orders``, as it is for the ``agentium-graph`` CLI and :meth:`database_for`.
    The path also names the database to authenticate against unless the URI sets
    ``authSource``; a path naming ``admin`` (``mongodb://user:pw@h/admin``) is refused like
    ``database="admin"``: write ``mongodb://user:pw@h/?authSource=admin`` and pass
    ``database=`` (or put the store's database in the path). :attr:`database_name` is the
    database used.

    Works on a standalone ``mongod``, a replica set and a sharded cluster (the task key is
    the ``_id`` of its task document and a valid shard key) without multi-document
    transactions: every transition is one single-document compare-and-set. Constructing
    the store does no I/O; the first operation creates the indexes idempotently and refuses
    a database written by a newer schema (:class:`~agentium_graph.StoreSchemaError`).

    ``write_concern`` (default ``WriteConcern(w="majority", j=True)``): an acknowledged
    write survives a crash of the server (``j``) and a failover (``majority``). Weaker
    settings (``j=False``) are faster but can lose acknowledged commits, which makes a
    worker redo work it reported done; use them only where that is acceptable.

    Timeouts (used only when the store owns the client; a URI option of the same name
    wins): ``server_selection_timeout_s`` bounds the wait for a usable server,
    ``connect_timeout_s`` a new connection, ``socket_timeout_s`` one reply (so a stalled
    server is an error, not a hang). Transient failures (network, not-primary, shutdown,
    elections) are retried ``retries`` times with jittered exponential backoff up to
    ``retry_max_wait_s``; then the call raises :class:`~agentium_graph.StoreUnavailableError`
    and the task stays recoverable. ``cas_attempts`` bounds the re-reads after losing a
    compare-and-set race. ``cache_size``: how many task documents the store keeps to skip
    the read before a write (0 disables it); ``stats`` counts round trips. A URI's options
    are checked at construction: an unknown option or a malformed value (say
    ``serverSelectionTimeoutMS=abc``) is a :class:`~agentium_graph.ConfigurationError`, not a
    driver warning followed by the driver's own 30 s default. A client the store creates
    does not use the driver's retryable writes (``retryWrites=false`` unless the URI sets
    it): the store retries itself, re-inserting a commit's blobs and journal entries before
    it retries the compare-and-set that makes them visible.

    Arguments are checked at construction, before any I/O, and types are exact:
    ``read_only`` and ``create`` take real bools (not 1 or ``"yes"``), ``retries``,
    ``cas_attempts`` and ``cache_size`` real ints, the ``*_s`` durations an int or a float
    (not a bool or a string). A wrong one is a :class:`~agentium_graph.ConfigurationError`
    naming it (``details["argument"]``). Text that is not valid Unicode (a lone surrogate,
    as Python decodes an invalid byte of a command-line argument) in a key, id or record is
    a :class:`~agentium_graph.ConfigurationError` naming the operation, and changes nothing.

    Reads only read: ``get_header``, ``get_task``, ``list_tasks``, ``read_timeline``... check
    the database's ``meta`` document (its schema version) with a read and never write, so
    a user with MongoDB's ``read`` role can inspect tasks. The first write of a store stamps
    the ``meta`` document and creates the indexes (so a fresh database is created then).

    ``read_only=True``: only read. The database must already hold an agentium-graph store
    (its ``meta`` document): a database without one (a mistyped name) is refused with a
    :class:`~agentium_graph.StoreError` (``details["reason"] == "no_store"``) and nothing is
    created; every mutating operation raises :class:`~agentium_graph.StoreError` without
    any I/O. This is how the ``agentium-graph`` CLI's ``list``, ``inspect`` and
    ``timeline`` open a store. ``create=False``: a writing store that refuses, the same
    way, a database that holds no agentium-graph store instead of creating one (the CLI's
    ``cancel`` and ``resolve``).
    """

    def __init__(self, uri_or_client: str | AsyncMongoClient[dict[str, Any]] | None = None,
                 *, uri: str | None = None, client: AsyncMongoClient[dict[str, Any]] | None = None,
                 database: str | None = None,
                 write_concern: WriteConcern = DEFAULT_WRITE_CONCERN,
                 server_selection_timeout_s: float = 5.0, connect_timeout_s: float = 5.0,
                 socket_timeout_s: float = 20.0, retries: int = 3,
                 retry_max_wait_s: float = 1.0, cas_attempts: int = 20,
                 cache_size: int = 256, read_only: bool = False, create: bool = True) -> None:
        uri_or_client = _one_source(uri_or_client, uri, client)
        if database is not None:
            check_database_name(database)
        check_flags(read_only=read_only, create=create)
        self._read_only = read_only
        self._create = create and not read_only
        if not isinstance(write_concern, WriteConcern) or not write_concern.acknowledged:
            raise ConfigurationError(
                "write_concern must be an acknowledged pymongo WriteConcern, for example "
                "WriteConcern(w='majority', j=True) (the default)",
                details={"argument": "write_concern"})
        timeouts = {name: _seconds(name, value) for name, value in (
            ("server_selection_timeout_s", server_selection_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("socket_timeout_s", socket_timeout_s),
            ("retry_max_wait_s", retry_max_wait_s))}
        self._write_concern = write_concern
        self._retries = _count("retries", retries, 0)
        self._cas_attempts = _count("cas_attempts", cas_attempts, 1)
        self._cache_size = _count("cache_size", cache_size, 0)
        self._retry_max_wait_s = timeouts["retry_max_wait_s"]
        self._client_options = (timeouts["server_selection_timeout_s"],
                                timeouts["connect_timeout_s"], timeouts["socket_timeout_s"])
        # A client works only on the event loop that first used it. From a URI the store
        # keeps one client per event loop (the runtime's *_sync wrappers start a new loop
        # per call; threads run loops of their own); a given client serves one loop.
        self._uri: str | None = None
        self._spare: AsyncMongoClient[dict[str, Any]] | None = None  # not bound to a loop yet
        self._given: AsyncMongoClient[dict[str, Any]] | None = None
        self._given_loop: asyncio.AbstractEventLoop | None = None
        if isinstance(uri_or_client, str):
            # Built now so a bad URI fails here; AsyncMongoClient does no I/O until used.
            self._spare = _client_from_uri(uri_or_client, *self._client_options)
            self._uri = uri_or_client
            self._owns_client = True
            self._database_name = resolve_database(self._spare, database,
                                                   source=_source(uri_or_client))
            self._where = f"{_redact(uri_or_client)} database {self._database_name!r}"
        elif isinstance(uri_or_client, AsyncMongoClient):
            document_class = uri_or_client.codec_options.document_class
            if not (isinstance(document_class, type) and issubclass(document_class, dict)):
                raise ConfigurationError(
                    "MongoDBDurableTaskStore needs an AsyncMongoClient whose document_class is "
                    f"dict (the default), got document_class={document_class.__name__}; "
                    "create the client without document_class, or pass a mongodb:// URI",
                    details={"argument": "uri_or_client"})
            self._database_name = resolve_database(uri_or_client, database,
                                                   source=_source(uri_or_client))
            self._given = uri_or_client
            self._owns_client = False
            self._where = f"database {self._database_name!r}"
        else:
            raise ConfigurationError(
                "MongoDBDurableTaskStore needs a mongodb:// URI or a pymongo AsyncMongoClient, "
                f"got {type(uri_or_client).__name__} (motor clients are not supported: motor "
                "is deprecated; use pymongo's AsyncMongoClient)",
                details={"argument": "uri_or_client"})
        self._capabilities = StoreCapabilities(durable=True, multi_process=True,
                                               name="mongodb", max_blob_bytes=MAX_BLOB_BYTES)
        self._counters = Counters()
        self._loops: dict[asyncio.AbstractEventLoop, LoopState] = {}
        self._loops_lock = threading.Lock()
        self._checked = False   # the meta document was read and its version accepted
        self._prepared = False  # the meta document is stamped and the indexes exist
        self._closed = False

    # --- properties ----------------------------------------------------------------------
    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    @property
    def database_name(self) -> str:
        """The database the store uses (``database``, else the URI's, else ``agentium``)."""
        return self._database_name

    @staticmethod
    def database_for(uri_or_client: str | AsyncMongoClient[dict[str, Any]],
                     database: str | None = None) -> str:
        """The database a store constructed with these arguments uses, without any I/O;
        raises :class:`~agentium_graph.ConfigurationError` as the constructor would (a bad
        URI, an invalid name, one of MongoDB's own databases). The ``agentium-graph`` CLI
        resolves ``--store`` and ``--database`` with it."""
        if isinstance(uri_or_client, str):
            # Only parsed: a client does no I/O until used and, never opened, needs no close.
            # Parsed also when ``database`` is given: a bad URI option is refused either way.
            client = _client_from_uri(uri_or_client, 5.0, 5.0, 20.0)
            if database is not None:
                check_database_name(database)
                return database
        elif database is not None:
            check_database_name(database)
            return database
        elif isinstance(uri_or_client, AsyncMongoClient):
            client = uri_or_client
        else:
            raise ConfigurationError(
                "database_for needs a mongodb:// URI or a pymongo AsyncMongoClient, got "
                f"{type(uri_or_client).__name__}", details={"argument": "uri_or_client"})
        return resolve_database(client, None, source=_source(uri_or_client))

    @property
    def write_concern(self) -> WriteConcern:
        return self._write_concern

    @property
    def read_only(self) -> bool:
        """Whether the store only reads (``read_only=True``)."""
        return self._read_only

    @property
    def stats(self) -> MongoDBStoreStats:
        """A snapshot of the store's counters (see :class:`MongoDBStoreStats`)."""
        c = self._counters
        return MongoDBStoreStats(c.round_trips, c.reads, c.writes, c.transient_retries,
                                 c.cas_misses, c.cache_hits, c.orphans_reclaimed)

    def __repr__(self) -> str:
        mode = ", read_only=True" if self._read_only else "" if self._create else \
            ", create=False"
        return f"MongoDBDurableTaskStore({self._where}{mode})"

    # --- plumbing ------------------------------------------------------------------------
    async def _io(self, op: str, fn: Callable[[], Awaitable[T]], *, write: bool = False,
                  redo: bool = False) -> T:
        """Run one driver call: errors mapped, transient ones retried (bounded, jittered).

        ``redo``: instead of retrying after a transient failure, raise
        :class:`RedoSideWrites` (a compare-and-set must not be retried before the side
        records it makes visible are inserted again: the server may have lost them)."""
        if self._closed:
            raise closed_error(self._where)
        counters = self._counters
        if write:
            counters.writes += 1
        else:
            counters.reads += 1
        started = time.monotonic()
        task = asyncio.current_task()
        cancels = 0 if task is None else task.cancelling()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_random_exponential(multiplier=0.05, max=self._retry_max_wait_s),
            retry=retry_if_exception_type(TransientStoreError), reraise=True)
        attempts = 0
        last: TransientStoreError | None = None
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        if redo:
                            assert last is not None
                            raise RedoSideWrites(last)
                        counters.transient_retries += 1
                    counters.round_trips += 1
                    try:
                        return await self._attempt(op, fn)
                    except TransientStoreError as exc:
                        last = exc
                        note_transient_failure()
                        raise
                    finally:
                        _redeliver_cancel(task, cancels)
        except TransientStoreError as exc:
            if self._closed:
                raise closed_error(self._where) from exc
            raise retries_exhausted(exc, op, self._where, attempts,
                                    time.monotonic() - started) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _attempt(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One try of a driver call, bounded as a whole. The driver's own timeouts bound
        each of its steps, but its async pool has been seen (pymongo 4.20, Python 3.11) to
        deadlock on its own lock after the server died under several concurrent calls:
        the call then ignores cancellation too. So the call runs in a task of its own and
        is abandoned (cancelled, not awaited) when its bound passes: a stalled call is a
        :class:`StoreUnavailableError`, not retried on a client that is stuck, and a
        client the store made itself is replaced for the calls after it. A RuntimeError
        out of the driver is a transient failure."""
        state = self._state()
        deadline, client = state.deadline_s, state.client
        try:
            with mapped_errors(op, self._where):
                if deadline is None:  # the client waits for replies without limit
                    return await fn()
                call: asyncio.Future[T] = asyncio.ensure_future(fn())
                try:
                    done, _ = await asyncio.wait((call,), timeout=deadline)
                except asyncio.CancelledError:
                    _abandon(call)
                    raise
                if done:
                    return call.result()
        except RuntimeError as exc:
            if not from_driver(exc):
                raise
            raise driver_failure(exc, op, self._where) from exc
        _abandon(call)
        # Only the client this call ran on is replaced: an operation begun on a client
        # replaced already (still running on it until it ends) must not retire the new one.
        used = _OPERATION_SESSION.get()
        current = used is None or used is state.session
        replaced = state.owned and current and state.client is client and \
            self._replace_client(state)
        raise stalled_call(op, self._where, deadline, replaced=replaced)

    def _replace_client(self, state: LoopState) -> bool:
        """Give this loop a new client (and session) in place of one whose call stalled;
        the old one is closed in the background, bounded. False if it cannot be made."""
        if self._uri is None or self._closed or state.closed:
            return False
        try:
            fresh = _client_from_uri(self._uri, *self._client_options)
        except StoreError:  # pragma: no cover - the URI made the first client
            return False
        old, used = state.client, state.session
        state.client, state.session = fresh, None
        state.cache.clear()
        # Operations of other tasks may be running on the old client, healthy: closing it
        # under them would fail each with InvalidOperation. It is closed once they ended
        # (bounded: one of them may be stuck in the same pool).
        closing = asyncio.ensure_future(close_when_idle(old, used, state.deadline_s))
        CLOSING.add(closing)
        closing.add_done_callback(CLOSING.discard)
        state.retiring.add(closing)
        closing.add_done_callback(state.retiring.discard)
        log.warning("MongoDB store (%s): a driver call stalled; the store replaced its "
                    "client", self._where)
        return True

    def _state(self) -> LoopState:
        """What the store keeps for the running event loop (created on its first use)."""
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            state = self._loops.get(loop)
            if state is not None:
                return state
            if self._closed:
                raise closed_error(self._where)
            for other in [other for other in self._loops if other.is_closed()]:
                self._loops.pop(other).discard()  # a loop that ended without shutting down
            if self._given is not None:
                bound = self._given_loop or getattr(self._given, "_loop", None)
                if bound is not None and bound is not loop:
                    raise ConfigurationError(
                        f"MongoDB store ({self._where}) was given an AsyncMongoClient, which "
                        "works only on the event loop that first used it, and is now used "
                        "from another event loop (the runtime's *_sync wrappers start one per "
                        "call; each thread runs its own). Pass a mongodb:// URI instead (the "
                        "store then keeps one client per event loop), or use the store from "
                        "one event loop", details={"where": self._where})
                self._given_loop = loop
                client, owned = self._given, False
            else:
                spare, self._spare = self._spare, None
                if spare is None:
                    assert self._uri is not None
                    spare = _client_from_uri(self._uri, *self._client_options)
                client, owned = spare, True
            state = LoopState(loop, client, owned, DocCache(self._cache_size),
                               call_deadline(client))
            self._loops[loop] = state
            return state

    @property
    def _cache(self) -> DocCache:
        """The running event loop's cache of task documents."""
        return self._state().cache

    async def _ready(self, op: str | None = None) -> Session:
        """The running loop's session, once the database is fit for the call: for a read
        (``op`` None) its meta document was read and its schema accepted; for a write
        (``op`` names it) the meta document is stamped and the indexes exist (once per
        store, whichever loop comes first)."""
        if op is not None and self._read_only:
            raise StoreError(
                f"MongoDB store ({self._where}): {op} writes, but this store was opened "
                "read-only (read_only=True); open it without read_only to change tasks "
                "(nothing was written)", details={"where": self._where, "op": op})
        state = self._state()
        if state.session is not None and (self._prepared or (op is None and self._checked)):
            if self._closed:
                raise closed_error(self._where)
            return state.session
        async with state.lock:
            if self._closed:
                raise closed_error(self._where)
            if state.session is None:
                if state.owned and state.guard is None:
                    # Closes this loop's client when the loop shuts down (asyncio.run
                    # closes open async generators before it closes the loop).
                    state.guard = _close_with_loop(weakref.ref(self), state)
                    await anext(state.guard)
                db: AsyncDatabase[dict[str, Any]] = state.client.get_database(
                    self._database_name, codec_options=_CODEC_OPTIONS,
                    write_concern=self._write_concern, read_preference=ReadPreference.PRIMARY)
                state.session = Session(db, self._io, self._counters, state.cache,
                                        self._cas_attempts, self._retries)
            session = state.session
            if op is not None and not self._prepared:
                await self._prepare(session.db)
                self._prepared = self._checked = True
            elif op is None and not self._checked:
                self._checked = await self._check(session.db)
            # A stall during those calls replaced the client (state.session is None then):
            # this operation goes on with the session it prepared with.
            return state.session or session

    def _forget(self, state: LoopState) -> None:
        with self._loops_lock:
            if self._loops.get(state.loop) is state:
                del self._loops[state.loop]

    def _no_store(self) -> StoreError:
        mode = "read_only=True" if self._read_only else "create=False"
        return StoreError(
            f"MongoDB store ({self._where}): the database {self._database_name!r} holds no "
            f"agentium-graph store (it has no agentium-graph-mongodb meta document) and this "
            f"store does not create one ({mode}); check the database name (database=..., the "
            "CLI's --database or the URI's path) and the URI. Nothing was created",
            details={"where": self._where, "database": self._database_name,
                     "reason": "no_store"})

    async def _check(self, db: AsyncDatabase[dict[str, Any]]) -> bool:
        """Read (never write) the meta document and refuse a newer or foreign schema;
        whether it exists. A store that may create the database reads a database without
        one as empty; one that may not (read_only, create=False) refuses it."""
        found = await self._io("open (check schema)",
                               lambda: db[META].find_one({"_id": META_ID}))
        if found is None:
            if not self._create:
                raise self._no_store()
            return False
        check_meta(found, f"the meta document of {self._where}")
        return True

    async def _prepare(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        """Before the first write: stamp (or, with create=False, require) the meta document,
        check the schema, create the indexes."""
        meta = db[META]
        if not self._create:
            await self._check(db)
        else:
            await self._refuse_foreign(db)

            async def stamp() -> dict[str, Any] | None:
                try:
                    found = await meta.find_one_and_update(
                        {"_id": META_ID},
                        {"$setOnInsert": {"v": SCHEMA_VERSION,
                                          "application": APPLICATION}},
                        upsert=True, return_document=ReturnDocument.AFTER)
                except DuplicateKeyError:  # two stores stamping a new database at once
                    found = None
                if found is None:
                    # Racing upserts: the loser may get a duplicate key, or (on some
                    # servers) no post-image at all. The winner's document is there.
                    found = await meta.find_one({"_id": META_ID})
                return found
            found = await self._io("open (check schema)", stamp, write=True)
            check_meta(found or {}, f"the meta document of {self._where}")
        await self._io("open (create indexes)", lambda: db[TASKS].create_index(
            [("header.status", 1), ("_id", 1)], name="by_status"), write=True)
        await self._io("open (create indexes)", lambda: db[JOURNAL].create_index(
            [("k", 1), ("s", 1)], unique=True, name="by_task_seq"), write=True)

    async def _refuse_foreign(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        """Before stamping a database that has no meta document: refuse one whose
        collections of the store's names already hold documents (another application's,
        or a store whose meta document was deleted), instead of writing into them."""
        ours = {"_id": META_ID}

        async def occupied() -> str | None:
            if await db[META].find_one(ours, {"_id": 1}) is not None:
                return None
            for name in (TASKS, JOURNAL, BLOBS, META):
                if await db[name].find_one({}, {"_id": 1}) is not None:
                    # Another store may have stamped the database since (it stamps
                    # before it writes anything else): then the documents are its own.
                    stamped = await db[META].find_one(ours, {"_id": 1})
                    return None if stamped is not None else name
            return None

        held = await self._io("open (check database)", occupied)
        if held is not None:
            raise StoreSchemaError(
                f"MongoDB store ({self._where}): the database {self._database_name!r} has "
                f"no agentium-graph-mongodb meta document, but its {held!r} collection "
                "already holds documents: it belongs to another application, or it is a "
                "store whose meta document was deleted. Point the store at a database of "
                "its own (database=..., the CLI's --database or the URI's path); nothing "
                "was written", details={"where": self._where, "database":
                                        self._database_name, "collection": held,
                                        "reason": "foreign_database"})

    async def _call(self, op: str, write: bool, fn: Callable[[Session], Awaitable[T]]) -> T:
        """One protocol operation on the running loop's session."""
        with text_errors(op, self._where):
            session = await self._ready(op if write else None)
            session.users += 1
            session.idle.clear()
            token = _OPERATION_SESSION.set(session)
            try:
                return await fn(session)
            finally:
                _OPERATION_SESSION.reset(token)
                session.users -= 1
                if not session.users:
                    session.idle.set()

    # --- DurableTaskStore ------------------------------------------------------------------
    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        return await self._call("create_task", True, lambda s: s.create_task(request))

    async def get_header(self, key: str) -> TaskHeader | None:
        return await self._call("get_header", False, lambda s: s.get_header(key))

    async def get_task(self, key: str) -> TaskSnapshot | None:
        return await self._call("get_task", False, lambda s: s.get_task(key))

    async def get_identity(self, key: str) -> TaskIdentity | None:
        return await self._call("get_identity", False, lambda s: s.get_identity(key))

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        return await self._call("list_tasks", False, lambda s: s.list_tasks(request))

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        return await self._call("acquire_lease", True, lambda s: s.acquire(request))

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        return await self._call("renew_lease", True, lambda s: s.renew(request))

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        return await self._call("release_lease", True, lambda s: s.release(request))

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        return await self._call("request_cancel", True, lambda s: s.cancel(request))

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._call("commit", True, lambda s: s.commit(request))

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        if not digests:
            return {}
        return await self._call("get_blobs", False, lambda s: s.get_blobs(digests))

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        return await self._call("read_timeline", False, lambda s: s.read_timeline(request))

    async def close(self) -> None:
        """Release the connections (only of clients the store created); idempotent.

        The client of the running event loop is closed now; a client of another loop that
        is running (in another thread) is closed there, without waiting; a client of a
        loop that is idle is closed when that loop shuts down (``asyncio.run`` ends) or by
        ``close()`` called on it. Closing never raises for another loop's client."""
        self._closed = True
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            states = list(self._loops.values())
            spare, self._spare = self._spare, None
        if spare is not None:  # never used by any loop: nothing is open
            with contextlib.suppress(PyMongoError, RuntimeError):
                await spare.close()
        for state in states:
            if state.loop is loop:
                self._forget(state)
                await state.close_here()
            elif state.loop.is_closed():
                self._forget(state)
                state.discard()
            elif state.loop.is_running():
                self._forget(state)
                with contextlib.suppress(RuntimeError):  # it stopped meanwhile
                    asyncio.run_coroutine_threadsafe(state.close_here(), state.loop)

    async def __aenter__(self) -> MongoDBDurableTaskStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


# The session of the protocol operation running in this task (set by _call).
_OPERATION_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "agentium_graph_mongodb_session", default=None)


def _abandon(call: asyncio.Future[Any]) -> None:
    """Cancel a driver call without waiting for it (a stuck one never finishes); its
    outcome is fetched when it ends, so asyncio logs no 'exception never retrieved'."""
    call.cancel()
    call.add_done_callback(_outcome_seen)


def _outcome_seen(call: asyncio.Future[Any]) -> None:
    if not call.cancelled():
        call.exception()


def _redeliver_cancel(task: asyncio.Task[Any] | None, cancels: int) -> None:
    """Raise CancelledError if the task was cancelled during a driver call that ended
    without raising it: pymongo's async network layer can swallow a cancellation that
    lands in some windows of an operation (observed with pymongo 4.20), which would leave
    the task running while its canceller waits for it forever."""
    if task is not None and task.cancelling() > cancels:
        raise asyncio.CancelledError


async def _close_with_loop(store: weakref.ref[MongoDBDurableTaskStore],
                           state: LoopState) -> AsyncGenerator[None, None]:
    """An async generator started on the state's loop: the loop's shutdown (asyncio.run's
    ``shutdown_asyncgens``) closes it, which closes the loop's client before the loop
    closes."""
    discard = False
    try:
        yield
    except Discard:
        discard = True
    finally:
        if not discard:  # closed by the loop's shutdown, or by close() on this loop
            owner = store()
            if owner is not None:
                owner._forget(state)
            await state.shutdown()


if TYPE_CHECKING:
    # The store fits the protocol: checked by mypy --strict, no runtime_checkable needed.
    _fits: DurableTaskStore = MongoDBDurableTaskStore("mongodb://localhost")
