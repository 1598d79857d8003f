"""The store conformance suite: how a :class:`~agentium_graph.DurableTaskStore` proves itself.

Every bundled store and every third-party store runs the same pytest suite. Requirements:
``pytest`` and ``pytest-asyncio`` (this package is the only place the SDK imports pytest).

How to use it -- one test module in your store's package::

    import pytest
    from agentium_graph.testing import FactoryHarness, StoreConformanceSuite, StoreHarness

    class TestMyStoreConformance(StoreConformanceSuite):
        @pytest.fixture
        def harness(self, tmp_path) -> StoreHarness:
            return FactoryHarness(
                name="mystore",
                factory="my_package:MyDurableTaskStore",       # "module:callable"
                factory_kwargs={"path": str(tmp_path / "db")})  # JSON only

The harness fixture must give every test its own, empty data set. A harness provides:

* ``open()``: a new handle (a store object) on that data; the suite closes them.
* ``reopen()``: close every handle and open a fresh one -- a simulated restart.
* ``factory`` / ``factory_kwargs``: a child process runs
  ``factory(**factory_kwargs)`` (sync or async) to open the *same* data.
* ``name``: shown in failure messages.

:class:`FactoryHarness` does all of that from the factory alone; subclass
:class:`StoreHarness` and implement ``connect()`` when a handle needs more (see
:class:`~agentium_graph.testing.memory.MemoryHarness`).

The suite talks to the store only through the protocol. Durability tests run only when
``capabilities.durable`` is True, two-process tests only when ``capabilities.multi_process``
is True; otherwise they are skipped with that reason. Helpers for your own tests:
:func:`make_create_request` (a valid create request like ``runtime.create()`` builds),
:func:`node_record`, :func:`action_record`, :class:`FixedClock`, :func:`capture` (a task's
whole state, to assert that a rejected call changed nothing), :func:`read_timeline` and
:class:`ForwardingStore` (wraps a store; override the calls a test observes or breaks).
See ``docs/store-authors.md``.

Also shipped here for tests and examples: :class:`ScriptedProvider`, the deterministic fake
model provider (scripted turns, tool calls, usage, delays, failures, partial streams).
"""

from agentium_graph.providers import PartialStream, ScriptedProvider, ScriptedTurn, TurnMatch
from agentium_graph.store._forwarding import ForwardingStore
from agentium_graph.testing._base import require_durable, require_multi_process
from agentium_graph.testing._fixtures import (
    T0,
    FixedClock,
    TaskState,
    acquire,
    action_record,
    capture,
    commit,
    make_create_request,
    make_identity,
    node_record,
    read_timeline,
)
from agentium_graph.testing._harness import (
    FactoryHarness,
    StoreHarness,
    load_factory,
    open_from_factory,
)
from agentium_graph.testing._suite import StoreConformanceSuite

__all__ = [
    "T0",
    "FactoryHarness",
    "FixedClock",
    "ForwardingStore",
    "PartialStream",
    "ScriptedProvider",
    "ScriptedTurn",
    "StoreConformanceSuite",
    "StoreHarness",
    "TaskState",
    "TurnMatch",
    "acquire",
    "action_record",
    "capture",
    "commit",
    "load_factory",
    "make_create_request",
    "make_identity",
    "node_record",
    "open_from_factory",
    "read_timeline",
    "require_durable",
    "require_multi_process",
]
