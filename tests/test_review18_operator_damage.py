"""The operator API does not write over damage it can see, and ``inspect`` sees the end of the
journal (follow-ups of the damage review, tests/test_review18_damage.py):

* ``resolve_action`` checked an attested output against the identity it read without
  checking that identity against the header's digest (a changed identity's schema decided);
* ``cancel`` of a ``recovery_required`` task nobody runs wrote its cancel over damaged
  records (a node row missing), ending the task ``canceled`` on top of the damage;
* ``inspect`` never read the journal, so one cut short (its last entries deleted) was
  ``verified``, and a run of a static plan appended to it (taking the lease wrote the next
  entry, after which the end looked intact).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentium_graph import ActionOutcome, DataIntegrityError
from tests._review18_damage_tasks import runtime
from tests.conftest import Calls
from tests.test_review18_damaged_records import SQLite, base, damaged, edit, problems, run

__all__ = ["base"]  # the module-scoped fixture of the damaged-records tests


def _state(path: Path, key: str) -> tuple[Any, ...]:
    with sqlite3.connect(path) as conn:
        return (conn.execute("SELECT header FROM tasks WHERE key = ?", (key,)).fetchone(),
                conn.execute("SELECT COUNT(*) FROM journal WHERE key = ?", (key,)).fetchone())


def _uncertain(path: Path) -> str:
    async def find() -> str:
        async with SQLite(path, read_only=True) as store:
            snapshot = await store.get_task("rr")
            assert snapshot is not None
            [action] = [a for a in snapshot.actions.values() if a.state == "uncertain"]
            return action.action_id
    return asyncio.run(find())


def test_resolve_checks_the_output_with_the_identity_the_header_pins(base: Path,
                                                                   tmp_path: Path) -> None:
    def change(identity: Any) -> None:
        for descriptor in identity["descriptors"].values():
            descriptor["output_schema"] = {}  # anything goes: a forged, permissive schema
    path = damaged(base, tmp_path, edit("identities", "identity", "key = ?", ("rr",),
                                        change, base))
    action_id = _uncertain(path)
    before = _state(path, "rr")

    async def resolve() -> None:
        async with SQLite(path) as store:
            await runtime(store, Calls()).resolve_action(
                "rr", action_id, ActionOutcome(output={"anything": True},
                                               result_ref=action_id), actor="oncall")
    with pytest.raises(DataIntegrityError, match="identity record"):
        asyncio.run(resolve())
    assert _state(path, "rr") == before  # no lease taken, nothing journaled


def test_cancel_of_a_stuck_task_writes_nothing_over_damage(base: Path, tmp_path: Path) -> None:
    with sqlite3.connect(base) as conn:
        [(node_id,)] = conn.execute("SELECT node_id FROM nodes WHERE key = 'rr' "
                                    "ORDER BY node_id LIMIT 1").fetchall()
    path = damaged(base, tmp_path, ("DELETE FROM nodes WHERE key = 'rr' AND node_id = ?",
                                    (node_id,)))

    async def cancel() -> None:
        async with SQLite(path) as store:
            await runtime(store, Calls()).cancel("rr", "operator gave up")
    with pytest.raises(DataIntegrityError, match="no stored record"):
        asyncio.run(cancel())
    with sqlite3.connect(path) as conn:
        status, = conn.execute("SELECT status FROM tasks WHERE key = 'rr'").fetchone()
    assert status == "recovery_required"

    async def lease() -> Any:
        async with SQLite(path, read_only=True) as store:
            header = await store.get_header("rr")
            assert header is not None
            return header.lease
    assert asyncio.run(lease()) is None  # the canceler gave its lease back


def test_inspect_sees_a_journal_cut_short(base: Path, tmp_path: Path) -> None:
    with sqlite3.connect(base) as conn:
        [(last,)] = conn.execute("SELECT MAX(seq) FROM journal WHERE key = 'done'").fetchall()
    path = damaged(base, tmp_path, ("DELETE FROM journal WHERE key = 'done' AND seq = ?",
                                    (last,)))
    found = asyncio.run(problems(path, "done"))
    assert len(found) == 1 and found[0].startswith("journal: "), found


def test_run_does_not_append_to_a_journal_cut_short(base: Path, tmp_path: Path) -> None:
    # Taking the lease appends an entry past the damaged end, which then looked intact.
    with sqlite3.connect(base) as conn:
        [(last,)] = conn.execute("SELECT MAX(seq) FROM journal WHERE key = 'stale'").fetchall()
    path = damaged(base, tmp_path, ("DELETE FROM journal WHERE key = 'stale' AND seq = ?",
                                    (last,)))
    before = _state(path, "stale")
    error, calls = asyncio.run(run(path, "stale"))
    assert isinstance(error, DataIntegrityError) and "journal" in str(error), error
    assert calls == {} and _state(path, "stale") == before  # no lease, nothing appended


def test_an_intact_journal_is_no_problem(base: Path) -> None:
    assert asyncio.run(problems(base, "done")) == ()
