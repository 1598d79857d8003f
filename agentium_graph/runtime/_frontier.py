"""The scheduler's frontier: nodes that may have become ready, handed out in schedule order.

A turn of the scheduler examines frontier nodes in graph position order and admits leaves
until their scope's concurrency is full. Nodes of a full scope stay on the frontier for a
later turn. A plain set, sorted every turn, would make each turn cost O(frontier): a plan
of 10,000 independent nodes with a concurrency of 16 re-examined every waiting node on
every turn, O(n²) over the run. Here the frontier keeps one heap per *group* (the leaves
of one scope, or all containers), and a turn merges the groups' heads. Once a scope is
full the turn closes its group, so the rest of that scope's waiting leaves cost nothing:
a turn costs O((handed out + groups) · log n).

A small frontier (a chain has one node on it) is simply sorted each turn: the heaps exist
only while the frontier holds more than :data:`LARGE` nodes, until it is back under
:data:`SMALL`.

The order is exactly a sorted scan's: by position, skipping only leaves that a sorted scan
would have skipped as well (their scope is full for the rest of the turn). Leaves of a
closed group that are no longer ready are not dropped in that turn: they are dropped the
next time they are handed out, which changes nothing (a node that is not ready is
re-added when a dependency completes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator

_CONTAINERS = "\x00containers"  # the group key of container nodes (not a scope prefix)
LARGE = 64  # more members than this: keep heaps
SMALL = 16  # fewer than this: drop them (apart from LARGE so a frontier does not flap)


class Frontier:
    """Node ids with a membership set and per-group heaps of ``(position, id)``.

    ``position(node_id)`` gives a node's schedule position, ``group(node_id)`` its group:
    its scope prefix for a leaf, or :data:`CONTAINERS`. Both are read when a node is
    added; :meth:`rebuild` re-reads them after the graph changed shape (a plan revision
    may give an id a new spec). Heaps hold stale entries for removed nodes; they are
    dropped when they come up."""

    __slots__ = ("_deferred", "_group", "_heaps", "_members", "_position", "_was_large")

    def __init__(self, position: Callable[[str], int], group: Callable[[str], str]) -> None:
        self._position = position
        self._group = group
        self._members: set[str] = set()
        # Per group, while the frontier is large (None while it is small).
        self._heaps: dict[str, list[tuple[int, str]]] | None = None
        # While a turn runs, nodes added are kept here: like a sorted snapshot, a turn
        # hands out only what was on the frontier when it began.
        self._deferred: list[str] | None = None
        # Whether the last turn left more than LARGE nodes waiting: only then do heaps pay
        # (a first turn over a long chain's nodes examines each of them once anyway).
        self._was_large = False

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def add(self, node_id: str) -> None:
        if node_id not in self._members:
            self._members.add(node_id)
            if self._heaps is not None:  # (a small frontier's turn sorts a snapshot)
                if self._deferred is not None:
                    self._deferred.append(node_id)
                else:
                    self._push(node_id)

    def update(self, node_ids: Iterable[str]) -> None:
        if self._heaps is None:
            self._members.update(node_ids)
            return
        for node_id in node_ids:
            self.add(node_id)

    def discard(self, node_id: str) -> None:
        self._members.discard(node_id)

    def rebuild(self) -> None:
        """Re-read every member's position and group (after the graph changed shape).
        Not during a turn."""
        if self._heaps is not None:
            self._heaps = {}
            for node_id in self._members:
                self._push(node_id)

    def _push(self, node_id: str) -> None:
        assert self._heaps is not None
        group = self._group(node_id)
        heap = self._heaps.get(group)
        if heap is None:
            heap = self._heaps[group] = []
        heapq.heappush(heap, (self._position(node_id), node_id))

    def turn(self) -> Turn:
        if self._deferred is not None:
            raise RuntimeError("a frontier turn is already running")
        size = len(self._members)
        if self._heaps is None and size > LARGE and self._was_large:
            self._heaps = {}
            for node_id in self._members:
                self._push(node_id)
        elif self._heaps is not None and size < SMALL:
            self._heaps = None
        self._deferred = []
        return Turn(self)


class Turn:
    """One scheduler turn over a :class:`Frontier`: iterate it for node ids in position
    order, :meth:`close` a leaf group whose scope is full, and :meth:`end` it (in a
    ``finally``) to put back every handed-out node that is still a member."""

    __slots__ = ("_closed", "_frontier", "_out")

    def __init__(self, frontier: Frontier) -> None:
        self._frontier = frontier
        self._closed: set[str] = set()
        self._out: list[str] = []

    def close(self, group: str) -> None:
        """Hand out no more nodes of ``group`` in this turn."""
        self._closed.add(group)

    def __iter__(self) -> Iterator[str]:
        """Node ids in position order. While the frontier is small this is a sorted
        snapshot that still holds the leaves of closed groups: the caller skips them by
        the same check that closed the group (its scope is full)."""
        frontier = self._frontier
        if frontier._heaps is None:
            return iter(sorted(frontier._members, key=frontier._position))
        return self._merge(frontier, frontier._heaps)

    def _merge(self, frontier: Frontier,
               heaps: dict[str, list[tuple[int, str]]]) -> Iterator[str]:
        members, closed, out = frontier._members, self._closed, self._out
        heads: list[tuple[int, str, str]] = []
        for group, heap in heaps.items():
            while heap and heap[0][1] not in members:
                heapq.heappop(heap)  # a stale entry: the node left the frontier
            if heap:
                heads.append((heap[0][0], heap[0][1], group))
        heapq.heapify(heads)
        seen: set[str] = set()
        while heads:
            _, _, group = heapq.heappop(heads)
            if group in closed:
                continue
            heap = heaps[group]
            _, node_id = heapq.heappop(heap)
            if node_id in members and node_id not in seen:
                seen.add(node_id)
                out.append(node_id)  # popped from its heap: end() puts it back if kept
                yield node_id
            while heap and (heap[0][1] not in members or heap[0][1] in seen):
                heapq.heappop(heap)  # stale, or a second entry of a node handed out
            if heap and group not in closed:
                heapq.heappush(heads, (heap[0][0], heap[0][1], group))

    def end(self) -> None:
        """Put back the handed-out nodes still on the frontier (kept for a later turn), and
        file the nodes added during the turn."""
        frontier = self._frontier
        deferred, frontier._deferred = frontier._deferred or [], None
        frontier._was_large = len(frontier._members) > LARGE
        if frontier._heaps is not None:
            for node_id in (*self._out, *deferred):
                if node_id in frontier._members:
                    frontier._push(node_id)
        self._out.clear()


CONTAINERS = _CONTAINERS
