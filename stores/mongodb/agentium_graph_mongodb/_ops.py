"""The store's operations on one database: every transition through the shared state machine.

A transition that changes the header (commit, acquire, release) is:

1. take the task document (this store's cached copy, else one read);
2. let :mod:`agentium_graph.store._transitions` decide, giving the ``$set`` paths;
3. insert blobs and journal entries (insert-if-absent, deterministic ``_id``; two
   ``insert_many`` at once, one per collection);
4. one ``find_one_and_update`` filtered on ``_id`` + ``header.seq`` (compare-and-set).

Steps 3 and 4 are separate commands, so a server that crashed between them (or a replica
set that rolled back) may have lost side records it had acknowledged (with ``j=False`` or
``w=1``). The compare-and-set is therefore never retried on its own: after any transient
failure of a transition, its side records are inserted again (idempotently) first, so a
committed task never points at a blob or journal entry that is not there.

A miss in step 4 means another writer got there first: read again and decide again
(bounded). Errors the state machine raises from a cached copy are re-checked against a
fresh read before they are believed. Journal entries above the committed
``header.journal_seq`` are invisible to readers; entries left there by a writer that lost
its race or crashed are *claimed* (by bumping ``header.seq``, which fails any writer still
holding them) and then replaced. Each update also records a random token in ``writes``, so
a writer whose acknowledgement was lost recognizes its own write instead of applying it
twice. ``request_cancel`` and ``renew_lease`` touch only their own fields, so they never
conflict with the lease holder's compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from agentium_graph.errors import (
    AgentiumGraphError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    TaskNotFoundError,
)
from agentium_graph.store import (
    TERMINAL_TASK,
    AcquireLeaseRequest,
    ActionRecord,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    JournalEntry,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    NodeRecord,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    TimelineRequest,
    acquire_with_steps,
    apply_commit,
    creation_entry,
    identity_conflict,
    lease_expiry,
    needs,
    release_lease,
    renew_lease,
    request_cancel,
)
from agentium_graph_mongodb._codec import (
    BLOBS,
    JOURNAL,
    SCHEMA_VERSION,
    TASKS,
    blob_doc,
    blob_text,
    changed_header_fields,
    charges_text,
    check_version,
    damaged,
    encode_key,
    entry_from_doc,
    header_doc,
    journal_doc,
    schema_errors,
    stored_node,
)
from agentium_graph_mongodb._doc import WRITES_KEPT, DocCache, TaskDoc, write_tokens
from agentium_graph_mongodb._errors import (
    DOCUMENT_LIMIT_BYTES,
    DUPLICATE_KEY,
    FailureWatch,
    RedoSideWrites,
    TransientStoreError,
    bounded,
    internal_error_of,
    map_mongo_error,
    watching_failures,
)
from agentium_graph_mongodb._records import (
    check_create_size,
    grant_of,
    loaded,
    parse_header,
    parse_identity,
    parse_records,
    record_sets,
)

T = TypeVar("T")
R = TypeVar("R")
_IN_CHUNK = 1000  # bound on the ids of one $in list
_HEADER_ONLY = {"header": 1, "v": 1}
_NOT_IDENTITY = {"identity": 0, "first_entry": 0}


class IO(Protocol):
    """The store's one way to the server: errors mapped, transient ones retried."""

    def __call__(self, op: str, fn: Callable[[], Awaitable[T]], *,
                 write: bool = False, redo: bool = False) -> Awaitable[T]: ...


@dataclass(slots=True)
class Counters:
    reads: int = 0
    writes: int = 0
    round_trips: int = 0
    transient_retries: int = 0
    cas_misses: int = 0
    cache_hits: int = 0
    orphans_reclaimed: int = 0


@dataclass(slots=True)
class _Plan(Generic[R]):
    """What a decided transition writes, and how its result is built from the post-image."""

    sets: dict[str, Any]
    finish: Callable[[TaskHeader], R]
    journal: list[JournalEntry] = field(default_factory=list)
    blobs: dict[str, str] = field(default_factory=dict)
    guard: dict[str, Any] = field(default_factory=dict)  # extra filter conditions


@dataclass(slots=True)
class _Sent:
    """``blobs_at``: the failure count when a transition last inserted its blobs (and
    nothing failed meanwhile); -1 before."""

    blobs_at: int = -1


def _token() -> str:
    return uuid.uuid4().hex


class Session:
    """Every protocol operation against one database (built once the database is ready)."""

    def __init__(self, db: AsyncDatabase[dict[str, Any]], io: IO, counters: Counters,
                 cache: DocCache, cas_attempts: int, retries: int) -> None:
        self.db = db
        self.tasks: AsyncCollection[dict[str, Any]] = db[TASKS]
        self.journal: AsyncCollection[dict[str, Any]] = db[JOURNAL]
        self.blobs: AsyncCollection[dict[str, Any]] = db[BLOBS]
        self.io = io
        self.counters = counters
        self.cache = cache
        self.cas_attempts = cas_attempts
        self.retries = retries  # side records inserted again, then the CAS: how many times
        self.users = 0  # protocol operations running on this session (see the store's _call)
        self.idle = asyncio.Event()
        self.idle.set()

    # --- reads ----------------------------------------------------------------------------
    async def _find_one(self, op: str, key: str,
                        projection: dict[str, int]) -> dict[str, Any] | None:
        return await self.io(op, lambda: self.tasks.find_one({"_id": key}, projection))

    async def load(self, op: str, key: str) -> TaskDoc:
        raw = await self._find_one(op, key, _NOT_IDENTITY)
        if raw is None:
            raise TaskNotFoundError(key)
        return TaskDoc.from_raw(raw)

    async def get_header(self, key: str) -> TaskHeader | None:
        raw = await self._find_one("get_header", key, _HEADER_ONLY)
        return None if raw is None else parse_header(raw, key)

    async def get_task(self, key: str) -> TaskSnapshot | None:
        raw = await self._find_one("get_task", key, _NOT_IDENTITY)
        if raw is None:
            return None
        doc = TaskDoc.from_raw(raw)
        nodes = parse_records(doc, NodeRecord, "nodes", doc.nodes)
        actions = parse_records(doc, ActionRecord, "actions", doc.actions)
        return TaskSnapshot(header=doc.parsed_header(),
                            nodes={n.node_id: n for n in nodes.values()},
                            actions={a.action_id: a for a in actions.values()})

    async def get_identity(self, key: str) -> TaskIdentity | None:
        raw = await self._find_one("get_identity", key, {"identity": 1, "v": 1})
        if raw is None:
            return None
        return parse_identity(raw, key)

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        # Task keys are strings: a document with another kind of _id (someone else's) is
        # no task, and would sort before them (numbers) or after them (ObjectIds).
        ids: dict[str, Any] = {"$type": "string"}
        if request.after is not None:
            ids["$gt"] = request.after
        query: dict[str, Any] = {"_id": ids}
        if request.status is not None:
            query["header.status"] = request.status

        async def run() -> list[dict[str, Any]]:
            cursor = self.tasks.find(query, _HEADER_ONLY).sort("_id", 1).limit(request.limit)
            return await cursor.to_list(None)
        return [parse_header(raw, raw["_id"]) for raw in await self.io("list_tasks", run)]

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        wanted = sorted(set(digests))
        out: dict[str, str] = {}
        for start in range(0, len(wanted), _IN_CHUNK):
            part = wanted[start:start + _IN_CHUNK]

            async def run(part: list[str] = part) -> list[dict[str, Any]]:
                return await self.blobs.find({"_id": {"$in": part}}).to_list(None)
            for raw in await self.io("get_blobs", run):
                out[str(raw["_id"])] = blob_text(raw)
        return out

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        key = request.key
        raw = await self._find_one("read_timeline", key,
                                   {"header.journal_seq": 1, "first_entry": 1, "v": 1})
        if raw is None:
            raise TaskNotFoundError(key)
        where = f"task document {key!r}"
        check_version(raw, where, key)
        header = raw.get("header")
        committed = header.get("journal_seq") if isinstance(header, dict) else None
        if not isinstance(committed, int) or isinstance(committed, bool):
            raise damaged(where, "header.journal_seq is missing or not an integer", key)
        with schema_errors(where, "first_entry", key):
            first = JournalEntry.model_validate_json(raw["first_entry"])
        out: list[JournalEntry] = []
        if request.after_seq < 1 <= committed:
            out.append(first)  # the creation entry lives in the task document itself
        after = max(request.after_seq, 1)
        room = request.limit - len(out)
        if room > 0 and committed > after:
            # Only entries up to the committed journal_seq: anything above is an orphan.
            async def run() -> list[dict[str, Any]]:
                cursor = self.journal.find({"k": key, "s": {"$gt": after, "$lte": committed}})
                return await cursor.sort("s", 1).limit(room).to_list(None)
            docs = await self.io("read_timeline", run)
            entries = [entry_from_doc(d) for d in docs]
            expected = list(range(after + 1, after + 1 + min(room, committed - after)))
            if [e.seq for e in entries] != expected:
                missing = sorted(set(expected) - {e.seq for e in entries})
                raise StoreSchemaError(
                    f"MongoDB store: journal of task {key!r} is missing committed entries "
                    f"{missing[:10]}: they were deleted, or the server lost acknowledged "
                    "writes (a crash with a write concern without j=True, a replica-set "
                    "rollback with w=1, a restored backup older than the tasks collection). "
                    "Restore the journal collection from a backup taken with the tasks "
                    "collection", details={"key": key, "missing": missing[:10]})
            out.extend(entries)
        return out

    # --- creation -------------------------------------------------------------------------
    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        key = request.header.key
        try:
            entry = creation_entry(request)
        except AgentiumGraphError:
            existing = await self._find_one("create_task", key, {"header": 1, "identity": 1,
                                                                 "writes": 1, "v": 1})
            if existing is None:
                raise
            return self._existing(existing, request, token=None)
        token = _token()
        doc = TaskDoc(key=key, header=header_doc(request.header),
                      nodes={encode_key(n.node_id): stored_node(n).model_dump_json()
                             for n in request.nodes},
                      admissions={encode_key(request.admission_id): charges_text({})},
                      writes=[token])
        raw = {"_id": key, "v": SCHEMA_VERSION, "header": doc.header,
               "identity": request.identity.model_dump_json(),
               "first_entry": entry.model_dump_json(), "nodes": doc.nodes, "actions": {},
               "admissions": doc.admissions, "writes": doc.writes}
        check_create_size(raw)

        async def insert() -> bool:
            try:
                await self.tasks.insert_one(raw)
            except DuplicateKeyError:
                return False
            return True

        async def side_writes() -> bool:
            await self._insert_blobs("create_task", request.blobs)
            return True
        with watching_failures() as watch:
            inserted = await self._with_side_writes(
                "create_task", key, watch, side_writes,
                lambda: self.io("create_task", insert, write=True, redo=True))
        if inserted:
            self.cache.put(doc)
            return CreateTaskResult(created=True, header=doc.parsed_header())
        existing = await self._find_one("create_task", key, {"header": 1, "identity": 1,
                                                             "writes": 1, "v": 1})
        if existing is None:  # created and deleted in between: a fresh attempt decides
            raise StoreUnavailableError(
                f"MongoDB store: task {key!r} was deleted while being created; create it again",
                details={"key": key})
        return self._existing(existing, request, token)

    def _existing(self, raw: dict[str, Any], request: CreateTaskRequest,
                  token: str | None) -> CreateTaskResult:
        key = request.header.key
        header = parse_header(raw, key)
        if token is not None and token in write_tokens(raw, key):
            # Our own insert, acknowledged only on a retry after a lost reply.
            return CreateTaskResult(created=True, header=header)
        if header.identity_digest != request.header.identity_digest:
            identity_conflict(parse_identity(raw, key), request.identity)
        return CreateTaskResult(created=False, header=header)

    # --- compare-and-set transitions ------------------------------------------------------
    async def acquire(self, request: AcquireLeaseRequest) -> LeaseGrant:
        need = needs(request.steps)

        def decide(doc: TaskDoc) -> _Plan[LeaseGrant]:
            nodes, actions, charged = loaded(doc, need)
            header, journal, delta = acquire_with_steps(doc.parsed_header(), nodes, actions,
                                                        charged, request)
            lease = doc.header.get("lease")
            # Renewals do not move header.seq: guard on the expiry this decision saw.
            guard = {"header.lease": None} if lease is None else {
                "header.lease.expires_at": lease["expires_at"]}
            if delta is not None:
                # A cancel request does not move seq either, and steps are refused while
                # one is pending: the CAS must miss if one arrived after this read.
                guard["header.cancel"] = None
            sets = changed_header_fields(doc.header, header_doc(header))
            if delta is not None:
                sets.update(record_sets(delta))
            finish = functools.partial(grant_of, expires_at=lease_expiry(request),
                                       doc=doc if request.snapshot else None, delta=delta)
            return _Plan(sets=sets, finish=finish, journal=journal, guard=guard,
                         blobs=dict(request.blobs) if delta is not None else {})
        return await self._transition("acquire_lease", request.key, decide)

    async def release(self, request: ReleaseLeaseRequest) -> TaskHeader:
        def decide(doc: TaskDoc) -> _Plan[TaskHeader]:
            header = release_lease(doc.parsed_header(), request)
            return _Plan(sets=changed_header_fields(doc.header, header_doc(header)),
                         finish=lambda post: post)
        return await self._transition("release_lease", request.key, decide)

    async def commit(self, request: CommitRequest) -> CommitResult:
        need = needs(request.steps)

        def decide(doc: TaskDoc) -> _Plan[CommitResult]:
            nodes, actions, charged = loaded(doc, need)
            delta = apply_commit(doc.parsed_header(), nodes, actions, charged, request)
            sets = changed_header_fields(doc.header, header_doc(delta.header))
            sets.update(record_sets(delta))
            return _Plan(sets=sets, finish=delta.result,
                         journal=delta.journal, blobs=dict(request.blobs))
        return await self._transition("commit", request.key, decide)

    async def _transition(self, op: str, key: str,
                          decide: Callable[[TaskDoc], _Plan[R]]) -> R:
        async with self.cache.lock(key):
            with watching_failures() as watch:
                return await self._transition_watched(op, key, decide, watch)

    async def _transition_watched(self, op: str, key: str,
                                  decide: Callable[[TaskDoc], _Plan[R]],
                                  watch: FailureWatch) -> R:
        doc = self.cache.get(key)
        fresh = doc is None
        if doc is not None:
            self.counters.cache_hits += 1
        token = _token()
        sent = _Sent()
        for _ in range(self.cas_attempts):
            if doc is None:
                doc, fresh = await self.load(op, key), True
            try:
                plan = decide(doc)
            except AgentiumGraphError:
                if fresh:
                    raise
                self.cache.drop(key)  # believe a refusal only from a fresh read
                doc = None
                continue
            side = functools.partial(self._side_records, op, key, plan, token, doc.seq, sent,
                                     watch)
            cas = functools.partial(self._compare_and_set, op, key, doc, plan, token)
            outcome = await self._with_side_writes(op, key, watch, side, cas)
            if outcome is False:
                self.counters.cas_misses += 1  # lost the race for the journal slots
                self.cache.drop(key)
                doc = None
                continue
            if outcome is not None:
                post: dict[str, Any] = outcome
                header = parse_header(post, key)
                doc.apply(plan.sets, dict(post["header"]), token)
                self.cache.put(doc)
                return plan.finish(header)
            self.counters.cas_misses += 1
            self.cache.drop(key)
            try:
                doc, fresh = await self.load(op, key), True
            except AgentiumGraphError:  # gone, or no longer ours to write
                await self._drop_orphans(op, key, plan.journal, token)
                raise
            if token in doc.writes:  # ours after all: the reply was lost, then retried
                self.cache.put(doc)
                return plan.finish(doc.parsed_header())
            await self._drop_orphans(op, key, plan.journal, token)
        raise StoreUnavailableError(
            f"MongoDB store: {op} on task {key!r} lost the compare-and-set race "
            f"{self.cas_attempts} times in a row; other writers keep changing this task. "
            "Retry; if it persists, check for several workers fighting over the task",
            details={"key": key, "op": op, "attempts": self.cas_attempts})

    async def _with_side_writes(self, op: str, key: str, watch: FailureWatch,
                                side: Callable[[], Awaitable[bool]],
                                write: Callable[[], Awaitable[T]]) -> T | Literal[False]:
        """Insert the side records (``side``; False when journal slots were taken: the
        caller reads again), then ``write``, the one write that makes them visible (its
        ``io`` call made with ``redo=True``).

        After any transient failure since the side records were acknowledged the server
        may have lost them (it restarted: with ``j=False``, or a replica set rolled back
        ``w=1`` writes), so ``write`` is never retried alone: the side records are
        inserted again first (they are insert-if-absent, and a journal slot found taken by
        another writer is resolved as usual). Bounded by the store's ``retries``."""
        redos = 0
        while True:
            mark = watch.count
            if not await side():
                return False
            last: TransientStoreError | None = None
            if watch.count == mark:
                try:
                    return await write()
                except RedoSideWrites as redo:
                    last = redo.last
            redos += 1
            self.counters.transient_retries += 1
            if redos > self.retries:
                raise StoreUnavailableError(
                    f"MongoDB store: {op} on task {key!r} met transient failures {redos} times "
                    "between inserting its blobs and journal entries and the write that makes "
                    f"them visible{f' (last: {bounded(str(last), 800)})' if last else ''}. "
                    "Check that the server is running and reachable, then run the task "
                    "again: it stays recoverable. To wait longer, raise retries",
                    details={"key": key, "op": op, "attempts": redos})

    async def _side_records(self, op: str, key: str, plan: _Plan[R], token: str, seq: int,
                            sent: _Sent, watch: FailureWatch) -> bool:
        """A transition's blobs (skipped when this call inserted them already and nothing
        failed since) and journal entries; False when the caller must read again."""
        mark = watch.count
        blobs = {} if sent.blobs_at == mark else plan.blobs
        ok = await self._side_writes(op, key, blobs, plan.journal, token, seq)
        if ok and watch.count == mark:
            sent.blobs_at = mark
        return ok

    async def _side_writes(self, op: str, key: str, blobs: dict[str, str],
                           entries: list[JournalEntry], token: str, seq: int) -> bool:
        """Insert blobs and journal entries (two inserts at once, on two connections);
        False when the caller must read again and retry.

        Not one client-level ``bulkWrite``: a server that does not honour its write
        concern's ``j`` (measured on SecantusDB: 18 of 2,182 acknowledged ``j=True``
        inserts lost on SIGKILL, none with per-collection inserts) would make a
        committed task point at lost records."""
        blob_docs = [blob_doc(d, text) for d, text in sorted(blobs.items())]
        journal_docs = [journal_doc(key, e, token) for e in entries]
        if blob_docs and journal_docs:
            done = await asyncio.gather(self._insert_many(op, self.blobs, blob_docs),
                                        self._insert_many(op, self.journal, journal_docs),
                                        return_exceptions=True)
            for outcome in done:
                if isinstance(outcome, BaseException):
                    raise outcome
            taken = done[1] if isinstance(done[1], list) else []
        elif blob_docs:
            await self._insert_many(op, self.blobs, blob_docs)
            taken = []
        elif journal_docs:
            taken = await self._insert_many(op, self.journal, journal_docs)
        else:
            taken = []
        if not taken:
            return True
        return await self._resolve_taken(op, key, [journal_docs[i] for i in taken], token, seq)

    async def _compare_and_set(self, op: str, key: str, doc: TaskDoc, plan: _Plan[R],
                               token: str) -> dict[str, Any] | None:
        query = {"_id": key, "v": SCHEMA_VERSION, "header.seq": doc.seq, **plan.guard}
        update = {"$set": plan.sets,
                  "$push": {"writes": {"$each": [token], "$slice": -WRITES_KEPT}}}

        async def run() -> dict[str, Any] | None:
            return await self.tasks.find_one_and_update(
                query, update, projection=_HEADER_ONLY, return_document=ReturnDocument.AFTER)
        try:
            return await self.io(op, run, write=True, redo=True)
        except StoreError as error:
            internal = internal_error_of(error)
            if internal is None or not await self._over_limit(op, key, doc, plan.sets):
                raise
            raise map_mongo_error(internal, op, str(error.details.get("where", "")),
                                  too_large=True) from internal

    async def _over_limit(self, op: str, key: str, doc: TaskDoc, sets: dict[str, Any]) -> bool:
        """Whether ``$set: sets`` takes the stored task document over the document limit
        (asked after a server answered the write with a generic internal error; False when
        it cannot be measured: the caller then keeps that error)."""
        async def run() -> list[dict[str, Any]]:
            cursor = await self.tasks.aggregate([
                {"$match": {"_id": key}},
                {"$project": {"_id": 0, "size": {"$bsonSize": "$$ROOT"}}}])
            return await cursor.to_list(1)
        try:
            found = await self.io(op, run)
        except StoreError:
            return False
        size = found[0].get("size") if found else None
        return isinstance(size, int) and size + doc.growth(sets) > DOCUMENT_LIMIT_BYTES

    # --- side documents: blobs and journal entries -----------------------------------------
    async def _insert_many(self, op: str, collection: AsyncCollection[dict[str, Any]],
                           docs: list[dict[str, Any]]) -> list[int]:
        """Insert-if-absent; the indexes of documents whose ``_id`` already existed."""
        async def run() -> list[int]:
            try:
                await collection.insert_many(docs, ordered=False)
            except BulkWriteError as exc:
                details = exc.details or {}
                errors = details.get("writeErrors", [])
                if details.get("writeConcernErrors") or any(
                        e.get("code") != DUPLICATE_KEY for e in errors):
                    raise
                return sorted(int(e["index"]) for e in errors)
            return []
        return await self.io(op, run, write=True)

    async def _insert_blobs(self, op: str, blobs: dict[str, str]) -> None:
        if blobs:
            await self._insert_many(op, self.blobs,
                                    [blob_doc(d, text) for d, text in sorted(blobs.items())])

    async def _resolve_taken(self, op: str, key: str, taken: list[dict[str, Any]],
                             token: str, seq: int) -> bool:
        """Some journal slots this attempt needs hold documents already: find out whose."""
        ids = [d["_id"] for d in taken]

        async def fetch() -> list[dict[str, Any]]:
            return await self.journal.find({"_id": {"$in": ids}}, {"t": 1, "e": 1}).to_list(None)
        found = {d["_id"]: d for d in await self.io(op, fetch)}
        foreign: list[dict[str, Any]] = []
        for want in taken:
            have = found.get(want["_id"])
            if have is None:
                await self._slot_not_ours(op, key, want)
                return False  # removed meanwhile by a claimant: start over
            if have.get("t") != token:
                foreign.append(have)
            elif have.get("e") != want["e"]:
                # This call's own earlier, abandoned attempt: nobody else can commit it.
                async def replace(want: dict[str, Any] = want) -> int:
                    res = await self.journal.replace_one({"_id": want["_id"], "t": token}, want)
                    return res.matched_count
                if not await self.io(op, replace, write=True):
                    return False
        if not foreign:
            return True
        return await self._claim(op, key, seq, foreign)

    async def _slot_not_ours(self, op: str, key: str, want: dict[str, Any]) -> None:
        """Raise if the task's journal slot ``want`` is held by a document under another
        ``_id`` (only a hand-made or foreign document: the store names every entry by its
        task and seq). The unique index refuses every insert into it, so the commit would
        otherwise retry as if it kept losing a race."""
        async def fetch() -> dict[str, Any] | None:
            return await self.journal.find_one({"k": key, "s": want["s"]}, {"_id": 1})
        held = await self.io(op, fetch)
        if held is not None and held.get("_id") != want["_id"]:
            raise StoreSchemaError(
                f"task {key!r}: journal entry {want['s']} is held by a document with _id "
                f"{str(held.get('_id'))[:100]!r} in the journal collection, which this store "
                f"did not write (it names that entry {want['_id']!r}); no commit of the task "
                "can succeed until it is removed or the database is restored from a backup",
                details={"key": key, "seq": want["s"], "reason": "journal_slot_taken"})

    async def _claim(self, op: str, key: str, seq: int,
                     foreign: list[dict[str, Any]]) -> bool:
        """Entries of another writer sit where ours go. If the task moved on they were
        committed (our copy is stale). Otherwise they are uncommitted: bump header.seq so
        their writer can never commit them, then delete them. Either way, retry."""
        head = await self._find_one(op, key, {"header.seq": 1})
        if head is None:
            raise TaskNotFoundError(key)
        if head["header"]["seq"] != seq:
            return False

        async def bump() -> int:
            res = await self.tasks.update_one({"_id": key, "v": SCHEMA_VERSION, "header.seq": seq},
                                              {"$set": {"header.seq": seq + 1}})
            return res.matched_count
        if not await self.io(op, bump, write=True):
            return False
        claimed = [{"_id": d["_id"], "t": d.get("t")} for d in foreign]

        async def delete() -> int:
            res = await self.journal.delete_many({"$or": claimed})
            return res.deleted_count
        self.counters.orphans_reclaimed += await self.io(op, delete, write=True)
        return False

    async def _drop_orphans(self, op: str, key: str, entries: list[JournalEntry],
                            token: str) -> None:
        """Best effort: remove a lost attempt's entries (a later writer would claim them)."""
        if not entries:
            return
        ids = [journal_doc(key, e, token)["_id"] for e in entries]

        async def delete() -> None:
            await self.journal.delete_many({"_id": {"$in": ids}, "t": token})
        with contextlib.suppress(StoreError):
            await self.io(op, delete, write=True)

    # --- lease renewal and cancel: their own fields only ------------------------------------
    async def renew(self, request: RenewLeaseRequest) -> LeaseStatus:
        key = request.key
        cached = self.cache.get(key)
        header = None if cached is None else cached.parsed_header()
        fresh = header is None
        for _ in range(self.cas_attempts):
            if header is None:
                header, fresh = await self._fresh_header("renew_lease", key), True
            try:
                renewed = renew_lease(header, request)
            except AgentiumGraphError:
                if fresh:
                    raise
                header = None
                continue
            lease = header_doc(renewed)["lease"]
            query = {"_id": key, "v": SCHEMA_VERSION, "header.fence": request.fence,
                     "header.lease.owner": request.worker_id,
                     "header.lease.fence": request.fence}
            post = await self._update_header("renew_lease", query,
                                             {"header.lease.expires_at": lease["expires_at"]})
            if post is not None:
                parsed = parse_header(post, key)
                doc = self.cache.get(key)
                if doc is not None and doc.seq == parsed.seq:
                    doc.header = dict(post["header"])
                assert parsed.lease is not None
                return LeaseStatus(fence=parsed.fence, expires_at=parsed.lease.expires_at,
                                   cancel=parsed.cancel)
            self.counters.cas_misses += 1
            header = None
        raise StoreUnavailableError(
            f"MongoDB store: renew_lease on task {key!r} kept racing other writers; retry",
            details={"key": key, "op": "renew_lease"})

    async def cancel(self, request: CancelTaskRequest) -> TaskHeader:
        key = request.key
        for _ in range(self.cas_attempts):
            header = await self._fresh_header("request_cancel", key)
            wanted = request_cancel(header, request)
            if wanted is None:
                return header
            assert wanted.cancel is not None
            query = {"_id": key, "v": SCHEMA_VERSION, "header.cancel": None,
                     "header.status": {"$nin": sorted(TERMINAL_TASK)}}
            post = await self._update_header(
                "request_cancel", query,
                {"header.cancel": wanted.cancel.model_dump(mode="json")})
            if post is not None:
                return parse_header(post, key)
            self.counters.cas_misses += 1
        raise StoreUnavailableError(
            f"MongoDB store: request_cancel on task {key!r} kept racing other writers; retry",
            details={"key": key, "op": "request_cancel"})

    async def _fresh_header(self, op: str, key: str) -> TaskHeader:
        raw = await self._find_one(op, key, _HEADER_ONLY)
        if raw is None:
            raise TaskNotFoundError(key)
        return parse_header(raw, key)

    async def _update_header(self, op: str, query: dict[str, Any],
                             sets: dict[str, Any]) -> dict[str, Any] | None:
        async def run() -> dict[str, Any] | None:
            return await self.tasks.find_one_and_update(
                query, {"$set": sets}, projection=_HEADER_ONLY,
                return_document=ReturnDocument.AFTER)
        return await self.io(op, run, write=True)
