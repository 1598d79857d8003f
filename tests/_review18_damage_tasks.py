"""Real tasks in every state a store holds, built by the runtime, for the damage tests.

:func:`build_tasks` makes, in one store: ``done`` (a completed chain of three tools),
``failed`` (a tool that raises), ``canceled``, ``stale`` (a worker died mid-chain: n0
completed, n1 running; the next worker that took the lease died holding it, and that lease
expired long ago), ``rr`` (``recovery_required``: an effect whose receipt was never recorded
and whose connector cannot tell, so its action is uncertain) and ``planned`` (a planner's
plan, committed and run). :func:`catalog` is what a worker needs to run every one of them
again and counts every tool call, dispatch and lookup (``Calls.by_node``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    NodeFailedError,
    TaskCanceledError,
    ToolBinding,
)
from agentium_graph.errors import DurableRecoveryRequiredError
from agentium_graph.providers import ScriptedProvider
from agentium_graph.store import (
    AcquireLeaseRequest,
    CommitRequest,
    CommitResult,
    RecordAction,
    SettleNode,
)
from agentium_graph.store._protocol import DurableTaskStore
from tests.conftest import INT_OUT, Calls, chain_plan, make_catalog, program
from tests.test_effects import PAY_OUT, Destination, FakeConnector
from tests.test_effects import PLAN as PAY_PLAN
from tests.test_planner import GOOD, planned, turn

KEYS = ("canceled", "done", "failed", "planned", "rr", "stale")
# Every task's clock: far enough in the past that every lease it took has expired now.
PAST = datetime(2026, 1, 1, tzinfo=UTC)


class Crash(BaseException):
    """A worker dying mid-run: nothing after it runs, nothing is settled or released."""


class _Dying:
    """Wraps a store; raises :class:`Crash` at the first commit ``when`` matches."""

    def __init__(self, store: DurableTaskStore, when: Callable[[CommitRequest], bool]) -> None:
        self._store = store
        self._when = when

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self._when(request):
            raise Crash
        return await self._store.commit(request)


def planner_program() -> ExecutionGraphProgram:
    return planned(ScriptedProvider([turn(GOOD)] * 4))


def catalog(calls: Calls, *, lookups: list[str] | None = None) -> HostCatalog:
    """Every binding the tasks use; a tool call (or an effect's dispatch or lookup) of any
    of them is counted in ``calls`` (``calls.by_node``, by node id)."""

    def boom(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        raise RuntimeError("boom")

    class Counted(FakeConnector):
        async def dispatch(self, request: Any) -> Any:
            calls.by_node["<dispatch>"] = calls.by_node.get("<dispatch>", 0) + 1
            return await super().dispatch(request)

        async def resolve_result(self, result_ref: str) -> Any:
            calls.by_node["<lookup>"] = calls.by_node.get("<lookup>", 0) + 1
            return await super().resolve_result(result_ref)

    connector = Counted(Destination(), lookups=lookups if lookups is not None else
                        ["unknown"] * 30)
    base = make_catalog(calls)
    return HostCatalog([
        *base,
        ToolBinding(id="boom", version="1", execute=boom, recovery="pure",
                    input_schema={"type": "object"}, output_schema=INT_OUT),
        ToolBinding(id="pay", version="1", connector=connector, destination="payments",
                    input_schema={"type": "object", "required": ["amount"]},
                    output_schema=PAY_OUT),
    ])


def runtime(store: DurableTaskStore, calls: Calls, *,
            clock: Callable[[], datetime] | None = None, **kw: Any) -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=catalog(calls), store=store,
                                 programs=[planner_program()], lookup_timeout=0.05,
                                 lookup_attempts=1, clock=clock, **kw)


async def build_tasks(store: DurableTaskStore) -> None:
    """Create and run the six tasks of :data:`KEYS` in ``store`` (see the module docstring)."""
    calls = Calls()
    now = [PAST]

    def clock() -> datetime:
        now[0] += timedelta(milliseconds=1)
        return now[0]

    rt = runtime(store, calls, clock=clock)
    await rt.create("done", program(chain_plan(3)))
    await rt.run("done", "w-done")
    await rt.create("failed", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 1}},
        {"id": "b", "binding": "boom", "version": "1",
         "args": {"x": {"$ref": {"node": "a", "path": ["value"]}}}}]}))
    with contextlib.suppress(NodeFailedError):
        await rt.run("failed", "w-failed")
    await rt.create("canceled", program(chain_plan(2)))
    with contextlib.suppress(TaskCanceledError):
        await rt.cancel("canceled", "not needed")
    await rt.create("planned", planner_program(), input={"start": 1})
    await rt.run("planned", "w-planned")
    # stale: the worker dies settling n1; its lease is left to expire.
    await rt.create("stale", program(chain_plan(3)))
    dying = runtime(_Dying(store, lambda r: any(  # type: ignore[arg-type]
        isinstance(s, SettleNode) and s.node_id == "n1" for s in r.steps)), calls, clock=clock)
    with contextlib.suppress(Crash):
        await dying.run("stale", "w-stale")
    # ... and a worker that then took the lease died too, without giving it back.
    await store.acquire_lease(AcquireLeaseRequest(key="stale", worker_id="w-dead",
                                                  ttl_seconds=5, now=clock()))
    # rr: the worker dies before recording the effect's receipt; the next cannot tell.
    await rt.create("rr", program(PAY_PLAN))
    dying = runtime(_Dying(store, lambda r: any(  # type: ignore[arg-type]
        isinstance(s, RecordAction) and s.action.state == "confirmed" for s in r.steps)),
        calls, clock=clock)
    with contextlib.suppress(Crash, DurableRecoveryRequiredError):
        await dying.run("rr", "w-rr")
    now[0] += timedelta(seconds=60)
    with contextlib.suppress(DurableRecoveryRequiredError):
        await rt.run("rr", "w-rr2")
    for key, status in (("done", "completed"), ("failed", "failed"), ("canceled", "canceled"),
                        ("planned", "completed"), ("stale", "running"),
                        ("rr", "recovery_required")):
        header = await store.get_header(key)
        assert header is not None and header.status == status, (key, header)
