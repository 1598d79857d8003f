"""Property-based, differential tests of the runtime against a reference evaluator.

Hypothesis draws random valid task graphs of pure tools (``tests/_review18_prop_model.py``):
fan-outs and joins, ``dependsOn`` / ``inputsFrom``, ``$ref`` paths (whole outputs and refs
nested in lists and dicts of args), sync and async tools, tools that fail for some inputs,
nested graph and repeat bindings, random plan and root concurrency. Each task runs on the
in-memory store and on a SQLite file, and is checked against the reference and across the
two stores; then runs are interrupted at random store calls (a dying worker, a store that
fails, ``run()`` canceled) and budgets run out at random points, and the recovered task
must still end as the reference says, without re-running completed work or refunding.

Deterministic in CI (``derandomize=True``); ``HYPOTHESIS_PROFILE=deep`` runs many more
examples with random seeds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from agentium_graph import (
    AgentiumGraphError,
    BudgetExhaustedError,
    Budgets,
    DurableTaskStore,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
    NodeFailedError,
    RootLimits,
    StoreError,
    StoreUnavailableError,
    TaskCanceledError,
    TaskResult,
    TaskView,
)
from agentium_graph.store import (
    JournalEntry,
)
from agentium_graph.testing import ForwardingStore
from agentium_graph_sqlite import SQLiteDurableTaskStore
from tests._review18_prop_model import (
    Case,
    Executions,
    Reference,
    cases,
    catalog,
    evaluate,
    wide_cases,
)

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
KEY = "prop-task"
TERMINAL_NODE = {"completed", "failed", "canceled", "uncertain", "tombstoned"}


# The whole deep run of a test is one pytest item: give it time.
pytestmark = pytest.mark.timeout(7200 if DEEP else 120)


def prop_settings(examples: int) -> settings:
    return settings(derandomize=not DEEP, deadline=None,
                    max_examples=examples * 25 if DEEP else examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    database=None, phases=[Phase.explicit, Phase.generate, Phase.shrink])


# --- store wrapper -------------------------------------------------------------------------
T = TypeVar("T")


class Crash(BaseException):
    """The worker died (like a SIGKILL: nothing after it runs in that process)."""


@dataclass(frozen=True)
class Fault:
    """Where one run is interrupted: at its ``at``-th write (commit or lease acquisition).

    ``mode``: ``crash_before`` / ``crash_after`` (the worker dies before the write or right
    after it landed; every later call of that worker fails too), ``unavailable_before`` /
    ``unavailable_after`` (that one call raises StoreUnavailableError, after it landed in the
    second case), ``cancel`` (``run()`` is canceled while the write is in flight);
    ``renew_error``: the ``at``-th lease renewal raises StoreError (the run goes on);
    ``cancel_in_tool`` / ``crash_in_tool``: as a tool starts (the driver arms them);
    ``operator_cancel``: right after the write, an operator cancels the task.
    """

    at: int
    mode: str
    fresh: bool = False  # the next run is a fresh runtime (another worker)


class Faulty(ForwardingStore):
    """Wraps a store; injects one :class:`Fault` at the store boundary (no test-only branch
    in the library: the runtime calls store methods by name)."""

    def __init__(self, inner: DurableTaskStore, fault: Fault | None) -> None:
        super().__init__(inner)
        self.fault = fault
        self.writes = 0
        self.renewals = 0
        self.canceler: Callable[[], Awaitable[Any]] | None = None
        self.dead = False
        self.fired = False

    async def around(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        if op == "close":
            return await call()
        if self.dead:
            raise Crash("this worker is dead")
        if op in ("commit", "acquire_lease"):
            return await self._write(call)
        fault = self.fault
        if op == "renew_lease" and fault is not None and fault.mode == "renew_error" and \
                not self.fired:
            self.renewals += 1
            if self.renewals == (fault.at - 1) % 2 + 1:
                self.fired = True
                raise StoreError("injected: a renewal failed (disk I/O error)")
        return await call()

    async def _write(self, call: Callable[[], Awaitable[T]]) -> T:
        self.writes += 1
        fault = self.fault
        if fault is None or self.fired or self.writes != fault.at or \
                fault.mode in ("renew_error", "cancel_in_tool", "crash_in_tool"):
            return await call()
        self.fired = True
        if fault.mode == "crash_before":
            self.dead = True
            raise Crash("died before the write")
        if fault.mode == "unavailable_before":
            raise StoreUnavailableError("injected: the store is unreachable")
        if fault.mode == "operator_cancel":
            result = await call()
            assert self.canceler is not None
            await self.canceler()  # an operator cancels the task (another handle) meanwhile
            return result
        if fault.mode == "cancel":
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
            return await call()
        await call()
        if fault.mode == "crash_after":
            self.dead = True
            raise Crash("died right after the write landed")
        assert fault.mode == "unavailable_after"
        raise StoreUnavailableError("injected: the answer of a write that landed was lost")


# --- running and observing -----------------------------------------------------------------
class Stores:
    """Opens handles on one data set: the memory store (one object: it is the process), or
    one SQLite file (a new handle per worker, as a new process would open)."""

    def __init__(self, kind: str, directory: str) -> None:
        self.kind = kind
        self.path = Path(directory) / "tasks.db"
        self.memory = InMemoryDurableTaskStore()
        self.handles: list[DurableTaskStore] = []

    def open(self) -> DurableTaskStore:
        if self.kind == "memory":
            return self.memory
        store = SQLiteDurableTaskStore(self.path, synchronous="NORMAL")
        self.handles.append(store)
        return store

    async def close(self) -> None:
        for store in self.handles:
            await store.close()


@dataclass
class Observed:
    result: TaskResult | None
    error: BaseException | None
    view: TaskView
    journal: list[JournalEntry]


async def walk_timeline(rt: ExecutionGraphRuntime, limit: int) -> list[JournalEntry]:
    """The whole journal read in pages of ``limit``, checked against one big read."""
    events: list[JournalEntry] = []
    cursor: str | None = None
    total = None
    for _ in range(100_000):
        page = await rt.timeline(KEY, cursor=cursor, limit=limit)
        assert total is None or page.total == total
        total = page.total
        assert len(page.events) <= limit
        events.extend(page.events)
        if page.next_cursor is None:
            break
        assert page.events, "a page with a next cursor is never empty"
        cursor = page.next_cursor
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), \
        "timeline pages have gaps or repeats"
    assert total == len(events)
    whole = (await rt.timeline(KEY, limit=1000)).events
    if len(events) <= 1000:
        assert list(whole) == events
    return events


async def observe(rt: ExecutionGraphRuntime, limit: int) -> tuple[TaskView, list[JournalEntry]]:
    view = await rt.inspect(KEY)
    assert view.verified, view.problems
    journal = await walk_timeline(rt, limit)
    assert view.journal_length == len(journal)
    return view, journal


def settled_run_error(error: BaseException | None) -> None:
    if error is not None and not isinstance(error, AgentiumGraphError):
        raise error


# --- checks --------------------------------------------------------------------------------
def check_nodes_sane(view: TaskView, journal: list[JournalEntry]) -> None:
    fences = {e.fence for e in journal if e.kind == "lease_acquired"}
    for node_id, node in view.nodes.items():
        numbers = [a.number for a in node.attempts]
        assert numbers == list(range(1, len(numbers) + 1)), (node_id, numbers)
        node_fences = [a.fence for a in node.attempts]
        assert all(a < b for a, b in itertools.pairwise(node_fences)), \
            f"{node_id}: attempt fences not strictly increasing: {node_fences}"
        for a in node.attempts:
            assert a.fence in fences, f"{node_id}: attempt under fence {a.fence} never granted"
            assert a.fence <= view.fence
        for a in node.attempts[:-1]:
            assert a.outcome == "interrupted", (node_id, [x.outcome for x in node.attempts])
        if node.attempts:
            last = node.attempts[-1].outcome
            expected = {"completed": "completed", "failed": "failed", "canceled": "canceled",
                        "running": None}.get(node.state, "?")
            assert last == expected or (node.state == "canceled" and last is None), \
                f"{node_id} is {node.state} with its last attempt {last}"
        if node.state == "completed":
            assert node.output_digest is not None
        else:
            assert node.output is None
        if node.parent is not None:
            assert node.parent in view.nodes
            assert view.nodes[node.parent].state != "pending" or not node.attempts


def check_counters(view: TaskView) -> None:
    assert view.counters["expanded_nodes"] == len(view.nodes)
    scopes = {n.node_id.rsplit("/", 1)[0] for n in view.nodes.values() if n.parent is not None}
    assert view.counters["plan_revisions"] == 1 + len(scopes)
    leaf_attempts = sum(len(n.attempts) for n in view.nodes.values() if n.kind == "tool")
    assert view.counters["work_attempts"] == leaf_attempts
    assert view.counters["tool_calls"] == leaf_attempts
    for name, value in view.counters.items():
        limit = view.limits.get(name)
        assert limit is None or value <= limit, (name, value, limit)


def check_completed_outputs(view: TaskView, ref: Reference) -> None:
    for node_id, node in view.nodes.items():
        assert node_id in ref.outcomes, f"{node_id} was materialized but the plan has no such node"
        outcome = ref.outcomes[node_id]
        if node.state == "completed":
            assert outcome.kind == "ok", f"{node_id} completed but the reference says {outcome}"
            assert node.output == outcome.output, node_id
        if outcome.kind == "blocked":
            assert not node.attempts, f"{node_id} started although a dependency failed"


def check_concurrency(case: Case, view: TaskView, executions: Executions) -> None:
    """No more leaves ran at once than the root limit, nor in one scope than its plan's
    max_concurrency (containers hold no slot)."""
    for scope, peak in executions.peak.items():
        if scope == "*":
            assert peak <= case.max_concurrent_work, (peak, case.max_concurrent_work)
            continue
        if scope == "":
            allowed = case.plan.max_concurrency
        else:
            container = scope[:-1]
            if container not in view.nodes:  # a repeat iteration: <container>/<i>/
                container = container.rsplit("/", 1)[0]
            allowed = case.container_map[view.nodes[container].binding].plan.max_concurrency
        assert peak <= allowed, f"{peak} leaves of scope {scope!r} ran at once, limit {allowed}"


def check_final(case: Case, ref: Reference, obs: Observed, executions: Executions,
                interrupted: bool) -> None:
    """A task that ran to its end (completed or failed) agrees with the reference."""
    view = obs.view
    check_nodes_sane(view, obs.journal)
    check_counters(view)
    check_completed_outputs(view, ref)
    counts = executions.count()
    for node_id, node in view.nodes.items():
        if node.kind == "tool":
            n = counts.get(node_id, 0)
            assert n <= len(node.attempts), (node_id, n, len(node.attempts))
            if not interrupted:
                assert n == len(node.attempts), (node_id, n, len(node.attempts))
    if not interrupted:
        check_concurrency(case, view, executions)
    assert set(counts) <= set(view.nodes)
    if ref.completes:
        assert obs.error is None, f"the reference completes; the run raised {obs.error!r}"
        assert obs.result is not None and obs.result.status == "completed"
        assert obs.result.output == ref.output()
        assert view.status == "completed"
        assert set(view.nodes) == set(ref.outcomes)
        assert all(n.state == "completed" for n in view.nodes.values())
        assert view.counters["expanded_nodes"] == ref.expanded_nodes()
        assert view.counters["plan_revisions"] == ref.plan_revisions()
        if not interrupted:
            assert view.counters["tool_calls"] == len(ref.leaves)
            assert counts == dict.fromkeys(ref.leaves, 1)
        return
    assert isinstance(obs.error, NodeFailedError), \
        f"the reference fails at {sorted(ref.failing)}; the run gave {obs.error!r}"
    assert view.status == "failed"
    failing = ref.failing
    assert obs.error.node_id in failing, (obs.error.node_id, failing)
    assert view.error is not None and view.error.node_id == obs.error.node_id
    failed = {n for n, v in view.nodes.items() if v.state == "failed"}
    failed_leaves = {n for n in failed if view.nodes[n].kind == "tool"}
    assert obs.error.node_id in failed_leaves
    assert failed_leaves <= failing, failed_leaves - failing
    holders = {a for n in failed_leaves for a in ref.ancestors(n)}
    first = set(ref.ancestors(obs.error.node_id))
    assert first <= failed, f"containers of the failed node not failed: {first - failed}"
    assert failed - failed_leaves <= holders
    for node_id, node in view.nodes.items():
        assert node.state in ("completed", "failed", "canceled"), (node_id, node.state)


def normalized(view: TaskView, journal: list[JournalEntry], exact_order: bool) -> Any:
    """What two stores must agree on: everything but timestamps and the random task id."""
    nodes = {}
    for node_id, n in view.nodes.items():
        nodes[node_id] = (
            n.state, n.kind, n.binding, n.version, n.revision, n.incarnation_id, n.parent,
            n.deps, n.input_digest, n.output, n.output_digest,
            None if n.error is None else (n.error.code, n.error.node_id),
            [(a.number, a.attempt_id, a.fence, a.worker_id, a.admission_id, a.input_digest,
              a.outcome) for a in n.attempts])
    entries = [(e.kind, e.node_id, e.fence, e.data) for e in journal]
    if not exact_order:
        entries.sort(key=repr)
    return {
        "status": view.status, "revision": view.revision, "counters": view.counters,
        "limits": view.limits, "identity": view.identity_digest,
        "catalog": view.catalog_digest, "fence": view.fence,
        "error": None if view.error is None else (view.error.code, view.error.node_id),
        "nodes": nodes, "journal": entries, "journal_length": view.journal_length,
    }


async def run_once(case: Case, kind: str, directory: str, limit: int,
                   budgets: Budgets | None = None) -> tuple[Observed, Executions]:
    executions = Executions()
    cat = catalog(case, executions)
    stores = Stores(kind, directory)
    try:
        rt = ExecutionGraphRuntime(catalog=cat, store=stores.open())
        await rt.create(KEY, case.program(), input=case.input, budgets=budgets,
                        limits=RootLimits(max_concurrent_work=case.max_concurrent_work))
        reader = ExecutionGraphRuntime(catalog=cat, store=stores.open())
        running = True
        walks: list[list[JournalEntry]] = []

        async def read_along() -> None:
            # Another handle pages through the journal while the run writes it.
            while running:
                events: list[JournalEntry] = []
                cursor: str | None = None
                while True:
                    page = await reader.timeline(KEY, cursor=cursor, limit=limit)
                    events.extend(page.events)
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
                walks.append(events)
                await asyncio.sleep(0)

        along = asyncio.create_task(read_along())
        result: TaskResult | None = None
        error: BaseException | None = None
        try:
            result = await rt.run(KEY, "w0")
        except AgentiumGraphError as exc:
            error = exc
        finally:
            running = False
            await along
        view, journal = await observe(rt, limit)
        for events in walks:  # each walk saw a prefix of the journal, without gaps
            assert events == journal[:len(events)]
        if result is not None:
            assert result.counters == view.counters and result.revision == view.revision
            assert (await rt.run(KEY, "w9")) == result  # the retained result
        snapshot = await rt.admission_snapshot(KEY)
        assert snapshot.counters == view.counters and snapshot.limits == view.limits
        assert snapshot.active == 0 and snapshot.queued == 0
        return Observed(result, error, view, journal), executions
    finally:
        await stores.close()


# --- 1. plain runs on both stores ----------------------------------------------------------
@prop_settings(60)
@given(case=cases(max_root_nodes=12 if DEEP else 8, max_containers=4 if DEEP else 2),
       limit=st.integers(1, 7))
def test_random_plans_match_the_reference_on_both_stores(case: Case, limit: int) -> None:
    ref = evaluate(case)
    event("completes" if ref.completes else "fails")
    event(f"containers: {len(case.containers)}, nodes: {len(ref.outcomes)}")

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            memory, mem_exec = await run_once(case, "memory", directory, limit)
            sqlite, sql_exec = await run_once(case, "sqlite", directory, limit)
        for obs, executions in ((memory, mem_exec), (sqlite, sql_exec)):
            check_final(case, ref, obs, executions, interrupted=False)
        deterministic = ref.completes or not case.suspends()
        if deterministic:
            assert normalized(memory.view, memory.journal, not case.suspends()) == \
                normalized(sqlite.view, sqlite.journal, not case.suspends())
        else:  # a failure stops work whose progress depends on timing: compare the rest
            assert memory.view.status == sqlite.view.status
            assert memory.view.identity_digest == sqlite.view.identity_digest
            for node_id in set(memory.view.nodes) & set(sqlite.view.nodes):
                a, b = memory.view.nodes[node_id], sqlite.view.nodes[node_id]
                assert a.incarnation_id == b.incarnation_id
                if a.state == b.state == "completed":
                    assert a.output_digest == b.output_digest

    asyncio.run(main())


@prop_settings(16)
@given(case=wide_cases(), limit=st.integers(5, 40))
def test_wide_plans_match_the_reference(case: Case, limit: int) -> None:
    # Most of 65 to 130 nodes are ready at once: the scheduler's frontier keeps per-scope
    # heaps (more than 64 waiting nodes), closes full scopes, and merges them in order.
    ref = evaluate(case)
    event("completes" if ref.completes else "fails")

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            obs, executions = await run_once(case, "memory", directory, limit)
        check_final(case, ref, obs, executions, interrupted=False)

    asyncio.run(main())


# --- 2. interrupted runs and budgets -------------------------------------------------------
# Interleaved: hypothesis favours the first ones in derandomized (CI) runs.
FAULT_MODES = ("crash_before", "cancel_in_tool", "unavailable_after", "crash_after", "cancel",
               "crash_in_tool", "operator_cancel", "unavailable_before", "renew_error")
IN_TOOL = ("cancel_in_tool", "crash_in_tool")
POLL = 0.003  # lease renewals every 3 ms, so that renewal faults meet running work
LEASE_TTL = 15.0


def _clock(offset: timedelta) -> Any:
    return lambda: datetime.now(UTC) + offset


@dataclass
class History:
    """What the runs of one task did, run by run."""

    views: list[TaskView] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)


def check_progress(before: TaskView, after: TaskView, executions: Executions, run: int) -> None:
    """Between two observations around one run: nothing goes backwards, nothing completed is
    run again, and the run's new attempts carry a fence newer than any before it."""
    for name, value in before.counters.items():
        assert after.counters[name] >= value, f"{name} went down: {value} -> {after.counters[name]}"
    for name, value in after.counters.items():
        limit = after.limits.get(name)
        assert limit is None or value <= limit, (name, value, limit)
    assert after.fence >= before.fence
    assert after.journal_length >= before.journal_length
    assert set(before.nodes) <= set(after.nodes)
    for node_id, old in before.nodes.items():
        new = after.nodes[node_id]
        if old.state == "completed":
            assert new.state == "completed" and new.output_digest == old.output_digest, node_id
            assert len(new.attempts) == len(old.attempts), f"{node_id} was started again"
        if old.state in ("failed", "canceled"):
            assert new.state == old.state, (node_id, old.state, new.state)
        olds = [(a.number, a.attempt_id, a.fence) for a in old.attempts]
        news = [(a.number, a.attempt_id, a.fence) for a in new.attempts]
        assert news[:len(olds)] == olds, f"{node_id}: attempts rewritten {olds} -> {news}"
        for a in new.attempts[len(olds):]:
            assert a.fence > before.fence, f"{node_id}: new attempt under an old fence"
    for node_id, new in after.nodes.items():
        if node_id not in before.nodes:
            assert all(a.fence > before.fence for a in new.attempts)
    done = {n for n, v in before.nodes.items() if v.state == "completed"}
    again = set(executions.count(run)) & done
    assert not again, f"completed nodes executed again in run {run}: {sorted(again)}"


@dataclass
class Driver:
    """Runs one task until it settles, one fault per run, each run checked against the last.

    A worker that died is replaced by another (a new store handle, a runtime whose clock is
    past the dead worker's lease); after any other interruption the same runtime tries again,
    or a fresh one when the fault says so."""

    case: Case
    stores: Stores
    faults: list[Fault]
    budgets: Budgets | None
    limits: RootLimits
    executions: Executions = field(default_factory=Executions)
    history: History = field(default_factory=History)
    fired: bool = False  # a fault that could cost work (not a renewal) fired
    offset: timedelta = timedelta(0)
    worker: int = 0

    def runtime(self, store: Faulty) -> ExecutionGraphRuntime:
        store.canceler = self.cancel
        return ExecutionGraphRuntime(catalog=self.cat, store=store, clock=_clock(self.offset),
                                     lease_ttl=LEASE_TTL, poll_interval=POLL)

    def arm(self, fault: Fault | None, store: Faulty, task: list[asyncio.Task[Any]]) -> None:
        """A fault inside a tool: the ``at``-th tool this run enters cancels ``run()`` (from
        the loop: threads hand it over) or kills the worker (its store fails from then on)."""
        self.executions.hook = None
        if fault is None or fault.mode not in IN_TOOL:
            return
        loop = asyncio.get_running_loop()
        entered = [0]

        def hook(_node: str) -> None:
            entered[0] += 1
            if entered[0] != (fault.at - 1) % 3 + 1:
                return
            store.fired = True
            if fault.mode == "crash_in_tool":
                store.dead = True
            else:
                loop.call_soon_threadsafe(task[0].cancel)
        self.executions.hook = hook

    async def cancel(self) -> None:
        view = await self.observer.cancel(KEY, "an operator stopped it")
        self.canceled = True
        assert view.cancel is not None or view.status in ("completed", "failed")

    async def drive(self) -> Observed:
        self.cat = catalog(self.case, self.executions)
        observer = self.observer = ExecutionGraphRuntime(catalog=self.cat,
                                                         store=self.stores.open())
        queue = list(self.faults)
        fault = queue.pop(0) if queue else None
        store = Faulty(self.stores.open(), fault)
        rt = self.runtime(store)
        await rt.create(KEY, self.case.program(), input=self.case.input, budgets=self.budgets,
                        limits=self.limits)
        self.history.views.append(await observer.inspect(KEY))
        result: TaskResult | None = None
        error: BaseException | None = None
        budget_stops = 0
        for run in range(len(self.faults) + 6):
            self.executions.run = run
            holder: list[asyncio.Task[Any]] = []
            self.arm(fault, store, holder)
            holder.append(asyncio.create_task(rt.run(KEY, f"w{self.worker}")))
            await asyncio.wait(holder)
            task = holder[0]
            self.executions.hook = None
            if store.fired and fault is not None:
                event(f"fired: {fault.mode}")
                self.fired = self.fired or fault.mode != "renew_error"
            result, error = None, None
            if task.cancelled():
                outcome = "cancelled"
            elif task.exception() is None:
                result, outcome = task.result(), "result"
            else:
                error = task.exception()
                outcome = type(error).__name__
            self.history.outcomes.append(outcome)
            view = await observer.inspect(KEY)
            assert view.verified, view.problems
            previous = self.history.views[-1]
            check_progress(previous, view, self.executions, run)
            self.history.views.append(view)
            if result is not None or isinstance(error, NodeFailedError | TaskCanceledError):
                break
            if isinstance(error, BudgetExhaustedError):
                # (an operator's cancel may have been applied as soon as the stop ended)
                assert view.status == "pending" or \
                    (self.canceled and view.status == "canceled"), view.status
                same = view.counters == previous.counters and \
                    {n: v.state for n, v in view.nodes.items()} == \
                    {n: v.state for n, v in previous.nodes.items()}
                budget_stops = budget_stops + 1 if same else 0
                if budget_stops >= 1 and not queue:
                    break
            elif not (isinstance(error, Crash | StoreUnavailableError) or
                      outcome == "cancelled"):
                raise AssertionError(f"run {run} ended with {outcome}: {error!r}") from error
            restart = isinstance(error, Crash) or (fault is not None and fault.fresh)
            fault = queue.pop(0) if queue else None
            if restart:
                # Another worker (process) takes over once the last one's lease expired.
                self.offset += timedelta(seconds=LEASE_TTL * 2 + 1)
                self.worker += 1
                store = Faulty(self.stores.open(), fault)
                rt = self.runtime(store)
            else:
                store.fault = fault
                store.writes, store.renewals, store.fired = 0, 0, False
        else:
            raise AssertionError(f"the task never settled: {self.history.outcomes}")
        view, journal = await observe(observer, self.limit)
        return Observed(result, error, view, journal)

    limit: int = 3
    cat: Any = None
    observer: Any = None
    canceled: bool = False  # an operator canceled the task


@st.composite
def fault_lists(draw: st.DrawFn) -> list[Fault]:
    return draw(st.lists(st.builds(Fault, st.integers(1, 10), st.sampled_from(FAULT_MODES),
                                   st.booleans()),
                         min_size=1, max_size=3))


@st.composite
def root_limits(draw: st.DrawFn, case: Case) -> RootLimits:
    ref = evaluate(case)
    roots = len(case.plan.nodes)
    return RootLimits(
        max_concurrent_work=case.max_concurrent_work,
        max_expanded_nodes=draw(st.one_of(st.just(1000), st.integers(
            roots, max(roots, ref.expanded_nodes())))),
        max_work_attempts=draw(st.one_of(st.just(1000), st.integers(1, 12))))


@prop_settings(80)
@given(data=st.data(), case=cases(max_root_nodes=8 if DEEP else 6,
                                   max_containers=3 if DEEP else 2), faults=fault_lists(),
       kind=st.sampled_from(("sqlite", "memory")), budget=st.one_of(st.none(), st.integers(0, 12)),
       limit=st.integers(1, 7))
def test_interrupted_runs_recover_to_the_reference(data: st.DataObject, case: Case,
                                                   faults: list[Fault], kind: str,
                                                   budget: int | None, limit: int) -> None:
    ref = evaluate(case)
    event("completes" if ref.completes else "fails")
    limits = data.draw(root_limits(case))
    budgets = None if budget is None else Budgets(tool_calls=budget)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            stores = Stores(kind, directory)
            driver = Driver(case, stores, faults, budgets, limits, limit=limit)
            try:
                obs = await driver.drive()
            finally:
                await stores.close()
        event(f"outcomes: {driver.history.outcomes}")
        view = obs.view
        enough = len(ref.leaves) <= min(budget if budget is not None else 1000,
                                        limits.max_work_attempts) and \
            ref.expanded_nodes() <= limits.max_expanded_nodes
        if isinstance(obs.error, BudgetExhaustedError):
            assert not (ref.completes and enough and not driver.fired), \
                "the budgets suffice for the whole plan, yet one ran out"
            counter = obs.error.counter
            limit_of = {"tool_calls": budget, "work_attempts": limits.max_work_attempts,
                        "expanded_nodes": limits.max_expanded_nodes}
            assert counter in limit_of, counter
            if counter != "expanded_nodes":  # charged one by one: they stop at the limit
                assert view.counters[counter] == limit_of[counter], (counter, view.counters)
            assert view.counters[counter] <= (limit_of[counter] or 0)
            assert view.status == "pending"
            assert view.error is not None and view.error.code == "budget_exhausted"
            check_nodes_sane(view, obs.journal)
            check_counters(view)
            check_completed_outputs(view, ref)
            return
        if isinstance(obs.error, TaskCanceledError):
            assert driver.canceled
            assert view.status == "canceled" and view.cancel is not None
            check_nodes_sane(view, obs.journal)
            check_counters(view)
            check_completed_outputs(view, ref)
            for node_id, node in view.nodes.items():
                assert node.state in ("completed", "failed", "canceled"), (node_id, node.state)
            return
        if ref.completes and not enough:
            raise AssertionError(f"{obs.error!r}: the plan completed beyond its budgets")
        check_final(case, ref, obs, driver.executions, interrupted=True)

    asyncio.run(main())
