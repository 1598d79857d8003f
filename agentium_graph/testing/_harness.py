"""Harnesses: how the conformance suite opens, reopens and names a store under test."""

from __future__ import annotations

import importlib
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from agentium_graph.store._protocol import DurableTaskStore


def load_factory(factory: str) -> Any:
    """Resolve ``"package.module:attribute"`` (dots allowed after the colon) to an object."""
    module_name, sep, attr_path = factory.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"store factory {factory!r} must look like 'package.module:function'")
    target: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"store factory {factory!r} is not callable")
    return target


async def open_from_factory(factory: str, factory_kwargs: Mapping[str, Any]) -> DurableTaskStore:
    """Call ``factory(**factory_kwargs)`` and return the store (awaiting it if needed).

    This is exactly what a child process of the two-process tests does, so a factory must
    be importable from a fresh interpreter and its kwargs must be JSON.
    """
    made = load_factory(factory)(**dict(factory_kwargs))
    if inspect.isawaitable(made):
        made = await made
    store: DurableTaskStore = made
    return store


class StoreHarness(ABC):
    """Opens handles on one store's data for the conformance suite.

    A harness stands for *one* data set (one SQLite file, one MongoDB database, one
    in-memory store) that starts empty for every test.

    * :meth:`connect` (abstract) builds one new handle on that data.
    * :meth:`open` connects and remembers the handle so :meth:`close` can close it.
    * :meth:`reopen` closes every handle, then opens a fresh one: for a durable store this
      is a simulated restart, and everything acknowledged before must still be there.
    * ``factory`` (``"module:function"``) and ``factory_kwargs`` (JSON) let a child
      process open a handle on the same data: ``factory(**factory_kwargs)``. The factory
      may be a class or a function, sync or async.
    * ``name`` names the store in test output.
    """

    def __init__(self, *, name: str, factory: str,
                 factory_kwargs: Mapping[str, Any] | None = None) -> None:
        kwargs = dict(factory_kwargs or {})
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"factory_kwargs of harness {name!r} must be JSON: {exc}") from None
        self.name = name
        self.factory = factory
        self.factory_kwargs: dict[str, Any] = kwargs
        self._handles: list[DurableTaskStore] = []

    @abstractmethod
    async def connect(self) -> DurableTaskStore:
        """Build one new handle on this harness's data (the harness tracks it in open())."""

    async def open(self) -> DurableTaskStore:
        """A new handle on the same data; closed by :meth:`close` / :meth:`reopen`."""
        store = await self.connect()
        self._handles.append(store)
        return store

    async def reopen(self) -> DurableTaskStore:
        """Close every open handle, then open a fresh one on the same data."""
        await self.close()
        return await self.open()

    async def close(self) -> None:
        """Close every handle this harness opened (each once, newest first)."""
        handles, self._handles = self._handles, []
        seen: set[int] = set()
        for store in reversed(handles):
            if id(store) not in seen:
                seen.add(id(store))
                await store.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, factory={self.factory!r})"


class FactoryHarness(StoreHarness):
    """The usual harness: every handle is ``factory(**factory_kwargs)``.

    For example, a SQLite store's test module::

        @pytest.fixture
        def harness(self, tmp_path) -> StoreHarness:
            return FactoryHarness(name="sqlite",
                                  factory="agentium_graph_sqlite:SQLiteDurableTaskStore",
                                  factory_kwargs={"path": str(tmp_path / "tasks.db")})
    """

    async def connect(self) -> DurableTaskStore:
        return await open_from_factory(self.factory, self.factory_kwargs)
