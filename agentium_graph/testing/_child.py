"""The child-process side of the two-process conformance tests.

A child is started as ``python -c "<CHILD_CODE>" '<json config>'``. It opens the store
with ``factory(**factory_kwargs)``, performs one read (so connection and schema set-up
happen before the race), prints ``ready``, waits for ``go`` on stdin, runs its scenario
and prints one JSON line with what it observed. Times are wall-clock UTC: both children
run on one machine, and every ``now`` a child sends is reported back to the parent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from agentium_graph.errors import BudgetExhaustedError, LeaseHeldError, StaleFenceError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._requests import AcquireLeaseRequest, Charge, CommitRequest
from agentium_graph.testing._harness import open_from_factory

CHILD_CODE = "from agentium_graph.testing._child import main; main()"

Scenario = Callable[[DurableTaskStore, dict[str, Any]], Awaitable[dict[str, Any]]]


def _now() -> datetime:
    return datetime.now(UTC)


async def _until(instant: datetime) -> None:
    """Sleep until a known instant (a lease expiry): the protocol's own waiting rule."""
    await asyncio.sleep(max((instant - _now()).total_seconds(), 0.0))


async def _acquire(store: DurableTaskStore, config: dict[str, Any],
                   grants: list[dict[str, Any]]) -> tuple[int, datetime]:
    """Acquire the lease, waiting out another holder's expiry; record every grant."""
    while True:
        now = _now()
        try:
            grant = await store.acquire_lease(AcquireLeaseRequest(
                key=config["key"], worker_id=config["worker"],
                ttl_seconds=config["ttl"], now=now))
        except LeaseHeldError as exc:
            config["held"] = config.get("held", 0) + 1
            await _until(exc.expires_at)
            continue
        grants.append({"fence": grant.fence, "worker": config["worker"],
                       "now": now.isoformat(), "expires_at": grant.expires_at.isoformat()})
        return grant.fence, grant.expires_at


async def lease_race(store: DurableTaskStore, config: dict[str, Any]) -> dict[str, Any]:
    """Acquire ``rounds`` times; hold each lease until it expires, then compete again."""
    grants: list[dict[str, Any]] = []
    for _ in range(config["rounds"]):
        _, expires = await _acquire(store, config, grants)
        await _until(expires)
    return {"grants": grants, "held": config.get("held", 0)}


async def charge_race(store: DurableTaskStore, config: dict[str, Any]) -> dict[str, Any]:
    """Each round: acquire, charge a shared admission id, let the lease lapse until the
    other child takes over (bounded), then charge an own admission id under the old fence.
    """
    grants: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []
    key, worker, counter = config["key"], config["worker"], config["counter"]
    for i in range(config["rounds"]):
        fence, expires = await _acquire(store, config, grants)
        for n, admission in enumerate((f"shared-{i}", f"{worker}-{i}")):
            if n == 1:
                await _until(expires)
                await _await_takeover(store, key, fence, config["ttl"])
            try:
                result = await store.commit(CommitRequest(
                    key=key, worker_id=worker, fence=fence, now=_now(),
                    steps=(Charge(admission_id=admission, charges={counter: 1}),)))
                outcome = "charged" if admission in result.charged else "already"
            except StaleFenceError:
                outcome = "stale"
            except BudgetExhaustedError:
                outcome = "exhausted"
            outcomes.append({"admission": admission, "fence": fence, "outcome": outcome})
    return {"grants": grants, "outcomes": outcomes, "held": config.get("held", 0)}


async def _await_takeover(store: DurableTaskStore, key: str, fence: int, ttl: float) -> None:
    """Poll until another fence is current, for at most a few TTLs (the other child may
    have finished its rounds)."""
    try:
        async with asyncio.timeout(ttl * 5):
            while True:
                header = await store.get_header(key)
                if header is None or header.fence != fence:
                    return
                await asyncio.sleep(ttl / 20)
    except TimeoutError:
        return


SCENARIOS: dict[str, Scenario] = {"lease_race": lease_race, "charge_race": charge_race}


async def _run(config: dict[str, Any]) -> dict[str, Any]:
    store = await open_from_factory(config["factory"], config["factory_kwargs"])
    try:
        await store.get_header(config["key"])
        print("ready", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go' from the parent, got {line!r}")
        return await SCENARIOS[config["scenario"]](store, config)
    finally:
        await store.close()


def main() -> None:
    config = json.loads(sys.argv[1])
    result = asyncio.run(_run(config))
    print(json.dumps(result), flush=True)
