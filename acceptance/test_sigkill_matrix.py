"""SIGKILL a worker at every journal boundary, recover in a fresh process, check the books.

Every case asserts: nodes completed before the kill never run again; the interrupted node
runs at most once more; final outputs are right; counters are never refunded and never
exceed their limits; each node's attempts carry strictly increasing fences.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from acceptance._graph import EXPECTED, FAN
from acceptance.conftest import Case, snapshot
from agentium_graph import DurableTaskStore, ExecutionGraphRuntime, HostCatalog
from agentium_graph.store import TaskSnapshot

NODES = list(EXPECTED)


async def check_recovery(case: Case, store: DurableTaskStore, before: TaskSnapshot,
                         interrupted: list[str], **run: Any) -> dict[str, Any]:
    """Recover in a fresh process and check the books.

    ``interrupted``: nodes whose tool had started in the killed process without its
    completion being committed. In the recovery, every node that was not completed runs
    exactly once more and every completed node not at all.
    """
    completed_before = {n for n, r in before.nodes.items() if r.state == "completed"}
    starts_before = {n: case.starts(n) for n in NODES}
    for node in interrupted:
        assert starts_before[node] >= 1 and node not in completed_before, node
    code, out, err = case.run(**run)  # by default the killed worker's id: "w1"
    assert code == 0 and out is not None and out["ok"], (out, err)
    assert {n: v["value"] for n, v in out["output"].items()} == EXPECTED

    after = await snapshot(store, case.key)
    assert after.header.status == "completed"
    for node in completed_before:
        assert case.starts(node) == starts_before[node], f"completed node {node} ran again"
        assert after.nodes[node].attempts == before.nodes[node].attempts
    for node in NODES:
        expected = starts_before[node] + (0 if node in completed_before else 1)
        assert case.starts(node) == expected, (node, case.starts(node))
        if node not in interrupted and node not in completed_before:
            assert starts_before[node] == 0, f"{node} ran before the kill unexpectedly"
        fences = [a.fence for a in after.nodes[node].attempts]
        assert fences == sorted(set(fences)), f"{node} fences not increasing: {fences}"
        assert after.nodes[node].attempts[-1].outcome == "completed"
    for name, value in before.header.counters.items():
        assert after.header.counters[name] >= value, f"{name} was refunded"
    for name, value in after.header.counters.items():
        limit = after.header.limits.get(name)
        assert limit is None or value <= limit
    # Every fresh attempt was charged exactly once; nothing else was.
    attempts = sum(len(r.attempts) for r in after.nodes.values())
    assert after.header.counters["work_attempts"] == attempts
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([]), store=store)
    view = await runtime.inspect(case.key)
    assert view.verified, view.problems
    return out


@pytest.mark.parametrize("point, node, reran", [
    ("before_lease", None, []),
    ("after_lease", None, []),
    ("before_start_commit", "b", ["a"]),  # a's completion shares b's start commit
    ("after_start_commit", "b", []),
    ("before_completion_commit", "b", ["b"]),
    ("after_completion_commit", "b", []),
    ("before_completion_commit", "d", ["d"]),
    ("before_start_commit", "e", ["d"]),
    ("after_completion_commit", "e", []),
])
async def test_kill_at_store_boundary(case: Case, store_of: DurableTaskStore, point: str,
                                      node: str | None, reran: list[str]) -> None:
    case.run_killed(create=True, kill_at=point, node=node)
    before = await snapshot(store_of, case.key)
    if point == "before_lease":
        assert before.header.fence == 0 and before.header.lease is None
        assert all(n.state == "pending" for n in before.nodes.values())
    if point == "after_lease":
        # The worker created the task itself, so its first wave rode on the lease: one
        # durable write holds the grant and a's start, and a's tool never ran.
        assert before.header.fence == 1 and before.nodes["a"].state == "running"
        assert before.nodes["a"].attempts[-1].fence == 1 and case.starts("a") == 0
    if point == "after_start_commit":
        assert before.nodes["b"].state == "running" and case.starts("b") == 0
    if point == "after_completion_commit":
        assert before.nodes[node or ""].state == "completed"
    if point == "before_completion_commit":
        assert before.nodes[node or ""].state == "running" and case.starts(node or "") == 1
    await check_recovery(case, store_of, before, reran)
    after = await snapshot(store_of, case.key)
    if point == "after_start_commit":
        outcomes = [a.outcome for a in after.nodes["b"].attempts]
        assert outcomes == ["interrupted", "completed"]


async def test_kill_inside_the_tool(case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(create=True, kill_in_tool="b")
    before = await snapshot(store_of, case.key)
    assert before.nodes["b"].state == "running"
    await check_recovery(case, store_of, before, ["b"])


async def test_kill_during_lease_renewal(case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(create=True, kill_at="during_renewal", slow={"b": 2.0},
                    poll_interval=0.2)
    before = await snapshot(store_of, case.key)
    assert before.nodes["a"].state == "completed"
    await check_recovery(case, store_of, before, ["b"])


async def test_kill_while_fan_out_runs(case: Case, store_of: DurableTaskStore) -> None:
    case.run_killed(create=True, kill_when_fan_running=FAN)
    before = await snapshot(store_of, case.key)
    running = sorted(n for n, r in before.nodes.items() if r.state == "running")
    assert running == [f"c{i}" for i in range(FAN)]
    await check_recovery(case, store_of, before, running)


async def test_repeated_kills_then_recovery(case: Case, store_of: DurableTaskStore) -> None:
    """Three crashes in a row at different points; each recovery resumes where it was."""
    case.run_killed(create=True, kill_at="after_completion_commit", node="a")
    case.run_killed(kill_in_tool="b")
    case.run_killed(kill_at="before_completion_commit", node="d")
    before = await snapshot(store_of, case.key)
    assert before.header.fence == 3
    await check_recovery(case, store_of, before, ["d"])
    assert case.starts("b") == 2 and case.starts("d") == 2 and case.starts("a") == 1
    after = await snapshot(store_of, case.key)
    # b: started with a's completion (fence 1), killed in its tool (2), completed (3).
    assert [(a.fence, a.outcome) for a in after.nodes["b"].attempts] == [
        (1, "interrupted"), (2, "interrupted"), (3, "completed")]
    assert [(a.fence, a.outcome) for a in after.nodes["d"].attempts] == [
        (3, "interrupted"), (4, "completed")]


async def test_kill_after_a_renewal_was_written(case: Case, store_of: DurableTaskStore) -> None:
    # (review 54) "during_renewal" kills before a renewal reaches the store: here one is
    # written (the lease runs past the grant's TTL) and its answer is never seen.
    case.run_killed(create=True, kill_at="after_renewal", slow={"b": 2.0}, poll_interval=0.2)
    before = await snapshot(store_of, case.key)
    lease = before.header.lease
    assert lease is not None and lease.expires_at > lease.acquired_at + timedelta(seconds=5)
    await check_recovery(case, store_of, before, ["b"])


async def test_kill_right_after_the_lease_of_a_task_created_elsewhere(
        case: Case, store_of: DurableTaskStore) -> None:
    # (review 54) A worker that created the task takes the lease with its first starts;
    # one that did not takes the lease alone first: killed there, nothing is claimed.
    code, out, _ = case.run(create=True, create_only=True)
    assert code == 0 and out is not None and out["created"]
    case.run_killed(kill_at="after_lease")
    before = await snapshot(store_of, case.key)
    assert before.header.fence == 1 and before.header.lease is not None
    assert all(n.state == "pending" for n in before.nodes.values())
    assert before.header.counters["work_attempts"] == 0
    await check_recovery(case, store_of, before, [])


async def test_kill_after_a_completion_that_readies_nothing(
        case: Case, store_of: DurableTaskStore) -> None:
    # (review 54) b's completion commit also starts the fan-out; c0's readies nothing (d
    # waits for c1-c3, still running).
    case.run_killed(create=True, kill_at="after_completion_commit", node="c0",
                    slow={f"c{i}": 3.0 for i in range(1, FAN)})
    before = await snapshot(store_of, case.key)
    assert before.nodes["c0"].state == "completed" and before.nodes["d"].state == "pending"
    running = sorted(n for n, r in before.nodes.items() if r.state == "running")
    assert running == [f"c{i}" for i in range(1, FAN)]
    await check_recovery(case, store_of, before, running)


async def test_another_worker_takes_over_once_the_lease_expired(
        case: Case, store_of: DurableTaskStore) -> None:
    # (review 54) Every other recovery reuses the killed worker's id, which takes its own
    # lease over at once; another worker waits for it to expire (5 s), under tight limits
    # (one attempt more than the nodes: exactly the re-run of b).
    case.run_killed(create=True, kill_in_tool="b",
                    limits={"max_work_attempts": len(NODES) + 1})
    before = await snapshot(store_of, case.key)
    lease = before.header.lease
    assert lease is not None and lease.owner == "w1"
    await check_recovery(case, store_of, before, ["b"], worker="w2", wait=True)
    after = await snapshot(store_of, case.key)
    assert [a.fence for a in after.nodes["b"].attempts] == [1, 2]
    assert after.header.counters["work_attempts"] == after.header.limits["work_attempts"]
