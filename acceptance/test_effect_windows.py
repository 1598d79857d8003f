"""Effect windows: SIGKILL around a real HTTP destination; count what it accepted.

The destination is a real HTTP server (``IdempotentTestServer``) in the test process;
workers are fresh processes. Each case asserts the destination's accepted count (exactly
one where the outcome is knowable), the receipts, the counters and the task status.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptance._effect_graph import AMOUNT
from acceptance.conftest import Case, check_books, snapshot
from agentium_graph import ActionOutcome, DurableTaskStore, ExecutionGraphRuntime, HostCatalog
from agentium_graph_http.testing import IdempotentTestServer


@pytest.fixture
def server() -> Iterator[IdempotentTestServer]:
    with IdempotentTestServer() as srv:
        yield srv


def effect_case(case: Case, server: IdempotentTestServer, **kw: Any) -> dict[str, Any]:
    return {"graph": "effect", "server_url": server.url, **kw}


async def finish_and_check(case: Case, store: DurableTaskStore, server: IdempotentTestServer,
                           *, idempotent: bool = False, source: str,
                           prep_starts: int = 1) -> None:
    before = await snapshot(store, case.key)  # as the kill left it
    code, out, err = case.run(**effect_case(case, server, idempotent=idempotent))
    assert code == 0 and out is not None and out["ok"], (out, err)
    assert out["output"]["receipt"] == {"text": f"charged {AMOUNT} EUR"}
    assert server.accepted_count == 1  # exactly one acceptance at the destination
    snap = await store.get_task(case.key)
    assert snap is not None and snap.header.status == "completed"
    check_books(before, snap)
    [action] = snap.actions.values()
    assert action.state == "confirmed" and action.outcome_source == source
    assert server.accepted_for(action.action_id) == 1
    # One charge per dispatch (never for a lookup) plus one per pure attempt.
    pure_attempts = len(snap.nodes["prep"].attempts) + len(snap.nodes["receipt"].attempts)
    assert snap.header.counters["tool_calls"] == action.dispatches + pure_attempts
    for name, value in snap.header.counters.items():
        limit = snap.header.limits.get(name)
        assert limit is None or value <= limit
    assert case.starts("prep") == prep_starts and case.starts("receipt") == 1


async def test_kill_after_intent_before_dispatch(case: Case, store_of: DurableTaskStore,
                                                 server: IdempotentTestServer) -> None:
    case.run_killed(**effect_case(case, server, create=True, kill_at="after_start_commit",
                                  node="pay"))
    assert server.post_count == 0
    snap = await store_of.get_task(case.key)
    assert snap is not None
    [action] = snap.actions.values()
    assert action.state == "dispatching"  # recorded before dispatch; nothing sent
    await finish_and_check(case, store_of, server, source="dispatch")
    assert server.lookup_count == 1  # the lookup proved absence (404) before dispatching


async def test_kill_before_the_start_commit(case: Case, store_of: DurableTaskStore,
                                            server: IdempotentTestServer) -> None:
    case.run_killed(**effect_case(case, server, create=True, kill_at="before_start_commit",
                                  node="pay"))
    snap = await store_of.get_task(case.key)
    assert snap is not None and not snap.actions and server.post_count == 0
    # prep's completion shared the killed commit with pay's start, so prep runs again.
    await finish_and_check(case, store_of, server, source="dispatch", prep_starts=2)
    assert server.lookup_count == 0


async def test_kill_after_accept_before_receipt(case: Case, store_of: DurableTaskStore,
                                                server: IdempotentTestServer) -> None:
    pids: list[int] = []
    server.on_accept = lambda key: os.kill(pids[0], signal.SIGKILL)
    proc = case.start(**effect_case(case, server, create=True))
    pids.append(proc.pid)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    server.on_accept = None
    assert server.accepted_count == 1
    snap = await store_of.get_task(case.key)
    assert snap is not None
    [action] = snap.actions.values()
    assert action.state == "dispatching" and snap.nodes["pay"].state == "running"
    await finish_and_check(case, store_of, server, source="reconcile")
    assert server.post_count == 1  # reconciled by lookup, never posted again


async def test_kill_after_receipt_and_completion(case: Case, store_of: DurableTaskStore,
                                                 server: IdempotentTestServer) -> None:
    # Receipt and node completion share one commit, so "after the receipt, before the
    # completion" cannot be observed; the closest window is right after that commit.
    case.run_killed(**effect_case(case, server, create=True,
                                  kill_at="after_completion_commit", node="pay"))
    snap = await store_of.get_task(case.key)
    assert snap is not None and snap.nodes["pay"].state == "completed"
    await finish_and_check(case, store_of, server, source="dispatch")
    assert server.post_count == 1 and server.lookup_count == 0


async def test_kill_before_receipt_commit_then_transient_lookup_failure(
        case: Case, store_of: DurableTaskStore, server: IdempotentTestServer) -> None:
    case.run_killed(**effect_case(case, server, create=True,
                                  kill_at="before_completion_commit", node="pay"))
    assert server.accepted_count == 1
    server.fail_lookups(1)  # the first lookup fails, the retry finds the charge
    await finish_and_check(case, store_of, server, source="reconcile")
    assert server.post_count == 1 and server.lookup_count == 2


async def test_unknown_lookup_requires_recovery_then_operator_resolution(
        case: Case, store_of: DurableTaskStore, server: IdempotentTestServer) -> None:
    case.run_killed(**effect_case(case, server, create=True,
                                  kill_at="before_completion_commit", node="pay"))
    server.fail_lookups(None)  # the lookup service is down
    code, out, err = case.run(**effect_case(case, server))
    assert code == 0 and out is not None and not out["ok"], (out, err)
    assert out["error"] == "DurableRecoveryRequiredError"
    [action_id] = out["details"]["action_ids"]
    assert server.post_count == 1  # never a blind second dispatch
    snap = await store_of.get_task(case.key)
    assert snap is not None and snap.header.status == "recovery_required"
    assert snap.nodes["pay"].state == "uncertain"
    code, out, err = case.run(**effect_case(case, server))
    assert out is not None and out["error"] == "DurableRecoveryRequiredError"
    server.reset_faults()
    # The operator checks the destination and attests the outcome.
    runtime = ExecutionGraphRuntime(catalog=HostCatalog([]), store=store_of)
    view = await runtime.resolve_action(
        case.key, action_id, ActionOutcome(output=server.response_for(action_id),
                                           result_ref=action_id), actor="oncall")
    assert view.status == "pending"
    await finish_and_check(case, store_of, server, source="operator")
    assert server.post_count == 1


async def test_idempotent_destination_replays_under_the_same_key(
        case: Case, store_of: DurableTaskStore, server: IdempotentTestServer) -> None:
    case.run_killed(**effect_case(case, server, create=True, idempotent=True,
                                  kill_at="before_completion_commit", node="pay"))
    server.fail_lookups(None)
    await finish_and_check(case, store_of, server, idempotent=True, source="dispatch")
    assert server.post_count == 2 and server.replay_count == 1  # deduped by the key


@pytest.mark.parametrize("refuse", [True, False], ids=["fencing-destination", "no-fencing"])
async def test_a_frozen_workers_late_dispatch_carries_its_old_fence(
        case: Case, store_of: DurableTaskStore, tmp_path: Path, refuse: bool) -> None:
    """A worker frozen after its intent commit, just before its POST, past its lease: a
    fresh worker proves the action absent and dispatches it again under fence 2, then the
    frozen one wakes and sends its POST under fence 1. A destination that cannot dedupe
    by key refuses it by the fence header (one acceptance); without that it accepts a
    second charge. Either way the frozen worker's writes are fenced out."""
    hold = tmp_path / "hold"
    with IdempotentTestServer(dedupe=False, refuse_stale_fences=refuse) as server:
        frozen = case.start(**effect_case(case, server, create=True, worker="frozen",
                                          hold_first_post=str(hold), lease_ttl=1.0,
                                          poll_interval=0.2))
        try:
            deadline = time.monotonic() + 60
            while not hold.with_suffix(".held").exists():
                assert frozen.poll() is None, frozen.communicate()
                assert time.monotonic() < deadline, "the worker never reached its POST"
                await asyncio.sleep(0.02)
            assert hold.with_suffix(".held").read_text() == "1"  # its fence, as sent
            code, out, err = case.run(**effect_case(case, server, worker="fresh", wait=True,
                                                    lease_ttl=1.0))
            assert code == 0 and out is not None and out["ok"], (out, err)
            assert out["output"]["receipt"] == {"text": f"charged {AMOUNT} EUR"}
            assert server.accepted_count == 1 and server.lookup_count == 1
        finally:
            hold.with_suffix(".go").write_text("go")
        stdout, stderr = frozen.communicate(timeout=60)
        late = json.loads(stdout.strip().splitlines()[-1])
        assert late["ok"] is False and late["error"] == "StaleFenceError", (late, stderr)
        snap = await store_of.get_task(case.key)
        assert snap is not None and snap.header.status == "completed"
        [action] = snap.actions.values()
        assert action.state == "confirmed" and action.dispatches == 2
        assert server.post_count == 2 and server.stale_refused == (1 if refuse else 0)
        assert server.accepted_for(action.action_id) == (1 if refuse else 2)
    assert case.starts("prep") == 1 and case.starts("receipt") == 1
