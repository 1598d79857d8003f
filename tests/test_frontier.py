"""The scheduler's frontier: a turn hands out nodes exactly as a sorted scan of the frontier
would, minus the leaves of scopes that are full, and a wide plan costs O(n log n) to
schedule instead of O(n²)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentium_graph import (
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    PlanLimits,
    ToolBinding,
)
from agentium_graph.runtime import _frontier as frontier_module
from agentium_graph.runtime import _run
from agentium_graph.runtime._frontier import CONTAINERS, Frontier

# (LARGE, SMALL): heaps always, never, or switched on and off as the frontier grows and
# shrinks. Every behavior below must hold in each.
MODES = {"heaps": (-1, -1), "sorted": (10 ** 9, 10 ** 9), "switching": (5, 2)}


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    large, small = MODES[request.param]
    monkeypatch.setattr(frontier_module, "LARGE", large)
    monkeypatch.setattr(frontier_module, "SMALL", small)
    return str(request.param)


def _frontier(groups: dict[str, str]) -> tuple[Frontier, dict[str, int]]:
    position = {n: i for i, n in enumerate(sorted(groups, key=lambda n: int(n[1:])))}
    return Frontier(position.__getitem__, groups.__getitem__), position


@pytest.mark.usefixtures("mode")
def test_a_turn_hands_out_members_in_position_order_once_each() -> None:
    groups = {f"n{i}": ("a", "b", CONTAINERS)[i % 3] for i in range(30)}
    frontier, _ = _frontier(groups)
    frontier.update(["n7", "n3", "n20", "n3", "n11", "n0"])
    frontier.discard("n20")
    frontier.add("n20")  # back again: two heap entries, handed out once
    turn = frontier.turn()
    assert list(turn) == ["n0", "n3", "n7", "n11", "n20"]
    turn.end()
    assert len(frontier) == 5  # nothing was discarded: all are handed out again
    turn = frontier.turn()
    assert list(turn) == ["n0", "n3", "n7", "n11", "n20"]
    turn.end()


def test_a_closed_group_hands_out_nothing_more_in_that_turn_once_large(mode: str) -> None:
    groups = {f"n{i}": ("a", "b")[i % 2] for i in range(10)}
    frontier, _ = _frontier(groups)
    frontier.update(groups)
    for _ in range(2):  # the first turn of a large frontier may be a sorted scan
        turn = frontier.turn()
        seen = []
        for node_id in turn:
            seen.append(node_id)
            if node_id == "n2":
                turn.close("a")  # n4, n6, n8 wait for a later turn
        turn.end()
    assert seen == sorted(seen, key=lambda n: int(n[1:]))
    assert [n for n in seen if groups[n] == "b"] == ["n1", "n3", "n5", "n7", "n9"]
    # A small frontier is a sorted snapshot: the caller skips a closed group's leaves by
    # the same check that closed it. Heaps skip them.
    skipped = {"n4", "n6", "n8"}
    assert (skipped <= set(seen)) if mode == "sorted" else not skipped & set(seen)
    turn = frontier.turn()
    assert list(turn) == [f"n{i}" for i in range(10)]
    turn.end()


@pytest.mark.usefixtures("mode")
def test_nodes_added_during_a_turn_wait_for_the_next_one() -> None:
    groups = {f"n{i}": "a" for i in range(5)}
    frontier, _ = _frontier(groups)
    frontier.update(["n1", "n3"])
    turn = frontier.turn()
    seen = []
    for node_id in turn:
        seen.append(node_id)
        frontier.discard(node_id)
        if node_id == "n1":
            frontier.update(["n0", "n2", "n4"])  # a snapshot would not see them either
    turn.end()
    assert seen == ["n1", "n3"]
    turn = frontier.turn()
    assert list(turn) == ["n0", "n2", "n4"]
    turn.end()
    with pytest.raises(RuntimeError):
        frontier.turn()
        frontier.turn()


@pytest.mark.usefixtures("mode")
def test_rebuild_follows_new_positions_and_groups() -> None:
    groups = {"n0": "a", "n1": "a", "n2": "b"}
    position = {"n0": 0, "n1": 1, "n2": 2}
    frontier = Frontier(lambda n: position[n], groups.__getitem__)
    frontier.update(["n0", "n1", "n2"])
    position.update(n0=5, n2=-1)
    groups["n1"] = CONTAINERS
    frontier.rebuild()
    turn = frontier.turn()
    for node_id in turn:
        if node_id == "n2":
            turn.close("a")
    turn.end()
    assert list(frontier.turn()) == ["n2", "n1", "n0"]


def _decide(node_id: str, groups: dict[str, str], keep: set[str], capacity: dict[str, int],
            full: dict[str, int], out: list[str], drop: set[str]) -> str | None:
    """What the scheduler does with a node handed out: keep it for a later turn (None), act
    on it (admit or drop it: listed in ``out`` and added to ``drop``), or skip it and close
    its full scope (returns the scope's group)."""
    group = groups[node_id]
    if node_id in keep:
        return None
    if group != CONTAINERS and full[group] >= capacity[group]:
        return group  # skipped (as when a sorted snapshot hands out a closed group's leaf)
    out.append(node_id)
    drop.add(node_id)
    if group != CONTAINERS:
        full[group] += 1
    return None


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("seed", range(25))
def test_a_turn_equals_a_sorted_scan_that_skips_full_scopes(seed: int) -> None:
    # The reference is what the scheduler did before: sort the whole frontier, examine
    # each node, skip the leaves of a scope once it is full. Both see the same random
    # frontier, decisions and additions over many turns.
    rng = random.Random(seed)
    n = 60
    groups = {f"n{i}": rng.choice(["", "c/", "d/", CONTAINERS]) for i in range(n)}
    frontier, position = _frontier(groups)
    reference: set[str] = set()
    for _ in range(40):
        for node_id in rng.sample(sorted(groups), rng.randrange(0, 8)):
            frontier.add(node_id)
            reference.add(node_id)
        capacity = {g: rng.randrange(0, 4) for g in ("", "c/", "d/")}
        keep = {n for n in groups if rng.random() < 0.2}   # e.g. materialized this turn
        later = [f"n{rng.randrange(n)}" for _ in range(3)]  # added during the turn

        expected: list[str] = []
        full = dict.fromkeys(capacity, 0)
        dropped: set[str] = set()
        closed: set[str] = set()
        for node_id in sorted(reference, key=position.__getitem__):
            if groups[node_id] in closed:
                continue
            group = _decide(node_id, groups, keep, capacity, full, expected, dropped)
            if group is not None:
                closed.add(group)
        reference -= dropped
        reference.update(later)

        got: list[str] = []
        full = dict.fromkeys(capacity, 0)
        dropped = set()
        turn = frontier.turn()
        for node_id in turn:
            group = _decide(node_id, groups, keep, capacity, full, got, dropped)
            if group is not None:
                turn.close(group)
            for gone in dropped:
                frontier.discard(gone)
        frontier.update(later)
        turn.end()
        assert got == expected
        check = frontier.turn()
        assert set(check) == reference
        check.end()  # everything handed out stays on the frontier


async def test_a_wide_fan_out_examines_each_node_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,500 independent nodes, four at a time: every waiting node used to be examined on
    # every turn (about a million readiness checks); now each is examined about once, and
    # the frontier looks up a node's group about once per time it is added.
    checks = groups = 0
    is_ready, group = _run.TaskRun._is_ready, _run.TaskRun._frontier_group

    def counting(self: Any, node: Any) -> bool:
        nonlocal checks
        checks += 1
        return is_ready(self, node)

    def counting_groups(self: Any, node_id: str) -> str:
        nonlocal groups
        groups += 1
        return group(self, node_id)

    monkeypatch.setattr(_run.TaskRun, "_is_ready", counting)
    monkeypatch.setattr(_run.TaskRun, "_frontier_group", counting_groups)

    async def noop(args: dict[str, Any]) -> dict[str, Any]:
        return {}

    n = 1500
    rt = ExecutionGraphRuntime(catalog=HostCatalog([ToolBinding(
        id="t", version="1", execute=noop, recovery="pure")]),
        limits={"max_expanded_nodes": 2 * n, "max_work_attempts": 2 * n})
    await rt.create("wide", ExecutionGraphProgram(
        id="p", version="1", limits=PlanLimits(max_nodes=n, max_concurrency=4),
        plan={"schemaVersion": 1, "revision": 1, "nodes": [
            {"id": f"n{i}", "binding": "t", "version": "1", "args": {}}
            for i in range(n)]}))
    result = await rt.run("wide")
    assert len(result.output) == n
    assert checks <= 3 * n, checks
    assert groups <= 3 * n, groups
