"""MongoDBDurableTaskStore: configuration, the client's lifecycle, retries and statistics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pymongo import AsyncMongoClient, ReadPreference, ReturnDocument, WriteConcern
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConfigurationError as PyMongoConfigurationError
from pymongo.errors import DuplicateKeyError
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from agentium_graph._otel import traced_store
from agentium_graph.errors import ConfigurationError
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
from agentium_graph_mongodb._codec import (
    JOURNAL,
    META,
    META_ID,
    SCHEMA_VERSION,
    TASKS,
    check_version,
)
from agentium_graph_mongodb._doc import DocCache
from agentium_graph_mongodb._errors import (
    TransientStoreError,
    closed_error,
    mapped_errors,
    retries_exhausted,
)
from agentium_graph_mongodb._ops import Counters, Session

T = TypeVar("T")
DEFAULT_WRITE_CONCERN = WriteConcern(w="majority", j=True)
CLIENT_BULK_WIRE_VERSION = 25  # MongoDB 8.0: the bulkWrite command across collections


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


@traced_store("mongodb")
class MongoDBDurableTaskStore:
    """A durable task store in one MongoDB database; safe for many processes and hosts.

    ``uri_or_client``: a ``mongodb://`` / ``mongodb+srv://`` URI (the store creates, owns
    and closes the client) or a :class:`pymongo.AsyncMongoClient` (the caller owns and
    closes it; its own timeouts apply). ``database``: the database holding the store's
    collections (``tasks``, ``journal``, ``blobs``, ``meta``); give the store one of its own.

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
    the read before a write (0 disables it); ``stats`` counts round trips.
    """

    def __init__(self, uri_or_client: str | AsyncMongoClient[dict[str, Any]], *,
                 database: str = "agentium",
                 write_concern: WriteConcern = DEFAULT_WRITE_CONCERN,
                 server_selection_timeout_s: float = 5.0, connect_timeout_s: float = 5.0,
                 socket_timeout_s: float = 20.0, retries: int = 3,
                 retry_max_wait_s: float = 1.0, cas_attempts: int = 20,
                 cache_size: int = 256) -> None:
        if not isinstance(database, str) or not database or any(
                c in database for c in '/\\. "$\x00'):
            raise ConfigurationError(
                f"invalid MongoDB database name {database!r}; use letters, digits, '_' or '-'")
        if not isinstance(write_concern, WriteConcern) or not write_concern.acknowledged:
            raise ConfigurationError(
                "write_concern must be an acknowledged pymongo WriteConcern, for example "
                "WriteConcern(w='majority', j=True) (the default)")
        for name, value in (("server_selection_timeout_s", server_selection_timeout_s),
                            ("connect_timeout_s", connect_timeout_s),
                            ("socket_timeout_s", socket_timeout_s),
                            ("retry_max_wait_s", retry_max_wait_s)):
            if not value > 0:
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        if retries < 0 or cas_attempts < 1 or cache_size < 0:
            raise ConfigurationError("retries and cache_size must be >= 0 and cas_attempts >= 1")
        self._database_name = database
        self._write_concern = write_concern
        self._retries = retries
        self._retry_max_wait_s = retry_max_wait_s
        self._cas_attempts = cas_attempts
        if isinstance(uri_or_client, str):
            self._client = _client_from_uri(uri_or_client, server_selection_timeout_s,
                                            connect_timeout_s, socket_timeout_s)
            self._owns_client = True
            self._where = f"{_redact(uri_or_client)} database {database!r}"
        elif isinstance(uri_or_client, AsyncMongoClient):
            self._client = uri_or_client
            self._owns_client = False
            self._where = f"database {database!r}"
        else:
            raise ConfigurationError(
                "MongoDBDurableTaskStore needs a mongodb:// URI or a pymongo AsyncMongoClient, "
                f"got {type(uri_or_client).__name__} (motor clients are not supported: motor "
                "is deprecated; use pymongo's AsyncMongoClient)")
        self._capabilities = StoreCapabilities(durable=True, multi_process=True,
                                               name="mongodb")
        self._counters = Counters()
        self._cache = DocCache(cache_size)
        self._session: Session | None = None
        self._ready_lock = asyncio.Lock()
        self._closed = False

    # --- properties ----------------------------------------------------------------------
    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    @property
    def database_name(self) -> str:
        return self._database_name

    @property
    def write_concern(self) -> WriteConcern:
        return self._write_concern

    @property
    def stats(self) -> MongoDBStoreStats:
        """A snapshot of the store's counters (see :class:`MongoDBStoreStats`)."""
        c = self._counters
        return MongoDBStoreStats(c.round_trips, c.reads, c.writes, c.transient_retries,
                                 c.cas_misses, c.cache_hits, c.orphans_reclaimed)

    def __repr__(self) -> str:
        return f"MongoDBDurableTaskStore({self._where})"

    # --- plumbing ------------------------------------------------------------------------
    async def _io(self, op: str, fn: Callable[[], Awaitable[T]], *, write: bool = False) -> T:
        """Run one driver call: errors mapped, transient ones retried (bounded, jittered)."""
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
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    counters.round_trips += 1
                    if attempts > 1:
                        counters.transient_retries += 1
                    try:
                        with mapped_errors(op, self._where):
                            return await fn()
                    finally:
                        _redeliver_cancel(task, cancels)
        except TransientStoreError as exc:
            if self._closed:
                raise closed_error(self._where) from exc
            raise retries_exhausted(exc, op, self._where, attempts,
                                    time.monotonic() - started) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _ready(self) -> Session:
        """The session, after creating indexes and checking the schema (once per store)."""
        if self._session is not None:
            if self._closed:
                raise closed_error(self._where)
            return self._session
        async with self._ready_lock:
            if self._session is None:
                db: AsyncDatabase[dict[str, Any]] = self._client.get_database(
                    self._database_name, write_concern=self._write_concern,
                    read_preference=ReadPreference.PRIMARY)
                client_bulk = await self._prepare(db)
                self._session = Session(db, self._io, self._counters, self._cache,
                                        self._cas_attempts, client_bulk)
            return self._session

    async def _prepare(self, db: AsyncDatabase[dict[str, Any]]) -> bool:
        """Stamp/check the schema, create the indexes; whether client bulkWrite works."""
        meta = db[META]

        async def stamp() -> dict[str, Any] | None:
            try:
                return await meta.find_one_and_update(
                    {"_id": META_ID},
                    {"$setOnInsert": {"v": SCHEMA_VERSION,
                                      "application": "agentium-graph-mongodb"}},
                    upsert=True, return_document=ReturnDocument.AFTER)
            except DuplicateKeyError:  # two stores stamping a new database at once
                return await meta.find_one({"_id": META_ID})
        found = await self._io("open (check schema)", stamp, write=True)
        check_version(found or {}, f"the meta document of {self._where}")
        await self._io("open (create indexes)", lambda: db[TASKS].create_index(
            [("header.status", 1), ("_id", 1)], name="by_status"), write=True)
        await self._io("open (create indexes)", lambda: db[JOURNAL].create_index(
            [("k", 1), ("s", 1)], unique=True, name="by_task_seq"), write=True)
        hello = await self._io("open (hello)", lambda: db.command("hello"))
        return int(hello.get("maxWireVersion", 0)) >= CLIENT_BULK_WIRE_VERSION

    # --- DurableTaskStore ------------------------------------------------------------------
    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        return await (await self._ready()).create_task(request)

    async def get_header(self, key: str) -> TaskHeader | None:
        return await (await self._ready()).get_header(key)

    async def get_task(self, key: str) -> TaskSnapshot | None:
        return await (await self._ready()).get_task(key)

    async def get_identity(self, key: str) -> TaskIdentity | None:
        return await (await self._ready()).get_identity(key)

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        return await (await self._ready()).list_tasks(request)

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        return await (await self._ready()).acquire(request)

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        return await (await self._ready()).renew(request)

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        return await (await self._ready()).release(request)

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        return await (await self._ready()).cancel(request)

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await (await self._ready()).commit(request)

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        if not digests:
            return {}
        return await (await self._ready()).get_blobs(digests)

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        return await (await self._ready()).read_timeline(request)

    async def close(self) -> None:
        """Release the connections (only of a client the store created); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cache.clear()
        if self._owns_client:
            with mapped_errors("close", self._where):
                await self._client.close()

    async def __aenter__(self) -> MongoDBDurableTaskStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


def _redeliver_cancel(task: asyncio.Task[Any] | None, cancels: int) -> None:
    """Raise CancelledError if the task was cancelled during a driver call that ended
    without raising it: pymongo's async network layer can swallow a cancellation that
    lands in some windows of an operation (observed with pymongo 4.20), which would leave
    the task running while its canceller waits for it forever."""
    if task is not None and task.cancelling() > cancels:
        raise asyncio.CancelledError


def _client_from_uri(uri: str, server_selection_timeout_s: float, connect_timeout_s: float,
                     socket_timeout_s: float) -> AsyncMongoClient[dict[str, Any]]:
    given = {name.lower() for name, _ in parse_qsl(urlsplit(uri).query)}
    options: dict[str, Any] = {}
    for name, seconds in (("serverSelectionTimeoutMS", server_selection_timeout_s),
                          ("connectTimeoutMS", connect_timeout_s),
                          ("socketTimeoutMS", socket_timeout_s)):
        if name.lower() not in given:
            options[name] = max(1, int(seconds * 1000))
    if "appname" not in given:
        options["appname"] = "agentium-graph-mongodb"
    try:
        # AsyncMongoClient does no I/O here: it connects (and resolves SRV) on first use.
        return AsyncMongoClient(uri, **options)
    except (PyMongoConfigurationError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid MongoDB URI {_redact(uri)!r}: {exc}; expected "
            "mongodb://[user:password@]host[:port][/?options] or mongodb+srv://host/",
            details={"uri": _redact(uri)}) from None


def _redact(uri: str) -> str:
    """The URI without its password (and without options, which may carry secrets)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable MongoDB URI>"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, hosts = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{hosts}"
    return f"{parts.scheme}://{netloc}{parts.path}"


if TYPE_CHECKING:
    # The store fits the protocol: checked by mypy --strict, no runtime_checkable needed.
    _fits: DurableTaskStore = MongoDBDurableTaskStore("mongodb://localhost")
