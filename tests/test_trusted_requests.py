"""The runtime's unvalidated request builders (``start_attempt``, ``node_completed``,
``commit_request``) make exactly what the validating constructors make for the same call,
and a clock value that is not a datetime is still validated (refused by name, or converted
as pydantic converts it).

``tests/test_trusted_records.py`` pins the pydantic internals ``trusted`` relies on, and that
these request classes have nothing else to set up (no validators or private state).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from agentium_graph.errors import ErrorInfo
from agentium_graph.store._requests import (
    CommitRequest,
    SetStatus,
    SettleNode,
    StartAttempt,
    commit_request,
    node_completed,
    start_attempt,
)
from agentium_graph.testing._fixtures import T0
from tests.test_trusted_records import _same


@pytest.mark.parametrize("deps", [(), ("n0",), ("a", "b")])
def test_start_attempt_is_the_validated_step(deps: tuple[str, ...]) -> None:
    charges = {"work_attempts": 1, "tool_calls": 1}
    fast = start_attempt("n1", "att_1", "sha256:d", "adm_1", charges, deps)
    _same(fast, StartAttempt(node_id="n1", attempt_id="att_1", input_digest="sha256:d",
                             admission_id="adm_1", charges=charges, requires_completed=deps))
    assert fast.charges is not charges  # its own dict, as the constructor copies it
    charges["tool_calls"] = 9
    assert fast.charges == {"work_attempts": 1, "tool_calls": 1}


def test_node_completed_is_the_validated_step() -> None:
    _same(node_completed("n1", "sha256:o"),
          SettleNode(node_id="n1", state="completed", output_digest="sha256:o"))


def _steps() -> list[Any]:
    return [node_completed("n0", "sha256:o"),
            start_attempt("n1", "att_1", "sha256:d", "adm_1", {"tool_calls": 1}, ("n0",)),
            SetStatus(status="failed", error=ErrorInfo(code="x", message="m"))]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_commit_request_is_the_validated_request(count: int) -> None:
    steps = _steps()[:count]
    blobs = {"sha256:o": '{"value":1}'} if count else {}
    fast = commit_request("k", "w1", 3, T0, steps, blobs)
    _same(fast, CommitRequest(key="k", worker_id="w1", fence=3, now=T0, steps=tuple(steps),
                              blobs=blobs))
    assert type(fast.steps) is tuple and fast.blobs is not blobs


def test_commit_request_validates_a_clock_value_that_is_not_a_datetime() -> None:
    with pytest.raises(ValidationError, match="now"):
        commit_request("k", "w1", 3, "yesterday", _steps(), {})  # type: ignore[arg-type]
    # What pydantic accepts for a datetime field (an ISO string, a Unix time) is converted
    # exactly as the validating constructor converts it.
    for value in ((T0 + timedelta(seconds=1)).isoformat(), 12.5):
        _same(commit_request("k", "w1", 3, value, [], {}),  # type: ignore[arg-type]
              CommitRequest(key="k", worker_id="w1", fence=3, now=value, steps=(), blobs={}))

