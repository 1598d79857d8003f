"""Node-level decisions the scheduler makes, defined once.

The allowed transitions themselves live in :mod:`agentium_graph.store._transitions`
(``NODE_TRANSITIONS``), which every store applies; this module answers the scheduler's
questions about a node record in the same vocabulary.
"""

from __future__ import annotations

from agentium_graph.store._records import NodeRecord
from agentium_graph.store._transitions import TERMINAL_NODE

# States from which a worker (re)starts a node: never started, or interrupted mid-way by
# a lost worker (its open attempt ran under an older fence).
RESTARTABLE: frozenset[str] = frozenset({"pending", "claimed", "prepared", "running"})


def is_terminal(node: NodeRecord) -> bool:
    return node.state in TERMINAL_NODE


def was_interrupted(node: NodeRecord, fence: int) -> bool:
    """True when the node's open attempt belongs to an older fence (a crashed worker)."""
    return bool(node.attempts) and node.attempts[-1].ended_at is None and \
        node.attempts[-1].fence < fence
