"""The requests the differential machine sends: small pools of ids so that random draws
collide (re-created tasks, repeated admission ids, retransmitted actions and revisions),
and step lists that mostly follow a node's legal transitions so commits make progress."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from agentium_graph._canonical import admission_id, task_id
from agentium_graph.errors import ErrorInfo
from agentium_graph.store._records import (
    ActionRecord,
    ActionState,
    NodeRecord,
    TaskSnapshot,
    TaskStatus,
)
from agentium_graph.store._requests import (
    AddNodes,
    AppendJournal,
    Charge,
    ClaimNode,
    CommitRevision,
    CreateTaskRequest,
    PrepareNode,
    RecordAction,
    ReopenNode,
    SetStatus,
    SettleNode,
    StartAttempt,
    Step,
)
from agentium_graph.testing._fixtures import action_record, make_create_request, node_record

#: Task keys: characters that are special to MongoDB field paths, SQL and sorting.
KEYS = ("k0", "k.1", "k\u00e9$")
WORKERS = ("w1", "w2")
ADMISSIONS = ("a0", "a1", "a.2", "$a3")
ATTEMPTS = ("t0", "t1", "t2")
ACTIONS = ("act0", "act.1")
#: Content digests (blobs, inputs, outputs, plans); blob texts below collide on them.
DIGESTS = tuple(f"sha256:{c * 64}" for c in "abcd")
BLOB_TEXTS = ('{"v":1}', '{"v":"\u00fcber"}', "[]")
#: Nodes a task is created with (n0 -> n1 a chain, two free ones with awkward ids).
CREATED_NODES = ("n0", "n1", "x.y", "$z")
#: Ids new incarnations may take (n1 exists: another incarnation of it is refused).
NEW_NODES = ("m0", "m.1", "n1")
COUNTER_NAMES = ("work_attempts", "tool_calls", "model_calls", "input_tokens", "x.y$")
LIMITS: dict[str, int | None] = {"work_attempts": 4, "tool_calls": 3, "expanded_nodes": 7,
                                 "plan_revisions": 3}
_ENDED = frozenset({"completed", "failed", "canceled", "tombstoned"})
STATUSES: tuple[TaskStatus, ...] = ("running", "completed", "failed", "canceled",
                                    "recovery_required", "pending")

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(("a", "b.c", "$d", "")), inner, max_size=3),
    max_leaves=6)


def create_request(key: str, variant: int) -> CreateTaskRequest:
    """Variant 0: the task's one true request (a re-create is identical); 1 and 2: another
    identity under the same key (a conflict); 3: an invalid request (seq 1) of variant 0's
    identity; 4: variant 0 with other blobs."""
    base = make_create_request(key, nodes=2, limits=LIMITS, input=variant % 3 if
                               variant < 3 else 0)
    deps = {"n1": ("n0",)}
    nodes = tuple(node_record(key, n, deps=deps.get(n, ())) for n in CREATED_NODES)
    counters = {**base.header.counters, "expanded_nodes": len(nodes)}
    header = base.header.model_copy(update={"counters": counters})
    if variant == 3:
        header = header.model_copy(update={"seq": 1})
    blobs = {DIGESTS[0]: BLOB_TEXTS[0]} if variant != 4 else {DIGESTS[0]: BLOB_TEXTS[1],
                                                              DIGESTS[3]: BLOB_TEXTS[2]}
    return base.model_copy(update={"header": header, "nodes": nodes, "blobs": blobs})


def create_admission(key: str) -> str:
    return admission_id(task_id(key), "create")


@dataclass
class View:
    """What a step generator knows of a task (from the reference store)."""

    key: str
    snapshot: TaskSnapshot | None
    fence: int
    last_revision: CommitRevision | None = None
    admissions: tuple[str, ...] = field(default=ADMISSIONS)

    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return {} if self.snapshot is None else self.snapshot.nodes

    @property
    def actions(self) -> dict[str, ActionRecord]:
        return {} if self.snapshot is None else self.snapshot.actions


# Error details and action origins are not checked as JSON: NaN and infinities reach the
# store (and come back as null, as JSON keeps them).
_DETAIL = _JSON | st.floats() | st.lists(st.floats(), max_size=2)


_ORIGINS: tuple[dict[str, Any], ...] = ({"binding": "b", "version": "1"}, {"ratio": math.inf})


def _error(draw: st.DrawFn) -> ErrorInfo | None:
    if not draw(st.booleans()):
        return None
    return ErrorInfo(code=draw(st.sampled_from(("boom", "tool_error"))), message="it broke",
                     details=draw(st.dictionaries(st.sampled_from(("a", "b.c")), _DETAIL,
                                                  max_size=2)))


def _charges(draw: st.DrawFn) -> dict[str, int]:
    names = draw(st.lists(st.sampled_from(COUNTER_NAMES), max_size=2, unique=True))
    return {n: draw(st.sampled_from((0, 1, 1, 1, 2, 3, 2**62, -1))) for n in names}


def _node_id(draw: st.DrawFn, view: View) -> str:
    known = sorted(view.nodes)
    if not known or draw(st.integers(0, 15)) == 0:
        return "ghost"  # no such node
    live = [i for i in known if view.nodes[i].state not in _ENDED]
    if live and draw(st.integers(0, 3)) > 0:
        known = live
    return draw(st.sampled_from(known))


def _requires(draw: st.DrawFn, view: View, rec: NodeRecord | None) -> tuple[str, ...]:
    if rec is not None and draw(st.integers(0, 5)):
        return rec.deps
    return tuple(draw(st.lists(st.sampled_from(sorted(view.nodes) or ["ghost"]), max_size=1)))


def _start(draw: st.DrawFn, view: View, node: str, rec: NodeRecord | None) -> StartAttempt:
    admission = draw(st.sampled_from((None, *view.admissions)))
    return StartAttempt(node_id=node, attempt_id=draw(st.sampled_from(ATTEMPTS)),
                        input_digest=draw(st.sampled_from((None, *DIGESTS[:2]))),
                        admission_id=admission,
                        charges=_charges(draw) if admission else {},
                        requires_completed=_requires(draw, view, rec))


def _settle(draw: st.DrawFn, node: str) -> SettleNode:
    state = draw(st.sampled_from(("completed", "completed", "failed", "canceled",
                                  "uncertain")))
    digest = draw(st.sampled_from(DIGESTS)) if state == "completed" and draw(
        st.integers(0, 5)) else None
    return SettleNode(node_id=node, state=state, output_digest=digest,
                      error=_error(draw) if state != "completed" else None)


def _node_step(draw: st.DrawFn, view: View) -> Step:
    """A step on one node, usually one its state allows."""
    node = _node_id(draw, view)
    rec = view.nodes.get(node)
    state = "pending" if rec is None else rec.state
    choices: dict[str, tuple[str, ...]] = {
        "pending": ("claim", "prepare", "start", "start", "settle"),
        "claimed": ("claim", "prepare", "start", "start"),
        "prepared": ("prepare", "start", "start"),
        "running": ("settle", "settle", "start"),
        "uncertain": ("reopen", "settle", "start"),
    }
    kind = draw(st.sampled_from(choices.get(state, ("claim", "settle", "reopen"))))
    if kind == "claim":
        return ClaimNode(node_id=node, requires_completed=_requires(draw, view, rec))
    if kind == "prepare":
        return PrepareNode(node_id=node, input_digest=draw(st.sampled_from(DIGESTS[:2])))
    if kind == "start":
        return _start(draw, view, node, rec)
    if kind == "reopen":
        return ReopenNode(node_id=node, reason="operator attested")
    return _settle(draw, node)


def _action_step(draw: st.DrawFn, view: View) -> RecordAction:
    action_id = draw(st.sampled_from(ACTIONS))
    existing = view.actions.get(action_id)
    node = existing.node_id if existing is not None and draw(st.integers(0, 3)) else \
        _node_id(draw, view)
    state: ActionState = draw(st.sampled_from(("intent", "dispatching", "confirmed",
                                               "rejected", "uncertain")))
    same = existing is None or draw(st.integers(0, 4))
    record = action_record(
        action_id, node, state, fence=view.fence,
        admission=existing.admission_id if existing is not None and same else
        draw(st.sampled_from(view.admissions)),
        request_digest=existing.request_digest if existing is not None and same else
        draw(st.sampled_from(DIGESTS[:2])),
        outcome_digest=draw(st.sampled_from((None, DIGESTS[2]))) if state == "confirmed"
        else None,
        outcome_source=draw(st.sampled_from((None, "dispatch"))),
        origin=existing.origin if existing is not None and same else
        draw(st.sampled_from(_ORIGINS)))
    if existing is not None and draw(st.integers(0, 5)) == 0:
        record = existing  # an identical retransmission
    return RecordAction(action=record)


def _revision_step(draw: st.DrawFn, view: View) -> CommitRevision:
    if view.last_revision is not None and draw(st.integers(0, 3)) == 0:
        return view.last_revision  # a retransmission (identical, or now stale)
    current = 1 if view.snapshot is None else view.snapshot.header.revision
    base = current + draw(st.sampled_from((0, 0, 0, -1, 1)))
    revision = base + draw(st.sampled_from((1, 1, 1, 0, 2)))
    pending = sorted(i for i, n in view.nodes.items() if n.state == "pending")
    tombstone = draw(st.lists(st.sampled_from(pending or ["ghost"]), max_size=2, unique=True))
    add = tuple(node_record(view.key, n, revision=revision, args=draw(st.integers(0, 1)))
                for n in draw(st.lists(st.sampled_from((*NEW_NODES, *tombstone)),
                                       max_size=2, unique=True)))
    return CommitRevision(base_revision=base, revision=revision,
                          plan_digest=draw(st.sampled_from(DIGESTS)), add=add,
                          tombstone=tuple(tombstone),
                          admission_id=draw(st.sampled_from(view.admissions)))


def _other_step(draw: st.DrawFn, view: View) -> Step:
    kind = draw(st.sampled_from(("charge", "charge", "action", "action", "journal", "status",
                                 "add", "revision")))
    if kind == "charge":
        return Charge(admission_id=draw(st.sampled_from(view.admissions)),
                      charges=_charges(draw),
                      node_id=draw(st.sampled_from((None, *sorted(view.nodes)))))
    if kind == "action":
        return _action_step(draw, view)
    if kind == "journal":
        data: dict[str, Any] = draw(st.dictionaries(st.sampled_from(("x", "kind", "a.b")),
                                                    _JSON, max_size=2))
        return AppendJournal(kind=draw(st.sampled_from(("note", "operator.note"))),
                             node_id=draw(st.sampled_from((None, *sorted(view.nodes)))),
                             data=data)
    if kind == "status":
        return SetStatus(status=draw(st.sampled_from(STATUSES)), error=_error(draw),
                         release_lease=draw(st.booleans()))
    if kind == "add":
        add = tuple(node_record(view.key, n, args=draw(st.integers(0, 1)))
                    for n in draw(st.lists(st.sampled_from(NEW_NODES), min_size=1, max_size=2,
                                           unique=True)))
        return AddNodes(nodes=add, admission_id=draw(st.sampled_from(view.admissions)))
    return _revision_step(draw, view)


@st.composite
def steps(draw: st.DrawFn, view: View, max_size: int = 4) -> tuple[Step, ...]:
    """A commit's steps: mostly node transitions, some charges, actions, notes, status
    changes and plan changes."""
    count = draw(st.integers(0, max_size))
    out: list[Step] = []
    for _ in range(count):
        out.append(_node_step(draw, view) if draw(st.integers(0, 2)) else
                   _other_step(draw, view))
    return tuple(out)


def blobs() -> st.SearchStrategy[dict[str, str]]:
    """Blobs to put with a write: digests collide, texts may differ (the first one wins)."""
    return st.dictionaries(st.sampled_from(DIGESTS), st.sampled_from(BLOB_TEXTS), max_size=2)
