"""A host clock that returns anything but an aware datetime is a ConfigurationError."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from agentium_graph import (
    ConfigurationError,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
)
from tests.conftest import Calls, chain_plan, make_catalog, program

BAD = [
    pytest.param(datetime(2026, 1, 1), "naive", id="naive"),
    pytest.param("2026-01-01T00:00:00+00:00", "str", id="str"),
    pytest.param(1.5, "float", id="float"),
    pytest.param(None, "None", id="none"),
    pytest.param(date(2026, 1, 1), "date", id="date"),
]


def _runtime(store: InMemoryDurableTaskStore, value: Any) -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store,
                                 clock=lambda: value)


async def _state(store: InMemoryDurableTaskStore, key: str) -> Any:
    snap = await store.get_task(key)
    assert snap is not None
    return snap.model_dump(mode="json")


@pytest.mark.parametrize(("value", "named"), BAD)
async def test_create_with_a_bad_clock_stores_nothing(value: Any, named: str) -> None:
    store = InMemoryDurableTaskStore()
    rt = _runtime(store, value)
    with pytest.raises(ConfigurationError, match="clock") as caught:
        await rt.create("k", program(chain_plan(2)))
    assert named in str(caught.value) and "aware" in str(caught.value)
    assert caught.value.details["returned"] == type(value).__name__
    assert await store.get_task("k") is None and await store.get_header("k") is None


@pytest.mark.parametrize(("value", "named"), BAD)
async def test_run_and_cancel_with_a_bad_clock_change_nothing(value: Any, named: str) -> None:
    store = InMemoryDurableTaskStore()
    await ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store).create(
        "k", program(chain_plan(2)), deadline=timedelta(hours=1))
    before = await _state(store, "k")
    rt = _runtime(store, value)
    with pytest.raises(ConfigurationError, match="clock"):
        await rt.run("k")
    with pytest.raises(ConfigurationError, match="clock"):
        await rt.cancel("k", reason="stop")
    assert await _state(store, "k") == before
    view = await rt.inspect("k")  # reading needs no clock
    assert view.status == "pending" and view.verified


@pytest.mark.parametrize("good_calls", range(1, 7))
async def test_a_clock_that_goes_bad_mid_run_stops_the_run_typed(good_calls: int) -> None:
    # Wherever the run reads the bad time (taking the lease, a commit, a deadline wait),
    # it stops with the typed error before writing it; what it committed stays readable.
    store = InMemoryDurableTaskStore()
    good = datetime(2026, 1, 1, tzinfo=UTC)
    calls = {"n": 0}

    def clock() -> datetime:
        calls["n"] += 1
        return good if calls["n"] <= good_calls else good.replace(tzinfo=None)

    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store, clock=clock)
    await ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store,
                                clock=lambda: good).create(
        "k", program(chain_plan(3)), deadline=timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="naive"):
        await rt.run("k")
    view = await rt.inspect("k")
    assert view.verified and view.status in ("pending", "running")
    header = await store.get_header("k")
    assert header is not None and header.updated_at.tzinfo is not None
    assert header.lease is None or header.lease.expires_at.tzinfo is not None


async def test_any_aware_datetime_is_accepted() -> None:
    store = InMemoryDurableTaskStore()
    east = timezone(timedelta(hours=5))
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=store,
                               clock=lambda: datetime.now(east))
    await rt.create("k", program(chain_plan(2)))
    assert (await rt.run("k")).status == "completed"
