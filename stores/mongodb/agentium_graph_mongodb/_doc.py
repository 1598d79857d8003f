"""A task document as the store holds it in memory, and the per-store cache of them.

The cache lets a commit skip its read: the lease holder usually wrote the document last,
so its copy is current, and the compare-and-set on ``header.seq`` proves it (a miss means
someone else wrote; the store then reads the document again). Records stay JSON text
in the cache, so nothing a caller receives shares state with it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson

from agentium_graph.store import TaskHeader
from agentium_graph_mongodb._codec import check_version, damaged, header_from_doc

#: How many recent write tokens a task document keeps (``writes``): enough for a writer
#: whose acknowledgement was lost to recognize its own write after a retry.
WRITES_KEPT = 8


@dataclass(slots=True)
class TaskDoc:
    """The parts of a task document a transition reads (not the identity)."""

    key: str
    header: dict[str, Any]
    nodes: dict[str, str] = field(default_factory=dict)       # encoded node id -> JSON
    actions: dict[str, str] = field(default_factory=dict)     # encoded action id -> JSON
    admissions: dict[str, str] = field(default_factory=dict)  # encoded admission id -> JSON
    writes: list[str] = field(default_factory=list)

    @property
    def seq(self) -> int:
        seq = self.header["seq"]
        assert isinstance(seq, int)
        return seq

    def parsed_header(self) -> TaskHeader:
        return header_from_doc(self.header, f"task document {self.key!r}", self.key)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> TaskDoc:
        key = str(raw.get("_id"))
        where = f"task document {key!r}"
        check_version(raw, where, key)
        header = raw.get("header")
        if not isinstance(header, Mapping):
            raise damaged(where, "header is missing" if header is None else
                          f"header is not a document (a {type(header).__name__})", key)
        seq = header.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise damaged(where, "header.seq is missing or not an integer", key)
        return cls(key=key, header=dict(header),
                    nodes=_texts(raw, "nodes", where, key),
                    actions=_texts(raw, "actions", where, key),
                    admissions=_texts(raw, "admissions", where, key),
                    writes=write_tokens(raw, key))

    def growth(self, sets: Mapping[str, Any]) -> int:
        """About how many bytes ``$set: sets`` adds to the stored document (negative when
        it shrinks), measured as BSON against this copy's records and header."""
        parts: dict[str, Mapping[str, Any]] = {
            "header": self.header, "nodes": self.nodes, "actions": self.actions,
            "admissions": self.admissions}
        change = 0
        for path, value in sets.items():
            top, _, name = path.partition(".")
            part = parts.get(top, {})
            change += _field_bytes(name, value)
            if name in part:
                change -= _field_bytes(name, part[name])
        return change

    def apply(self, sets: Mapping[str, Any], header: dict[str, Any], token: str) -> None:
        """Replay a successful update on this copy; ``header`` is the server's post-image."""
        for path, value in sets.items():
            top, _, name = path.partition(".")
            if top == "nodes":
                self.nodes[name] = value
            elif top == "actions":
                self.actions[name] = value
            elif top == "admissions":
                self.admissions[name] = value
        self.header = header
        self.writes = [*self.writes, token][-WRITES_KEPT:]


def _field_bytes(name: str, value: Any) -> int:
    return len(bson.encode({name: value})) - 5  # less the document's own length and end


def write_tokens(raw: Mapping[str, Any], key: str) -> list[str]:
    """The document's recent write tokens (``writes``)."""
    writes = raw.get("writes", [])
    if not isinstance(writes, list) or not all(isinstance(t, str) for t in writes):
        raise damaged(f"task document {key!r}",
                      "writes is not a list of write tokens (strings)", key)
    return list(writes)


def _texts(raw: Mapping[str, Any], name: str, where: str, key: str) -> dict[str, str]:
    value = raw.get(name, {})
    if not isinstance(value, Mapping):
        raise damaged(where, f"{name} is not a document of records (a {type(value).__name__})",
                      key)
    out: dict[str, str] = {}
    for field_name, text in value.items():
        if not isinstance(text, str):
            raise damaged(where, f"{name}.{field_name} is not JSON text (a "
                          f"{type(text).__name__})", key)
        out[str(field_name)] = text
    return out


class DocCache:
    """A bounded LRU of task documents plus one asyncio lock per key in use."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._docs: OrderedDict[str, TaskDoc] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())

    def get(self, key: str) -> TaskDoc | None:
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
        return doc

    def put(self, doc: TaskDoc) -> None:
        if self._size <= 0:
            return
        self._docs[doc.key] = doc
        self._docs.move_to_end(doc.key)
        while len(self._docs) > self._size:
            self._docs.popitem(last=False)

    def drop(self, key: str) -> None:
        self._docs.pop(key, None)

    def clear(self) -> None:
        self._docs.clear()

    def lock(self, key: str) -> asyncio.Lock:
        """The lock serializing this store's compare-and-set writes to one task."""
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock
