"""Opening the stores under test by name, and measuring what they write.

Names: ``memory``; ``sqlite`` (``synchronous=FULL``, the default: every acknowledged commit
survives power loss); ``sqlite-normal`` (fsync only at checkpoints; survives a process crash,
not a power loss); ``mongodb`` (needs ``agentium_graph_mongodb`` importable and
``AGENTIUM_MONGODB_URI`` set).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentium_graph import DurableTaskStore, InMemoryDurableTaskStore

MONGODB_URI_ENV = "AGENTIUM_MONGODB_URI"
DURABLE = ("sqlite", "sqlite-normal", "mongodb")
WRITES = ("create_task", "acquire_lease", "renew_lease", "release_lease", "request_cancel",
          "commit")


def mongodb_available() -> str | None:
    """Why MongoDB cannot be benchmarked here, or None when it can."""
    if not os.environ.get(MONGODB_URI_ENV):
        return f"{MONGODB_URI_ENV} is not set"
    try:
        importlib.import_module("agentium_graph_mongodb")
    except ImportError:
        return "agentium_graph_mongodb is not installed"
    return None


def open_store(name: str, directory: Path, tag: str) -> DurableTaskStore:
    """A new store named ``name``; ``tag`` keeps its data apart from other runs."""
    if name == "memory":
        return InMemoryDurableTaskStore()
    if name in ("sqlite", "sqlite-normal"):
        from agentium_graph_sqlite import SQLiteDurableTaskStore

        return SQLiteDurableTaskStore(directory / f"{tag}.db",
                                      synchronous="NORMAL" if name == "sqlite-normal" else "FULL")
    if name == "mongodb":
        # Hook for the MongoDB store: one fresh database per run, default write concern
        # (journaled majority). Its ``stats`` are read like SQLite's if it has them.
        module: Any = importlib.import_module("agentium_graph_mongodb")
        uri = os.environ[MONGODB_URI_ENV]
        store: DurableTaskStore = module.MongoDBDurableTaskStore(uri,
                                                                 database=mongodb_database(tag))
        return store
    raise SystemExit(f"unknown store {name!r}; use memory, sqlite, sqlite-normal or mongodb")


def mongodb_database(tag: str) -> str:
    return f"agentium_bench_{tag}"


def discard(store_name: str, tag: str) -> None:
    """Drop what a run left in a server-side store (the SQLite files go with the dir)."""
    if store_name != "mongodb":
        return
    from agentium_graph_mongodb.testing import MongoServer

    MongoServer("uri", os.environ[MONGODB_URI_ENV], "bench").drop_database(
        mongodb_database(tag))


def store_files(store: DurableTaskStore) -> list[Path]:
    """The files whose growth counts as bytes written (SQLite: the database and its WAL)."""
    path = getattr(store, "path", None)
    if not isinstance(path, Path):
        return []
    return [path, path.with_name(path.name + "-wal")]


def _write_syscall_bytes() -> int | None:
    # Bytes this process passed to write(2) and friends: WAL frames, checkpoints, blobs.
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Sample:
    """Counters at one instant; subtract two to measure a span."""

    calls: dict[str, int]
    stats: dict[str, int]
    file_bytes: int | None
    wchar: int | None

    def minus(self, before: Sample) -> dict[str, Any]:
        calls = {k: v - before.calls.get(k, 0) for k, v in self.calls.items()}
        stats = {k: v - before.stats.get(k, 0) for k, v in self.stats.items()}
        return {
            "calls": {k: v for k, v in calls.items() if v},
            "stats": stats,
            "file_bytes": None if self.file_bytes is None or before.file_bytes is None
            else self.file_bytes - before.file_bytes,
            "wchar": None if self.wchar is None or before.wchar is None
            else self.wchar - before.wchar,
        }


@dataclass
class Probe:
    """Counts a store's write calls (by wrapping its bound methods) and reads its stats."""

    store: DurableTaskStore
    calls: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in WRITES:
            self._wrap(name)

    def _wrap(self, name: str) -> None:
        inner: Callable[[Any], Awaitable[Any]] = getattr(self.store, name)
        calls = self.calls
        calls[name] = 0

        async def counted(request: Any) -> Any:
            calls[name] += 1
            return await inner(request)

        # An instance attribute shadows the method for this one store object only.
        setattr(self.store, name, counted)

    def sample(self) -> Sample:
        stats = getattr(self.store, "stats", None)
        numbers: dict[str, int] = {}
        if stats is not None and dataclasses.is_dataclass(stats) and not isinstance(stats,
                                                                                     type):
            numbers = {k: v for k, v in dataclasses.asdict(stats).items()
                       if isinstance(v, int)}
        files = store_files(self.store)
        size = sum(p.stat().st_size for p in files if p.exists()) if files else None
        return Sample(dict(self.calls), numbers, size, _write_syscall_bytes())


def durable_commits(delta: dict[str, Any], store_name: str) -> int | None:
    """Durable commits in a span: the store's own counter, else its write calls."""
    if store_name == "memory":
        return None
    stats: dict[str, int] = delta["stats"]
    for name in ("commits", "writes"):  # SQLite counts commits, MongoDB write calls
        if name in stats:
            return stats[name]
    calls: dict[str, int] = delta["calls"]
    return sum(calls.values())


def round_trips(delta: dict[str, Any]) -> int | None:
    """Round trips to a database server, when the store counts them (MongoDB hook)."""
    stats: dict[str, int] = delta["stats"]
    for name in ("round_trips", "roundtrips", "requests"):
        if name in stats:
            return stats[name]
    return None
