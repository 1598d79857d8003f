"""The state machine's unvalidated record constructors (``_records.replace``, ``trusted`` and
the functions built on it) make exactly what pydantic's validating constructor and
``model_copy`` make, and the pydantic internals they rely on are still there.

If a pydantic upgrade or a new validator on a record breaks an assumption, a test here fails
(rather than a store silently writing something else).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentium_graph.errors import ErrorInfo
from agentium_graph.store import (
    InMemoryDurableTaskStore,
    _memory,
    _records,
    _requests,
    _transitions,
)
from agentium_graph.store._records import (
    TRUSTED,
    ActionRecord,
    AttemptRecord,
    CancelRecord,
    JournalEntry,
    LeaseRecord,
    NodeRecord,
    TaskHeader,
    journal_entry,
    new_attempt,
    record_json,
    replace,
    stored_header_json,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    AddNodes,
    AppendJournal,
    CancelTaskRequest,
    Charge,
    ClaimNode,
    CommitRequest,
    CommitResult,
    CommitRevision,
    PrepareNode,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    ReopenNode,
    SetStatus,
    SettleNode,
    StartAttempt,
    commit_result,
)
from agentium_graph.testing._fixtures import (
    T0,
    action_record,
    commit,
    make_create_request,
    node_record,
)

T1 = T0 + timedelta(seconds=1)
ERROR = ErrorInfo(code="tool_error", message="boom", node_id="n1", details={"a": [1, 2]})


def _same(fast: BaseModel, validated: BaseModel) -> None:
    """``fast`` is indistinguishable from ``validated`` (and frozen like it)."""
    assert type(fast) is type(validated)
    assert fast == validated
    assert list(fast.__dict__) == list(validated.__dict__)  # field order: repr, iteration
    assert repr(fast) == repr(validated)
    assert fast.model_dump_json() == validated.model_dump_json()
    assert fast.model_dump_json(exclude_unset=True) == \
        validated.model_dump_json(exclude_unset=True)
    assert fast.model_fields_set == validated.model_fields_set
    assert type(fast.model_fields_set) is set
    assert fast.__pydantic_extra__ is validated.__pydantic_extra__ is None
    assert fast.__pydantic_private__ is validated.__pydantic_private__ is None
    name = next(iter(type(fast).model_fields))
    with pytest.raises(ValidationError):
        setattr(fast, name, getattr(fast, name))


# --- what the fast paths rely on ------------------------------------------------------------

def test_basemodel_still_keeps_instance_state_in_these_slots() -> None:
    # trusted()/replace() assign an instance's state through these descriptors, exactly as
    # BaseModel.__copy__ does; a pydantic that stores it elsewhere must fail here.
    slots = BaseModel.__dict__
    assert type(slots["__dict__"]).__name__ == "getset_descriptor"
    for name in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
        assert type(slots[name]).__name__ == "member_descriptor", name
    assert {"__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
            "__pydantic_private__"} <= set(BaseModel.__slots__)


@pytest.mark.parametrize("cls", sorted([*TRUSTED, CommitResult, StartAttempt, SettleNode,
                                         CommitRequest], key=lambda c: c.__name__))
def test_trusted_classes_have_nothing_else_to_set_up(cls: type[BaseModel]) -> None:
    # Nothing the validating constructor would run or set beyond the field values.
    decorators = cls.__pydantic_decorators__
    for kind in ("validators", "field_validators", "root_validators", "model_validators",
                 "field_serializers", "model_serializers", "computed_fields"):
        assert not getattr(decorators, kind), (cls.__name__, kind)
    assert cls.__pydantic_post_init__ is None
    assert cls.__private_attributes__ == {}
    assert cls.model_config.get("extra") == "forbid"
    assert cls.model_config.get("frozen") is True


def test_trusted_is_exactly_the_records_a_transition_copies() -> None:
    assert frozenset({LeaseRecord, CancelRecord, AttemptRecord, NodeRecord, ActionRecord,
                      TaskHeader, JournalEntry}) == TRUSTED


# --- each fast path against its validating twin ----------------------------------------------

def _header() -> TaskHeader:
    return make_create_request("k").header


def _samples() -> list[tuple[BaseModel, dict[str, Any]]]:
    lease = LeaseRecord(owner="w", fence=2, acquired_at=T0, expires_at=T1)
    attempt = AttemptRecord(number=1, attempt_id="a1", fence=2, worker_id="w", started_at=T0)
    node = node_record("k", "n1", deps=("n0",))
    return [
        (lease, {"expires_at": T1 + timedelta(seconds=5)}),
        (CancelRecord(reason="stop", requested_at=T0), {"reason": "later"}),
        (attempt, {"ended_at": T1, "outcome": "completed"}),
        (node, {"state": "running", "attempts": (attempt,), "updated_at": T1,
                "input_digest": "d"}),
        (node, {"state": "failed", "error": ERROR, "output_digest": None}),
        (action_record("x1", "n1"), {"updated_at": T1}),
        (action_record("x1", "n1"), {"origin": {"b": 1}, "resolution": None}),
        (_header(), {"seq": 3, "counters": {"tool_calls": 1}, "status": "running",
                     "lease": lease, "error": ERROR, "plan_digest": "p", "updated_at": T1}),
        (_header(), {"cancel": CancelRecord(reason="stop", requested_at=T1)}),
        (_header(), {}),
        (JournalEntry(seq=1, at=T0, kind="k"), {"data": {"x": 1}}),
    ]


@pytest.mark.parametrize("index", range(len(_samples())))
def test_replace_is_model_copy(index: int) -> None:
    rec, update = _samples()[index]
    before = rec.model_dump_json()
    fresh = replace(rec, **update)
    _same(fresh, rec.model_copy(update=update))
    assert fresh is not rec
    assert rec.model_dump_json() == before
    assert fresh.model_fields_set is not rec.model_fields_set


def test_replace_of_other_models_is_model_copy() -> None:
    # Not in TRUSTED (ErrorInfo has a validator; a subclass may have private state):
    # replace() hands them to model_copy.
    class Sub(NodeRecord):
        pass

    sub = Sub.model_validate(node_record("k", "n1").model_dump())
    _same(replace(sub, state="claimed"), sub.model_copy(update={"state": "claimed"}))
    _same(replace(ERROR, details={}), ERROR.model_copy(update={"details": {}}))


@pytest.mark.parametrize("node_id, fence, data", [
    ("n1", 3, {"state": "completed", "output_digest": "d"}),
    (None, None, {}),
    (None, 1, {"error": ERROR.model_dump(mode="json"), "nested": {"a": [1]}}),
])
def test_journal_entry_is_the_validated_entry(node_id: str | None, fence: int | None,
                                              data: dict[str, Any]) -> None:
    fast = journal_entry(7, T1, "node_completed", node_id, fence, dict(data))
    _same(fast, JournalEntry(seq=7, at=T1, kind="node_completed", node_id=node_id,
                             fence=fence, data=data))


@pytest.mark.parametrize("admission_id, input_digest", [("adm", "d"), (None, None)])
def test_new_attempt_is_the_validated_attempt(admission_id: str | None,
                                              input_digest: str | None) -> None:
    fast = new_attempt(2, "att", 5, "w1", T0, admission_id, input_digest)
    _same(fast, AttemptRecord(number=2, attempt_id="att", fence=5, worker_id="w1",
                              started_at=T0, admission_id=admission_id,
                              input_digest=input_digest))


def test_commit_result_is_the_validated_result() -> None:
    nodes = {"n1": node_record("k", "n1")}
    actions = {"x1": action_record("x1", "n1")}
    journal = [JournalEntry(seq=2, at=T0, kind="node_claimed", node_id="n1")]
    charges = {"adm": {"tool_calls": 1}}
    fast = commit_result(_header(), nodes, actions, journal, charges, ["old"])
    _same(fast, CommitResult(header=fast.header, nodes=nodes, actions=actions,
                             journal=tuple(journal), charged=tuple(charges),
                             already_charged=("old",)))
    # Like the validating constructor, the result holds its own containers.
    assert fast.nodes is not nodes and fast.actions is not actions
    assert type(fast.journal) is tuple and type(fast.already_charged) is tuple


@pytest.mark.parametrize("index", range(len(_samples())))
def test_record_json_is_model_dump_json(index: int) -> None:
    rec, update = _samples()[index]
    for one in (rec, replace(rec, **update)):
        assert record_json(one) == one.model_dump_json()


def test_record_json_of_text_that_is_not_ascii() -> None:
    entry = JournalEntry(seq=1, at=T0, kind="note", data={"t": "ünïcødé \u2028 \"q\" \x00"})
    assert record_json(entry) == entry.model_dump_json()
    assert "ünïcødé" in record_json(entry)


def test_stored_header_json_leaves_out_only_a_missing_plan_digest() -> None:
    header = replace(_header(), error=ERROR, lease=LeaseRecord(
        owner="w", fence=1, acquired_at=T0, expires_at=T1))
    assert stored_header_json(header) == header.model_dump_json(exclude={"plan_digest"})
    assert "plan_digest" not in stored_header_json(header)
    planned = replace(header, plan_digest="p")
    assert stored_header_json(planned) == planned.model_dump_json()


# --- a whole task: same results, same stored bytes -------------------------------------------

def _reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the stores build every record with pydantic's validating constructor and
    ``model_copy``, as they did before the fast paths."""
    def ref_replace(rec: Any, /, **update: Any) -> Any:
        return rec.model_copy(update=update)

    def ref_entry(seq: int, at: Any, kind: str, node_id: str | None, fence: int | None,
                  data: dict[str, Any]) -> JournalEntry:
        return JournalEntry(seq=seq, at=at, kind=kind, node_id=node_id, fence=fence,
                            data=dict(data))

    def ref_attempt(number: int, attempt_id: str, fence: int, worker_id: str, started_at: Any,
                    admission_id: str | None, input_digest: str | None) -> AttemptRecord:
        return AttemptRecord(number=number, attempt_id=attempt_id, fence=fence,
                             worker_id=worker_id, started_at=started_at,
                             admission_id=admission_id, input_digest=input_digest)

    def ref_result(header: TaskHeader, nodes: Any, actions: Any, journal: Any, charged: Any,
                   already: Any) -> CommitResult:
        return CommitResult(header=header, nodes=nodes, actions=actions,
                            journal=tuple(journal), charged=tuple(charged),
                            already_charged=tuple(already))

    def ref_json(rec: BaseModel) -> str:
        return rec.model_dump_json()

    def ref_header_json(header: TaskHeader) -> str:
        return header.model_dump_json(exclude={"plan_digest"} if header.plan_digest is None
                                      else None)

    for module in (_transitions, _memory, _records):
        monkeypatch.setattr(module, "replace", ref_replace)
    monkeypatch.setattr(_memory, "record_json", ref_json)
    monkeypatch.setattr(_transitions, "journal_entry", ref_entry)
    monkeypatch.setattr(_transitions, "new_attempt", ref_attempt)
    monkeypatch.setattr(_transitions, "commit_result", ref_result)
    monkeypatch.setattr(_requests, "commit_result", ref_result)
    try:
        from agentium_graph_sqlite import _ops
    except ImportError:  # pragma: no cover - the SQLite store is not installed
        return
    monkeypatch.setattr(_ops, "replace", ref_replace)
    monkeypatch.setattr(_ops, "record_json", ref_json)
    monkeypatch.setattr(_ops, "stored_header_json", ref_header_json)
    monkeypatch.setattr(_ops, "_entries_json",
                        lambda entries: _ops._ENTRIES.dump_json(entries).decode())


async def _every_transition(store: Any) -> list[str]:
    """Drive one task through every kind of transition; what each call returned."""
    key = "k"
    out: list[str] = []

    def keep(result: BaseModel) -> None:
        out.append(repr(result))
        out.append(result.model_dump_json())

    keep(await store.create_task(make_create_request(key, nodes=4)))
    grant = await store.acquire_lease(AcquireLeaseRequest(
        key=key, worker_id="w1", ttl_seconds=30, now=T0, snapshot=True,
        steps=(ClaimNode(node_id="n0"),)))
    keep(grant)
    fence = grant.fence
    steps: list[tuple[Any, ...]] = [
        (PrepareNode(node_id="n0", input_digest="i0"),
         StartAttempt(node_id="n0", attempt_id="a0", input_digest="i0", admission_id="adm0",
                      charges={"tool_calls": 1, "work_attempts": 1})),
        (SettleNode(node_id="n0", state="completed", output_digest="o0"),
         StartAttempt(node_id="n1", attempt_id="a1", admission_id="adm1",
                      charges={"tool_calls": 1}, requires_completed=("n0",))),
    ]
    for batch in steps:
        keep(await commit(store, key, "w1", fence, *batch, now=T1, blobs={"o0": '"out"'}))
    # A newer fence interrupts the running attempt and starts another.
    grant = await store.acquire_lease(AcquireLeaseRequest(key=key, worker_id="w1",
                                                          ttl_seconds=30, now=T1))
    keep(grant)
    fence = grant.fence
    steps = [
        (StartAttempt(node_id="n1", attempt_id="a1b"),),
        (SettleNode(node_id="n1", state="uncertain", error=ERROR),),
        (ReopenNode(node_id="n1", reason="attested"),),
        (RecordAction(action=action_record("x1", "n2", fence=fence)),),
        (RecordAction(action=action_record("x1", "n2", "dispatching", fence=fence)),),
        (RecordAction(action=action_record("x1", "n2", "dispatching", fence=fence)),),
        (RecordAction(action=action_record("x1", "n2", "confirmed", fence=fence,
                                           outcome_digest="od", outcome_source="host")),),
        (AddNodes(nodes=(node_record(key, "g/c1", parent="n2"),), admission_id="adm-add"),
         Charge(admission_id="adm-c", charges={"model_calls": 2}, node_id="n2"),
         Charge(admission_id="adm-c", charges={"model_calls": 2}, node_id="n2"),
         AppendJournal(kind="note", node_id="n2", data={"x": [1, {"y": None}]})),
        (CommitRevision(base_revision=1, revision=2, plan_digest="p2", tombstone=("n3",),
                        add=(node_record(key, "n3", revision=2, deps=("n2",)),),
                        admission_id="adm-rev"),),
    ]
    for batch in steps:
        keep(await commit(store, key, "w1", fence, *batch, now=T1))
    keep(await store.release_lease(ReleaseLeaseRequest(key=key, worker_id="w1", fence=fence,
                                                       now=T1)))
    fence = (await store.acquire_lease(AcquireLeaseRequest(
        key=key, worker_id="w2", ttl_seconds=30, now=T1))).fence
    keep(await store.renew_lease(RenewLeaseRequest(key=key, worker_id="w2", fence=fence,
                                                   ttl_seconds=60, now=T1)))
    keep(await store.request_cancel(CancelTaskRequest(key=key, reason="stop", now=T1)))
    keep(await store.request_cancel(CancelTaskRequest(key=key, reason="again", now=T1)))
    keep(await commit(store, key, "w2", fence,
                      SetStatus(status="failed", error=ERROR, release_lease=True),
                      AppendJournal(kind="late"), now=T1))
    snapshot = await store.get_task(key)
    assert snapshot is not None
    keep(snapshot)
    return out


async def test_memory_store_returns_and_stores_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast_store = InMemoryDurableTaskStore()
    fast = await _every_transition(fast_store)
    with monkeypatch.context() as patch:
        _reference(patch)
        ref_store = InMemoryDurableTaskStore()
        ref = await _every_transition(ref_store)
    assert fast == ref
    assert fast_store._rows == ref_store._rows  # every stored record, as JSON text


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in tables}
    finally:
        conn.close()


async def test_sqlite_store_returns_and_stores_the_same(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sqlite_store = pytest.importorskip("agentium_graph_sqlite")
    make: Callable[[Path], Any] = sqlite_store.SQLiteDurableTaskStore

    async def run(path: Path) -> list[str]:
        async with make(path) as store:
            return await _every_transition(store)

    fast = await run(tmp_path / "fast.db")
    with monkeypatch.context() as patch:
        _reference(patch)
        ref = await run(tmp_path / "ref.db")
    assert fast == ref
    fast_rows, ref_rows = _rows(tmp_path / "fast.db"), _rows(tmp_path / "ref.db")
    assert fast_rows["tasks"] and fast_rows["journal"] and fast_rows["actions"]
    assert fast_rows == ref_rows
