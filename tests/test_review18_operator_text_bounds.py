"""A cancel reason and an operator name are bounded text. An unbounded reason (a pasted log
of megabytes) was kept in the task's header, so every later header write carried it, and one
past MongoDB's 16 MiB document limit could never be recorded there; an unbounded ``actor``
became the lease owner (``operator:<actor>``) of the resolution. Both are refused before
anything is read or written, from Python and the CLI; a traceback-sized reason still fits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentium_graph import ActionOutcome, ConfigurationError, InMemoryDurableTaskStore
from agentium_graph.cli import cli
from agentium_graph.runtime._args import MAX_ACTOR_CHARS, MAX_REASON_CHARS
from agentium_graph_sqlite import SQLiteDurableTaskStore
from tests.test_review16_operator_api import PAY, journaled, stuck


async def test_a_reason_at_the_limit_is_recorded_one_past_it_is_refused() -> None:
    store = InMemoryDurableTaskStore()
    rt, _ = await stuck(store, PAY)
    before = await journaled(store)
    with pytest.raises(ConfigurationError, match="reason") as caught:
        await rt.cancel("k", "x" * (MAX_REASON_CHARS + 1))
    assert caught.value.details["limit"] == MAX_REASON_CHARS
    assert await journaled(store) == before  # nothing recorded
    view = await rt.cancel("k", "y" * MAX_REASON_CHARS)
    assert view.status == "canceled"
    assert view.cancel is not None and view.cancel.reason == "y" * MAX_REASON_CHARS


@pytest.mark.parametrize("actor", ["o" * (MAX_ACTOR_CHARS + 1), 7, "  "])
async def test_an_actor_too_long_or_not_text_is_refused_before_the_lease(actor: Any) -> None:
    store = InMemoryDurableTaskStore()
    rt, action_id = await stuck(store, PAY)
    before = await journaled(store)
    with pytest.raises(ConfigurationError, match="actor"):
        await rt.resolve_action("k", action_id, ActionOutcome(output={"charged": 5},
                                                              result_ref=action_id),
                                actor=actor)
    assert await journaled(store) == before  # no lease taken, nothing journaled


def _uncertain_db(path: Path) -> str:
    async def make() -> str:
        async with SQLiteDurableTaskStore(path) as store:
            _, action_id = await stuck(store, PAY)  # type: ignore[arg-type]
            return action_id
    return asyncio.run(make())


def test_the_cli_refuses_a_long_reason_and_a_long_actor(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    action_id = _uncertain_db(db)
    store = f"sqlite:///{db}"

    def header() -> Any:
        async def read() -> Any:
            async with SQLiteDurableTaskStore(db) as s:
                return await s.get_header("k")
        return asyncio.run(read())

    before = header()
    result = CliRunner().invoke(cli, ["--store", store, "cancel", "k", "--reason",
                                      "x" * (MAX_REASON_CHARS + 1)])
    assert result.exit_code == 2 and "--reason" in result.output, result.output
    result = CliRunner().invoke(cli, ["--store", store, "resolve", "k", action_id, "--absent",
                                      "--actor", "o" * (MAX_ACTOR_CHARS + 1)])
    assert result.exit_code == 2 and "--actor" in result.output, result.output
    assert header() == before
    # The same commands with short text are accepted: only the length was refused.
    result = CliRunner().invoke(cli, ["--store", store, "resolve", "k", action_id, "--absent",
                                      "--actor", "o" * MAX_ACTOR_CHARS])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["--store", store, "cancel", "k", "--reason", "done"])
    assert result.exit_code == 0, result.output
    assert header().cancel.reason == "done"
