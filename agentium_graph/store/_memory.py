"""The in-memory store: the reference implementation and test fixture (not durable).

Task headers, node records and action records are kept as the frozen model objects
themselves, so a commit parses and serializes none of them. Frozen models cannot be
reassigned, but some hold mutable containers (``TaskHeader.counters``/``limits``,
``ErrorInfo.details`` of a header's or node's error, ``ActionRecord.origin``/
``resolution``). The store keeps the isolation a database gives (nothing a caller holds
can change stored state, and stored state never changes what a caller holds) by one rule:

* **Every write stores its own copies** of those containers (the ``_own_*`` functions);
  values typed ``Any`` are copied as JSON values, as if written to a database and read
  back. A node record without an error has no mutable container (``deps`` and
  ``attempts`` are tuples of immutable values), so it is stored as it is.
* **Every read hands out copies** of them: a caller never holds a stored container.
* **A write returns what** :mod:`~agentium_graph.store._transitions` **built**, uncopied.
  The transitions are pure: they only read the stored records they are given and build
  new ones with ``_records.replace`` (``model_copy``), which shares nested containers with
  the record it copies.
  So a result may share containers with the request (the caller's own objects) and with
  the stored records this very write replaces (e.g. a new header's ``limits``), but never
  with anything the store keeps afterwards.

The journal (appended on every commit, read rarely) and the identity (written once) stay
JSON text: text is immutable and, unlike many small long-lived objects, costs the garbage
collector nothing.

Each operation runs without awaiting between its read and its write, which makes it atomic
under any number of concurrent asyncio callers. A write makes every copy before it changes
anything, so one refused while copying (data that is not JSON) changes nothing.

Text no store can encode (a lone surrogate, what Python makes of an invalid byte in a
command-line argument) is refused as the durable stores refuse it, with a
:class:`~agentium_graph.ConfigurationError` naming the operation: keys, ids, reasons and
blob texts are checked before anything is read, and what a write serializes (its journal
entries, action records) before anything changes.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentium_graph._otel import traced_store
from agentium_graph.errors import ConfigurationError, ErrorInfo, TaskNotFoundError
from agentium_graph.store._records import (
    ActionRecord,
    JournalEntry,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    record_json,
    replace,
)
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
from agentium_graph.store._transitions import (
    Delta,
    acquire_with_steps,
    apply_commit,
    creation_entry,
    identity_conflict,
    lease_expiry,
    release_lease,
    renew_lease,
    request_cancel,
)


def _json_copy(value: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``value`` made of JSON values only (raises if it is not JSON), as a
    database keeps it: NaN and infinities become null, as in the JSON every durable store
    writes."""
    copied: dict[str, Any] = _finite(to_jsonable_python(value))
    return copied


def _finite(value: Any) -> Any:
    """``value`` (JSON values, its own copy) with every non-finite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        for name, item in value.items():
            if isinstance(item, float | dict | list):
                value[name] = _finite(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, float | dict | list):
                value[index] = _finite(item)
    return value


def _not_text(op: str, detail: str) -> ConfigurationError:
    return ConfigurationError(
        f"memory store: {op} was given text that is not valid Unicode ({detail}): a lone "
        "surrogate, as Python decodes an invalid byte of a command-line argument. Pass keys, "
        "ids and texts as valid UTF-8 text; the task was not changed", details={"op": op})


def _unicode_error(op: str, exc: PydanticSerializationError) -> Exception:
    """The error for a record the JSON encoder refused: typed if it held a lone surrogate;
    anything else (data that is not JSON at all) is raised as it is."""
    return _not_text(op, str(exc)) if "UnicodeEncodeError" in str(exc) else exc


def _check_text(op: str, *texts: str | None) -> None:
    """Refuse a string no store can encode (checked before anything is read or written)."""
    for text in texts:
        if text is not None and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _not_text(op, str(exc)) from None


def _check_blobs(op: str, blobs: dict[str, str]) -> None:
    for digest_, text in blobs.items():
        _check_text(op, digest_, text)


def _own_error(error: ErrorInfo | None) -> ErrorInfo | None:
    return None if error is None else error.model_copy(
        update={"details": _json_copy(error.details)})


def _own_header(header: TaskHeader) -> TaskHeader:
    update: dict[str, Any] = {"counters": dict(header.counters),
                              "limits": dict(header.limits)}
    if header.error is not None:
        update["error"] = _own_error(header.error)
    return replace(header, **update)


def _own_node(node: NodeRecord) -> NodeRecord:
    # Only ``error.details`` is mutable: ``deps`` and ``attempts`` are immutable tuples.
    return node if node.error is None else replace(node, error=_own_error(node.error))


def _own_action(action: ActionRecord) -> ActionRecord:
    resolution = action.resolution
    return replace(action, origin=_json_copy(action.origin),
                   resolution=None if resolution is None else _json_copy(resolution))


@dataclass
class _Task:
    """One task's stored state (see the module docstring for what is private)."""

    header: TaskHeader
    identity: str  # written once and read rarely: kept as JSON text
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    actions: dict[str, ActionRecord] = field(default_factory=dict)
    admissions: dict[str, dict[str, int]] = field(default_factory=dict)  # id -> charged
    journal: list[str] = field(default_factory=list)  # entries as JSON text


@dataclass
class _Row:
    """A task's state as JSON text: what ``tests/test_store_conformance_memory.py`` saves
    to a file (through :attr:`InMemoryDurableTaskStore._rows`) to share it between
    processes."""

    header: str
    identity: str
    nodes: dict[str, str] = field(default_factory=dict)
    actions: dict[str, str] = field(default_factory=dict)
    admissions: dict[str, str] = field(default_factory=dict)
    journal: list[str] = field(default_factory=list)


@traced_store("memory")
class InMemoryDurableTaskStore:
    """A process-local store. ``capabilities.durable`` is False: it cannot survive a crash."""

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self._blobs: dict[str, str] = {}
        self._capabilities = StoreCapabilities(durable=False, multi_process=False,
                                               name="memory")

    @property
    def capabilities(self) -> StoreCapabilities:
        return self._capabilities

    @property
    def _rows(self) -> dict[str, _Row]:
        """Every task as JSON text; assigning it replaces the store's tasks."""
        return {key: _Row(
            header=task.header.model_dump_json(), identity=task.identity,
            nodes={k: v.model_dump_json() for k, v in task.nodes.items()},
            actions={k: v.model_dump_json() for k, v in task.actions.items()},
            admissions={k: json.dumps(v) for k, v in task.admissions.items()},
            journal=list(task.journal))
            for key, task in self._tasks.items()}

    @_rows.setter
    def _rows(self, rows: dict[str, _Row]) -> None:
        # Freshly parsed records: nothing else holds them, so they are the private copies.
        self._tasks = {key: _Task(
            header=TaskHeader.model_validate_json(row.header), identity=row.identity,
            nodes={k: NodeRecord.model_validate_json(v) for k, v in row.nodes.items()},
            actions={k: ActionRecord.model_validate_json(v) for k, v in row.actions.items()},
            admissions={k: json.loads(v) for k, v in row.admissions.items()},
            journal=list(row.journal))
            for key, row in rows.items()}

    def _task(self, key: str) -> _Task:
        task = self._tasks.get(key)
        if task is None:
            raise TaskNotFoundError(key)
        return task

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        await asyncio.sleep(0)
        header = request.header
        key = header.key
        _check_text("create_task", key, header.task_id, header.identity_digest,
                    request.admission_id)
        _check_blobs("create_task", request.blobs)
        task = self._tasks.get(key)
        if task is not None:
            if task.header.identity_digest != request.header.identity_digest:
                identity_conflict(TaskIdentity.model_validate_json(task.identity),
                                  request.identity)
            return CreateTaskResult(created=False, header=_own_header(task.header))
        entry = creation_entry(request)
        try:
            identity = request.identity.model_dump_json()
        except PydanticSerializationError as exc:
            raise _unicode_error("create_task", exc) from None
        task = _Task(header=_own_header(request.header), identity=identity,
                     nodes={node.node_id: _own_node(node) for node in request.nodes},
                     admissions={request.admission_id: {}}, journal=[record_json(entry)])
        for digest_, text in request.blobs.items():
            self._blobs.setdefault(digest_, text)
        self._tasks[key] = task
        return CreateTaskResult(created=True, header=_own_header(task.header))

    async def get_header(self, key: str) -> TaskHeader | None:
        await asyncio.sleep(0)
        _check_text("get_header", key)
        task = self._tasks.get(key)
        return None if task is None else _own_header(task.header)

    async def get_task(self, key: str) -> TaskSnapshot | None:
        await asyncio.sleep(0)
        _check_text("get_task", key)
        task = self._tasks.get(key)
        return None if task is None else self._snapshot(task)

    @staticmethod
    def _snapshot(task: _Task) -> TaskSnapshot:
        return TaskSnapshot(
            header=_own_header(task.header),
            nodes={k: _own_node(v) for k, v in task.nodes.items()},
            actions={k: _own_action(v) for k, v in task.actions.items()})

    async def get_identity(self, key: str) -> TaskIdentity | None:
        await asyncio.sleep(0)
        _check_text("get_identity", key)
        task = self._tasks.get(key)
        return None if task is None else TaskIdentity.model_validate_json(task.identity)

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        await asyncio.sleep(0)
        _check_text("list_tasks", request.after)
        out: list[TaskHeader] = []
        for key in sorted(self._tasks):
            if request.after is not None and key <= request.after:
                continue
            header = self._tasks[key].header
            if request.status is None or header.status == request.status:
                out.append(_own_header(header))
                if len(out) >= request.limit:
                    break
        return out

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        await asyncio.sleep(0)
        _check_text("acquire_lease", request.key, request.worker_id)
        _check_blobs("acquire_lease", request.blobs)
        task = self._task(request.key)
        header, journal, delta = acquire_with_steps(
            task.header, task.nodes, task.actions, task.admissions.keys(), request)
        # The blobs belong to the steps' commit: without steps there is none (as in every
        # durable store).
        self._persist("acquire_lease", task, header, journal, delta,
                      request.blobs if delta is not None else {})
        snapshot = self._snapshot(task) if request.snapshot else None
        return LeaseGrant(fence=header.fence, expires_at=lease_expiry(request), header=header,
                          snapshot=snapshot, commit=None if delta is None else delta.result())

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        await asyncio.sleep(0)
        _check_text("renew_lease", request.key, request.worker_id)
        task = self._task(request.key)
        header = renew_lease(task.header, request)
        task.header = _own_header(header)
        assert header.lease is not None
        return LeaseStatus(fence=header.fence, expires_at=header.lease.expires_at,
                           cancel=header.cancel)

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        await asyncio.sleep(0)
        _check_text("release_lease", request.key, request.worker_id)
        task = self._task(request.key)
        header = release_lease(task.header, request)
        task.header = _own_header(header)
        return header

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        await asyncio.sleep(0)
        _check_text("request_cancel", request.key, request.reason)
        task = self._task(request.key)
        header = request_cancel(task.header, request)
        if header is None:
            return _own_header(task.header)
        task.header = _own_header(header)
        return header

    async def commit(self, request: CommitRequest) -> CommitResult:
        await asyncio.sleep(0)
        key, blobs = request.key, request.blobs
        if not (key.isascii() and request.worker_id.isascii()):  # (_check_text's own test)
            _check_text("commit", key, request.worker_id)
        if blobs:
            _check_blobs("commit", blobs)
        task = self._tasks.get(key) or self._task(key)
        # The whole task is at hand: the state machine reads the stored records themselves
        # (it never changes what it is given), so nothing is gathered per commit.
        delta = apply_commit(task.header, task.nodes, task.actions, task.admissions.keys(),
                             request)
        self._persist("commit", task, delta.header, delta.journal, delta, request.blobs)
        return delta.result()

    def _persist(self, op: str, task: _Task, header: TaskHeader,
                 journal: list[JournalEntry], delta: Delta | None,
                 blobs: dict[str, str]) -> None:
        # Callers never await between loading and this write: atomic for asyncio callers.
        # Every copy is made before anything changes: a copy that fails changes nothing.
        own_header = _own_header(header)
        nodes: dict[str, NodeRecord] = {}
        actions: dict[str, ActionRecord] = {}
        if delta is not None:
            for k, node in delta.nodes.items():
                nodes[k] = node if node.error is None else _own_node(node)  # (its test)
            for k, action in delta.actions.items():
                actions[k] = _own_action(action)
        own_journal: list[str] = []
        try:
            for entry in journal:
                own_journal.append(entry.__pydantic_serializer__.to_json(entry).decode())
            for action in actions.values():  # what a database would have to encode
                record_json(action)
        except PydanticSerializationError as exc:
            raise _unicode_error(op, exc) from None
        stored = self._blobs
        for digest_, text in blobs.items():
            stored.setdefault(digest_, text)
        task.nodes.update(nodes)
        if actions:
            task.actions.update(actions)
        if delta is not None:
            for admission, amounts in delta.charges.items():
                task.admissions[admission] = dict(amounts)
        task.journal.extend(own_journal)
        task.header = own_header

    async def get_blobs(self, digests: Sequence[str]) -> dict[str, str]:
        await asyncio.sleep(0)
        _check_text("get_blobs", *digests)
        return {d: self._blobs[d] for d in digests if d in self._blobs}

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        await asyncio.sleep(0)
        _check_text("read_timeline", request.key)
        task = self._task(request.key)
        # Journal seq n is at index n-1; entries are appended in seq order.
        window = task.journal[request.after_seq:request.after_seq + request.limit]
        return [JournalEntry.model_validate_json(e) for e in window]

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InMemoryDurableTaskStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
