"""Differential, stateful testing of a store against the in-memory reference store.

:func:`run_differential` drives one random sequence of protocol calls (hypothesis's
``RuleBasedStateMachine``) against :class:`~agentium_graph.store.InMemoryDurableTaskStore`
and the store under test side by side: creates (identical, conflicting and invalid
re-creates), lease acquire / renew / release under a clock that only moves forward
(expiry, takeover by another worker, stale fences), commits of random step lists (node
transitions, charges with repeated admission ids, actions, journal notes, status changes,
plan revisions), cancel requests and commits from a second handle, blob puts, every read
with paging, and ``reopen`` (close every handle and open the data again). After each call
both stores must give the same result, or raise the same error (type, ``code`` and
``details``); after each step their whole state must be equal (every task's snapshot,
identity and journal, and the blobs), and the invariants hold: fences and counters never
decrease, the journal runs 1..``journal_seq`` without gaps, a refused call changes nothing.

Usage (needs ``hypothesis``), from a test that gives each example its own, empty data::

    def test_differential(tmp_path):
        paths = (tmp_path / f"{n}.db" for n in itertools.count())
        run_differential(lambda: FactoryHarness(
            name="mystore", factory="my_package:open_store",
            factory_kwargs={"path": str(next(paths))}), max_examples=20)

``HYPOTHESIS_PROFILE=deep`` runs 20 times the examples, each twice as long, with fresh
random seeds, and shrinks a failing sequence (CI runs are derandomized, the same sequences
every time, and report a failing one unshrunk: shrinking against a real store can take
minutes); ``HYPOTHESIS_PROFILE=shrink`` runs the CI sequences and shrinks.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, timedelta, timezone, tzinfo
from typing import Any, ClassVar, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from pydantic import BaseModel

from agentium_graph.errors import AgentiumGraphError
from agentium_graph.store._memory import InMemoryDurableTaskStore
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import TERMINAL_TASK
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitRevision,
    CreateTaskRequest,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TimelineRequest,
)
from agentium_graph.testing import _differential_steps as gen
from agentium_graph.testing._fixtures import FixedClock, TaskState, capture
from agentium_graph.testing._harness import StoreHarness

T = TypeVar("T")
Outcome = tuple[Any, ...]


def _dump(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _error(exc: Exception) -> Outcome:
    if isinstance(exc, AgentiumGraphError):
        return ("error", type(exc).__name__, exc.code, _dump(exc.details), str(exc))
    return ("untyped error", type(exc).__name__, str(exc))


def _create(store: DurableTaskStore, request: CreateTaskRequest) -> Coroutine[Any, Any, object]:
    return store.create_task(request)


def _state(state: TaskState) -> object:
    return {"snapshot": _dump(state.snapshot), "identity": _dump(state.identity),
            "timeline": _dump(state.timeline)}


class StoreDifferentialMachine(RuleBasedStateMachine):
    """The machine; :func:`run_differential` binds it to a harness factory."""

    new_harness: ClassVar[Callable[[], StoreHarness]]
    discard: ClassVar[Callable[[StoreHarness], None] | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FixedClock()
        self.reference = InMemoryDurableTaskStore()
        self.harness = type(self).new_harness()
        self.main: DurableTaskStore = self._run(self.harness.open())
        self.second: DurableTaskStore = self._run(self.harness.open())
        self.fences: dict[tuple[str, str], int] = {}  # (key, worker) -> fence it was granted
        self.revisions: dict[str, CommitRevision] = {}  # the last revision step per key
        self.highest: dict[str, tuple[int, dict[str, int]]] = {}  # fence, counters seen
        self.loose: dict[str, set[str]] = {}  # blobs a create that did not create offered

    # --- plumbing --------------------------------------------------------------------------
    def _run(self, awaitable: Awaitable[T]) -> T:
        async def run() -> T:
            return await awaitable
        return self.loop.run_until_complete(run())

    async def _attempt(self, call: Coroutine[Any, Any, object]) -> Outcome:
        try:
            return ("ok", _dump(await call))
        except Exception as exc:
            return _error(exc)

    def _both(self, call: Callable[[DurableTaskStore], Coroutine[Any, Any, object]], *,
              second: bool = False, key: str | None = None) -> Outcome:
        """``call`` on the reference, then on the store under test: the same outcome. A
        refused write (``key``: the task it touches) changes nothing in the reference."""
        before = self._run(capture(self.reference, key)) if key is not None else None
        expected = self._run(self._attempt(call(self.reference)))
        got = self._run(self._attempt(call(self.second if second else self.main)))
        assert got == expected, (f"{self.harness.name} diverged from the memory store:\n"
                                 f"  memory: {expected}\n  {self.harness.name}: {got}")
        assert expected[0] != "untyped error", f"untyped error from both stores: {expected}"
        if before is not None and key is not None and expected[0] != "ok":
            after = self._run(capture(self.reference, key))
            assert _state(after) == _state(before), f"a refused call changed {key!r}"
        return expected

    def _view(self, key: str, worker: str = "w1") -> gen.View:
        snapshot = self._run(self.reference.get_task(key))
        fence = self.fences.get((key, worker), 0 if snapshot is None else
                                snapshot.header.fence)
        return gen.View(key=key, snapshot=snapshot, fence=fence,
                        last_revision=self.revisions.get(key),
                        admissions=(*gen.ADMISSIONS, gen.create_admission(key)))

    def _fence(self, data: st.DataObject, key: str, worker: str) -> int:
        header = self._run(self.reference.get_header(key))
        current = 0 if header is None else header.fence
        mine = self.fences.get((key, worker), current)
        return data.draw(st.sampled_from((mine, mine, mine, current, max(0, current - 1),
                                          current + 1)), label="fence")

    def _granted(self, key: str, worker: str, outcome: Outcome) -> None:
        if outcome[0] == "ok":
            self.fences[key, worker] = outcome[1]["fence"]

    # --- rules -----------------------------------------------------------------------------
    @rule(key=st.sampled_from(gen.KEYS), variant=st.sampled_from((0, 0, 0, 1, 2, 3, 4)))
    def create(self, key: str, variant: int) -> None:
        request = gen.create_request(key, variant)
        outcome = self._both(lambda s: s.create_task(request), key=key)
        if outcome[0] != "ok" or not outcome[1]["created"]:
            # A store may write a create's blobs before it finds the task there (MongoDB:
            # blobs go first, so a task never names a missing one): harmless, as digests
            # name their content.
            for digest, text in request.blobs.items():
                self.loose.setdefault(digest, set()).add(text)

    @rule(seconds=st.sampled_from((0.000001, 1.0, 5.0, 29.0, 31.0, 120.0)),
          zone=st.sampled_from((UTC, UTC, timezone(timedelta(hours=5, minutes=30)),
                                timezone(timedelta(hours=-8)))))
    def advance(self, seconds: float, zone: tzinfo) -> None:
        """Time moves forward; the clock may report it in another zone (the same instant
        with another offset: stores keep both)."""
        self.clock.now = self.clock.advance(seconds).astimezone(zone)

    @rule(data=st.data(), key=st.sampled_from(gen.KEYS), worker=st.sampled_from(gen.WORKERS),
          ttl=st.sampled_from((5.0, 30.0)), snapshot=st.booleans(), second=st.booleans(),
          with_steps=st.integers(0, 3))
    def acquire(self, data: st.DataObject, key: str, worker: str, ttl: float, snapshot: bool,
                second: bool, with_steps: int) -> None:
        view = self._view(key, worker)
        view.fence = (0 if view.snapshot is None else view.snapshot.header.fence) + 1
        request = AcquireLeaseRequest(
            key=key, worker_id=worker, ttl_seconds=ttl, now=self.clock(), snapshot=snapshot,
            steps=data.draw(gen.steps(view, 3), label="steps") if with_steps == 0 else (),
            blobs=data.draw(gen.blobs(), label="blobs") if with_steps == 0 else {})
        self._granted(key, worker, self._both(lambda s: s.acquire_lease(request),
                                              second=second, key=key))

    @rule(data=st.data(), key=st.sampled_from(gen.KEYS), worker=st.sampled_from(gen.WORKERS),
          ttl=st.sampled_from((5.0, 30.0)), second=st.booleans())
    def renew(self, data: st.DataObject, key: str, worker: str, ttl: float,
              second: bool) -> None:
        request = RenewLeaseRequest(key=key, worker_id=worker, fence=self._fence(
            data, key, worker), ttl_seconds=ttl, now=self.clock())
        self._both(lambda s: s.renew_lease(request), second=second, key=key)

    @rule(data=st.data(), key=st.sampled_from(gen.KEYS), worker=st.sampled_from(gen.WORKERS))
    def release(self, data: st.DataObject, key: str, worker: str) -> None:
        request = ReleaseLeaseRequest(key=key, worker_id=worker,
                                      fence=self._fence(data, key, worker), now=self.clock())
        self._both(lambda s: s.release_lease(request), key=key)

    @initialize()
    def start(self) -> None:
        """Two tasks exist and one is leased: most sequences then commit at once."""
        for key in gen.KEYS[:2]:
            request = gen.create_request(key, 0)
            self._both(functools.partial(_create, request=request))
        lease = AcquireLeaseRequest(key=gen.KEYS[0], worker_id="w1", ttl_seconds=30.0,
                                    now=self.clock())
        self._granted(gen.KEYS[0], "w1", self._both(lambda s: s.acquire_lease(lease)))

    def _commit(self, data: st.DataObject, key: str, worker: str, fence: int, *,
                second: bool, max_steps: int) -> None:
        view = self._view(key, worker)
        view.fence = fence
        chosen = data.draw(gen.steps(view, max_steps), label="steps")
        request = CommitRequest(key=key, worker_id=worker, fence=fence, now=self.clock(),
                                steps=chosen, blobs=data.draw(gen.blobs(), label="blobs"))
        outcome = self._both(lambda s: s.commit(request), second=second, key=key)
        if outcome[0] == "ok":
            for step in chosen:
                if isinstance(step, CommitRevision):
                    self.revisions[key] = step

    @rule(data=st.data(), second=st.integers(0, 4))
    def work(self, data: st.DataObject, second: int) -> None:
        """The holder of a lease commits a few steps under its fence (a worker takes a
        lease first when no task has one)."""
        held, live = [], []
        for key in gen.KEYS:
            header = self._run(self.reference.get_header(key))
            if header is not None and header.lease is not None:
                held.append((key, header.lease.owner, header.lease.fence))
            elif header is not None and header.status not in TERMINAL_TASK:
                live.append(key)
        if not held and live:
            key = data.draw(st.sampled_from(live), label="key")
            worker = data.draw(st.sampled_from(gen.WORKERS), label="worker")
            lease = AcquireLeaseRequest(key=key, worker_id=worker, ttl_seconds=30.0,
                                        now=self.clock())
            outcome = self._both(lambda s: s.acquire_lease(lease), key=key)
            self._granted(key, worker, outcome)
            if outcome[0] == "ok":
                held.append((key, worker, outcome[1]["fence"]))
        if held:
            key, worker, fence = data.draw(st.sampled_from(held), label="lease")
            self._commit(data, key, worker, fence, second=second == 0, max_steps=3)

    @rule(data=st.data(), second=st.integers(0, 4))
    def work_more(self, data: st.DataObject, second: int) -> None:
        """(``work`` again: most of a sequence's calls should make progress.)"""
        self.work(data, second)

    @rule(data=st.data(), key=st.sampled_from(gen.KEYS), worker=st.sampled_from(gen.WORKERS),
          second=st.integers(0, 4))
    def commit(self, data: st.DataObject, key: str, worker: str, second: int) -> None:
        """A commit under the fence a worker was granted last (maybe stale), or another."""
        self._commit(data, key, worker, self._fence(data, key, worker), second=second == 0,
                     max_steps=4)

    @rule(key=st.sampled_from((*gen.KEYS, "missing")),
          reason=st.sampled_from(("operator", "second reason")))
    def cancel(self, key: str, reason: str) -> None:
        request = CancelTaskRequest(key=key, reason=reason, now=self.clock())
        self._both(lambda s: s.request_cancel(request), second=True, key=key)

    @rule(data=st.data(), key=st.sampled_from((*gen.KEYS, "missing")), second=st.booleans(),
          what=st.sampled_from(("task", "header", "identity", "list", "timeline", "blobs")))
    def read(self, data: st.DataObject, key: str, second: bool, what: str) -> None:
        call: Callable[[DurableTaskStore], Coroutine[Any, Any, object]]
        if what == "task":
            call = lambda s: s.get_task(key)  # noqa: E731
        elif what == "header":
            call = lambda s: s.get_header(key)  # noqa: E731
        elif what == "identity":
            call = lambda s: s.get_identity(key)  # noqa: E731
        elif what == "list":
            listing = ListTasksRequest(
                status=data.draw(st.sampled_from((None, *gen.STATUSES)), label="status"),
                after=data.draw(st.sampled_from((None, "", "k", *gen.KEYS, "zz")),
                                label="after"),
                limit=data.draw(st.integers(1, 4), label="limit"))
            call = lambda s: s.list_tasks(listing)  # noqa: E731
        elif what == "timeline":
            page = TimelineRequest(key=key, after_seq=data.draw(st.integers(0, 30)),
                                   limit=data.draw(st.integers(1, 5)))
            call = lambda s: s.read_timeline(page)  # noqa: E731
        else:
            digests = data.draw(st.lists(st.sampled_from((*gen.DIGESTS, "sha256:none")),
                                         max_size=3), label="digests")
            self._same_blobs(self._run(self.reference.get_blobs(digests)),
                             self._run((self.second if second else self.main).get_blobs(
                                 digests)))
            return
        self._both(call, second=second)

    @rule()
    def reopen(self) -> None:
        """Close every handle and open the data again (the reference keeps its state)."""
        self.main = self._run(self.harness.reopen())
        self.second = self._run(self.harness.open())

    # --- invariants ------------------------------------------------------------------------
    @invariant()
    def same_state(self) -> None:
        for key in gen.KEYS:
            expected = self._run(capture(self.reference, key))
            got = self._run(capture(self.main, key))
            assert _state(got) == _state(expected), (
                f"{self.harness.name} holds another state of task {key!r} than the memory "
                f"store:\n  memory: {_state(expected)}\n  {self.harness.name}: {_state(got)}")
            self._check_monotonic(key, expected)
        self._same_blobs(self._run(self.reference.get_blobs(gen.DIGESTS)),
                         self._run(self.main.get_blobs(gen.DIGESTS)))

    def _same_blobs(self, expected: dict[str, str], got: dict[str, str]) -> None:
        for digest in gen.DIGESTS:
            allowed = {expected.get(digest)}
            if digest in self.loose:
                allowed |= {None, *self.loose[digest]}
            assert got.get(digest) in allowed, (
                f"blob {digest}: {self.harness.name} has {got.get(digest)!r}, the memory store "
                f"{expected.get(digest)!r}")

    def _check_monotonic(self, key: str, state: TaskState) -> None:
        if state.snapshot is None:
            return
        header = state.snapshot.header
        assert [e.seq for e in state.timeline] == list(range(1, header.journal_seq + 1)), \
            f"journal of {key!r} has gaps: {[e.seq for e in state.timeline]}"
        fence, counters = self.highest.get(key, (0, {}))
        assert header.fence >= fence, f"fence of {key!r} went from {fence} to {header.fence}"
        for name, value in counters.items():
            assert header.counters.get(name, 0) >= value, \
                f"counter {name} of {key!r} went from {value} to {header.counters.get(name)}"
        self.highest[key] = (header.fence, dict(header.counters))

    def teardown(self) -> None:
        try:
            self._run(self.harness.close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            discard = type(self).discard
            if discard is not None:
                discard(self.harness)


def run_differential(new_harness: Callable[[], StoreHarness], *, max_examples: int = 20,
                     steps: int = 40,
                     discard: Callable[[StoreHarness], None] | None = None) -> None:
    """Run the differential machine: ``new_harness()`` gives each example a harness on its
    own, empty data set; ``discard(harness)`` (optional) removes that data afterwards."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "")
    deep = profile == "deep"
    # Shrinking a long sequence against a real store can take minutes (longer than a test's
    # timeout): CI reports the sequence as found; "deep" and "shrink" shrink it.
    phases = [p for p in Phase if p is not Phase.shrink or profile in ("deep", "shrink")]
    machine = type("Differential", (StoreDifferentialMachine,), {
        "new_harness": staticmethod(new_harness),
        "discard": None if discard is None else staticmethod(discard)})
    # Typed here: older hypothesis releases leave run_state_machine_as_test unannotated.
    run_machine: Callable[..., None] = run_state_machine_as_test
    run_machine(machine, settings=settings(
        max_examples=max_examples * (20 if deep else 1),
        stateful_step_count=steps * (2 if deep else 1), derandomize=not deep, deadline=None,
        database=None, phases=phases, suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.filter_too_much]))


__all__ = ["StoreDifferentialMachine", "run_differential"]
