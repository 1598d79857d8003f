"""Review 18: one runtime serving many runs keeps each run's state its own.

``ExecutionGraphRuntime`` keeps the run it is executing for each task key, so that
``cancel`` reaches that run at once and ``admission_snapshot`` reports its queue. SPEC 3:
a ``run`` by the worker that holds the lease (a restarted worker, a re-delivered job) takes
the task over at once under a new fence, and the run it replaced ends with
``StaleFenceError``. Review 18 found that when both runs were in one runtime, the replaced
run, as it ended, removed the *live* run from that map. Since review 20 a second ``run``
of a task that the same runtime is running is refused instead (``LeaseHeldError`` with
``same_runtime``: taking over a live run of its own process lost confirmed effects); the
takeover by a restarted worker (another runtime, the same worker id) is what remains, and
the first test checks both.

The rest pins down what a many-task workload relies on: 60 concurrent runs of tasks with
their own root limits, budgets, failures and cancels, with re-deliveries of ``create``,
``inspect``, ``admission_snapshot`` and ``timeline`` calls in between, keep every task's
concurrency, counters and events its own and leave no asyncio task or lease behind.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from agentium_graph import (
    AdmissionEvent,
    BudgetExhaustedError,
    Budgets,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    LeaseHeldError,
    NodeFailedError,
    PlanLimits,
    RootLimits,
    StaleFenceError,
    TaskCanceledError,
    ToolBinding,
    tool_context,
)
from tests.conftest import INT_OUT, wait_until

WAIT = 10.0


class Fenced:
    """A tool whose attempt under fence 1 waits for ``first``, any later one for ``later``."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.later = asyncio.Event()
        self.started: list[int] = []

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        fence = tool_context().fence
        self.started.append(fence)
        await (self.first if fence == 1 else self.later).wait()
        return {"value": fence}


@pytest.mark.parametrize("created_here", [True, False], ids=["created-here", "created-elsewhere"])
async def test_a_replaced_run_leaves_the_live_run_reachable(created_here: bool) -> None:
    tool = Fenced()
    catalog = HostCatalog([ToolBinding(id="t", version="1", execute=tool.tool,
                                       recovery="pure", output_schema=INT_OUT)])
    store = InMemoryDurableTaskStore()
    # Renewals (which would also observe a cancel) are far apart: what reaches the live
    # run within the test's bound is the runtime's in-process cancel.
    old = ExecutionGraphRuntime(catalog=catalog, store=store, lease_ttl=30, poll_interval=20)
    rt = ExecutionGraphRuntime(catalog=catalog, store=store, lease_ttl=30, poll_interval=20)
    creator = old if created_here else ExecutionGraphRuntime(catalog=catalog, store=store)
    await creator.create("k", ExecutionGraphProgram(id="p", version="1", plan={
        "schemaVersion": 1, "revision": 1,
        "nodes": [{"id": "a", "binding": "t", "version": "1", "args": {}}]}))
    replaced = asyncio.create_task(old.run("k", "w1"))
    await wait_until(lambda: tool.started == [1], WAIT)
    with pytest.raises(LeaseHeldError) as refused:  # the same runtime again: refused
        await old.run("k", "w1")
    assert refused.value.same_runtime and tool.started == [1]
    live = asyncio.create_task(rt.run("k", "w1"))  # the same worker restarted: takes over
    await wait_until(lambda: tool.started == [1, 2], WAIT)
    tool.first.set()
    async with asyncio.timeout(WAIT):
        with pytest.raises(StaleFenceError):
            await replaced
    snapshot = await rt.admission_snapshot("k")
    assert (snapshot.active, snapshot.queued) == (1, 0)  # the live run's node holds one
    await rt.cancel("k", "operator stop")
    async with asyncio.timeout(WAIT):
        with pytest.raises(TaskCanceledError):
            await live
    assert (await rt.inspect("k")).status == "canceled"


# --- many tasks on one runtime --------------------------------------------------------


class InFlight:
    """An async tool that records, per task, how many of its calls run at once."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    async def tool(self, args: dict[str, Any]) -> dict[str, Any]:
        key = tool_context().key
        self.now[key] += 1
        self.most[key] = max(self.most[key], self.now[key])
        try:
            for _ in range(args["turns"]):
                await asyncio.sleep(0)
            if args.get("fail"):
                raise RuntimeError(f"{key} fails on purpose")
            return {"value": args["turns"]}
        finally:
            self.now[key] -= 1


def task_program(width: int, fail: bool) -> ExecutionGraphProgram:
    nodes = [{"id": f"n{i}", "binding": "w", "version": "1",
              "args": {"turns": 1 + i % 3, **({"fail": True} if fail and i == 1 else {})}}
             for i in range(width)]
    return ExecutionGraphProgram(id="many", version="1",
                                 plan={"schemaVersion": 1, "revision": 1, "nodes": nodes},
                                 limits=PlanLimits(max_concurrency=5))


EXPECTED = {"ok": "completed", "fail": NodeFailedError.__name__,
            "budget": BudgetExhaustedError.__name__, "cancel": TaskCanceledError.__name__}


def stores() -> list[str]:
    return ["memory", "sqlite"]


@pytest.mark.parametrize("store_kind", stores())
async def test_sixty_tasks_at_once_keep_their_limits_counters_and_events(
        store_kind: str, tmp_path: Any) -> None:
    rnd = random.Random(18)
    tool = InFlight()
    catalog = HostCatalog([ToolBinding(id="w", version="1", execute=tool.tool,
                                       recovery="pure", output_schema=INT_OUT)])
    if store_kind == "sqlite":
        from agentium_graph_sqlite import SQLiteDurableTaskStore
        store: Any = SQLiteDurableTaskStore(tmp_path / "many.db")
    else:
        store = InMemoryDurableTaskStore()
    events: dict[str, list[AdmissionEvent]] = defaultdict(list)
    rt = ExecutionGraphRuntime(catalog=catalog, store=store,
                               limits=RootLimits(max_concurrent_work=4),
                               on_admission=lambda e: events[e.key].append(e))
    n_tasks = 60 if store_kind == "memory" else 30
    tasks: dict[str, dict[str, Any]] = {}
    for i in range(n_tasks):
        kind = ("ok", "fail", "budget", "cancel", "ok")[i % 5]
        spec = {"kind": kind, "cap": 1 + i % 3, "program": task_program(3 + i % 4, kind == "fail"),
                "budgets": Budgets(tool_calls=2) if kind == "budget" else None}
        await rt.create(f"t{i}", spec["program"], budgets=spec["budgets"],
                        limits=RootLimits(max_concurrent_work=spec["cap"]))
        tasks[f"t{i}"] = spec

    async def run(key: str) -> str:
        try:
            return (await rt.run(key, f"w-{key}")).status
        except (NodeFailedError, BudgetExhaustedError, TaskCanceledError) as exc:
            return type(exc).__name__

    snapshots: dict[str, list[Any]] = defaultdict(list)

    async def operator() -> None:
        for _ in range(40):
            key = f"t{rnd.randrange(n_tasks)}"
            spec = tasks[key]
            again = await rt.create(key, spec["program"], budgets=spec["budgets"],
                                    limits=RootLimits(max_concurrent_work=spec["cap"]))
            assert again.key == key and again.limits == (await rt.inspect(key)).limits
            snapshots[key].append(await rt.admission_snapshot(key))
            page = await rt.timeline(key, limit=5)
            assert page.key == key and page.total >= len(page.events)
            await asyncio.sleep(0)

    async def canceler() -> None:
        for key, spec in tasks.items():
            if spec["kind"] == "cancel":
                await asyncio.sleep(0)
                await rt.cancel(key, "not needed any more")

    async with asyncio.timeout(120):
        outcome = await asyncio.gather(*(run(k) for k in tasks), operator(), canceler())
    results = dict(zip(tasks, outcome[:n_tasks], strict=True))
    for key, spec in tasks.items():
        allowed = {EXPECTED[spec["kind"]]}
        if spec["kind"] == "cancel":
            allowed.add("completed")  # it may finish before the cancel arrives
        assert results[key] in allowed, (key, spec["kind"], results[key])
        assert tool.most[key] <= spec["cap"], (key, tool.most[key], spec["cap"])
        assert {e.capacity for e in events[key]} <= {spec["cap"]}, key
        admitted = Counter(e.node_id for e in events[key] if e.kind == "admitted")
        released = Counter(e.node_id for e in events[key] if e.kind == "released")
        assert admitted == released, key
        for snap in snapshots[key]:
            assert snap.active <= spec["cap"]
            if snap.active or snap.queued:
                assert snap.capacity == spec["cap"], (key, snap)
        view = await rt.inspect(key)
        assert view.lease is None, (key, view.lease)
        assert view.limits["tool_calls"] == (2 if spec["kind"] == "budget" else None)
        assert view.counters["work_attempts"] == view.counters["tool_calls"]
        assert view.counters["tool_calls"] <= (2 if spec["kind"] == "budget" else 6)
    assert Counter(results.values())["completed"] >= n_tasks // 5 * 2
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    await store.close()
