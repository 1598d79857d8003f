"""Store requests refuse what a store could not journal faithfully, naming where it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from agentium_graph import InMemoryDurableTaskStore
from agentium_graph.store import AcquireLeaseRequest, CreateTaskRequest, RenewLeaseRequest
from agentium_graph.store._requests import AppendJournal
from agentium_graph.testing import make_create_request


@pytest.mark.parametrize("data, where", [
    ({"o": object()}, "data.o: object is not a JSON type"),
    ({"tags": {1, 2}}, "data.tags: set is not a JSON type"),
    ({"x": [1, float("nan")]}, "data.x[1]: NaN and infinities are not JSON"),
    ({"raw": b"x"}, "data.raw: bytes is not a JSON type"),
    ({"deep": {"k": {3: 4}}}, "data.deep.k: object key 3 is not a string"),
])
def test_append_journal_data_must_be_plain_json(data: dict[str, Any], where: str) -> None:
    # A store would write these as something else (a set as a list, NaN as null) or fail
    # mid-commit with an untyped error; refused when the step is built instead.
    with pytest.raises(ValidationError, match="journal data must be plain JSON") as info:
        AppendJournal(kind="note", data=data)
    assert where in str(info.value)


def test_append_journal_data_of_plain_json_is_kept_as_given() -> None:
    data = {"kind": "x", "nested": [1, {"a": None, "b": 2.5, "c": "é"}], "t": (1, 2)}
    step = AppendJournal(kind="note", data=data)
    assert step.data == data


# --- review 49: what a store request must hold, whichever store gets it -----------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def test_a_clock_reading_in_an_odd_zone_is_kept_as_its_utc_instant() -> None:
    # A +00:00:30 zone: the stores' text forms keep whole-minute offsets only, so the lease
    # expiry moved 30 s on SQLite and MongoDB; +23:59:59.999999 was written as "+24:00",
    # which no store could read back.
    for zone in (timezone(timedelta(seconds=30)),
                 timezone(timedelta(hours=23, minutes=59, seconds=59, microseconds=999999))):
        now = T0.astimezone(zone)
        request = AcquireLeaseRequest(key="k", worker_id="w", ttl_seconds=5, now=now)
        assert request.now == T0 and request.now.tzinfo is UTC
        created = make_create_request("k", now=now)
        assert created.header.created_at.tzinfo is UTC and created.header.created_at == T0
    store = InMemoryDurableTaskStore()
    await store.create_task(make_create_request("k"))
    zone = timezone(timedelta(seconds=30))
    grant = await store.acquire_lease(AcquireLeaseRequest(
        key="k", worker_id="w1", ttl_seconds=5, now=T0.astimezone(zone)))
    assert grant.expires_at == T0 + timedelta(seconds=5)


@pytest.mark.parametrize("ttl", [float("inf"), 1e300, 31 * 86_400.0])
def test_a_lease_ttl_is_bounded(ttl: float) -> None:
    for model in (AcquireLeaseRequest, RenewLeaseRequest):
        extra = {"fence": 1} if model is RenewLeaseRequest else {}
        with pytest.raises(ValidationError, match="ttl_seconds"):
            model(key="k", worker_id="w", ttl_seconds=ttl, now=T0, **extra)


def test_an_expiry_past_the_last_datetime_is_refused() -> None:
    with pytest.raises(ValidationError, match="past the last date"):
        AcquireLeaseRequest(key="k", worker_id="w", ttl_seconds=30,
                            now=datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))


def test_a_naive_clock_reading_is_refused() -> None:
    with pytest.raises(ValidationError, match="timezone-aware"):
        AcquireLeaseRequest(key="k", worker_id="w", ttl_seconds=5, now=datetime(2030, 1, 1))


@pytest.mark.parametrize(("change", "words"), [
    ({"counters": {"tool_calls": 2**63}}, "counters.tool_calls"),
    ({"counters": {"tool_calls": -1}}, "counters.tool_calls"),
    ({"limits": {"tool_calls": 2**64}}, "limits.tool_calls"),
    ({"limits": {"tool_calls": 0}, "counters": {"tool_calls": 1}}, "counters.tool_calls"),
    ({"status": "completed"}, "a new task is pending"),
    ({"key": "other"}, "is not identity.key"),
], ids=["counter-int64", "negative", "limit-int64", "over-limit", "status", "key"])
def test_an_inconsistent_create_request_is_refused(change: dict[str, Any], words: str) -> None:
    request = make_create_request("k")
    data = request.model_dump()
    for name, value in change.items():
        if isinstance(value, dict):
            data["header"][name] = {**data["header"][name], **value}
        else:
            data["header"][name] = value
    with pytest.raises(ValidationError, match=words.replace(".", r"\.")):
        CreateTaskRequest.model_validate(data)


def test_a_create_request_with_a_node_given_twice_or_started_is_refused() -> None:
    data = make_create_request("k").model_dump()
    data["nodes"] = [data["nodes"][0], data["nodes"][0]]
    with pytest.raises(ValidationError, match="given twice"):
        CreateTaskRequest.model_validate(data)
    data = make_create_request("k").model_dump()
    data["nodes"][0]["state"] = "completed"
    with pytest.raises(ValidationError, match="must be pending"):
        CreateTaskRequest.model_validate(data)
