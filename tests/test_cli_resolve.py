"""An operator resolves an uncertain effect from the CLI, then the task finishes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentium_graph import (
    Absent,
    DurableRecoveryRequiredError,
    ExecutionGraphRuntime,
    ResolutionConflictError,
    TaskCanceledError,
)
from agentium_graph.cli import cli
from agentium_graph.store import CancelTaskRequest, CommitRequest, CommitResult, RecordAction
from agentium_graph_sqlite import SQLiteDurableTaskStore
from tests.conftest import program
from tests.test_effects import PLAN, Destination, FakeConnector, pay_catalog


class _Crash(BaseException):
    pass


class CrashingSQLite(SQLiteDurableTaskStore):
    async def commit(self, request: CommitRequest) -> CommitResult:
        if any(isinstance(s, RecordAction) and s.action.state == "confirmed"
               for s in request.steps):
            raise _Crash
        return await super().commit(request)


async def _uncertain_task(db: Path, dest: Destination) -> str:
    conn = FakeConnector(dest)
    async with CrashingSQLite(db) as store:
        rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=store)
        await rt.create("pay-1", program(PLAN))
        with pytest.raises(_Crash):
            await rt.run("pay-1")
    async with SQLiteDurableTaskStore(db) as store:
        blind = FakeConnector(dest, lookups=["unknown"] * 3)
        rt = ExecutionGraphRuntime(catalog=pay_catalog(blind), store=store, lookup_timeout=0.2)
        with pytest.raises(DurableRecoveryRequiredError) as info:
            await rt.run("pay-1")
    return info.value.action_ids[0]


async def _finish(db: Path, conn: FakeConnector) -> dict[str, Any]:
    async with SQLiteDurableTaskStore(db) as store:
        rt = ExecutionGraphRuntime(catalog=pay_catalog(conn), store=store)
        return (await rt.run("pay-1")).output


@pytest.mark.parametrize("mode", ["output", "absent"])
def test_cli_resolve_then_run_completes(tmp_path: Path, mode: str) -> None:
    # The CLI runs its own event loop, so this test is synchronous.
    db = tmp_path / "tasks.db"
    dest = Destination()
    action_id = asyncio.run(_uncertain_task(db, dest))
    runner = CliRunner()
    uri = f"sqlite:///{db}"
    args = ["--store", uri, "resolve", "pay-1", action_id, "--actor", "oncall", "--json"]
    if mode == "output":
        args += ["--output", json.dumps(dest.accepted[action_id])]
    else:
        dest.accepted.clear()
        args += ["--absent"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    action = json.loads(result.output)
    assert action["resolution"]["actor"] == "oncall"
    # As every timestamp of the record is written (review 45: it had "+00:00").
    assert action["resolution"]["at"].endswith("Z") and action["updated_at"].endswith("Z")
    assert action["state"] == ("confirmed" if mode == "output" else "intent")
    # A conflicting second resolution is refused with a one-line error.
    other = ["--absent"] if mode == "output" else ["--output", '{"charge_id": "x", "amount": 1}']
    again = runner.invoke(cli, ["--store", uri, "resolve", "pay-1", action_id, "--actor",
                                "someone", *other])
    assert again.exit_code != 0 and "second resolution is rejected" in again.output
    assert "already resolved by 'oncall'" in again.output
    # The same resolution again changes nothing and names who recorded it (review 37: it
    # named the repeating actor, whom the ledger never recorded).
    same = ["--output", json.dumps(dest.accepted[action_id])] if mode == "output" else \
        ["--absent"]
    repeated = runner.invoke(cli, ["--store", uri, "resolve", "pay-1", action_id, "--actor",
                                   "mallory", *same])
    assert repeated.exit_code == 0, repeated.output
    assert "(resolved by 'oncall')" in repeated.output and "mallory" not in repeated.output
    after = FakeConnector(dest)
    done = asyncio.run(_finish(db, after))
    assert done["charge"]["amount"] == 500
    assert len(after.dispatched) == (0 if mode == "output" else 1)


def test_cli_resolve_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["--store", f"sqlite:///{tmp_path / 'x.db'}", "resolve", "k",
                              "a", "--actor", "me"])
    assert res.exit_code == 2 and "exactly one of --absent or --output" in res.output
    res = runner.invoke(cli, ["--store", f"sqlite:///{tmp_path / 'x.db'}", "resolve", "k",
                              "a", "--actor", "me", "--output", "{nope"])
    assert res.exit_code == 2 and "not JSON" in res.output


def test_cli_cancel_of_a_recovery_required_task_cancels_it_now(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    action_id = asyncio.run(_uncertain_task(db, Destination()))
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{db}", "cancel", "pay-1",
                                      "--reason", "give up"])
    assert result.exit_code == 0, result.output
    assert "task 'pay-1' canceled" in result.output and action_id in result.output
    assert "next run" not in result.output  # it does not promise what a run cannot do

    async def view() -> Any:
        async with SQLiteDurableTaskStore(db) as store:
            rt = ExecutionGraphRuntime(catalog=pay_catalog(FakeConnector(Destination())),
                                       store=store)
            with pytest.raises(TaskCanceledError):
                await rt.run("pay-1")
            return await rt.inspect("pay-1")

    after = asyncio.run(view())
    assert after.status == "canceled"
    assert [(a.action_id, a.state) for a in after.actions] == [(action_id, "uncertain")]


def test_a_cancel_recorded_without_a_runtime_is_applied_by_the_next_run(
        tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    dest = Destination()
    asyncio.run(_uncertain_task(db, dest))

    async def record_then_run() -> Any:
        async with SQLiteDurableTaskStore(db) as store:
            await store.request_cancel(CancelTaskRequest(key="pay-1", reason="from afar",
                                                         now=datetime.now(UTC)))
            rt = ExecutionGraphRuntime(catalog=pay_catalog(FakeConnector(dest)), store=store)
            with pytest.raises(TaskCanceledError, match="from afar"):
                await rt.run("pay-1")
            return await rt.inspect("pay-1")

    assert asyncio.run(record_then_run()).status == "canceled"


def test_cli_cancel_says_it_canceled_a_task_whose_cancel_was_already_recorded(
        tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    asyncio.run(_uncertain_task(db, Destination()))

    async def record() -> None:  # e.g. by an earlier version, or another process
        async with SQLiteDurableTaskStore(db) as store:
            await store.request_cancel(CancelTaskRequest(key="pay-1", reason="earlier",
                                                         now=datetime.now(UTC)))

    asyncio.run(record())
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{db}", "cancel", "pay-1",
                                      "--reason", "now", "--json"])
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output)
    assert (outcome["recorded"], outcome["applied"]) == (False, True)
    assert outcome["header"]["status"] == "canceled"
    text = CliRunner().invoke(cli, ["--store", f"sqlite:///{db}", "cancel", "pay-1",
                                    "--reason", "again"])
    assert "already canceled; nothing to cancel" in text.output  # now it is true


def test_resolving_an_action_of_a_canceled_task_says_why_it_cannot(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    dest = Destination()
    action_id = asyncio.run(_uncertain_task(db, dest))

    async def cancel_then_resolve() -> None:
        async with SQLiteDurableTaskStore(db) as store:
            rt = ExecutionGraphRuntime(catalog=pay_catalog(FakeConnector(dest)), store=store)
            await rt.cancel("pay-1", reason="give up")
            with pytest.raises(ResolutionConflictError,
                               match=r"is canceled, so action .* can no longer be resolved"):
                await rt.resolve_action("pay-1", action_id, Absent(), actor="ops")
            [action] = (await rt.inspect("pay-1")).actions
            assert action.state == "uncertain" and action.resolution is None

    asyncio.run(cancel_then_resolve())
